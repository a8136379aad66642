//! How the server answers ordinary requests while a thousand slow clients hold connections,
//! and once they have gone.
//!
//! Each slow client opens a connection and sends a request's headers one byte every
//! `--trickle-ms` (1 s), never finishing them; cut off by the header-read timeout, it
//! connects again at once, as an attacker keeping its connections would. Three phases, each
//! `--requests` ordinary requests one after another, each on a new connection (a session's
//! `GET /status` with its token, through the runtime): before the slow clients come, while
//! they hold their connections, and after they have gone. Reports p50, p99 and the largest
//! latency of each phase, and how many slow connections the server cut.
//!
//! The server runs in this process on a runtime of its own (2 worker threads), served by
//! `dormant_server::serve` as the binary serves it; `--url` measures a server running
//! elsewhere instead (the binary, say).
//!
//! ```text
//! cargo run --release -p dormant-server --example slow_clients -- --slow 1000 --requests 2000
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::{Runtime, SledStore};
use dormant_server::{Auth, Connections, Server};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    slow: usize,
    requests: usize,
    trickle: Duration,
    header_read_timeout: Duration,
    url: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        slow: 1000,
        requests: 2000,
        trickle: Duration::from_secs(1),
        header_read_timeout: dormant_server::DEFAULT_HEADER_READ_TIMEOUT,
        url: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|error| format!("{flag} {value}: {error}"))
        };
        match flag.as_str() {
            "--slow" => args.slow = usize::try_from(number()?).unwrap_or(usize::MAX),
            "--requests" => args.requests = usize::try_from(number()?.max(1)).unwrap_or(1),
            "--trickle-ms" => args.trickle = Duration::from_millis(number()?.max(1)),
            "--header-read-timeout-ms" => {
                args.header_read_timeout = Duration::from_millis(number()?.max(1));
            }
            "--url" => args.url = Some(value.trim_end_matches('/').to_string()),
            other => {
                return Err(format!(
                "unknown flag {other} (--slow N, --requests N, --trickle-ms MS, --header-read-timeout-ms MS, --url URL)"
            ))
            }
        }
    }
    Ok(args)
}

/// The demo agent, served in this process on a runtime of its own.
struct InProcess {
    base: String,
    connections: Connections,
    _runtime: tokio::runtime::Runtime,
}

fn serve_here(header_read_timeout: Duration) -> Result<InProcess, Box<dyn std::error::Error>> {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (base, connections) = tokio.block_on(async {
        let store = Arc::new(SledStore::temporary()?);
        let runtime: Runtime =
            dormant_server::demo::configure(Runtime::builder().store(store))?.build()?;
        let app = Server::new(runtime, Auth::allow_unauthenticated()).router()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let serving = dormant_server::serve(listener, app).header_read_timeout(header_read_timeout);
        let connections = serving.connections();
        tokio::spawn(std::future::IntoFuture::into_future(serving));
        Ok::<_, Box<dyn std::error::Error>>((base, connections))
    })?;
    Ok(InProcess {
        base,
        connections,
        _runtime: tokio,
    })
}

/// A slow client: sends a header a byte every `trickle`, never ends it, and connects again
/// whenever the server cuts it off.
async fn slow_client(address: SocketAddr, trickle: Duration, cut: Arc<AtomicUsize>) {
    loop {
        let Ok(mut stream) = TcpStream::connect(address).await else {
            tokio::time::sleep(trickle).await;
            continue;
        };
        let head = b"GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: ";
        let mut sent = 0usize;
        let mut buffer = [0u8; 64];
        loop {
            let byte = head.get(sent).copied().unwrap_or(b'a');
            if stream.write_all(&[byte]).await.is_err() {
                break;
            }
            sent += 1;
            // The wait, or the server's close (an end of stream or a reset), whichever comes
            // first.
            tokio::select! {
                () = tokio::time::sleep(trickle) => {}
                _ = stream.read(&mut buffer) => break,
            }
        }
        cut.fetch_add(1, Ordering::Relaxed);
    }
}

struct Phase {
    name: &'static str,
    latency: Histogram<u64>,
    failed: usize,
    took: Duration,
}

