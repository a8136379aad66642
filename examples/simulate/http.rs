//! `--http [URL]`: suspension cycles over HTTP and SSE, side by side with the same cycles
//! through the in-process API in the same run.
//!
//! A cycle is one session: start it, follow its stream until it suspends, answer every call
//! it waits on (a client tool's result, an approval), resume it, and follow it to its end; a
//! session that suspends again goes round again. In process the cycle calls
//! `Runtime::start_on`, `follow`, `submit_tool_result` and `start_resume`; over HTTP it calls
//! `POST /start?stream=true` and `POST /submit-tool-result?resume=true&stream=true` (whose
//! answers are the run's stream) of a `dormant-server` router this process serves on
//! 127.0.0.1 (or of the server at URL, which must be on loopback and serve the demo agent:
//! load tests stay on the machine), with the client of `http_client.rs`. Both passes run
//! the same number of sessions with the same concurrency, one after the other, in
//! alternating order over `--http-rounds`.
//!
//! `--sse-streams N` then opens N streams on suspended sessions and reports how much the
//! process's RSS grew per open stream. Server and client share this process, so the figure
//! is the cost of both ends of a stream: an upper bound on the server's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dormant::types::ChunkKind;
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, Server, ServerConfig};
use futures::StreamExt;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::http_client::{Events, HttpClient};
use crate::report::Memory;
use crate::Args;

/// The agent of a self-served run: one client call, then a closing text.
const AGENT: &str = "cycle";
/// The agent of a server given by URL: the demo (a client call and an approval).
const DEMO: &str = "demo";
/// What each session is started with (the demo agent calls its client tool for it).
const MESSAGE: &str = "weather in Porto";

/// What one pass measured.
#[derive(Debug)]
pub(crate) struct Pass {
    pub(crate) sessions: usize,
    pub(crate) cycles: u64,
    pub(crate) elapsed: Duration,
    pub(crate) submit_us: Histogram<u64>,
    pub(crate) lag_ms: Histogram<u64>,
    pub(crate) errors: Vec<String>,
}

impl Pass {
    /// One line of the text report.
    pub(crate) fn line(&self, name: &str) -> String {
        let quantile = |histogram: &Histogram<u64>, q: f64| histogram.value_at_quantile(q);
        format!(
            "{name:<11} {:>6} sessions, {:>6} cycles in {:>6.2} s = {:>8.0} cycles/s; submit p50 {:>6} µs, p99 {:>6} µs; stream lag p50 {} ms, p99 {} ms",
            self.sessions,
            self.cycles,
            self.elapsed.as_secs_f64(),
            self.cycles_per_second(),
            quantile(&self.submit_us, 0.5),
            quantile(&self.submit_us, 0.99),
            quantile(&self.lag_ms, 0.5),
            quantile(&self.lag_ms, 0.99),
        )
    }

    pub(crate) fn cycles_per_second(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Latencies the sessions of a pass record, shared by its tasks.
#[derive(Debug)]
pub(crate) struct Recorder {
    submit_us: Mutex<Histogram<u64>>,
    lag_ms: Mutex<Histogram<u64>>,
}

impl Recorder {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            submit_us: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3)?),
            lag_ms: Mutex::new(Histogram::new_with_bounds(1, 3_600_000, 3)?),
        })
    }

    fn submit(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.submit_us.lock().saturating_record(micros.max(1));
    }

    /// From a chunk's commit (`at_ms`, the runtime's wall clock) to its arrival here.
    fn lag(&self, at_ms: u64) {
        self.lag_ms
            .lock()
            .saturating_record(now_ms().saturating_sub(at_ms).max(1));
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Runs the HTTP mode; returns how many problems it found.
pub(crate) async fn simulate(args: Args, target: Option<String>) -> anyhow::Result<usize> {
    let (_temp, _path, store) = crate::open_store(&args)?;
    let runtime = cycle_runtime(store, None, &args)?;
    let (base, agent, served) = match target {
        Some(url) => (loopback(&url)?, DEMO, None),
        None => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let base = format!("http://{}", listener.local_addr()?);
            let server = Server::new(runtime.clone(), Auth::allow_unauthenticated());
            (base, AGENT, Some(serve(server, listener)?))
        }
    };
    let client = Arc::new(HttpClient::new(&base)?);

    let mut in_process = Vec::new();
    let mut over_http = Vec::new();
    for round in 0..args.http_rounds.max(1) {
        // Alternate which pass goes first: the second runs on a bigger store.
        for http_first in [round % 2 == 1, round % 2 == 0] {
            if http_first {
                over_http.push(run_http(&client, agent, &args).await?);
            } else {
                in_process.push(run_in_process(&runtime, &args).await?);
            }
        }
    }
    let streams = if args.sse_streams > 0 {
        Some(stream_memory(&client, agent, args.sse_streams).await?)
    } else {
        None
    };
    if let Some(served) = served {
        served.stop().await?;
    }
    runtime.shutdown().await?;

    let problems: Vec<&String> = in_process
        .iter()
        .chain(&over_http)
        .flat_map(|pass| &pass.errors)
        .collect();
    for problem in problems.iter().take(20) {
        eprintln!("problem: {problem}");
    }
    print(&args, &in_process, &over_http, streams);
    Ok(problems.len())
}

