use super::data::{DeviceKey, Host, HostCall, Names, Op, OpClass, Range, Timelines};
use super::gaps::device_gaps;
use crate::open_session;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::execution::context::SessionContext;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::{IngestOptions, NoProgress};
use gpuq_synth::{write_kineto, SynthConfig};
use gpuq_synth::{write_nsys, NsysConfig};
use std::collections::BTreeMap;

fn ingest(store: &Store, path: &std::path::Path, run: &str) {
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        ..Default::default()
    };
    gpuq_ingest::ingest(store, &[path.to_path_buf()], &opts, &NoProgress).unwrap();
}

/// A session over a new store holding `trace` (Kineto JSON text) as run `run`; the directory
/// lives as long as the returned guard.
async fn session_with_trace(trace: &str, run: &str) -> (tempfile::TempDir, SessionContext) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("trace.json");
    std::fs::write(&path, trace).unwrap();
    ingest(&store, &path, run);
    let ctx = open_session(&store).await.unwrap();
    (dir, ctx)
}

/// Rows of a query as Int64 (NULL -> None) per column.
async fn int_rows(ctx: &SessionContext, sql: &str) -> Vec<Vec<Option<i64>>> {
    let mut out = Vec::new();
    for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
        let cols: Vec<_> = b
            .columns()
            .iter()
            .map(|c| cast(c, &DataType::Int64).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            out.push(
                cols.iter()
                    .map(|c| {
                        let c = c.as_primitive::<Int64Type>();
                        (!c.is_null(r)).then(|| c.value(r))
                    })
                    .collect(),
            );
        }
    }
    out
}

async fn text_rows(ctx: &SessionContext, sql: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
        for r in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| datafusion::arrow::util::display::array_value_to_string(c, r).unwrap())
                    .collect(),
            );
        }
    }
    out
}

#[tokio::test]
async fn gaps_busy_and_idle_equal_the_nsys_generators_truth_on_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("n.sqlite");
    let truth = write_nsys(&NsysConfig::small(), &path).unwrap();
    ingest(&store, &path, "n");
    let ctx = open_session(&store).await.unwrap();
    assert_eq!(truth.busy_union_by_device.len(), 2);

    let got = int_rows(
        &ctx,
        "SELECT pid, device, ts, dur FROM gpu_gaps('n') ORDER BY pid, device, ts",
    )
    .await;
    let mut want = Vec::new();
    for (&(pid, dev), union) in &truth.busy_union_by_device {
        for w in union.windows(2) {
            want.push(vec![
                Some(pid),
                Some(dev),
                Some(w[0].1),
                Some(w[1].0 - w[0].1),
            ]);
        }
    }
    assert!(want.len() > 10, "{} gaps", want.len());
    assert_eq!(got, want);

    // min_gap_ns keeps the strictly longer ones.
    let cut = want[want.len() / 2][3].unwrap();
    let n = int_rows(&ctx, &format!("SELECT count(*) FROM gpu_gaps('n', {cut})")).await;
    let expected = want.iter().filter(|g| g[3].unwrap() > cut).count() as i64;
    assert_eq!(n, vec![vec![Some(expected)]]);
    let n = int_rows(&ctx, "SELECT count(*) FROM gpu_gaps('n', dur('100us'))").await;
    let expected = want.iter().filter(|g| g[3].unwrap() > 100_000).count() as i64;
    assert_eq!(n, vec![vec![Some(expected)]]);

    let rows = int_rows(
        &ctx,
        "SELECT pid, device, span, busy, idle, compute + comm_exposed + memcpy_exposed + memset_exposed \
         FROM breakdown('n') ORDER BY pid, device",
    )
    .await;
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let key = (r[0].unwrap(), r[1].unwrap());
        let union = &truth.busy_union_by_device[&key];
        let span = union.last().unwrap().1 - union[0].0;
        assert_eq!(r[2], Some(span), "{key:?} span");
        assert_eq!(r[3], Some(truth.busy_ns_by_device[&key]), "{key:?} busy");
        assert_eq!(
            r[4],
            Some(span - truth.busy_ns_by_device[&key]),
            "{key:?} idle"
        );
        assert_eq!(r[5], r[3], "{key:?}: the exclusive split adds up to busy");
    }
    // The breakdown agrees with the idle_ratio aggregate and with the gaps.
    let agree = int_rows(
        &ctx,
        "SELECT count(*) FROM breakdown('n') b JOIN \
           (SELECT pid, device, round(idle_ratio(ts, dur) * 1e9) AS r FROM gpu_ops WHERE run = 'n' \
            GROUP BY pid, device) i ON b.pid = i.pid AND b.device = i.device \
         JOIN (SELECT pid, device, sum(dur) AS idle FROM gpu_gaps('n') GROUP BY pid, device) g \
           ON b.pid = g.pid AND b.device = g.device \
         WHERE round(CAST(b.idle AS DOUBLE) / b.span * 1e9) = i.r AND g.idle = b.idle",
    )
    .await;
    assert_eq!(agree, vec![vec![Some(2)]]);

    // Utilisation chunks tile each span and their busy time adds up to the union... or more,
    // where streams overlap (time utilisation).
    let util = int_rows(
        &ctx,
        "SELECT pid, device, count(*), min(ts), sum(dur) FROM gpu_util('n', 7) GROUP BY pid, device ORDER BY pid, device",
    )
    .await;
    for r in &util {
        let union = &truth.busy_union_by_device[&(r[0].unwrap(), r[1].unwrap())];
        assert_eq!(r[2], Some(7));
        assert_eq!(r[3], Some(union[0].0));
        assert_eq!(r[4], Some(union.last().unwrap().1 - union[0].0));
    }
}

