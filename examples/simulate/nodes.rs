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
    // Every node signs and checks session tokens with one key, so any node takes any token.
    let keys = tempfile::tempdir()?;
    let key_file = keys.path().join("token.key");
    TokenKey::load_or_create(&key_file)?;
    let mut nodes = Vec::with_capacity(count);
    for index in 0..count {
        let (process, base) = start_node(index, &key_file)?;
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

/// Starts node `index` as a process of its own (this program with `--serve-node`): the
/// process, and the address it serves at.
fn start_node(index: usize, key_file: &Path) -> anyhow::Result<(Child, String)> {
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
fn stop_node(process: &mut Child) -> anyhow::Result<()> {
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
    let store = Arc::new(
        PgStore::builder(&url)
            .node(format!("sim-{index}"))
            .advertise(base.clone())
            .connect()
            .await?,
    );
    let runtime = http::cycle_runtime(
        Arc::clone(&store) as Arc<dyn dormant::Store>,
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

/// A connection of the simulator's own to the database, to read what the passes cost.
struct Database(tokio_postgres::Client);

impl Database {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        Ok(Self(client))
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
