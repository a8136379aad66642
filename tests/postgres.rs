//! `PgStore` against a real PostgreSQL (a throwaway cluster per test, `dormant::testkit::PgCluster`):
//! the store contract the runtime relies on (`dormant::testkit::store_contract`), commits grouped under load, migrations, and a
//! session that suspends on one runtime and completes on another over the same database.
#![cfg(feature = "postgres")]

use std::sync::Arc;

use dormant::store::{Batch, CommitKind, Store, Tree};
use dormant::testkit::{store_contract, Reopen};
use dormant::{
    AgentDefinition, ManualClock, ModelReply, PgStore, Runtime, ScriptedLlm, SessionId, Status,
    ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

fn batch(ops: &[(&[u8], Option<&[u8]>)]) -> Batch {
    let mut batch = Batch::new(CommitKind::Other);
    for (key, value) in ops {
        match value {
            Some(value) => batch.put(Tree::Pending, key.to_vec(), value.to_vec()),
            None => batch.delete(Tree::Pending, key.to_vec()),
        }
    }
    batch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_postgres() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = cluster.url();
    store_contract(Reopen::Same, || {
        let url = url.clone();
        async move { Ok(Arc::new(PgStore::connect(&url).await?) as Arc<dyn Store>) }
    })
    .await?;

    // Many commits at once: grouped into few transactions, each acknowledged and visible.
    let store = Arc::new(PgStore::connect(&url).await?);
    let writers = (0..200u32).map(|index| {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let key = format!("load/{index:04}");
            store.commit(batch(&[(key.as_bytes(), Some(b"v"))])).await
        })
    });
    for written in futures::future::join_all(writers).await {
        written??;
    }
    assert_eq!(store.scan_prefix(Tree::Pending, b"load/").await?.len(), 200);
    assert!(store.size_on_disk().await? > 0);
    store.close().await?;
    assert!(store.is_closed());
    assert!(store.commit(batch(&[(b"late", Some(b"x"))])).await.is_err());
    Ok(())
}

/// A commit the database refuses (a key too large for its index) fails with the database's
/// error and writes nothing of its batch; the commits after it are written as before: the
/// pipelined transaction that failed did not leave its connection inside a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_database_refuses_writes_nothing_and_the_next_ones_go_on() -> anyhow::Result<()>
{
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let store = PgStore::connect(&cluster.url()).await?;
    // Bytes that do not compress, so the key stays over the index's limit of about 2.7 kB.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let huge: Vec<u8> = (0..10_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect();
    let refused = store
        .commit(batch(&[(b"beside", Some(b"x")), (&huge, Some(b"y"))]))
        .await;
    let error = refused
        .err()
        .ok_or_else(|| anyhow::anyhow!("the huge key was written"))?;
    assert!(error.to_string().contains("PostgreSQL"), "{error}");
    assert_eq!(store.get(Tree::Pending, b"beside").await?, None);
    for index in 0..20u32 {
        let key = format!("after/{index:02}");
        store.commit(batch(&[(key.as_bytes(), Some(b"v"))])).await?;
    }
    assert_eq!(store.scan_prefix(Tree::Pending, b"after/").await?.len(), 20);
    store.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_once_and_a_newer_database_is_refused() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let first = PgStore::connect(&cluster.url()).await?;
    first.commit(batch(&[(b"kept", Some(b"yes"))])).await?;
    // Two nodes opening the same database: the second finds it migrated, and the data.
    let second = PgStore::connect(&cluster.url()).await?;
    assert_eq!(
        second.get(Tree::Pending, b"kept").await?,
        Some(b"yes".to_vec())
    );
    second.close().await?;

    let (client, connection) =
        tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .execute("INSERT INTO dormant_migrations (version) VALUES (99)", &[])
        .await?;
    let refused = PgStore::connect(&cluster.url()).await;
    let message = refused
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(message.contains("migration 99"), "{message}");
    first.close().await?;
    Ok(())
}

