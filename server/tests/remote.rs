//! Remote sub-agents over HTTP, in one process: a parent runtime whose agent delegates to an
//! agent served by a second runtime on a loopback port. The remote child's client tool and
//! approval are answered at the parent's ROOT, forwarded across the boundary; the resume of
//! the root cascades to the remote; the root completes with the child's result.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{serve, TestServer};
use dormant::remote::RemotePolicy;
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, Approval, Error, ModelReply, PendingKind, Runtime, ScriptedLlm, SledStore,
    Status, ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};
use serde_json::json;

const KEY: &str = "operator-key-for-tests";

/// The remote's authenticate hook: the parent's key makes an operator that may choose ids.
fn operator_auth() -> Auth {
    Auth::api_key(KEY)
}

/// The remote: agent `helper` asks the user (a client tool), then publishes behind an
/// approval, then answers.
async fn remote_server() -> anyhow::Result<TestServer> {
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask").output_schema(json!({
            "type": "object", "required": ["answer"],
            "properties": { "answer": { "type": "string" } }
        })))
        .tool(
            ToolDefinition::server("publish", |input, _ctx| async move {
                Ok::<_, ToolError>(json!({ "published": input["title"] }))
            })
            .require_approval(Approval::Always),
        )
        .build()?;
    let llm = ScriptedLlm::new().script(
        "helper",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({ "q": "title?" }))]),
            ModelReply::tool_calls(vec![ToolCall::new(
                "p1",
                "publish",
                json!({ "title": "hello" }),
            )]),
            ModelReply::text("helper done"),
        ],
    );
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(helper)
        .background_deadlines(false)
        .build()?;
    serve(runtime, operator_auth(), ServerConfig::default()).await
}

fn fast_policy() -> RemotePolicy {
    RemotePolicy {
        attempts: 3,
        backoff: Duration::from_millis(20),
        ..RemotePolicy::default()
    }
}

