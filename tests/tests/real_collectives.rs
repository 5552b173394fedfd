//! `collectives` on the real Kineto traces of `../shared/traces/kineto`: every row's message
//! size, dtype, group size and bandwidths equal an independent computation from the raw JSON
//! (serde_json; sizes from the kernel's args or its `record_param_comms`, nccl-tests' factors
//! written out again here), and on the 8-rank DLRM job the waits, transfers and last ranks
//! equal a brute-force matching of the ranks' kernels.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::prelude::SessionContext;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::{IngestOptions, NoProgress};
use gpuq_query::analyses::collectives::{self, CollectiveCall};
use gpuq_query::analyses::data::Scope;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

fn ingest_as(store: &Store, paths: &[std::path::PathBuf], run: &str) {
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        ..Default::default()
    };
    gpuq_ingest::ingest(store, paths, &opts, &NoProgress).unwrap();
}

fn read_json(path: &Path) -> Value {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut text)
        .unwrap();
    serde_json::from_slice(&text).unwrap()
}

/// A collective kernel as the raw JSON has it, with its message fields.
#[derive(Debug, Clone)]
struct RawKernel {
    rank: Option<i64>,
    name: String,
    ts_us: f64,
    ts_ns: i64,
    dur: i64,
    args: Option<Value>,
}

/// Microseconds (as written) to the nearest ns: exact for integers (epoch µs do not fit an
/// f64 in ns).
fn ns(v: &Value) -> i64 {
    match v.as_i64() {
        Some(us) => us * 1000,
        None => (v.as_f64().unwrap() * 1000.0).round() as i64,
    }
}

/// The communication kernels of one raw trace (names with nccl/rccl, and the symmetric-memory
/// all-reduce of the B200 trace), by start, each with the args that carry its message: its
/// own, else those of the `record_param_comms` around its launch call (same pid and tid), else
/// those of the `record_param_comms` with its External id when the launch is not in the trace.
fn raw_kernels(path: &Path) -> Vec<RawKernel> {
    let v = read_json(path);
    let rank = v["distributedInfo"]["rank"].as_i64();
    let events = v["traceEvents"].as_array().unwrap();
    let has_message = |a: &Value| a.get("Collective name").is_some();
    let comms: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "record_param_comms" && e["ph"] == "X" && has_message(&e["args"]))
        .collect();
    let mut launches: HashMap<i64, &Value> = HashMap::new();
    for e in events {
        let cat = e["cat"].as_str().unwrap_or("");
        if matches!(cat, "cuda_runtime" | "cuda_driver") {
            if let Some(c) = e["args"]["correlation"].as_i64() {
                launches.insert(c, e);
            }
        }
    }
    let mut out = Vec::new();
    for e in events {
        if e["cat"] != "kernel" || e["ph"] != "X" {
            continue;
        }
        let name = e["name"].as_str().unwrap().to_string();
        let low = name.to_lowercase();
        let nccl = low.contains("nccl") || low.contains("rccl");
        if !nccl && !low.contains("multimem_all_reduce") {
            continue;
        }
        let a = &e["args"];
        let args = if !nccl {
            None
        } else if has_message(a) {
            Some(a.clone())
        } else if let Some(l) = a["correlation"].as_i64().and_then(|c| launches.get(&c)) {
            let (s, end) = (ns(&l["ts"]), ns(&l["ts"]) + ns(&l["dur"]));
            comms
                .iter()
                .filter(|o| o["pid"] == l["pid"] && o["tid"] == l["tid"])
                .filter(|o| ns(&o["ts"]) <= s && ns(&o["ts"]) + ns(&o["dur"]) >= end)
                .max_by_key(|o| ns(&o["ts"]))
                .map(|o| o["args"].clone())
        } else {
            comms
                .iter()
                .find(|o| {
                    o["args"]["External id"] == a["External id"] && !a["External id"].is_null()
                })
                .map(|o| o["args"].clone())
        };
        out.push(RawKernel {
            rank,
            name,
            ts_us: e["ts"].as_f64().unwrap(),
            ts_ns: ns(&e["ts"]),
            dur: ns(&e["dur"]),
            args,
        });
    }
    out.sort_by(|a, b| a.ts_us.total_cmp(&b.ts_us));
    out
}

