//! The AG-UI endpoint (issue 33, item 3): a thread's run as AG-UI events, an interrupt that
//! lists every call of the tree waiting for a person (a sub-agent's too), and the next run's
//! resume entries as their answers. Every run input and event is checked against the official
//! schemas of `@ag-ui/core`, and the official client (`@ag-ui/client`'s `HttpAgent`, which
//! enforces the protocol's rules on what it reads) drives a thread through an interrupt (both
//! 1.0.0, from the npm registry; `.ci/run` installs them and sets `DORMANT_AGUI_NODE_MODULES` to
//! their `node_modules`). Without them those checks say they were skipped and how to install
//! the packages, unless `DORMANT_REQUIRE_AGUI` is set.

mod common;

use std::io::Write;
use std::sync::Arc;

use dormant::{
    AgentDefinition, Approval, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

use common::TestServer;

const OPERATOR: &str = "an-operator-key-of-some-length";

/// `desk` streams its replies: it asks `pick` (a client tool), to approve `send`, and hands
/// `helper` a task, whose `confirm` waits too; then it says it is done.
async fn server() -> anyhow::Result<TestServer> {
    let llm = ScriptedLlm::new()
        .streaming()
        .script(
            "desk",
            vec![
                ModelReply::tool_calls(vec![
                    ToolCall::new("pick-1", "pick", json!({ "prompt": "a colour" })),
                    ToolCall::new("send-1", "send", json!({ "to": "ana" })),
                    ToolCall::new("help-1", "helper", json!({ "message": "confirm it" })),
                ]),
                ModelReply::text("All done."),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("confirm-1", "confirm", json!({}))]),
                ModelReply::text("confirmed"),
            ],
        );
    let desk = AgentDefinition::builder("desk")
        .tool(
            ToolDefinition::client("pick")
                .description("Picks a colour.")
                .output_schema(json!({ "type": "object", "required": ["colour"],
                                       "properties": { "colour": { "type": "string" } } })),
        )
        .tool(
            ToolDefinition::server("send", |input: Value, _ctx| async move {
                Ok::<_, ToolError>(json!({ "sent_to": input["to"] }))
            })
            .require_approval(Approval::Always),
        )
        .tool(ToolDefinition::sub_agent("helper", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("confirm"))
        .build()?;
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(desk)
        .agent(helper)
        .build()?;
    common::serve(runtime, Auth::api_key(OPERATOR), ServerConfig::default()).await
}

/// Posts a run input; answers the status and, for a stream, its events.
async fn run(server: &TestServer, input: &Value) -> anyhow::Result<(StatusCode, Vec<Value>)> {
    let response = server
        .http
        .post(server.url("/ag-ui"))
        .header("x-api-key", OPERATOR)
        .header("accept", "text/event-stream")
        .json(input)
        .send()
        .await?;
    let status = response.status();
    let text = response.text().await?;
    if !status.is_success() {
        return Ok((status, vec![serde_json::from_str(&text)?]));
    }
    let events = text
        .split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok((status, events))
}

