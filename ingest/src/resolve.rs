//! Attribution: which operator, annotation and profiler step each event belongs to.
//!
//! GPU work is attributed through its launch call (same correlation id): the innermost
//! `cpu_op` and user annotation enclosing the launch on the launching thread, and the
//! `ProfilerStep#N` range containing the launch. Host events use their own time and thread.

use crate::events::{HostStructure, Kind};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, Int64Array, Int64Builder, RecordBatch, StringBuilder,
};
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use std::collections::HashMap;
use std::sync::Arc;

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Interval {
    start: i64,
    end: i64,
    name: u32,
    parent: u32,
}

/// Intervals of one kind on one thread, sorted by start, each with its enclosing interval.
#[derive(Debug, Default)]
struct Nest {
    intervals: Vec<Interval>,
}

impl Nest {
    fn build(mut intervals: Vec<Interval>) -> Nest {
        intervals.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut stack: Vec<u32> = Vec::new();
        for i in 0..intervals.len() {
            while let Some(&top) = stack.last() {
                if intervals[top as usize].end <= intervals[i].start {
                    stack.pop();
                } else {
                    break;
                }
            }
            intervals[i].parent = stack.last().copied().unwrap_or(NONE);
            stack.push(i as u32);
        }
        Nest { intervals }
    }

    /// The innermost interval containing `t` (`start <= t < end`).
    fn innermost(&self, t: i64) -> Option<u32> {
        let idx = self.intervals.partition_point(|iv| iv.start <= t);
        let mut i = idx.checked_sub(1)? as u32;
        loop {
            let iv = &self.intervals[i as usize];
            if t < iv.end {
                return Some(i);
            }
            if iv.parent == NONE {
                return None;
            }
            i = iv.parent;
        }
    }

    fn get(&self, i: u32) -> &Interval {
        &self.intervals[i as usize]
    }
}

#[derive(Debug, Default)]
struct ThreadIndex {
    ops: Nest,
    annotations: Nest,
}

/// Lookup structure built once per trace file.
pub struct Resolver {
    names: Vec<Arc<str>>,
    threads: HashMap<(i64, i64), ThreadIndex>,
    launches: HashMap<i64, (i64, i64, i64)>,
    steps: Vec<(i64, i64, i64)>,
}

impl Resolver {
    pub fn new(host: HostStructure) -> Resolver {
        let mut per_thread: HashMap<(i64, i64), (Vec<Interval>, Vec<Interval>)> = HashMap::new();
        for iv in host.intervals {
            let e = per_thread.entry((iv.pid, iv.tid)).or_default();
            let item = Interval {
                start: iv.start,
                end: iv.end,
                name: iv.name,
                parent: NONE,
            };
            if iv.annotation {
                e.1.push(item);
            } else {
                e.0.push(item);
            }
        }
        let threads = per_thread
            .into_iter()
            .map(|(k, (ops, annos))| {
                (
                    k,
                    ThreadIndex {
                        ops: Nest::build(ops),
                        annotations: Nest::build(annos),
                    },
                )
            })
            .collect();
        let mut launches = HashMap::with_capacity(host.launches.len());
        for l in host.launches {
            // Keep the first launch of a correlation id (graph launches fan out on the GPU side).
            launches
                .entry(l.correlation)
                .or_insert((l.pid, l.tid, l.ts));
        }
        let mut steps = host.steps;
        steps.sort_unstable();
        Resolver {
            names: host.names.names().to_vec(),
            threads,
            launches,
            steps,
        }
    }

    fn step_at(&self, t: i64) -> Option<i64> {
        let idx = self.steps.partition_point(|s| s.0 <= t);
        let s = self.steps.get(idx.checked_sub(1)?)?;
        (t < s.1).then_some(s.2)
    }