/// nccl-tests' (doc/PERFORMANCE.md) size S and bus bandwidth factor of the collectives these
/// traces hold, from the raw args.
fn expected_size(args: &Value) -> (i64, f64) {
    let n = args["Group size"].as_i64().unwrap() as f64;
    let elem = match args["dtype"].as_str().unwrap() {
        "Float" => 4,
        "BFloat16" | "Half" => 2,
        "Long" | "Double" => 8,
        "Byte" | "Char" | "Bool" => 1,
        other => panic!("dtype {other} not in this test's table"),
    };
    let (inn, out) = (
        args["In msg nelems"].as_i64().unwrap(),
        args["Out msg nelems"].as_i64().unwrap(),
    );
    match args["Collective name"].as_str().unwrap() {
        "allreduce" => (inn * elem, 2.0 * (n - 1.0) / n),
        "broadcast" => (inn * elem, 1.0),
        "_allgather_base" | "allgather" | "all_gather" => (out * elem, (n - 1.0) / n),
        "reduce_scatter" | "_reduce_scatter_base" => (inn * elem, (n - 1.0) / n),
        other => panic!("collective {other} not in this test's table"),
    }
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
        (None, None) => true,
        _ => false,
    }
}

/// Checks every row against the raw kernels (both in start order per rank).
fn check_rows(file: &Path, rows: &[CollectiveCall], raw: &[RawKernel]) {
    let what = file.display();
    assert_eq!(rows.len(), raw.len(), "{what}: rows");
    for (i, (r, k)) in rows.iter().zip(raw).enumerate() {
        let at = format!("{what}: row {i} ({})", k.name);
        assert_eq!(r.name, k.name, "{at}");
        assert_eq!(r.dur, k.dur, "{at}");
        assert_eq!(r.rank.map(i64::from), k.rank, "{at}");
        let text = |key: &str| {
            k.args
                .as_ref()
                .and_then(|a| a[key].as_str().map(String::from))
        };
        let int = |key: &str| k.args.as_ref().and_then(|a| a[key].as_i64());
        assert_eq!(r.collective, text("Collective name"), "{at}");
        assert_eq!(r.process_group, text("Process Group Name"), "{at}");
        assert_eq!(r.dtype, text("dtype"), "{at}");
        assert_eq!(r.group_size, int("Group size"), "{at}");
        assert_eq!(r.in_nelems, int("In msg nelems"), "{at}");
        assert_eq!(r.out_nelems, int("Out msg nelems"), "{at}");
        let (bytes, algbw, busbw) = match &k.args {
            Some(a) => {
                let (s, factor) = expected_size(a);
                let algbw = s as f64 / k.dur as f64;
                (Some(s), Some(algbw), Some(algbw * factor))
            }
            None => (None, None, None),
        };
        assert_eq!(r.bytes, bytes, "{at}");
        assert!(
            close(r.algbw_gbps, algbw),
            "{at}: algbw {:?} vs {algbw:?}",
            r.algbw_gbps
        );
        assert!(
            close(r.busbw_gbps, busbw),
            "{at}: busbw {:?} vs {busbw:?}",
            r.busbw_gbps
        );
        let ring = k.name.contains("_RING_");
        assert_eq!(r.algorithm, ring.then_some("RING"), "{at}");
        if k.name.contains("_RING_LL_") || k.name.contains("_RING_LL(") {
            assert_eq!(r.protocol, Some("LL"), "{at}");
        }
    }
}

async fn load(ctx: &SessionContext, run: &str) -> Vec<CollectiveCall> {
    collectives::load(ctx, run, &Scope::whole()).await.unwrap()
}

/// `SELECT count(*), sum(bytes) FROM collectives(run)`: the table function returns what
/// `load` does.
async fn sql_count_and_bytes(ctx: &SessionContext, run: &str) -> (i64, Option<i64>) {
    let sql = format!("SELECT count(*), sum(bytes) FROM collectives('{run}')");
    let b = &ctx.sql(&sql).await.unwrap().collect().await.unwrap()[0];
    let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Int64).unwrap();
    let s = datafusion::arrow::compute::cast(b.column(1), &DataType::Int64).unwrap();
    let (c, s) = (c.as_primitive::<Int64Type>(), s.as_primitive::<Int64Type>());
    (c.value(0), (!s.is_null(0)).then(|| s.value(0)))
}