/// The runtime of a self-served run: the agent [`AGENT`] on `store`, which is one of several
/// nodes' when `leases` says who owns what (its calls for another node's sessions are then
/// sent there over HTTP).
pub(crate) fn cycle_runtime(
    store: Arc<dyn dormant::store::Store>,
    leases: Option<Arc<dyn dormant::cluster::leases::Leases>>,
    args: &Args,
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder(AGENT)
        .tool(ToolDefinition::client("ask_user").output_schema(json!({
            "type": "object", "required": ["answer"],
            "properties": { "answer": { "type": "string" } }
        })))
        .build()?;
    let llm = ScriptedLlm::new().script(
        AGENT,
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("ask_user-1", "ask_user", json!({}))]),
            ModelReply::text("done"),
        ],
    );
    let mut builder = Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .agent(agent)
        .client_tool_timeout_ms(10 * 60 * 1000);
    if args.max_resident > 0 {
        builder = builder.max_resident(args.max_resident);
    }
    if let Some(leases) = leases {
        builder = builder
            .leases(leases)
            .peers(Arc::new(dormant_server::HttpPeers::new()));
    }
    Ok(builder.build()?)
}

/// A router this process serves on `listener` until [`Served::stop`].
pub(crate) struct Served {
    closing: dormant_server::Closing,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.closing.close();
        self.task.await??;
        Ok(())
    }
}

/// Serves `server` (without its page) on `listener`.
pub(crate) fn serve(server: Server, listener: tokio::net::TcpListener) -> anyhow::Result<Served> {
    let server = server.config(ServerConfig::default().page(false));
    let closing = server.closing();
    let app = server.router()?;
    // Small writes (an SSE event, a JSON answer) go out at once, not after Nagle's wait for
    // the peer's delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let wait = closing.clone();
    // As the binary serves (header-read bound, connection cap), so the cycles measured are
    // those a deployment gets.
    let task = tokio::spawn(async move {
        dormant_server::serve(listener, app)
            .with_graceful_shutdown(async move { wait.closed().await })
            .await
    });
    Ok(Served { closing, task })
}

/// Refuses a target off this machine.
fn loopback(url: &str) -> anyhow::Result<String> {
    let url = url.trim_end_matches('/');
    let host = url
        .strip_prefix("http://")
        .context("--http URL must be http://… on this machine")?;
    let on_loopback = ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|name| host == *name || host.starts_with(&format!("{name}:")));
    anyhow::ensure!(
        on_loopback,
        "--http {url}: load tests stay on loopback (127.0.0.1, localhost, [::1])"
    );
    Ok(url.to_string())
}

async fn run_in_process(runtime: &Runtime, args: &Args) -> anyhow::Result<Pass> {
    let (mut pass, ids) = run_pass(args, "in process", |recorder| {
        let runtime = runtime.clone();
        async move { cycle_in_process(&runtime, &recorder).await }
    })
    .await?;
    for id in ids {
        let messages = serde_json::to_value(runtime.messages(&id).await?)?;
        if !messages.as_array().is_some_and(|all| one_answer(all)) {
            pass.errors
                .push(format!("in process: {id} does not have exactly one answer"));
        }
    }
    Ok(pass)
}

