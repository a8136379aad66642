//! The in-process API on any node (issue 18): two runtimes share one PostgreSQL database
//! (a throwaway cluster), each with a `dormant-server` router on loopback and the HTTP peer
//! transport. A session suspends on node A; node B's `Runtime` calls for it (submit, resume,
//! abort) are served by A and answered on B as A answered them, errors included, unless served
//! on B as a call routed there (`Runtime::serve_peer`); B follows the run A makes; and a call
//! to `/peer` without A's key is refused. And a call B routes to A costs B one or two reads of
//! the database (the session's root the first time, then the lease), never an activation.

#![cfg(feature = "postgres")]

use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use dormant::cluster::leases::LeaseOwner;
use dormant::cluster::peer::{PeerAnswer, PeerCall, PeerEvents, Peers};
use dormant::remote::RemoteError;
use dormant::types::ChunkKind;
use dormant::{
    AgentDefinition, Error, ModelReply, PgStore, Runtime, ScriptedLlm, SessionId, Status, ToolCall,
    ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, HttpPeers, Server, TokenKey, PEER_KEY};
use futures::StreamExt;
use serde_json::json;

/// Longer than a follower on a node that does not run the session waits between two reads of
/// the store; a stream that says nothing for this long is stuck.
const FOLLOW_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// The key every node signs session tokens with: a token one issues is good on any.
const TOKEN_KEY: [u8; 32] = [7; 32];

/// One node: a runtime on the shared database, served on a loopback port it advertises.
struct Node {
    runtime: Runtime,
    base: String,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    closing: dormant_server::Closing,
}

async fn node(url: &str, name: &str) -> anyhow::Result<Node> {
    node_with(url, name, Arc::new(HttpPeers::new())).await
}

