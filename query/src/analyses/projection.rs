//! `gpu_projection(run [, steps])`: each host range (NVTX range, `user_annotation`, operator)
//! projected onto the GPU, per range name: Nsight Systems' `nvtx_gpu_proj_sum`.
//!
//! A GPU operation (kernel, copy, set) belongs to a range when the runtime or driver call that
//! launched it (matched by correlation id on the rank) lies within the range on the range's own
//! thread. An instance's **projection** runs from the start of its first GPU operation to the
//! end of its last; ranges that launched nothing are left out. Nested ranges each get the
//! operations of their calls, so projections of a parent and its children overlap (their sum
//! can exceed the run). `gpu_busy` adds what nsys does not give: the union of the instance's
//! GPU operations, the time the GPU actually worked for it, so a projection much longer than
//! its busy time says the range's work waited on the GPU or was spread out.
//!
//! Columns per (`name`, `kind`): `instances`, `range_time` (host time of those instances),
//! `proj_time`, `proj_avg`, `proj_med`, `proj_min`, `proj_max`, `proj_stddev` (sample),
//! `gpu_ops`, `avg_gpu_ops`, `gpu_busy`, `avg_level` (depth in its thread's range stack, 0 at
//! the top) and `avg_children` (direct child ranges). With a step range the instances that
//! start in the selected steps count.
//!
//! ```sql
//! SELECT name, fmt_dur(proj_time), fmt_dur(gpu_busy), instances FROM gpu_projection('llama-bs8') LIMIT 10;
//! ```

use super::data::{collect, ints, launches_by_thread, strings, Names, Scope, Thread};
use super::history::stats::median_ints;
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;

pub static GPU_PROJECTION: Spec = Spec::of_run("gpu_projection", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

fn schema() -> SchemaRef {
    let int = |n: &str| Field::new(n, DataType::Int64, false);
    let float = |n: &str| Field::new(n, DataType::Float64, false);
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("kind", DataType::Utf8, false),
        int("instances"),
        int("range_time"),
        int("proj_time"),
        float("proj_avg"),
        float("proj_med"),
        int("proj_min"),
        int("proj_max"),
        float("proj_stddev"),
        int("gpu_ops"),
        float("avg_gpu_ops"),
        int("gpu_busy"),
        float("avg_level"),
        float("avg_children"),
    ]))
}

/// One range instance on a thread.
#[derive(Debug, Clone, Copy)]
pub struct HostRange {
    pub start: i64,
    pub end: i64,
    /// Interned (name, kind).
    pub key: (u32, u32),
}

/// One launch call on a thread: its time and the GPU operations it launched.
#[derive(Debug, Clone)]
pub struct Launch {
    pub start: i64,
    pub end: i64,
    pub ops: Vec<(i64, i64)>,
}

/// A range instance that launched GPU work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projected {
    pub key: (u32, u32),
    pub range_start: i64,
    pub range_dur: i64,
    pub proj_start: i64,
    pub proj_end: i64,
    pub ops: i64,
    pub busy: i64,
    pub level: i64,
    pub children: i64,
}

/// Projects one thread's ranges: each range gets the GPU operations of the launch calls that
/// lie within it (`start <= call start` and `call end <= end`). Ranges nest as a stack (a
/// range inside another is its child); `level` is the depth in that stack and `children`
/// counts direct children that launched GPU work themselves.
pub fn project_thread(ranges: &mut [HostRange], launches: &mut [Launch]) -> Vec<Projected> {
    // Outer ranges first when two start together; a call starting with a range is in it.
    ranges.sort_by_key(|r| (r.start, std::cmp::Reverse(r.end)));
    launches.sort_by_key(|l| l.start);
    let n = ranges.len();
    let mut level = vec![0i64; n];
    let mut parent: Vec<Option<usize>> = vec![None; n];
    let mut ops: Vec<Vec<(i64, i64)>> = vec![Vec::new(); n];
    let mut stack: Vec<usize> = Vec::new();
    let mut launches = launches.iter().peekable();
    for i in 0..=n {
        let next_start = ranges.get(i).map(|r| r.start);
        while let Some(l) = launches.next_if(|l| next_start.is_none_or(|t| l.start < t)) {
            // Ranges that ended before the call started hold no later item either.
            while stack.last().is_some_and(|&top| ranges[top].end < l.start) {
                stack.pop();
            }
            for &open in &stack {
                let r = &ranges[open];
                if r.start <= l.start && l.end <= r.end {
                    ops[open].extend_from_slice(&l.ops);
                }
            }
        }
        let Some(r) = ranges.get(i) else { break };
        while stack.last().is_some_and(|&top| {
            let t = &ranges[top];
            !(t.start <= r.start && r.end <= t.end)
        }) {
            stack.pop();
        }
        level[i] = stack.len() as i64;
        parent[i] = stack.last().copied();
        stack.push(i);
    }
    let mut children = vec![0i64; n];
    for i in 0..n {
        if let (Some(p), false) = (parent[i], ops[i].is_empty()) {
            children[p] += 1;
        }
    }
    let mut out = Vec::new();
    for (i, mut ops) in ops.into_iter().enumerate() {
        if ops.is_empty() {
            continue;
        }
        ops.sort_unstable();
        let (mut busy, mut open) = (0i64, (ops[0].0, ops[0].0));
        for &(s, e) in &ops {
            if s > open.1 {
                busy += open.1 - open.0;
                open = (s, e);
            } else {
                open.1 = open.1.max(e);
            }
        }
        busy += open.1 - open.0;
        out.push(Projected {
            key: ranges[i].key,
            range_start: ranges[i].start,
            range_dur: ranges[i].end - ranges[i].start,
            proj_start: ops[0].0,
            proj_end: ops.iter().map(|o| o.1).max().unwrap_or(ops[0].1),
            ops: ops.len() as i64,
            busy,
            level: level[i],
            children: children[i],
        });
    }
    out
}

