//! Ingest on damaged, hostile or contended input, through the real `gpuq` binary: a writer
//! waiting for the store lock, Nsight Systems exports in WAL mode, damaged rocprofv3 CSVs,
//! oversized strings and decompression bombs. Each ends in an error naming the file and
//! where, or in the events the input holds; never a hang, a panic or a silent loss.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{gpuq, kineto_launches, ok, stderr};

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
    let trace = kineto_launches(dir.path(), "t.json", 3, None, 1_700_000_000_000_000);
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

/// A copy of the rocprofv3 fixture output directory, its kernel table replaced by `kernels`.
fn rocprof_dir_with_kernels(dir: &Path, name: &str, kernels: &[u8]) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingest/fixtures/rocprof/modern");
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for f in std::fs::read_dir(&fixture).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(out.join("4242_kernel_trace.csv"), kernels).unwrap();
    out
}

/// A damaged rocprofv3 CSV in an output directory (a required column missing, a NUL byte, cut
/// inside its header or a row) is an error naming the file and line, the store unchanged; it
/// is never passed over, leaving the run without its rows.
#[test]
fn a_damaged_rocprof_csv_in_a_directory_is_an_error_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ingest/fixtures/rocprof/modern/4242_kernel_trace.csv");
    let kernels = std::fs::read(&fixture).unwrap();
    let text = String::from_utf8(kernels.clone()).unwrap();
    let second_row = text.match_indices('\n').nth(1).unwrap().0 + 1;

    let no_name_column = text.replacen("\"Kernel_Name\"", "\"Kernel\"", 1);
    let mut nul = kernels.clone();
    nul[second_row + 3] = 0;
    let cases: [(&str, &[u8], &str); 4] = [
        ("missing", no_name_column.as_bytes(), "line 1"),
        ("nul", &nul, "line 3"),
        ("cut-header", &kernels[..100], "line 1"),
        ("cut-row", &kernels[..second_row + 40], "line 3"),
    ];
    for (name, damaged, line) in cases {
        let out = rocprof_dir_with_kernels(dir.path(), name, damaged);
        let o = gpuq(
            &store,
            &["ingest", "-q", out.to_str().unwrap(), "--run", name],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("4242_kernel_trace.csv"), "{name}: {err}");
        assert!(err.contains(line), "{name}: {err}");
    }
    assert_eq!(run_count(&store), 0, "a damaged output was stored");

    // The undamaged copy goes in whole.
    let out = rocprof_dir_with_kernels(dir.path(), "whole", &kernels);
    ok(
        &store,
        &["ingest", "-q", out.to_str().unwrap(), "--run", "whole"],
    );
    let kernels_stored = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT count(*) AS n FROM kernels",
        ],
    );
    assert_eq!(kernels_stored.lines().nth(1), Some("5"), "{kernels_stored}");
}

/// `gpuq ARGS...` with `envs`, killed and reported as a hang past `limit`.
fn gpuq_within(limit: Duration, envs: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("gpuq {args:?} hung: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The export at `path` switched to WAL mode, as `PRAGMA journal_mode=WAL` leaves a cleanly
/// closed database: file format versions 2 (bytes 18 and 19 of the header).
fn wal_copy(path: &Path, dir: &Path, name: &str) -> PathBuf {
    let mut bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..16], b"SQLite format 3\0");
    bytes[18] = 2;
    bytes[19] = 2;
    let out = dir.join(name);
    std::fs::write(&out, bytes).unwrap();
    out
}

fn events_of(store: &Path, run: &str) -> String {
    ok(
        store,
        &["query", "--format", "csv", &format!("SELECT kind, count(*) AS n FROM events WHERE run = '{run}' GROUP BY kind ORDER BY kind")],
    )
}

/// Nsight Systems exports in WAL mode are read through SQLite by many reading threads (the
/// page reader needs a rollback-journal file); their connections are opened and closed one
/// at a time, because two closing at once could deadlock (about one ingest in 40 hung at 0 %
/// CPU). Each ingest here must finish in time and store what the rollback-mode file gives.
#[test]
fn nsys_exports_in_wal_mode_ingest_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let generated = dir.path().join("gen.sqlite");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(["generate", "--format", "nsys", generated.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut exports = vec![generated];
    if let Some(shared) = gpuq_testkit::shared_traces("nsys") {
        exports.extend(
            std::fs::read_dir(&shared)
                .unwrap()
                .map(|f| f.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "sqlite")),
        );
    }
    let store_s = store.to_str().unwrap();
    for (i, export) in exports.iter().enumerate() {
        let base = format!("x{i}");
        ok(
            &store,
            &["ingest", "-q", export.to_str().unwrap(), "--run", &base],
        );
        let want = events_of(&store, &base);
        for round in 0..8 {
            // A fresh WAL copy each time (the first reader creates its -shm and -wal), read
            // by more threads than cores.
            let wal = wal_copy(export, dir.path(), &format!("wal-{i}-{round}.sqlite"));
            // `--replace`: read again, though the content is stored already.
            let run = format!("{base}-wal");
            let o = gpuq_within(
                Duration::from_secs(120),
                &[("RAYON_NUM_THREADS", "8")],
                &[
                    "--store",
                    store_s,
                    "ingest",
                    "-q",
                    wal.to_str().unwrap(),
                    "--run",
                    &run,
                    "--replace",
                ],
            );
            assert!(o.status.success(), "{}: {}", wal.display(), stderr(&o));
            assert_eq!(events_of(&store, &run), want, "{}", wal.display());
        }
    }
}
