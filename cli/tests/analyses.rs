//! The analysis commands through the real binary (`top`, `gaps`, `util`, `breakdown`,
//! `roofline`, `stages`, `findings`, `demo`): they agree with their SQL, take step ranges and
//! kernel class rules, and reject bad arguments.

use std::process::{Command, Output};

mod common;
use common::{gpuq, kineto_with_kernels, query_csv, stderr, stdout, store_with_nsys_run};

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
        "projection",
        "modules",
        "precision",
        "overhead",
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

/// A store with run `r`: `gpuq generate`'s trace of `steps` profiler steps.
fn generated_run(dir: &std::path::Path, steps: u32) -> std::path::PathBuf {
    let store = dir.join("store");
    let trace = dir.join("steps.json");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            trace.to_str().unwrap(),
            "--steps",
            &steps.to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gpuq(&store, &["ingest", trace.to_str().unwrap(), "--run", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    store
}

#[test]
fn projection_gives_each_step_the_span_and_count_of_the_gpu_work_it_launched() {
    let dir = tempfile::tempdir().unwrap();
    let store = generated_run(dir.path(), 5);
    let o = gpuq(&store, &["projection", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        query_csv(&store, "SELECT * FROM gpu_projection('r')")
    );
    // Each ProfilerStep#N range launched exactly the GPU work the ingest attributed to step N:
    // the same count and span, computed the other way (from each operation's step).
    let got = query_csv(
        &store,
        "SELECT CAST(substr(name, 14) AS BIGINT) AS step, proj_time, gpu_ops, instances \
         FROM gpu_projection('r') WHERE name LIKE 'ProfilerStep#%' ORDER BY step",
    );
    let want = query_csv(
        &store,
        "SELECT step, max(ts + dur) - min(ts) AS proj_time, count(*) AS gpu_ops, 1 AS instances \
         FROM events WHERE run = 'r' AND kind IN ('kernel', 'memcpy', 'memset') \
         AND correlation IS NOT NULL AND step IS NOT NULL GROUP BY step ORDER BY step",
    );
    assert_eq!(got, want);
    assert_eq!(got.lines().count(), 6, "{got}");
    let table = stdout(&gpuq(&store, &["projection", "r", "-n", "3"]));
    assert!(
        table.contains("proj_time") && table.contains("gpu_busy"),
        "{table}"
    );
}

#[test]
fn modules_puts_each_kernel_under_the_module_or_backward_node_that_launched_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = generated_run(dir.path(), 3);
    let o = gpuq(&store, &["modules", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("with_stack"), "{}", stderr(&o));
    let got = stdout(&o);
    assert_eq!(
        got,
        query_csv(&store, "SELECT * FROM module_breakdown('r')")
    );
    // The generator's model is one module (GPT_0) around the forward; its backward nodes
    // carry no sequence number, so their kernels are (none)'s backward. The same sums by a
    // join: kernels whose launch call lies in a range of that name on its thread.
    let launched_in = |range: &str| {
        format!(
            "SELECT sum(k.dur) AS t, count(*) AS n FROM events k \
             JOIN events l ON l.run = 'r' AND l.kind IN ('runtime', 'driver') \
               AND l.correlation = k.correlation \
             JOIN events m ON m.run = 'r' AND m.name LIKE '{range}' AND m.pid = l.pid \
               AND m.tid = l.tid AND m.ts <= l.ts AND l.ts + l.dur <= m.ts + m.dur \
             WHERE k.run = 'r' AND k.kind = 'kernel'"
        )
    };
    let row = |sql: &str| query_csv(&store, sql).lines().nth(1).unwrap().to_string();
    assert_eq!(
        row(
            "SELECT gpu_time, kernels FROM module_breakdown('r') WHERE module = 'GPT_0' \
             AND pass = 'forward'"
        ),
        row(&launched_in("nn.Module: %"))
    );
    assert_eq!(
        row("SELECT gpu_time, kernels FROM module_breakdown('r') WHERE pass = 'backward'"),
        row(&launched_in("autograd::engine::evaluate_function: %"))
    );
    assert_eq!(
        row("SELECT round(sum(share), 6), sum(gpu_time) FROM module_breakdown('r')"),
        row("SELECT 100.0, sum(dur) FROM events WHERE run = 'r' AND kind = 'kernel'")
    );
    let o = gpuq(&store, &["modules", "r", "--depth", "0"]);
    assert!(!o.status.success());
    let o = gpuq(&store, &["query", "SELECT * FROM module_breakdown('r', 0)"]);
    assert!(stderr(&o).contains("depth must be >= 1"), "{}", stderr(&o));

    // Without module ranges (an Nsight Systems capture) the command says how to get them.
    let nsys_dir = tempfile::tempdir().unwrap();
    let nsys = store_with_nsys_run(nsys_dir.path());
    let o = gpuq(&nsys, &["modules", "r"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("with_stack=True"), "{}", stderr(&o));
    assert!(stdout(&o).contains("(none)"), "{}", stdout(&o));
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

#[test]
fn precision_gives_every_kernel_a_precision_and_the_time_per_precision() {
    let dir = tempfile::tempdir().unwrap();
    let store = generated_run(dir.path(), 3);
    let o = gpuq(&store, &["precision", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        query_csv(&store, "SELECT * FROM precision('r')")
    );
    let row = |sql: &str| query_csv(&store, sql).lines().nth(1).unwrap().to_string();
    // Every kernel once: the rows add up to the run's kernels and their time.
    assert_eq!(
        row("SELECT sum(kernels), sum(gpu_time), round(sum(share), 6) FROM precision('r')"),
        row("SELECT count(*), sum(dur), 100.0 FROM events WHERE run = 'r' AND kind = 'kernel'")
    );
    // The generator's GEMMs say bf16 in their names; its all-reduce says f32.
    assert_eq!(
        row("SELECT count(*) FROM precision('r') WHERE name LIKE '%bf16%' AND dtype <> 'bf16'"),
        "0"
    );
    assert_eq!(
        row("SELECT dtype, source FROM precision('r') WHERE name LIKE 'ncclDevKernel_AllReduce_Sum_f32%'"),
        "fp32,kernel"
    );
    let table = stdout(&gpuq(&store, &["precision", "r"]));
    assert!(
        table.contains("bf16") && table.contains("fp32_or_fp64_kernel"),
        "{table}"
    );
}

#[test]
fn overhead_shows_the_profilers_recorded_work_and_the_launch_calls() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_nsys_run(dir.path());
    let o = gpuq(&store, &["overhead", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        query_csv(&store, "SELECT * FROM profiler_overhead('r')")
    );
    let row = |sql: &str| query_csv(&store, sql).lines().nth(1).unwrap().to_string();
    // The generated capture records profiler overhead; every row's share is its total over
    // its window, and the launch calls are the runtime's.
    assert_ne!(
        row("SELECT count(*) FROM profiler_overhead('r') WHERE kind = 'recorded'"),
        "0"
    );
    assert_eq!(
        row("SELECT count(*) FROM profiler_overhead('r') \
             WHERE abs(share_pct - 100.0 * total / \"window\") > 1e-9"),
        "0"
    );
    assert_eq!(
        row("SELECT sum(instances) FROM profiler_overhead('r') WHERE kind = 'launch_calls'"),
        row(
            "SELECT count(*) FROM events WHERE run = 'r' AND kind IN ('runtime', 'driver') \
             AND name IN ('cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', \
             'cuLaunchKernelEx', 'cudaLaunchCooperativeKernel')"
        )
    );
    let table = stdout(&gpuq(&store, &["overhead", "r"]));
    assert!(
        table.contains("recorded") && table.contains("share_pct"),
        "{table}"
    );
}

#[test]
fn memory_gives_each_device_its_allocator_peak_and_says_when_nothing_was_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let store = generated_run(dir.path(), 4);
    let o = gpuq(&store, &["memory", "r", "--format", "csv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        query_csv(&store, "SELECT * FROM memory_usage('r')")
    );
    // The whole run's peak per device is the highest total the allocator reported, and each
    // step's peak is at most that.
    let got = query_csv(
        &store,
        "SELECT device, peak_allocated FROM memory_usage('r') WHERE step IS NULL ORDER BY device",
    );
    let want = query_csv(
        &store,
        "SELECT device, CAST(max(value) AS BIGINT) AS peak_allocated FROM counters \
         WHERE run = 'r' AND name = '[memory] Total Allocated' GROUP BY device ORDER BY device",
    );
    assert_eq!(got, want);
    assert!(got.lines().count() >= 2, "{got}");
    let over = query_csv(
        &store,
        "SELECT count(*) FROM memory_usage('r') s JOIN memory_usage('r') w \
         ON (s.device IS NOT DISTINCT FROM w.device) AND w.step IS NULL \
         WHERE s.step IS NOT NULL AND s.peak_allocated > w.peak_allocated",
    );
    assert_eq!(over.lines().nth(1), Some("0"));
    let steps = query_csv(
        &store,
        "SELECT count(DISTINCT step) FROM memory_usage('r', '6..7') WHERE step IS NOT NULL",
    );
    assert_eq!(steps.lines().nth(1), Some("2"), "{steps}");
    let table = stdout(&gpuq(&store, &["memory", "r"]));
    assert!(
        table.contains("peak_allocated_mib") && table.contains("peak_op"),
        "{table}"
    );
    // A run without allocator events says how to record them.
    let bare = dir.path().join("bare.json");
    kineto_with_kernels(&bare, &["gemm"]);
    let o = gpuq(
        &store,
        &["ingest", "-q", bare.to_str().unwrap(), "--run", "bare"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = gpuq(&store, &["memory", "bare"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("profile_memory=True"), "{}", stderr(&o));
}

#[test]
fn phases_and_collectives_print_their_rows_and_say_what_a_run_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let store = generated_run(dir.path(), 3);
    for (command, function, note) in [
        // The generated run has no serving markers, and 8-rank all-reduces with their sizes.
        (
            "phases",
            "inference_phases",
            "no serving-engine step markers",
        ),
        ("collectives", "collectives", "allreduce"),
    ] {
        let o = gpuq(&store, &[command, "r", "--format", "csv"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            stdout(&o),
            query_csv(&store, &format!("SELECT * FROM {function}('r')"))
        );
        let o = gpuq(&store, &[command, "r"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let said = format!("{}{}", stdout(&o), stderr(&o));
        assert!(said.contains(note), "{said}");
    }
}
