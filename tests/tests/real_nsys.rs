//! Every real Nsight Systems export in `../shared/traces/nsys/` ingests, and per-name kernel,
//! memory-operation and CUDA API statistics equal NVIDIA's own `nsys stats` output
//! (`golden/<fixture>/cuda_gpu_kern_sum.csv`, `cuda_gpu_mem_time_sum.csv`, `cuda_api_sum.csv`)
//! row for row, exact to the ns; and the analyses `top_kernels`, `gpu_gaps` and `gpu_util`
//! reproduce `nsys stats` / `nsys analyze` (`cuda_gpu_kern_sum`, `gpu_gaps:gap=0`,
//! `gpu_time_util:threshold=101:chunks=10`) row for row, and `gpu_projection` reproduces
//! `nvtx_gpu_proj_sum`.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use gpuq_engine::{RunId, Store};
use gpuq_ingest::{IngestOptions, NoProgress};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `name -> (count, total, min, max)`.
type Stats = BTreeMap<String, (i64, i64, i64, i64)>;

/// Reads a golden CSV into name -> (count, total, min, max), from the named columns.
fn golden(path: &Path, name_col: &str, count_col: &str) -> Stats {
    let mut r = csv::Reader::from_path(path).unwrap();
    let headers = r.headers().unwrap().clone();
    let col = |h: &str| {
        headers
            .iter()
            .position(|x| x == h)
            .unwrap_or_else(|| panic!("{}: no column {h}", path.display()))
    };
    let (n, c, t, lo, hi) = (
        col(name_col),
        col(count_col),
        col("Total Time (ns)"),
        col("Min (ns)"),
        col("Max (ns)"),
    );
    let mut out = Stats::new();
    for rec in r.records() {
        let rec = rec.unwrap();
        let int = |i: usize| rec[i].parse::<i64>().unwrap();
        let prev = out.insert(rec[n].to_string(), (int(c), int(t), int(lo), int(hi)));
        assert!(
            prev.is_none(),
            "{}: duplicate name {}",
            path.display(),
            &rec[n]
        );
    }
    out
}

