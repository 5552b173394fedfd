//! The store as users and other engines see it, through the real `gpuq` binary: which files
//! form a run, content stored under a second name, `--replace`, the ingest summary, and
//! DuckDB / polars reading exactly what gpuq reads after every kind of commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{gpuq, kineto_launches, ok, stderr, stdout};

fn query_csv(store: &Path, sql: &str) -> String {
    ok(store, &["query", "--format", "csv", sql])
}

/// `gpuq generate` of a small trace (rank 0 of 8, epoch clock).
fn generate(dir: &Path, name: &str, seed: u64) -> PathBuf {
    common::generate(dir, name, 300_000, seed)
}

/// A tiny Kineto trace: four launches and their kernels from `start_us` (epoch
/// microseconds), declaring `rank` if given.
fn tiny_trace(dir: &Path, name: &str, rank: Option<i32>, start_us: i64) -> PathBuf {
    kineto_launches(dir, name, 4, rank, start_us)
}

fn run_names(store: &Path) -> Vec<String> {
    query_csv(store, "SELECT run FROM runs ORDER BY run")
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// Epoch microseconds of 2023-11-14, and a year later.
const T0_US: i64 = 1_700_000_000_000_000;
const YEAR_US: i64 = 365 * 86_400 * 1_000_000;

#[test]
fn a_directory_of_unrelated_traces_becomes_one_run_per_file_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();
    tiny_trace(&traces, "old.json", Some(0), T0_US);
    tiny_trace(&traces, "new.json", Some(0), T0_US + YEAR_US);
    let out = ok(&store, &["ingest", traces.to_str().unwrap()]);
    assert!(out.contains("do not look like one job"), "{out}");
    assert!(out.contains("both are rank 0"), "{out}");
    assert_eq!(run_names(&store), ["new", "old"]);
    assert_eq!(
        query_csv(
            &store,
            "SELECT run, count(*) AS n FROM kernels GROUP BY run ORDER BY run"
        ),
        "run,n\nnew,4\nold,4\n"
    );
}

#[test]
fn files_without_ranks_far_apart_in_time_are_split_and_stored_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    std::fs::create_dir(&traces).unwrap();
    tiny_trace(&traces, "a.json", None, T0_US);
    tiny_trace(&traces, "b.json", None, T0_US + 2 * 3600 * 1_000_000);
    let store = dir.path().join("store");
    let out = ok(&store, &["ingest", traces.to_str().unwrap()]);
    assert!(out.contains("2.0 h apart"), "{out}");
    // Each is stored as it is when ingested alone: no rank given by its position.
    let alone = dir.path().join("alone");
    ok(&alone, &["ingest", traces.join("b.json").to_str().unwrap()]);
    let ranks = "SELECT run, count(*) AS n, min(rank) AS lo, max(rank) AS hi FROM events \
                 WHERE run = 'b' GROUP BY run";
    assert_eq!(query_csv(&store, ranks), query_csv(&alone, ranks));
    assert_eq!(run_names(&store), ["a", "b"]);
}

#[test]
fn the_ranks_of_one_job_stay_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let traces = dir.path().join("job");
    std::fs::create_dir(&traces).unwrap();
    for r in 0..3 {
        tiny_trace(
            &traces,
            &format!("rank{r}.json"),
            Some(r),
            T0_US + r as i64 * 7,
        );
    }
    let out = ok(&store, &["ingest", traces.to_str().unwrap()]);
    assert!(!out.contains("one job"), "{out}");
    assert_eq!(run_names(&store), ["job"]);
    assert_eq!(query_csv(&store, "SELECT ranks FROM runs"), "ranks\n3\n");
}

#[test]
fn a_named_run_of_unrelated_files_is_refused_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = tiny_trace(dir.path(), "a.json", Some(0), T0_US);
    let b = tiny_trace(dir.path(), "b.json", Some(1), T0_US + YEAR_US);
    ok(
        &store,
        &["ingest", "-q", a.to_str().unwrap(), "--run", "kept"],
    );
    let before = run_names(&store);
    let o = gpuq(
        &store,
        &[
            "ingest",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--run",
            "both",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("a.json") && err.contains("b.json"), "{err}");
    assert!(
        err.contains("days apart") && err.contains("--merge-unrelated"),
        "{err}"
    );
    assert_eq!(run_names(&store), before);
    let out = ok(
        &store,
        &[
            "ingest",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--run",
            "both",
            "--merge-unrelated",
        ],
    );
    assert!(out.contains("--merge-unrelated"), "{out}");
    assert_eq!(
        query_csv(
            &store,
            "SELECT count(*) AS n FROM kernels WHERE run = 'both'"
        ),
        "n\n8\n"
    );
}

