//! `--postgres URL --nodes N --failover ROUNDS`: how long a session is out when its owner
//! dies. Each round starts a session on one node (which owns it), waits until it is
//! suspended on its client tool, SIGKILLs that node, and answers the call at the next node
//! every 10 ms until the answer is accepted: the session was out from the kill to that
//! answer (the dead node's liveness must lapse, and the other node take the lease over). The
//! killed node is started again before the next round. At the default lease settings, as a
//! deployment would run, unless `--lease-ttl-ms` says otherwise. The nodes are started with
//! this program's own arguments, so they read the database URL and the lease setting there.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::http;
use crate::http_client::HttpClient;
use crate::nodes::{start_node, start_nodes, stop_node};

/// How long one round waits for the session to come back before it counts as lost.
const PATIENCE: Duration = Duration::from_secs(60);

/// How often the answer is tried again while the session is out.
const RETRY: Duration = Duration::from_millis(10);

/// Runs the mode; returns how many problems it found.
pub(crate) async fn simulate(count: usize, rounds: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(count >= 2, "--failover needs --nodes 2 or more");
    let (_keys, key_file, started) = start_nodes(count)?;
    let mut nodes = Vec::with_capacity(count);
    for (process, base) in started {
        nodes.push((process, HttpClient::new(&base)?));
    }
    let mut outages = Histogram::<u64>::new_with_bounds(1, 3_600_000, 3)?;
    let mut problems = Vec::new();
    for round in 0..rounds {
        let (victim, witness) = (round % count, (round + 1) % count);
        let (id, token, call) = http::suspend_over_http(&nodes[victim].1, "cycle").await?;
        nodes[victim].0.kill()?;
        nodes[victim].0.wait()?;
        let killed = Instant::now();
        let outcome = loop {
            match http::answer_over_http(&nodes[witness].1, &id, &token, &call).await {
                Ok(answer) => break Ok(answer),
                // Out: 503 while the dead owner still counts as live, then taken over.
                Err(_) if killed.elapsed() < PATIENCE => tokio::time::sleep(RETRY).await,
                Err(error) => break Err(error),
            }
        };
        let out = killed.elapsed();
        match outcome {
            Ok(answer) if answer["code"] == "accepted" => {
                outages.record(u64::try_from(out.as_millis())?.max(1))?;
                println!(
                    "round {round}: node {victim} killed, session answered at node {witness} after {} ms",
                    out.as_millis()
                );
            }
            Ok(answer) => problems.push(format!("round {round}: {id} answered {answer}")),
            Err(error) => problems.push(format!(
                "round {round}: {id} still out after {} s: {error:#}",
                out.as_secs()
            )),
        }
        let (process, base) = start_node(victim, &key_file)?;
        nodes[victim] = (process, HttpClient::new(&base)?);
    }
    for (mut process, _) in nodes {
        stop_node(&mut process)?;
    }
    for problem in &problems {
        eprintln!("problem: {problem}");
    }
    println!(
        "failover after SIGKILL, {} rounds on {count} nodes: out p50 {} ms, p99 {} ms, max {} ms",
        outages.len(),
        outages.value_at_quantile(0.5),
        outages.value_at_quantile(0.99),
        outages.max()
    );
    Ok(problems.len())
}