#[tokio::test]
async fn steps_stages_and_launches_of_a_kineto_run_match_its_truth() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("k.json");
    let cfg = SynthConfig::demo();
    let truth = write_kineto(&cfg, std::fs::File::create(&path).unwrap()).unwrap();
    ingest(&store, &path, "k");
    let ctx = open_session(&store).await.unwrap();

    let busy = int_rows(&ctx, "SELECT device, busy FROM breakdown('k')").await;
    assert_eq!(
        busy,
        vec![vec![
            Some(cfg.device as i64),
            Some(truth.busy_ns_by_device[&cfg.device])
        ]]
    );

    let steps = int_rows(
        &ctx,
        "SELECT step, ts, dur, kernels FROM step_stats('k') ORDER BY step",
    )
    .await;
    let want: Vec<_> = truth
        .steps
        .iter()
        .map(|&(n, ts, dur)| (Some(n as i64), Some(ts), Some(dur)))
        .collect();
    let got: Vec<_> = steps.iter().map(|r| (r[0], r[1], r[2])).collect();
    assert_eq!(got, want);
    // Every kernel launched in a step is counted in that step.
    let per_step = int_rows(&ctx, "SELECT step, count(*) FROM kernels WHERE run = 'k' AND step IS NOT NULL GROUP BY step ORDER BY step").await;
    assert_eq!(
        per_step,
        steps.iter().map(|r| vec![r[0], r[3]]).collect::<Vec<_>>()
    );

    // The steps stage is the union of the steps; phases exist for forward/backward/optimizer.
    let stages = text_rows(
        &ctx,
        "SELECT kind, name, instances, wall FROM stages('k') ORDER BY kind, name",
    )
    .await;
    let step_wall: i64 = truth.steps.iter().map(|s| s.2).sum();
    assert!(
        stages.contains(&vec![
            "steps".into(),
            "ProfilerStep".into(),
            truth.steps.len().to_string(),
            step_wall.to_string()
        ]),
        "{stages:?}"
    );
    for phase in ["backward", "dataloader", "forward", "optimizer"] {
        assert!(
            stages.iter().any(|r| r[0] == "phase" && r[1] == phase),
            "{phase}: {stages:?}"
        );
    }

    // Every GPU operation has its launch; delays and queue depths are sane.
    let l = int_rows(
        &ctx,
        "SELECT count(*), min(launch_delay), min(queue_depth), \
           sum(CASE WHEN gpu_ts < launch_ts THEN 1 ELSE 0 END), \
           sum(CASE WHEN launch_delay <> greatest(0, gpu_ts - launch_ts - launch_dur) THEN 1 ELSE 0 END) \
         FROM launch_stats('k')",
    )
    .await;
    let ops = int_rows(&ctx, "SELECT count(*) FROM gpu_ops WHERE run = 'k'").await;
    assert_eq!(l[0][0], ops[0][0]);
    assert!(l[0][1].is_some_and(|d| d >= 0), "{l:?}");
    assert_eq!(l[0][2], Some(0));
    assert_eq!(l[0][3], Some(0), "no GPU work starts before its launch");
    assert_eq!(l[0][4], Some(0));

    // Findings are ordered by severity; the D2H copies into pageable memory are found.
    let f = text_rows(
        &ctx,
        "SELECT severity, category, evidence FROM findings('k')",
    )
    .await;
    let rank = |s: &str| {
        ["high", "medium", "low"]
            .iter()
            .position(|x| *x == s)
            .unwrap()
    };
    assert!(
        f.windows(2).all(|w| rank(&w[0][0]) <= rank(&w[1][0])),
        "{f:?}"
    );
    assert!(f.iter().all(|r| !r[2].is_empty()));
    let cats: Vec<&str> = f.iter().map(|r| r[1].as_str()).collect();
    assert!(cats.contains(&"dominant_class"), "{cats:?}");
}

fn op(start: i64, end: i64, correlation: i64) -> Op {
    Op {
        start,
        end,
        stream: Some(7),
        class: OpClass::Compute,
        name: 0,
        correlation: Some(correlation),
        op: None,
        step: None,
    }
}