/// Runs `--sessions` cycles, `--concurrency` at a time, and times them; returns what each
/// finished cycle gave back, to check after the clock stopped.
pub(crate) async fn run_pass<T, F, Fut>(
    args: &Args,
    name: &str,
    cycle: F,
) -> anyhow::Result<(Pass, Vec<T>)>
where
    F: Fn(Arc<Recorder>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(T, u64)>>,
{
    let recorder = Arc::new(Recorder::new()?);
    let finished = Mutex::new(Vec::with_capacity(args.sessions));
    let errors = Mutex::new(Vec::new());
    let cycles = std::sync::atomic::AtomicU64::new(0);
    let started = Instant::now();
    futures::stream::iter(0..args.sessions)
        .for_each_concurrent(args.concurrency, |_| {
            let run = cycle(Arc::clone(&recorder));
            let (finished, errors, cycles) = (&finished, &errors, &cycles);
            async move {
                match run.await {
                    Ok((done, count)) => {
                        cycles.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
                        finished.lock().push(done);
                    }
                    Err(error) => errors.lock().push(format!("{name}: {error:#}")),
                }
            }
        })
        .await;
    let pass = Pass {
        sessions: args.sessions,
        cycles: cycles.load(std::sync::atomic::Ordering::Relaxed),
        elapsed: started.elapsed(),
        submit_us: recorder.submit_us.lock().clone(),
        lag_ms: recorder.lag_ms.lock().clone(),
        errors: errors.into_inner(),
    };
    Ok((pass, finished.into_inner()))
}

/// One session through the in-process API; returns it and its suspension cycles. It takes
/// the same steps as a cycle over HTTP: a stream follows the run until it settles, the calls
/// to answer are read off it (`run_suspended` lists them, `tool_approval_request` marks
/// approvals), and after the answers and the resume a new stream follows the resumed run from
/// where the resume says it starts.
async fn cycle_in_process(
    runtime: &Runtime,
    recorder: &Recorder,
) -> anyhow::Result<(SessionId, u64)> {
    let id = SessionId::generate();
    let mut from = runtime.start_on(&id, AGENT, "go").await?.from_seq;
    let mut cycles = 0;
    loop {
        let mut stream = Box::pin(runtime.follow(&id, from));
        let mut approvals = std::collections::HashMap::new();
        let waiting = loop {
            let chunk = stream.next().await.context("the stream ended early")??;
            recorder.lag(chunk.at_ms);
            match chunk.kind {
                ChunkKind::ToolApprovalRequest {
                    tool_call_id,
                    approval_id,
                    ..
                } => {
                    approvals.insert(tool_call_id, approval_id);
                }
                ChunkKind::RunSuspended { tool_call_ids, .. } => break tool_call_ids,
                ChunkKind::RunEnd { status, .. } => {
                    anyhow::ensure!(status == Status::Completed, "{id} ended {status}");
                    return Ok((id, cycles));
                }
                ChunkKind::RunInterrupted { .. } => anyhow::bail!("{id} was interrupted"),
                _ => {}
            }
        };
        drop(stream);
        for call in waiting {
            let submit = match approvals.remove(&call) {
                Some(approval) => Submit::approval(id.as_str(), &call, approval, true, None),
                None => Submit::result(id.as_str(), &call, json!({ "answer": "yes" })),
            };
            let sent = Instant::now();
            let outcome = runtime.submit_tool_result(submit).await?;
            recorder.submit(sent.elapsed());
            anyhow::ensure!(outcome == SubmitOutcome::Accepted, "{id}: {outcome:?}");
        }
        from = runtime.start_resume(&id).await?.from_seq;
        cycles += 1;
    }
}

/// After a pass, untimed: each session has exactly one answer of its client tool.
fn one_answer(messages: &[Value]) -> bool {
    messages
        .iter()
        .filter(|message| message["tool_name"] == "ask_user")
        .count()
        == 1
}

async fn run_http(
    client: &Arc<HttpClient>,
    agent: &'static str,
    args: &Args,
) -> anyhow::Result<Pass> {
    let (pass, sessions) = run_pass(args, "over HTTP", |recorder| {
        let client = Arc::clone(client);
        async move { cycle_over_http(&client, &client, agent, &recorder).await }
    })
    .await?;
    check_answers(client, pass, sessions).await
}

/// Adds to the pass's errors each session that does not have exactly one answer.
pub(crate) async fn check_answers(
    client: &HttpClient,
    mut pass: Pass,
    sessions: Vec<(String, String)>,
) -> anyhow::Result<Pass> {
    for (id, token) in sessions {
        let messages = client
            .get(&format!("/messages?session_id={id}"), &token)
            .await?;
        if !messages["messages"]
            .as_array()
            .is_some_and(|all| one_answer(all))
        {
            pass.errors
                .push(format!("over HTTP: {id} does not have exactly one answer"));
        }
    }
    Ok(pass)
}

/// One session over HTTP; returns its id, token and suspension cycles. The start answers
/// with the run's stream (`POST /start?stream=true`: first the start's JSON, then the chunks
/// until the run settles); the calls to answer are read off it, and the last answer of a
/// suspension resumes the run and streams it in the same request
/// (`?resume=true&stream=true`). Each stream is read to its end, so its connection goes back
/// to the pool: two requests a cycle.
///
/// The start goes to `client`, the answers to `answers` (another node of a cluster, say).
pub(crate) async fn cycle_over_http(
    client: &HttpClient,
    answers: &HttpClient,
    agent: &str,
    recorder: &Recorder,
) -> anyhow::Result<((String, String), u64)> {
    let (mut events, id, token) = start_over_http(client, agent).await?;
    let mut cycles = 0;
    loop {
        let mut approvals = std::collections::HashMap::new();
        let mut waiting = None;
        while let Some(event) = events.next().await? {
            if let Some(at) = event.at_ms {
                recorder.lag(at);
            }
            let Some(kind) = event.kind else { continue };
            match kind.name.as_str() {
                "tool_approval_request" => {
                    if let (Some(call), Some(approval)) = (kind.tool_call_id, kind.approval_id) {
                        approvals.insert(call, approval);
                    }
                }
                "run_suspended" => waiting = Some(kind.tool_call_ids),
                "run_end" => {
                    let status = kind.status.unwrap_or_default();
                    anyhow::ensure!(status == "completed", "{id} ended {status}");
                    while events.next().await?.is_some() {}
                    return Ok(((id, token), cycles));
                }
                _ => {}
            }
        }
        let waiting = waiting.context("the stream ended before the run settled")?;
        let last = waiting.len().saturating_sub(1);
        for (index, call) in waiting.into_iter().enumerate() {
            let approval = approvals.remove(&call);
            let envelope = Envelope::new(&id, &call, approval.as_deref());
            let sent = Instant::now();
            if index < last {
                let answer = answers
                    .post("/submit-tool-result", Some(&token), &envelope)
                    .await?;
                recorder.submit(sent.elapsed());
                anyhow::ensure!(answer["code"] == "accepted", "{id}: {answer}");
                continue;
            }
            let path = "/submit-tool-result?resume=true&stream=true";
            events = answers.stream(path, Some(&token), &envelope).await?;
            let answer = events.next().await?.context("no accepted event")?;
            recorder.submit(sent.elapsed());
            let code = answer.code.unwrap_or_default();
            anyhow::ensure!(code == "accepted", "{id}: answered {code}");
        }
        cycles += 1;
    }
}

/// The body of `POST /start`.
/// Starts a session of `agent` on `client` with its stream: the stream after its `started`
/// event, the session and its token.
async fn start_over_http<'a>(
    client: &'a HttpClient,
    agent: &str,
) -> anyhow::Result<(crate::http_client::Events<'a>, String, String)> {
    let body = StartBody {
        agent,
        message: MESSAGE,
    };
    let mut events = client.stream("/start?stream=true", None, &body).await?;
    let started = events.next().await?.context("no started event")?;
    let id = started.session_id.context("no session_id")?;
    let token = started.token.context("no token")?;
    Ok((events, id, token))
}