/// Per (name, kind): the instances' projections.
#[derive(Debug, Clone, Default)]
struct Row {
    range_time: i64,
    projections: Vec<i64>,
    ops: i64,
    busy: i64,
    levels: i64,
    children: i64,
}

/// Every range instance of `run` that launched GPU work, with its rank.
pub async fn load(
    ctx: &SessionContext,
    run: &str,
    names: &mut Names,
) -> Result<Vec<(Option<i32>, Projected)>> {
    let launches = launches_by_thread(ctx, run, names, &["kernel", "memcpy", "memset"])
        .await?
        .by_thread;
    let run = literal(run);
    let mut ranges: HashMap<Thread, Vec<HostRange>> = HashMap::new();
    let sql = format!(
        "SELECT rank, pid, tid, name, kind, ts, ts + dur FROM events WHERE run = {run} \
         AND kind IN ('annotation', 'cpu_op') AND dur >= 0 \
         AND (kind <> 'annotation' OR scope IS NULL OR scope <> 'stage')"
    );
    for b in collect(ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (name, kind) = (strings(&b, 3)?, strings(&b, 4)?);
        let (ts, end) = (ints(&b, 5)?, ints(&b, 6)?);
        for i in 0..b.num_rows() {
            let thread = (rank[i].map(|r| r as i32), pid[i], tid[i]);
            let (Some(s), Some(e)) = (ts[i], end[i]) else {
                continue;
            };
            // Threads that launched nothing project nothing.
            if !launches.contains_key(&thread) {
                continue;
            }
            let key = (
                names.id(name[i].as_deref().unwrap_or("")),
                names.id(kind[i].as_deref().unwrap_or("")),
            );
            ranges.entry(thread).or_default().push(HostRange {
                start: s,
                end: e,
                key,
            });
        }
    }
    let mut out = Vec::new();
    for (thread, calls) in launches {
        if let Some(mut ranges) = ranges.remove(&thread) {
            let mut calls: Vec<Launch> = calls
                .into_iter()
                .map(|c| Launch {
                    start: c.start,
                    end: c.end,
                    ops: c.ops.into_iter().map(|o| (o.start, o.end)).collect(),
                })
                .collect();
            out.extend(
                project_thread(&mut ranges, &mut calls)
                    .into_iter()
                    .map(|p| (thread.0, p)),
            );
        }
    }
    Ok(out)
}

