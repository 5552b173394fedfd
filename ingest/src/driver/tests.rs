//! The driver end to end: runs, parts, windows, rank files and their failures.

use super::windows::window_groups;
use super::*;

/// Every stored row of a run, in a canonical order, as text.
fn stored_rows(store: &Store, run: &str) -> Vec<String> {
    let manifest = store.manifest().unwrap();
    let entry = &manifest.runs[&RunId::new(run).unwrap()];
    let mut rows = Vec::new();
    for f in entry.files.iter().filter(|f| f.table == TableKind::Events) {
        let path = store.paths().absolute(&f.path);
        for b in gpuq_engine::part::read_parquet(f.table, &path).unwrap() {
            let columns: Vec<_> = (0..b.num_columns())
                .map(|c| {
                    datafusion::arrow::util::display::ArrayFormatter::try_new(
                        b.column(c).as_ref(),
                        &Default::default(),
                    )
                    .unwrap()
                })
                .collect();
            for i in 0..b.num_rows() {
                let row: Vec<String> = columns.iter().map(|c| c.value(i).to_string()).collect();
                rows.push(row.join("|"));
            }
        }
    }
    rows.sort_unstable();
    rows
}

#[test]
fn a_spilled_spool_stores_the_same_rows_as_one_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let cfg = gpuq_synth::SynthConfig {
        steps: 6,
        ..gpuq_synth::SynthConfig::small()
    };
    gpuq_synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
    // Two stores: the same file twice in one store would be skipped as already stored.
    let mut rows = Vec::new();
    for (store_dir, budget) in [("memory", None), ("spilled", Some(0))] {
        let store = Store::open(dir.path().join(store_dir)).unwrap();
        let opts = IngestOptions {
            run: Some(RunId::new("r").unwrap()),
            spool_budget: budget,
            ..Default::default()
        };
        ingest(&store, std::slice::from_ref(&trace), &opts, &NoProgress).unwrap();
        rows.push(stored_rows(&store, "r"));
        // Nothing is left in the staging area.
        let staging = std::fs::read_dir(store.paths().staging_dir())
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(staging, 0, "{store_dir}");
    }
    assert!(rows[0].len() > 100, "{} rows", rows[0].len());
    assert_eq!(rows[0], rows[1]);
}

#[test]
fn spool_frames_are_grouped_into_parts_of_about_equal_rows_in_order() {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    let mut next = 0;
    let frames: Vec<spool::Frame> = (0..23)
        .map(|i| {
            let rows = 20_000 + 3_000 * (i % 5);
            let values = Int64Array::from_iter_values(next..next + rows);
            next += rows;
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).unwrap();
            spool::Frame::encode(&batch).unwrap()
        })
        .collect();
    let total = next as usize;
    for cores in [1, 2, 3] {
        let groups: Vec<Vec<spool::Frame>> =
            part_groups(frames.clone().into_iter().map(Ok), total, cores)
                .collect::<std::io::Result<_>>()
                .unwrap();
        let count = total.div_ceil(PART_ROWS).next_multiple_of(cores);
        assert_eq!(groups.len(), count, "{cores} cores");
        // Whole frames: a part is off its share by at most one frame's rows.
        for g in &groups {
            let rows: usize = g.iter().map(spool::Frame::rows).sum();
            assert!(rows.abs_diff(total / count) <= 32_000, "{rows} rows");
        }
        let got: Vec<i64> = groups
            .iter()
            .flatten()
            .flat_map(|f| {
                f.decode()
                    .unwrap()
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(got, (0..next).collect::<Vec<_>>(), "{cores} cores");
    }
    // Fewer rows than a part: one group, whatever the cores.
    let one = part_groups(frames.into_iter().take(2).map(Ok), 43_000, 2).count();
    assert_eq!(one, 1);
}

#[test]
fn a_window_is_cut_into_parts_of_equal_rows_in_order() {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    let batches: Vec<RecordBatch> = (0..11)
        .map(|i| {
            let values = Int64Array::from_iter_values(i * 60_000..(i + 1) * 60_000 - 7 * i);
            RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).unwrap()
        })
        .collect();
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let want: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    let groups = window_groups(batches);
    let cores = rayon::current_num_threads().max(1);
    assert!(
        groups.len() >= 2 && groups.len() % cores == 0,
        "{} parts",
        groups.len()
    );
    let rows: Vec<usize> = groups
        .iter()
        .map(|g| g.iter().map(RecordBatch::num_rows).sum())
        .collect();
    assert!(
        rows.iter().all(|&r| r.abs_diff(total / groups.len()) <= 1),
        "{rows:?}"
    );
    let got: Vec<i64> = groups
        .iter()
        .flatten()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_eq!(got, want);
    // Few rows make one part.
    let small = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
    assert_eq!(window_groups(vec![small]).len(), 1);
}

