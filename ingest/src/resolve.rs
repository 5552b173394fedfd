//! Attribution: which operator, annotation and profiler step each event belongs to.
//!
//! GPU work is attributed through its launch call (same correlation id): the innermost
//! `cpu_op` and user annotation enclosing the launch on the launching thread, and the
//! `ProfilerStep#N` range containing the launch. Host events use their own time and thread.

use crate::events::{HostInterval, HostStructure, Kind, Launch, Step, Threads};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, Int64Array, Int64Builder, RecordBatch, StringBuilder,
};
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::Arc;

const NONE: u32 = u32::MAX;

/// Intervals of one kind on one thread: a slice of [`Resolver::intervals`] sorted by start
/// (longest first on ties), each with the index of its enclosing interval.
#[derive(Clone, Copy)]
struct Nest<'a> {
    intervals: &'a [HostInterval],
    parents: &'a [u32],
}

impl<'a> Nest<'a> {
    /// Index of the innermost interval containing `t` (`start <= t < end`).
    fn innermost(&self, t: i64) -> Option<usize> {
        let idx = self.intervals.partition_point(|iv| iv.start <= t);
        let mut i = idx.checked_sub(1)?;
        loop {
            if t < self.intervals[i].end {
                return Some(i);
            }
            i = self.parent(i)?;
        }
    }

    fn parent(&self, i: usize) -> Option<usize> {
        match self.parents[i] {
            NONE => None,
            p => Some(p as usize),
        }
    }
}

/// Parent of each interval of a sorted run (indices relative to the run).
fn nest_parents(run: &[HostInterval], parents: &mut Vec<u32>) {
    let mut stack: Vec<u32> = Vec::new();
    for (i, iv) in run.iter().enumerate() {
        while let Some(&top) = stack.last() {
            if run[top as usize].end <= iv.start {
                stack.pop();
            } else {
                break;
            }
        }
        parents.push(stack.last().copied().unwrap_or(NONE));
        stack.push(i as u32);
    }
}

/// Lookup structure built once per trace file. It reuses the parsed host structure in place
/// (sorted, plus 4 bytes of parent index per interval), so it costs no second copy.
pub struct Resolver {
    names: Vec<Arc<str>>,
    thread_ids: Threads,
    intervals: Vec<HostInterval>,
    parents: Vec<u32>,
    /// By thread id: the ranges of its operators and of its annotations in `intervals`.
    threads: Vec<(Range<usize>, Range<usize>)>,
    /// Sorted by correlation id (then pid when [`Self::per_process`]); first launch of each key.
    launches: Vec<Launch>,
    per_process: bool,
    /// Sorted by (process, start).
    steps: Vec<Step>,
}

impl Resolver {
    pub fn new(host: HostStructure) -> Resolver {
        let HostStructure {
            names,
            threads: thread_ids,
            mut intervals,
            mut launches,
            mut steps,
            correlation_per_process: per_process,
            ..
        } = host;
        // Millions of entries, sorted while nothing else runs: in parallel.
        intervals.par_sort_unstable_by_key(|iv| iv.order_key());
        intervals.shrink_to_fit();
        let mut parents = Vec::with_capacity(intervals.len());
        let mut threads = vec![(0..0, 0..0); thread_ids.len()];
        let mut start = 0;
        while start < intervals.len() {
            let first = intervals[start];
            let len = intervals[start..]
                .iter()
                .take_while(|iv| {
                    (iv.thread(), iv.annotation()) == (first.thread(), first.annotation())
                })
                .count();
            nest_parents(&intervals[start..start + len], &mut parents);
            let entry = &mut threads[first.thread() as usize];
            if first.annotation() {
                entry.1 = start..start + len;
            } else {
                entry.0 = start..start + len;
            }
            start += len;
        }
        // Keep the first launch of a correlation id (graph launches fan out on the GPU side).
        let pid_of = |l: &Launch| per_process.then(|| thread_ids.keys()[l.thread as usize].0);
        launches.par_sort_by_key(|l| (l.correlation, pid_of(l)));
        launches.dedup_by_key(|l| (l.correlation, pid_of(l)));
        launches.shrink_to_fit();
        steps.par_sort_unstable();
        Resolver {
            names: names.names().to_vec(),
            thread_ids,
            intervals,
            parents,
            threads,
            launches,
            per_process,
            steps,
        }
    }