fn input(run: &str, messages: Value, resume: Option<Value>) -> Value {
    let mut input = json!({
        "threadId": "thread-1", "runId": run, "state": {}, "messages": messages,
        "tools": [], "context": [], "forwardedProps": { "dormant": { "agent": "desk" } },
    });
    if let Some(resume) = resume {
        input["resume"] = resume;
    }
    input
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|event| event["type"] == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_runs_interrupts_with_every_waiting_call_and_resumes_with_the_answers(
) -> anyhow::Result<()> {
    let server = server().await?;
    let first = input(
        "run-1",
        json!([{ "id": "m1", "role": "user", "content": "Send a colour to Ana" }]),
        None,
    );
    let (code, events) = run(&server, &first).await?;
    assert_eq!(code, StatusCode::OK, "{events:?}");
    assert_eq!(events[0]["type"], "RUN_STARTED");
    assert_eq!(
        (events[0]["threadId"].as_str(), events[0]["runId"].as_str()),
        (Some("thread-1"), Some("run-1"))
    );
    // The calls, streamed: each opened with its name, its arguments, and closed.
    let started: Vec<&str> = of_type(&events, "TOOL_CALL_START")
        .iter()
        .filter_map(|event| event["toolCallName"].as_str())
        .collect();
    assert_eq!(started, ["pick", "send", "helper"], "{events:#?}");
    assert_eq!(of_type(&events, "TOOL_CALL_END").len(), 3);
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:#?}");
    assert_eq!(last["outcome"]["type"], "interrupt");
    // Before the interrupt, what a client needs to go on: the waiting calls and the messages.
    let before: Vec<&str> = events[events.len() - 3..events.len() - 1]
        .iter()
        .filter_map(|event| event["type"].as_str())
        .collect();
    assert_eq!(before, ["STATE_SNAPSHOT", "MESSAGES_SNAPSHOT"]);
    let messages = &events[events.len() - 2]["messages"];
    assert_eq!(messages[0]["content"], "Send a colour to Ana");
    assert_eq!(messages[1]["toolCalls"][0]["function"]["name"], "pick");
    let interrupts = last["outcome"]["interrupts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let reasons: Vec<(&str, &str)> = interrupts
        .iter()
        .filter_map(|interrupt| {
            Some((
                interrupt["toolCallId"].as_str()?,
                interrupt["reason"].as_str()?,
            ))
        })
        .collect();
    assert_eq!(
        reasons,
        [
            ("pick-1", "client_tool"),
            ("send-1", "approval"),
            ("confirm-1", "client_tool")
        ],
        "every waiting call of the tree, the sub-agent's too"
    );
    assert_eq!(interrupts[0]["message"], "Picks a colour.");
    assert_eq!(
        interrupts[0]["responseSchema"]["required"],
        json!(["colour"])
    );
    let id_of = |call: &str| {
        interrupts
            .iter()
            .find(|interrupt| interrupt["toolCallId"] == call)
            .and_then(|interrupt| interrupt["id"].as_str())
            .unwrap_or_default()
            .to_string()
    };

    // What a run input gets wrong is the run's error (RUN_ERROR), and nothing is applied:
    // a message while interrupts are open (it would abandon them), an interrupt the run did not
    // list, a resume that leaves one open, a result that does not fit its tool's schema.
    let refusals = [
        (
            input(
                "run-2",
                json!([{ "id": "m2", "role": "user", "content": "never mind" }]),
                None,
            ),
            "pending_interrupts",
        ),
        (
            input(
                "run-2",
                json!([]),
                Some(json!([{ "interruptId": "nope", "status": "resolved", "payload": 1 }])),
            ),
            "unknown_interrupt",
        ),
        (
            input(
                "run-2",
                json!([]),
                Some(
                    json!([{ "interruptId": id_of("send-1"), "status": "resolved", "payload": { "approved": true } }]),
                ),
            ),
            "interrupts_not_answered",
        ),
        (
            input(
                "run-2",
                json!([]),
                Some(json!([
                    { "interruptId": id_of("pick-1"), "status": "resolved", "payload": { "hue": 1 } },
                    { "interruptId": id_of("send-1"), "status": "resolved", "payload": { "approved": true } },
                    { "interruptId": id_of("confirm-1"), "status": "resolved", "payload": "yes" },
                ])),
            ),
            "invalid_result",
        ),
    ];
    for (refused, code) in refusals {
        let (status, events) = run(&server, &refused).await?;
        assert_eq!(status, StatusCode::OK);
        let types: Vec<&str> = events
            .iter()
            .filter_map(|event| event["type"].as_str())
            .collect();
        assert_eq!(types, ["RUN_STARTED", "RUN_ERROR"], "{events:?}");
        assert_eq!(events[1]["code"], code, "{events:?}");
        validate("events", &events)?;
    }
    let waits = server.runtime.pending(&"thread-1".parse()?).await?;
    assert!(
        waits.iter().all(|call| call.answer.is_none()),
        "nothing applied: {waits:?}"
    );

    // pick is answered elsewhere first (the page, say), without a resume: the resume's own
    // answer for it is left, the first stands.
    let first_answer = json!({ "session_id": "thread-1", "tool_call_id": "pick-1",
                               "result": { "colour": "green" } });
    let response = server
        .http
        .post(server.url("/submit-tool-result"))
        .header("x-api-key", OPERATOR)
        .json(&first_answer)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);

    // The next run answers all three: the tree goes on to its end.
    let resume = json!([
        { "interruptId": id_of("pick-1"), "status": "resolved", "payload": { "colour": "red" } },
        { "interruptId": id_of("send-1"), "status": "resolved", "payload": { "approved": true } },
        { "interruptId": id_of("confirm-1"), "status": "resolved", "payload": "yes" },
    ]);
    let second = input("run-2", json!([]), Some(resume));
    let (code, resumed) = run(&server, &second).await?;
    assert_eq!(code, StatusCode::OK, "{resumed:?}");
    assert_eq!(resumed[0]["runId"], "run-2");
    let results: Vec<&str> = of_type(&resumed, "TOOL_CALL_RESULT")
        .iter()
        .filter_map(|event| event["toolCallId"].as_str())
        .collect();
    assert!(
        results.contains(&"send-1") && results.contains(&"pick-1"),
        "{resumed:#?}"
    );
    let picked = of_type(&resumed, "TOOL_CALL_RESULT")
        .into_iter()
        .find(|event| event["toolCallId"] == "pick-1")
        .and_then(|event| event["content"].as_str())
        .unwrap_or_default()
        .to_string();
    assert_eq!(picked, r#"{"colour":"green"}"#, "the first answer stands");
    let text: String = of_type(&resumed, "TEXT_MESSAGE_CONTENT")
        .iter()
        .filter_map(|event| event["delta"].as_str())
        .collect();
    assert_eq!(text, "All done.", "streamed as deltas");
    let last = resumed.last().cloned().unwrap_or_default();
    assert_eq!(
        (last["type"].as_str(), last["outcome"]["type"].as_str()),
        (Some("RUN_FINISHED"), Some("success")),
        "{resumed:#?}"
    );
    assert_eq!(last["result"], "All done.");

    validate("input", &[first, second])?;
    validate("events", &[events, resumed].concat())?;
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// Where the official packages are, or `None` (said loudly) when they are not installed.
fn node_modules(what: &str) -> anyhow::Result<Option<std::ffi::OsString>> {
    if let Some(modules) =
        std::env::var_os("DORMANT_AGUI_NODE_MODULES").filter(|dir| !dir.is_empty())
    {
        return Ok(Some(modules));
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n\n*** SKIPPED: {what} needs Node.js and AG-UI's packages: npm install --prefix DIR \
         @ag-ui/core@1.0.0 @ag-ui/client@1.0.0 zod@3.25.76, then DORMANT_AGUI_NODE_MODULES=DIR/node_modules ***\n\n"
    );
    anyhow::ensure!(
        std::env::var("DORMANT_REQUIRE_AGUI")
            .map_or(true, |value| value.is_empty() || value == "0"),
        "DORMANT_REQUIRE_AGUI is set and DORMANT_AGUI_NODE_MODULES is not"
    );
    Ok(None)
}

/// Checks `items` with the official schemas (`agui/validate.cjs`), or says why it cannot.
fn validate(kind: &str, items: &[Value]) -> anyhow::Result<()> {
    let Some(modules) = node_modules(&format!("checking AG-UI {kind} against @ag-ui/core"))? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let file = dir.path().join(format!("{kind}.jsonl"));
    let lines: Vec<String> = items.iter().map(Value::to_string).collect();
    std::fs::write(&file, lines.join("\n") + "\n")?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agui/validate.cjs");
    let output = std::process::Command::new("node")
        .arg(script)
        .arg(kind)
        .arg(&file)
        .env("NODE_PATH", &modules)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "@ag-ui/core refused some {kind}:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_drives_a_thread_through_its_interrupt() -> anyhow::Result<()> {
    let Some(modules) = node_modules("driving a thread with @ag-ui/client")? else {
        return Ok(());
    };
    let server = server().await?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agui/drive.cjs");
    let answers = json!({
        "pick": { "colour": "blue" },
        "send": { "approved": true },
        "confirm": "yes",
    });
    let url = server.url("/ag-ui");
    // The client waits on its runs: off the runtime's threads, which serve them.
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(script)
            .args([
                url.as_str(),
                OPERATOR,
                "thread-2",
                "desk",
                "Send a colour to Ana",
            ])
            .arg(answers.to_string())
            .env("NODE_PATH", modules)
            .output()
    })
    .await??;
    anyhow::ensure!(
        output.status.success(),
        "the AG-UI client failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout)?;
    let runs = seen["runs"].as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 2, "{seen}");
    let first = &runs[0]["finished"]["outcome"];
    assert_eq!(first["type"], "interrupt", "{seen}");
    assert_eq!(
        first["interrupts"].as_array().map(Vec::len),
        Some(3),
        "{seen}"
    );
    let second = &runs[1]["finished"];
    assert_eq!(second["outcome"]["type"], "success", "{seen}");
    assert_eq!(second["result"], "All done.");
    assert!(runs[1]["error"].is_null(), "{seen}");
    let id: dormant::SessionId = "thread-2".parse()?;
    assert_eq!(
        server.runtime.status(&id).await?,
        dormant::Status::Completed
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