#[test]
fn each_gap_gets_the_first_cause_that_applies() {
    let key = DeviceKey {
        rank: None,
        pid: Some(0),
        device: Some(0),
    };
    let mut kernel_names = Names::default();
    kernel_names.id("k");
    let timelines = Timelines {
        devices: vec![(
            key.clone(),
            vec![
                op(0, 100_000, 1),
                op(150_000, 200_000, 2), // gap 50 us, launched at 120 us: host_wait
                op(210_000, 300_000, 3), // gap 10 us, queued: short
                op(1_300_000, 1_400_000, 4), // 1 ms, a sync covers it: sync
                op(2_400_000, 2_500_000, 5), // 1 ms in a DataLoader range: dataloader
                op(3_500_000, 3_600_000, 6), // 1 ms in a stage-log stage: stage
                op(4_600_000, 4_700_000, 7), // 1 ms, queued, nothing around: other
            ],
        )],
        names: kernel_names,
    };
    let mut names = Names::default();
    let launch = names.id("cudaLaunchKernel");
    let sync = names.id("cudaStreamSynchronize");
    let mut host = Host::default();
    let mut call = |name, start, end, corr| {
        host.push(
            HostCall {
                rank: None,
                pid: Some(42),
                tid: Some(42),
                name,
                start,
                end,
            },
            Some(corr),
        )
    };
    call(launch, 0, 5_000, 1);
    call(launch, 120_000, 125_000, 2);
    call(launch, 170_000, 175_000, 3);
    call(sync, 220_000, 1_250_000, -1);
    call(launch, 1_260_000, 1_265_000, 4);
    for (c, t) in [(5, 1_300_000), (6, 1_310_000), (7, 1_320_000)] {
        call(launch, t, t + 5_000, c);
    }
    let loader = names.id("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__");
    let stage_name = names.id("checkpoint");
    let stage = names.id("stage");
    let range = |name, scope, start, end| Range {
        rank: None,
        pid: Some(42),
        name,
        scope,
        start,
        end,
    };
    let ranges = vec![
        range(loader, None, 1_450_000, 2_390_000),
        range(stage_name, Some(stage), 2_500_000, 3_500_000),
    ];
    let gaps = device_gaps(&timelines, &host, &names, &ranges, 0);
    let causes: Vec<(i64, &str, Option<&str>)> = gaps
        .iter()
        .map(|g| (g.dur, g.cause, g.detail.as_deref()))
        .collect();
    assert_eq!(
        causes,
        vec![
            (50_000, "host_wait", Some("cudaLaunchKernel")),
            (10_000, "short", None),
            (1_000_000, "sync", Some("cudaStreamSynchronize")),
            (
                1_000_000,
                "dataloader",
                Some("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
            ),
            (1_000_000, "stage", Some("checkpoint")),
            (1_000_000, "other", None),
        ]
    );
    let mut by_cause = BTreeMap::new();
    for g in &gaps {
        *by_cause.entry(g.cause).or_insert(0) += 1;
    }
    assert_eq!(by_cause.len(), 6);

    // A stage log's stage around all the GPU work (the trace was taken inside `inference`)
    // is context: no cause changes, not even `other`.
    let inference = names.id("inference");
    let mut with_inference = ranges.clone();
    with_inference.push(range(inference, Some(stage), 0, 5_000_000));
    assert_eq!(
        device_gaps(&timelines, &host, &names, &with_inference, 0),
        gaps
    );
    // A stage that covers the gaps but not all the GPU work explains only what nothing more
    // specific does: host_wait and short stay, `other` becomes the stage.
    with_inference.pop();
    with_inference.push(range(inference, Some(stage), 50_000, 4_650_000));
    let causes: Vec<&str> = device_gaps(&timelines, &host, &names, &with_inference, 0)
        .iter()
        .map(|g| g.cause)
        .collect();
    assert_eq!(
        causes,
        ["host_wait", "short", "sync", "dataloader", "stage", "stage"]
    );
}

#[tokio::test]
async fn bad_calls_are_plan_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let ctx = open_session(&store).await.unwrap();
    for (sql, want) in [
        ("SELECT * FROM gpu_gaps('nope')", "unknown run nope"),
        ("SELECT * FROM gpu_gaps()", "takes 1 to 3 arguments"),
        ("SELECT * FROM gpu_gaps(3)", "the run must be a string"),
        (
            "SELECT * FROM gpu_util('x', 0)",
            "chunks must be between 1 and 1000",
        ),
        ("SELECT * FROM gpu_gaps('x', -1)", "min_gap_ns must be >= 0"),
        (
            "SELECT * FROM breakdown('x', 1)",
            "takes at most 0 integer arguments after the run, got 1",
        ),
        (
            "SELECT * FROM gpu_gaps('x', 'y')",
            "\"y\" is not a step range",
        ),
        (
            "SELECT * FROM gpu_gaps('x', 'y', 1)",
            "min_gap_ns must be an integer",
        ),
    ] {
        let err = match ctx.sql(sql).await {
            Ok(df) => df.collect().await.unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{sql}: {err}");
    }
}

/// An H100 trace with shapes: a large bf16 GEMM (compute-bound), and a small `aten::addmm`
/// inside `aten::linear` (memory-bound; counted once, for the addmm).
const ROOFLINE_TRACE: &str = r###"{
  "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
  "traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 10, "tid": 11, "ts": 100, "dur": 200,
   "args": {"Input Dims": [[64, 1024], [4096, 1024], [4096]], "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 10, "tid": 11, "ts": 110, "dur": 180,
   "args": {"Input Dims": [[4096], [64, 1024], [1024, 4096], [], []], "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 120, "dur": 5, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_small", "pid": 0, "tid": 7, "ts": 130, "dur": 10, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 11, "ts": 400, "dur": 100,
   "args": {"Input Dims": [[8192, 8192], [8192, 8192]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 410, "dur": 5, "args": {"correlation": 2}},
  {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_big", "pid": 0, "tid": 7, "ts": 500, "dur": 2000, "args": {"device": 0, "stream": 7, "correlation": 2}},
  {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 10, "tid": 11, "ts": 2600, "dur": 10, "args": {"Input Dims": [[64, 4096]]}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 2601, "dur": 5, "args": {"correlation": 3}},
  {"ph": "X", "cat": "kernel", "name": "relu_kernel", "pid": 0, "tid": 7, "ts": 2610, "dur": 3, "args": {"device": 0, "stream": 7, "correlation": 3}}
  ]
}"###;

#[tokio::test]
async fn roofline_rates_gemms_by_arithmetic_intensity_against_the_gpus_peak() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("roof.json");
    std::fs::write(&path, ROOFLINE_TRACE).unwrap();
    ingest(&store, &path, "roof");
    let ctx = open_session(&store).await.unwrap();
    let rows = text_rows(
        &ctx,
        "SELECT op, dtype, gpu, source, instances, kernels, kernel_time, flop, bytes, bound \
         FROM roofline('roof')",
    )
    .await;
    let big_flop = 2.0 * 8192f64.powi(3);
    let small_flop = 2.0 * 64.0 * 1024.0 * 4096.0;
    let small_bytes = (4096.0 + 64.0 * 1024.0 + 1024.0 * 4096.0 + 64.0 * 4096.0) * 2.0;
    let show = |v: f64| format!("{v:.1}");
    assert_eq!(
        rows,
        vec![
            vec![
                "aten::mm".to_string(),
                "bf16".into(),
                "H100 SXM".into(),
                "shapes".into(),
                "1".into(),
                "1".into(),
                "2000000".into(),
                show(big_flop),
                show(3.0 * 8192.0 * 8192.0 * 2.0),
                "compute".into()
            ],
            vec![
                "aten::addmm".to_string(),
                "bf16".into(),
                "H100 SXM".into(),
                "shapes".into(),
                "1".into(),
                "1".into(),
                "10000".into(),
                show(small_flop),
                show(small_bytes),
                "memory".into()
            ],
        ]
    );
    let b = ctx
        .sql("SELECT tflops, intensity, ridge, attainable_tflops, pct_of_attainable FROM roofline('roof')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let col = |c: usize| -> Vec<f64> {
        b[0].column(c)
            .as_primitive::<datafusion::arrow::datatypes::Float64Type>()
            .values()
            .to_vec()
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    let ridge = 989.4 / 3.35;
    let (big_tflops, small_tflops) = (big_flop / 2e6 / 1e3, small_flop / 1e4 / 1e3);
    let small_ai = small_flop / small_bytes;
    assert!(
        close(col(0)[0], big_tflops) && close(col(0)[1], small_tflops),
        "{:?}",
        col(0)
    );
    assert!(close(col(1)[1], small_ai));
    assert!(close(col(2)[0], ridge));
    assert!(close(col(3)[0], 989.4) && close(col(3)[1], small_ai * 3.35));
    assert!(close(col(4)[0], 100.0 * big_tflops / 989.4));
    assert!(close(col(4)[1], 100.0 * small_tflops / (small_ai * 3.35)));

    // Both run under 70 % of their roof: one finding, its impact the time saved at 70 %.
    let f = text_rows(
        &ctx,
        "SELECT severity, title, impact_ns FROM findings('roof') WHERE category = 'roofline'",
    )
    .await;
    assert_eq!(f.len(), 1, "{f:?}");
    let pct = |tflops: f64, roof: f64| 100.0 * tflops / roof;
    let lost = |t: f64, p: f64| ((t * (1.0 - p / 70.0)).max(0.0)).round() as i64;
    let want = lost(2e6, pct(big_tflops, 989.4)) + lost(1e4, pct(small_tflops, small_ai * 3.35));
    assert_eq!(f[0][2], want.to_string(), "{f:?}");
    assert!(
        f[0][1].starts_with("aten::mm (bf16) runs at 56% of its roofline on the H100 SXM"),
        "{f:?}"
    );
}

/// Rows of a query, or the error it ends with.
async fn query_error(ctx: &SessionContext, sql: &str) -> String {
    match ctx.sql(sql).await {
        Ok(df) => match df.collect().await {
            Ok(b) => panic!("{sql}: expected an error, got {} batches", b.len()),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn a_step_range_restricts_every_analysis_to_the_selected_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("k.json");
    let cfg = SynthConfig::demo();
    let truth = write_kineto(&cfg, std::fs::File::create(&path).unwrap()).unwrap();
    ingest(&store, &path, "k");
    let ctx = open_session(&store).await.unwrap();
    assert!(truth.steps.len() >= 4, "{}", truth.steps.len());
    let (a, b) = (truth.steps[1].0 as i64, truth.steps[2].0 as i64);
    let (w0, w1) = (truth.steps[1].1, truth.steps[2].1 + truth.steps[2].2);
    let range = format!("'{a}..{b}'");
    let in_steps = format!("run = 'k' AND step BETWEEN {a} AND {b}");
    let one = |sql: String| {
        let ctx = ctx.clone();
        async move { int_rows(&ctx, &sql).await[0].clone() }
    };

    // top_kernels: the kernels launched in the steps.
    let got = one(format!(
        "SELECT sum(instances), sum(total) FROM top_kernels('k', NULL, {range})"
    ))
    .await;
    let want = one(format!(
        "SELECT count(*), sum(dur) FROM kernels WHERE {in_steps}"
    ))
    .await;
    let all = one("SELECT count(*) FROM kernels WHERE run = 'k'".into()).await;
    assert_eq!(got, want);
    assert!(want[0] < all[0], "{want:?} of {all:?}");
    // The range is the last argument whatever comes before it.
    let n = one(format!("SELECT count(*) FROM top_kernels('k', 3, {range})")).await;
    assert_eq!(n, vec![Some(3)]);

    // breakdown: busy of the steps' operations; wall from the steps' span.
    let got = one(format!(
        "SELECT busy, wall, wall_with_stages FROM breakdown('k', {range})"
    ))
    .await;
    let want = one(format!(
        "SELECT busy_time(ts, dur) FROM gpu_ops WHERE {in_steps} AND ts > 0"
    ))
    .await;
    assert_eq!(got[0], want[0]);
    let whole = one("SELECT wall FROM breakdown('k')".into()).await;
    assert!(
        got[1].unwrap() >= w1 - w0 && got[1] < whole[0],
        "{got:?} {whole:?}"
    );
    assert_eq!(got[1], got[2], "no stage log: the two walls agree");

    // gpu_gaps and stream_gaps: inside the steps' span.
    for f in ["gpu_gaps", "stream_gaps"] {
        let g = one(format!(
            "SELECT count(*), min(ts), max(ts + dur) FROM {f}('k', 0, {range})"
        ))
        .await;
        assert!(g[0].unwrap() > 0, "{f}: {g:?}");
        assert!(
            g[1].unwrap() >= w0 && g[2].unwrap() <= w1,
            "{f}: {g:?} vs {w0}..{w1}"
        );
    }

    // gpu_util: chunks over the span of the steps' operations.
    let got = one(format!(
        "SELECT min(ts) FROM gpu_util('k', 10, NULL, {range})"
    ))
    .await;
    let want = one(format!(
        "SELECT min(ts) FROM gpu_ops WHERE {in_steps} AND ts > 0"
    ))
    .await;
    assert_eq!(got, want);

    // stages and step_stats: the two steps only.
    let got = one(format!(
        "SELECT instances, wall FROM stages('k', {range}) WHERE kind = 'steps'"
    ))
    .await;
    assert_eq!(
        got,
        vec![Some(2), Some(truth.steps[1].2 + truth.steps[2].2)]
    );
    let got = int_rows(
        &ctx,
        &format!("SELECT step FROM step_stats('k', {range}) ORDER BY step"),
    )
    .await;
    assert_eq!(got, vec![vec![Some(a)], vec![Some(b)]]);

    // launch_stats: the operations launched in the steps.
    let got = one(format!("SELECT count(*) FROM launch_stats('k', {range})")).await;
    let want = one(format!("SELECT count(*) FROM gpu_ops WHERE {in_steps}")).await;
    assert_eq!(got, want);

    // roofline, findings and self_time take the range too.
    for sql in [
        format!("SELECT count(*) FROM roofline('k', {range})"),
        format!("SELECT count(*) FROM findings('k', {range})"),
    ] {
        one(sql).await;
    }
    let got = one(format!("SELECT sum(total) FROM self_time('k', {range})")).await;
    let whole = one("SELECT sum(total) FROM self_time('k')".into()).await;
    assert!(got[0] < whole[0], "{got:?} {whole:?}");

    // A range that selects nothing names the run's steps; a bad range says how to write one.
    let last = truth.steps.last().unwrap().0;
    let first = truth.steps[0].0;
    let err = query_error(&ctx, "SELECT * FROM breakdown('k', '900..')").await;
    assert!(
        err.contains(&format!(
            "no step of run k is in the range 900.. (its steps: {first}..{last})"
        )),
        "{err}"
    );
    let err = query_error(&ctx, "SELECT * FROM top_kernels('k', 5, '900')").await;
    assert!(
        err.contains("no step of run k is in the range 900"),
        "{err}"
    );
    let err = query_error(&ctx, "SELECT * FROM gpu_gaps('k', 'x..y')").await;
    assert!(
        err.contains("\"x..y\" is not a step range") && err.contains("nor an integer min_gap_ns"),
        "{err}"
    );
    let err = query_error(&ctx, "SELECT * FROM breakdown('k', '5..3')").await;
    assert!(err.contains("is empty"), "{err}");
    let err = query_error(&ctx, "SELECT * FROM collective_skew('k', '1')").await;
    assert!(err.contains("takes no step range"), "{err}");
}

/// Three steps of equal wall time; the third keeps the GPU busy 75 % longer. The host
/// synchronises with the deprecated and driver forms, and its ranges nest (python > cpu_op >
/// runtime).
const STEPS_TRACE: &str = r###"{
  "traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 10, "tid": 11, "ts": 1000, "dur": 1000},
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 10, "tid": 11, "ts": 2000, "dur": 1000},
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 10, "tid": 11, "ts": 3000, "dur": 1000},
  {"ph": "X", "cat": "python_function", "name": "train.py(1): step", "pid": 10, "tid": 11, "ts": 1010, "dur": 900},
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 11, "ts": 1050, "dur": 200},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 1100, "dur": 50, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1200, "dur": 400, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaThreadSynchronize", "pid": 10, "tid": 11, "ts": 1300, "dur": 300},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 2100, "dur": 50, "args": {"correlation": 2}},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2200, "dur": 400, "args": {"device": 0, "stream": 7, "correlation": 2}},
  {"ph": "X", "cat": "cuda_driver", "name": "cuCtxSynchronize", "pid": 10, "tid": 11, "ts": 2300, "dur": 300},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 3100, "dur": 50, "args": {"correlation": 3}},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3200, "dur": 700, "args": {"device": 0, "stream": 7, "correlation": 3}},
  {"ph": "X", "cat": "cuda_driver", "name": "cuStreamSynchronize", "pid": 10, "tid": 11, "ts": 3300, "dur": 600}
  ]
}"###;

