//! Helpers for gpuq's cross-crate tests.

use std::path::PathBuf;

/// `../shared/traces/<sub>` next to the workspace, if it exists. The crate's directory is
/// taken from the environment `cargo test` runs the tests in, before the one compiled in: a
/// test binary built from another checkout sharing the target directory (a CI clone) is
/// reused by cargo, and would otherwise look beside that checkout and skip.
pub fn shared_traces(sub: &str) -> Option<PathBuf> {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let dir = crate_dir.join("../../shared/traces").join(sub);
    dir.is_dir().then_some(dir)
}

/// Every `*.json`, `*.json.gz` below `dir`, sorted.
pub fn trace_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".json.gz")
                || p.to_string_lossy().ends_with(".json")
            {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

pub mod fuzz;
mod fuzz_seeds;