/// An nsys export attributed in many small time windows (ranges open across windows,
/// launches looked up in many runs) stores exactly what one window stores.
#[test]
fn nsys_rows_attributed_in_time_windows_equal_those_of_one_window() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("report.sqlite");
    gpuq_synth::write_nsys(&gpuq_synth::NsysConfig::small(), &export).unwrap();
    let windows = |window_rows, spool_budget| IngestOptions {
        window_rows: Some(window_rows),
        spool_budget,
        ..Default::default()
    };
    let rows = assert_windows_change_nothing(
        &export,
        IngestOptions::default(),
        &[
            ("windows of 300 rows", windows(300, None)),
            ("spilled windows of 1000 rows", windows(1000, Some(0))),
        ],
    );
    assert!(rows.len() > 5000, "{} rows", rows.len());
    assert!(attributed_kernels(&rows) > 1000);
}

#[test]
fn kineto_rows_attributed_in_time_windows_equal_those_of_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let cfg = gpuq_synth::SynthConfig {
        steps: 12,
        streams: 3,
        nccl: true,
        ..gpuq_synth::SynthConfig::small()
    };
    gpuq_synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
    let configs = kineto_windows(IngestOptions::default());
    let rows = assert_windows_change_nothing(&trace, IngestOptions::default(), &configs);
    assert!(rows.len() > 5000, "{} rows", rows.len());
    assert!(attributed_kernels(&rows) > 1000);
    // The real traces' shapes: string pids, ROCm, CUDA graphs, several processes, ...
    let mut real = Vec::new();
    let mut dirs: Vec<_> = gpuq_testkit::shared_traces("kineto").into_iter().collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if crate::source::Source::open(&path, None)
                .is_ok_and(|s| s.format == Format::Kineto)
            {
                real.push(path);
            }
        }
    }
    for path in real {
        let rows = assert_windows_change_nothing(&path, IngestOptions::default(), &configs[..2]);
        assert!(!rows.is_empty(), "{}", path.display());
    }
}

/// Kineto ingests by windows (of 300 and 1000 rows, spilled, one window, and windows after
/// some ranges were kept), with the options of `whole`.
fn kineto_windows(whole: IngestOptions) -> Vec<(&'static str, IngestOptions)> {
    let windows = |window_rows, spool_budget| IngestOptions {
        whole_file_limit: Some(0),
        window_rows: Some(window_rows),
        spool_budget,
        ..whole.clone()
    };
    vec![
        ("windows of 300 rows", windows(300, None)),
        ("spilled windows of 1000 rows", windows(1000, Some(0))),
        ("one window", windows(usize::MAX, None)),
        (
            "windows after 500 ranges and launches were kept",
            IngestOptions {
                whole_file_limit: Some(500),
                ..windows(700, None)
            },
        ),
    ]
}

/// Column `name` of a row of [`stored_rows`].
fn field<'a>(row: &'a str, name: &str) -> &'a str {
    let index = TableKind::Events.file_schema().index_of(name).unwrap();
    row.split('|').nth(index).unwrap()
}

