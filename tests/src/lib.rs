//! Helpers for gpuq's cross-crate tests.

use std::path::PathBuf;

/// `../shared/traces/<sub>` next to the workspace, if it exists.
pub fn shared_traces(sub: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/traces")
        .join(sub);
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