    fn nest(&self, range: &Range<usize>) -> Nest<'_> {
        Nest {
            intervals: &self.intervals[range.clone()],
            parents: &self.parents[range.clone()],
        }
    }

    /// The launch of GPU work with this correlation id, issued by process `pid`.
    fn launch(&self, correlation: i64, pid: Option<i64>) -> Option<&Launch> {
        let key = (correlation, pid.filter(|_| self.per_process));
        let i = self
            .launches
            .binary_search_by_key(&key, |l| {
                let pid = self.thread_ids.keys()[l.thread as usize].0;
                (l.correlation, self.per_process.then_some(pid))
            })
            .ok()?;
        Some(&self.launches[i])
    }

    /// The step of process `pid` (when steps are per process) running at `t`.
    fn step_at(&self, t: i64, pid: Option<i64>) -> Option<i64> {
        let process = if self.per_process {
            pid.unwrap_or(0)
        } else {
            0
        };
        let idx = self
            .steps
            .partition_point(|s| (s.process, s.start) <= (process, t));
        let s = self.steps.get(idx.checked_sub(1)?)?;
        (s.process == process && t < s.end).then_some(s.number)
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
        // Values the adapter already knows win over attribution.
        let given_step = col("step").as_primitive::<Int64Type>();
        let given_op = col("op").as_string::<i32>();
        let given_scope = col("scope").as_string::<i32>();
        let mut step = Int64Builder::with_capacity(n);
        let mut op = StringBuilder::with_capacity(n, n * 8);
        let mut scope = StringBuilder::with_capacity(n, n * 8);
        for i in 0..n {
            let kind = kind_values[kinds.keys().value(i) as usize].unwrap_or(Kind::Other);
            let t = ts.value(i);
            let thread = if pid.is_null(i) || tid.is_null(i) {
                None
            } else {
                self.thread_ids.get(pid.value(i), tid.value(i))
            };
            let (point, thread, from_launch) = if kind.is_gpu() {
                let process = (!pid.is_null(i)).then(|| pid.value(i));
                match (!corr.is_null(i))
                    .then(|| self.launch(corr.value(i), process))
                    .flatten()
                {
                    Some(l) => (l.ts, Some(l.thread), true),
                    None => (t, None, false),
                }
            } else {
                (t, thread, false)
            };
            if given_step.is_valid(i) {
                step.append_value(given_step.value(i));
            } else {
                let process = match thread {
                    Some(k) => Some(self.thread_ids.keys()[k as usize].0),
                    None => (!pid.is_null(i)).then(|| pid.value(i)),
                };
                step.append_option(self.step_at(point, process));
            }
            if given_op.is_valid(i) || given_scope.is_valid(i) {
                op.append_option(given_op.is_valid(i).then(|| given_op.value(i)));
                scope.append_option(given_scope.is_valid(i).then(|| given_scope.value(i)));
                continue;
            }
            let index = thread.map(|k| &self.threads[k as usize]);
            let wants_op = from_launch || kind.is_launch();
            let op_name = index.filter(|_| wants_op).and_then(|(ops, _)| {
                let nest = self.nest(ops);
                Some(nest.intervals[nest.innermost(point)?].name)
            });
            op.append_option(op_name.map(|id| &*self.names[id as usize]));
            let scope_name = index.and_then(|(_, annotations)| {
                let nest = self.nest(annotations);
                let mut j = nest.innermost(point)?;
                if !kind.is_gpu() {
                    // An annotation's scope is the one around it, not itself.
                    let me = name_values.value(names.keys().value(i) as usize);
                    let end = t + dur.value(i);
                    loop {
                        let iv = &nest.intervals[j];
                        if iv.start == t && iv.end == end && &*self.names[iv.name as usize] == me {
                            j = nest.parent(j)?;
                        } else {
                            break;
                        }
                    }
                }
                Some(nest.intervals[j].name)
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

    fn iv(start: i64, end: i64, name: u32) -> HostInterval {
        HostInterval::new(0, start, end, name, false)
    }

    #[test]
    fn finds_innermost_enclosing_interval() {
        // A [0,100) > B [10,50) > C [20,30);  D [60,70) inside A
        let mut run = vec![iv(0, 100, 0), iv(10, 50, 1), iv(20, 30, 2), iv(60, 70, 3)];
        run.sort_unstable_by_key(|iv| (iv.start, std::cmp::Reverse(iv.end)));
        let mut parents = Vec::new();
        nest_parents(&run, &mut parents);
        let nest = Nest {
            intervals: &run,
            parents: &parents,
        };
        let name = |t| nest.innermost(t).map(|j| nest.intervals[j].name);
        assert_eq!(name(25), Some(2));
        assert_eq!(name(35), Some(1));
        assert_eq!(name(55), Some(0));
        assert_eq!(name(65), Some(3));
        assert_eq!(name(100), None);
        assert_eq!(name(-1), None);
        assert_eq!(name(0), Some(0));
        assert_eq!(nest.parent(2), Some(1));
        assert_eq!(nest.parent(0), None);
    }
}