#[tokio::test]
async fn vs_median_flags_a_step_whose_gpu_busy_time_grew() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("steps.json");
    std::fs::write(&path, STEPS_TRACE).unwrap();
    ingest(&store, &path, "s");
    let ctx = open_session(&store).await.unwrap();
    let rows = text_rows(
        &ctx,
        "SELECT step, dur, gpu_busy, vs_median, busy_vs_median FROM step_stats('s') ORDER BY step",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            vec!["1", "1000000", "400000", "1.0", "1.0"],
            vec!["2", "1000000", "400000", "1.0", "1.0"],
            vec!["3", "1000000", "700000", "1.75", "1.75"],
        ]
    );
    // The finding names the step; the time at stake is the GPU busy time over the median.
    let f = text_rows(
        &ctx,
        "SELECT title, evidence, impact_ns FROM findings('s') WHERE category = 'slow_steps'",
    )
    .await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0][1].starts_with("step 3: 1.00 ms (1× median; GPU busy 700 us, 1.75× median"),
        "{f:?}"
    );
    assert_eq!(f[0][2], "300000");

    // Deprecated and driver synchronisation calls are host synchronisations.
    let f = text_rows(
        &ctx,
        "SELECT title, evidence FROM findings('s') WHERE category = 'sync_api'",
    )
    .await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0][0].starts_with("3 host synchronisation calls (1.20 ms of host time"),
        "{f:?}"
    );
    for call in [
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
    ] {
        assert!(f[0][1].contains(call), "{call}: {f:?}");
    }

    // Self time: python [1010, 1910) holds aten::mm [1050, 1250), which holds the launch
    // [1100, 1150); the sync [1300, 1600) is inside the python range too.
    let rows = text_rows(
        &ctx,
        "SELECT kind, name, calls, total, self_dur FROM self_time('s') \
         WHERE name IN ('train.py(1): step', 'aten::mm') ORDER BY kind",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            vec!["cpu_op", "aten::mm", "1", "200000", "150000"],
            vec!["python", "train.py(1): step", "1", "900000", "400000"],
        ]
    );
    // Summed by kind, self times never exceed the thread's time (the nested sums do).
    let sums = int_rows(&ctx, "SELECT sum(self_dur), sum(total) FROM self_time('s')").await;
    let union = int_rows(
        &ctx,
        "SELECT busy_time(ts, dur) FROM events WHERE run = 's' AND pid = 10 \
         AND kind IN ('python', 'cpu_op', 'annotation', 'runtime', 'driver')",
    )
    .await;
    assert_eq!(sums[0][0], union[0][0]);
    assert!(sums[0][1] > sums[0][0]);
}