fn runtime(store: Arc<PgStore>) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("editor")
        .tool(ToolDefinition::client("edit"))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "editor",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({}))]),
            ModelReply::text("edited"),
        ],
    );
    Ok(Runtime::builder()
        .shared_store(store)
        .llm(Arc::new(llm))
        .agent(agent)
        .background_deadlines(false)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_suspended_on_one_runtime_completes_on_another_over_the_same_database(
) -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let first = runtime(Arc::new(PgStore::connect(&cluster.url()).await?))?;
    let id = "s1".parse()?;
    let run = first.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);
    first.shutdown().await?;

    let second = runtime(Arc::new(PgStore::connect(&cluster.url()).await?))?;
    assert_eq!(second.pending(&id).await?.len(), 1);
    let answer = Submit::result("s1", "e1", json!({ "ok": true }));
    assert_eq!(
        second.submit_tool_result(answer.clone()).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(
        second.submit_tool_result(answer).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let run = second.resume(&id).await?;
    assert_eq!(run.status, Status::Completed);
    assert_eq!(run.text.as_deref(), Some("edited"));
    second.shutdown().await?;
    Ok(())
}

/// An editor whose client tool is followed by a server tool that is not safe to retry and
/// counts its runs in `applied`.
fn counting_runtime(
    store: Arc<PgStore>,
    applied: Arc<std::sync::atomic::AtomicUsize>,
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("editor")
        .tool(ToolDefinition::client("edit"))
        .tool(ToolDefinition::server("apply", move |_input, _ctx| {
            let applied = Arc::clone(&applied);
            async move {
                applied.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, dormant::ToolError>(json!({ "applied": true }))
            }
        }))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "editor",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({}))]),
            ModelReply::tool_calls(vec![ToolCall::new("a1", "apply", json!({}))]),
            ModelReply::text("applied"),
            ModelReply::text("a second turn"),
        ],
    );
    Ok(Runtime::builder()
        .shared_store(store)
        .llm(Arc::new(llm))
        .agent(agent)
        .background_deadlines(false)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_lease_cannot_write_and_the_new_owner_serves_the_session(
) -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let applied = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store_a = Arc::new(PgStore::builder(cluster.url()).node("a").connect().await?);
    let store_b = Arc::new(PgStore::builder(cluster.url()).node("b").connect().await?);
    let a = counting_runtime(Arc::clone(&store_a), Arc::clone(&applied))?;
    let b = counting_runtime(Arc::clone(&store_b), Arc::clone(&applied))?;
    let id = "s1".parse()?;
    let run = a.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);

    // A owns s1 and is alive: B may not take it.
    let answer = Submit::result("s1", "e1", json!({ "ok": true }));
    let refused = b.submit_tool_result(answer.clone()).await;
    let message = refused
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(message.contains("owned by node a"), "{message}");

    // A is paused past its lease (its expiry, by the database's clock, is moved to the past):
    // B takes s1 over and serves it.
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    sql.execute(
        "UPDATE dormant_leases SET expires_at = now() - interval '1 second' WHERE session = 's1'",
        &[],
    )
    .await?;
    assert_eq!(b.submit_tool_result(answer).await?, SubmitOutcome::Accepted);
    let run = b.resume(&id).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    let row = sql
        .query_one(
            "SELECT owner, epoch FROM dormant_leases WHERE session = 's1'",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), "b");
    assert_eq!(row.get::<_, i64>(1), 2, "a takeover raises the epoch");
    let messages = b.messages(&id).await?.len();

    // A comes back with s1 still in memory: every write it attempts is refused, and nothing
    // of it is visible.
    let fenced = a.execute_on(&id, "editor", "edit again").await;
    let message = fenced
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(message.contains("lease on session s1 is lost"), "{message}");
    let again = a.execute_on(&id, "editor", "edit again").await;
    let message = again
        .err()
        .map(|error| error.to_string())
        .unwrap_or_default();
    assert!(message.contains("owned by node b"), "{message}");
    assert_eq!(
        b.messages(&id).await?.len(),
        messages,
        "nothing of A's is visible"
    );
    assert_eq!(b.status(&id).await?, Status::Completed);
    assert_eq!(
        applied.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no tool ran twice"
    );

    // Closing a node gives its leases up: the other takes over at once.
    b.shutdown().await?;
    let c = counting_runtime(
        Arc::new(PgStore::builder(cluster.url()).node("c").connect().await?),
        Arc::clone(&applied),
    )?;
    let run = c.execute_on(&id, "editor", "a second turn").await?;
    assert_eq!(run.status, Status::Completed);
    c.shutdown().await?;
    a.shutdown().await?;
    Ok(())
}

/// A lead whose sub-agent asks the client for an edit that times out after one second.
fn tree_runtime(store: Arc<PgStore>, clock: ManualClock) -> anyhow::Result<Runtime> {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("ask", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("edit").timeout_ms(1_000))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "c1",
                    "ask",
                    json!({ "message": "edit it" }),
                )]),
                ModelReply::text("the lead is done"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({}))]),
                ModelReply::text("the edit timed out"),
            ],
        );
    Ok(Runtime::builder()
        .shared_store(store)
        .clock(Arc::new(clock))
        .llm(Arc::new(llm))
        .agent(lead)
        .agent(helper)
        .background_deadlines(false)
        .build()?)
}

