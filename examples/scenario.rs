//! Run with: cargo run --example scenario
fn main() {}