/// [`node`], calling the others through `peers`.
async fn node_with(url: &str, name: &str, peers: Arc<dyn Peers>) -> anyhow::Result<Node> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let store = PgStore::builder(url)
        .node(name)
        .advertise(base.clone())
        .connect()
        .await?;
    let llm = ScriptedLlm::new().script(
        "editor",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("tc-1", "edit", json!({ "file": "a" }))]),
            ModelReply::text("done"),
        ],
    );
    let runtime = Runtime::builder()
        .shared_store(Arc::new(store))
        .llm(Arc::new(llm))
        .agent(
            AgentDefinition::builder("editor")
                .tool(ToolDefinition::client("edit"))
                .build()?,
        )
        .peers(peers)
        // Nothing here waits on a deadline: without the scheduler's looks at the index, a
        // node's statements are its calls'.
        .background_deadlines(false)
        .build()?;
    let server = Server::new(runtime.clone(), Auth::allow_unauthenticated())
        .token_key(TokenKey::from_bytes(TOKEN_KEY));
    // Held, as a daemon holds the switch that ends its streams at its shutdown.
    let closing = server.closing();
    let router = server.router()?;
    let served = tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(Node {
        runtime,
        base,
        served,
        closing,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_call_for_a_session_another_node_owns_is_served_by_the_owner(
) -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    let (a, b) = (node(&url, "a").await?, node(&url, "b").await?);
    let id: SessionId = "s1".parse()?;

    let suspended = a.runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    let owner = b.runtime.owner_of(&id).await?;
    assert_eq!(owner.map(|owner| owner.node).as_deref(), Some("a"));

    // B's calls are A's: the answer is accepted once, and the run completes on A. A call
    // served on B itself (as one another node routed to B) answers that A owns it.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let key_of = |node: &'static str| {
        let client = &client;
        async move {
            let row = client
                .query_one(
                    "SELECT peer_key FROM dormant_nodes WHERE node = $1",
                    &[&node],
                )
                .await?;
            anyhow::Ok(row.get::<_, String>(0))
        }
    };
    let answer = || Submit::result("s1", "tc-1", json!({ "ok": true }));
    let call = PeerCall::Submit { submit: answer() };
    let here = match b.runtime.serve_peer(&key_of("b").await?, call).await? {
        PeerAnswer::Failed(failure) => Err(failure.into_error(&id, None, "b")),
        other => Ok(other),
    };
    assert!(
        matches!(here, Err(Error::SessionUnavailable { .. })),
        "{here:?}"
    );
    assert_eq!(
        b.runtime.submit_tool_result(answer()).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(
        b.runtime.submit_tool_result(answer()).await?,
        SubmitOutcome::AlreadyCompleted
    );
    // B follows the session, and then the run A makes: its chunks reach B from the shared
    // store (B's live channel never carries them).
    let mut stream = Box::pin(b.runtime.follow(&id, 0));
    while let Some(chunk) = tokio::time::timeout(FOLLOW_BOUND, stream.next()).await? {
        if let ChunkKind::RunSuspended { .. } = chunk?.kind {
            break;
        }
    }
    b.runtime.start_resume(&id).await?;
    let mut ended = None;
    while let Some(chunk) = tokio::time::timeout(FOLLOW_BOUND, stream.next()).await? {
        if let ChunkKind::RunEnd { status, .. } = chunk?.kind {
            ended = Some(status);
            break;
        }
    }
    assert_eq!(ended, Some(Status::Completed));
    let runs = b.runtime.runs(&id).await?;
    assert_eq!(
        runs.last().and_then(|run| run.text.as_deref()),
        Some("done")
    );
    assert!(
        a.runtime.is_resident(&id) && !b.runtime.is_resident(&id),
        "the session ran on A only"
    );

    // A's refusals come back as the same errors.
    match b.runtime.resume(&id).await {
        Err(Error::NotResumable { session, status }) => {
            assert_eq!((session, status), (id.clone(), Status::Completed));
        }
        other => panic!("a second resume answered {other:?}"),
    }
    b.runtime.abort(&id).await?;
    assert!(matches!(
        b.runtime.resume(&id).await,
        Err(Error::Aborted(session)) if session == id
    ));
    assert!(matches!(
        a.runtime.start_on(&id, "editor", "again").await,
        Err(Error::Aborted(_))
    ));

    // Only a peer may call: the key is A's, from the shared database.
    let call = json!({ "call": "resume", "session": "s1", "wait": false });
    let refused = reqwest::Client::new()
        .post(format!("{}/peer", a.base))
        .header(PEER_KEY, "not-the-key")
        .json(&call)
        .send()
        .await?;
    assert_eq!(refused.status(), reqwest::StatusCode::FORBIDDEN);
    let body: serde_json::Value = refused.json().await?;
    assert_eq!(body["code"], "peer_refused");
    // A body that is no call is refused for what it is only with A's key: the key is
    // checked first, so a caller without it learns nothing of how its body was read.
    let key = key_of("a").await?;
    for (key, status) in [
        ("not-the-key", reqwest::StatusCode::FORBIDDEN),
        (key.as_str(), reqwest::StatusCode::BAD_REQUEST),
    ] {
        let malformed = reqwest::Client::new()
            .post(format!("{}/peer", a.base))
            .header(PEER_KEY, key)
            .json(&json!({ "call": "launch" }))
            .send()
            .await?;
        assert_eq!(malformed.status(), status);
    }

    for node in [a, b] {
        node.runtime.shutdown().await?;
        node.served.abort();
    }
    Ok(())
}

/// The statements logged since `from` (the cluster logs those of connections made with
/// `log_statement=all`), without the node's liveness renewals, which come on their own time.
fn statements_since(log: &std::path::Path, from: usize) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(log)?;
    Ok(text
        .lines()
        .skip(from)
        .filter(|line| line.contains("LOG:  execute") || line.contains("LOG:  statement:"))
        .filter(|line| !line.contains("UPDATE dormant_nodes"))
        .map(str::to_string)
        .collect())
}

