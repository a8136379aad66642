//! `--postgres URL --nodes N`: the HTTP mode's suspension cycles on N dormant nodes sharing
//! one PostgreSQL database, beside the same cycles on one node on a sled store, in the same
//! run (`--http-rounds` rounds, alternating which goes first).
//!
//! Each node is a process of its own: this program started again with `--serve-node I`,
//! a runtime with a `PgStore` (node name `sim-I`) and a `dormant-server` router on a loopback
//! port it advertises to the others and prints on its first line of output; it serves until
//! its standard input closes (this process ended, whichever way). The nodes share the
//! database and a token key file, nothing else. Session K starts on node K mod N, which owns
//! it from then on. Its answers go to that node, or with `--cross-node` to the next one,
//! which sends each on to the owner (every answer then crosses two nodes). The report adds,
//! for the PostgreSQL pass, the transactions the database committed (reads, lease changes
//! and commits) and the WAL flushes it made, per cycle.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dormant::PgStore;
use dormant_server::{Auth, Server, TokenKey};
use serde_json::json;

use crate::http::{self, Pass};
use crate::http_client::HttpClient;
use crate::Args;

/// One node of the cluster: its process, and a client to it.
struct Node {
    process: Child,
    client: Arc<HttpClient>,
}

/// The PostgreSQL pass's cost in the database.
#[derive(Clone, Copy, Debug, Default)]
struct DbCost {
    transactions: u64,
    wal_flushes: u64,
}

/// Runs the mode; returns how many problems it found.
pub(crate) async fn simulate(args: Args, url: String, count: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(count > 0, "--nodes must be at least 1");
    let (_keys, _key_file, started) = start_nodes(count)?;
    let mut nodes = Vec::with_capacity(count);
    for (process, base) in started {
        let client = Arc::new(HttpClient::new(&base)?);
        nodes.push(Node { process, client });
    }
    let database = Database::connect(&url).await?;
    let (_temp, _path, sled) = crate::open_store(&args)?;
    let single = http::cycle_runtime(sled, None, &args)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let single_client = Arc::new(HttpClient::new(&format!(
        "http://{}",
        listener.local_addr()?
    ))?);
    let single_served = http::serve(
        Server::new(single.clone(), Auth::allow_unauthenticated()),
        listener,
    )?;

    let pids: Vec<u32> = nodes.iter().map(|node| node.process.id()).collect();
    let pauses = args
        .pause_ms
        .map(|ms| Pauser::start(pids, Duration::from_millis(ms)));
    let mut on_postgres = Vec::new();
    let mut on_sled = Vec::new();
    let mut costs = Vec::new();
    for round in 0..args.http_rounds.max(1) {
        for postgres_first in [round % 2 == 0, round % 2 == 1] {
            if postgres_first {
                let before = database.cost().await?;
                on_postgres.push(run_cluster(&nodes, &args).await?);
                let after = database.cost().await?;
                costs.push(DbCost {
                    transactions: after.transactions.saturating_sub(before.transactions),
                    wal_flushes: after.wal_flushes.saturating_sub(before.wal_flushes),
                });
            } else {
                let client = Arc::clone(&single_client);
                let (pass, sessions) = http::run_pass(&args, "one sled node", |recorder| {
                    let client = Arc::clone(&client);
                    async move { http::cycle_over_http(&client, &client, "cycle", &recorder).await }
                })
                .await?;
                on_sled.push(http::check_answers(&single_client, pass, sessions).await?);
            }
        }
    }

    if let Some(pauses) = pauses {
        let made = pauses.stop()?;
        // Each tree's lease is taken once by the node its session started on; a lease taken
        // again was lost by a pause (to its node's own renewal, or to another node).
        let lost = database.leases_taken_again().await?;
        println!(
            "pauses: {made} of {} ms (SIGSTOP, then SIGCONT) during the PostgreSQL passes; leases lost meanwhile: {lost}",
            args.pause_ms.unwrap_or_default()
        );
    }
    for mut node in nodes {
        stop_node(&mut node.process)?;
    }
    single_served.stop().await?;
    single.shutdown().await?;

    let problems: Vec<&String> = on_postgres
        .iter()
        .chain(&on_sled)
        .flat_map(|pass| &pass.errors)
        .collect();
    for problem in problems.iter().take(20) {
        eprintln!("problem: {problem}");
    }
    print(&args, count, &on_postgres, &on_sled, &costs);
    Ok(problems.len())
}

