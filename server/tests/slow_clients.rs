//! Slow and silent clients cannot stop the server: a thousand connections that never finish
//! their headers leave it answering everyone else, each is closed once it has taken longer
//! than the header-read timeout, at the connection cap a new connection takes the place of
//! the one that has waited longest for a request (never of one being answered), and the binary raises its soft limit on open files
//! so that a few hundred such clients do not use up a 256-file limit. How fast it answers
//! meanwhile is measured by `cargo run --release -p dormant-server --example slow_clients`
//! (BENCHMARKS.md), not here.

mod common;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::Binary;
use common::demo_runtime;
use dormant::{Runtime, SledStore};
use dormant_server::{Auth, Closing, Connections, Server};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The demo agent served by `dormant_server::serve` on a loopback port.
struct Served {
    address: SocketAddr,
    connections: Connections,
    closing: Closing,
    runtime: Runtime,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(header_read_timeout: Duration, max_connections: usize) -> anyhow::Result<Served> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = Server::new(runtime.clone(), Auth::allow_unauthenticated());
    let closing = server.closing();
    let app = server.router()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let stop = closing.clone();
    let serving = dormant_server::serve(listener, app)
        .header_read_timeout(header_read_timeout)
        .max_connections(max_connections)
        .with_graceful_shutdown(async move { stop.closed().await });
    let connections = serving.connections();
    let served = tokio::spawn(serving.into_future());
    Ok(Served {
        address,
        connections,
        closing,
        runtime,
        served,
    })
}

impl Served {
    async fn stop(self) -> anyhow::Result<()> {
        self.closing.close();
        self.served.await??;
        self.runtime.shutdown().await?;
        Ok(())
    }
}

/// Waits until `condition` holds of the server's connections, failing after a minute (a
/// guard against a hang, not a measure).
async fn until(
    connections: &Connections,
    what: &str,
    condition: impl Fn(&Connections) -> bool,
) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(60), connections.wait_until(condition))
        .await
        .map_err(|_| anyhow::anyhow!("waited a minute for {what}"))
}

/// How many slow connections this process can hold, up to `wanted`: each takes two of its
/// descriptors (the client's end and the server's), with room left for everything else.
fn slow_count(wanted: usize) -> usize {
    let limit = dormant_server::raise_fd_limit()
        .ok()
        .and_then(|limit| limit.now)
        .unwrap_or(u64::MAX);
    let room = usize::try_from(limit.saturating_sub(256) / 2).unwrap_or(usize::MAX);
    if room < wanted {
        eprintln!(
            "SLOW CLIENTS: this process may open {limit} files: holding {room} slow connections, not {wanted}"
        );
    }
    wanted.min(room)
}

/// A client that opened a connection and sent part of a request's headers (or, every third,
/// nothing at all), and sends no more.
async fn slow_client(address: SocketAddr, index: usize) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(address).await?;
    if index % 3 != 0 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: a")
            .await?;
    }
    Ok(stream)
}

/// Whether the server still holds the connection open (nothing to read, and no end).
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.try_read(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock)
}

