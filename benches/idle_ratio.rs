//! Benchmark: `idle_ratio(ts, dur)` and `busy_time(ts, dur)` `GROUP BY run, device` against
//! `sum(dur)` `GROUP BY run, device` on the same rows (issue #4: within 2x).
//!
//! ```text
//! cargo run --release --example idle_ratio_bench -- [ROWS]     # default 100000000
//! ```
//!
//! The rows live in memory (a `MemTable`, one partition per core), so the figure is the cost
//! of the aggregate itself, not of Parquet decoding (which would hide it). They are laid out
//! as the store lays them out: per run and device, 4 streams one after the other, each sorted
//! by `ts`, so every group sees out-of-order starts where one stream ends and the next begins;
//! kernels on different streams overlap. 500 runs x 2 devices = 1,000 groups. Each query runs
//! once to warm up, then 3 times; the median is reported. The results are checked against a
//! brute-force union computed here.

use datafusion::arrow::array::{
    AsArray, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Int32Type, Int64Type, Schema, SchemaRef,
};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

const RUNS: usize = 500;
const DEVICES: usize = 2;
const STREAMS: usize = 4;
const BATCH_ROWS: usize = 1 << 20;

/// A small, fast, deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "run",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            false,
        ),
        Field::new("device", DataType::Int32, false),
        Field::new("ts", DataType::Int64, false),
        Field::new("dur", DataType::Int64, false),
    ]))
}

/// Generates the rows in batches, and the exact busy time and span of every group.
fn generate(rows: usize) -> (Vec<RecordBatch>, HashMap<(i32, i32), (i64, i64, i64)>) {
    let per_stream = rows.div_ceil(RUNS * DEVICES * STREAMS);
    let names = Arc::new(StringArray::from_iter_values(
        (0..RUNS).map(|r| format!("run-{r:03}")),
    ));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut batches = Vec::new();
    let mut truth = HashMap::new();
    let (mut run_col, mut dev_col, mut ts_col, mut dur_col) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let flush = |run: &mut Vec<i32>,
                 dev: &mut Vec<i32>,
                 ts: &mut Vec<i64>,
                 dur: &mut Vec<i64>,
                 out: &mut Vec<RecordBatch>| {
        let keys = Int32Array::from(std::mem::take(run));
        let run = DictionaryArray::<Int32Type>::try_new(keys, names.clone()).unwrap();
        out.push(
            RecordBatch::try_new(
                schema(),
                vec![
                    Arc::new(run),
                    Arc::new(Int32Array::from(std::mem::take(dev))),
                    Arc::new(Int64Array::from(std::mem::take(ts))),
                    Arc::new(Int64Array::from(std::mem::take(dur))),
                ],
            )
            .unwrap(),
        );
    };
    let mut intervals = Vec::with_capacity(per_stream * STREAMS);
    'all: for run in 0..RUNS as i32 {
        for device in 0..DEVICES as i32 {
            intervals.clear();
            for _stream in 0..STREAMS {
                // Epoch-ns timestamps, as in real runs; kernels of 1-200 us with gaps of 0-50 us.
                let mut t = 1_700_000_000_000_000_000 + rng.below(1_000_000);
                for _ in 0..per_stream {
                    if run_col.len() + batches.len() * BATCH_ROWS >= rows {
                        break;
                    }
                    let d = 1_000 + rng.below(199_000);
                    run_col.push(run);
                    dev_col.push(device);
                    ts_col.push(t);
                    dur_col.push(d);
                    intervals.push((t, t + d));
                    t += d + rng.below(50_000);
                    if run_col.len() == BATCH_ROWS {
                        flush(
                            &mut run_col,
                            &mut dev_col,
                            &mut ts_col,
                            &mut dur_col,
                            &mut batches,
                        );
                    }
                }
            }
            if !intervals.is_empty() {
                truth.insert((run, device), union_and_span(&mut intervals));
            }
            if run_col.len() + batches.len() * BATCH_ROWS >= rows {
                break 'all;
            }
        }
    }
    if !run_col.is_empty() {
        flush(
            &mut run_col,
            &mut dev_col,
            &mut ts_col,
            &mut dur_col,
            &mut batches,
        );
    }
    (batches, truth)
}