/// Starts a session of `agent` on `client` and reads its stream until the run waits: the
/// session, its token and the call it waits on.
pub(crate) async fn suspend_over_http(
    client: &HttpClient,
    agent: &str,
) -> anyhow::Result<(String, String, String)> {
    let (mut events, id, token) = start_over_http(client, agent).await?;
    while let Some(event) = events.next().await? {
        if let Some(kind) = event.kind {
            if kind.name == "run_suspended" {
                let call = kind.tool_call_ids.into_iter().next();
                return Ok((id, token, call.context("suspended on no call")?));
            }
        }
    }
    anyhow::bail!("{id}: the stream ended before the run waited")
}

/// Answers client tool `call` of session `id` on `client` (an answer that is not 2xx is an
/// error).
pub(crate) async fn answer_over_http(
    client: &HttpClient,
    id: &str,
    token: &str,
    call: &str,
) -> anyhow::Result<Value> {
    client
        .post(
            "/submit-tool-result",
            Some(token),
            &Envelope::new(id, call, None),
        )
        .await
}

#[derive(serde::Serialize)]
struct StartBody<'a> {
    agent: &'a str,
    message: &'a str,
}

/// The body of `POST /submit-tool-result`: `yes` to a client tool, or an approval.
#[derive(serde::Serialize)]
struct Envelope<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    session_id: &'a str,
    tool_call_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    approved: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Yes>,
}