/// A ROCm run: a kernel runs 100 ms; a synchronous hipMemcpy called 1 ms into it waits for it,
/// then copies 45 µs.
const ROCM_COPY_TRACE: &str = r###"{
  "traceEvents": [
  {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 10, "tid": 11, "ts": 50, "dur": 20, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "unet_block", "pid": 0, "tid": 7, "ts": 100, "dur": 100000, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpy", "pid": 10, "tid": 11, "ts": 1000, "dur": 99200, "args": {"correlation": 2}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7, "ts": 100110, "dur": 45, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4194304}}
  ]
}"###;

#[tokio::test]
async fn a_copy_that_waits_for_queued_work_is_a_synchronisation_in_hip_words() {
    let (_dir, ctx) = session_with_trace(ROCM_COPY_TRACE, "r").await;
    let f = text_rows(
        &ctx,
        "SELECT category, title, action, impact_ns FROM findings('r') \
         WHERE category IN ('memcpy_wait', 'sync_memcpy')",
    )
    .await;
    assert_eq!(f.len(), 2, "{f:?}");
    // The wait: from the call (1 ms) to the copy's start (100.11 ms), the GPU busy until 100.1.
    assert_eq!(f[0][0], "memcpy_wait", "{f:?}");
    assert_eq!(f[0][3], (99_100_000).to_string());
    assert!(
        f[0][1].contains("1 synchronous copy waits 99.1 ms for GPU work queued"),
        "{f:?}"
    );
    assert!(
        f[0][2].contains("hipMemcpyAsync") && !f[0][2].contains("cuda"),
        "{f:?}"
    );
    // The copy's own cost is what is left of the call.
    assert_eq!(f[1][0], "sync_memcpy");
    assert_eq!(f[1][3], (99_200_000 - 99_100_000).to_string());
    assert!(
        f[1][2].contains("hipMemcpyAsync") && !f[1][2].contains("cuda"),
        "{f:?}"
    );
}