#[test]
fn content_already_stored_under_a_new_run_name_makes_that_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t = generate(dir.path(), "t.json", 3);
    ok(
        &store,
        &["ingest", "-q", t.to_str().unwrap(), "--run", "base"],
    );
    let out = ok(&store, &["ingest", t.to_str().unwrap(), "--run", "cand"]);
    assert!(
        out.contains("stored as run cand") && out.contains("run base"),
        "{out}"
    );
    assert_eq!(run_names(&store), ["base", "cand"]);
    let counts = "SELECT run, count(*) AS n FROM events GROUP BY run ORDER BY run";
    let both = query_csv(&store, counts);
    let n: Vec<&str> = both
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(n[0], n[1], "{both}");
    let o = gpuq(
        &store,
        &["check", "--baseline", "base", "--candidate", "cand"],
    );
    assert!(!stderr(&o).contains("unknown run"), "{}", stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    // The same file again under the same name is still a no-op.
    let out = ok(&store, &["ingest", t.to_str().unwrap(), "--run", "cand"]);
    assert!(out.contains("already stored in run cand"), "{out}");
    // Removing one run leaves the other whole.
    ok(&store, &["runs", "rm", "base"]);
    assert_eq!(query_csv(&store, counts), format!("run,n\ncand,{}\n", n[1]));
}

#[test]
fn replace_keeps_the_tags_unless_new_ones_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t = generate(dir.path(), "t.json", 3);
    let u = generate(dir.path(), "u.json", 4);
    let tags = || {
        query_csv(
            &store,
            "SELECT tags['commit'] AS c, tags['branch'] AS b FROM runs",
        )
    };
    ok(
        &store,
        &[
            "ingest",
            "-q",
            t.to_str().unwrap(),
            "--run",
            "r",
            "--tag",
            "commit=abc",
        ],
    );
    ok(
        &store,
        &[
            "ingest",
            "-q",
            u.to_str().unwrap(),
            "--run",
            "r",
            "--replace",
        ],
    );
    assert_eq!(tags(), "c,b\nabc,\n");
    ok(
        &store,
        &[
            "ingest",
            "-q",
            t.to_str().unwrap(),
            "--run",
            "r",
            "--replace",
            "--tag",
            "branch=dev",
        ],
    );
    assert_eq!(tags(), "c,b\n,dev\n");
}

/// The `N.N MB` figures of an ingest summary line.
fn summary_mb(out: &str) -> Vec<f64> {
    let words: Vec<&str> = out.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[1] == "MB" || w[1] == "MB,")
        .filter_map(|w| w[0].trim_start_matches('(').parse().ok())
        .collect()
}

#[test]
fn the_ingest_speed_is_measured_on_decompressed_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let plain = generate(dir.path(), "t.json", 5);
    let gz = generate(dir.path(), "t.json.gz", 5);
    let plain_mb = std::fs::metadata(&plain).unwrap().len() as f64 / 1e6;
    let gz_mb = std::fs::metadata(&gz).unwrap().len() as f64 / 1e6;
    assert!(gz_mb < plain_mb / 2.0);
    let out = ok(&store, &["ingest", gz.to_str().unwrap(), "--run", "gz"]);
    let mb = summary_mb(&out);
    assert_eq!(mb.len(), 2, "{out}");
    assert!(
        (mb[0] - plain_mb).abs() < 0.05,
        "{out}: {plain_mb} MB decompressed"
    );
    assert!(
        (mb[1] - gz_mb).abs() < 0.05 && out.contains("compressed"),
        "{out}"
    );
}

/// Per run: (events, kernels), as gpuq counts them.
fn gpuq_counts(store: &Path) -> BTreeMap<String, (u64, u64)> {
    let csv = query_csv(
        store,
        "SELECT run, count(*) AS n, count(*) FILTER (WHERE kind = 'kernel') AS k \
         FROM events GROUP BY run",
    );
    csv.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].to_string(),
                (f[1].parse().unwrap(), f[2].parse().unwrap()),
            )
        })
        .collect()
}

/// Whether python3 with duckdb and polars is here; when not, the test is skipped (saying
/// so) unless `GPUQ_REQUIRE_PY=1`, as CI sets.
fn python_engines() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import duckdb, polars"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("GPUQ_REQUIRE_PY").as_deref() != Ok("1"),
            "GPUQ_REQUIRE_PY=1 but python3 cannot import duckdb and polars"
        );
        eprintln!("skipped: python3 with duckdb and polars not found (pip install duckdb polars)");
    }
    found
}

