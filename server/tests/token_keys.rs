//! The key that signs session tokens: a store's key file that went missing is not silently
//! replaced (every token of its sessions would be refused), nodes sharing a PostgreSQL store
//! with different keys are refused at start with both named, and no secret (a node's peer
//! key, the token key, a token) reaches the log, even at trace level.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;
use common::binary::Binary;
use serde_json::{json, Value};

/// Runs the binary expecting it to refuse to start: its stderr. Fails if it started.
fn refused(mut command: Command) -> anyhow::Result<String> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        anyhow::bail!("it started: {line}");
    }
    let output = child.wait_with_output()?;
    anyhow::ensure!(!output.status.success(), "it exited 0");
    Ok(String::from_utf8(output.stderr)?)
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[test]
fn a_missing_key_file_of_an_existing_store_is_not_replaced_unless_asked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let key = dir.path().join("store.token-key");
    // A new store: its key is created with it.
    Binary::start(&store, "127.0.0.1:0", &[])?.terminate()?;
    anyhow::ensure!(key.exists(), "no key beside the new store");

    std::fs::remove_file(&key)?;
    let stderr = refused(Binary::command(&store, "127.0.0.1:0", &[]))?;
    assert!(stderr.contains("is missing"), "{stderr}");
    assert!(stderr.contains(&text(&key)), "{stderr}");
    assert!(stderr.contains("--new-token-key"), "{stderr}");
    assert!(!key.exists(), "a key was made all the same");

    // Asked to, it starts with a new key.
    Binary::start(&store, "127.0.0.1:0", &["--new-token-key"])?.terminate()?;
    assert!(key.exists());
    Ok(())
}

#[test]
fn nodes_of_one_database_with_different_token_keys_are_refused_at_start() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = format!("postgres://postgres@{}", cluster.address());
    let store = Path::new(&url);
    let dir = tempfile::tempdir()?;
    let (key_a, key_b) = (dir.path().join("a.key"), dir.path().join("b.key"));
    std::fs::write(&key_b, [7u8; 32])?;
    let node = |key: &Path, name: &str, extra: &[&str]| {
        let mut args = vec!["--token-key-file".to_string(), text(key)];
        args.extend(["--node-name".to_string(), name.to_string()]);
        args.extend(extra.iter().map(|arg| (*arg).to_string()));
        args
    };

    let a = Binary::start(store, "127.0.0.1:0", &refs(&node(&key_a, "a", &[])))?;
    let stderr = refused(Binary::command(
        store,
        "127.0.0.1:0",
        &refs(&node(&key_b, "b", &[])),
    ))?;
    for named in [
        text(&key_a),
        text(&key_b),
        "node a".to_string(),
        "node b".to_string(),
        "--new-token-key".to_string(),
    ] {
        assert!(stderr.contains(&named), "{named} not in: {stderr}");
    }
    // The same key file: a second node starts.
    let b = Binary::start(store, "127.0.0.1:0", &refs(&node(&key_a, "b", &[])))?;
    // A key file missing on a database that has a key: refused too.
    let missing = dir.path().join("missing.key");
    let stderr = refused(Binary::command(
        store,
        "127.0.0.1:0",
        &refs(&node(&missing, "c", &[])),
    ))?;
    assert!(stderr.contains("is missing"), "{stderr}");
    assert!(!missing.exists());
    // Asked to, a node makes its key the one every node must use.
    b.terminate()?;
    a.terminate()?;
    let c = Binary::start(
        store,
        "127.0.0.1:0",
        &refs(&node(&key_b, "c", &["--new-token-key"])),
    )?;
    let stderr = refused(Binary::command(
        store,
        "127.0.0.1:0",
        &refs(&node(&key_a, "a", &[])),
    ))?;
    assert!(stderr.contains("node c"), "{stderr}");
    c.terminate()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_at_trace_level() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = format!("postgres://postgres@{}", cluster.address());
    let dir = tempfile::tempdir()?;
    let key = text(&dir.path().join("token-key"));
    let logs = [dir.path().join("a.log"), dir.path().join("b.log")];
    let mut nodes = Vec::new();
    for (name, log) in ["a", "b"].iter().zip(&logs) {
        nodes.push(Binary::start_logging_to(
            Path::new(&url),
            "127.0.0.1:0",
            &["--token-key-file", &key, "--node-name", name],
            &[("RUST_LOG", "trace")],
            log,
        )?);
    }
    let http = reqwest::Client::new();
    let started: Value = http
        .post(format!("{}/start", nodes[0].base))
        .json(&json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?
        .json()
        .await?;
    let id = started["session_id"].as_str().context("no session id")?;
    let token = started["token"].as_str().context("no token")?;
    // Read through the other node (sent on to the owner), with the token in a header and in
    // a query.
    let status = http
        .get(format!("{}/status?session_id={id}", nodes[1].base))
        .bearer_auth(token)
        .send()
        .await?;
    assert!(status.status().is_success());
    let events = http
        .get(format!(
            "{}/sse?session_id={id}&token={token}",
            nodes[1].base
        ))
        .send()
        .await?;
    assert!(events.status().is_success());
    let _ = events.text().await?;

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let peer_keys: Vec<String> = client
        .query(
            "SELECT peer_key FROM dormant_nodes WHERE peer_key IS NOT NULL",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    anyhow::ensure!(peer_keys.len() == 2, "{peer_keys:?}");
    for node in nodes {
        node.terminate()?;
    }
    let token_key: String = std::fs::read(&key)?
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    for log in &logs {
        let written = std::fs::read_to_string(log)?;
        // The log is at trace level, tokio-postgres's statements included.
        assert!(
            written.contains("executing statement"),
            "{}: no statement logged",
            log.display()
        );
        for (what, secret) in peer_keys
            .iter()
            .map(|key| ("a peer key", key.as_str()))
            .chain([("the token key", token_key.as_str()), ("a token", token)])
        {
            assert!(!written.contains(secret), "{what} is in {}", log.display());
        }
    }
    Ok(())
}