    /// Fills `rank`, `step`, `op`, `scope` and adds `time_base` to `ts`.
    pub fn resolve(&self, batch: &RecordBatch, rank: Option<i32>, time_base: i64) -> RecordBatch {
        let n = batch.num_rows();
        let col = |name: &str| batch.column_by_name(name).expect("events column");
        let kinds = col("kind").as_dictionary::<Int32Type>();
        let kind_values: Vec<Option<Kind>> = kinds
            .values()
            .as_string::<i32>()
            .iter()
            .map(|v| v.and_then(Kind::from_name))
            .collect();
        let names = col("name").as_dictionary::<Int32Type>();
        let name_values = names.values().as_string::<i32>();
        let pid = col("pid").as_primitive::<Int64Type>();
        let tid = col("tid").as_primitive::<Int64Type>();
        let ts = col("ts").as_primitive::<Int64Type>();
        let dur = col("dur").as_primitive::<Int64Type>();
        let corr = col("correlation").as_primitive::<Int64Type>();
        let mut step = Int64Builder::with_capacity(n);
        let mut op = StringBuilder::with_capacity(n, n * 8);
        let mut scope = StringBuilder::with_capacity(n, n * 8);
        for i in 0..n {
            let kind = kind_values[kinds.keys().value(i) as usize].unwrap_or(Kind::Other);
            let t = ts.value(i);
            let thread = if pid.is_null(i) || tid.is_null(i) {
                None
            } else {
                Some((pid.value(i), tid.value(i)))
            };
            let (point, thread, from_launch) = if kind.is_gpu() {
                match (!corr.is_null(i))
                    .then(|| self.launches.get(&corr.value(i)))
                    .flatten()
                {
                    Some(&(p, th, lt)) => (lt, Some((p, th)), true),
                    None => (t, None, false),
                }
            } else {
                (t, thread, false)
            };
            step.append_option(self.step_at(point));
            let index = thread.and_then(|k| self.threads.get(&k));
            let wants_op = from_launch || kind.is_launch();
            let op_name = index
                .filter(|_| wants_op)
                .and_then(|x| Some(x.ops.get(x.ops.innermost(point)?).name));
            op.append_option(op_name.map(|id| &*self.names[id as usize]));
            let scope_name = index.and_then(|x| {
                let nest = &x.annotations;
                let mut j = nest.innermost(point)?;
                if !kind.is_gpu() {
                    // An annotation's scope is the one around it, not itself.
                    let me = name_values.value(names.keys().value(i) as usize);
                    let end = t + dur.value(i);
                    loop {
                        let iv = nest.get(j);
                        if iv.start == t && iv.end == end && &*self.names[iv.name as usize] == me {
                            if iv.parent == NONE {
                                return None;
                            }
                            j = iv.parent;
                        } else {
                            break;
                        }
                    }
                }
                Some(nest.get(j).name)
            });
            scope.append_option(scope_name.map(|id| &*self.names[id as usize]));
        }
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        let schema = batch.schema();
        let idx = |name: &str| schema.index_of(name).expect("events column");
        columns[idx("rank")] = Arc::new(Int32Array::from(vec![rank; n]));
        columns[idx("step")] = Arc::new(step.finish());
        columns[idx("op")] = Arc::new(op.finish());
        columns[idx("scope")] = Arc::new(scope.finish());
        if time_base != 0 {
            columns[idx("ts")] = Arc::new(Int64Array::from_iter_values(
                ts.values().iter().map(|v| v + time_base),
            ));
        }
        RecordBatch::try_new(schema, columns).expect("same schema")
    }
}

/// Sets `rank` and shifts `ts` of a counters batch.
pub fn resolve_counters(batch: &RecordBatch, rank: Option<i32>, time_base: i64) -> RecordBatch {
    let schema = batch.schema();
    let mut columns = batch.columns().to_vec();
    let n = batch.num_rows();
    columns[schema.index_of("rank").expect("rank")] = Arc::new(Int32Array::from(vec![rank; n]));
    if time_base != 0 {
        let i = schema.index_of("ts").expect("ts");
        let ts = columns[i].as_primitive::<Int64Type>().clone();
        columns[i] = Arc::new(Int64Array::from_iter_values(
            ts.values().iter().map(|v| v + time_base),
        ));
    }
    RecordBatch::try_new(schema, columns).expect("same schema")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(start: i64, end: i64, name: u32) -> Interval {
        Interval {
            start,
            end,
            name,
            parent: NONE,
        }
    }

    #[test]
    fn finds_innermost_enclosing_interval() {
        // A [0,100) > B [10,50) > C [20,30);  D [60,70) inside A
        let nest = Nest::build(vec![
            iv(20, 30, 2),
            iv(0, 100, 0),
            iv(60, 70, 3),
            iv(10, 50, 1),
        ]);
        let name = |t| nest.innermost(t).map(|j| nest.get(j).name);
        assert_eq!(name(25), Some(2));
        assert_eq!(name(35), Some(1));
        assert_eq!(name(55), Some(0));
        assert_eq!(name(65), Some(3));
        assert_eq!(name(100), None);
        assert_eq!(name(-1), None);
        assert_eq!(name(0), Some(0));
    }
}
