use super::data::{DeviceKey, Host, HostCall, Names, Op, OpClass, Range, Timelines};
use super::gaps::device_gaps;
use crate::open_session;
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::execution::context::SessionContext;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::synth::{write_kineto, SynthConfig};
use gpuq_ingest::synth_nsys::{write_nsys, NsysConfig};
use gpuq_ingest::{IngestOptions, NoProgress};
use std::collections::BTreeMap;

fn ingest(store: &Store, path: &std::path::Path, run: &str) {
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        ..Default::default()
    };
    gpuq_ingest::ingest(store, &[path.to_path_buf()], &opts, &NoProgress).unwrap();
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
}

#[tokio::test]
async fn bad_calls_are_plan_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let ctx = open_session(&store).await.unwrap();
    for (sql, want) in [
        ("SELECT * FROM gpu_gaps('nope')", "unknown run nope"),
        ("SELECT * FROM gpu_gaps()", "takes 1 to 2 arguments"),
        ("SELECT * FROM gpu_gaps(3)", "the run must be a string"),
        (
            "SELECT * FROM gpu_util('x', 0)",
            "chunks must be between 1 and 1000",
        ),
        ("SELECT * FROM gpu_gaps('x', -1)", "min_gap_ns must be >= 0"),
        ("SELECT * FROM breakdown('x', 1)", "takes 1 to 1 arguments"),
        (
            "SELECT * FROM gpu_gaps('x', 'y')",
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
