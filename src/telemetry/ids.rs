//! Trace and span ids derived from what the store keeps (run ids and call ids), so that a run
//! resumed after a restart, or a remote child in another process, can link to a span whose
//! context nobody kept.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use sha2::{Digest, Sha256};

use crate::types::ids::RunId;

/// A run's trace id and the span id of its `invoke_agent` span, both derived from the run id
/// (SHA-256: a UUID v7's own bytes would not do, as a ratio sampler reads bits of the trace id
/// that a v7 fixes).
///
/// ```
/// let run = dormant::RunId::generate();
/// let (trace, span) = dormant::telemetry::run_trace(run);
/// assert_eq!(dormant::telemetry::run_trace(run), (trace, span));
/// assert_ne!(span, opentelemetry::trace::SpanId::INVALID);
/// ```
pub fn run_trace(run: RunId) -> (TraceId, SpanId) {
    (trace_id(run), derived(&[run.as_bytes(), b"invoke_agent"]))
}

/// The W3C `traceparent` of run `run`'s `invoke_agent` span: what a remote child's start
/// carries, for the child's runs to link to the run that called it (the span exists as soon
/// as the run has begun, whichever later run records the call's outcome).
///
/// ```
/// let header = dormant::telemetry::traceparent(dormant::RunId::generate());
/// assert!(header.starts_with("00-") && header.ends_with("-01"));
/// assert_eq!(header.len(), 55);
/// ```
pub fn traceparent(run: RunId) -> String {
    let (trace, span) = run_trace(run);
    format!("00-{trace}-{span}-01")
}

/// The span id of call `tool_call_id`'s `execute_tool` span.
pub(crate) fn tool_span_id(run: RunId, tool_call_id: &str) -> SpanId {
    derived(&[run.as_bytes(), b"execute_tool", tool_call_id.as_bytes()])
}

pub(crate) fn trace_id(run: RunId) -> TraceId {
    let mut hash = Sha256::new();
    hash.update(b"dormant trace\0");
    hash.update(run.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&hash.finalize()[..16]);
    if id == [0; 16] {
        id[15] = 1;
    }
    TraceId::from_bytes(id)
}

/// The context of a run's `invoke_agent` span, as a link target.
pub(crate) fn run_context(run: RunId) -> SpanContext {
    let (trace, span) = run_trace(run);
    SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

/// A W3C `traceparent` header's span context (version 00), or `None` if it is not one.
pub(crate) fn parse_traceparent(header: &str) -> Option<SpanContext> {
    let mut parts = header.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(
        trace,
        span,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

/// The first 8 bytes of the SHA-256 of `parts` (never the invalid all-zero id).
fn derived(parts: &[&[u8]]) -> SpanId {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&hash.finalize()[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId::from_bytes(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_as_the_runs_span() {
        let run = RunId::generate();
        let context = parse_traceparent(&traceparent(run));
        assert_eq!(context.as_ref().map(|c| c.trace_id()), Some(trace_id(run)));
        assert_eq!(context.map(|c| c.span_id()), Some(run_trace(run).1));
        assert_ne!(tool_span_id(run, "c1"), tool_span_id(run, "c2"));
        assert_ne!(tool_span_id(run, "c1"), run_trace(run).1);
    }

    #[test]
    fn trace_ids_spread_over_the_bits_a_ratio_sampler_reads() {
        // The SDK's TraceIdRatioBased compares the low 8 bytes (shifted right once) with the
        // ratio: over many runs, about half must fall under one half.
        let under: usize = (0..1_000)
            .filter(|_| {
                let bytes = trace_id(RunId::generate()).to_bytes();
                let mut low = [0u8; 8];
                low.copy_from_slice(&bytes[8..]);
                (u64::from_be_bytes(low) >> 1) < (u64::MAX >> 2)
            })
            .count();
        assert!((350..650).contains(&under), "{under} of 1000");
    }

    #[test]
    fn a_malformed_traceparent_is_none() {
        for header in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
            "00-zzf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(parse_traceparent(header).is_none(), "{header}");
        }
    }
}
