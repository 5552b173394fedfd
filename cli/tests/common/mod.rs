//! Helpers shared by the CLI integration tests: the real `gpuq` binary run on a store.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::path::Path;
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