/// A synchronous copy on stream 7 called at 1 ms, after a kernel on stream 7 that runs until
/// 10.1 ms; a collective on stream 20 keeps the device busy until 100.1 ms, and the copy only
/// starts at 60 ms. The copy waited for its own stream (9.1 ms), not for the collective.
const OTHER_STREAM_COPY_TRACE: &str = r###"{
  "traceEvents": [
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 40, "dur": 20, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 100, "dur": 10000, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 12, "ts": 60, "dur": 20, "args": {"correlation": 3}},
  {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20, "ts": 100, "dur": 100000, "args": {"device": 0, "stream": 20, "correlation": 3}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpy", "pid": 10, "tid": 11, "ts": 1000, "dur": 59100, "args": {"correlation": 2}},
  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7, "ts": 60000, "dur": 45, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4194304}}
  ]
}"###;

#[tokio::test]
async fn a_copy_waits_for_its_own_stream_not_for_other_streams() {
    let (_dir, ctx) = session_with_trace(OTHER_STREAM_COPY_TRACE, "s").await;
    let f = text_rows(
        &ctx,
        "SELECT category, impact_ns FROM findings('s') \
         WHERE category IN ('memcpy_wait', 'sync_memcpy') ORDER BY category",
    )
    .await;
    // Against the device's busy time the wait would be 59 ms (1 ms to 60 ms, all under the
    // collective); on the copy's stream it ends with the gemm at 10.1 ms.
    assert_eq!(
        f,
        vec![
            vec!["memcpy_wait".to_string(), (9_100_000).to_string()],
            vec![
                "sync_memcpy".to_string(),
                (59_100_000 - 9_100_000).to_string()
            ],
        ]
    );
}

#[tokio::test]
async fn an_enclosing_stage_log_changes_no_cause_and_no_trace_wall() {
    let cfg = SynthConfig::demo();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("k.json");
    write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
    let plain = Store::open(dir.path().join("plain")).unwrap();
    let staged = Store::open(dir.path().join("staged")).unwrap();
    ingest(&plain, &trace, "k");
    ingest(&staged, &trace, "k");
    let (ctx, staged_ctx) = (
        open_session(&plain).await.unwrap(),
        open_session(&staged).await.unwrap(),
    );
    let span = int_rows(
        &ctx,
        "SELECT min(ts), max(ts + dur) FROM events WHERE run = 'k'",
    )
    .await;
    let (lo, hi) = (span[0][0].unwrap(), span[0][1].unwrap());
    // `inference` encloses the trace by 4 s on each side (epoch ns, JSON lines).
    let log = dir.path().join("stages.jsonl");
    let (begin, end) = (lo - 4_000_000_000, hi + 4_000_000_000);
    std::fs::write(
        &log,
        format!(
            "{{\"ts\": {begin}, \"stage\": \"inference\", \"event\": \"begin\"}}\n\
             {{\"ts\": {end}, \"stage\": \"inference\", \"event\": \"end\"}}\n"
        ),
    )
    .unwrap();
    ingest(&staged, &log, "k");

    let causes =
        "SELECT cause, count(*), sum(dur) FROM gpu_gaps('k') GROUP BY cause ORDER BY cause";
    let without = text_rows(&ctx, causes).await;
    assert!(!without.is_empty(), "{without:?}");
    assert_eq!(text_rows(&staged_ctx, causes).await, without);
    let walls = "SELECT wall, unaccounted FROM breakdown('k')";
    assert_eq!(
        int_rows(&staged_ctx, walls).await,
        int_rows(&ctx, walls).await
    );
    let extended = int_rows(
        &staged_ctx,
        "SELECT wall_with_stages, unaccounted_with_stages + busy FROM breakdown('k')",
    )
    .await;
    assert_eq!(extended, vec![vec![Some(end - begin), Some(end - begin)]]);
    // The stage's share of the rank's time is whole, not more.
    let share = text_rows(
        &staged_ctx,
        "SELECT share_pct FROM stages('k') WHERE kind = 'stage'",
    )
    .await;
    assert_eq!(share, vec![vec!["100.0"]]);
    // The findings' dominant gap cause is the same.
    let top = "SELECT title FROM findings('k') WHERE category = 'idle_gaps'";
    assert_eq!(
        text_rows(&staged_ctx, top).await,
        text_rows(&ctx, top).await
    );
}