async fn ordinary_requests(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    requests: usize,
    name: &'static str,
) -> Result<Phase, Box<dyn std::error::Error>> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut failed = 0;
    let began = Instant::now();
    for _ in 0..requests {
        let started = Instant::now();
        let answer = http.get(url).bearer_auth(token).send().await;
        let ok = match answer {
            Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
            Err(_) => false,
        };
        if !ok {
            failed += 1;
        }
        latency.record(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX))?;
    }
    Ok(Phase {
        name,
        latency,
        failed,
        took: began.elapsed(),
    })
}

fn report(phase: &Phase, slow_open: &str) {
    let ms = |micros: u64| micros as f64 / 1000.0;
    println!(
        "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.1} s |",
        phase.name,
        slow_open,
        phase.latency.len(),
        ms(phase.latency.value_at_quantile(0.5)),
        ms(phase.latency.value_at_quantile(0.99)),
        ms(phase.latency.max()),
        phase.failed,
        phase.took.as_secs_f64(),
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let limit = dormant_server::raise_fd_limit()?;
    let here = match &args.url {
        Some(_) => None,
        None => Some(serve_here(args.header_read_timeout)?),
    };
    let base = match (&args.url, &here) {
        (Some(url), _) => url.clone(),
        (None, Some(here)) => here.base.clone(),
        (None, None) => return Err("no server".into()),
    };
    let address: SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .map_err(|error| format!("{base}: an http://IP:PORT URL: {error}"))?;
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let open_now = |here: &Option<InProcess>| {
        here.as_ref()
            .map_or("?".to_string(), |here| here.connections.open().to_string())
    };
    client.block_on(async {
        // A new connection for every request: the slow clients compete with the others for
        // being accepted, not only for being served.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(60))
            .build()?;
        let started: serde_json::Value = http
            .post(format!("{base}/start"))
            .json(&serde_json::json!({ "agent": "demo", "message": "weather in Porto" }))
            .send()
            .await?
            .json()
            .await?;
        let field = |name: &str| {
            started[name]
                .as_str()
                .map(str::to_string)
                .ok_or(format!("no {name} in {started}"))
        };
        let (session, token) = (field("session_id")?, field("token")?);
        let url = format!("{base}/status?session_id={session}");
        println!(
            "slow clients: {}, a header byte every {} ms; header-read timeout {}; open files {:?} (hard {:?})",
            args.slow,
            args.trickle.as_millis(),
            if args.url.is_some() { "the server's".to_string() } else { format!("{} ms", args.header_read_timeout.as_millis()) },
            limit.now,
            limit.hard,
        );
        println!();
        println!("| phase | connections open at the end | requests | p50 | p99 | max | failed | took |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        let before = ordinary_requests(&http, &url, &token, args.requests, "before").await?;
        report(&before, &open_now(&here));

        let cut = Arc::new(AtomicUsize::new(0));
        let slow: Vec<_> = (0..args.slow)
            .map(|_| tokio::spawn(slow_client(address, args.trickle, Arc::clone(&cut))))
            .collect();
        // Every slow client connected and has sent its first bytes.
        if let Some(here) = &here {
            let slow = args.slow;
            let every = here.connections.wait_until(|open| open.open() >= slow);
            let _ = tokio::time::timeout(Duration::from_secs(60), every).await;
        } else {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let during = ordinary_requests(&http, &url, &token, args.requests, "during").await?;
        report(&during, &open_now(&here));

        for client in &slow {
            client.abort();
        }
        for client in slow {
            let _ = client.await;
        }
        if let Some(here) = &here {
            let gone = here.connections.wait_until(|open| open.open() == 0);
            let _ = tokio::time::timeout(Duration::from_secs(60), gone).await;
        }
        let after = ordinary_requests(&http, &url, &token, args.requests, "after").await?;
        report(&after, &open_now(&here));
        println!();
        println!(
            "slow connections cut by the server: {}{}",
            cut.load(Ordering::Relaxed),
            here.as_ref().map_or(String::new(), |here| format!(
                "; most connections open at once: {}",
                here.connections.peak()
            )),
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
