//! The kill test of issue 18: three `dormant-server` nodes share one PostgreSQL database
//! (a throwaway cluster) under a mixed workload of demo sessions (a server tool, a client
//! tool answered over HTTP, an approval-gated tool that is not safe to retry). Meanwhile one
//! node at a time is SIGKILLed at a random moment and started again after longer than a
//! lease, repeatedly. The clients send every request to a random live node and retry
//! elsewhere while the answer is 503 or the connection breaks.
//!
//! What must hold: the dead node's sessions go on on the others (every session ends
//! completed); every answer a node acknowledged (200) is in its session exactly once; the
//! gated tool is in each session at most once; and the client-tool deadlines of sessions
//! nobody answers fire although their owner was killed.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use common::binary::Binary;
use parking_lot::Mutex;
use reqwest::StatusCode;
use serde_json::{json, Value};

const NODES: usize = 3;
const SESSIONS: usize = 12;
/// Sessions whose client call nobody answers: its deadline fires.
const UNANSWERED: usize = 3;
const KILLS: usize = 5;
const LEASE_TTL_MS: u64 = 600;
const CLIENT_TOOL_TIMEOUT_MS: u64 = 5_000;
/// The longest the whole workload may take.
const BUDGET: Duration = Duration::from_secs(90);

/// A deterministic source of "random" choices (xorshift), its seed printed by the test.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// The three nodes: each slot holds the running process, or nothing while it is down.
struct Nodes {
    url: String,
    key: PathBuf,
    slots: Mutex<Vec<Option<Binary>>>,
    choices: Mutex<Choices>,
    /// Unanswered sessions started on node 0 (the first kill waits for all of them).
    unanswered_started: std::sync::atomic::AtomicUsize,
}

impl Nodes {
    fn start(&self, index: usize) -> anyhow::Result<Binary> {
        let key = self.key.to_string_lossy().into_owned();
        let (ttl, timeout) = (LEASE_TTL_MS.to_string(), CLIENT_TOOL_TIMEOUT_MS.to_string());
        Binary::start_with_env(
            Path::new(&self.url),
            "127.0.0.1:0",
            &[
                "--token-key-file",
                &key,
                "--node-name",
                &format!("node-{index}"),
                "--lease-ttl-ms",
                &ttl,
                "--client-tool-timeout-ms",
                &timeout,
            ],
            // A node's requests for the sessions of a killed node log at warn: too many to read.
            &[("RUST_LOG", "error")],
        )
    }

    /// The address of node `index`, if it is up.
    fn base(&self, index: usize) -> Option<String> {
        self.slots.lock()[index]
            .as_ref()
            .map(|binary| binary.base.clone())
    }

    /// The address of a random live node.
    fn any(&self) -> Option<String> {
        let slots = self.slots.lock();
        let live: Vec<&Binary> = slots.iter().flatten().collect();
        let pick = self.choices.lock().below(live.len() as u64) as usize;
        live.get(pick).map(|binary| binary.base.clone())
    }
}

