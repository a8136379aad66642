//! The global allocator of the `hitl` bench and of the simulator: mimalloc, unless the
//! `system-allocator` feature asks for the system's.
//!
//! The library never sets an allocator; a program that embeds it chooses. With thousands of
//! sessions in flight, glibc's malloc spends much of a suspension cycle in its arena locks,
//! free-list consolidation and heap growth (a third of the runtime's CPU in profiles, and
//! about half of sled's node copies): the same cycles run 1.5–1.8× faster on mimalloc (see
//! BENCHMARKS.md). So these programs measure what a daemon should deploy, and
//! `--features system-allocator` measures the default.

#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator in use, for reports.
pub(crate) const NAME: &str = if cfg!(feature = "system-allocator") {
    "system"
} else {
    "mimalloc"
};
