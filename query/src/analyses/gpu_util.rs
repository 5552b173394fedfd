//! `gpu_util(run [, chunks [, threshold_pct]])`: how busy each device was over time, as
//! Nsight Systems' `gpu_time_util` rule computes it.
//!
//! Per device timeline (rank, pid, device; operations as in [`gaps`](super::gaps)), the span
//! from the first start to the last end is cut into `chunks` (default 30, 1 to 1000) chunks
//! of `ceil(span / chunks)` ns (the last one shorter, empty ones dropped). A chunk's
//! `in_use_pct` is 100 × the summed time of the operations inside it / its length: concurrent
//! operations add up, so it can exceed 100 ("time" utilisation, not "resource" utilisation).
//!
//! Without `threshold_pct` every chunk is a row. With it, only chunks under the threshold
//! are kept and consecutive kept chunks merge into one row whose `in_use_pct` is their
//! length-weighted mean: Nsight Systems' output (its default threshold is 50).
//! Percentages are rounded to 0.1 like Nsight Systems'.
//!
//! With a step range (`gpu_util('r', 30, NULL, '3..5')`) the span is that of the operations
//! launched in the selected steps.
//!
//! ```sql
//! SELECT device, ts, fmt_dur(dur), in_use_pct FROM gpu_util('llama-bs8', 20) ORDER BY device, ts;
//! SELECT * FROM gpu_util('llama-bs8', 30, 50);  -- nsys analyze --rule gpu_time_util
//! ```

use super::data::{DeviceKey, Op, Timelines};
use super::{batch, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::sync::Arc;

pub const DEFAULT_CHUNKS: i64 = 30;

pub static GPU_UTIL: Spec = Spec {
    name: "gpu_util",
    params: &["chunks", "threshold_pct"],
    schema: schema,
    compute: |ctx, call| compute(ctx, call).boxed(),
    validate: |call| match (call.int(0), call.int(1)) {
        (Some(n), _) if !(1..=1000).contains(&n) => {
            Err(format!("chunks must be between 1 and 1000, got {n}"))
        }
        (_, Some(t)) if t < 0 => Err(format!("threshold_pct must be >= 0, got {t}")),
        _ => Ok(()),
    },
};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("pid", DataType::Int64, true),
        Field::new("device", DataType::Int32, true),
        Field::new("ts", DataType::Int64, false),
        Field::new("dur", DataType::Int64, false),
        Field::new("in_use_pct", DataType::Float64, false),
    ]))
}

/// One chunk (or merged run of chunks) of a device timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub key: DeviceKey,
    pub start: i64,
    pub dur: i64,
    pub in_use_pct: f64,
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The chunks of one device timeline: (start, end, busy ns inside).
fn chunks_of(ops: &[Op], n: i64) -> Vec<(i64, i64, i64)> {
    let (Some(lo), Some(hi)) = (
        ops.iter().map(|o| o.start).min(),
        ops.iter().map(|o| o.end).max(),
    ) else {
        return Vec::new();
    };
    // Float division then ceiling, as the rule's Python does.
    let size = (((hi - lo) as f64) / n as f64).ceil() as i64;
    if size <= 0 {
        return Vec::new();
    }
    let mut chunks: Vec<(i64, i64, i64)> = (0..n)
        .map(|i| (lo + i * size, (lo + (i + 1) * size).min(hi), 0))
        .filter(|c| c.1 > c.0)
        .collect();
    for o in ops {
        if o.end <= o.start {
            continue;
        }
        let first = ((o.start - lo) / size) as usize;
        for c in chunks.iter_mut().skip(first) {
            if c.0 >= o.end {
                break;
            }
            c.2 += o.end.min(c.1) - o.start.max(c.0);
        }
    }
    chunks
}

/// Utilisation chunks of every device timeline; with `threshold`, Nsight Systems' merged
/// under-threshold rows.
pub fn utilisation(timelines: &Timelines, chunks: i64, threshold: Option<f64>) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (key, ops) in &timelines.devices {
        let cs = chunks_of(ops, chunks);
        let pct = |c: &(i64, i64, i64)| 100.0 * c.2 as f64 / (c.1 - c.0) as f64;
        let Some(t) = threshold else {
            out.extend(cs.iter().map(|c| Chunk {
                key: key.clone(),
                start: c.0,
                dur: c.1 - c.0,
                in_use_pct: round1(pct(c)),
            }));
            continue;
        };
        // (start, end, Σ size·pct, Σ size) of the open merged row.
        let mut open: Option<(i64, i64, f64, f64)> = None;
        let mut close = |open: &mut Option<(i64, i64, f64, f64)>| {
            if let Some((s, e, w, n)) = open.take() {
                out.push(Chunk {
                    key: key.clone(),
                    start: s,
                    dur: e - s,
                    in_use_pct: round1(w / n),
                });
            }
        };
        for c in &cs {
            let p = pct(c);
            if p < t {
                let size = (c.1 - c.0) as f64;
                open = Some(match open {
                    Some((s, _, w, n)) => (s, c.1, w + size * p, n + size),
                    None => (c.0, c.1, size * p, size),
                });
            } else {
                close(&mut open);
            }
        }
        close(&mut open);
    }
    out
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let mut timelines = Timelines::load(&ctx, &call.run, true).await?;
    scope.restrict(&mut timelines);
    let rows = utilisation(
        &timelines,
        call.int(0).unwrap_or(DEFAULT_CHUNKS),
        call.int(1).map(|t| t as f64),
    );
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.key.rank))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.key.pid))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.key.device))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.start))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.dur))),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.in_use_pct),
        )),
    ];
    batch(schema(), columns)
}
