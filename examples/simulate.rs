//! Run with: cargo run --example simulate
fn main() {}