/// A tree of sessions has one owner: its root's lease, which its sub-agents hold with it, so
/// a parent and its children always live on one node. A deadline of a tree another node
/// owns is left to that node (not fired, not cleared as stale), and fires on another node
/// once the owner is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_has_one_owner_and_its_deadlines_wait_for_it() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let clock = ManualClock::new(0);
    let store_a = Arc::new(PgStore::builder(cluster.url()).node("a").connect().await?);
    let store_b = Arc::new(PgStore::builder(cluster.url()).node("b").connect().await?);
    let a = tree_runtime(store_a, clock.clone())?;
    let b = tree_runtime(store_b, clock.clone())?;
    let root: SessionId = "root".parse()?;
    let run = a.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    let child = root.ephemeral_child("c1");

    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let leases: Vec<(String, String)> = sql
        .query(
            "SELECT session, owner FROM dormant_leases WHERE expires_at > now() ORDER BY session",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        leases,
        vec![("root".to_string(), "a".to_string())],
        "the child holds its root's lease, not one of its own"
    );

    // B cannot write to the tree while A owns it: an answer for the child's call is refused.
    let answer = Submit::result("root", "e1", json!({ "ok": true }));
    let refused = b
        .submit_tool_result(answer)
        .await
        .err()
        .map(|e| e.to_string());
    assert!(
        refused
            .as_deref()
            .unwrap_or_default()
            .contains("owned by node a"),
        "{refused:?}"
    );

    // The client tool's deadline passes. B's sweep leaves it to A, and does not clear it.
    clock.advance(1_500);
    let swept = b.sweep_deadlines().await?;
    assert_eq!((swept.fired, swept.deferred), (0, 1), "{swept:?}");
    let swept = b.sweep_deadlines().await?;
    assert_eq!(
        (swept.fired, swept.deferred),
        (0, 1),
        "still due: {swept:?}"
    );

    // A is gone (its leases released as it closes): B fires the deadline, taking the tree, and
    // the resume at the root goes on through the child.
    a.shutdown().await?;
    let swept = b.sweep_deadlines().await?;
    assert_eq!((swept.fired, swept.deferred), (1, 0), "{swept:?}");
    let run = b.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(run.text.as_deref(), Some("the lead is done"));
    assert_eq!(b.status(&child).await?, Status::Completed);
    let owner: String = sql
        .query_one(
            "SELECT owner FROM dormant_leases WHERE session = 'root'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(owner, "b");
    b.shutdown().await?;
    Ok(())
}

/// Two children of one root wait on calls that share the id `e1`: each has its own ownership
/// entry on PostgreSQL too, and each answer at the root finds one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_children_sharing_a_call_id_are_each_answered_at_the_root() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("ask", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("edit"))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![
                    ToolCall::new("c1", "ask", json!({ "message": "one" })),
                    ToolCall::new("c2", "ask", json!({ "message": "two" })),
                ]),
                ModelReply::text("both done"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({}))]),
                ModelReply::text("edited"),
            ],
        );
    let runtime = Runtime::builder()
        .shared_store(Arc::new(PgStore::connect(&cluster.url()).await?))
        .clock(Arc::new(ManualClock::new(0)))
        .llm(Arc::new(llm))
        .agent(lead)
        .agent(helper)
        .build()?;
    let root: SessionId = "root".parse()?;
    let run = runtime.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    let answer = |text: &str| Submit::result("root", "e1", json!(text));
    for (text, outcome) in [
        ("first", SubmitOutcome::Accepted),
        ("second", SubmitOutcome::Accepted),
        ("third", SubmitOutcome::AlreadyCompleted),
    ] {
        assert_eq!(
            runtime.submit_tool_result(answer(text)).await?,
            outcome,
            "{text}"
        );
    }
    let run = runtime.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(run.text.as_deref(), Some("both done"));
    runtime.shutdown().await?;
    Ok(())
}

/// A node whose liveness lapsed (paused past its time to live) and that nobody took over
/// forgets its leases and gives them up, rather than keep rows that are valid again once it is
/// live again and that no session of it would ever give up: another node may take the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_a_lapsed_node_forgot_are_given_up_not_held_for_its_lifetime() -> anyhow::Result<()>
{
    use dormant::cluster::leases::Leases;
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let a = PgStore::builder(cluster.url()).node("a").connect().await?;
    let b = PgStore::builder(cluster.url()).node("b").connect().await?;
    a.acquire("s", "t").await?;
    let held = b.acquire("s2", "t").await;
    assert!(held.is_err(), "a holds t: {held:?}");
    // A pauses past its time to live: its row expires, nobody takes t meanwhile.
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    sql.execute(
        "UPDATE dormant_nodes SET expires_at = now() - interval '1 second' WHERE node = 'a'",
        &[],
    )
    .await?;
    // Its next renewal finds that, forgets its leases, and registers again.
    assert_eq!(a.renew_leases().await?, 0);
    a.release_session("s");
    // The give-up is posted; B's take waits for nothing but it (bounded, so a lease never
    // given up fails here instead of hanging).
    let taken = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match b.acquire("s2", "t").await {
                Ok(()) => break,
                Err(_) => tokio::task::yield_now().await,
            }
        }
    })
    .await;
    assert!(taken.is_ok(), "t is still held by a, which forgot it");
    Ok(())
}