/// A started node: its process, and the address it serves at.
pub(crate) type Started = (Child, String);

/// Starts `count` nodes that share a token key: every node signs and checks session tokens
/// with one key, so any node takes any token. The key's directory (kept while the nodes run),
/// its file (to start a node again), and the nodes.
pub(crate) fn start_nodes(
    count: usize,
) -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf, Vec<Started>)> {
    let keys = tempfile::tempdir()?;
    let key_file = keys.path().join("token.key");
    TokenKey::load_or_create(&key_file)?;
    let started = (0..count)
        .map(|index| start_node(index, &key_file))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((keys, key_file, started))
}

/// Starts node `index` as a process of its own (this program with `--serve-node`): the
/// process, and the address it serves at.
pub(crate) fn start_node(index: usize, key_file: &Path) -> anyhow::Result<Started> {
    let mut process = Command::new(std::env::current_exe()?)
        .args(std::env::args_os().skip(1))
        .arg("--serve-node")
        .arg(index.to_string())
        .arg("--token-key-file")
        .arg(key_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    if let Some(stdout) = process.stdout.take() {
        BufReader::new(stdout).read_line(&mut line)?;
    }
    match line.trim().strip_prefix("listening ") {
        Some(base) => Ok((process, base.to_string())),
        None => {
            let _ = process.kill();
            let status = process.wait()?;
            anyhow::bail!("node {index} did not start ({status}): {line:?}")
        }
    }
}

/// Closes a node's standard input (it shuts down) and waits for it.
pub(crate) fn stop_node(process: &mut Child) -> anyhow::Result<()> {
    drop(process.stdin.take());
    let status = process.wait()?;
    anyhow::ensure!(status.success(), "a node ended with {status}");
    Ok(())
}

/// `--serve-node INDEX`: one node of the cluster, until standard input closes.
pub(crate) async fn serve_node(args: Args, url: String, index: usize) -> anyhow::Result<()> {
    let key_file = args
        .token_key_file
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--serve-node needs --token-key-file"))?;
    let key = TokenKey::load_or_create(&key_file)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let mut builder = PgStore::builder(&url)
        .node(format!("sim-{index}"))
        .advertise(base.clone());
    if let Some(ms) = args.lease_ttl_ms {
        builder = builder.lease_ttl(Duration::from_millis(ms));
    }
    let store = Arc::new(builder.connect().await?);
    let runtime = http::cycle_runtime(
        Arc::clone(&store) as Arc<dyn dormant::store::Store>,
        Some(Arc::clone(&store) as Arc<dyn dormant::cluster::leases::Leases>),
        &args,
    )?;
    let server = Server::new(runtime.clone(), Auth::allow_unauthenticated()).token_key(key);
    let served = http::serve(server, listener)?;
    println!("listening {base}");
    // Standard input closes when the simulator ends it, or when the simulator is gone.
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    served.stop().await?;
    runtime.shutdown().await?;
    Ok(())
}

/// Pauses the nodes one after another (SIGSTOP, then SIGCONT after the pause), from a thread
/// of its own, until stopped.
struct Pauser {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<usize>>,
}

impl Pauser {
    fn start(pids: Vec<u32>, pause: Duration) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut made = 0;
            while !stopped.load(Ordering::Relaxed) {
                // Between pauses, as long again: every node runs most of the time.
                std::thread::sleep(pause);
                let pid = pids[made % pids.len()].to_string();
                signal("-STOP", &pid)?;
                std::thread::sleep(pause);
                signal("-CONT", &pid)?;
                made += 1;
            }
            Ok(made)
        });
        Self { stop, thread }
    }

    /// Stops pausing (no node is left paused): how many pauses were made.
    fn stop(self) -> anyhow::Result<usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the pausing thread panicked"))?
    }
}

fn signal(which: &str, pid: &str) -> anyhow::Result<()> {
    let status = Command::new("kill").args([which, pid]).status()?;
    anyhow::ensure!(status.success(), "kill {which} {pid} failed");
    Ok(())
}

/// A connection of the simulator's own to the database, to read what the passes cost.
struct Database(tokio_postgres::Client);

