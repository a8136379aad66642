//! VmRSS of the bench process, shared by the benches that measure memory.

use anyhow::Context as _;

/// VmRSS of this process in bytes, from /proc/self/status (0 where there is no procfs).
pub(crate) fn rss_bytes() -> anyhow::Result<u64> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Ok(0);
    };
    let Some(line) = status.lines().find(|line| line.starts_with("VmRSS:")) else {
        return Ok(0);
    };
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("parsing {line:?}"))?;
    Ok(kib * 1024)
}