/// The sample standard deviation (0 for one value), as nsys reports it.
fn stddev(values: &[i64]) -> f64 {
    let n = values.len();
    if n < 2 {
        return 0.0;
    }
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let ss: f64 = values.iter().map(|&v| (v as f64 - mean).powi(2)).sum();
    (ss / (n - 1) as f64).sqrt()
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope: Scope = call.scope(&ctx).await?;
    let mut names = Names::default();
    let mut rows: HashMap<(u32, u32), Row> = HashMap::new();
    for (rank, p) in load(&ctx, &call.run, &mut names).await? {
        if let Some((lo, hi)) = scope.window(rank) {
            if p.range_start < lo || p.range_start >= hi {
                continue;
            }
        }
        let row = rows.entry(p.key).or_default();
        row.range_time += p.range_dur;
        row.projections.push(p.proj_end - p.proj_start);
        row.ops += p.ops;
        row.busy += p.busy;
        row.levels += p.level;
        row.children += p.children;
    }
    let mut rows: Vec<((u32, u32), Row)> = rows.into_iter().collect();
    for (_, r) in &mut rows {
        r.projections.sort_unstable();
    }
    let total = |r: &Row| r.projections.iter().sum::<i64>();
    rows.sort_by(|(ka, a), (kb, b)| {
        total(b)
            .cmp(&total(a))
            .then_with(|| names.get(ka.0).cmp(names.get(kb.0)))
            .then_with(|| names.get(ka.1).cmp(names.get(kb.1)))
    });
    let count = |r: &Row| r.projections.len() as f64;
    let ints = |f: &dyn Fn(&Row) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|(_, r)| f(r))))
    };
    let floats = |f: &dyn Fn(&Row) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|(_, r)| f(r)),
        ))
    };
    let text = |f: &dyn Fn(&(u32, u32)) -> u32| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(k, _)| names.get(f(k))),
        ))
    };
    let columns = vec![
        call.run_column(rows.len()),
        text(&|k| k.0),
        text(&|k| k.1),
        ints(&|r| r.projections.len() as i64),
        ints(&|r| r.range_time),
        ints(&total),
        floats(&|r| total(r) as f64 / count(r)),
        floats(&|r| median_ints(r.projections.clone()).unwrap_or(0.0)),
        ints(&|r| r.projections[0]),
        ints(&|r| r.projections[r.projections.len() - 1]),
        floats(&|r| stddev(&r.projections)),
        ints(&|r| r.ops),
        floats(&|r| r.ops as f64 / count(r)),
        ints(&|r| r.busy),
        floats(&|r| r.levels as f64 / count(r)),
        floats(&|r| r.children as f64 / count(r)),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, name: u32) -> HostRange {
        HostRange {
            start,
            end,
            key: (name, 0),
        }
    }

    fn launch(start: i64, end: i64, ops: &[(i64, i64)]) -> Launch {
        Launch {
            start,
            end,
            ops: ops.to_vec(),
        }
    }

    #[test]
    fn a_range_projects_the_work_its_calls_launched() {
        // outer [0,100) holds inner [10,40) and a range that launched nothing [50,60); calls at
        // 12 and 30 are inside inner, one at 70 only inside outer, one at 95..105 straddles
        // outer's end (in no range), one at 200 is outside.
        let mut ranges = vec![range(10, 40, 1), range(0, 100, 0), range(50, 60, 2)];
        let mut calls = vec![
            launch(30, 35, &[(500, 600)]),
            launch(12, 14, &[(300, 400), (350, 450)]),
            launch(70, 72, &[(1000, 1010)]),
            launch(95, 105, &[(2000, 2100)]),
            launch(200, 201, &[(3000, 3001)]),
        ];
        let mut got = project_thread(&mut ranges, &mut calls);
        got.sort_by_key(|p| p.key);
        assert_eq!(got.len(), 2, "ranges that launched nothing are left out");
        let (outer, inner) = (&got[0], &got[1]);
        assert_eq!((outer.proj_start, outer.proj_end), (300, 1010));
        assert_eq!(outer.ops, 4);
        assert_eq!(outer.busy, 150 + 100 + 10, "the union of its operations");
        assert_eq!((outer.level, outer.children), (0, 1));
        assert_eq!((inner.proj_start, inner.proj_end), (300, 600));
        assert_eq!((inner.ops, inner.busy), (3, 250));
        assert_eq!((inner.level, inner.children, inner.range_dur), (1, 0, 30));
    }

    #[test]
    fn a_call_that_starts_with_a_range_is_in_it_and_statistics_are_nsys() {
        let mut ranges = vec![range(5, 10, 0), range(5, 10, 1)];
        let mut calls = vec![launch(5, 10, &[(20, 30)])];
        let got = project_thread(&mut ranges, &mut calls);
        assert_eq!(got.len(), 2, "both equal ranges hold the call");
        assert_eq!(got.iter().map(|p| p.level).sum::<i64>(), 1);
        // nsys: 7274562 and 151750042 have a StdDev of 102159591.6.
        assert_eq!(
            format!("{:.1}", stddev(&[7274562, 151750042])),
            "102159591.6"
        );
        assert_eq!(stddev(&[5]), 0.0);
    }
}