/// The parent: agent `lead` delegates to `helper` at `endpoint`.
fn parent_runtime(endpoint: &str) -> anyhow::Result<Runtime> {
    parent_runtime_through(endpoint, Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
}

/// [`parent_runtime`], reaching the remote through `transport`.
fn parent_runtime_through(
    endpoint: &str,
    transport: Arc<dyn dormant::remote::RemoteAgents>,
) -> anyhow::Result<Runtime> {
    parent_runtime_with(endpoint, transport, |builder| builder)
}

/// [`parent_runtime_through`], its builder changed by `configure` first.
fn parent_runtime_with(
    endpoint: &str,
    transport: Arc<dyn dormant::remote::RemoteAgents>,
    configure: impl FnOnce(dormant::RuntimeBuilder) -> dormant::RuntimeBuilder,
) -> anyhow::Result<Runtime> {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "delegate", endpoint, "helper",
        ))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "d1",
                "delegate",
                json!({ "message": "ask the user" }),
            )]),
            ModelReply::text("lead done"),
        ],
    );
    let builder = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(lead)
        .remote_agents(transport)
        .remote_policy(fast_policy())
        .background_deadlines(false);
    Ok(configure(builder).build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_childs_client_tool_and_approval_are_answered_at_the_root() -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let parent = parent_runtime(&remote.base)?;
    let root = "root-1".parse()?;

    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(run.pending, vec!["q1".to_string()]);

    // The root lists the remote call, with where it lives.
    let remote_calls = parent.pending_remote(&root).await?;
    assert_eq!(remote_calls.len(), 1);
    let (via, call) = &remote_calls[0];
    assert_eq!(via, &root);
    assert_eq!(call.tool_call_id, "q1");
    assert_eq!(call.kind, PendingKind::Client);
    assert_eq!(call.owner, "root-1-sub-d1");

    // A result that breaks the remote tool's schema: the remote's errors, as is.
    let wrong = parent
        .submit_tool_result(Submit::result("root-1", "q1", json!({ "nope": 1 })))
        .await?;
    assert!(
        matches!(&wrong, SubmitOutcome::InvalidResult { errors, .. } if !errors.is_empty()),
        "{wrong:?}"
    );
    let accepted = parent
        .submit_tool_result(Submit::result("root-1", "q1", json!({ "answer": "hello" })))
        .await?;
    assert_eq!(accepted, SubmitOutcome::Accepted);
    let again = parent
        .submit_tool_result(Submit::result("root-1", "q1", json!({ "answer": "again" })))
        .await?;
    assert_eq!(again, SubmitOutcome::AlreadyCompleted);

    // The resume cascades to the remote child, which then waits on an approval.
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let remote_calls = parent.pending_remote(&root).await?;
    assert_eq!(remote_calls.len(), 1, "{remote_calls:?}");
    let approval = &remote_calls[0].1;
    assert_eq!(approval.kind, PendingKind::Approval);
    let approval_id = approval.approval_id.clone().unwrap_or_default();
    // q1 is gone from the root: a duplicate answers from the tombstone here.
    let late = parent
        .submit_tool_result(Submit::result("root-1", "q1", json!({ "answer": "late" })))
        .await?;
    assert_eq!(late, SubmitOutcome::AlreadyCompleted);

    let approved = parent
        .submit_tool_result(Submit::approval("root-1", "p1", approval_id, true, None))
        .await?;
    assert_eq!(approved, SubmitOutcome::Accepted);
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(run.text.as_deref(), Some("lead done"));
    assert!(parent.pending_remote(&root).await?.is_empty());

    // The child's text is the tool result, and its stream was copied into the root's.
    let messages = parent.messages(&root).await?;
    let outcome = messages.iter().find_map(|message| match message {
        dormant::Message::Tool { outcome, .. } => Some(outcome.clone()),
        _ => None,
    });
    assert_eq!(outcome, Some(ToolOutcome::Result(json!("helper done"))));
    let child = remote.runtime.session(&"root-1-sub-d1".parse()?).await?;
    assert_eq!(child.status, Status::Completed);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_remote_is_a_tool_error_at_start_and_a_retryable_error_at_submit(
) -> anyhow::Result<()> {
    // Nothing listens on this port (bound, then dropped).
    let endpoint = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    let parent = parent_runtime(&endpoint)?;
    let root = "root-2".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    let messages = parent.messages(&root).await?;
    let failed = messages.iter().any(|message| {
        matches!(message, dormant::Message::Tool { outcome: ToolOutcome::Error(text), .. }
            if text.starts_with("remote_subagent_failed"))
    });
    assert!(failed, "{messages:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_while_the_remote_is_down_is_retryable_and_stores_nothing() -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let parent = parent_runtime(&remote.base)?;
    let root = "root-3".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);

    // The remote goes away (its listener closes): the submit is a typed, retryable error.
    let remote_runtime = remote.stop().await?;
    let answer = Submit::result("root-3", "q1", json!({ "answer": "hello" }));
    let down = parent.submit_tool_result(answer.clone()).await;
    match down {
        Err(Error::Remote(error)) => assert!(error.is_retryable(), "{error}"),
        other => panic!("expected a retryable remote error, got {other:?}"),
    }
    let pending = remote_runtime.pending(&"root-3-sub-d1".parse()?).await?;
    assert!(pending[0].answer.is_none(), "nothing was stored");
    // That the same submit is accepted once the remote is back on its port is shown with
    // real processes (remote_processes.rs).
    Ok(())
}

/// POSTs `body` to the remote as its operator (the parent's credential).
async fn as_operator(
    remote: &TestServer,
    path: &str,
    body: serde_json::Value,
) -> anyhow::Result<(reqwest::StatusCode, serde_json::Value)> {
    let response = remote
        .http
        .post(remote.url(path))
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await?;
    common::answer(response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_child_takes_answers_only_through_its_root_and_turns_only_from_its_parent(
) -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let parent = parent_runtime(&remote.base)?;
    let root = "root-4".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");

    // The child records whose it is.
    let child = remote.runtime.session(&"root-4-sub-d1".parse()?).await?;
    let parent_of = child.remote_parent.clone().map(|p| (p.parent, p.root));
    assert_eq!(parent_of, Some((root.clone(), root.clone())));

    // Straight at the child, even as the remote's operator: refused, nothing stored.
    let direct = json!({ "session_id": "root-4-sub-d1", "tool_call_id": "q1",
                         "result": { "answer": "direct" } });
    let (code, body) = as_operator(&remote, "/submit-tool-result", direct).await?;
    assert_eq!(
        (code.as_u16(), body["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let turn = json!({ "agent": "helper", "message": "hijack", "session_id": "root-4-sub-d1" });
    let (code, body) = as_operator(&remote, "/start", turn).await?;
    assert_eq!(
        (code.as_u16(), body["code"].as_str()),
        (409, Some("sub_agent_session")),
        "{body}"
    );
    // A start that names a parent must name both ids, and be new_only.
    for bad in [
        json!({ "agent": "helper", "message": "m", "session_id": "x1", "new_only": true,
                "parent_session_id": "p" }),
        json!({ "agent": "helper", "message": "m", "session_id": "x2",
                "parent_session_id": "p", "root_session_id": "p" }),
    ] {
        let (code, body) = as_operator(&remote, "/start", bad).await?;
        assert_eq!(code.as_u16(), 400, "{body}");
    }
    assert!(
        remote.runtime.pending(&"root-4-sub-d1".parse()?).await?[0]
            .answer
            .is_none(),
        "nothing was stored"
    );

    // Through the root it is accepted, and the tree goes on.
    let accepted = parent
        .submit_tool_result(Submit::result("root-4", "q1", json!({ "answer": "root" })))
        .await?;
    assert_eq!(accepted, SubmitOutcome::Accepted);
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    Ok(())
}

/// The HTTP transport, each stop held until the test lets it through, and each start
/// panicking if the test asks for that.
#[derive(Debug)]
struct HeldStops {
    http: HttpRemoteAgents,
    asked: tokio::sync::mpsc::UnboundedSender<String>,
    release: tokio::sync::Semaphore,
    panics_at_start: bool,
    /// The next status reads this many times answer 502, as a proxy in front of a remote
    /// that restarts does.
    bad_gateways: std::sync::atomic::AtomicUsize,
    /// The next status reads this many times answer 500, the remote's own failure.
    server_errors: std::sync::atomic::AtomicUsize,
    /// The next streams this many times end at once on an error event of the remote's, each
    /// told on `broke` as it is served.
    broken_streams: std::sync::atomic::AtomicUsize,
    broke: tokio::sync::Notify,
}

impl HeldStops {
    fn new(asked: tokio::sync::mpsc::UnboundedSender<String>, panics_at_start: bool) -> Self {
        Self {
            http: HttpRemoteAgents::new(Some(KEY.into())),
            asked,
            release: tokio::sync::Semaphore::new(0),
            panics_at_start,
            bad_gateways: Default::default(),
            server_errors: Default::default(),
            broken_streams: Default::default(),
            broke: tokio::sync::Notify::new(),
        }
    }
}

#[async_trait::async_trait]
impl dormant::remote::RemoteAgents for HeldStops {
    async fn start(
        &self,
        endpoint: &str,
        agent: &str,
        session: &dormant::SessionId,
        message: &str,
        parent: &dormant::remote::RemoteParent,
    ) -> Result<dormant::remote::RemoteStart, dormant::remote::RemoteError> {
        assert!(!self.panics_at_start, "the transport panics at a start");
        self.http
            .start(endpoint, agent, session, message, parent)
            .await
    }

    async fn status(
        &self,
        endpoint: &str,
        session: &dormant::SessionId,
        chunks_from: u64,
    ) -> Result<dormant::remote::RemoteStatus, dormant::remote::RemoteError> {
        use std::sync::atomic::Ordering::SeqCst;
        let errors = self.server_errors.load(SeqCst);
        if errors > 0 {
            self.server_errors.store(errors - 1, SeqCst);
            return Err(dormant::remote::RemoteError::Refused {
                endpoint: endpoint.to_string(),
                status: 500,
                code: "store_error".into(),
                message: "the remote's store failed".into(),
            });
        }
        let left = self.bad_gateways.load(SeqCst);
        if left > 0 {
            self.bad_gateways.store(left - 1, SeqCst);
            return Err(dormant::remote::RemoteError::Refused {
                endpoint: endpoint.to_string(),
                status: 502,
                code: "http_error".into(),
                message: "Bad Gateway".into(),
            });
        }
        self.http.status(endpoint, session, chunks_from).await
    }

    async fn chunks(
        &self,
        endpoint: &str,
        session: &dormant::SessionId,
        from: u64,
    ) -> Result<dormant::remote::RemoteChunks, dormant::remote::RemoteError> {
        use futures::StreamExt;
        use std::sync::atomic::Ordering::SeqCst;
        let left = self.broken_streams.load(SeqCst);
        if left > 0 {
            self.broken_streams.store(left - 1, SeqCst);
            self.broke.notify_one();
            let error = dormant::remote::RemoteError::Refused {
                endpoint: endpoint.to_string(),
                status: 200,
                code: "stream_error".into(),
                message: "the stream ended on an error".into(),
            };
            return Ok(futures::stream::iter([Err(error)]).boxed());
        }
        self.http.chunks(endpoint, session, from).await
    }

    async fn resume(
        &self,
        endpoint: &str,
        session: &dormant::SessionId,
    ) -> Result<(), dormant::remote::RemoteError> {
        self.http.resume(endpoint, session).await
    }

    async fn submit(
        &self,
        endpoint: &str,
        submit: &Submit,
    ) -> Result<SubmitOutcome, dormant::remote::RemoteError> {
        self.http.submit(endpoint, submit).await
    }

    async fn stop(
        &self,
        endpoint: &str,
        session: &dormant::SessionId,
        abort: bool,
    ) -> Result<(), dormant::remote::RemoteError> {
        let _ = self.asked.send(session.to_string());
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
        self.http.stop(endpoint, session, abort).await
    }
}

/// A new message to a root that waits on a remote child abandons the child's call and aborts
/// the child there: the root is at work (not settled) until the remote has stopped it, so a
/// caller told it settled finds the child aborted, not still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_stopping_a_remote_child_is_settled_once_the_remote_stopped_it() -> anyhow::Result<()>
{
    let remote = remote_server().await?;
    let (asked, mut stops) = tokio::sync::mpsc::unbounded_channel();
    let transport = Arc::new(HeldStops::new(asked, false));
    let parent = parent_runtime_through(&remote.base, transport.clone())?;
    let root = "root-1".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");

    let run = parent.execute_on(&root, "lead", "something else").await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(stops.recv().await.as_deref(), Some("root-1-sub-d1"));
    assert!(
        !parent.is_settled(&root).await,
        "settled while its remote child was still being stopped"
    );
    transport.release.add_permits(1);
    parent.wait_settled(&root).await;
    let child = remote.runtime.session(&"root-1-sub-d1".parse()?).await?;
    assert_eq!(child.status, Status::Failed, "the child was aborted there");
    parent.shutdown().await?;
    Ok(())
}

/// A driver whose transport panics reports the remote as unreachable: the parent's call is a
/// tool error, as for a remote that does not answer, not a wait that never ends (the driver's
/// task used to die with its report).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_panics_is_a_remote_that_did_not_answer() -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let (asked, _stops) = tokio::sync::mpsc::unbounded_channel();
    let transport = Arc::new(HeldStops::new(asked, true));
    let parent = parent_runtime_through(&remote.base, transport)?;
    let root = "root-3".parse()?;
    // Bounded: the defect was a run that waited for good.
    let run = tokio::time::timeout(
        Duration::from_secs(60),
        parent.execute_on(&root, "lead", "go"),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the run still waits on a driver that panicked"))??;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    let messages = parent.messages(&root).await?;
    let failed = messages.iter().any(|message| {
        matches!(message, dormant::Message::Tool { outcome: ToolOutcome::Error(text), .. }
            if text.starts_with("remote_subagent_failed") && text.contains("panicked"))
    });
    assert!(failed, "{messages:?}");
    parent.wait_settled(&root).await;
    parent.shutdown().await?;
    Ok(())
}

/// A proxy's 502 in front of a remote that restarts is tried again, as an unreachable remote
/// is: the remote child goes on, rather than being written off as lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_gateway_before_the_remote_is_tried_again_not_a_lost_child() -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let (asked, _stops) = tokio::sync::mpsc::unbounded_channel();
    let transport = Arc::new(HeldStops::new(asked, false));
    let parent = parent_runtime_through(&remote.base, transport.clone())?;
    let root = "root-gw".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let accepted = parent
        .submit_tool_result(Submit::result(
            "root-gw",
            "q1",
            json!({ "answer": "hello" }),
        ))
        .await?;
    assert_eq!(accepted, SubmitOutcome::Accepted);

    // The resume wakes the child; its status reads meet two 502s first (fewer than the
    // policy's tries).
    transport
        .bad_gateways
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(
        transport
            .bad_gateways
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the 502s were met"
    );
    let remote_calls = parent.pending_remote(&root).await?;
    assert_eq!(remote_calls.len(), 1, "{remote_calls:?}");
    assert_eq!(remote_calls[0].1.kind, PendingKind::Approval);
    Ok(())
}

/// A parent that resumes by itself (`auto_resume`) takes its remote child, on a server that
/// does not, through its answers: once nothing waits but the child's resume, the parent
/// resumes, which wakes the child there; the tree completes with no resume asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_that_resumes_by_itself_wakes_a_remote_child_that_does_not() -> anyhow::Result<()>
{
    use futures::StreamExt;
    let remote = remote_server().await?;
    let transport = Arc::new(HttpRemoteAgents::new(Some(KEY.into())));
    let parent = parent_runtime_with(&remote.base, transport, |builder| builder.auto_resume(true))?;
    let root: dormant::SessionId = "root-auto".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let from = parent.chunks(&root, 0).await?.len() as u64;
    let mut chunks = std::pin::pin!(parent.follow(&root, from));
    let answer = Submit::result("root-auto", "q1", json!({ "answer": "hello" }));
    assert_eq!(
        parent.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    // The parent goes on by itself: the child, woken, asks for its approval next.
    let approval = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let waits = parent.pending_remote(&root).await?;
            if let Some((_, call)) = waits
                .into_iter()
                .find(|(_, call)| call.kind == PendingKind::Approval)
            {
                return anyhow::Ok(call);
            }
            // A chunk of the tree moved (the next one is awaited, not a time).
            chunks.next().await;
        }
    })
    .await??;
    let yes = Submit::approval(
        "root-auto",
        approval.tool_call_id.clone(),
        approval.approval_id.clone().unwrap_or_default(),
        true,
        None,
    );
    assert_eq!(
        parent.submit_tool_result(yes).await?,
        SubmitOutcome::Accepted
    );
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if let dormant::types::ChunkKind::RunEnd { status, .. } = chunk.kind {
                return anyhow::Ok(Some(status));
            }
        }
        Ok(None)
    })
    .await??;
    assert_eq!(ended, Some(Status::Completed));
    parent.shutdown().await?;
    Ok(())
}