/// Sends a request to random live nodes until one answers with something other than 503
/// (another node owns the session and cannot be reached yet, say) or a broken connection.
async fn request(
    nodes: &Nodes,
    http: &reqwest::Client,
    post: Option<&Value>,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(StatusCode, Value)> {
    let started = Instant::now();
    loop {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "{path}: no node answered for 30 s"
        );
        let Some(base) = nodes.any() else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let url = format!("{base}{path}");
        let mut request = match post {
            Some(body) => http.post(url).json(body),
            None => http.get(url),
        };
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.timeout(Duration::from_secs(10)).send().await {
            Ok(response) if response.status() != StatusCode::SERVICE_UNAVAILABLE => {
                let status = response.status();
                let body = response.json().await.unwrap_or_default();
                return Ok((status, body));
            }
            // A node that is down, dying, or not yet the owner: ask again, maybe elsewhere.
            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// What a client acknowledged for one session.
#[derive(Debug, Default)]
struct Acknowledged {
    /// The answer a node accepted (200) for its client call.
    answer: Option<String>,
}

/// Drives one session to its end, reading where it stands from `GET /status` (which waits
/// for it to settle, on its owner) and doing what that calls for.
async fn drive(
    nodes: Arc<Nodes>,
    index: usize,
    answered: bool,
) -> anyhow::Result<(String, String, Acknowledged)> {
    let http = reqwest::Client::new();
    let start = json!({ "agent": "demo", "message": format!("weather in Porto, session {index}") });
    let started = if answered {
        let (code, started) = request(&nodes, &http, Some(&start), "/start", None).await?;
        anyhow::ensure!(code == StatusCode::ACCEPTED, "start: {code} {started}");
        started
    } else {
        // On node 0, which the first kill takes down for longer than the call's deadline.
        let base = nodes
            .base(0)
            .context("node 0 is up until these have started")?;
        let response = http
            .post(format!("{base}/start"))
            .json(&start)
            .send()
            .await?;
        anyhow::ensure!(response.status() == StatusCode::ACCEPTED, "start on node 0");
        let started: Value = response.json().await?;
        nodes
            .unanswered_started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        started
    };
    let id = started["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let token = started["token"].as_str().context("token")?.to_string();
    let mut acknowledged = Acknowledged::default();
    let began = Instant::now();
    loop {
        anyhow::ensure!(began.elapsed() < BUDGET, "{id} did not finish");
        let path = format!("/status?session_id={id}&settle_ms=1000");
        let (code, status) = request(&nodes, &http, None, &path, Some(&token)).await?;
        anyhow::ensure!(code == StatusCode::OK, "status of {id}: {code} {status}");
        let state = status["status"].as_str().unwrap_or_default().to_string();
        if state == "completed" {
            return Ok((id, token, acknowledged));
        }
        anyhow::ensure!(
            state != "failed" && state != "aborted",
            "{id} ended {status}"
        );
        let waiting: Vec<&Value> = status["pending"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|call| call["waiting"] == true)
            .collect();
        let envelope = waiting
            .iter()
            .find_map(|call| match call["tool_name"].as_str() {
                Some("ask_user") if answered => Some(json!({
                    "session_id": id, "tool_call_id": call["tool_call_id"],
                    "result": { "answer": format!("Porto-{index}") },
                })),
                Some("publish") => Some(json!({
                    "kind": "approval-response", "session_id": id,
                    "tool_call_id": call["tool_call_id"], "approval_id": call["approval_id"],
                    "approved": true,
                })),
                _ => None,
            });
        if let Some(envelope) = envelope {
            let (code, body) = request(
                &nodes,
                &http,
                Some(&envelope),
                "/submit-tool-result",
                Some(&token),
            )
            .await?;
            match code {
                StatusCode::OK if envelope["result"].is_object() => {
                    acknowledged.answer = Some(format!("Porto-{index}"));
                }
                // Accepted, or accepted before a retry (the node died after it answered).
                StatusCode::OK | StatusCode::CONFLICT => {}
                _ => anyhow::bail!("submit to {id}: {code} {body}"),
            }
            continue;
        }
        let resumable = state != "running" && waiting.is_empty();
        if resumable {
            let resume = json!({ "session_id": id });
            let (code, body) =
                request(&nodes, &http, Some(&resume), "/resume", Some(&token)).await?;
            // 409: the run goes on already (an automatic resume, or another node's).
            anyhow::ensure!(
                code == StatusCode::ACCEPTED || code == StatusCode::CONFLICT,
                "resume of {id}: {code} {body}"
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Kills node 0 once the unanswered sessions started there and keeps it down past their
/// deadline (the others must fire it); then kills a random node at a random moment, keeps it
/// down longer than a lease (so the others take its sessions over) and starts it again,
/// `KILLS - 1` times.
async fn killer(nodes: Arc<Nodes>) -> anyhow::Result<usize> {
    let started = Instant::now();
    while nodes
        .unanswered_started
        .load(std::sync::atomic::Ordering::SeqCst)
        < UNANSWERED
    {
        anyhow::ensure!(
            started.elapsed() < BUDGET,
            "the unanswered sessions never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut kills = 0;
    for round in 0..KILLS {
        let (wait, victim, down) = {
            let mut choices = nodes.choices.lock();
            match round {
                0 => (choices.below(300), 0, CLIENT_TOOL_TIMEOUT_MS + 1_500),
                _ => (
                    choices.below(700) + 100,
                    choices.below(NODES as u64) as usize,
                    choices.below(600) + LEASE_TTL_MS + 300,
                ),
            }
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let binary = nodes.slots.lock()[victim].take();
        if let Some(binary) = binary {
            binary.kill()?;
            kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(down)).await;
        let restarted = nodes.start(victim)?;
        nodes.slots.lock()[victim] = Some(restarted);
    }
    Ok(kills)
}

/// The tool messages of a session, by tool name.
fn tool_messages(messages: &Value) -> HashMap<String, Vec<Value>> {
    let mut by_tool: HashMap<String, Vec<Value>> = HashMap::new();
    for message in messages["messages"].as_array().into_iter().flatten() {
        if message["role"] == "tool" {
            let tool = message["tool_name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            by_tool.entry(tool).or_default().push(message.clone());
        }
    }
    by_tool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_lose_one_at_a_time_and_every_answer_is_applied_once() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let seed = std::env::var("DORMANT_KILL_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5eed_0018_u64);
    println!("kill test seed {seed} (DORMANT_KILL_SEED to replay)");
    let nodes = Arc::new(Nodes {
        url: format!("postgres://postgres@{}", cluster.address()),
        key: dir.path().join("token-key"),
        slots: Mutex::new(Vec::new()),
        choices: Mutex::new(Choices(seed.max(1))),
        unanswered_started: std::sync::atomic::AtomicUsize::new(0),
    });
    for index in 0..NODES {
        let binary = nodes.start(index)?;
        nodes.slots.lock().push(Some(binary));
    }

    let killing = tokio::spawn(killer(Arc::clone(&nodes)));
    let drivers: Vec<_> = (0..SESSIONS)
        .map(|index| tokio::spawn(drive(Arc::clone(&nodes), index, index >= UNANSWERED)))
        .collect();
    let mut sessions = Vec::new();
    for driver in drivers {
        sessions.push((sessions.len(), driver.await??));
    }
    let kills = killing.await??;
    assert_eq!(kills, KILLS, "every kill found its node running");

    let http = reqwest::Client::new();
    let acknowledged_answers = sessions
        .iter()
        .filter(|(_, (_, _, acknowledged))| acknowledged.answer.is_some())
        .count();
    println!("{kills} kills; {acknowledged_answers} answers acknowledged");
    assert!(acknowledged_answers > 0, "the workload answered some calls");
    for (index, (id, token, acknowledged)) in sessions {
        let path = format!("/messages?session_id={id}");
        let (code, messages) = request(&nodes, &http, None, &path, Some(&token)).await?;
        assert_eq!(code, StatusCode::OK, "{messages}");
        let tools = tool_messages(&messages);
        let asks = tools.get("ask_user").cloned().unwrap_or_default();
        assert_eq!(
            asks.len(),
            1,
            "{id}: one result for the client call: {asks:?}"
        );
        let ask = asks[0].to_string();
        match (&acknowledged.answer, index < UNANSWERED) {
            (Some(answer), _) => assert!(
                ask.contains(answer.as_str()),
                "{id}: the acknowledged answer {answer} is the call's result: {ask}"
            ),
            (None, true) => assert!(
                ask.contains("client_tool_timeout"),
                "{id}: nobody answered, so its deadline fired: {ask}"
            ),
            // Answered but acknowledged only as a conflict: the deadline came first, or a
            // node accepted it and died before it answered (then it is the result).
            (None, false) => assert!(
                ask.contains("client_tool_timeout") || ask.contains(&format!("Porto-{index}")),
                "{id}: {ask}"
            ),
        }
        let published = tools.get("publish").map_or(0, Vec::len);
        assert!(
            published <= 1,
            "{id}: the tool that is not safe to retry ran {published} times: {messages}"
        );
    }
    // The dead nodes' sessions moved: their leases were taken over (the epoch grew).
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let moved: i64 = sql
        .query_one("SELECT count(*) FROM dormant_leases WHERE epoch > 1", &[])
        .await?
        .get(0);
    println!("{moved} leases taken over");
    assert!(moved > 0, "some sessions moved to another node");
    drop(nodes);
    Ok(())
}
