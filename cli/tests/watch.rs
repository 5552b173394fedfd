//! `gpuq watch` through the binary: cycles written into a directory while the watch runs
//! (whole, in slow pieces, gzip-compressed, and a bad file) appear in the run one whole
//! cycle at a time to a concurrent reader; after a SIGKILL and a restart the run equals the
//! same files ingested at once.

mod common;

use common::{gpuq, ok, query_csv, stderr, stdout};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A generated profiling cycle: two steps numbered from `first_step`, rank 0, the same seed
/// as every other cycle (one job).
fn generate_cycle(path: &Path, first_step: u32) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            path.to_str().unwrap(),
            "--steps",
            "2",
            "--rank",
            "0",
        ])
        .args(["--first-step", &first_step.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `gpuq watch DIR --run live ARGS...`, its standard output piped (not a terminal), its
/// lines sent to the returned channel.
fn spawn_watch(store: &Path, dir: &Path, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(store)
        .args(["watch", dir.to_str().unwrap(), "--run", "live"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    for stream in [
        Box::new(out) as Box<dyn std::io::Read + Send>,
        Box::new(err),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    (child, rx)
}

/// `gpuq watch DIR --run live --once ARGS...`, waited for.
fn watch_once(store: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["watch", dir.to_str().unwrap(), "--run", "live", "--once"];
    all.extend(args);
    gpuq(store, &all)
}

/// Waits for a line starting with `prefix` (up to 60 s); returns the lines seen until then.
fn wait_for(rx: &mpsc::Receiver<String>, prefix: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push(line.clone());
            if line.starts_with(prefix) {
                return;
            }
        }
    }
    panic!("no line starting with {prefix:?}; lines: {seen:#?}");
}

fn kernels(store: &Path, run: &str) -> (u64, i64) {
    let csv = query_csv(
        store,
        &format!(
            "SELECT count(*), coalesce(sum(dur), 0) FROM events \
             WHERE run = '{run}' AND kind = 'kernel'"
        ),
    );
    let row = csv.lines().nth(1).unwrap().to_string();
    let (n, sum) = row.split_once(',').unwrap();
    (n.parse().unwrap(), sum.parse().unwrap())
}

/// Every sum of a subset of `parts`.
fn subset_sums(parts: &[u64]) -> Vec<u64> {
    let mut sums = vec![0];
    for &p in parts {
        let more: Vec<u64> = sums.iter().map(|s| s + p).collect();
        sums.extend(more);
    }
    sums
}

fn write_slowly(path: &Path, bytes: &[u8], pieces: usize, pause: Duration) {
    let mut f = std::fs::File::create(path).unwrap();
    for piece in bytes.chunks(bytes.len().div_ceil(pieces)) {
        f.write_all(piece).unwrap();
        f.flush().unwrap();
        std::thread::sleep(pause);
    }
}

#[test]
fn cycles_appear_whole_while_written_and_a_restart_equals_one_ingest() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let staging = tmp.path().join("staging");
    let dir = tmp.path().join("traces");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    // The watch prints the paths it reads with the directory's symbolic links resolved.
    let dir = std::fs::canonicalize(dir).unwrap();
    // Five cycles of one job, as torch.profiler names them; the third compressed.
    let names = [
        "worker0.1001.pt.trace.json",
        "worker0.1002.pt.trace.json",
        "worker0.1003.pt.trace.json.gz",
        "worker0.1004.pt.trace.json",
        "worker0.1005.pt.trace.json",
    ];
    let cycles: Vec<PathBuf> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let path = staging.join(name);
            generate_cycle(&path, 2 * i as u32);
            path
        })
        .collect();

    // The reference: each cycle as a run of its own, and all of them at once.
    let reference = tmp.path().join("reference");
    let mut per_cycle = Vec::new();
    for (i, c) in cycles.iter().enumerate() {
        let run = format!("c{i}");
        ok(&reference, &["ingest", c.to_str().unwrap(), "--run", &run]);
        per_cycle.push(kernels(&reference, &run).0);
    }
    let mut at_once = vec!["ingest", "--run", "all", "--merge-unrelated"];
    at_once.extend(cycles.iter().map(|c| c.to_str().unwrap()));
    ok(&reference, &at_once);
    let whole_sums = subset_sums(&per_cycle);

    let (mut watch, rx) = spawn_watch(&store, &dir, &["--settle", "300ms"]);
    // A reader beside the watch: every count it sees is whole cycles, and never shrinks.
    let reading = AtomicBool::new(true);
    let seen_counts = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut counts = Vec::new();
            while reading.load(Ordering::SeqCst) {
                let o = gpuq(
                    &store,
                    &[
                        "query",
                        "--format",
                        "csv",
                        "SELECT count(*) FROM events WHERE run = 'live' AND kind = 'kernel'",
                    ],
                );
                // Before the first commit the run (or the store) does not exist yet.
                if o.status.success() {
                    if let Some(n) = stdout(&o).lines().nth(1).and_then(|l| l.parse().ok()) {
                        counts.push(n);
                    }
                }
                std::thread::sleep(Duration::from_millis(30));
            }
            counts
        });
        let mut lines = Vec::new();
        std::fs::copy(&cycles[0], dir.join(names[0])).unwrap();
        wait_for(
            &rx,
            &format!("stored {}", dir.join(names[0]).display()),
            &mut lines,
        );
        // Written in five pieces, each sooner than the settle time after the last.
        let bytes = std::fs::read(&cycles[1]).unwrap();
        write_slowly(&dir.join(names[1]), &bytes, 5, Duration::from_millis(100));
        // A bad file: reported with its position, skipped.
        let bad = gpuq_testkit::with_bad_timestamp(&std::fs::read(&cycles[3]).unwrap());
        std::fs::write(dir.join("worker0.1999.pt.trace.json"), &bad).unwrap();
        std::fs::copy(&cycles[2], dir.join(names[2])).unwrap();
        wait_for(
            &rx,
            &format!("stored {}", dir.join(names[2]).display()),
            &mut lines,
        );
        reading.store(false, Ordering::SeqCst);
        let counts: Vec<u64> = reader.join().unwrap();
        let all: String = lines.join("\n");
        // Each stored line says the highest step of its cycle (2 steps from 2 * i).
        assert!(all.contains("steps up to 1 "), "{all}");
        assert!(all.contains("steps up to 5 "), "{all}");
        assert!(
            all.contains(&format!("stored {}", dir.join(names[1]).display())),
            "{all}"
        );
        assert!(
            all.contains("failed ") && all.contains("worker0.1999.pt.trace.json: byte "),
            "{all}"
        );
        counts
    });
    // The reader saw the run grow (the count before and after at least one cycle).
    let mut distinct = seen_counts.clone();
    distinct.dedup();
    assert!(distinct.len() >= 2, "{seen_counts:?}");
    for pair in seen_counts.windows(2) {
        assert!(pair[0] <= pair[1], "the count shrank: {seen_counts:?}");
    }
    for n in &seen_counts {
        assert!(
            whole_sums.contains(n),
            "{n} is not whole cycles ({per_cycle:?})"
        );
    }
    assert_eq!(
        kernels(&store, "live").0,
        per_cycle[..3].iter().sum::<u64>()
    );

    // The last two cycles arrive and the watch is killed at once, perhaps in the middle of
    // an append; a restart with --once stores what is missing.
    std::fs::copy(&cycles[3], dir.join(names[3])).unwrap();
    std::fs::copy(&cycles[4], dir.join(names[4])).unwrap();
    std::thread::sleep(Duration::from_millis(350));
    watch.kill().unwrap();
    watch.wait().unwrap();
    let o = watch_once(&store, &dir, &["--settle", "100ms"]);
    // The bad file is still bad: --once fails, after storing the rest.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("worker0.1999.pt.trace.json: byte "),
        "{}",
        stderr(&o)
    );

    // The run equals the files ingested at once: counts, sums, steps and the analysis.
    assert_eq!(kernels(&store, "live"), kernels(&reference, "all"));
    let steps = |store: &Path, run: &str| {
        query_csv(
            store,
            &format!(
                "SELECT DISTINCT step FROM events WHERE run = '{run}' AND step IS NOT NULL \
                 ORDER BY step"
            ),
        )
    };
    let live_steps = steps(&store, "live");
    assert_eq!(live_steps, steps(&reference, "all"));
    assert_eq!(
        live_steps.lines().skip(1).collect::<Vec<_>>(),
        ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]
    );
    let top = |store: &Path, run: &str| ok(store, &["top", run, "--format", "csv"]);
    assert_eq!(top(&store, "live"), top(&reference, "all"));
}

