//! Helpers shared by the CLI integration tests: the real `gpuq` binary run on a store.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `gpuq --store STORE ARGS...`, waited for.
pub fn gpuq(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs the command, asserts it succeeded and returns its standard output.
pub fn ok(store: &Path, args: &[&str]) -> String {
    let o = gpuq(store, args);
    assert!(o.status.success(), "gpuq {args:?}: {}", stderr(&o));
    stdout(&o)
}

/// `gpuq query --format csv SQL`, asserted to succeed: its standard output.
pub fn query_csv(store: &Path, sql: &str) -> String {
    let o = gpuq(store, &["query", "--format", "csv", sql]);
    assert!(o.status.success(), "{sql}: {}", stderr(&o));
    stdout(&o)
}

/// A file of the repository, by its path from the root.
pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// A generated Nsight Systems export (a small two-process capture) at `path`.
pub fn generate_nsys(path: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(["generate", "--format", "nsys", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `gpuq --store STORE sql ARGS...` with `input` on its standard input (not a terminal),
/// waited for.
pub fn shell_output(store: &Path, args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(store)
        .arg("sql")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `gpuq generate` of a Kineto trace of about `bytes` bytes at `dir/name`.
pub fn generate(dir: &Path, name: &str, bytes: u64, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            path.to_str().unwrap(),
            "--bytes",
            &bytes.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    path
}

/// A store under `dir` holding the small generated Nsight Systems export as run `r`.
pub fn store_with_nsys_run(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    let nsys = dir.join("r.sqlite");
    generate_nsys(&nsys);
    let o = gpuq(
        &store,
        &["ingest", "-q", nsys.to_str().unwrap(), "--run", "r"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    store
}

/// A Kineto trace with one kernel of each name given, 10 µs each, one after another.
pub fn kineto_with_kernels(path: &Path, names: &[&str]) {
    let events: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                r#"{{"ph": "X", "cat": "kernel", "name": "{n}", "pid": 0, "tid": 7, "ts": {}, "dur": 10, "args": {{"device": 0, "stream": 7}}}}"#,
                100 + 20 * i
            )
        })
        .collect();
    std::fs::write(
        path,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
}

/// A small Kineto trace at `dir/name`: `launches` launches of a `gemm` kernel, one per
/// millisecond from `start_us` (epoch microseconds), declaring `rank` if given.
pub fn kineto_launches(
    dir: &Path,
    name: &str,
    launches: usize,
    rank: Option<i32>,
    start_us: i64,
) -> PathBuf {
    let mut events = Vec::new();
    for i in 0..launches as i64 {
        let ts = start_us + i * 1000;
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
    let dist = rank
        .map(|r| {
            format!(r#""distributedInfo": {{"backend": "nccl", "rank": {r}, "world_size": 8}}, "#)
        })
        .unwrap_or_default();
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(r#"{{{dist}"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
    path
}
