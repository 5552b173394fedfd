//! The real `gpuq` binary, run in temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{generate_nsys, gpuq, ok, query_csv, repo_file, stderr, stdout};

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

fn generate(dir: &Path, name: &str, bytes: u64, seed: u64) -> PathBuf {
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
fn bad_sql_fails_with_one_readable_line() {
    let dir = tempfile::tempdir().unwrap();
    for sql in [
        "SELEC 1",
        "SELECT * FROM no_such_table",
        "SELECT no_col FROM kernels",
    ] {
        let o = gpuq(dir.path(), &["query", sql]);
        assert_eq!(o.status.code(), Some(1), "{sql}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("gpuq: error: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
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

/// Drives `gpuq sql` through a pseudo-terminal (util-linux `script`) as a user would.
#[test]
fn the_repl_works_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!(
            "SKIPPED: util-linux `script` is not installed; the terminal REPL test did not run"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t = generate(dir.path(), "t.json", 300_000, 6);
    assert!(
        gpuq(&store, &["ingest", "-q", t.to_str().unwrap(), "--run", "r"])
            .status
            .success()
    );
    let cmd = format!(
        "{} --store {} sql",
        env!("CARGO_BIN_EXE_gpuq"),
        store.display()
    );
    // The expected counts, known before the session starts.
    let count = |sql: &str| {
        let out = stdout(&gpuq(&store, &["query", "--format", "csv", sql]));
        out.lines().nth(1).unwrap().to_string()
    };
    let n = count("SELECT count(*) AS n FROM kernels");
    let m = count("SELECT count(*) AS n FROM memcpy");
    let mut child = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The terminal's output as it comes, so that keys can wait for what they answer: a Ctrl-C
    // typed while the shell is still busy with earlier lines would reach it as input, not as a
    // signal to the statement it is meant to cancel.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let reader = {
        let seen = seen.clone();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(k) = out.read(&mut buf) {
                if k == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buf[..k]);
            }
        })
    };
    let text_now = || strip_ansi(&String::from_utf8_lossy(&seen.lock().unwrap())).replace('\r', "");
    let mut send = |keys: &[u8], answer: Option<&str>| {
        use std::io::Write;
        let before = answer.map_or(0, |a| text_now().matches(a).count());
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
        let Some(answer) = answer else {
            std::thread::sleep(Duration::from_millis(400));
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while text_now().matches(answer).count() <= before {
            if std::time::Instant::now() > deadline {
                let _ = Command::new("pkill").args(["-f", &cmd]).status();
                panic!(
                    "no {answer:?} after {:?}: {}",
                    String::from_utf8_lossy(keys),
                    text_now()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    send(b"SELECT count(*)\r", None); // multi-line: not complete yet
    send(b"  AS n FROM kernels;\r", Some(&format!("| {n} ")));
    send(b"\\timing on\r", None);
    send(b"\\format csv\r", None);
    send(b"SELECT 40 + 2 AS answer;\r", Some("answer\n42"));
    send(b"SELEC broken;\r", Some("gpuq: error: ")); // an error keeps the session
    send(b"\\d kernels\r", Some("column_name"));
    // Completion of a table name (`ker` is ambiguous: kernel_class).
    send(
        b"SELECT count(*) AS c FROM memc\t;\r",
        Some(&format!("c\n{m}")),
    );
    send(b"SELECT 'still here' AS s;\r", Some("s\nstill here"));
    send(b"\x03", None); // Ctrl-C at the prompt keeps the session
    send(
        b"SELECT count(*) FROM generate_series(1, 100000000000);\r",
        None,
    );
    std::thread::sleep(Duration::from_secs(1));
    send(b"\x03", Some("cancelled")); // Ctrl-C cancels the running statement
    send(b"SELECT 7 AS after_ctrl_c;\r", Some("after_ctrl_c\n7"));
    send(b"\\q\r", None);
    drop(send);
    drop(stdin);
    child.wait().unwrap();
    reader.join().unwrap();
    let text = text_now();
    assert!(
        text.contains(&format!("| {n} ")),
        "multi-line statement result missing: {text}"
    );
    assert!(text.contains("answer\n42"), "{text}");
    assert!(text.contains("gpuq: error: "), "{text}");
    assert!(text.contains("column_name"), "{text}");
    assert!(
        text.contains(&format!("c\n{m}")),
        "completion did not produce a runnable query: {text}"
    );
    assert!(text.contains("still here"), "{text}");
    assert!(text.contains("after_ctrl_c\n7"), "{text}");
    assert!(text.contains("cancelled"), "{text}");
    assert!(text.contains("row(s) in"), "timing missing: {text}");
    // History persists across sessions.
    let history = std::fs::read_to_string(store.join("_history")).unwrap();
    assert!(history.contains("SELECT 40 + 2 AS answer;"), "{history}");
}

/// Removes terminal escape sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn the_repl_runs_statements_from_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(dir.path())
        .args(["sql", "--format", "csv"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(
                b"SELECT 1 AS a;\n\\format json\nSELECT 2\n  AS b;\n\\format table\n\\maxrows 2\n\
                  SELECT column1 AS v FROM (VALUES (11), (12), (13));\n",
            )
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("a\n1\n[{\"b\":2}]\n"), "{text}");
    assert!(
        text.contains("| 11 ") && text.contains("| 12 ") && !text.contains("| 13 "),
        "{text}"
    );
    assert!(text.contains("3 rows, the first 2 shown"), "{text}");
}

#[test]
fn demo_runs_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let o = gpuq(dir.path(), &["demo", "--steps", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("stored as run demo"), "{out}");
    assert!(out.contains("Top kernels"), "{out}");
    assert!(out.contains("aten::"), "{out}");
    assert!(
        out.contains("Where the GPU time went") && out.contains("idle_pct"),
        "{out}"
    );
    assert!(out.contains("Findings"), "{out}");
    assert!(
        out.contains("gpuq diff demo demo-pr") && out.contains("step_time"),
        "{out}"
    );
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

/// A store under `dir` holding the small generated Nsight Systems export as run `r`.
fn store_with_nsys_run(dir: &Path) -> PathBuf {
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
fn top_lists_a_runs_kernels_by_time_and_rejects_unknown_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_nsys_run(dir.path());
    let o = gpuq(&store, &["top", "r", "-n", "3", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "name,time_pct,total,instances,avg,med,min,max,stddev,class,top_op,busy_pct"
    );
    assert_eq!(lines.len(), 4, "{out}");
    // Totals are in descending order and equal a plain SQL sum.
    let top = query_csv(
        &store,
        "SELECT sum(dur) AS t FROM kernels GROUP BY name ORDER BY t DESC LIMIT 1",
    );
    let total = top.lines().nth(1).unwrap();
    let first = lines[1].to_string();
    assert!(first.contains(&format!(",{total},")), "{first} vs {total}");
    let o = gpuq(&store, &["top", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown run nope"), "{}", stderr(&o));
}

#[test]
fn analysis_commands_agree_with_their_sql_and_reject_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_nsys_run(dir.path());
    let run = |args: &[&str]| {
        let o = gpuq(&store, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let rows = |csv: &str| csv.lines().skip(1).map(str::to_string).collect::<Vec<_>>();

    // gaps: CSV rows are the table function's rows, longest first, and --min-gap filters.
    let all = rows(&run(&["gaps", "r", "--format", "csv"]));
    let n = query_csv(&store, "SELECT count(*) FROM gpu_gaps('r')");
    assert_eq!(n.lines().nth(1).unwrap(), all.len().to_string());
    assert!(!all.is_empty());
    let durs: Vec<i64> = all
        .iter()
        .map(|l| l.split(',').nth(5).unwrap().parse().unwrap())
        .collect();
    assert!(durs.windows(2).all(|w| w[0] >= w[1]), "not longest first");
    let long = rows(&run(&["gaps", "r", "--min-gap", "50us", "--format", "csv"]));
    let expected = durs.iter().filter(|&&d| d > 50_000).count();
    assert_eq!(long.len(), expected);
    let table = run(&["gaps", "r"]);
    assert!(
        table.contains("pct_of_idle") && table.contains("next_name"),
        "{table}"
    );
    let streams = run(&["gaps", "r", "--per-stream", "--format", "csv", "-n", "5"]);
    assert!(
        streams.starts_with("run,rank,pid,device,stream,"),
        "{streams}"
    );
    assert_eq!(rows(&streams).len(), 5);

    // breakdown: busy + idle = span and the parts of busy add up, on every device.
    let b = run(&["breakdown", "r", "--format", "csv"]);
    let header: Vec<&str> = b.lines().next().unwrap().split(',').collect();
    let col = |row: &[&str], name: &str| -> i64 {
        row[header.iter().position(|h| *h == name).unwrap()]
            .parse()
            .unwrap()
    };
    let devices = rows(&b);
    assert!(!devices.is_empty());
    for line in &devices {
        let row: Vec<&str> = line.split(',').collect();
        assert_eq!(
            col(&row, "busy") + col(&row, "idle"),
            col(&row, "span"),
            "{line}"
        );
        assert_eq!(
            col(&row, "compute")
                + col(&row, "comm_exposed")
                + col(&row, "memcpy_exposed")
                + col(&row, "memset_exposed"),
            col(&row, "busy"),
            "{line}"
        );
    }
    // util: chunks per device, as asked.
    let util = rows(&run(&["util", "r", "--chunks", "10", "--format", "csv"]));
    assert_eq!(util.len(), 10 * devices.len());
    assert!(run(&["stages", "r"]).contains("gpu_busy"));
    let findings = run(&["findings", "r"]);
    assert!(
        findings.starts_with("1. [") || findings.starts_with("No findings"),
        "{findings}"
    );

    for args in [
        &["gaps", "nope"][..],
        &["breakdown", "nope"],
        &["util", "nope"],
        &["stages", "nope"],
        &["findings", "nope"],
    ] {
        let o = gpuq(&store, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).contains("unknown run nope"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = gpuq(&store, &["gaps", "r", "--min-gap", "soon"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("soon"), "{}", stderr(&o));
    let o = gpuq(&store, &["util", "r", "--chunks", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("chunks"), "{}", stderr(&o));
}

/// Generates a 12-step demo trace: `repeat` varies kernel durations by ±5 %, `scale` slows
/// the forward FC1 GEMM (`gemm_relu`) down; then ingests it as `run` with `tags`.
fn ingest_repeat(
    dir: &Path,
    store: &Path,
    run: &str,
    repeat: u64,
    scale: Option<u32>,
    tags: &[&str],
) {
    let path = dir.join(format!("{run}.json"));
    let mut args = vec![
        "generate".to_string(),
        path.to_str().unwrap().to_string(),
        "--steps".into(),
        "12".into(),
        "--steady".into(),
        "--jitter".into(),
        "5".into(),
        "--repeat".into(),
        repeat.to_string(),
    ];
    if let Some(s) = scale {
        args.extend(["--scale-kernel".to_string(), format!("gemm_relu={s}")]);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(&args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut args = vec!["ingest", "-q", path.to_str().unwrap(), "--run", run];
    for t in tags {
        args.extend(["--tag", t]);
    }
    let o = gpuq(store, &args);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn diff_check_and_trend_find_an_injected_regression_and_pass_noise() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    ingest_repeat(
        dir.path(),
        &store,
        "main-1",
        1,
        None,
        &["branch=main", "i=1"],
    );
    ingest_repeat(
        dir.path(),
        &store,
        "main-2",
        2,
        None,
        &["branch=main", "i=2"],
    );
    ingest_repeat(
        dir.path(),
        &store,
        "pr-noise",
        3,
        None,
        &["branch=pr", "i=3"],
    );
    ingest_repeat(
        dir.path(),
        &store,
        "pr-slow",
        4,
        Some(300),
        &["branch=pr", "i=4"],
    );
    let main = "tags['branch'] = 'main'";

    // The gate fails on the slowed run, naming the kernel as evidence...
    let o = gpuq(
        &store,
        &[
            "check",
            "--baseline",
            main,
            "--candidate",
            "pr-slow",
            "--max-regression",
            "3%",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("FAIL") && out.contains("kernel_time"), "{out}");
    assert!(out.contains("gemm_relu"), "{out}");
    // ...passes the run that differs only by noise...
    let o = gpuq(
        &store,
        &["check", "--baseline", main, "--candidate", "pr-noise"],
    );
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    // ...says the same as JSON for CI tooling...
    let o = gpuq(
        &store,
        &[
            "check",
            "--baseline",
            main,
            "--candidate",
            "pr-slow",
            "--format",
            "json",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["pass"], false);
    assert_eq!(
        v["baseline"]["runs"],
        serde_json::json!(["main-1", "main-2"])
    );
    let kt = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "kernel_time")
        .unwrap();
    assert_eq!(kt["regression"], true);
    assert!(kt["change_pct"].as_f64().unwrap() > 3.0);
    // ...and exits 2 when it cannot run at all.
    let o = gpuq(
        &store,
        &["check", "--baseline", main, "--candidate", "no-such-run"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown run no-such-run"),
        "{}",
        stderr(&o)
    );
    let o = gpuq(
        &store,
        &[
            "check",
            "--baseline",
            main,
            "--candidate",
            "pr-slow",
            "--metrics",
            "bogus",
        ],
    );
    assert_eq!(o.status.code(), Some(2));

    // diff: the summary, then the kernel that changed.
    let o = gpuq(&store, &["diff", "main-1", "pr-slow"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("step_time") && out.contains("gemm_relu") && out.contains("slower"),
        "{out}"
    );
    let o = gpuq(
        &store,
        &[
            "diff", "main-1", "pr-slow", "--level", "class", "--format", "csv",
        ],
    );
    let out = stdout(&o);
    let gemm = out
        .lines()
        .find(|l| l.contains(",gemm,"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(gemm.ends_with(",slower"), "{gemm}");
    let o = gpuq(&store, &["diff", "main-1", "pr-slow", "--level", "nope"]);
    assert!(!o.status.success() && stderr(&o).contains("unknown level"));

    // trend ordered by a tag: the slowed run is the last point and the largest value.
    let o = gpuq(
        &store,
        &[
            "trend",
            "--metric",
            "kernel_time",
            "--by",
            "i",
            "--format",
            "csv",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let runs: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap())
        .collect();
    assert_eq!(runs, ["main-1", "main-2", "pr-noise", "pr-slow"]);
    let o = gpuq(&store, &["trend", "--metric", "kernel_time", "--by", "i"]);
    let out = stdout(&o);
    assert!(
        out.contains("4 run(s)") && out.lines().last().unwrap().ends_with("without steps)"),
        "{out}"
    );
    assert!(out.contains('█'), "{out}");

    // repeatability over the three unshifted runs.
    let o = gpuq(
        &store,
        &["repeat", "--where", "run <> 'pr-slow'", "--top", "5"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("top_5_kendall_tau"), "{}", stdout(&o));

    // Removing by selector: all or nothing, and only with --yes for several runs.
    let pr = "tags['branch'] = 'pr'";
    let o = gpuq(&store, &["runs", "rm", pr]);
    assert!(
        !o.status.success() && stderr(&o).contains("add --yes"),
        "{}",
        stderr(&o)
    );
    let o = gpuq(&store, &["runs", "rm", pr, "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("removed run pr-noise") && stdout(&o).contains("removed run pr-slow")
    );
    let left = query_csv(&store, "SELECT run FROM runs ORDER BY run");
    assert_eq!(left, "run\nmain-1\nmain-2\n");
    let o = gpuq(&store, &["compact"]);
    assert!(
        o.status.success() && stdout(&o).contains("compacted 2 run(s)"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn analysis_commands_take_a_step_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = dir.path().join("steps.json");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            trace.to_str().unwrap(),
            "--steps",
            "6",
            "--seed",
            "3",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let steps = query_csv(&store, "SELECT min(step), max(step) FROM step_stats('r')");
    let (first, last): (i64, i64) = {
        let row = steps.lines().nth(1).unwrap();
        let (a, b) = row.split_once(',').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    assert!(last - first >= 2, "{steps}");
    let range = format!("{}..{}", first + 1, first + 2);
    for command in [
        "top",
        "gaps",
        "util",
        "breakdown",
        "roofline",
        "stages",
        "findings",
    ] {
        let o = gpuq(
            &store,
            &[command, "r", "--steps", &range, "--format", "csv"],
        );
        assert!(o.status.success(), "{command}: {}", stderr(&o));
    }
    // The command prints what the table function returns for the range.
    let o = gpuq(&store, &["top", "r", "--steps", &range, "--format", "csv"]);
    let want = query_csv(
        &store,
        &format!("SELECT * FROM top_kernels('r', NULL, '{range}')"),
    );
    assert_eq!(stdout(&o), want);
    let whole = query_csv(&store, "SELECT * FROM top_kernels('r')");
    assert_ne!(want, whole);
    let o = gpuq(
        &store,
        &["stages", "r", "--steps", &range, "--format", "csv"],
    );
    let per_step = stdout(&o);
    let step_rows = per_step
        .lines()
        .filter(|l| {
            l.starts_with("r,")
                && l.split(',')
                    .nth(2)
                    .is_some_and(|s| s.parse::<i64>().is_ok())
        })
        .count();
    assert_eq!(step_rows, 2, "{per_step}");

    // A range without a step of the run, and a range that is not one.
    let o = gpuq(&store, &["breakdown", "r", "--steps", "900"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!(
            "no step of run r is in the range 900 (its steps: {first}..{last})"
        )),
        "{}",
        stderr(&o)
    );
    let o = gpuq(&store, &["findings", "r", "--steps", "5..3"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is empty"), "{}", stderr(&o));
}

#[test]
fn roofline_explains_an_empty_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = dir.path().join("noshapes.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 11, "ts": 100, "dur": 50},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 110, "dur": 5, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120, "dur": 40, "args": {"device": 0, "stream": 7, "correlation": 1}}
]}"#,
    )
    .unwrap();
    let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gpuq(&store, &["roofline", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "header only: {}", stdout(&o));
    assert!(
        stderr(&o).contains("note: roofline is empty: the trace has no input shapes")
            && stderr(&o).contains("record_shapes=True"),
        "{}",
        stderr(&o)
    );
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

/// A Kineto trace with one kernel of each name given, 10 µs each, one after another.
fn kineto_with_kernels(path: &Path, names: &[&str]) {
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

/// `--classes FILE`, else `<store>/kernel_classes.txt`, put the user's rules before the
/// built-in ones in `kernel_class()` and in the analyses; a bad rules file fails with its line.
#[test]
fn user_kernel_class_rules_apply_to_sql_and_analyses() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = dir.path().join("t.json");
    kineto_with_kernels(&trace, &["my_ring_exchange", "triton_poi_fused_add_0"]);
    let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sql = "SELECT name, kernel_class(name) AS c FROM kernels ORDER BY name";
    assert_eq!(
        query_csv(&store, sql),
        "name,c\nmy_ring_exchange,other\ntriton_poi_fused_add_0,elementwise\n"
    );
    let rules = dir.path().join("rules.txt");
    std::fs::write(
        &rules,
        "# ours\ncommunication = ^my_ring_\nfused_add = fused_add\n",
    )
    .unwrap();
    let with_rules = |args: &[&str]| {
        let mut all = vec!["--classes", rules.to_str().unwrap()];
        all.extend_from_slice(args);
        gpuq(&store, &all)
    };
    let o = with_rules(&["query", "--format", "csv", sql]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "name,c\nmy_ring_exchange,communication\ntriton_poi_fused_add_0,fused_add\n"
    );
    // The analyses classify with the same rules: `top`'s class, `breakdown`'s communication.
    let o = with_rules(&["top", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(",communication,"), "{}", stdout(&o));
    let comm = |o: &Output| {
        let out = stdout(o);
        let header: Vec<&str> = out.lines().next().unwrap().split(',').collect();
        let col = header
            .iter()
            .position(|h| *h == "comm")
            .expect("comm column");
        out.lines()
            .nth(1)
            .unwrap()
            .split(',')
            .nth(col)
            .unwrap()
            .to_string()
    };
    let plain = gpuq(&store, &["breakdown", "r", "--format", "csv"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(comm(&plain), "0");
    assert_eq!(
        comm(&with_rules(&["breakdown", "r", "--format", "csv"])),
        "10000"
    );

    // The store's rules file applies without the flag.
    std::fs::copy(&rules, store.join("kernel_classes.txt")).unwrap();
    assert!(query_csv(&store, sql).contains("my_ring_exchange,communication"));

    // A bad rules file: an error with the file and line, exit 1, nothing run.
    std::fs::write(&rules, "gemm = ok\ngemm = (unclosed\n").unwrap();
    let o = with_rules(&["query", sql]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("rules.txt") && err.contains("line 2"), "{err}");
    assert!(stdout(&o).is_empty());
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

/// Exposed unified-memory page migrations get prefetch advice, not "pin your memory"; exposed
/// ordinary copies still get it.
#[test]
fn unified_memory_migrations_are_not_advised_to_be_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let action = |run: &str, copy: &str| {
        let trace = dir.path().join(format!("{run}.json"));
        std::fs::write(
            &trace,
            format!(
                r#"{{"traceEvents": [
  {{"ph": "X", "cat": "gpu_memcpy", "name": "{copy}", "pid": 0, "tid": 7, "ts": 100, "dur": 200, "args": {{"device": 0, "stream": 7, "bytes": 1048576}}}},
  {{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 400, "dur": 10, "args": {{"device": 0, "stream": 7}}}}
]}}"#
            ),
        )
        .unwrap();
        let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", run]);
        assert!(o.status.success(), "{}", stderr(&o));
        let found = query_csv(
            &store,
            &format!("SELECT action FROM findings('{run}') WHERE category = 'exposed_memcpy'"),
        );
        assert_eq!(found.lines().count(), 2, "{found}");
        found
    };
    let um = action("um", "Memcpy Unified HtoD");
    assert!(
        um.contains("cudaMemPrefetchAsync") && !um.contains("pinned"),
        "{um}"
    );
    let plain = action("plain", "Memcpy HtoD (Pageable -> Device)");
    assert!(plain.contains("pinned"), "{plain}");
    assert_eq!(
        query_csv(&store, "SELECT run, copy_kind FROM memcpy ORDER BY run"),
        "run,copy_kind\nplain,HtoD\num,UM HtoD\n"
    );
}