#[test]
fn once_reports_incomplete_files_and_exits_zero_and_sigterm_stops_the_watch_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = tmp.path().join("traces");
    std::fs::create_dir_all(&dir).unwrap();
    let whole = tmp.path().join("rank-3.json");
    generate_cycle(&whole, 0);
    std::fs::copy(&whole, dir.join("rank-3.json")).unwrap();
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(dir.join("rank-4.json"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(dir.join(".rank-5.json.tmp"), &bytes[..10]).unwrap();
    let o = watch_once(
        &store,
        &dir,
        &[
            "--settle",
            "50ms",
            "--rank-from",
            "path",
            "--tag",
            "job=test",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("stored ") && out.contains("rank-3.json"),
        "{out}"
    );
    assert!(
        out.contains("incomplete ") && out.contains("rank-4.json"),
        "{out}"
    );
    assert!(!out.contains("rank-5"), "{out}");
    // The rank from the file name (the trace declares rank 0), the tag from --tag.
    let ranks = query_csv(
        &store,
        "SELECT DISTINCT rank FROM events WHERE run = 'live'",
    );
    assert_eq!(ranks, "rank\n3\n");
    let tags = query_csv(
        &store,
        "SELECT tags['job'] AS job FROM runs WHERE run = 'live'",
    );
    assert_eq!(tags, "job\ntest\n");

    // A running watch stops on SIGTERM with status 0 and its summary.
    let (child, rx) = spawn_watch(&store, &dir, &["--settle", "50ms"]);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signals a child process of this test.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let mut lines = Vec::new();
    wait_for(&rx, "watch: 0 stored, 1 already in the run", &mut lines);
}

#[test]
fn idle_exit_stops_a_watch_that_sees_no_new_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = tmp.path().join("traces");
    std::fs::create_dir_all(&dir).unwrap();
    generate_cycle(&dir.join("w.json"), 0);
    let started = Instant::now();
    let o = gpuq(
        &store,
        &[
            "watch",
            dir.to_str().unwrap(),
            "--run",
            "live",
            "--idle-exit",
            "1s",
            "--poll",
            "--settle",
            "50ms",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(stdout(&o).contains("watch: 1 stored"), "{}", stdout(&o));
}

/// The stages of `run` as `name,ts,dur` lines, in time order.
fn stage_rows(store: &Path, run: &str) -> Vec<String> {
    let csv = query_csv(
        store,
        &format!(
            "SELECT name, ts, dur FROM events WHERE run = '{run}' AND scope = 'stage' \
             ORDER BY ts, name"
        ),
    );
    csv.lines().skip(1).map(str::to_string).collect()
}

fn open_stages(store: &Path, run: &str) -> String {
    let csv = query_csv(
        store,
        &format!("SELECT coalesce(open_stages, 'none') FROM runs WHERE run = '{run}'"),
    );
    csv.lines().nth(1).unwrap_or_default().to_string()
}

#[test]
fn a_stage_log_is_followed_line_by_line_and_a_restart_reads_on() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let dir = std::fs::canonicalize({
        let d = tmp.path().join("traces");
        std::fs::create_dir_all(&d).unwrap();
        d
    })
    .unwrap();
    let log = dir.join("stages.log");
    let stored = format!("stored {}", log.display());
    let line = |s: u32, what: &str| format!("2026-12-02T10:00:{s:02}Z stage={what}\n");
    let mut writer = std::fs::File::create(&log).unwrap();
    let (mut watch, rx) = spawn_watch(&store, &dir, &["--settle", "100ms"]);
    let mut seen = Vec::new();
    let mut write = |text: &str| {
        writer.write_all(text.as_bytes()).unwrap();
        writer.flush().unwrap();
    };

    // A begin alone: no stage yet, one open.
    write(&line(0, "train begin rank=0"));
    wait_for(&rx, &stored, &mut seen);
    assert!(stage_rows(&store, "live").is_empty());
    let open = open_stages(&store, "live");
    assert!(open.contains("train") && open.contains("rank"), "{open}");

    // A step begins and ends (its end line written in two pieces): it appears once whole.
    write(&line(1, "step begin"));
    write("2026-12-02T10:00:03Z sta");
    std::thread::sleep(Duration::from_millis(400));
    write("ge=step end\n");
    wait_for(&rx, &stored, &mut seen);
    let rows = loop {
        let rows = stage_rows(&store, "live");
        if !rows.is_empty() {
            break rows;
        }
        wait_for(&rx, &stored, &mut seen);
    };
    assert_eq!(rows, ["step,1796205601000000000,2000000000"]);
    let open = open_stages(&store, "live");
    assert!(open.contains("train") && !open.contains("step"), "{open}");

    // The watch is killed; the log grows meanwhile; a restarted watch reads on from where
    // the run's copy ends, and stores no stage twice.
    watch.kill().unwrap();
    watch.wait().unwrap();
    // Other log output only: read, and nothing committed.
    let versions = || std::fs::read_dir(store.join("_manifest")).unwrap().count();
    let before = versions();
    write("2026-12-02T10:00:03.5Z level=info loss=0.25\n");
    let o = watch_once(&store, &dir, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains(&stored), "{}", stdout(&o));
    assert_eq!(versions(), before);
    write(&line(4, "eval begin"));
    write(&line(5, "eval end"));
    write(&line(6, "train end rank=0"));
    let o = watch_once(&store, &dir, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stage_rows(&store, "live"),
        [
            "train,1796205600000000000,6000000000",
            "step,1796205601000000000,2000000000",
            "eval,1796205604000000000,1000000000",
        ]
    );
    assert_eq!(open_stages(&store, "live"), "none");
    // The same log ingested whole gives the same stages.
    ok(&store, &["ingest", log.to_str().unwrap(), "--run", "whole"]);
    assert_eq!(stage_rows(&store, "whole"), stage_rows(&store, "live"));
    // Nothing new: a further watch stores nothing.
    let o = watch_once(&store, &dir, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains(&stored), "{}", stdout(&o));
}