fn log_lines(log: &std::path::Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_to_string(log)?.lines().count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_routed_to_the_owner_costs_this_node_two_database_reads_at_most(
) -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    // Only B's connections log their statements.
    let logged = format!("{url} options='-c log_statement=all'");
    let (a, b) = (node(&url, "a").await?, node(&logged, "b").await?);
    let id: SessionId = "s1".parse()?;
    let suspended = a.runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    let log = cluster.log();

    // The first call B makes for the session reads its root and the lease; the next, at most
    // the lease (not even that within a second: B remembers the owner as long). Nothing is
    // activated on B.
    let from = log_lines(&log)?;
    let answer = Submit::result("s1", "tc-1", json!({ "ok": true }));
    assert_eq!(
        b.runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let first = statements_since(&log, from)?;
    assert_eq!(first.len(), 2, "{first:#?}");
    let from = log_lines(&log)?;
    b.runtime.start_resume(&id).await?;
    let next = statements_since(&log, from)?;
    assert!(next.len() <= 1, "{next:#?}");
    assert!(!b.runtime.is_resident(&id));

    for node in [a, b] {
        node.runtime.shutdown().await?;
        node.served.abort();
    }
    Ok(())
}

/// The HTTP transport, counting what goes through it.
#[derive(Debug, Default)]
struct CountingPeers {
    http: HttpPeers,
    calls: AtomicUsize,
    follows: AtomicUsize,
    follows_to_settle: AtomicUsize,
    submit_follows: AtomicUsize,
    /// Answers a follow to the settle as a transport that cannot (or an owner of an earlier
    /// version) does.
    open_ended: std::sync::atomic::AtomicBool,
    /// Answers a submit with its follow as a transport that cannot (or an owner of an
    /// earlier version) does.
    no_submit_follow: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Peers for CountingPeers {
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.http.call(owner, call).await
    }

    async fn follow(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        self.follows.fetch_add(1, Ordering::SeqCst);
        self.http.follow(owner, session, from).await
    }

    async fn follow_to_settle(
        &self,
        owner: &LeaseOwner,
        session: &SessionId,
        from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        self.follows_to_settle.fetch_add(1, Ordering::SeqCst);
        if self.open_ended.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.http.follow_to_settle(owner, session, from).await
    }

    async fn submit_and_follow(
        &self,
        owner: &LeaseOwner,
        submit: &Submit,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        self.submit_follows.fetch_add(1, Ordering::SeqCst);
        if self.no_submit_follow.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.http.submit_and_follow(owner, submit).await
    }
}

/// An answer through a node that does not own the session, with its resume and the resumed
/// run's stream (`POST /submit-tool-result?resume=true&stream=true` there): one call to the
/// owner, which answers and then streams the run to its settle. A transport (or an owner of
/// an earlier version) that cannot makes the two calls, with the same stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_its_resume_and_stream_is_one_call_to_the_owner() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    let peers = Arc::new(CountingPeers::default());
    let a = node(&url, "a").await?;
    let b = node_with(&url, "b", peers.clone()).await?;
    let counts = || {
        [
            peers.submit_follows.load(Ordering::SeqCst),
            peers.calls.load(Ordering::SeqCst),
            peers.follows_to_settle.load(Ordering::SeqCst),
            peers.follows.load(Ordering::SeqCst),
        ]
    };
    answered_and_followed(&a, &b, "s1").await?;
    assert_eq!(counts(), [1, 0, 0, 0], "one call, nothing beside it");

    // An answer the owner does not accept: its outcome, and nothing to follow.
    let stray = Submit::result("s1", "tc-9", json!({ "ok": true }));
    let followed = b.runtime.submit_resume_and_follow(stray).await?;
    assert!(
        followed.answer.outcome == SubmitOutcome::UnknownToolCall,
        "{:?}",
        followed.answer
    );
    assert!(followed.answer.resumed.is_none() && followed.follow.is_none());
    assert_eq!(counts(), [2, 0, 0, 0]);

    peers.no_submit_follow.store(true, Ordering::SeqCst);
    answered_and_followed(&a, &b, "s2").await?;
    assert_eq!(counts(), [3, 1, 1, 0], "the answer, then the follow");

    // Over HTTP, through B: the answer, the run's chunks, and the end at its settle.
    peers.no_submit_follow.store(false, Ordering::SeqCst);
    let id: SessionId = "s3".parse()?;
    a.runtime.execute_on(&id, "editor", "edit it").await?;
    let response = reqwest::Client::new()
        .post(format!(
            "{}/submit-tool-result?resume=true&stream=true",
            b.base
        ))
        .bearer_auth(TokenKey::from_bytes(TOKEN_KEY).issue(&id))
        .json(&Submit::result("s3", "tc-1", json!({ "ok": true })).to_json())
        .send()
        .await?;
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let body = tokio::time::timeout(FOLLOW_BOUND, response.text()).await??;
    let events: Vec<&str> = body
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"accepted"), "{body}");
    assert!(events.contains(&"run_end"), "{body}");
    assert!(body.contains("settled"), "{body}");
    assert_eq!(a.runtime.session(&id).await?.status, Status::Completed);
    assert_eq!(counts(), [4, 1, 1, 0], "one call more");

    for node in [a, b] {
        node.runtime.shutdown().await?;
        node.served.abort();
    }
    Ok(())
}