/// Ranges that `--step-pattern` makes steps are scopes, not operators, also where a trace
/// is attributed by windows (as operator rows, `cpu_op`, they would otherwise be the
/// kernels' operators).
#[test]
fn step_pattern_scopes_are_the_same_by_windows() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let mut events = Vec::new();
    for i in 0..400 {
        let t = 1000 + 100 * i;
        let event = |cat: &str, name: &str, ts: i64, dur: i64, args: &str| {
            format!(
                r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, "args": {{{args}}}}}"#
            )
        };
        events.push(event("cpu_op", &format!("scheduler_step {i}"), t, 90, ""));
        events.push(event("cpu_op", "aten::mm", t + 5, 50, ""));
        let correlation = format!(r#""correlation": {i}"#);
        events.push(event(
            "cuda_runtime",
            "cudaLaunchKernel",
            t + 10,
            5,
            &correlation,
        ));
        let on_gpu = format!(r#""correlation": {i}, "device": 0, "stream": 7"#);
        events.push(
            event("kernel", "gemm", t + 20, 20, &on_gpu)
                .replace(r#""pid": 1, "tid": 1"#, r#""pid": 0, "tid": 7"#),
        );
    }
    let text = format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n"));
    std::fs::write(&trace, text).unwrap();
    let whole = IngestOptions {
        step_pattern: Some(crate::formats::nsys::step_pattern(r"^scheduler_step (\d+)$").unwrap()),
        ..Default::default()
    };
    let rows = assert_windows_change_nothing(&trace, whole.clone(), &kineto_windows(whole));
    let kernels: Vec<&String> = rows
        .iter()
        .filter(|r| field(r, "kind") == "kernel")
        .collect();
    assert_eq!(kernels.len(), 400);
    for k in kernels {
        assert_eq!(field(k, "op"), "aten::mm", "{k}");
        let step = field(k, "step").parse::<i64>().unwrap();
        assert_eq!(field(k, "scope"), format!("scheduler_step {step}"), "{k}");
    }
}

/// Legacy `export_chrome_trace` links a kernel to its operator by a flow arrow, which is
/// not stored as a row: attributing by windows must not lose it.
#[test]
fn legacy_flow_launches_are_the_same_by_windows() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let mut events = Vec::new();
    for i in 0..1500 {
        let t = 1_000_000 + 10 * i;
        events.push(format!(r#"{{"name": "op{i}", "ph": "X", "ts": {t}, "dur": 8, "tid": 3, "pid": "CPU functions", "args": {{}}}}"#));
        events.push(format!(r#"{{"name": "op{i}", "ph": "s", "ts": {t}, "tid": 3, "pid": "CPU functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#));
        events.push(format!(r#"{{"name": "k{i}", "ph": "f", "ts": {}, "tid": 0, "pid": "CUDA functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#, t + 5));
        events.push(format!(r#"{{"name": "k{i}", "ph": "X", "ts": {}, "dur": 2, "tid": 0, "pid": "CUDA functions", "args": {{}}}}"#, t + 5));
    }
    std::fs::write(&trace, format!("[{}]", events.join(",\n"))).unwrap();
    let whole = IngestOptions::default();
    let rows = assert_windows_change_nothing(&trace, whole.clone(), &kineto_windows(whole));
    let kernels: Vec<&String> = rows
        .iter()
        .filter(|r| field(r, "kind") == "kernel")
        .collect();
    assert_eq!(kernels.len(), 1500);
    for k in kernels {
        assert_eq!(
            field(k, "op"),
            format!("op{}", &field(k, "name")[1..]),
            "{k}"
        );
    }
}

#[test]
fn a_correlation_id_in_two_processes_finds_its_earliest_launch_also_by_windows() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let mut events = Vec::new();
    let op = |pid: i64, name: &str, ts: i64, dur: i64| {
        format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, "tid": {pid}, "ts": {ts}, "dur": {dur}}}"#
        )
    };
    for pid in [1, 2] {
        for i in 0..20 {
            events.push(op(pid, "filler", i * 10 + 3, 2));
        }
    }
    // Process 1 launches correlation 7 later than process 2 does.
    events.push(op(1, "opA", 105, 10));
    events.push(op(2, "opB", 15, 10));
    for (pid, ts) in [(1, 110), (2, 20)] {
        events.push(format!(r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {pid}, "ts": {ts}, "dur": 1, "args": {{"correlation": 7}}}}"#));
    }
    events.push(r#"{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 300, "dur": 4, "args": {"correlation": 7, "device": 0, "stream": 7}}"#.into());
    std::fs::write(
        &trace,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
    let windows = |spool_budget| IngestOptions {
        whole_file_limit: Some(0),
        window_rows: Some(4),
        spool_budget,
        ..Default::default()
    };
    let rows = assert_windows_change_nothing(
        &trace,
        IngestOptions::default(),
        &[
            ("windows of 4 rows", windows(None)),
            ("spilled windows of 4 rows", windows(Some(0))),
        ],
    );
    let kernel: Vec<&String> = rows.iter().filter(|r| r.contains("|kernel|")).collect();
    assert_eq!(kernel.len(), 1);
    assert!(kernel[0].contains("|opB|"), "{}", kernel[0]);
}

/// Ingests `input` with `whole` and with each of `windowed`, checks that the stored rows
/// are the same, and returns them ([`stored_rows`]).
fn assert_windows_change_nothing(
    input: &Path,
    whole: IngestOptions,
    windowed: &[(&str, IngestOptions)],
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    let all = std::iter::once(("whole", whole)).chain(windowed.iter().cloned());
    for (i, (what, opts)) in all.enumerate() {
        let store = Store::open(dir.path().join(i.to_string())).unwrap();
        let opts = IngestOptions {
            run: Some(RunId::new("r").unwrap()),
            ..opts
        };
        ingest(&store, &[input.to_path_buf()], &opts, &NoProgress).unwrap();
        rows.push((what, stored_rows(&store, "r")));
    }
    let whole = &rows[0].1;
    for (what, other) in &rows[1..] {
        let differing: Vec<_> = whole.iter().zip(other).filter(|(a, b)| a != b).collect();
        assert_eq!(whole.len(), other.len(), "{}: {what}", input.display());
        assert!(
            differing.is_empty(),
            "{}: {what}: {} rows differ, first: {:?}",
            input.display(),
            differing.len(),
            differing[0]
        );
    }
    rows.swap_remove(0).1
}

/// Kernels among `rows` ([`stored_rows`]) with an operator, a scope and a step: comparing
/// attributions means something only if there are many.
fn attributed_kernels(rows: &[String]) -> usize {
    let schema = TableKind::Events.file_schema();
    let col = |name: &str| schema.index_of(name).unwrap();
    rows.iter()
        .map(|r| r.split('|').collect::<Vec<_>>())
        .filter(|f| f[col("kind")] == "kernel")
        .filter(|f| !f[col("op")].is_empty() && !f[col("scope")].is_empty())
        .filter(|f| !f[col("step")].is_empty())
        .count()
}

#[test]
fn gpu_events_far_outside_the_host_span_are_counted_as_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    // Host activity spans 1 s..1.001 s; one kernel 60 s later (corrupt), one within range.
    std::fs::write(
        &trace,
        r#"{"traceEvents": [
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000000, "dur": 1000},
          {"ph": "X", "cat": "kernel", "name": "ok", "pid": 0, "tid": 7, "ts": 1000500, "dur": 10},
          {"ph": "X", "cat": "kernel", "name": "late", "pid": 0, "tid": 7, "ts": 61000000, "dur": 10}
        ]}"#,
    )
    .unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let reports = ingest(&store, &[trace], &IngestOptions::default(), &NoProgress).unwrap();
    let warnings = &reports[0].warnings;
    let key = "GPU events more than 10 s outside the host time range (CUPTI timestamp corruption?)";
    assert_eq!(warnings.get(key), Some(&1), "{warnings:?}");
    assert_eq!(reports[0].events, 3, "the suspicious event is kept");
}

#[test]
fn only_sources_on_different_clocks_are_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let epoch = |seed: u64| {
        let path = dir.path().join(format!("epoch-{seed}.json"));
        let cfg = gpuq_synth::SynthConfig {
            seed,
            ..gpuq_synth::SynthConfig::small()
        };
        gpuq_synth::write_kineto(&cfg, std::fs::File::create(&path).unwrap()).unwrap();
        path
    };
    // Nsight Systems exports are on the session's clock (ns since its start).
    let relative = dir.path().join("relative.sqlite");
    gpuq_synth::write_nsys(&gpuq_synth::NsysConfig::small(), &relative).unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let run = |name: &str| IngestOptions {
        run: Some(RunId::new(name).unwrap()),
        ..Default::default()
    };
    // Synthetic traces carry an HF_TOKEN in their metadata: its redaction is counted too.
    let without_redaction = |r: &RunReport| {
        let mut w = r.warnings.clone();
        assert!(w.remove(redact::WARNING).is_some(), "{w:?}");
        w
    };
    let one = ingest(&store, &[epoch(1)], &run("one"), &NoProgress).unwrap();
    assert!(
        without_redaction(&one[0]).is_empty(),
        "{:?}",
        one[0].warnings
    );
    // Synthetic traces of other seeds start days apart: merged on request, with that
    // warning only.
    let apart = IngestOptions {
        merge_unrelated: true,
        ..run("two")
    };
    let two = ingest(&store, &[epoch(2), epoch(3)], &apart, &NoProgress).unwrap();
    assert_eq!(two[0].files, 2);
    let two_warnings = without_redaction(&two[0]);
    assert_eq!(two_warnings.len(), 1, "{two_warnings:?}");
    assert!(
        two_warnings.keys().all(|w| w.contains("--merge-unrelated")),
        "{two_warnings:?}"
    );
    // Refused unless asked for: files on different clocks are not one job.
    let refused = ingest(
        &store,
        &[epoch(4), relative.clone()],
        &run("mixed"),
        &NoProgress,
    );
    assert!(matches!(refused, Err(IngestError::Unrelated { .. })));
    let merge = IngestOptions {
        merge_unrelated: true,
        ..run("mixed")
    };
    let mixed = ingest(&store, &[epoch(4), relative], &merge, &NoProgress).unwrap();
    let key = "sources on different clocks (epoch ns and trace-relative ns) in one run";
    assert_eq!(
        mixed[0].warnings.get(key),
        Some(&1),
        "{:?}",
        mixed[0].warnings
    );
}

fn facts(path: &str, rank: Option<i32>, span_s: (i64, i64), epoch_time: bool) -> JobFacts {
    JobFacts {
        path: path.into(),
        rank,
        span: Some((span_s.0 * 1_000_000_000, span_s.1 * 1_000_000_000)),
        epoch_time,
    }
}

#[test]
fn files_are_one_job_only_with_distinct_ranks_one_clock_and_no_long_gap() {
    let t = 1_700_000_000;
    let ranks: Vec<JobFacts> = (0..4)
        .map(|r| facts(&format!("r{r}"), Some(r), (t + r as i64, t + 30), true))
        .collect();
    assert_eq!(unrelated(&ranks), None);
    // Chained spans: each within a minute of the furthest end so far.
    let chained = [
        facts("a", None, (t, t + 100), true),
        facts("b", None, (t + 150, t + 200), true),
        facts("c", None, (t + 50, t + 60), true),
    ];
    assert_eq!(unrelated(&chained), None);
    let twice = [
        facts("a", Some(0), (t, t + 1), true),
        facts("b", Some(0), (t, t + 1), true),
    ];
    assert_eq!(
        unrelated(&twice),
        Some(("a".into(), "b".into(), "both are rank 0".into()))
    );
    let apart = [
        facts("late", Some(1), (t + 3 * 86_400, t + 3 * 86_400 + 5), true),
        facts("early", Some(0), (t, t + 5), true),
    ];
    assert_eq!(
        unrelated(&apart),
        Some((
            "early".into(),
            "late".into(),
            "3.0 days apart in time".into()
        ))
    );
    let clocks = [
        facts("e", None, (t, t + 1), true),
        facts("s", None, (0, 1), false),
    ];
    assert!(unrelated(&clocks).unwrap().2.contains("clock"));
    // Session clocks of different files cannot be compared: no gap is measured.
    let sessions = [
        facts("s0", Some(0), (0, 10), false),
        facts("s1", Some(1), (5000, 5010), false),
    ];
    assert_eq!(unrelated(&sessions), None);
}

#[test]
fn a_given_rank_replaces_the_declared_one_in_rows_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let cfg = gpuq_synth::SynthConfig {
        rank: Some(0),
        ..gpuq_synth::SynthConfig::small()
    };
    gpuq_synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new("r").unwrap()),
        rank: Some(3),
        ..Default::default()
    };
    ingest(&store, std::slice::from_ref(&trace), &opts, &NoProgress).unwrap();
    let manifest = store.manifest().unwrap();
    let meta = &manifest.runs[&RunId::new("r").unwrap()].meta;
    assert_eq!(meta.ranks, vec![3]);
    assert_eq!(meta.sources[0].rank, Some(3));
    let rows = stored_rows(&store, "r");
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| field(r, "rank") == "3"), "{}", rows[0]);
}