/// The remote's own failure (a 500) reading a live child's status is tried again, as a remote
/// out of reach is, up to the runtime's patience: the child is not written off at once, and
/// left running there for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_failure_reading_a_live_child_is_tried_again_not_a_lost_child(
) -> anyhow::Result<()> {
    let remote = remote_server().await?;
    let (asked, _stops) = tokio::sync::mpsc::unbounded_channel();
    let transport = Arc::new(HeldStops::new(asked, false));
    let parent = parent_runtime_through(&remote.base, transport.clone())?;
    let root = "root-500".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let answer = Submit::result("root-500", "q1", json!({ "answer": "hello" }));
    assert_eq!(
        parent.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    // The watch that follows the answer has read the child's status: the failure is the
    // wake's.
    parent.wait_settled(&root).await;
    transport
        .server_errors
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(
        transport
            .server_errors
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the 500 was met"
    );
    let written_off = parent.messages(&root).await?.into_iter().any(|message| {
        matches!(message, dormant::Message::Tool { tool_call_id, .. } if tool_call_id == "d1")
    });
    assert!(
        !written_off,
        "the child is not written off at the first failure"
    );
    // Asked again, the remote answers: the child waits on its approval.
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let remote_calls = parent.pending_remote(&root).await?;
    assert_eq!(remote_calls.len(), 1, "{remote_calls:?}");
    assert_eq!(remote_calls[0].1.kind, PendingKind::Approval);
    Ok(())
}

/// A remote that froze with its connection open (the stream's headers sent, then nothing, not
/// even a keep-alive) is taken for unreachable, not waited on for good. (The clock is paused
/// once the stream is open: it moves on whenever everything waits, as then.)
#[tokio::test]
async fn a_stream_that_falls_silent_is_a_remote_out_of_reach() -> anyhow::Result<()> {
    use dormant::remote::RemoteAgents;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let frozen = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        // The request's head first, then the answer's.
        let mut head = Vec::new();
        while !head.windows(4).any(|end| end == b"\r\n\r\n") {
            let mut buffer = [0u8; 1024];
            let read = socket.read(&mut buffer).await?;
            anyhow::ensure!(read > 0, "the request ended early");
            head.extend_from_slice(&buffer[..read]);
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
            .await?;
        // Holds the connection, and says nothing more.
        std::future::pending::<()>().await;
        anyhow::Ok(socket)
    });
    let transport = HttpRemoteAgents::new(Some(KEY.into()));
    let mut chunks = transport.chunks(&endpoint, &"child-1".parse()?, 0).await?;
    tokio::time::pause();
    // Bounded (at ten minutes of the paused clock), so that a reader that waits for good fails.
    let first = tokio::time::timeout(Duration::from_secs(600), chunks.next())
        .await
        .map_err(|_| anyhow::anyhow!("the silent stream was waited on for good"))?;
    match first {
        Some(Err(error)) => {
            assert!(error.is_retryable(), "{error}");
            assert!(error.to_string().contains("sent nothing"), "{error}");
        }
        other => panic!("expected the stream to be taken for broken, got {other:?}"),
    }
    frozen.abort();
    Ok(())
}

