//! A streaming model's deltas reach live followers between the stored chunks, in order, and
//! are never stored: `follow` and a late follower see only the chunks, and the step's `text`
//! chunk carries the whole reply either way.

mod common;

use std::sync::Arc;

use dormant::types::{ChunkKind, DeltaKind};
use dormant::{
    AgentDefinition, ManualClock, ModelReply, Runtime, ScriptedLlm, SessionId, StreamEvent,
    ToolCall, ToolDefinition,
};
use futures::StreamExt;
use serde_json::json;

fn streaming_runtime() -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("writer")
        .tool(ToolDefinition::client("confirm"))
        .tool(ToolDefinition::server("lookup", |_, _| async {
            Ok(json!(1))
        }))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "writer",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("c1", "confirm", json!({}))]),
                ModelReply::tool_calls(vec![ToolCall::new("l1", "lookup", json!({ "q": "x" }))]),
                ModelReply::text("The answer is one."),
            ],
        )
        .streaming();
    Ok(Runtime::builder()
        .store(common::temp_store()?)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(agent)
        .build()?)
}

type Events =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<StreamEvent, dormant::Error>> + Send>>;

/// The next events of `events`, up to the first chunk that settles a run.
async fn until_settled(events: &mut Events) -> anyhow::Result<Vec<StreamEvent>> {
    let mut seen = Vec::new();
    while let Some(event) = events.next().await {
        let event = event?;
        let settled = matches!(&event, StreamEvent::Chunk(chunk)
            if matches!(chunk.kind, ChunkKind::RunEnd { .. } | ChunkKind::RunSuspended { .. }));
        seen.push(event);
        if settled {
            return Ok(seen);
        }
    }
    anyhow::bail!("the stream ended before the run settled")
}

#[tokio::test]
async fn deltas_arrive_between_chunks_and_are_never_stored() -> anyhow::Result<()> {
    let runtime = streaming_runtime()?;
    let id: SessionId = "s1".parse()?;
    let mut live: Events = Box::pin(runtime.follow_live(&id, 0));
    runtime.execute_on(&id, "writer", "what is it?").await?;
    // The follower catches up with the suspended run (from the store or live: a follower
    // that reads the store past a step does not get that step's deltas).
    until_settled(&mut live).await?;
    let resumed_from = runtime.session(&id).await?.chunk_count;
    let answer = dormant::Submit::result("s1", "c1", json!({ "ok": true }));
    runtime.submit_tool_result(answer).await?;
    // Caught up, it reads the resumed run from its live queue, in order, deltas included.
    let outcome = runtime.resume(&id).await?;
    assert_eq!(outcome.text.as_deref(), Some("The answer is one."));
    let events = until_settled(&mut live).await?;

    let text: String = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::Delta(delta) => match &delta.kind {
                DeltaKind::TextDelta { text } => Some(text.as_str()),
                _ => None,
            },
            StreamEvent::Chunk(_) => None,
        })
        .collect();
    assert_eq!(
        text, "The answer is one.",
        "the text deltas add up to the reply"
    );

    let call = events.iter().find_map(|event| match event {
        StreamEvent::Delta(delta) => match &delta.kind {
            DeltaKind::ToolCallDelta {
                id,
                name,
                arguments,
                ..
            } => Some((id.clone(), name.clone(), arguments.clone(), delta.step)),
            _ => None,
        },
        StreamEvent::Chunk(_) => None,
    });
    assert_eq!(
        call,
        Some((
            Some("l1".into()),
            Some("lookup".into()),
            r#"{"q":"x"}"#.into(),
            2
        )),
        "the resumed run streamed the call in its step 2 (a resume goes on counting the steps)"
    );

    // Each step's deltas are numbered from 0 without gaps, and come before the chunks the
    // step's reply is committed as.
    let mut kinds = Vec::new();
    let mut next_index = std::collections::HashMap::new();
    for event in &events {
        match event {
            StreamEvent::Delta(delta) => {
                let next = next_index.entry(delta.step).or_insert(0);
                assert_eq!(delta.index, *next, "delta numbering of step {}", delta.step);
                *next += 1;
                kinds.push("delta");
            }
            StreamEvent::Chunk(chunk) => kinds.push(chunk.kind.type_name()),
        }
    }
    let first_text_delta = kinds.iter().rposition(|kind| *kind == "delta");
    let text_chunk = kinds.iter().position(|kind| *kind == "text");
    assert!(
        first_text_delta < text_chunk,
        "deltas precede the text chunk: {kinds:?}"
    );
    let tool_delta = kinds.iter().position(|kind| *kind == "delta");
    let tool_start = kinds.iter().position(|kind| *kind == "tool_start");
    assert!(
        tool_delta < tool_start,
        "the call's delta precedes its tool_start: {kinds:?}"
    );

    // The resumed run's run_start names the run it resumes; the first run's names none.
    let resumes = events.iter().find_map(|event| match event {
        StreamEvent::Chunk(chunk) => match &chunk.kind {
            ChunkKind::RunStart { resumes, .. } => Some(*resumes),
            _ => None,
        },
        StreamEvent::Delta(_) => None,
    });
    let first_run = runtime.runs(&id).await?[0].run_id;
    assert_eq!(resumes, Some(Some(first_run)));
    let first_start = &runtime.chunks(&id, 0).await?[0].kind;
    assert!(matches!(
        first_start,
        ChunkKind::RunStart { resumes: None, .. }
    ));

    // Stored: only chunks, with the sequence numbers the live follower saw.
    let stored = runtime.chunks(&id, resumed_from).await?;
    let live_chunks: Vec<u64> = events
        .iter()
        .filter_map(|event| match event {
            StreamEvent::Chunk(chunk) => Some(chunk.seq),
            StreamEvent::Delta(_) => None,
        })
        .collect();
    let stored_seqs: Vec<u64> = stored.iter().map(|chunk| chunk.seq).collect();
    assert_eq!(live_chunks, stored_seqs);

    // A follower that starts after the run sees the chunks and no delta.
    let mut late: Events = Box::pin(runtime.follow_live(&id, resumed_from));
    let late = until_settled(&mut late).await?;
    assert!(late
        .iter()
        .all(|event| matches!(event, StreamEvent::Chunk(_))));
    assert_eq!(late.len(), stored.len());
    Ok(())
}

#[tokio::test]
async fn follow_yields_every_chunk_once_from_a_streaming_model() -> anyhow::Result<()> {
    let runtime = streaming_runtime()?;
    let id: SessionId = "s2".parse()?;
    let plain = runtime.follow(&id, 0);
    runtime.execute_on(&id, "writer", "go").await?;
    let answer = dormant::Submit::result("s2", "c1", json!({ "ok": true }));
    runtime.submit_tool_result(answer).await?;
    runtime.resume(&id).await?;
    let mut plain = std::pin::pin!(plain);
    let mut seqs = Vec::new();
    while let Some(chunk) = plain.next().await {
        let chunk = chunk?;
        seqs.push(chunk.seq);
        if matches!(chunk.kind, ChunkKind::RunEnd { .. }) {
            break;
        }
    }
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    Ok(())
}
