//! CPU time of the bench process (every thread: runtime workers, the store's flusher, sled's
//! I/O threads), a steadier figure than wall time on a shared two-core machine.

use std::time::Duration;

/// User + system CPU time this process has used so far, from /proc/self/stat (`None` where
/// there is no procfs or it cannot be read).
pub(crate) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // Fields 3.. follow; utime and stime are fields 14 and 15 of the whole line.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // Linux reports them in USER_HZ ticks, which is 100 on every architecture it supports.
    Some(Duration::from_millis((utime + stime) * 10))
}