#[tokio::test]
async fn a_stage_log_on_another_clock_is_refused_or_converted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let trace = dir.path().join("k.json");
    write_kineto(&SynthConfig::demo(), std::fs::File::create(&trace).unwrap()).unwrap();
    ingest(&store, &trace, "k");
    let ctx = open_session(&store).await.unwrap();
    let count = "SELECT count(*) FROM events WHERE run = 'k'";
    let before = int_rows(&ctx, count).await;
    let span = int_rows(&ctx, "SELECT min(ts) FROM events WHERE run = 'k'").await;
    let lo = span[0][0].unwrap();
    // Six years earlier.
    let off = lo - 6 * 365 * 86_400 * 1_000_000_000;
    let log = dir.path().join("old.jsonl");
    std::fs::write(
        &log,
        format!(
            "{{\"ts\": {off}, \"stage\": \"train\", \"event\": \"begin\"}}\n\
             {{\"ts\": {}, \"stage\": \"train\", \"event\": \"end\"}}\n",
            off + 1_000_000_000
        ),
    )
    .unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new("k").unwrap()),
        ..Default::default()
    };
    let err = gpuq_ingest::ingest(&store, &[log.clone()], &opts, &NoProgress)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("old.jsonl") && err.contains("do not overlap the run's"),
        "{err}"
    );
    assert_eq!(int_rows(&ctx, count).await, before, "the run is unchanged");

    // An Nsight Systems run is on its session clock: the log is converted with the session
    // start its metadata holds.
    let nsys = dir.path().join("n.sqlite");
    write_nsys(&NsysConfig::small(), &nsys).unwrap();
    ingest(&store, &nsys, "n");
    let span = int_rows(&ctx, "SELECT min(ts) FROM events WHERE run = 'n'").await;
    let first = span[0][0].unwrap();
    let session_start: i64 = 1_767_225_600_000_000_000;
    let log = dir.path().join("nsys_stages.jsonl");
    let begin = session_start + first + 1_000;
    std::fs::write(
        &log,
        format!(
            "{{\"ts\": {begin}, \"stage\": \"decode\", \"event\": \"begin\"}}\n\
             {{\"ts\": {}, \"stage\": \"decode\", \"event\": \"end\"}}\n",
            begin + 5_000
        ),
    )
    .unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new("n").unwrap()),
        ..Default::default()
    };
    gpuq_ingest::ingest(&store, &[log], &opts, &NoProgress).unwrap();
    let ctx = open_session(&store).await.unwrap();
    let got = int_rows(
        &ctx,
        "SELECT ts, dur FROM events WHERE run = 'n' AND scope = 'stage'",
    )
    .await;
    assert_eq!(got, vec![vec![Some(first + 1_000), Some(5_000)]]);
}

#[tokio::test]
async fn roofline_says_why_it_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let path = dir.path().join("steps.json");
    std::fs::write(&path, STEPS_TRACE).unwrap();
    ingest(&store, &path, "s");
    let unknown = dir.path().join("roof.json");
    std::fs::write(
        &unknown,
        ROOFLINE_TRACE.replace("NVIDIA H100 80GB HBM3", "NVIDIA Imaginary 9000"),
    )
    .unwrap();
    ingest(&store, &unknown, "u");
    let ctx = open_session(&store).await.unwrap();
    let scope = super::data::Scope::whole();
    let notes = super::roofline::notes(&ctx, "s", &scope).await.unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("no input shapes") && notes[0].contains("record_shapes=True"),
        "{notes:?}"
    );
    let notes = super::roofline::notes(&ctx, "u", &scope).await.unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("GPU model unknown: no datasheet peak for \"NVIDIA Imaginary 9000\""),
        "{notes:?}"
    );
}

/// A run's gaps as `gpu_gaps` lists them, and as [`GapWindows`] finds them a window at a
/// time, over `parts` equal windows: the same rows. Returns how many.
async fn gaps_whole_and_by_window(ctx: &SessionContext, run: &str, parts: i64) -> usize {
    use super::gaps::{gaps_between, GapWindows};
    let whole = text_rows(
        ctx,
        &format!(
            "SELECT rank, pid, device, ts, dur, cause, detail, next_name FROM gpu_gaps('{run}', 0)"
        ),
    )
    .await;
    let mut whole: Vec<String> = whole.into_iter().map(|r| r.join("|")).collect();
    whole.sort();
    let span = int_rows(
        ctx,
        &format!("SELECT min(ts), max(ts) FROM gpu_ops WHERE run = '{run}' AND ts > 0"),
    )
    .await;
    let (lo, hi) = (span[0][0].unwrap(), span[0][1].unwrap() + 1);
    let step = ((hi - lo) / parts).max(1);
    let mut got = Vec::new();
    let mut a = lo;
    // Window after window, as an export reads them; the first also alone.
    let mut windows = GapWindows::start(ctx, run, lo).await.unwrap();
    let first = gaps_between(ctx, run, lo, lo + step, 0).await.unwrap();
    while a < hi {
        let z = (a + step).min(hi);
        let gaps = windows.next(ctx, z, 0).await.unwrap();
        if a == lo {
            assert_eq!(gaps, first);
        }
        for g in gaps {
            let q = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
            got.push(
                [
                    q(g.key.rank.map(i64::from)),
                    q(g.key.pid),
                    q(g.key.device.map(i64::from)),
                    g.start.to_string(),
                    g.dur.to_string(),
                    g.cause.to_string(),
                    g.detail.clone().unwrap_or_default(),
                    g.next_name.clone(),
                ]
                .join("|"),
            );
        }
        a = z;
    }
    got.sort();
    let missing: Vec<&String> = whole.iter().filter(|w| !got.contains(w)).take(4).collect();
    let extra: Vec<&String> = got.iter().filter(|g| !whole.contains(g)).take(4).collect();
    assert!(
        got == whole,
        "{run} in {parts} windows: {} gaps, {} whole; missing {missing:?}; extra {extra:?}",
        got.len(),
        whole.len()
    );
    whole.len()
}

