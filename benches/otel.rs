//! Run with: cargo bench --features otel --bench otel   (add `-- --quick` for a short run)
//!
//! What OpenTelemetry costs a suspension cycle (execute → suspend → submit → resume →
//! complete, each on a fresh session), in one process, the configurations rotated round by
//! round so that none always runs first on this noisy machine: no telemetry configured; spans
//! recorded by the SDK and handed to an exporter that drops them (the SDK's own cost); spans
//! exported over OTLP/HTTP (protobuf) to a receiver on loopback (the exporter's cost too, its
//! thread sharing the two cores). On `MemoryStore`, where the runtime's own work is all there
//! is and the spans' share is largest, and on `SledStore`. What compiling the feature in costs
//! with nothing configured is measured apart: the `hitl` bench built with and without
//! `--features otel`, rotated by `scripts/ab-cycles.sh` (BENCHMARKS.md, issue 34).

#[path = "support/allocator.rs"]
mod allocator;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/cycles.rs"]
mod cycles;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::store::Store;
use dormant::telemetry::Telemetry;
use dormant::{MemoryStore, SledStore};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter,
};

/// An exporter that drops every span, counting them: what the SDK costs before any export.
#[derive(Debug, Default)]
struct Dropping(Arc<AtomicUsize>);

impl SpanExporter for Dropping {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.fetch_add(batch.len(), Ordering::Relaxed);
        Ok(())
    }
}

/// Spans a cycle records: two runs (each `invoke_agent` and `chat`) and the call.
const SPANS_PER_CYCLE: usize = 5;

/// A provider whose batch processor queues every span of the run (the default queue of 2,048
/// would drop most of them at this rate, and the cost with them).
fn provider_with<E: SpanExporter + 'static>(exporter: E, cycles: usize) -> SdkTracerProvider {
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(cycles * SPANS_PER_CYCLE + 1_024)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build();
    SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Off,
    Dropped,
    Otlp,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Off => "no telemetry configured",
            Mode::Dropped => "spans to an exporter that drops them",
            Mode::Otlp => "spans over OTLP/HTTP to a loopback receiver",
        }
    }
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "# dormant OpenTelemetry cost ({} cores, {} allocator)",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        allocator::NAME
    );
    runtime.block_on(async {
        let receiver = receiver().await?;
        let (rounds, sessions, cycles) = if quick { (2, 1_000, 5_000) } else { (6, 1_000, 20_000) };
        for durable in [false, true] {
            let store_name = if durable { "SledStore" } else { "MemoryStore" };
            println!("\n## {store_name}: {cycles} cycles, {sessions} at a time, {rounds} rounds rotated\n");
            let modes = [Mode::Off, Mode::Dropped, Mode::Otlp];
            let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); modes.len()];
            for round in 0..rounds {
                for slot in 0..modes.len() {
                    let index = (round + slot) % modes.len();
                    let measured = measure(modes[index], durable, &receiver, sessions, cycles).await?;
                    results[index].push(measured);
                }
            }
            println!("| configuration | cycles/s (median) | of no telemetry | CPU µs/cycle (median) | of no telemetry |");
            println!("|---|---:|---:|---:|---:|");
            let off_rate = median(results[0].iter().map(|r| r.0).collect());
            let off_cpu = median(results[0].iter().map(|r| r.1).collect());
            for (mode, runs) in modes.iter().zip(&results) {
                let rate = median(runs.iter().map(|r| r.0).collect());
                let cpu = median(runs.iter().map(|r| r.1).collect());
                println!(
                    "| {} | {rate:.0} | {:.3} | {cpu:.0} | {:.3} |",
                    mode.name(),
                    rate / off_rate,
                    cpu / off_cpu
                );
            }
        }
        anyhow::Ok(())
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// One configuration's run: cycles/s and CPU µs a cycle (0 without procfs).
async fn measure(
    mode: Mode,
    durable: bool,
    receiver: &str,
    sessions: usize,
    cycles: usize,
) -> anyhow::Result<(f64, f64)> {
    let dropped = Arc::new(AtomicUsize::new(0));
    let provider = match mode {
        Mode::Off => None,
        Mode::Dropped => Some(provider_with(Dropping(Arc::clone(&dropped)), cycles)),
        Mode::Otlp => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(format!("{receiver}/v1/traces"))
                .build()?;
            Some(provider_with(exporter, cycles))
        }
    };
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = if durable {
        Arc::new(SledStore::open(dir.path())?)
    } else {
        Arc::new(MemoryStore::new())
    };
    let mut builder = cycles::editor_runtime(store, cycles::one_call_script())?;
    if let Some(provider) = &provider {
        builder = builder.telemetry(Telemetry::new(provider));
    }
    let runtime = builder.build()?;
    let cpu_before = cpu::process_cpu();
    let started = Instant::now();
    let driven = cycles::drive(&runtime, sessions, cycles).await;
    // The spans still queued are exported before the clock stops: their cost is the run's.
    if let Some(provider) = &provider {
        provider.force_flush()?;
    }
    let elapsed = started.elapsed();
    let cpu = cpu::process_cpu()
        .zip(cpu_before)
        .map_or(Duration::ZERO, |(after, before)| {
            after.saturating_sub(before)
        });
    driven?;
    if mode == Mode::Dropped {
        let spans = dropped.load(Ordering::Relaxed);
        anyhow::ensure!(
            spans == cycles * SPANS_PER_CYCLE,
            "{spans} spans reached the exporter, not {}",
            cycles * SPANS_PER_CYCLE
        );
    }
    runtime.shutdown().await?;
    if let Some(provider) = provider {
        provider.shutdown()?;
    }
    Ok((
        cycles as f64 / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / cycles as f64,
    ))
}

/// An OTLP/HTTP receiver on loopback that reads each export and answers 200 (no decoding:
/// the bench measures the sender).
async fn receiver() -> anyhow::Result<String> {
    let router = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|_body: axum::body::Bytes| async { "" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(format!("http://{address}"))
}