#[tokio::test]
async fn sizes_and_bandwidths_equal_the_raw_args_on_one_rank_traces() {
    let Some(dir) = gpuq_testkit::shared_traces("kineto") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let traces = [
        ("nccl", "hta/nccl_parser_config__nccl_data.json.gz"),
        ("mi300", "tracelens/mi300__resnet_act_checkpoint.json.gz"),
        ("b200", "tracelens/b200__eager_trace.json.gz"),
        (
            "nsres",
            "hta/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        ),
    ];
    for (run, file) in traces {
        ingest_as(&store, &[dir.join(file)], run);
    }
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let mut sized = 0;
    for (run, file) in traces {
        let path = dir.join(file);
        let rows = load(&ctx, run).await;
        let raw = raw_kernels(&path);
        check_rows(&path, &rows, &raw);
        sized += rows.iter().filter(|r| r.bytes.is_some()).count();
        // One rank of each job: nothing to match across ranks.
        assert!(rows
            .iter()
            .all(|r| r.wait.is_none() && r.last_rank.is_none() && r.ranks == 1));
        let bytes: i64 = rows.iter().filter_map(|r| r.bytes).sum();
        let want = (
            rows.len() as i64,
            rows.iter().any(|r| r.bytes.is_some()).then_some(bytes),
        );
        assert_eq!(sql_count_and_bytes(&ctx, run).await, want, "{run}");
        let mut by: BTreeMap<(Option<String>, Option<String>), Vec<f64>> = BTreeMap::new();
        for r in &rows {
            let key = (r.collective.clone(), r.dtype.clone());
            by.entry(key).or_default().extend(r.busbw_gbps);
        }
        for ((c, d), bw) in by.into_iter().filter(|(_, bw)| !bw.is_empty()) {
            let mean = bw.iter().sum::<f64>() / bw.len() as f64;
            eprintln!(
                "{run}: {c:?} {d:?}: {} sized kernels, mean busbw {mean:.2} GB/s",
                bw.len()
            );
        }
    }
    // The shapes this test is about: sized kernels on three traces (21 + 12 + 1), the B200's
    // 73 symmetric-memory all-reduces unsized, and no collective kernel in the ns trace.
    assert_eq!(sized, 34);
    assert_eq!(load(&ctx, "b200").await.len(), 74);
    assert!(load(&ctx, "nsres").await.is_empty());
    let mi300 = load(&ctx, "mi300").await;
    assert_eq!(
        mi300
            .iter()
            .filter(|r| r.sizes_from == Some("kernel"))
            .count(),
        12
    );
    // A step range keeps the kernels launched in it.
    let steps = format!(
        "SELECT count(*) FROM collectives('mi300', '{}')",
        mi300.iter().filter_map(|r| r.step).max().unwrap()
    );
    let b = &ctx.sql(&steps).await.unwrap().collect().await.unwrap()[0];
    let last = mi300.iter().filter_map(|r| r.step).max();
    let want = mi300
        .iter()
        .filter(|r| r.step.is_some() && r.step == last)
        .count() as i64;
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), want);
}

/// The summary the `gpuq collectives` command prints: per collective, algorithm, protocol and
/// group size.
const SUMMARY: &str = "WITH c AS (SELECT * FROM collectives('dlrm')),
k AS (SELECT coalesce(collective, name) AS collective, algorithm, protocol, group_size, * EXCLUDE (collective, algorithm, protocol, group_size) FROM c),
l AS (SELECT collective, algorithm, protocol, group_size, last_rank, count(*) AS n FROM k
      WHERE rank = last_rank GROUP BY 1, 2, 3, 4, 5),
m AS (SELECT collective, algorithm, protocol, group_size,
             first_value(last_rank ORDER BY n DESC, last_rank) AS last_rank_mode,
             max(n) AS last_rank_calls FROM l GROUP BY 1, 2, 3, 4)
SELECT k.collective, k.algorithm, k.protocol, k.group_size,
       count(DISTINCT concat(coalesce(k.process_group, ''), '/', k.name, '/', k.instance)) AS calls,
       count(*) AS kernels, sum(k.dur) AS total, sum(k.bytes) AS bytes,
       median(k.busbw_gbps) AS busbw_med,
       100.0 * sum(k.wait) / sum(CASE WHEN k.wait IS NOT NULL THEN k.dur END) AS wait_pct,
       min(m.last_rank_mode) AS last_rank, min(m.last_rank_calls) AS last_rank_calls