async fn stats(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Stats {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Stats::new();
    for b in batches {
        let name = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
        let name = name.as_string::<i32>();
        let ints: Vec<_> = (1..5)
            .map(|i| datafusion::arrow::compute::cast(b.column(i), &DataType::Int64).unwrap())
            .collect();
        for row in 0..b.num_rows() {
            let v = |i: usize| ints[i].as_primitive::<Int64Type>().value(row);
            assert!(!name.is_null(row));
            out.insert(name.value(row).to_string(), (v(0), v(1), v(2), v(3)));
        }
    }
    out
}

#[tokio::test]
async fn every_real_nsys_export_matches_nsys_stats() {
    let Some(dir) = gpuq_testkit::shared_traces("nsys") else {
        return;
    };
    let mut fixtures: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sqlite"))
        .collect();
    fixtures.sort();
    assert_eq!(fixtures.len(), 7, "expected the 7 shared nsys exports");
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let mut compared = 0;
    for (i, file) in fixtures.iter().enumerate() {
        let run = format!("n{i}");
        let opts = IngestOptions {
            run: Some(RunId::new(&run).unwrap()),
            ..Default::default()
        };
        gpuq_ingest::ingest(&store, std::slice::from_ref(file), &opts, &NoProgress)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let g = dir.join("golden").join(&stem);
        let q = |view: &str| {
            format!(
                "SELECT name, count(*), sum(dur), min(dur), max(dur) FROM {view} \
                 WHERE run = '{run}' GROUP BY name"
            )
        };
        let want = golden(&g.join("cuda_gpu_kern_sum.csv"), "Name", "Instances");
        assert!(!want.is_empty(), "{stem}: golden kernel summary is empty");
        assert_eq!(stats(&ctx, &q("kernels")).await, want, "{stem}: kernels");
        let want = golden(&g.join("cuda_gpu_mem_time_sum.csv"), "Operation", "Count");
        let got = stats(
            &ctx,
            &format!(
                "SELECT name, count(*), sum(dur), min(dur), max(dur) FROM events \
                 WHERE run = '{run}' AND kind IN ('memcpy', 'memset') GROUP BY name"
            ),
        )
        .await;
        assert_eq!(got, want, "{stem}: memory operations");
        let want = golden(&g.join("cuda_api_sum.csv"), "Name", "Num Calls");
        assert_eq!(
            stats(&ctx, &q("runtime")).await,
            want,
            "{stem}: CUDA API calls"
        );
        compared += 1;
    }
    assert_eq!(compared, 7);
}

#[tokio::test]
async fn nsys_gpu_work_is_attributed_to_its_launch_in_the_same_process() {
    let Some(dir) = gpuq_testkit::shared_traces("nsys") else {
        return;
    };
    // Two processes (ranks) in one export: correlation ids repeat across them.
    let file = dir.join("nsysai_h100_2gpu_1s.sqlite");
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    gpuq_ingest::ingest(&store, &[file], &IngestOptions::default(), &NoProgress).unwrap();
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    // A kernel joined to the runtime call with its correlation id in its own process has
    // that call's step, op and scope (attribution went to the right process's launch).
    let sql = "SELECT count(*) AS n, count(DISTINCT k.pid) AS pids, \
               sum(CASE WHEN (k.step IS NOT DISTINCT FROM r.step) AND (k.op IS NOT DISTINCT FROM r.op) \
               AND (k.scope IS NOT DISTINCT FROM r.scope) THEN 1 ELSE 0 END) AS same, \
               count(k.op) AS with_op \
               FROM kernels k JOIN runtime r \
               ON k.run = r.run AND k.correlation = r.correlation AND k.pid = r.pid";
    let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let n = b[0].column(0).as_primitive::<Int64Type>().value(0);
    let pids = b[0].column(1).as_primitive::<Int64Type>().value(0);
    let same = b[0].column(2).as_primitive::<Int64Type>().value(0);
    let with_op = b[0].column(3).as_primitive::<Int64Type>().value(0);
    // Independently, in SQLite: kernels with a runtime call of the same correlation id in
    // the same process (matching on correlation id alone would pair more).
    let db = rusqlite::Connection::open(dir.join("nsysai_h100_2gpu_1s.sqlite")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    let want = count(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM \
         CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId \
         AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid)",
    );
    let any_process = count(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM \
         CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId)",
    );
    assert!(
        any_process > want,
        "the fixture has cross-process id collisions"
    );
    assert_eq!(
        n, want,
        "kernels joined to their launch in their own process"
    );
    assert_eq!(pids, 2);
    assert_eq!(same, n, "a kernel's step, op and scope are its launch's");
    // This export's NVTX ranges are all PyTorch operators (`aten::view, op_id = 314290`).
    let enclosed = count(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r \
         ON r.correlationId = k.correlationId AND (r.globalTid & 0xFFFFFFFFFF000000) = k.globalPid \
         WHERE EXISTS (SELECT 1 FROM NVTX_EVENTS e WHERE e.globalTid = r.globalTid \
         AND e.start <= r.start AND e.end > r.start AND e.eventType IN (59, 60, 70, 71))",
    );
    assert!(enclosed > 0);
    assert_eq!(
        with_op, enclosed,
        "kernels whose launch is inside an operator range"
    );
    let b = ctx
        .sql("SELECT count(*) FROM kernels WHERE op LIKE 'aten::%' AND op NOT LIKE '%,%'")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(
        b[0].column(0).as_primitive::<Int64Type>().value(0),
        with_op,
        "op is the bare operator name"
    );
    // Kernels of each process carry their process's GPU.
    let sql = "SELECT count(DISTINCT device) FROM kernels GROUP BY pid";
    let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    for batch in b {
        let c = batch.column(0).as_primitive::<Int64Type>();
        assert!(c.iter().all(|v| v == Some(1)), "one GPU per process");
    }
}

/// A float column rendered as nsys prints it (one decimal).
fn one_decimal(c: &dyn Array, row: usize) -> String {
    let c = datafusion::arrow::compute::cast(c, &DataType::Float64).unwrap();
    format!(
        "{:.1}",
        c.as_primitive::<datafusion::arrow::datatypes::Float64Type>()
            .value(row)
    )
}