/// Checks that DuckDB's and polars' reads of the Hive glob and of `gpuq files` count what
/// gpuq counts, run by run.
fn engines_agree(store: &Path, step: &str) {
    let want = gpuq_counts(store);
    let duckdb = ok(store, &["files", "--format", "duckdb"]);
    let json = ok(store, &["files", "--format", "json"]);
    let o = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/engines.py"))
        .arg(store)
        .arg(duckdb.trim())
        .arg(json.trim())
        .output()
        .unwrap();
    assert!(o.status.success(), "{step}: {}", stderr(&o));
    let mut seen: BTreeMap<String, BTreeMap<String, (u64, u64)>> = BTreeMap::new();
    for line in stdout(&o).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let counts = seen.entry(f[0].to_string()).or_default();
        if f[1] != "-" {
            counts.insert(
                f[1].to_string(),
                (f[2].parse().unwrap(), f[3].parse().unwrap()),
            );
        }
    }
    assert_eq!(seen.len(), 4, "{step}: {}", stdout(&o));
    for (source, counts) in &seen {
        assert_eq!(counts, &want, "{step}: {source} disagrees with gpuq");
    }
}

#[test]
fn duckdb_and_polars_see_exactly_what_gpuq_sees_after_every_commit() {
    if !python_engines() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let [a, b, c] = [1, 2, 3].map(|s| generate(dir.path(), &format!("t{s}.json"), s));
    ok(
        &store,
        &["ingest", "-q", a.to_str().unwrap(), "--run", "alpha"],
    );
    ok(
        &store,
        &["ingest", "-q", b.to_str().unwrap(), "--run", "beta"],
    );
    engines_agree(&store, "ingest");
    let before = gpuq_counts(&store);
    ok(
        &store,
        &[
            "ingest",
            "-q",
            c.to_str().unwrap(),
            "--run",
            "alpha",
            "--replace",
        ],
    );
    assert_ne!(gpuq_counts(&store)["alpha"], before["alpha"]);
    engines_agree(&store, "replace");
    ok(
        &store,
        &["ingest", "-q", a.to_str().unwrap(), "--run", "beta"],
    );
    ok(
        &store,
        &["ingest", "-q", c.to_str().unwrap(), "--run", "gamma"],
    );
    engines_agree(&store, "append and share");
    let out = ok(&store, &["compact"]);
    assert!(out.contains("beta: merged"), "{out}");
    engines_agree(&store, "compact");
    ok(&store, &["runs", "rm", "alpha"]);
    engines_agree(&store, "runs rm");
    ok(&store, &["runs", "rm", "beta"]);
    ok(&store, &["runs", "rm", "gamma"]);
    assert!(gpuq_counts(&store).is_empty());
    engines_agree(&store, "empty");
}

#[test]
fn files_prints_the_current_versions_files_of_the_runs_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = generate(dir.path(), "a.json", 1);
    let b = generate(dir.path(), "b.json", 2);
    ok(
        &store,
        &["ingest", "-q", a.to_str().unwrap(), "--run", "alpha"],
    );
    ok(
        &store,
        &["ingest", "-q", b.to_str().unwrap(), "--run", "beta"],
    );
    let all = ok(&store, &["files"]);
    let alpha = ok(&store, &["files", "alpha"]);
    assert!(!alpha.is_empty() && all.len() > alpha.len());
    for line in alpha.lines() {
        let p = Path::new(line);
        assert!(p.is_absolute() && p.exists(), "{line}");
        assert!(line.contains("/events/run=alpha/"), "{line}");
    }
    let counters = ok(&store, &["files", "--table", "counters"]);
    assert!(
        counters.lines().all(|l| l.contains("/counters/run=")),
        "{counters}"
    );
    // A replaced version's files stay readable at the printed paths for older readers.
    ok(
        &store,
        &[
            "ingest",
            "-q",
            b.to_str().unwrap(),
            "--run",
            "alpha",
            "--replace",
        ],
    );
    assert!(alpha.lines().all(|l| Path::new(l).exists()));
    assert_ne!(ok(&store, &["files", "alpha"]), alpha);
    let o = gpuq(&store, &["files", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown run: nope"), "{}", stderr(&o));
}

#[test]
fn real_unrelated_kineto_traces_become_one_run_each_and_real_ranks_one_run() {
    let Some(hta) = gpuq_testkit::shared_traces("kineto/hta") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = ok(&store, &["ingest", hta.to_str().unwrap()]);
    let traces = std::fs::read_dir(&hta).unwrap().count();
    assert!(out.contains("do not look like one job"), "{out}");
    assert_eq!(run_names(&store).len(), traces, "{out}");
    let Some(dlrm) = gpuq_testkit::shared_traces("kineto/param_dlrm_8rank") else {
        return;
    };
    let out = ok(&store, &["ingest", dlrm.to_str().unwrap()]);
    assert!(!out.contains("one job"), "{out}");
    assert_eq!(
        query_csv(
            &store,
            "SELECT ranks FROM runs WHERE run = 'param_dlrm_8rank'"
        ),
        "ranks\n8\n"
    );
}