FROM k LEFT JOIN m ON k.collective = m.collective
  AND (k.algorithm IS NOT DISTINCT FROM m.algorithm) AND (k.protocol IS NOT DISTINCT FROM m.protocol)
  AND (k.group_size IS NOT DISTINCT FROM m.group_size)
GROUP BY 1, 2, 3, 4 ORDER BY total DESC";

#[tokio::test]
async fn waits_and_last_ranks_of_the_eight_rank_job_equal_a_brute_force_matching() {
    let Some(dir) = gpuq_testkit::shared_traces("kineto/param_dlrm_8rank") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    ingest_as(&store, &[dir.clone()], "dlrm");
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let rows = load(&ctx, "dlrm").await;
    let files = gpuq_testkit::trace_files(&dir);
    let per_rank: Vec<Vec<RawKernel>> = files.iter().map(|f| raw_kernels(f)).collect();
    assert_eq!(per_rank.len(), 8);
    // Rows come by rank, then start: check each rank's against its file.
    let mut at = 0;
    for (file, raw) in files.iter().zip(&per_rank) {
        check_rows(file, &rows[at..at + raw.len()], raw);
        at += raw.len();
    }
    assert_eq!(at, rows.len());
    // This job's traces carry no message sizes (its record_param_comms only have Input Dims).
    assert!(rows
        .iter()
        .all(|r| r.bytes.is_none() && r.collective.is_none()));
    // Brute force: the k-th kernel of a name on each rank is one call.
    let mut i = 0;
    let (mut waited, mut total) = (0i64, 0i64);
    let mut last_counts: BTreeMap<i64, i64> = BTreeMap::new();
    for raw in &per_rank {
        for (j, k) in raw.iter().enumerate() {
            let instance = raw[..j].iter().filter(|o| o.name == k.name).count();
            let mut starts: Vec<(i64, i64)> = Vec::new();
            for other in &per_rank {
                if let Some(o) = other.iter().filter(|o| o.name == k.name).nth(instance) {
                    starts.push((o.ts_ns, o.rank.unwrap()));
                }
            }
            let (last, last_rank) = *starts.iter().max().unwrap();
            let first = starts.iter().map(|s| s.0).min().unwrap();
            let wait = (last - k.ts_ns).clamp(0, k.dur);
            let r = &rows[i];
            let what = format!("rank {:?} kernel {j} ({})", k.rank, k.name);
            assert_eq!(r.ts, k.ts_ns, "{what}");
            assert_eq!(r.instance, instance as i64, "{what}");
            assert_eq!(r.ranks, starts.len() as i64, "{what}");
            assert_eq!(r.wait, Some(wait), "{what}");
            assert_eq!(r.transfer, Some(k.dur - wait), "{what}");
            let want_last = (last > first).then_some(last_rank as i32);
            assert_eq!(r.last_rank, want_last, "{what}");
            if want_last == r.rank {
                *last_counts.entry(last_rank).or_default() += 1;
            }
            waited += wait;
            total += k.dur;
            i += 1;
        }
    }
    eprintln!(
        "dlrm: {} kernels, {:.1} % of their time waiting; calls each rank arrived last at: {last_counts:?}",
        rows.len(),
        100.0 * waited as f64 / total as f64
    );
    assert!(rows.iter().all(|r| r.ranks == 8));
    // The summary statement runs, and adds up.
    let batches = ctx.sql(SUMMARY).await.unwrap().collect().await.unwrap();
    let (mut kernels, mut calls) = (0, 0);
    for b in &batches {
        let i64s = |name: &str| {
            let c = b.column_by_name(name).unwrap();
            datafusion::arrow::compute::cast(c, &DataType::Int64).unwrap()
        };
        kernels += i64s("kernels")
            .as_primitive::<Int64Type>()
            .iter()
            .flatten()
            .sum::<i64>();
        calls += i64s("calls")
            .as_primitive::<Int64Type>()
            .iter()
            .flatten()
            .sum::<i64>();
        let wait = b.column_by_name("wait_pct").unwrap();
        let wait = datafusion::arrow::compute::cast(wait, &DataType::Float64).unwrap();
        assert!(wait
            .as_primitive::<Float64Type>()
            .iter()
            .flatten()
            .all(|w| (0.0..=100.0).contains(&w)));
    }
    assert_eq!(kernels, rows.len() as i64);
    assert_eq!(calls, rows.len() as i64 / 8);
}
