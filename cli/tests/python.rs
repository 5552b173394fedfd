//! `import gpuq`: the pytest suite of `python/tests` run against the extension module this
//! build made (`lib_gpuq.so`, a workspace member) and this `gpuq` binary, with the package laid
//! out in a temporary directory as `pip install ./python` would install it.
//!
//! Needs python3 with pytest, pandas and pyarrow (polars and DuckDB where present); skipped
//! without them unless `GPUQ_REQUIRE_PY=1`, as CI sets.

mod common;

use common::repo_file;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The newest build of the extension module beside the binary (cargo refreshes the copy in
/// `deps/` on every build, the one beside it only on some).
fn extension_module() -> Option<PathBuf> {
    let release = Path::new(env!("CARGO_BIN_EXE_gpuq")).parent()?;
    [
        release.join("lib_gpuq.so"),
        release.join("deps/lib_gpuq.so"),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

fn python_ready() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import pytest, pandas, pyarrow"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("GPUQ_REQUIRE_PY").as_deref() != Ok("1"),
            "GPUQ_REQUIRE_PY=1 but python3 cannot import pytest, pandas and pyarrow"
        );
        eprintln!("skipped: python3 with pytest, pandas and pyarrow not found");
    }
    found
}

#[test]
fn the_python_package_passes_its_tests() {
    if !python_ready() {
        return;
    }
    let Some(module) = extension_module() else {
        panic!("no lib_gpuq.so beside the gpuq binary: build the workspace (cargo test --release --workspace)");
    };
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("gpuq");
    std::fs::create_dir(&package).unwrap();
    std::fs::copy(
        repo_file("python/gpuq/__init__.py"),
        package.join("__init__.py"),
    )
    .unwrap();
    std::fs::copy(&module, package.join("_gpuq.abi3.so")).unwrap();
    let o = Command::new("python3")
        // Short tracebacks: a long one repr()s each frame's arguments, and the repr of a
        // Result runs its query (endless in the Ctrl-C test).
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            "--tb=short",
        ])
        .arg(repo_file("python/tests"))
        .env("PYTHONPATH", dir.path())
        .env("GPUQ_BIN", env!("CARGO_BIN_EXE_gpuq"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{out}");
    eprintln!("{out}");
    // Only the real-PyTorch test may skip, where torch is not installed and not required.
    let torch_optional = std::env::var("GPUQ_REQUIRE_TORCH").as_deref() != Ok("1");
    let skipped: Vec<&str> = out.lines().filter(|l| l.starts_with("SKIPPED")).collect();
    assert!(
        skipped
            .iter()
            .all(|l| torch_optional && l.contains("torch is not installed")),
        "a Python test was skipped: {out}"
    );
    assert_eq!(
        out.contains(" skipped"),
        !skipped.is_empty(),
        "a skip without its reason: {out}"
    );
}