impl Database {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(Self(client))
    }

    /// How many leases were taken more than once (their epoch rose past the first take).
    async fn leases_taken_again(&self) -> anyhow::Result<i64> {
        let row = self
            .0
            .query_one("SELECT count(*) FROM dormant_leases WHERE epoch > 1", &[])
            .await?;
        Ok(row.try_get(0)?)
    }

    /// The transactions the database committed and the WAL flushes it made so far.
    async fn cost(&self) -> anyhow::Result<DbCost> {
        // A busy backend reports its statistics about every second: a pass of many seconds
        // hides that lag.
        let row = self
            .0
            .query_one(
                "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                 (SELECT wal_sync FROM pg_stat_wal)",
                &[],
            )
            .await?;
        let read = |value: i64| u64::try_from(value).unwrap_or_default();
        Ok(DbCost {
            transactions: read(row.try_get(0)?),
            wal_flushes: read(row.try_get(1)?),
        })
    }
}

/// One pass over the cluster: session K starts on node K mod N; its answers go to its owner,
/// or with `--cross-node` to the next node.
async fn run_cluster(nodes: &[Node], args: &Args) -> anyhow::Result<Pass> {
    let next = AtomicUsize::new(0);
    let hop = usize::from(args.cross_node);
    let name = format!("{} nodes", nodes.len());
    let (mut pass, sessions) = http::run_pass(args, &name, |recorder| {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let owner = Arc::clone(&nodes[index % nodes.len()].client);
        let answers = Arc::clone(&nodes[(index + hop) % nodes.len()].client);
        async move { http::cycle_over_http(&owner, &answers, "cycle", &recorder).await }
    })
    .await?;
    // Each session is checked on a node that does not own it: the reads of any node agree.
    let errors = std::mem::take(&mut pass.errors);
    let mut pass = http::check_answers(&nodes[nodes.len() - 1].client, pass, sessions).await?;
    pass.errors.extend(errors);
    Ok(pass)
}

fn print(args: &Args, count: usize, on_postgres: &[Pass], on_sled: &[Pass], costs: &[DbCost]) {
    let mean = |passes: &[Pass]| {
        passes.iter().map(Pass::cycles_per_second).sum::<f64>() / passes.len().max(1) as f64
    };
    let cycles: u64 = on_postgres.iter().map(|pass| pass.cycles).sum();
    let per_cycle = |total: u64| total as f64 / cycles.max(1) as f64;
    let transactions = per_cycle(costs.iter().map(|cost| cost.transactions).sum());
    let wal_flushes = per_cycle(costs.iter().map(|cost| cost.wal_flushes).sum());
    let ratio = mean(on_postgres) / mean(on_sled).max(f64::EPSILON);
    if args.json {
        let pass_json = |pass: &Pass| {
            json!({
                "cycles": pass.cycles, "seconds": pass.elapsed.as_secs_f64(),
                "cycles_per_second": pass.cycles_per_second(),
                "submit_p50_us": pass.submit_us.value_at_quantile(0.5),
                "submit_p99_us": pass.submit_us.value_at_quantile(0.99),
                "errors": pass.errors.len(),
            })
        };
        let report = json!({
            "nodes": count, "cross_node": args.cross_node, "concurrency": args.concurrency,
            "postgres": on_postgres.iter().map(pass_json).collect::<Vec<_>>(),
            "sled": on_sled.iter().map(pass_json).collect::<Vec<_>>(),
            "postgres_over_sled": ratio,
            "transactions_per_cycle": transactions,
            "wal_flushes_per_cycle": wal_flushes,
        });
        println!("{report}");
        return;
    }
    let routing = if args.cross_node {
        "answers through another node"
    } else {
        "answers to the owner"
    };
    println!(
        "suspension cycles over HTTP, {} at a time, {count} PostgreSQL node processes ({routing}) against one sled node:",
        args.concurrency
    );
    for (round, (postgres, sled)) in on_postgres.iter().zip(on_sled).enumerate() {
        println!("round {}:", round + 1);
        println!("  {}", postgres.line(&format!("{count} pg nodes")));
        println!("  {}", sled.line("1 sled node"));
    }
    println!(
        "PostgreSQL / sled: {ratio:.2} (mean cycles/s {:.0} / {:.0}); per cycle on PostgreSQL: {transactions:.2} database transactions (reads included), {wal_flushes:.2} WAL flushes",
        mean(on_postgres),
        mean(on_sled)
    );
}