#[tokio::test]
async fn top_kernels_reproduces_cuda_gpu_kern_sum_row_for_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let Some(fixtures) = ingest_fixtures(&store, None) else {
        return;
    };
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    for (stem, golden, run) in fixtures {
        let sql = format!("SELECT * FROM top_kernels('{run}')");
        let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
        // Our rows as nsys's CSV columns: Time (%), Total, Instances, Avg, Med, Min, Max, StdDev, Name.
        let mut got = Vec::new();
        for b in &batches {
            let col = |n: &str| b.column_by_name(n).unwrap().clone();
            let name = datafusion::arrow::compute::cast(&col("name"), &DataType::Utf8).unwrap();
            for r in 0..b.num_rows() {
                let int = |n: &str| {
                    datafusion::arrow::compute::cast(&col(n), &DataType::Int64)
                        .unwrap()
                        .as_primitive::<Int64Type>()
                        .value(r)
                        .to_string()
                };
                got.push(vec![
                    one_decimal(col("time_pct").as_ref(), r),
                    int("total"),
                    int("instances"),
                    one_decimal(col("avg").as_ref(), r),
                    one_decimal(col("med").as_ref(), r),
                    int("min"),
                    int("max"),
                    one_decimal(col("stddev").as_ref(), r),
                    name.as_string::<i32>().value(r).to_string(),
                ]);
            }
        }
        let mut want = Vec::new();
        let mut rd = csv::Reader::from_path(golden.join("cuda_gpu_kern_sum.csv")).unwrap();
        for rec in rd.records() {
            want.push(rec.unwrap().iter().map(str::to_string).collect::<Vec<_>>());
        }
        assert_eq!(
            got, want,
            "{stem}: top_kernels vs cuda_gpu_kern_sum (in order)"
        );
    }
}

/// Every shared Nsight Systems export, in name order, ingested into `store` as runs `r0`,
/// `r1`, ... (attributing host rows in windows of `window_rows`, default when None): (fixture
/// name, its golden directory, run). None without `../shared`.
fn ingest_fixtures(
    store: &Store,
    window_rows: Option<usize>,
) -> Option<Vec<(String, PathBuf, String)>> {
    let Some(dir) = gpuq_testkit::shared_traces("nsys") else {
        return None;
    };
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sqlite"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let run = format!("r{i}");
        let opts = IngestOptions {
            run: Some(RunId::new(&run).unwrap()),
            window_rows,
            ..Default::default()
        };
        gpuq_ingest::ingest(store, std::slice::from_ref(file), &opts, &NoProgress).unwrap();
        out.push((stem.clone(), dir.join("golden").join(&stem), run));
    }
    assert_eq!(out.len(), 7, "fixtures");
    Some(out)
}

/// Rows of a query as text, each column rendered by arrow (floats with one decimal).
async fn text_rows(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Vec<Vec<String>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in &batches {
        for r in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| match c.data_type() {
                        DataType::Float64 => one_decimal(c.as_ref(), r),
                        _ => datafusion::arrow::util::display::array_value_to_string(c, r).unwrap(),
                    })
                    .collect(),
            );
        }
    }
    out
}

/// A golden CSV's rows, with the named columns in the given order.
fn golden_rows(path: &Path, columns: &[&str]) -> Vec<Vec<String>> {
    rows_of(csv::Reader::from_path(path).unwrap(), columns)
}

/// The named columns of a CSV's rows; none for an empty file (nsys writes one when a report
/// has nothing to say).
fn rows_of<R: std::io::Read>(mut rd: csv::Reader<R>, columns: &[&str]) -> Vec<Vec<String>> {
    let headers = rd.headers().unwrap().clone();
    if headers.is_empty() {
        return Vec::new();
    }
    let idx: Vec<usize> = columns
        .iter()
        .map(|c| {
            headers
                .iter()
                .position(|h| h == *c)
                .unwrap_or_else(|| panic!("{c}"))
        })
        .collect();
    rd.records()
        .map(|rec| {
            let rec = rec.unwrap();
            idx.iter().map(|&i| rec[i].to_string()).collect()
        })
        .collect()
}

