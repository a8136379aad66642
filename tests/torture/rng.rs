//! A tiny seeded generator (splitmix64) and a stable string hash (FNV-1a): enough for a
//! reproducible workload without a dependency, and stable across processes and Rust versions
//! (std's hasher promises neither), which matters because every child process must derive the
//! same script for a session.

/// splitmix64: one u64 of state, good enough statistics for choosing kills and workloads.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for one named thing (a session, a generation), independent of the others.
    pub(crate) fn derived(seed: u64, name: &str) -> Self {
        Self(seed ^ fnv(name))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `low..high` (`high > low`).
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low))
    }

    /// True with probability `percent`/100.
    pub(crate) fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// FNV-1a, 64 bits.
pub(crate) fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}
