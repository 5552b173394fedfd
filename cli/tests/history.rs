//! The history commands through the real binary: `diff`, `check` and `trend` find an injected
//! regression and pass noise.

use std::path::Path;
use std::process::Command;

mod common;
use common::{gpuq, query_csv, stderr, stdout};

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

/// A run at `seq_len` whose kernels take 10 µs·r² (`attention`), 20 µs·r (`mlp`) and 5 µs
/// (`norm`) per step, r = seq_len / 512, over 3 steps.
fn scaled_trace(dir: &Path, seq_len: i64) -> std::path::PathBuf {
    let r = seq_len / 512;
    let (mut events, mut t, mut c) = (Vec::new(), 1000, 0);
    for step in 0..3 {
        let start = t;
        for (name, dur) in [("attention", 10 * r * r), ("mlp", 20 * r), ("norm", 5)] {
            c += 1;
            events.push(format!(
                r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {t}, "dur": 2, "args": {{"correlation": {c}}}}}"#
            ));
            events.push(format!(
                r#"{{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": 7, "ts": {}, "dur": {dur}, "args": {{"device": 0, "stream": 7, "correlation": {c}}}}}"#,
                t + 3
            ));
            t += dur + 10;
        }
        events.push(format!(
            r#"{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": {start}, "dur": {}}}"#,
            t - start
        ));
        t += 5;
    }
    let path = dir.join(format!("seq{seq_len}.json"));
    std::fs::write(
        &path,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
    path
}

#[test]
fn scaling_fits_each_kernels_growth_with_a_run_tag() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for seq_len in [512, 1024, 2048, 4096] {
        let trace = scaled_trace(dir.path(), seq_len);
        let o = gpuq(
            &store,
            &[
                "ingest",
                "-q",
                trace.to_str().unwrap(),
                "--run",
                &format!("s{seq_len}"),
                "--tag",
                &format!("seq_len={seq_len}"),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let got = query_csv(
        &store,
        "SELECT name, round(exponent, 6) AS k, round(ci_low, 6) AS lo, round(ci_high, 6) AS hi, \
         growth, runs, CAST(time_at_max AS BIGINT) AS at_max FROM scaling('true', 'seq_len')",
    );
    assert_eq!(
        got,
        "name,k,lo,hi,growth,runs,at_max\n\
         attention,2.0,2.0,2.0,super-linear,4,640000\n\
         mlp,1.0,1.0,1.0,linear,4,160000\n\
         norm,0.0,0.0,0.0,constant,4,5000\n"
    );
    let o = gpuq(&store, &["scaling", "seq_len", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        query_csv(
            &store,
            "SELECT * FROM scaling('true', 'seq_len', 'kernel') LIMIT 20"
        )
    );
    let table = stdout(&gpuq(&store, &["scaling", "seq_len", "--level", "class"]));
    assert!(
        table.contains("exponent") && table.contains("growth"),
        "{table}"
    );
    // Fewer than two tagged runs, or an unknown level, is an error that says why.
    let o = gpuq(&store, &["scaling", "batch"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("0 of them so tagged"), "{}", stderr(&o));
    let o = gpuq(&store, &["scaling", "seq_len", "--level", "warp"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown level"), "{}", stderr(&o));
}