/// Whether the server still holds the connection open, once what it sent has been read.
fn open_after_reading(stream: &TcpStream) -> bool {
    let mut buffer = [0u8; 4096];
    loop {
        match stream.try_read(&mut buffer) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(error) => return error.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

/// A plain request on a fresh connection, the answer's status.
async fn ordinary(http: &reqwest::Client, address: SocketAddr) -> anyhow::Result<StatusCode> {
    Ok(http
        .get(format!("http://{address}/healthz"))
        .send()
        .await?
        .status())
}

fn fresh_connections() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slow_clients_leave_the_server_answering_the_others_and_it_serves_as_before_once_they_go(
) -> anyhow::Result<()> {
    let count = slow_count(1000);
    // A bound no slow client reaches during the test: they stay until they go themselves.
    let served = serve(Duration::from_secs(3600), 4096).await?;
    let address = served.address;
    let mut slow = Vec::with_capacity(count);
    for index in 0..count {
        slow.push(slow_client(address, index).await?);
    }
    let connections = served.connections.clone();
    until(
        &connections,
        "every slow connection to be accepted",
        |open| open.open() == count,
    )
    .await?;

    // The others are answered while every slow connection is held.
    let http = fresh_connections()?;
    for _ in 0..50 {
        assert_eq!(ordinary(&http, address).await?, StatusCode::OK);
    }
    let started = http
        .post(format!("http://{address}/start"))
        .json(&serde_json::json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?;
    assert_eq!(started.status(), StatusCode::ACCEPTED);
    assert!(
        slow.iter().all(still_open),
        "a slow client was cut before the bound"
    );
    assert!(served.connections.peak() > count);

    // They go; the server is back to none, and serves as before.
    drop(slow);
    until(&connections, "the slow connections to close", |open| {
        open.open() == 0
    })
    .await?;
    for _ in 0..50 {
        assert_eq!(ordinary(&http, address).await?, StatusCode::OK);
    }
    served.stop().await
}

/// More slow clients than the server may hold (a process with a low limit on open files):
/// each honest client is still answered, in the place of a slow one, and the slow clients
/// never hold more than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_slow_clients_than_the_cap_cannot_keep_the_others_out() -> anyhow::Result<()> {
    let count = slow_count(400);
    let cap = 64;
    let served = serve(Duration::from_secs(3600), cap).await?;
    let address = served.address;
    let mut slow = Vec::with_capacity(count);
    for index in 0..count {
        slow.push(slow_client(address, index).await?);
    }
    let connections = served.connections.clone();
    until(
        &connections,
        "the slow connections to be taken in",
        |open| open.accepted() >= u64::try_from(count).unwrap_or(u64::MAX),
    )
    .await?;
    let http = fresh_connections()?;
    for _ in 0..50 {
        assert_eq!(ordinary(&http, address).await?, StatusCode::OK);
    }
    assert!(
        served.connections.peak() <= cap,
        "{}",
        served.connections.peak()
    );
    drop(slow);
    served.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_takes_longer_than_the_bound_to_send_its_headers_is_cut_off(
) -> anyhow::Result<()> {
    let bound = Duration::from_millis(300);
    let served = serve(bound, 4096).await?;
    let address = served.address;
    let mut cut = Vec::new();
    for index in 0..12 {
        let opened = Instant::now();
        let stream = slow_client(address, index).await?;
        let (mut reader, mut writer) = stream.into_split();
        // A third of them trickle a byte of a header every 20 ms: slow but never silent, which
        // does not restart the clock.
        if index % 3 == 1 {
            tokio::spawn(async move {
                while writer.write_all(b"a").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        } else {
            tokio::spawn(async move {
                let _kept_open = writer;
                std::future::pending::<()>().await;
            });
        }
        cut.push(tokio::spawn(async move {
            let mut answer = Vec::new();
            // The server's close ends the read: an end of stream, or a reset if bytes were
            // still arriving.
            let _ = tokio::time::timeout(Duration::from_secs(60), reader.read_to_end(&mut answer))
                .await?;
            Ok::<_, anyhow::Error>(opened.elapsed())
        }));
    }
    for closed in cut {
        let after = closed.await??;
        assert!(
            after >= bound,
            "cut after {after:?}, before the bound of {bound:?}"
        );
    }
    let connections = served.connections.clone();
    until(
        &connections,
        "the cut connections to be counted closed",
        |open| open.open() == 0,
    )
    .await?;
    // An honest client is served as before.
    assert_eq!(
        ordinary(&fresh_connections()?, address).await?,
        StatusCode::OK
    );
    served.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_a_new_connection_takes_the_place_of_the_one_waiting_longest(
) -> anyhow::Result<()> {
    let served = serve(Duration::from_secs(3600), 2).await?;
    let address = served.address;
    let mut first = slow_client(address, 1).await?;
    let connections = served.connections.clone();
    until(&connections, "the first slow connection", |open| {
        open.open() == 1
    })
    .await?;
    let second = slow_client(address, 2).await?;
    until(&connections, "both slow connections", |open| {
        open.open() == 2
    })
    .await?;

    // The cap is reached: an honest client is served at once, in the place of the
    // connection that has waited longest for its request.
    let mut third = TcpStream::connect(address).await?;
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: third\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(60), third.read_to_string(&mut answer)).await??;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), first.read_to_end(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the oldest: {closed:?}"
    );
    assert!(still_open(&second), "the younger slow connection was cut");
    assert_eq!(served.connections.peak(), 2, "more than the cap were open");
    drop(second);
    served.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_being_answered_is_never_cut_to_make_room() -> anyhow::Result<()> {
    let served = serve(Duration::from_secs(3600), 1).await?;
    let address = served.address;
    // A session's stream: the connection is answering for as long as it is open.
    let http = fresh_connections()?;
    let started: serde_json::Value = http
        .post(format!("http://{address}/start"))
        .json(&serde_json::json!({ "agent": "demo", "message": "echo hi" }))
        .send()
        .await?
        .json()
        .await?;
    let id = started["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let token = started["token"].as_str().unwrap_or_default().to_string();
    let connections = served.connections.clone();
    until(&connections, "the start's connection to close", |open| {
        open.open() == 0
    })
    .await?;
    let mut stream = TcpStream::connect(address).await?;
    let request =
        format!("GET /sse?session_id={id}&token={token}&until=closed HTTP/1.1\r\nHost: s\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await?;
    assert_eq!(&head, b"HTTP/1.1 200");

    // A second connection waits in the backlog: the stream is not cut for it.
    let mut second = TcpStream::connect(address).await?;
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: second\r\nConnection: close\r\n\r\n")
        .await?;
    let mut byte = [0u8; 1];
    let waited = tokio::time::timeout(Duration::from_millis(300), second.read(&mut byte)).await;
    assert!(
        waited.is_err(),
        "the second connection was served beside the stream"
    );
    assert!(open_after_reading(&stream), "the stream was cut");
    // The stream ends: the second is served.
    drop(stream);
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), second.read_to_end(&mut answer)).await??;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    served.stop().await
}

/// The binary, started with a soft limit of 256 open files (a hard one far above it), still
/// answers with 300 slow clients connected: it raised its soft limit at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_raises_its_soft_limit_on_open_files_and_serves_past_the_old_one(
) -> anyhow::Result<()> {
    let limit = dormant_server::raise_fd_limit()?;
    let Some(hard) = limit.hard.or(limit.now) else {
        eprintln!("SKIPPED: no limit on open files to test against");
        return Ok(());
    };
    if hard < 2048 {
        eprintln!("SKIPPED: the hard limit on open files is {hard}, too low to show a raise past 256 with 300 clients");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let binary = tokio::task::spawn_blocking(move || {
        Binary::start_with_soft_fd_limit(
            &store,
            "127.0.0.1:0",
            &["--header-read-timeout-ms", "3600000"],
            256,
        )
    })
    .await??;
    let pid = binary.child.id();
    match std::fs::read_to_string(format!("/proc/{pid}/limits")) {
        Ok(limits) => {
            let line = limits
                .lines()
                .find(|line| line.starts_with("Max open files"))
                .unwrap_or_default();
            let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
            assert_eq!(
                numbers.first(),
                numbers.get(1),
                "the soft limit is not the hard one: {line}"
            );
            assert_ne!(numbers.first(), Some(&"256"), "{line}");
        }
        Err(error) => eprintln!("SKIPPED the /proc check: {error}"),
    }
    let address: SocketAddr = binary.base.trim_start_matches("http://").parse()?;
    let mut slow = Vec::new();
    for index in 0..300 {
        slow.push(slow_client(address, index).await?);
    }
    let http = fresh_connections()?;
    for _ in 0..10 {
        assert_eq!(ordinary(&http, address).await?, StatusCode::OK);
    }
    assert!(slow.iter().all(still_open));
    drop(slow);
    drop(binary);
    Ok(())
}