#[test]
fn a_trace_cut_short_is_a_truncated_error_and_a_damaged_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = Vec::new();
    gpuq_synth::write_kineto(&gpuq_synth::SynthConfig::small(), &mut text).unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let attempt = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        ingest(&store, &[path], &IngestOptions::default(), &NoProgress).unwrap_err()
    };
    for cut in [text.len() / 3, text.len() / 2, text.len() - 3] {
        let e = attempt("cut.json", &text[..cut]);
        assert!(e.is_truncated(), "cut at {cut}: {e}");
    }
    // A gzip stream that stops in the middle.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &text).unwrap();
    let gz = gz.finish().unwrap();
    let e = attempt("cut.json.gz", &gz[..gz.len() / 2]);
    assert!(e.is_truncated(), "{e}");
    // A timestamp that is no number: damaged, not cut short.
    let bad = gpuq_testkit::with_bad_timestamp(&text);
    let e = attempt("bad.json", &bad);
    assert!(!e.is_truncated(), "{e}");
}

#[test]
fn the_report_says_the_highest_step_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new("r").unwrap()),
        ..Default::default()
    };
    for (first_step, last) in [(10, 12), (3, 5)] {
        let trace = dir.path().join(format!("from{first_step}.json"));
        let cfg = gpuq_synth::SynthConfig {
            steps: 3,
            first_step,
            ..gpuq_synth::SynthConfig::small()
        };
        gpuq_synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
        let reports = ingest(&store, &[trace], &opts, &NoProgress).unwrap();
        // This ingest's steps, not the run's: the second append has lower numbers.
        assert_eq!(reports[0].last_step, Some(last), "from {first_step}");
    }
}
