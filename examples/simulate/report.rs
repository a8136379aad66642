//! The closing report, as text or as one JSON object.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use dormant::runtime::{ClientToolStats, Latency};
use dormant::store::Durability;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::driver::{Counters, Measured};
use crate::verify::ToolCounts;
use crate::Args;

/// Resident and peak resident memory of this process, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Memory {
    rss: u64,
    hwm: u64,
}

impl Memory {
    /// Reads VmRSS and VmHWM from /proc/self/status (zeros where there is no procfs).
    pub(crate) fn read() -> anyhow::Result<Memory> {
        let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
            return Ok(Memory::default());
        };
        let field = |name: &str| -> anyhow::Result<u64> {
            let Some(line) = status.lines().find(|line| line.starts_with(name)) else {
                return Ok(0);
            };
            let kib: u64 = line
                .trim_start_matches(name)
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .with_context(|| format!("parsing {line:?}"))?;
            Ok(kib * 1024)
        };
        Ok(Memory {
            rss: field("VmRSS:")?,
            hwm: field("VmHWM:")?,
        })
    }

    /// VmRSS, bytes.
    pub(crate) fn rss(self) -> u64 {
        self.rss
    }

    /// VmHWM (peak RSS), bytes.
    pub(crate) fn hwm(self) -> u64 {
        self.hwm
    }
}

/// Everything the closing report shows.
#[derive(Debug)]
pub(crate) struct Report<'a> {
    pub(crate) args: &'a Args,
    pub(crate) store_path: Option<PathBuf>,
    pub(crate) measured: &'a Measured,
    pub(crate) stats: dormant::runtime::RuntimeStats,
    /// The runtime's counters, global: they include the work it did for sessions an earlier
    /// process left in the store.
    pub(crate) client: ClientToolStats,
    /// Timeouts recorded in this run's sessions.
    pub(crate) timeouts: u64,
    pub(crate) tools: ToolCounts,
    pub(crate) rss_before: Memory,
    pub(crate) rss_after: Memory,
    pub(crate) store_bytes: u64,
    pub(crate) flushes: u64,
    pub(crate) verify_elapsed: Duration,
    pub(crate) problems: &'a [String],
}

/// p50, p99, p999 and max of a histogram (µs).
fn quantiles(histogram: &Histogram<u64>) -> Value {
    json!({
        "count": histogram.len(),
        "p50": histogram.value_at_quantile(0.5),
        "p99": histogram.value_at_quantile(0.99),
        "p999": histogram.value_at_quantile(0.999),
        "max": histogram.max(),
    })
}

fn latency_json(latency: &Latency) -> Value {
    json!({
        "count": latency.count,
        "p50": latency.p50_us,
        "p99": latency.p99_us,
        "p999": latency.p999_us,
        "max": latency.max_us,
    })
}

fn quantiles_text(histogram: &Histogram<u64>) -> String {
    format!(
        "p50 {} µs, p99 {} µs, p999 {} µs, max {} µs",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.value_at_quantile(0.999),
        histogram.max()
    )
}

fn ms(us: u64) -> f64 {
    as_f64(us) / 1000.0
}