#[derive(serde::Serialize)]
struct Yes {
    answer: &'static str,
}

impl<'a> Envelope<'a> {
    fn new(session: &'a str, call: &'a str, approval: Option<&'a str>) -> Self {
        Self {
            kind: approval.map(|_| "approval-response"),
            session_id: session,
            tool_call_id: call,
            approval_id: approval,
            approved: approval.map(|_| true),
            result: approval.is_none().then_some(Yes { answer: "yes" }),
        }
    }
}

/// RSS growth per open SSE stream: N sessions suspend, then N streams stay open on them.
async fn stream_memory(
    client: &Arc<HttpClient>,
    agent: &str,
    count: usize,
) -> anyhow::Result<(usize, u64)> {
    let mut sessions = Vec::with_capacity(count);
    for _ in 0..count {
        let started = client
            .post(
                "/start",
                None,
                &StartBody {
                    agent,
                    message: MESSAGE,
                },
            )
            .await?;
        let id = started["session_id"]
            .as_str()
            .context("no session_id")?
            .to_string();
        let token = started["token"].as_str().context("no token")?.to_string();
        sessions.push((id, token));
    }
    // Every session settles (suspends) before the streams open, so they stay idle.
    for (id, token) in &sessions {
        let path = format!("/sse?session_id={id}");
        let answer = client.send("GET", &path, Some(token), &[]).await?;
        let mut events = Events::new(answer);
        while events.next().await?.is_some() {}
    }
    let before = Memory::read()?.rss();
    let mut open = Vec::with_capacity(count);
    for (id, token) in &sessions {
        // From past the end: the stream waits for what comes next, idle.
        let path = format!("/sse?session_id={id}&until=closed&from=1000000");
        let answer = client.send("GET", &path, Some(token), &[]).await?;
        anyhow::ensure!(
            (200..300).contains(&answer.status),
            "sse answered {}",
            answer.status
        );
        open.push(answer);
    }
    let after = Memory::read()?.rss();
    drop(open);
    Ok((count, after.saturating_sub(before) / count.max(1) as u64))
}

fn print(args: &Args, in_process: &[Pass], over_http: &[Pass], streams: Option<(usize, u64)>) {
    let mean = |passes: &[Pass]| {
        passes.iter().map(Pass::cycles_per_second).sum::<f64>() / passes.len().max(1) as f64
    };
    if args.json {
        let pass_json = |pass: &Pass| {
            json!({
                "sessions": pass.sessions, "cycles": pass.cycles, "seconds": pass.elapsed.as_secs_f64(),
                "cycles_per_second": pass.cycles_per_second(),
                "submit_p50_us": pass.submit_us.value_at_quantile(0.5),
                "submit_p99_us": pass.submit_us.value_at_quantile(0.99),
                "lag_p50_ms": pass.lag_ms.value_at_quantile(0.5),
                "lag_p99_ms": pass.lag_ms.value_at_quantile(0.99),
                "errors": pass.errors.len(),
            })
        };
        let report = json!({
            "concurrency": args.concurrency,
            "in_process": in_process.iter().map(pass_json).collect::<Vec<_>>(),
            "http": over_http.iter().map(pass_json).collect::<Vec<_>>(),
            "http_over_in_process": mean(over_http) / mean(in_process).max(f64::EPSILON),
            "sse_streams": streams.map(|(count, bytes)| json!({ "open": count, "rss_bytes_per_stream": bytes })),
        });
        println!("{report}");
        return;
    }
    println!("suspension cycles, {} at a time:", args.concurrency);
    for (round, (local, remote)) in in_process.iter().zip(over_http).enumerate() {
        println!("round {}:", round + 1);
        println!("  {}", local.line("in process"));
        println!("  {}", remote.line("over HTTP"));
    }
    println!(
        "HTTP / in process: {:.2} (mean cycles/s {:.0} / {:.0})",
        mean(over_http) / mean(in_process).max(f64::EPSILON),
        mean(over_http),
        mean(in_process)
    );
    if let Some((count, bytes)) = streams {
        println!(
            "{count} open SSE streams: RSS +{:.1} KiB per stream (server and client ends, one process)",
            bytes as f64 / 1024.0
        );
    }
}
