//! The nested suspension cycle across a server boundary, beside the same tree with a local
//! child, in one process and one run:
//!
//! root → child → client tool → submit at the root → resume the root → completed
//!
//! `remote`: the child runs on a second runtime served by dormant-server on a loopback port
//! (the parent reaches it with `HttpRemoteAgents`, over dormant's own routes); `a2a`: the same
//! child on the same server, reached over A2A (`ToolDefinition::a2a_agent`: the server's A2A
//! endpoint, the child a task); `local`: the child is a sub-agent of the same runtime. Each
//! round runs `--trees` trees at once, each through one cycle; the rounds rotate which goes
//! first so that all see the same machine. Reports cycles/s and the cycle latency p50/p99 of
//! each, and the ratios.
//!
//! ```text
//! cargo run --release -p dormant-server --example remote_cycles -- --trees 100 --rounds 6
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, HttpRemoteAgents, Server, ServerConfig};
use hdrhistogram::Histogram;
use serde_json::json;

const KEY: &str = "bench-operator-key";

struct Args {
    trees: usize,
    rounds: usize,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        trees: 100,
        rounds: 6,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or(format!("{flag} needs a value"))?;
        let number = value
            .parse::<usize>()
            .map_err(|error| format!("{flag} {value}: {error}"))?;
        match flag.as_str() {
            "--trees" => args.trees = number.max(1),
            "--rounds" => args.rounds = number.max(1),
            other => return Err(format!("unknown flag {other} (--trees N, --rounds N)")),
        }
    }
    Ok(args)
}

/// Scripts replay by each session's model-call count, so one script serves every tree.
fn llm() -> ScriptedLlm {
    ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "d1",
                    "delegate",
                    json!({ "message": "ask" }),
                )]),
                ModelReply::text("lead done"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({}))]),
                ModelReply::text("helper done"),
            ],
        )
}

fn helper() -> Result<AgentDefinition, Box<dyn std::error::Error>> {
    Ok(AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?)
}

fn lead(delegate: ToolDefinition) -> Result<AgentDefinition, Box<dyn std::error::Error>> {
    Ok(AgentDefinition::builder("lead").tool(delegate).build()?)
}

/// One tree through one cycle; its latency.
async fn cycle(runtime: Runtime, root: String) -> Result<Duration, String> {
    let started = Instant::now();
    let id = root.parse().map_err(|error| format!("{error}"))?;
    let run = runtime
        .execute_on(&id, "lead", "go")
        .await
        .map_err(|error| error.to_string())?;
    if run.status != Status::SuspendedAwaitingChildren {
        return Err(format!("{root}: {run:?}"));
    }
    let outcome = runtime
        .submit_tool_result(Submit::result(root.as_str(), "q1", json!({ "ok": true })))
        .await
        .map_err(|error| error.to_string())?;
    if outcome != SubmitOutcome::Accepted {
        return Err(format!("{root}: submit {outcome:?}"));
    }
    let run = runtime
        .resume(&id)
        .await
        .map_err(|error| error.to_string())?;
    if run.status != Status::Completed {
        return Err(format!("{root}: resume {run:?}"));
    }
    Ok(started.elapsed())
}

/// One round: `trees` cycles at once. Wall time, and each cycle's latency into `histogram`.
async fn round(
    runtime: &Runtime,
    label: &str,
    round: usize,
    trees: usize,
    histogram: &mut Histogram<u64>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let cycles = (0..trees).map(|tree| {
        let runtime = runtime.clone();
        tokio::spawn(cycle(runtime, format!("{label}-{round}-{tree}")))
    });
    for done in futures::future::join_all(cycles).await {
        let latency = done??;
        histogram.record(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX))?;
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let dirs = (
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    );

    // The remote: `helper` served on a loopback port.
    let remote = Runtime::builder()
        .store(Arc::new(SledStore::open(dirs.0.path())?))
        .llm(Arc::new(llm()))
        .agent(helper()?)
        .build()?;
    let auth = Auth::api_key(KEY);
    // A message to its A2A endpoint starts the helper.
    let server =
        Server::new(remote.clone(), auth).config(ServerConfig::default().page_agent("helper"));
    let closing = server.closing();
    let app = server.router()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    // As the binary does: an SSE event is a small write, sent at once rather than after
    // Nagle's wait for the ACK of the one before (a 40 ms stall with delayed ACKs).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let stop = closing.clone();
    let served = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.closed().await })
            .await;
    });

    let remote_parent = Runtime::builder()
        .store(Arc::new(SledStore::open(dirs.1.path())?))
        .llm(Arc::new(llm()))
        .agent(lead(ToolDefinition::remote_sub_agent(
            "delegate", &endpoint, "helper",
        ))?)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .build()?;
    let a2a_parent = Runtime::builder()
        .store(Arc::new(SledStore::open(dirs.3.path())?))
        .llm(Arc::new(llm()))
        .agent(lead(ToolDefinition::a2a_agent("delegate", &endpoint))?)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .build()?;
    let local_parent = Runtime::builder()
        .store(Arc::new(SledStore::open(dirs.2.path())?))
        .llm(Arc::new(llm()))
        .agent(lead(ToolDefinition::sub_agent("delegate", "helper"))?)
        .agent(helper()?)
        .build()?;

    let parents = [
        (&local_parent, "local"),
        (&remote_parent, "remote"),
        (&a2a_parent, "a2a"),
    ];
    let mut histograms = [
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
        Histogram::<u64>::new(3)?,
    ];
    let mut walls = [Duration::ZERO; 3];
    // A warm-up round of each, not counted.
    let mut scratch = Histogram::<u64>::new(3)?;
    for (runtime, label) in parents {
        round(
            runtime,
            &format!("warm-{label}"),
            0,
            args.trees,
            &mut scratch,
        )
        .await?;
    }
    for index in 0..args.rounds {
        // Rotate which goes first, so none always runs on a warmer machine.
        for step in 0..parents.len() {
            let which = (index + step) % parents.len();
            let (runtime, label) = parents[which];
            walls[which] +=
                round(runtime, label, index, args.trees, &mut histograms[which]).await?;
        }
    }
    println!(
        "nested suspension cycle, {} trees at once, {} rounds each",
        args.trees, args.rounds
    );
    let mut rates = [0.0; 3];
    for (which, label) in [
        "local child       ",
        "remote child      ",
        "remote child (A2A)",
    ]
    .iter()
    .enumerate()
    {
        let histogram = &histograms[which];
        let cycles = histogram.len() as f64;
        rates[which] = cycles / walls[which].as_secs_f64();
        println!(
            "{label}: {:>8.0} cycles/s   p50 {:>7.2} ms   p99 {:>7.2} ms   ({} cycles)",
            rates[which],
            histogram.value_at_quantile(0.50) as f64 / 1000.0,
            histogram.value_at_quantile(0.99) as f64 / 1000.0,
            histogram.len()
        );
    }
    println!("remote / local cycles/s: {:.2}", rates[1] / rates[0]);
    println!("A2A / remote cycles/s: {:.2}", rates[2] / rates[1]);

    for runtime in [&remote_parent, &a2a_parent, &local_parent] {
        runtime.shutdown().await?;
    }
    closing.close();
    let _ = served.await;
    remote.shutdown().await?;
    Ok(())
}
