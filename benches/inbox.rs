//! Run with: cargo bench --bench inbox            (add `-- --quick` for a tenth of the sessions)
//!
//! The inbox (issue 32): a page of 50 waiting calls out of 1,000,000 sessions of which
//! 100,000 wait, on sled, beside the raw cost of its parts in the same run (a bare read of
//! 50 entries of the deadline index and of the 100 keys a page then reads).

#[path = "support/timed.rs"]
mod timed;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::store::{Store, Tree};
use dormant::types::{InboxCursor, InboxFilter};
use dormant::{
    AgentDefinition, ModelReply, PendingKind, Runtime, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition,
};
use futures::stream::{self, StreamExt};
use serde_json::json;

const PAGE: usize = 50;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let (waiting, done) = if quick {
        (10_000, 90_000)
    } else {
        (100_000, 900_000)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(waiting, done))
}

fn agents() -> anyhow::Result<(AgentDefinition, AgentDefinition)> {
    let editor = AgentDefinition::builder("editor")
        .tool(ToolDefinition::client("edit").description("Edit the draft"))
        .client_tool_timeout_ms(24 * 3600 * 1000)
        .build()?;
    let chat = AgentDefinition::builder("chat").build()?;
    Ok((editor, chat))
}

async fn bench(waiting: usize, done: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    let (editor, chat) = agents()?;
    let llm = ScriptedLlm::new()
        .script(
            "editor",
            vec![ModelReply::tool_calls(vec![ToolCall::new(
                "e1",
                "edit",
                json!({ "doc": 1 }),
            )])],
        )
        .script("chat", vec![ModelReply::text("hi")]);
    let runtime = Runtime::builder()
        .store(store.clone())
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .max_resident(1_000)
        .agent(editor)
        .agent(chat)
        .build()?;
    let started = Instant::now();
    let sessions = (0..waiting + done).map(|i| {
        let agent = if i % 10 == 0 && i / 10 < waiting {
            "editor"
        } else {
            "chat"
        };
        (format!("s{i:07}"), agent)
    });
    let made: Vec<anyhow::Result<()>> = stream::iter(sessions)
        .map(|(id, agent)| {
            let runtime = runtime.clone();
            async move {
                runtime.execute_on(&id.parse()?, agent, "go").await?;
                Ok(())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    runtime.evict_all().await;
    let first = runtime.inbox(&InboxFilter::all(), None, PAGE).await?;
    anyhow::ensure!(first.items.len() == PAGE, "{} items", first.items.len());
    println!(
        "\n## The inbox: {} sessions, {} waiting (sled), made in {:.1} s\n",
        waiting + done,
        waiting,
        started.elapsed().as_secs_f64()
    );

    // Cursors spread over the index, to read pages from anywhere in it.
    let mut cursors: Vec<Option<InboxCursor>> = vec![None];
    let mut after = first.next.clone();
    let stride = (waiting / PAGE / 20).max(1);
    let mut page = 1;
    while let Some(cursor) = after {
        let next = runtime
            .inbox(&InboxFilter::all(), Some(&cursor), PAGE)
            .await?;
        // A page from the cursor reads a full page (not the empty one after the last).
        if page % stride == 0 && next.items.len() == PAGE {
            cursors.push(Some(cursor));
        }
        page += 1;
        after = next.next;
    }
    anyhow::ensure!(page * PAGE >= waiting, "{page} pages for {waiting} calls");
    let runs = 200;
    let filters = [
        ("every waiting call", InboxFilter::all()),
        (
            "agent = editor (every waiting call)",
            InboxFilter::all().agent("editor"),
        ),
        (
            "kind = client, tool = edit",
            InboxFilter::all().kind(PendingKind::Client).tool("edit"),
        ),
    ];
    println!("| a page of {PAGE} | p50 ms | p99 ms | of the bare reads (p50) |");
    println!("|---|---:|---:|---:|");
    let bare = timings(runs, |i| {
        let store = store.clone();
        let cursor = cursors[i % cursors.len()].clone();
        async move { bare_page(store.as_ref(), cursor.as_ref()).await }
    })
    .await?;
    for (name, filter) in filters {
        let times = timings(runs, |i| {
            let runtime = runtime.clone();
            let filter = filter.clone();
            let cursor = cursors[i % cursors.len()].clone();
            async move {
                let page = runtime.inbox(&filter, cursor.as_ref(), PAGE).await?;
                anyhow::ensure!(
                    !page.items.is_empty(),
                    "an empty page at {cursor:?} with {filter:?}"
                );
                Ok(())
            }
        })
        .await?;
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            ms(times.0),
            ms(times.1),
            times.0.as_secs_f64() / bare.0.as_secs_f64()
        );
    }
    println!(
        "| the bare reads: {PAGE} index entries, then the {PAGE} pending entries and {PAGE} session records | {:.2} | {:.2} | 1.00 |",
        ms(bare.0),
        ms(bare.1)
    );
    runtime.shutdown().await?;
    Ok(())
}

/// What a page reads, read bare: `PAGE` index entries after `cursor`, then each one's
/// pending entry and session record, one by one as the inbox does.
async fn bare_page(store: &dyn Store, cursor: Option<&InboxCursor>) -> anyhow::Result<()> {
    let start = cursor.map_or_else(Vec::new, |cursor| {
        let mut key = hex(&cursor.0);
        key.push(0);
        key
    });
    let entries = store
        .scan_range(Tree::Deadlines, &start, &[0xff; 9], PAGE)
        .await?;
    for (key, _) in &entries {
        // `deadline · len · session · call`
        let rest = &key[8..];
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let session = &rest[2..2 + len];
        anyhow::ensure!(store.get(Tree::Pending, rest).await?.is_some());
        anyhow::ensure!(store.get(Tree::Sessions, session).await?.is_some());
    }
    Ok(())
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .filter_map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}

/// p50 and p99 of `runs` timings of `op`.
async fn timings<F, Fut>(runs: usize, op: F) -> anyhow::Result<(Duration, Duration)>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let times = timed::timed(runs, op).await?;
    Ok((timed::percentile(&times, 50), timed::percentile(&times, 99)))
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