/// `session` suspended on A, then answered through B with its resume and followed there to
/// the settle: every chunk of the run, once, then the count A has.
async fn answered_and_followed(a: &Node, b: &Node, session: &str) -> anyhow::Result<()> {
    let id: SessionId = session.parse()?;
    let suspended = a.runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    let answer = Submit::result(session, "tc-1", json!({ "ok": true }));
    let followed = b.runtime.submit_resume_and_follow(answer).await?;
    assert_eq!(followed.answer.outcome, SubmitOutcome::Accepted);
    let started = match followed.answer.resumed {
        Some(Ok(started)) => started,
        other => anyhow::bail!("resumed: {other:?}"),
    };
    let Some(follow) = followed.follow else {
        anyhow::bail!("a run started, and nothing to follow");
    };
    let (mut events, mut settled) = (follow.events, follow.settled);
    let (seen, chunks) = to_the_settle(&mut events, &mut settled).await?;
    let record = a.runtime.session(&id).await?;
    assert_eq!(record.status, Status::Completed);
    assert_eq!(chunks, Some(record.chunk_count), "the count once settled");
    assert_eq!(
        seen,
        (started.from_seq..record.chunk_count).collect::<Vec<_>>()
    );
    Ok(())
}

/// A stream that ends at the settle of a run another node makes (the agent server's answer to
/// `POST /submit-tool-result?resume=true&stream=true` on a node that does not own the
/// session) learns the settle from the owner's stream: one follow, no call that waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_to_the_settle_of_a_run_on_another_node_is_one_call_to_it() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    let peers = Arc::new(CountingPeers::default());
    let a = node(&url, "a").await?;
    let b = node_with(&url, "b", peers.clone()).await?;
    follow_to_settle(&a, &b, "s1", true).await?;
    assert_eq!(peers.follows_to_settle.load(Ordering::SeqCst), 1);
    assert_eq!(peers.follows.load(Ordering::SeqCst), 0);
    assert_eq!(
        peers.calls.load(Ordering::SeqCst),
        1,
        "no call waited for the settle"
    );

    // A transport (or an owner of an earlier version) that does not end at the settle: an
    // open-ended follow, and a call that waits for the settle beside it.
    peers.open_ended.store(true, Ordering::SeqCst);
    follow_to_settle(&a, &b, "s2", false).await?;
    assert_eq!(peers.follows_to_settle.load(Ordering::SeqCst), 2);
    assert_eq!(peers.follows.load(Ordering::SeqCst), 1);
    assert_eq!(
        peers.calls.load(Ordering::SeqCst),
        3,
        "the answer, and the wait"
    );

    for node in [a, b] {
        node.runtime.shutdown().await?;
        node.served.abort();
    }
    Ok(())
}