/// Answers from a script once the test lets each call through.
struct Gated {
    script: ScriptedLlm,
    gate: Arc<tokio::sync::Semaphore>,
}

impl dormant::llm::LlmAdapter for Gated {
    fn complete(
        &self,
        request: dormant::llm::ModelRequest,
    ) -> futures::future::BoxFuture<'static, Result<ModelReply, dormant::llm::LlmError>> {
        let (gate, reply) = (Arc::clone(&self.gate), self.script.complete(request));
        Box::pin(async move {
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
            reply.await
        })
    }
}

/// A remote child's stream that ends on an error while the child runs says nothing of the
/// child: its status is read again and the child followed on, not written off as lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_while_the_child_runs_is_followed_again() -> anyhow::Result<()> {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let llm = Gated {
        script: ScriptedLlm::new().script(
            "helper",
            vec![ModelReply::tool_calls(vec![ToolCall::new(
                "q1",
                "ask",
                json!({ "q": "title?" }),
            )])],
        ),
        gate: Arc::clone(&gate),
    };
    let remote_runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(helper)
        .background_deadlines(false)
        .build()?;
    let remote = serve(remote_runtime, operator_auth(), ServerConfig::default()).await?;
    let (asked, _stops) = tokio::sync::mpsc::unbounded_channel();
    let transport = Arc::new(HeldStops::new(asked, false));
    transport
        .broken_streams
        .store(1, std::sync::atomic::Ordering::SeqCst);
    let parent = parent_runtime_through(&remote.base, transport.clone())?;
    let root: dormant::SessionId = "root-broken".parse()?;
    let running = {
        let (parent, root) = (parent.clone(), root.clone());
        tokio::spawn(async move { parent.execute_on(&root, "lead", "go").await })
    };
    // The child's model waits: its status says running, and its stream breaks.
    tokio::time::timeout(Duration::from_secs(60), transport.broke.notified())
        .await
        .map_err(|_| anyhow::anyhow!("the child's stream was never asked for"))?;
    gate.add_permits(10);
    let run = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .map_err(|_| anyhow::anyhow!("the root never settled"))???;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(run.pending, vec!["q1".to_string()]);
    Ok(())
}
