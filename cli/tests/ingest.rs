//! `gpuq ingest` through the real binary, in temporary directories: every input format
//! detected and stored, bad input rejected with the store unchanged, re-ingest and `--replace`,
//! a killed ingest.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{
    generate, generate_nsys, gpuq, kineto_with_kernels, ok, query_csv, repo_file, stderr, stdout,
    store_with_nsys_run,
};

/// Every file of the store with its bytes, except the writer's lock file.
fn snapshot(store: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![store.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() != "_lock" {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Whether an error line repeats its cause (`gpuq: error: FILE: X: X`), as error reporters do
/// when the cause is both in the message and the error's `source()`.
fn said_twice(err: &str, file: &Path) -> bool {
    let prefix = format!("gpuq: error: {}: ", file.display());
    let Some(m) = err.trim_end().strip_prefix(&prefix) else {
        return false;
    };
    m.match_indices(": ").any(|(i, _)| m[..i] == m[i + 2..])
}

#[test]
fn ingest_then_query_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = generate(dir.path(), "train.json.gz", 2_000_000, 1);
    let o = gpuq(
        &store,
        &[
            "ingest",
            trace.to_str().unwrap(),
            "--run",
            "llama-bs8",
            "--tag",
            "model=llama",
            "--tag",
            "bs=8",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stored as run llama-bs8"),
        "{}",
        stdout(&o)
    );
    let sql = "SELECT name, count(*) AS n, sum(dur) AS total_ns FROM kernels WHERE run = 'llama-bs8' GROUP BY name ORDER BY total_ns DESC LIMIT 3";
    let csv = gpuq(&store, &["query", "--format", "csv", sql]);
    assert!(csv.status.success(), "{}", stderr(&csv));
    let lines: Vec<String> = stdout(&csv).lines().map(String::from).collect();
    assert_eq!(lines[0], "name,n,total_ns");
    assert_eq!(lines.len(), 4);
    let json = gpuq(&store, &["query", "--format", "json", sql]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);
    let first_total: i64 = lines[1].rsplit(',').next().unwrap().parse().unwrap();
    assert_eq!(v[0]["total_ns"].as_i64().unwrap(), first_total);
    let nd = gpuq(&store, &["query", "--format", "ndjson", sql]);
    assert_eq!(stdout(&nd).lines().count(), 3);
    let md = gpuq(&store, &["query", "--format", "markdown", sql]);
    assert!(
        stdout(&md).starts_with("| name | n | total_ns |\n|---|---|---|\n"),
        "{}",
        stdout(&md)
    );
    let table = gpuq(
        &store,
        &[
            "query",
            "SELECT tags['model'] AS model FROM runs; SELECT count(*) AS k FROM kernels",
        ],
    );
    assert!(table.status.success());
    assert!(
        stdout(&table).contains("llama") && stdout(&table).contains("| k "),
        "{}",
        stdout(&table)
    );
    // SQL from a file, several statements.
    let f = dir.path().join("q.sql");
    std::fs::write(&f, "SELECT 1 AS one;\nSELECT 2 AS two;\n").unwrap();
    let o = gpuq(
        &store,
        &["query", "--format", "csv", "-f", f.to_str().unwrap()],
    );
    assert_eq!(stdout(&o), "one\n1\ntwo\n2\n");
    // Tables show the first --maxrows rows (default 40) and say so; other formats print all.
    let hundred = "SELECT ts FROM events ORDER BY ts LIMIT 100";
    let data_rows = |o: &Output| {
        stdout(o)
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| ts"))
            .count()
    };
    let cut = gpuq(&store, &["query", hundred]);
    assert_eq!(data_rows(&cut), 40, "{}", stdout(&cut));
    assert!(
        stdout(&cut).contains("100 rows, the first 40 shown"),
        "{}",
        stdout(&cut)
    );
    let all = gpuq(&store, &["query", "--maxrows", "inf", hundred]);
    assert_eq!(data_rows(&all), 100);
    assert!(!stdout(&all).contains("shown"));
    let five = gpuq(&store, &["query", "--maxrows", "5", hundred]);
    assert_eq!(data_rows(&five), 5);
    let csv = gpuq(&store, &["query", "--format", "csv", hundred]);
    assert_eq!(stdout(&csv).lines().count(), 101);
    let bad = gpuq(&store, &["query", "--maxrows", "many", hundred]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not a row count"), "{}", stderr(&bad));
}

#[test]
fn a_relative_store_path_works() {
    let dir = tempfile::tempdir().unwrap();
    let t = generate(dir.path(), "t.json", 200_000, 7);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gpuq"))
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run(&[
        "--store",
        "st",
        "ingest",
        "-q",
        t.to_str().unwrap(),
        "--run",
        "r"
    ])
    .status
    .success());
    let o = run(&[
        "--store",
        "./st",
        "query",
        "--format",
        "csv",
        "SELECT count(*) > 0 AS ok FROM kernels",
    ]);
    assert_eq!(stdout(&o), "ok\ntrue\n", "{}", stderr(&o));
}

#[test]
fn bad_input_is_rejected_and_leaves_the_store_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let good = generate(dir.path(), "good.json", 300_000, 2);
    assert!(gpuq(
        &store,
        &["ingest", "-q", good.to_str().unwrap(), "--run", "good"]
    )
    .status
    .success());
    let text = std::fs::read_to_string(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated.json",
            text.as_bytes()[..text.len() / 2].to_vec(),
            "truncated",
        ),
        (
            "not_a_trace.json",
            br#"{"hello": "world"}"#.to_vec(),
            "traceEvents",
        ),
        (
            "binary.json",
            vec![0u8, 159, 146, 150, 1, 2, 3],
            "unrecognised format",
        ),
        ("empty.json", Vec::new(), "empty"),
        (
            "nodur.json",
            br#"{"traceEvents": [{"ph": "X", "name": "k", "ts": 1}]}"#.to_vec(),
            "dur",
        ),
        (
            "types.json",
            br#"{"traceEvents": [{"ph": "X", "name": "k", "ts": [1], "dur": 1}]}"#.to_vec(),
            "\"ts\"",
        ),
        ("list.json", b"[1, 2, 3]".to_vec(), "unrecognised format"),
    ];
    let before = snapshot(&store);
    for (name, bytes, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let o = gpuq(&store, &["ingest", path.to_str().unwrap(), "--run", "bad"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(name),
            "{name}: error does not name the file: {err}"
        );
        assert!(err.contains(needle), "{name}: {err}");
        assert!(!said_twice(&err, &path), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert_eq!(snapshot(&store), before, "{name} changed the store");
    }
    let o = gpuq(&store, &["ingest", "/no/such/file.json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/no/such/file.json"));
    for bad in ["../x", "", "a b", "run/1"] {
        let o = gpuq(&store, &["ingest", good.to_str().unwrap(), "--run", bad]);
        assert_eq!(o.status.code(), Some(1), "{bad:?}");
        assert!(stderr(&o).contains("invalid run name"), "{}", stderr(&o));
    }
    assert_eq!(snapshot(&store), before);
}

#[test]
fn reingesting_a_stored_file_is_a_no_op_and_replace_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t = generate(dir.path(), "t.json", 300_000, 3);
    assert!(
        gpuq(&store, &["ingest", "-q", t.to_str().unwrap(), "--run", "r"])
            .status
            .success()
    );
    let before = snapshot(&store);
    let o = gpuq(&store, &["ingest", t.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success());
    assert!(
        stdout(&o).contains("already stored in run r"),
        "{}",
        stdout(&o)
    );
    assert_eq!(snapshot(&store).len(), before.len());
    let count = |s: &Path| {
        stdout(&gpuq(
            s,
            &[
                "query",
                "--format",
                "csv",
                "SELECT count(*) AS n FROM events",
            ],
        ))
    };
    let n = count(&store);
    let o = gpuq(
        &store,
        &[
            "ingest",
            "-q",
            t.to_str().unwrap(),
            "--run",
            "r",
            "--replace",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(count(&store), n);
    let o = gpuq(&store, &["runs", "tag", "r", "branch=main"]);
    assert!(o.status.success());
    let o = gpuq(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT tags['branch'] AS b FROM runs",
        ],
    );
    assert_eq!(stdout(&o), "b\nmain\n");
    assert!(gpuq(&store, &["runs", "rm", "r"]).status.success());
    assert_eq!(count(&store), "n\n0\n");
    assert_eq!(gpuq(&store, &["runs", "rm", "r"]).status.code(), Some(1));
}

#[test]
fn killing_an_ingest_midway_leaves_a_consistent_store_without_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let small = generate(dir.path(), "small.json", 200_000, 4);
    assert!(gpuq(
        &store,
        &["ingest", "-q", small.to_str().unwrap(), "--run", "kept"]
    )
    .status
    .success());
    let big = generate(dir.path(), "big.json", 60_000_000, 5);
    let expected = stdout(&gpuq(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT run, count(*) FROM events GROUP BY run",
        ],
    ));
    // Kill at several points: while parsing, while writing Parquet, around the commit.
    let mut rng = 0x9E3779B97F4A7C15u64;
    let mut completed_once = false;
    for _ in 0..6 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_millis(50 + rng % 1500);
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
            .arg("--store")
            .arg(&store)
            .args(["ingest", "-q", big.to_str().unwrap(), "--run", "killed"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().unwrap();
        let runs = stdout(&gpuq(
            &store,
            &[
                "query",
                "--format",
                "csv",
                "SELECT run, count(*) FROM events GROUP BY run",
            ],
        ));
        if status.success() {
            // It finished before the kill: the run is complete, remove it and go on.
            assert!(runs.contains("killed"));
            assert!(gpuq(&store, &["runs", "rm", "killed"]).status.success());
            completed_once = true;
            continue;
        }
        assert_eq!(runs, expected, "after a kill at {delay:?}");
    }
    // The next writer cleans up whatever the killed ones left.
    assert!(gpuq(&store, &["runs", "tag", "kept", "checked=yes"])
        .status
        .success());
    let staging = std::fs::read_dir(store.join("_staging"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(staging, 0);
    // Files of a completed-then-removed run stay for a grace period; otherwise nothing remains.
    assert!(completed_once || !store.join("events/run=killed").exists());
}

/// The export is hashed on a thread of its own while it is parsed; that hash must be the
/// whole file's, or a second ingest of the same export would not be recognised.
#[test]
fn reingesting_a_stored_nsys_export_is_a_no_op() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_nsys_run(dir.path());
    let nsys = dir.path().join("r.sqlite");
    let before = snapshot(&store);
    let o = gpuq(&store, &["ingest", nsys.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("already stored in run r"),
        "{}",
        stdout(&o)
    );
    assert_eq!(snapshot(&store), before);
    // A copy with one byte more is a different file: it is ingested.
    let grown = dir.path().join("grown.sqlite");
    let mut bytes = std::fs::read(&nsys).unwrap();
    bytes.push(0);
    std::fs::write(&grown, bytes).unwrap();
    let o = gpuq(
        &store,
        &["ingest", "-q", grown.to_str().unwrap(), "--run", "grown"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = stdout(&gpuq(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT run FROM runs ORDER BY run",
        ],
    ));
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        ["run", "grown", "r"],
        "{runs}"
    );
}

#[test]
fn nsys_rocprof_and_stage_logs_are_detected_by_content_and_land_in_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // Names that say nothing: detection is by content.
    let nsys = dir.path().join("capture.bin");
    generate_nsys(&nsys);
    let o = gpuq(
        &store,
        &["ingest", "-q", nsys.to_str().unwrap(), "--run", "h100"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rocprof = repo_file("ingest/fixtures/rocprof/modern");
    let o = gpuq(
        &store,
        &["ingest", "-q", rocprof.to_str().unwrap(), "--run", "mi300"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // A stage log on the epoch clock cannot go into a run on its trace's own clock (the
    // rocprof fixture's, without a UTC start): refused, the run unchanged. One as a run of its
    // own is fine.
    let log = repo_file("ingest/fixtures/stagelog/python_snippet.log");
    let o = gpuq(
        &store,
        &["ingest", "-q", log.to_str().unwrap(), "--run", "mi300"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("python_snippet.log") && stderr(&o).contains("cannot be placed"),
        "{}",
        stderr(&o)
    );
    let own = dir.path().join("train.log");
    std::fs::write(
        &own,
        "{\"ts\": \"2026-12-02T10:00:00Z\", \"stage\": \"load\", \"event\": \"begin\"}\n\
         {\"ts\": \"2026-12-02T10:00:02.5Z\", \"stage\": \"load\", \"event\": \"end\"}\n\
         2026-12-02 10:00:02,600 INFO train: stage=train begin\n\
         2026-12-02 10:00:09,600 INFO train: stage=train end\n",
    )
    .unwrap();
    let o = gpuq(
        &store,
        &["ingest", "-q", own.to_str().unwrap(), "--run", "stages"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let formats = query_csv(&store, "SELECT run, format FROM runs ORDER BY run");
    assert_eq!(
        formats,
        "run,format\nh100,nsys\nmi300,rocprofv3\nstages,stagelog\n"
    );
    // One query over all formats.
    let kernels = query_csv(
        &store,
        "SELECT run, count(*) > 0 AS any FROM kernels GROUP BY run ORDER BY run",
    );
    assert_eq!(kernels, "run,any\nh100,true\nmi300,true\n");
    let stages = query_csv(
        &store,
        "SELECT name, count(*) AS n FROM annotations WHERE run = 'stages' AND scope = 'stage' \
         GROUP BY name ORDER BY name",
    );
    assert_eq!(stages, "name,n\nload,1\ntrain,1\n");
    let durs = query_csv(
        &store,
        "SELECT name, ts, dur FROM annotations WHERE run = 'stages' ORDER BY ts",
    );
    assert_eq!(
        durs,
        "name,ts,dur\nload,1796205600000000000,2500000000\ntrain,1796205602600000000,7000000000\n"
    );
    let refused = query_csv(
        &store,
        "SELECT count(*) AS n FROM annotations WHERE run = 'mi300' AND scope = 'stage'",
    );
    assert_eq!(refused, "n\n0\n");
}

#[test]
fn bad_input_of_every_format_is_rejected_and_leaves_the_store_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let nsys = dir.path().join("good.sqlite");
    generate_nsys(&nsys);
    assert!(gpuq(&store, &["ingest", "-q", nsys.to_str().unwrap()])
        .status
        .success());
    let sqlite = std::fs::read(&nsys).unwrap();
    let other_db = dir.path().join("other.sqlite");
    {
        let c = rusqlite::Connection::open(&other_db).unwrap();
        c.execute_batch("CREATE TABLE t(a INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
    }
    // An export whose last kernel row is damaged: GPU rows are attributed and written in
    // parts while they are read, so parts exist on disk when the damaged row is reached.
    let damaged = dir.path().join("damaged-src.sqlite");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(["generate", "--format", "nsys", "--kernels", "400000"])
        .arg(&damaged)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    {
        let c = rusqlite::Connection::open(&damaged).unwrap();
        c.execute_batch(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = 'x' \
             WHERE rowid = (SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL);",
        )
        .unwrap();
    }
    let cases: Vec<(&str, Vec<u8>, &str, &[&str])> = vec![
        (
            "damaged.sqlite",
            std::fs::read(&damaged).unwrap(),
            "CUPTI_ACTIVITY_KIND_KERNEL",
            &[],
        ),
        (
            "truncated.sqlite",
            sqlite[..sqlite.len() / 3].to_vec(),
            "",
            &[],
        ),
        (
            "other.sqlite",
            std::fs::read(&other_db).unwrap(),
            "not an Nsight Systems export",
            &[],
        ),
        (
            "1_kernel_trace.csv",
            b"\"Kind\",\"Agent_Id\",\"Queue_Id\",\"Kernel_Name\",\"Correlation_Id\",\"Start_Timestamp\"\n\
              \"KERNEL_DISPATCH\",\"Agent 1\",1,\"k\",1,100\n"
                .to_vec(),
            "End_Timestamp",
            &[],
        ),
        (
            "stages.log",
            b"2026-12-02T10:00:00Z stage=load begin\n2026-12-02T10:00:01Z stage=load end\n\
              garbage that is no log line\n"
                .to_vec(),
            "line 3",
            &[],
        ),
        (
            "prose.txt",
            b"hello world\nthis is not a trace\n".to_vec(),
            "tried: Kineto",
            &[],
        ),
        (
            "forced.json",
            br#"{"traceEvents": []}"#.to_vec(),
            "not nsys",
            &["--format", "nsys"],
        ),
    ];
    let before = snapshot(&store);
    for (name, bytes, needle, extra) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let mut args = vec!["ingest", path.to_str().unwrap(), "--run", "bad"];
        args.extend_from_slice(extra);
        let o = gpuq(&store, &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(name),
            "{name}: error does not name the file: {err}"
        );
        assert!(err.contains(needle), "{name}: {err}");
        assert!(!said_twice(&err, &path), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert_eq!(snapshot(&store), before, "{name} changed the store");
    }
    // --lenient skips and counts the bad log line.
    let log = dir.path().join("stages.log");
    let o = gpuq(
        &store,
        &[
            "ingest",
            "-q",
            "--lenient",
            log.to_str().unwrap(),
            "--run",
            "lenient",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let w = query_csv(
        &store,
        "SELECT warning_details FROM runs WHERE run = 'lenient'",
    );
    assert!(w.contains("unparsable lines skipped"), "{w}");
    let n = query_csv(
        &store,
        "SELECT count(*) AS n FROM annotations WHERE run = 'lenient'",
    );
    assert_eq!(n, "n\n1\n");
}

#[test]
fn a_stage_log_with_naive_times_asks_for_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let log = dir.path().join("stages.jsonl");
    std::fs::write(
        &log,
        "{\"ts\": \"2026-12-02T10:00:00\", \"stage\": \"load\", \"event\": \"begin\"}\n\
         {\"ts\": \"2026-12-02T10:00:05\", \"stage\": \"load\", \"event\": \"end\"}\n",
    )
    .unwrap();
    let o = gpuq(&store, &["ingest", log.to_str().unwrap(), "--run", "s"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("stages.jsonl")
            && err.contains("line 1")
            && err.contains("a UTC offset is needed")
            && err.contains("--tz"),
        "{err}"
    );
    assert!(!err.contains("unrecognised format"), "{err}");
    let runs = gpuq(&store, &["runs", "--format", "csv"]);
    assert!(
        !stdout(&runs).lines().any(|l| l.starts_with("s,")),
        "{}",
        stdout(&runs)
    );
    // With the zone the log was written in, the same log is stored on the UTC epoch clock:
    // 10:00 in Berlin in December is 09:00Z.
    let out = ok(
        &store,
        &[
            "ingest",
            log.to_str().unwrap(),
            "--run",
            "s",
            "--tz",
            "Europe/Berlin",
        ],
    );
    assert!(out.contains("1 event"), "{out}");
    let rows = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT name, ts, dur FROM events WHERE run = 's'",
        ],
    );
    assert_eq!(rows, "name,ts,dur\nload,1796202000000000000,5000000000\n");
    let o = gpuq(
        &store,
        &[
            "ingest",
            log.to_str().unwrap(),
            "--run",
            "t",
            "--tz",
            "Berlin",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("IANA time zone"), "{}", stderr(&o));
}

/// The Trace Event Format's JSON Array Format (a bare array of events, PyTorch 1.x's
/// `export_chrome_trace`) is detected by content and stored like the object form; `--format
/// kineto` reads a file that detection does not recognise.
#[test]
fn a_bare_array_of_events_is_a_kineto_trace() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let object = dir.path().join("object.json");
    kineto_with_kernels(&object, &["k_a", "k_b"]);
    let text = std::fs::read_to_string(&object).unwrap();
    let inner = &text[text.find('[').unwrap()..=text.rfind(']').unwrap()];
    let array = dir.path().join("array.json");
    std::fs::write(&array, inner).unwrap();
    // Unterminated, as a trace written while running and never closed.
    let open = dir.path().join("open.json");
    std::fs::write(&open, format!("{},\n", inner.trim_end_matches(']'))).unwrap();
    for (run, file) in [("obj", &object), ("arr", &array), ("open", &open)] {
        let o = gpuq(&store, &["ingest", file.to_str().unwrap(), "--run", run]);
        assert!(o.status.success(), "{run}: {}", stderr(&o));
    }
    let rows = |run: &str| {
        query_csv(
            &store,
            &format!(
                "SELECT name, ts, dur, device, stream FROM kernels WHERE run = '{run}' ORDER BY ts"
            ),
        )
    };
    assert_eq!(rows("arr"), rows("obj"));
    assert_eq!(rows("open"), rows("obj"));
    assert_eq!(rows("obj").lines().count(), 3);

    // Detection does not take `[1, 2]` for a trace; forcing Kineto reads it and says why it
    // is not one, naming the file, and the store is unchanged.
    let odd = dir.path().join("odd.json");
    std::fs::write(&odd, "[1, 2]").unwrap();
    let before = snapshot(&store);
    let o = gpuq(&store, &["ingest", odd.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unrecognised format"), "{}", stderr(&o));
    let o = gpuq(
        &store,
        &["ingest", "--format", "kineto", odd.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("odd.json") && err.contains("expected an event object"),
        "{err}"
    );
    assert_eq!(snapshot(&store), before);
}

/// A process that sees one GPU lists it as device 0 in `deviceProperties` while its events say
/// device 5 (`CUDA_VISIBLE_DEVICES=5`): the GPU is still named.
#[test]
fn renumbered_visible_devices_keep_their_gpu_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = dir.path().join("rank5.json");
    std::fs::write(
        &trace,
        r#"{"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9}],
  "traceEvents": [
  {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 5, "tid": 7, "ts": 100, "dur": 10, "args": {"device": 5, "stream": 7}}
]}"#,
    )
    .unwrap();
    let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        query_csv(
            &store,
            "SELECT gpus, json_get_int(devices, 0, 'id') AS id, warnings FROM runs"
        ),
        "gpus,id,warnings\n1x NVIDIA H100 80GB HBM3,5,0\n"
    );
}

/// A rocprofv3 output directory is one source of several CSV files; the report counts them.
#[test]
fn a_rocprof_output_reports_its_csv_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let rocprof = repo_file("ingest/fixtures/rocprof/modern");
    let csvs = std::fs::read_dir(&rocprof).unwrap().count();
    assert!(csvs > 1);
    let o = gpuq(
        &store,
        &["ingest", rocprof.to_str().unwrap(), "--run", "mi300"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("stored as run mi300: {csvs} file(s)")),
        "{}",
        stdout(&o)
    );
}
