//! Crash test of every writer: `gpuq ingest` (a new run, `--replace`, an append), `gpuq
//! compact` and `gpuq runs rm` are killed with SIGKILL at random points (seeded), and after
//! each kill every run must be whole or absent: its row count that of a fresh ingest of its
//! files (or of the state before the writer), and the `runs` table saying the same. The next
//! writer then leaves no staged file or temporary manifest behind.

mod common;

use common::{generate, gpuq, ok};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Rows of `events` per run, and what the `runs` table says each run has.
fn counts(store: &Path) -> BTreeMap<String, (u64, u64)> {
    let rows = ok(
        store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT r.run, coalesce(e.n, 0), r.events FROM runs r \
             LEFT JOIN (SELECT run, count(*) AS n FROM events GROUP BY run) e ON e.run = r.run",
        ],
    );
    let events_runs = ok(
        store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT DISTINCT run FROM events",
        ],
    );
    let mut out = BTreeMap::new();
    for line in rows.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        out.insert(
            f[0].to_string(),
            (f[1].parse().unwrap(), f[2].parse().unwrap()),
        );
    }
    // No rows of a run the runs table does not list.
    for run in events_runs.lines().skip(1) {
        assert!(
            out.contains_key(run),
            "rows of run {run}, which `runs` does not list"
        );
    }
    out
}

/// Row counts of each run, checked whole: `events` rows equal the `runs` table's count.
fn whole_counts(store: &Path, after: &str) -> BTreeMap<String, u64> {
    counts(store)
        .into_iter()
        .map(|(run, (rows, said))| {
            assert_eq!(
                rows, said,
                "run {run} after {after}: {rows} rows, `runs` says {said}"
            );
            (run, rows)
        })
        .collect()
}

/// Leftovers of crashed writers that the next writer must remove.
fn leftovers(store: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(store.join("_staging"))
        .into_iter()
        .flatten()
        .flatten()
    {
        out.push(format!("_staging/{}", e.file_name().to_string_lossy()));
    }
    for e in std::fs::read_dir(store.join("_manifest"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            out.push(format!("_manifest/{name}"));
        }
    }
    out
}

/// xorshift64: the kill points, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn killing_any_writer_leaves_every_run_whole_or_absent() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let base = generate(dir.path(), "base.json", 200_000, 4);
    let big = generate(dir.path(), "big.json", 12_000_000, 5);
    let other = generate(dir.path(), "other.json", 6_000_000, 6);
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let (base, big, other) = (s(&base), s(&big), s(&other));

    // What a fresh ingest of each file stores.
    let reference = dir.path().join("reference");
    for (run, file) in [("base", &base), ("big", &big), ("other", &other)] {
        ok(&reference, &["ingest", "-q", file, "--run", run]);
    }
    let fresh = whole_counts(&reference, "reference ingests");
    let (n_base, n_big, n_other) = (fresh["base"], fresh["big"], fresh["other"]);

    ok(&store, &["ingest", "-q", &base, "--run", "kept"]);
    ok(&store, &["ingest", "-q", &big, "--run", "victim"]);

    // Each writer and its arguments.
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let append = v(&[
        "ingest",
        "-q",
        &other,
        "--run",
        "victim",
        "--merge-unrelated",
    ]);
    let writers: Vec<(&str, Vec<String>)> = vec![
        ("ingest", v(&["ingest", "-q", &big, "--run", "fresh"])),
        (
            "replace",
            v(&["ingest", "-q", &other, "--run", "victim", "--replace"]),
        ),
        ("append", append.clone()),
        ("compact", v(&["compact", "victim"])),
        ("rm", v(&["runs", "rm", "victim"])),
    ];
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut kills = 0;
    // Kills that landed before the writer finished, by writer.
    let mut interrupted: BTreeMap<&str, usize> = BTreeMap::new();
    // How long each writer takes when not killed.
    let mut writer_time: BTreeMap<&str, Duration> = BTreeMap::new();
    for (name, args) in &writers {
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        for round in 0..6 {
            // Each round starts from the same victim: `big`, twice as two appended parts for
            // compaction to merge.
            let before = whole_counts(&store, "the previous round");
            if before.get("victim") != Some(&n_big) || *name == "compact" {
                let _ = gpuq(&store, &["runs", "rm", "victim"]);
                ok(&store, &["ingest", "-q", &big, "--run", "victim"]);
                if *name == "compact" {
                    let args: Vec<&str> = append.iter().map(|s| s.as_str()).collect();
                    ok(&store, &args);
                }
            }
            if before.contains_key("fresh") {
                ok(&store, &["runs", "rm", "fresh"]);
            }
            let victim_before = whole_counts(&store, "set-up")["victim"];
            // Round 0 runs to the end and measures the writer; the others are killed at a
            // random point of that time.
            let t0 = Instant::now();
            let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
                .arg("--store")
                .arg(&store)
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let status = if round == 0 {
                child.wait().unwrap()
            } else {
                let full = writer_time[*name];
                let delay = Duration::from_micros(rng.next() % (full.as_micros() as u64 + 1));
                std::thread::sleep(delay);
                let _ = child.kill();
                kills += 1;
                child.wait().unwrap()
            };
            if round == 0 {
                assert!(status.success(), "{name} did not finish");
                writer_time.insert(*name, t0.elapsed());
            }
            let after = whole_counts(&store, &format!("{name} (round {round})"));
            assert_eq!(
                after.get("kept"),
                Some(&n_base),
                "{name}: the untouched run changed"
            );
            let victim = after.get("victim").copied();
            let allowed: Vec<Option<u64>> = match *name {
                "ingest" => {
                    let fresh = after.get("fresh").copied();
                    assert!(
                        fresh.is_none() || fresh == Some(n_big),
                        "killed ingest left run `fresh` with {fresh:?} rows, not 0 or {n_big}"
                    );
                    vec![Some(victim_before)]
                }
                "replace" => vec![Some(victim_before), Some(n_other)],
                "append" => vec![Some(victim_before), Some(victim_before + n_other)],
                "compact" => vec![Some(victim_before)],
                "rm" => vec![Some(victim_before), None],
                _ => unreachable!(),
            };
            assert!(
                allowed.contains(&victim),
                "{name} (round {round}) left the victim with {victim:?} rows; allowed {allowed:?}"
            );
            if status.success() && round > 0 {
                continue; // it finished before the kill
            }
            if round > 0 {
                *interrupted.entry(*name).or_default() += 1;
            }
            // The next writer cleans up what the killed one left.
            ok(&store, &["runs", "tag", "kept", &format!("round={round}")]);
            assert_eq!(
                leftovers(&store),
                Vec::<String>::new(),
                "after {name} round {round}"
            );
        }
    }
    eprintln!(
        "{kills} kills, {interrupted:?} before the writer finished, in {:.1?}",
        started.elapsed()
    );
    // Most kill points fall inside the writer's run: the test does kill writers midway.
    let midway: usize = interrupted.values().sum();
    assert!(
        midway * 2 >= kills,
        "only {midway} of {kills} kills interrupted a writer"
    );
}
