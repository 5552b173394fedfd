//! Ingest on damaged, hostile or contended input, through the real `gpuq` binary: a writer
//! waiting for the store lock. Each ends in an error naming the file and where, or in the
//! events the input holds; never a hang, a panic or a silent loss.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{gpuq, ok, stderr};

/// A small Kineto trace: `n` launches and their kernels.
fn kineto_trace(dir: &Path, name: &str, n: usize) -> PathBuf {
    let mut events = Vec::new();
    for i in 0..n as i64 {
        let ts = 1_700_000_000_000_000 + i * 1000;
        events.push(format!(
            r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {ts}, "dur": 5, "args": {{"correlation": {c}}}}}"#,
            c = i + 1
        ));
        events.push(format!(
            r#"{{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": {}, "dur": 100, "args": {{"device": 0, "stream": 7, "correlation": {c}}}}}"#,
            ts + 10,
            c = i + 1
        ));
    }
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
    path
}

fn run_count(store: &Path) -> usize {
    ok(
        store,
        &["query", "--format", "csv", "SELECT count(*) AS n FROM runs"],
    )
    .lines()
    .nth(1)
    .unwrap()
    .parse()
    .unwrap()
}

/// A writer that finds the store locked says by whom on stderr, gives up after
/// `--lock-timeout` (or `GPUQ_LOCK_TIMEOUT`) with an error and exit 1, and leaves the store
/// as it was; once the lock is free, the same ingest goes through.
#[test]
fn a_writer_waiting_for_the_store_lock_says_so_and_gives_up_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = kineto_trace(dir.path(), "t.json", 3);
    let trace = trace.to_str().unwrap();
    ok(&store, &["ingest", "-q", trace, "--run", "first"]);

    // Another writer: holds the lock, its pid in the lock file as gpuq writes it.
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(store.join("_lock"))
        .unwrap();
    lock.lock().unwrap();
    std::fs::write(store.join("_lock"), "4242\n").unwrap();

    let second = [
        "--lock-timeout",
        "1s",
        "ingest",
        "-q",
        trace,
        "--run",
        "second",
    ];
    let started = Instant::now();
    let o = gpuq(&store, &second);
    let waited = started.elapsed();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("waiting for the store lock held by pid 4242"),
        "{err}"
    );
    assert!(err.contains("gave up waiting for the store lock"), "{err}");
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(20),
        "{waited:?}"
    );

    // The environment variable does the same; 0 does not wait at all.
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(["--store", store.to_str().unwrap()])
        .args(["runs", "rm", "first"])
        .env("GPUQ_LOCK_TIMEOUT", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("held by pid 4242"), "{}", stderr(&o));

    drop(lock);
    assert_eq!(run_count(&store), 1, "the store changed while locked");
    ok(&store, &second);
    assert_eq!(run_count(&store), 2);
}
