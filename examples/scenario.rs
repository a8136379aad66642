//! Run with: cargo run --example scenario -- FILE_OR_DIR...
//!
//! Runs conformance scenario files (a directory stands for its `*.json` files, sorted), prints
//! one line per failing step and a closing `N passed, M failed`, and exits with status 0 only
//! if every file passed.

use std::path::PathBuf;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let paths: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        eprintln!("usage: cargo run --example scenario -- FILE_OR_DIR...");
        return ExitCode::from(2);
    }
    let summary = dormant::testkit::scenario::run_paths(&paths).await;
    for line in summary.failure_lines() {
        println!("{line}");
    }
    println!("{summary}");
    if summary.all_passed() && !summary.results().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