#[tokio::test]
async fn gpu_gaps_and_gpu_util_reproduce_nsys_analyze_row_for_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let Some(fixtures) = ingest_fixtures(&store, None) else {
        return;
    };
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let (mut gaps, mut chunks) = (0, 0);
    for (stem, g, run) in fixtures {
        // Row# orders by duration then start; ties across devices are unordered, so compare
        // sorted rows.
        let mut want = golden_rows(
            &g.join("gpu_gaps_gap-0.csv"),
            &["Duration (ns)", "Start (ns)", "PID", "Device ID"],
        );
        let mut got = text_rows(
            &ctx,
            &format!("SELECT dur, ts, pid, device FROM gpu_gaps('{run}', 0)"),
        )
        .await;
        want.sort();
        got.sort();
        assert!(!want.is_empty(), "{stem}: no golden gaps");
        assert_eq!(got.len(), want.len(), "{stem}: gap count");
        assert_eq!(got, want, "{stem}: gpu_gaps gap=0");
        gaps += got.len();

        let mut want = golden_rows(
            &g.join("gpu_time_util_threshold-101_chunks-10.csv"),
            &[
                "In-Use (%)",
                "Duration (ns)",
                "Start (ns)",
                "PID",
                "Device ID",
            ],
        );
        let mut got = text_rows(
            &ctx,
            &format!("SELECT in_use_pct, dur, ts, pid, device FROM gpu_util('{run}', 10, 101)"),
        )
        .await;
        want.sort();
        got.sort();
        assert!(!want.is_empty(), "{stem}: no golden utilisation rows");
        assert_eq!(got, want, "{stem}: gpu_time_util threshold=101 chunks=10");
        chunks += got.len();

        // Unmerged chunks: at most ten per device, tiling the span of its merged row.
        let merged: BTreeMap<(String, String), (String, String)> = got
            .iter()
            .map(|r| ((r[3].clone(), r[4].clone()), (r[2].clone(), r[1].clone())))
            .collect();
        let per_chunk = text_rows(
            &ctx,
            &format!(
                "SELECT pid, device, count(*), min(ts), sum(dur) FROM gpu_util('{run}', 10) \
                 GROUP BY pid, device"
            ),
        )
        .await;
        assert_eq!(per_chunk.len(), merged.len(), "{stem}: devices");
        for row in per_chunk {
            let n: usize = row[2].parse().unwrap();
            assert!((1..=10).contains(&n), "{stem}: {n} chunks");
            let key = (row[0].clone(), row[1].clone());
            assert_eq!(
                merged[&key],
                (row[3].clone(), row[4].clone()),
                "{stem}: {key:?}"
            );
        }
    }
    eprintln!("checked {gaps} gaps and {chunks} utilisation rows against nsys analyze");
}

/// Host rows attributed in windows of 100 rows (NVTX ranges stay open across many windows, and
/// the two-process exports have runtime rows out of time order) store exactly the rows that one
/// window per export stores: every column of every row, attribution included.
#[tokio::test]
async fn real_exports_attributed_in_small_windows_store_the_same_rows() {
    let (one, small) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let one = Store::open(one.path()).unwrap();
    let small = Store::open(small.path()).unwrap();
    if ingest_fixtures(&one, None).is_none() {
        return;
    }
    ingest_fixtures(&small, Some(100)).unwrap();
    let sql = "SELECT run, kind, name, ts, dur, pid, tid, device, stream, correlation, \
               op, scope, step, args FROM events \
               ORDER BY run, kind, ts, name, pid, tid, device, stream, correlation, dur, \
               op, scope, step, args";
    let want = text_rows(&gpuq_query::open_session(&one).await.unwrap(), sql).await;
    let got = text_rows(&gpuq_query::open_session(&small).await.unwrap(), sql).await;
    assert!(want.len() > 50_000, "{} rows", want.len());
    let attributed = want
        .iter()
        .filter(|r| r[1] == "kernel" && !r[10].is_empty() && !r[11].is_empty())
        .count();
    assert!(
        attributed > 1000,
        "{attributed} kernels with an operator and a scope"
    );
    assert_eq!(got.len(), want.len());
    let differing: Vec<_> = want.iter().zip(&got).filter(|(w, g)| w != g).collect();
    assert!(
        differing.is_empty(),
        "{} rows differ, first: {:?}",
        differing.len(),
        differing[0]
    );
}

/// A golden CSV that may be gzip'd (`name.csv` or `name.csv.gz`), as a csv reader.
fn golden_reader(dir: &Path, name: &str) -> Option<csv::Reader<Box<dyn std::io::Read>>> {
    let plain = dir.join(format!("{name}.csv"));
    let gz = dir.join(format!("{name}.csv.gz"));
    let read: Box<dyn std::io::Read> = if plain.exists() {
        Box::new(std::fs::File::open(plain).unwrap())
    } else if gz.exists() {
        Box::new(flate2::read::GzDecoder::new(
            std::fs::File::open(gz).unwrap(),
        ))
    } else {
        return None;
    };
    Some(csv::Reader::from_reader(read))
}