/// (busy, first start, last end) of a set of intervals, by sorting them.
fn union_and_span(iv: &mut [(i64, i64)]) -> (i64, i64, i64) {
    iv.sort_unstable();
    let (mut busy, mut cur) = (0, iv[0]);
    let mut hi = iv[0].1;
    for &(s, e) in &iv[1..] {
        hi = hi.max(e);
        if s > cur.1 {
            busy += cur.1 - cur.0;
            cur = (s, e);
        } else {
            cur.1 = cur.1.max(e);
        }
    }
    busy += cur.1 - cur.0;
    (busy, iv[0].0, hi)
}

async fn median_secs(ctx: &SessionContext, sql: &str) -> (f64, Vec<RecordBatch>) {
    let mut out = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        out = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    (times[1], out)
}

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .map(|a| a.replace('_', "").parse().expect("ROWS must be a number"))
        .unwrap_or(100_000_000);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let t = Instant::now();
        let (batches, truth) = generate(rows);
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        println!(
            "generated {total} rows in {} groups in {:.1} s",
            truth.len(),
            t.elapsed().as_secs_f64()
        );
        // One partition per core, each a contiguous slice of the rows, as file scans give.
        let per = batches.len().div_ceil(threads);
        let partitions: Vec<Vec<RecordBatch>> =
            batches.chunks(per.max(1)).map(|c| c.to_vec()).collect();
        drop(batches);
        let ctx = SessionContext::new_with_config(gpuq_query::session_config());
        gpuq_query::functions::register_all(&ctx);
        ctx.register_table(
            "k",
            Arc::new(MemTable::try_new(schema(), partitions).unwrap()),
        )
        .unwrap();

        let (sum_s, sum_out) = median_secs(
            &ctx,
            "SELECT run, device, sum(dur) AS v FROM k GROUP BY run, device",
        )
        .await;
        let (busy_s, busy_out) = median_secs(
            &ctx,
            "SELECT run, device, busy_time(ts, dur) AS v FROM k GROUP BY run, device",
        )
        .await;
        let (idle_s, idle_out) = median_secs(
            &ctx,
            "SELECT run, device, idle_ratio(ts, dur) AS v FROM k GROUP BY run, device",
        )
        .await;

        // Check every group against the brute-force union.
        let key = |b: &RecordBatch, r: usize| {
            let run = b.column(0).as_dictionary::<Int32Type>();
            let name = run
                .values()
                .as_string::<i32>()
                .value(run.keys().value(r) as usize);
            let run: i32 = name[4..].parse().unwrap();
            (run, b.column(1).as_primitive::<Int32Type>().value(r))
        };
        let mut checked = 0;
        for b in &busy_out {
            for r in 0..b.num_rows() {
                let got = b.column(2).as_primitive::<Int64Type>().value(r);
                assert_eq!(got, truth[&key(b, r)].0, "busy_time of {:?}", key(b, r));
                checked += 1;
            }
        }
        for b in &idle_out {
            for r in 0..b.num_rows() {
                let (busy, lo, hi) = truth[&key(b, r)];
                let want = 1.0 - busy as f64 / (hi - lo) as f64;
                let got = b.column(2).as_primitive::<Float64Type>().value(r);
                assert!((got - want).abs() < 1e-12, "idle_ratio of {:?}", key(b, r));
            }
        }
        assert_eq!(checked, truth.len());
        assert_eq!(
            sum_out.iter().map(|b| b.num_rows()).sum::<usize>(),
            truth.len()
        );
        println!("results equal the brute-force union for all {checked} groups");
        println!("sum(dur)          {sum_s:.3} s");
        println!(
            "busy_time(ts,dur) {busy_s:.3} s  ({:.2}x sum)",
            busy_s / sum_s
        );
        println!(
            "idle_ratio(ts,dur) {idle_s:.3} s  ({:.2}x sum; target <= 2x)",
            idle_s / sum_s
        );
    });
}