/// `session` suspended on A, answered and resumed through B, and followed on B to its settle:
/// every chunk of the run, then the count A has (with `in_order`, told only after every chunk
/// below it; else the stream may still have some to give, as with a wait beside the follow).
async fn follow_to_settle(a: &Node, b: &Node, session: &str, in_order: bool) -> anyhow::Result<()> {
    let id: SessionId = session.parse()?;
    let suspended = a.runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    let answer = Submit::result(session, "tc-1", json!({ "ok": true }));
    let answered = b.runtime.submit_and_resume(answer).await?;
    assert_eq!(answered.outcome, SubmitOutcome::Accepted);
    let started = match answered.resumed {
        Some(Ok(started)) => started,
        other => anyhow::bail!("resumed: {other:?}"),
    };
    let (events, settled) = b.runtime.follow_live_to_settle(&id, started.from_seq);
    let (mut events, mut settled) = (Box::pin(events), Box::pin(settled));
    let (mut seen, chunks) = to_the_settle(&mut events, &mut settled).await?;
    let record = a.runtime.session(&id).await?;
    assert_eq!(record.status, Status::Completed);
    assert_eq!(chunks, Some(record.chunk_count), "the count once settled");
    if !in_order {
        while seen.last().map_or(started.from_seq, |seq| seq + 1) < record.chunk_count {
            match tokio::time::timeout(FOLLOW_BOUND, events.next()).await? {
                Some(Ok(dormant::StreamEvent::Chunk(chunk))) => seen.push(chunk.seq),
                Some(Ok(dormant::StreamEvent::Delta(_))) => {}
                other => anyhow::bail!("the stream broke off: {other:?}"),
            }
        }
    }
    // Every chunk of the run, once (and, in order, before the settle was told).
    assert_eq!(
        seen,
        (started.from_seq..record.chunk_count).collect::<Vec<_>>()
    );
    Ok(())
}

/// Reads a follow to the settle: the sequence numbers of the chunks given before the settle
/// was told, and the count it told.
async fn to_the_settle(
    events: &mut (impl futures::Stream<Item = Result<dormant::StreamEvent, Error>> + Unpin),
    settled: &mut (impl std::future::Future<Output = Option<u64>> + Unpin),
) -> anyhow::Result<(Vec<u64>, Option<u64>)> {
    let mut seen = Vec::new();
    let chunks = tokio::time::timeout(FOLLOW_BOUND, async {
        loop {
            tokio::select! {
                biased;
                event = events.next() => match event {
                    Some(Ok(dormant::StreamEvent::Chunk(chunk))) => seen.push(chunk.seq),
                    Some(Ok(dormant::StreamEvent::Delta(_))) => {}
                    other => anyhow::bail!("the stream broke off: {other:?}"),
                },
                chunks = &mut *settled => break Ok(chunks),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("stuck after {seen:?}"))??;
    Ok((seen, chunks))
}

/// A follow another node keeps open (until its caller hangs up) ends when the owner shuts
/// down: it must not hold the drain of the owner's shutdown until the follower leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_follow_ends_when_the_owner_shuts_down() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    let a = node(&url, "a").await?;
    let id: SessionId = "s1".parse()?;
    let suspended = a.runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let key: String = client
        .query_one("SELECT peer_key FROM dormant_nodes WHERE node = 'a'", &[])
        .await?
        .get(0);
    let response = reqwest::Client::new()
        .post(format!("{}/peer/follow", a.base))
        .header(PEER_KEY, key)
        .json(&json!({ "session": "s1", "from": 0 }))
        .send()
        .await?;
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let mut body = response.bytes_stream();
    // The session's chunks so far come; then the follow stays open, as asked.
    let first = tokio::time::timeout(FOLLOW_BOUND, body.next()).await?;
    assert!(matches!(first, Some(Ok(_))), "{first:?}");
    a.closing.close();
    let ended = tokio::time::timeout(FOLLOW_BOUND, async {
        while let Some(chunk) = body.next().await {
            chunk?;
        }
        anyhow::Ok(())
    })
    .await;
    assert!(
        matches!(ended, Ok(Ok(()))),
        "the follow did not end at the shutdown: {ended:?}"
    );
    a.served.abort();
    a.runtime.shutdown().await?;
    Ok(())
}
