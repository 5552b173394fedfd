//! `launch_stats(run)`: one row per GPU operation with its launch call (HTA's kernel launch
//! statistics and queue length).
//!
//! | column | definition |
//! |---|---|
//! | `launch_name`, `launch_ts`, `launch_dur` | the runtime/driver call with the operation's correlation id (same process) |
//! | `gpu_ts`, `gpu_dur` | the operation itself |
//! | `launch_delay` | `max(0, gpu_ts - (launch_ts + launch_dur))`: how long the work waited after the call returned |
//! | `queue_depth` | operations of the same stream launched before this call and not yet started on the GPU when it began |
//! | `shorter_than_launch` | `gpu_dur < launch_dur`: the host cannot keep up with such kernels |
//!
//! Operations without a launch call in the trace are left out. With a step range
//! (`launch_stats('r', '3..5')`) the rows are the operations launched in the selected steps;
//! their queue depth still counts earlier work of other steps.
//!
//! ```sql
//! SELECT launch_name, count(*), fmt_dur(median(launch_delay)), max(queue_depth)
//! FROM launch_stats('llama-bs8') GROUP BY launch_name;
//! ```

use super::data::{Host, Names, OpClass, Timelines};
use super::{batch, Call, Spec};
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

pub static LAUNCH_STATS: Spec = Spec::of_run("launch_stats", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

fn schema() -> SchemaRef {
    let f = |n, t, null| Field::new(n, t, null);
    Arc::new(Schema::new(vec![
        f("run", DataType::Utf8, false),
        f("rank", DataType::Int32, true),
        f("pid", DataType::Int64, true),
        f("tid", DataType::Int64, true),
        f("device", DataType::Int32, true),
        f("stream", DataType::Int64, true),
        f("correlation", DataType::Int64, false),
        f("kind", DataType::Utf8, false),
        f("name", DataType::Utf8, false),
        f("launch_name", DataType::Utf8, false),
        f("launch_ts", DataType::Int64, false),
        f("launch_dur", DataType::Int64, false),
        f("gpu_ts", DataType::Int64, false),
        f("gpu_dur", DataType::Int64, false),
        f("launch_delay", DataType::Int64, false),
        f("queue_depth", DataType::Int64, false),
        f("shorter_than_launch", DataType::Boolean, false),
    ]))
}

/// One GPU operation and its launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub rank: Option<i32>,
    /// The launching process and thread.
    pub pid: Option<i64>,
    pub tid: Option<i64>,
    pub device: Option<i32>,
    pub stream: Option<i64>,
    pub correlation: i64,
    pub kind: &'static str,
    pub name: u32,
    pub launch_name: u32,
    pub launch_ts: i64,
    pub launch_dur: i64,
    pub gpu_ts: i64,
    pub gpu_dur: i64,
    pub launch_delay: i64,
    pub queue_depth: i64,
    /// The step of the launch.
    pub step: Option<i64>,
}

/// Every GPU operation with a launch call, ordered by device timeline and GPU start.
pub fn launches(timelines: &Timelines, host: &Host) -> Vec<Launch> {
    let mut out = Vec::new();
    for (key, ops) in &timelines.devices {
        let first = out.len();
        for o in ops {
            let Some(l) = host.launch(key, o.correlation) else {
                continue;
            };
            let kind = match o.class {
                OpClass::Memcpy => "memcpy",
                OpClass::Memset => "memset",
                OpClass::Overhead => continue,
                _ => "kernel",
            };
            out.push(Launch {
                rank: key.rank,
                pid: l.pid,
                tid: l.tid,
                device: key.device,
                stream: o.stream,
                correlation: o.correlation.unwrap_or_default(),
                kind,
                name: o.name,
                launch_name: l.name,
                launch_ts: l.start,
                launch_dur: l.end - l.start,
                gpu_ts: o.start,
                gpu_dur: o.end - o.start,
                launch_delay: (o.start - l.end).max(0),
                queue_depth: 0,
                step: o.step,
            });
        }
        // Queue depth per stream: walk launches in call order, keeping the GPU starts of
        // launched-but-not-started operations in a min-heap.
        let mut by_stream: BTreeMap<Option<i64>, Vec<usize>> = BTreeMap::new();
        for (i, l) in out.iter().enumerate().skip(first) {
            by_stream.entry(l.stream).or_default().push(i);
        }
        for (_, mut idx) in by_stream {
            idx.sort_by_key(|&i| (out[i].launch_ts, out[i].gpu_ts));
            let mut queued = BinaryHeap::new();
            for i in idx {
                let t = out[i].launch_ts;
                while queued.peek().is_some_and(|&Reverse(s)| s <= t) {
                    queued.pop();
                }
                out[i].queue_depth = queued.len() as i64;
                queued.push(Reverse(out[i].gpu_ts));
            }
        }
    }
    out
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let timelines = Timelines::load(&ctx, &call.run, false).await?;
    let mut names = Names::default();
    let host = Host::load(&ctx, &call.run, &mut names).await?;
    let scope = call.scope(&ctx).await?;
    let mut rows = launches(&timelines, &host);
    rows.retain(|l| scope.keeps(l.step));
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.pid))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.tid))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.device))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.stream))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.correlation),
        )),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.kind))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| timelines.names.get(r.name)),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| names.get(r.launch_name)),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.launch_ts),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.launch_dur),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.gpu_ts))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.gpu_dur))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.launch_delay),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.queue_depth),
        )),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.gpu_dur < r.launch_dur)),
        )),
    ];
    batch(schema(), columns)
}
