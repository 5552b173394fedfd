//! Helpers shared by gpuq's tests (a dev-dependency only): where the real traces are
//! ([`shared_traces`], [`trace_files`]) and readers of Arrow columns as plain values
//! ([`strings`], [`ints`]), and a damaged trace ([`with_bad_timestamp`]).

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type};
use std::path::{Path, PathBuf};

/// Set to `1` (as `.ci/run` does where `../shared/traces` exists) to make a missing real-trace
/// directory fail the test instead of skipping it.
pub const REQUIRE_TRACES: &str = "GPUQ_REQUIRE_TRACES";

/// `../shared/traces/<kind>` beside the workspace (`kind` such as `nsys` or
/// `kineto/tracelens`), or `None` after printing `SKIPPED: ...` when it is missing; a test
/// then checks what it can without it. Panics instead when `GPUQ_REQUIRE_TRACES=1`, so that
/// no real-trace check is skipped silently where the traces should be.
///
/// The workspace is found from the `CARGO_MANIFEST_DIR` that `cargo test` runs the test in,
/// before the one compiled in: a test binary built from another checkout sharing the target
/// directory (a CI clone) is reused by cargo, and would otherwise look beside that checkout.
pub fn shared_traces(kind: &str) -> Option<PathBuf> {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let dir = crate_dir.join("../../shared/traces").join(kind);
    if dir.is_dir() {
        return Some(dir);
    }
    let missing = format!("../shared/traces/{kind} not found ({})", dir.display());
    if std::env::var(REQUIRE_TRACES).is_ok_and(|v| v == "1") {
        panic!("{missing}, and {REQUIRE_TRACES}=1 requires the real traces");
    }
    eprintln!("SKIPPED: {missing}; the real-trace checks did not run");
    None
}

/// Every `*.json`, `*.json.gz` below `dir`, sorted.
pub fn trace_files(dir: &Path) -> Vec<PathBuf> {
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

/// A Utf8 or dictionary column as strings.
pub fn strings(b: &RecordBatch, col: &str) -> Vec<Option<String>> {
    let c = b.column_by_name(col).unwrap();
    match c.data_type() {
        DataType::Dictionary(_, _) => {
            let d = c.as_dictionary::<Int32Type>();
            let v = d.values().as_string::<i32>();
            (0..d.len())
                .map(|i| d.key(i).map(|k| v.value(k).to_string()))
                .collect()
        }
        _ => c
            .as_string::<i32>()
            .iter()
            .map(|s| s.map(String::from))
            .collect(),
    }
}

/// An Int32 or Int64 column as i64s.
pub fn ints(b: &RecordBatch, col: &str) -> Vec<Option<i64>> {
    let c = b.column_by_name(col).unwrap();
    match c.data_type() {
        DataType::Int32 => c
            .as_primitive::<Int32Type>()
            .iter()
            .map(|v| v.map(i64::from))
            .collect(),
        _ => c.as_primitive::<Int64Type>().iter().collect(),
    }
}

/// Kineto JSON `trace` damaged but not cut short: the `ts` of a complete (`X`) event in its
/// second half becomes a string, which ingest refuses with the byte position.
pub fn with_bad_timestamp(trace: &[u8]) -> Vec<u8> {
    let find = |from: usize, what: &[u8]| {
        from + trace[from..]
            .windows(what.len())
            .position(|w| w == what)
            .expect("a complete event with a timestamp in the second half")
    };
    let ts = find(find(trace.len() / 2, b"{\"ph\": \"X\""), b"\"ts\": ") + 6;
    let end = find(ts, b",");
    let mut bad = trace.to_vec();
    bad.splice(ts..end, *b"\"abc\"");
    bad
}
