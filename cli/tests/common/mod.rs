//! Helpers shared by the CLI integration tests: the real `gpuq` binary run on a store.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::{Command, Output};

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