impl Report<'_> {
    fn secs(&self) -> f64 {
        self.measured.elapsed.as_secs_f64().max(1e-9)
    }

    fn turns(&self) -> usize {
        self.args.sessions * self.args.turns
    }

    fn suspensions(&self) -> usize {
        self.args.sessions * self.args.suspensions
    }

    fn model_steps(&self) -> usize {
        self.turns() * (self.args.steps + 1) + self.suspensions()
    }

    fn rehydrations(&self) -> u64 {
        // Every session's first activation creates it; a busy session is never evicted, so
        // each further activation loaded an existing session from the store.
        self.stats
            .host
            .activations
            .saturating_sub(u64::try_from(self.args.sessions).unwrap_or(u64::MAX))
    }

    /// Timeouts the runtime fired for sessions that are not this run's.
    fn earlier_timeouts(&self) -> u64 {
        self.client.timeouts.saturating_sub(self.timeouts)
    }

    fn commits_per_flush(&self) -> f64 {
        if self.flushes == 0 {
            0.0
        } else {
            as_f64(self.stats.commit_latency.count) / as_f64(self.flushes)
        }
    }

    fn rate(&self, count: u64) -> f64 {
        as_f64(count) / self.secs()
    }

    fn counter(counter: &std::sync::atomic::AtomicU64) -> u64 {
        Counters::get(counter)
    }

    fn suspension_json(&self) -> Value {
        let c = &self.measured.counters;
        let h = &self.measured.histograms;
        let get = Self::counter;
        json!({
            "per_session": self.args.suspensions,
            "total": self.suspensions(),
            "client_calls": get(&c.client_calls),
            "approvals": get(&c.approvals),
            "client_timeout_ms": self.args.client_timeout_ms,
            "answer_delay_ms_max": self.args.answer_delay_ms,
            "auto_resume": self.args.auto_resume,
            "seed": self.args.seed,
            "cycles": get(&c.cycles),
            "cycles_per_s": self.rate(get(&c.cycles)),
            "submit_latency_us": {
                "accepted": quantiles(&h.submit_accepted),
                "all": quantiles(&h.submit_all),
            },
            "resume_latency_us": quantiles(&h.resume),
            "client_wait_us": latency_json(&self.client.wait),
            "accepted": get(&c.accepted),
            "approvals_run": self.tools.deploys,
            "late_answers": get(&c.late),
            "never_answered": get(&c.never_answered),
            "timeouts_fired": self.timeouts,
            // Deadlines of sessions an earlier process left in the store, which this runtime
            // fired too (their lag is in timeout_lag_us).
            "timeouts_of_earlier_sessions": self.earlier_timeouts(),
            "timeout_lag_us": latency_json(&self.client.timeout_lag),
            "duplicates": {
                "sent": get(&c.duplicates),
                "already_completed": get(&c.duplicates_already_completed),
            },
            "wrong_kind": {
                "sent": get(&c.wrong_kind),
                "invalid_result": get(&c.wrong_kind_invalid),
                "late": get(&c.wrong_kind_late),
                "then_accepted": get(&c.wrong_kind_then_accepted),
            },
            "evicted_while_waiting": {
                "explicit_evictions": get(&c.explicit_evictions),
                "submits_to_evicted": get(&c.submits_to_evicted),
                "submits_to_lru_evicted": get(&c.submits_to_lru_evicted),
                "resumes_of_evicted": get(&c.resumes_of_evicted),
            },
        })
    }

    pub(crate) fn json(&self) -> Value {
        let host = &self.stats.host;
        let commits = &self.stats.commit_latency;
        let h = &self.measured.histograms;
        json!({
            "sessions": self.args.sessions,
            "steps_per_turn": self.args.steps,
            "turns_per_session": self.args.turns,
            "concurrency": self.args.concurrency,
            "max_resident": (self.args.max_resident > 0).then_some(self.args.max_resident),
            "engine": format!("{:?}", self.args.engine),
            "durability": format!("{:?}", Durability::from(self.args.durability)),
            "group_commit": !self.args.no_group_commit,
            "store_path": self.store_path.as_ref().map(|p| p.display().to_string()),
            "allocator": crate::allocator::NAME,
            "elapsed_s": self.secs(),
            "sessions_per_s": self.rate(count(self.args.sessions)),
            "turns_per_s": self.rate(count(self.turns())),
            "model_steps": self.model_steps(),
            "steps_per_s": self.rate(count(self.model_steps())),
            "tool_calls": self.tools.lookups + self.tools.deploys,
            "run_latency_us": quantiles(&h.run),
            "turn_latency_us": quantiles(&h.turn),
            "suspensions": self.suspension_json(),
            "commits": commits.count,
            "commits_per_s": self.rate(commits.count),
            "commit_latency_us": latency_json(commits),
            "commit_bytes": self.stats.commit_bytes,
            "flushes": self.flushes,
            "commits_per_flush": self.commits_per_flush(),
            "activations": host.activations,
            "passivations": host.passivations,
            "rehydrations": self.rehydrations(),
            "activation_failures": host.activation_failures,
            "crashes": host.crashes,
            "peak_resident": host.peak_resident,
            "resident_at_end": host.resident,
            "rss_before_bytes": self.rss_before.rss,
            "rss_after_bytes": self.rss_after.rss,
            "rss_peak_bytes": self.rss_after.hwm,
            "store_bytes": self.store_bytes,
            "verify_s": self.verify_elapsed.as_secs_f64(),
            "verified": self.problems.is_empty(),
            "problems": self.problems.iter().take(20).collect::<Vec<_>>(),
            "problem_count": self.problems.len(),
        })
    }

    fn print_suspensions(&self) {
        let args = self.args;
        let c = &self.measured.counters;
        let h = &self.measured.histograms;
        let get = Self::counter;
        let lag = &self.client.timeout_lag;
        let wait = &self.client.wait;
        println!(
            "suspensions:         {} per session, {} in all ({} client calls, {} approvals); timeout {} ms, answer delay ≤ {} ms, {} resume",
            args.suspensions,
            self.suspensions(),
            get(&c.client_calls),
            get(&c.approvals),
            args.client_timeout_ms,
            args.answer_delay_ms,
            if args.auto_resume { "automatic" } else { "explicit" },
        );
        println!(
            "suspension cycles/s: {:.0} ({} cycles: execute → suspend → durable submit → resume → complete)",
            self.rate(get(&c.cycles)),
            get(&c.cycles)
        );
        println!(
            "submit latency:      p50 {} µs, p99 {} µs, max {} µs ({} accepted); all {} submits p50 {} µs, p99 {} µs",
            h.submit_accepted.value_at_quantile(0.5),
            h.submit_accepted.value_at_quantile(0.99),
            h.submit_accepted.max(),
            h.submit_accepted.len(),
            h.submit_all.len(),
            h.submit_all.value_at_quantile(0.5),
            h.submit_all.value_at_quantile(0.99),
        );
        if !args.auto_resume {
            println!("resume latency:      {}", quantiles_text(&h.resume));
        }
        println!(
            "client wait:         p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (pending → accepted answer)",
            ms(wait.p50_us),
            ms(wait.p99_us),
            ms(wait.max_us)
        );
        println!(
            "answers:             {} accepted ({} approvals ran the tool once), {} late (after the deadline)",
            get(&c.accepted),
            self.tools.deploys,
            get(&c.late)
        );
        println!(
            "timeouts fired:      {} ({} never answered + {} late), lag p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            self.timeouts,
            get(&c.never_answered),
            get(&c.late),
            ms(lag.p50_us),
            ms(lag.p99_us),
            ms(lag.max_us)
        );
        if self.earlier_timeouts() > 0 {
            println!(
                "                     and {} of sessions an earlier process left in the store (the lag counts them too)",
                self.earlier_timeouts()
            );
        }
        println!(
            "duplicates:          {} sent, {} already_completed",
            get(&c.duplicates),
            get(&c.duplicates_already_completed)
        );
        println!(
            "wrong kinds:         {} sent, {} invalid_result ({} late), {} then accepted",
            get(&c.wrong_kind),
            get(&c.wrong_kind_invalid),
            get(&c.wrong_kind_late),
            get(&c.wrong_kind_then_accepted)
        );
        println!(
            "evicted waiting:     {} evicted on suspending; {} answers ({} evicted by the resident limit) and {} resumes reached an evicted session",
            get(&c.explicit_evictions),
            get(&c.submits_to_evicted),
            get(&c.submits_to_lru_evicted),
            get(&c.resumes_of_evicted)
        );
    }

    pub(crate) fn print(&self) {
        let args = self.args;
        let host = &self.stats.host;
        let commits = &self.stats.commit_latency;
        let h = &self.measured.histograms;
        let mib = |bytes: u64| as_f64(bytes) / (1024.0 * 1024.0);
        println!("dormant simulate");
        println!(
            "config:              {} sessions × {} turns × ({} tool steps + 1 text) + {} suspensions each, concurrency {}, max resident {}, {:?} store, {:?}, group commit {}",
            args.sessions,
            args.turns,
            args.steps,
            args.suspensions,
            args.concurrency,
            if args.max_resident > 0 { args.max_resident.to_string() } else { "unlimited".into() },
            args.engine,
            Durability::from(args.durability),
            if args.no_group_commit { "off" } else { "on" },
        );
        if let Some(path) = &self.store_path {
            println!("store:               {}", path.display());
        }
        println!("allocator:           {}", crate::allocator::NAME);
        println!("elapsed:             {:.2} s", self.secs());
        println!("sessions:            {}", args.sessions);
        println!(
            "sessions/s:          {:.0}",
            self.rate(count(args.sessions))
        );
        println!("turns/s:             {:.0}", self.rate(count(self.turns())));
        println!(
            "steps/s:             {:.0} ({} model steps)",
            self.rate(count(self.model_steps())),
            self.model_steps()
        );
        println!(
            "tool calls:          {} ({} lookups, {} approved deploys)",
            self.tools.lookups + self.tools.deploys,
            self.tools.lookups,
            self.tools.deploys
        );
        println!("run latency:         {}", quantiles_text(&h.run));
        if args.suspensions > 0 {
            println!(
                "turn latency:        {} (client waits included)",
                quantiles_text(&h.turn)
            );
            self.print_suspensions();
        }
        println!(
            "commits:             {} ({:.0}/s, {:.1} MiB)",
            commits.count,
            self.rate(commits.count),
            mib(self.stats.commit_bytes)
        );
        println!(
            "commit latency:      p50 {} µs, p99 {} µs, p999 {} µs, max {} µs",
            commits.p50_us, commits.p99_us, commits.p999_us, commits.max_us
        );
        println!("flushes:             {}", self.flushes);
        println!("commits per flush:   {:.1}", self.commits_per_flush());
        // The limit evicts idle sessions only, so busy ones can take the peak a little over it.
        println!(
            "peak resident:       {} (max resident evicts idle sessions only)",
            host.peak_resident
        );
        println!("activations:         {}", host.activations);
        println!("passivations:        {}", host.passivations);
        println!("rehydrations:        {}", self.rehydrations());
        println!(
            "crashes:             {} (activation failures {})",
            host.crashes, host.activation_failures
        );
        println!(
            "rss:                 {:.1} MiB before, {:.1} MiB after, {:.1} MiB peak",
            mib(self.rss_before.rss),
            mib(self.rss_after.rss),
            mib(self.rss_after.hwm)
        );
        println!("store on disk:       {:.1} MiB", mib(self.store_bytes));
        println!(
            "verified:            {} ({} problems, checked in {:.2} s)",
            if self.problems.is_empty() {
                "ok"
            } else {
                "FAILED"
            },
            self.problems.len(),
            self.verify_elapsed.as_secs_f64()
        );
        if args.suspensions > 0 && self.problems.is_empty() {
            println!(
                "                     every accepted answer applied exactly once with its value; every unanswered call timed out"
            );
        }
        for problem in self.problems.iter().take(20) {
            println!("  {problem}");
        }
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}
