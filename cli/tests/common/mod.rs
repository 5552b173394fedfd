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