#[tokio::test]
async fn gaps_read_a_window_at_a_time_are_the_whole_runs_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    // Nsight Systems: two processes, profiler overhead counted as work.
    let n = dir.path().join("n.sqlite");
    write_nsys(&NsysConfig::small(), &n).unwrap();
    ingest(&store, &n, "n");
    // Kineto: steps, syncs, data loading, launches queued ahead.
    let k = dir.path().join("k.json");
    write_kineto(&SynthConfig::demo(), std::fs::File::create(&k).unwrap()).unwrap();
    ingest(&store, &k, "k");
    let ctx = open_session(&store).await.unwrap();
    for run in ["n", "k"] {
        for parts in [1, 3, 17, 400] {
            assert!(gaps_whole_and_by_window(&ctx, run, parts).await > 10);
        }
    }
}

#[tokio::test]
async fn gaps_read_a_window_at_a_time_are_the_whole_runs_gaps_on_real_traces() {
    let Some(nsys) = gpuq_testkit::shared_traces("nsys") else {
        return;
    };
    let Some(kineto) = gpuq_testkit::shared_traces("kineto") else {
        return;
    };
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&nsys)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sqlite"))
        .collect();
    files.sort();
    // Small Kineto traces of every shape: CUDA, ROCm, multi-stream event syncs.
    for rel in [
        "hta/critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz",
        "hta/amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "kineto_tb_plugin/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    ] {
        files.push(kineto.join(rel));
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    for (i, f) in files.iter().enumerate() {
        ingest(&store, f, &format!("t{i}"));
    }
    let ctx = open_session(&store).await.unwrap();
    for i in 0..files.len() {
        for parts in [5, 61] {
            gaps_whole_and_by_window(&ctx, &format!("t{i}"), parts).await;
        }
    }
}

/// A run whose profiler flushed its buffers for 300 us of a 1 ms window (two flushes that
/// overlap by 50 us) and launched two kernels with 50 us and 70 us calls.
const OVERHEAD_TRACE: &str = r###"{
  "traceEvents": [
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 1000, "dur": 50, "args": {"correlation": 1}},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1100, "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 1}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 1200, "dur": 70, "args": {"correlation": 2}},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1900, "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 2}},
  {"ph": "X", "cat": "overhead", "name": "Buffer Flush", "pid": 10, "tid": 12, "ts": 1300, "dur": 200},
  {"ph": "X", "cat": "overhead", "name": "Buffer Flush", "pid": 10, "tid": 13, "ts": 1450, "dur": 150}
  ]
}"###;

#[tokio::test]
async fn profiler_overhead_counts_recorded_work_once_and_findings_warn_of_it() {
    let (_dir, ctx) = session_with_trace(OVERHEAD_TRACE, "o").await;
    let rows = text_rows(
        &ctx,
        "SELECT kind, name, instances, total, med, max, \"window\", share_pct \
         FROM profiler_overhead('o')",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            vec![
                "recorded",
                "Buffer Flush",
                "2",
                "300000",
                "175000.0",
                "200000",
                "1000000",
                "30.0"
            ],
            vec![
                "launch_calls",
                "cudaLaunchKernel",
                "2",
                "120000",
                "60000.0",
                "70000",
                "1000000",
                "12.0"
            ],
        ]
    );
    let f = text_rows(
        &ctx,
        "SELECT severity, title, impact_ns FROM findings('o') WHERE category = 'profiler_overhead'",
    )
    .await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0][0], "medium", "never high: {f:?}");
    assert!(
        f[0][1].contains("30.0%") && f[0][1].contains("Buffer Flush"),
        "{f:?}"
    );
    assert_eq!(f[0][2], "300000");
}

/// Step busy read a window of operations at a time equals `step_stats`' gpu_busy, however
/// small the windows; the windows partition the span.
#[tokio::test]
async fn step_busy_a_window_at_a_time_is_step_stats_busy() {
    let cfg = SynthConfig {
        steps: 6,
        ..SynthConfig::small()
    };
    let mut text = Vec::new();
    write_kineto(&cfg, &mut text).unwrap();
    let (_dir, ctx) = session_with_trace(std::str::from_utf8(&text).unwrap(), "w").await;
    let rows = int_rows(
        &ctx,
        "SELECT s.rank, s.ts, s.ts + s.dur, t.gpu_busy FROM steps s \
         JOIN step_stats('w') t ON s.step = t.step WHERE s.run = 'w' AND s.dur > 0 ORDER BY s.ts",
    )
    .await;
    assert_eq!(rows.len(), 6);
    let steps: Vec<(Option<i32>, i64, i64)> = rows
        .iter()
        .map(|r| (r[0].map(|v| v as i32), r[1].unwrap(), r[2].unwrap()))
        .collect();
    let want: Vec<i64> = rows.iter().map(|r| r[3].unwrap()).collect();
    assert!(want.iter().all(|&b| b > 0), "{want:?}");
    let (lo, hi) = (steps[0].1, steps.iter().map(|s| s.2).max().unwrap());
    let windows = super::data::op_windows(&ctx, "w", lo, hi, 7).await.unwrap();
    assert!(windows.len() > 10, "{windows:?}");
    assert_eq!((windows[0].0, windows[windows.len() - 1].1), (lo, hi));
    assert!(windows
        .windows(2)
        .all(|w| w[0].1 == w[1].0 && w[0].0 < w[0].1));
    for per_window in [7, 100, 1_000_000] {
        let got = super::stages::busy_within_windows(&ctx, "w", &steps, per_window)
            .await
            .unwrap();
        assert_eq!(got, want, "{per_window} operations a window");
    }
}