#[tokio::test]
async fn gpu_projection_reproduces_nvtx_gpu_proj_sum_row_for_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let Some(fixtures) = ingest_fixtures(&store, None) else {
        return;
    };
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let columns = [
        "Range",
        "Total Proj Time (ns)",
        "Total Range Time (ns)",
        "Range Instances",
        "Proj Avg (ns)",
        "Proj Med (ns)",
        "Proj Min (ns)",
        "Proj Max (ns)",
        "Proj StdDev (ns)",
        "Total GPU Ops",
        "Avg GPU Ops",
        "Avg Range Lvl",
        "Avg Num Child",
    ];
    let mut checked = 0;
    for (stem, g, run) in fixtures {
        let Some(rd) = golden_reader(&g, "nvtx_gpu_proj_sum") else {
            panic!("{stem}: no nvtx_gpu_proj_sum golden");
        };
        let mut want = rows_of(rd, &columns);
        let mut got = text_rows(
            &ctx,
            &format!(
                "SELECT name, proj_time, range_time, instances, proj_avg, proj_med, proj_min, \
                 proj_max, proj_stddev, gpu_ops, avg_gpu_ops, avg_level, avg_children \
                 FROM gpu_projection('{run}')"
            ),
        )
        .await;
        // Equal totals order by name in both, but nsys's tie order is not ours: compare sorted.
        want.sort();
        got.sort();
        assert_eq!(got.len(), want.len(), "{stem}: ranges");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w, "{stem}: gpu_projection vs nvtx_gpu_proj_sum");
        }
        checked += got.len();
    }
    assert!(checked > 20_000, "{checked} ranges checked");
    eprintln!("checked {checked} ranges against nvtx_gpu_proj_sum");
}

/// An API name without nsys's version suffix.
fn base_name(name: &str) -> String {
    match name.rfind("_v") {
        Some(at) if name[at + 2..].bytes().all(|b| b.is_ascii_digit()) => name[..at].to_string(),
        _ => name.to_string(),
    }
}

/// `profiler_overhead` on the real exports: per name, the recorded rows are `PROFILER_OVERHEAD`'s
/// (count and longest), and per launch API the calls are the runtime table's (count and sum).
#[tokio::test]
async fn profiler_overhead_counts_the_exports_overhead_rows_and_launch_calls() {
    use gpuq_query::analyses::overhead::is_launch_call;
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let Some(fixtures) = ingest_fixtures(&store, None) else {
        return;
    };
    let dir = gpuq_testkit::shared_traces("nsys").unwrap();
    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let mut recorded = 0;
    for (stem, _, run) in fixtures {
        let db = rusqlite::Connection::open(dir.join(format!("{stem}.sqlite"))).unwrap();
        let has = |table: &str| {
            db.query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = ?1",
                [table],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                > 0
        };
        // kind -> name -> [instances, longest or sum]
        let mut want: BTreeMap<(String, String), [i64; 2]> = BTreeMap::new();
        if has("PROFILER_OVERHEAD") {
            let mut q = db
                .prepare(
                    "SELECT s.value, count(*), max(o.end - o.start) FROM PROFILER_OVERHEAD o \
                     JOIN StringIds s ON s.id = o.nameId WHERE o.end >= o.start GROUP BY 1",
                )
                .unwrap();
            for row in q
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
            {
                let (name, n, max) = row.unwrap();
                want.insert(("recorded".into(), name), [n, max]);
            }
        }
        let mut q = db
            .prepare(
                "SELECT s.value, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r \
                 JOIN StringIds s ON s.id = r.nameId WHERE r.end >= r.start",
            )
            .unwrap();
        for row in q
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .unwrap()
        {
            let (name, dur) = row.unwrap();
            // nsys's API names carry a version suffix (`cudaLaunchKernel_v7000`).
            if is_launch_call(&name) {
                let w = want
                    .entry(("launch_calls".into(), base_name(&name)))
                    .or_default();
                w[0] += 1;
                w[1] += dur;
            }
        }
        let rows = text_rows(
            &ctx,
            &format!(
                "SELECT kind, name, sum(instances), \
                   CASE WHEN kind = 'recorded' THEN max(\"max\") ELSE sum(total) END \
                 FROM profiler_overhead('{run}') GROUP BY kind, name"
            ),
        )
        .await;
        let mut got: BTreeMap<(String, String), [i64; 2]> = BTreeMap::new();
        for r in rows {
            let name = if r[0] == "launch_calls" {
                base_name(&r[1])
            } else {
                r[1].clone()
            };
            let g = got.entry((r[0].clone(), name)).or_default();
            g[0] += r[2].parse::<i64>().unwrap();
            g[1] += r[3].parse::<i64>().unwrap();
        }
        assert_eq!(got, want, "{stem}");
        recorded += got.keys().filter(|k| k.0 == "recorded").count();
    }
    assert!(recorded >= 3, "{recorded} recorded overhead names");
}
