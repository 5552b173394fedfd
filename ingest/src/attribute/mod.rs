//! Attribution: which operator, annotation and profiler step each event belongs to.
//!
//! GPU work is attributed through its launch call (same correlation id): the innermost
//! `cpu_op` and user annotation enclosing the launch on the launching thread, and the
//! `ProfilerStep#N` range containing the launch. Host events use their own time and thread.

pub mod host;
pub mod launches;
pub mod search;
pub mod windows;

use crate::columns::Kind;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, DictionaryArray, Int32Array, Int32Builder, Int64Array, Int64Builder,
    RecordBatch, StringArray,
};
use datafusion::arrow::compute::concat;
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use host::{HostInterval, HostStructure, Launch, Step, Threads};
use launches::{AttributedLaunch, LaunchIndex, Launches};
use rayon::prelude::*;
use search::partition_point_near;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

const NONE: u32 = u32::MAX;

/// The number of a step matched by a pattern without a capture group, until
/// [`number_occurrences`] numbers such steps once the whole file is read.
pub const UNNUMBERED_STEP: i64 = i64::MIN;

/// The step a range named `name` marks under a step pattern: the number in its capture group,
/// or [`UNNUMBERED_STEP`] when the pattern has none (a repeated range, such as a denoising
/// loop's `denoise_step`, numbered by occurrence). None when the name does not match, or its
/// group is not an integer.
pub fn step_of(pattern: &regex::Regex, name: &str) -> Option<i64> {
    // Most ranges are not steps: the match test alone allocates nothing.
    if !pattern.is_match(name) {
        return None;
    }
    if pattern.captures_len() < 2 {
        return Some(UNNUMBERED_STEP);
    }
    pattern.captures(name)?.get(1)?.as_str().parse().ok()
}

/// Numbers the steps matched by a pattern without a capture group 1, 2, ... in order of start,
/// per process.
pub fn number_occurrences(steps: &mut [Step]) {
    let mut unnumbered: Vec<&mut Step> = steps
        .iter_mut()
        .filter(|s| s.number == UNNUMBERED_STEP)
        .collect();
    unnumbered.sort_by_key(|s| (s.process, s.start, s.end));
    let mut last: Option<(i64, i64)> = None;
    for s in unnumbered {
        let n = match last {
            Some((process, n)) if process == s.process => n + 1,
            _ => 1,
        };
        s.number = n;
        last = Some((s.process, n));
    }
}

/// Intervals of one kind on one thread: a slice of [`Resolver::intervals`] sorted by start
/// (longest first on ties), each with the index of its enclosing interval.
#[derive(Clone, Copy)]
struct Nest<'a> {
    intervals: &'a [HostInterval],
    parents: &'a [u32],
}

impl<'a> Nest<'a> {
    /// Index of the innermost interval containing `t` (`start <= t < end`).
    #[cfg(test)]
    fn innermost(&self, t: i64) -> Option<usize> {
        self.innermost_near(t, &mut 0)
    }

    /// [`Self::innermost`], searching from `hint` (updated to the search position).
    fn innermost_near(&self, t: i64, hint: &mut usize) -> Option<usize> {
        let idx = partition_point_near(self.intervals, *hint, |iv| iv.start <= t);
        *hint = idx;
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

/// Lookup structure built once per trace file, or once per time window of one
/// ([`Resolver::window`]). It reuses the parsed host structure in place (sorted, plus 4 bytes
/// of parent index per interval), so it costs no second copy.
pub struct Resolver {
    /// Interval names by id; also the values of the `op` and `scope` dictionaries of every
    /// resolved batch.
    names: Arc<StringArray>,
    thread_ids: Threads,
    intervals: Vec<HostInterval>,
    parents: Vec<u32>,
    /// By thread id: the ranges of its operators and of its annotations in `intervals`.
    threads: Vec<(Range<usize>, Range<usize>)>,
    /// The launches, attributed: what GPU rows take over.
    launches: Launches,
    per_process: bool,
    /// Sorted by (process, start).
    steps: Vec<Step>,
}

impl Resolver {
    /// The resolver of a whole file's host structure.
    pub fn new(host: HostStructure) -> Resolver {
        let names = Arc::new(StringArray::from_iter_values(
            host.names.names().iter().map(|n| &**n),
        ));
        Resolver::window(
            names,
            host.threads,
            host.intervals,
            host.launches,
            host.steps,
            host.correlation_per_process,
        )
    }

    /// A resolver over some of a file's host structure: `intervals` must hold every interval
    /// around the times it will be asked about (a window of the file's time and the intervals
    /// still open at its start), `launches` those to attribute; `names` are all the names the
    /// interval ids refer to.
    pub fn window(
        names: Arc<StringArray>,
        thread_ids: Threads,
        mut intervals: Vec<HostInterval>,
        launches: Vec<Launch>,
        mut steps: Vec<Step>,
        per_process: bool,
    ) -> Resolver {
        // Millions of entries (for a whole file), sorted while nothing else runs: in parallel.
        // Stable: of ranges with the same span, the later in the file is the inner one (a
        // trace lists a caller before its callees), whether the file is attributed at once
        // or by windows.
        intervals.par_sort_by_key(|iv| iv.order_key());
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
        steps.par_sort_unstable();
        let mut resolver = Resolver {
            names,
            thread_ids,
            intervals,
            parents,
            threads,
            launches: Launches::Memory(Vec::new()),
            per_process,
            steps,
        };
        resolver.launches = Launches::Memory(resolver.attribute(launches));
        resolver
    }

    /// Attributes launch calls: the innermost operator and annotation around each on its
    /// thread, and its step. Sorted by key, one per key: the earliest call of the key (graph
    /// launches fan out on the GPU side, not here).
    fn attribute(&self, mut launches: Vec<Launch>) -> Vec<AttributedLaunch> {
        let pid_of = |l: &Launch| self.thread_ids.keys()[l.thread as usize].0;
        let key_pid = |l: &Launch| if self.per_process { pid_of(l) } else { 0 };
        // Stable: of calls at the same time, the first in the file is kept.
        launches.par_sort_by_key(|l| (key_pid(l), l.correlation, l.ts));
        launches.dedup_by_key(|l| (key_pid(l), l.correlation));
        launches
            .par_chunks(1 << 14)
            .flat_map_iter(|chunk| {
                // Launches in key order alternate between threads: a search position each.
                let mut hints: Vec<[usize; 3]> = vec![[0; 3]; self.threads.len()];
                chunk
                    .iter()
                    .map(|l| {
                        let [op_hint, scope_hint, step_hint] = &mut hints[l.thread as usize];
                        let (ops, annotations) = &self.threads[l.thread as usize];
                        let name = |i: Option<usize>| i.map(|i| self.intervals[i].name);
                        AttributedLaunch::new(
                            l.correlation,
                            key_pid(l),
                            self.step_at(l.ts, Some(pid_of(l)), step_hint),
                            name(self.innermost(ops, l.ts, op_hint)),
                            name(self.innermost(annotations, l.ts, scope_hint)),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Index in `intervals` of the innermost interval of `range` containing `t`.
    fn innermost(&self, range: &Range<usize>, t: i64, hint: &mut usize) -> Option<usize> {
        let nest = self.nest(range);
        Some(range.start + nest.innermost_near(t, hint)?)
    }

    /// Hands the attributed launches over (sorted by key, one per key), leaving none.
    pub fn take_launches(&mut self) -> Vec<AttributedLaunch> {
        match &mut self.launches {
            Launches::Memory(launches) => std::mem::take(launches),
            Launches::Index(_) => Vec::new(),
        }
    }

    /// GPU rows find their launches in `index` from now on.
    pub fn with_launch_index(mut self, index: LaunchIndex) -> Resolver {
        self.launches = Launches::Index(index);
        self
    }

    /// The intervals still open after `t` (ending later): those a window starting at `t`
    /// needs from this one.
    pub fn open_intervals(&self, t: i64) -> Vec<HostInterval> {
        self.intervals
            .iter()
            .filter(|iv| iv.end > t)
            .copied()
            .collect()
    }

    fn nest(&self, range: &Range<usize>) -> Nest<'_> {
        Nest {
            intervals: &self.intervals[range.clone()],
            parents: &self.parents[range.clone()],
        }
    }

    /// The step of process `pid` (when steps are per process) running at `t`, searched from
    /// `hint` (updated to the search position).
    fn step_at(&self, t: i64, pid: Option<i64>, hint: &mut usize) -> Option<i64> {
        let process = if self.per_process {
            pid.unwrap_or(0)
        } else {
            0
        };
        let idx =
            partition_point_near(&self.steps, *hint, |s| (s.process, s.start) <= (process, t));
        *hint = idx;
        let s = self.steps.get(idx.checked_sub(1)?)?;
        (s.process == process && t < s.end).then_some(s.number)
    }

    /// Fills `rank`, `step`, `op`, `scope` and adds `time_base` to `ts`. Fails only when the
    /// launches are in a [`LaunchIndex`] that cannot be read.
    pub fn resolve(
        &self,
        batch: &RecordBatch,
        rank: Option<i32>,
        time_base: i64,
    ) -> std::io::Result<RecordBatch> {
        let n = batch.num_rows();
        let col = |name: &str| batch.column_by_name(name).expect("events column");
        let (kinds, kind_values) = crate::columns::kinds_of(batch);
        let kind_of = |i: usize| kind_values[kinds.keys().value(i) as usize].unwrap_or(Kind::Other);
        let names = col("name").as_dictionary::<Int32Type>();
        let name_values = names.values().as_string::<i32>();
        let pid = col("pid").as_primitive::<Int64Type>();
        let tid = col("tid").as_primitive::<Int64Type>();
        let ts = col("ts").as_primitive::<Int64Type>();
        let dur = col("dur").as_primitive::<Int64Type>();
        let corr = col("correlation").as_primitive::<Int64Type>();
        // GPU work takes over what its launch call was attributed to.
        let has_gpu_rows = kind_values.iter().flatten().any(|k| k.is_gpu());
        let launch_keys: Vec<Option<(i64, i64)>> = (0..n)
            .take(if has_gpu_rows { n } else { 0 })
            .map(|i| {
                if !kind_of(i).is_gpu() || corr.is_null(i) {
                    return None;
                }
                let process = if self.per_process {
                    pid.is_valid(i).then(|| pid.value(i))?
                } else {
                    0
                };
                Some((process, corr.value(i)))
            })
            .collect();
        let mut launches = self.launches.find_all(&launch_keys)?;
        drop(launch_keys);
        launches.resize(n, None);
        // Values the adapter already knows win over attribution.
        let given_step = col("step").as_primitive::<Int64Type>();
        let given_op = col("op").as_dictionary::<Int32Type>();
        let given_scope = col("scope").as_dictionary::<Int32Type>();
        let mut step = Int64Builder::with_capacity(n);
        // Keys into `name_values`, then into the texts adapters gave that follow them.
        let mut op = Int32Builder::with_capacity(n);
        let mut scope = Int32Builder::with_capacity(n);
        let mut given = GivenTexts::new(self.names.len());
        // Rows come in runs of one thread and rising times: every search starts where the
        // previous one of its kind (and thread) ended.
        let mut step_hint = 0;
        let mut nest_hints: Vec<[usize; 2]> = vec![[0; 2]; self.threads.len()];
        let mut last_thread: Option<((i64, i64), Option<u32>)> = None;
        for (i, launch) in launches.iter().enumerate() {
            let kind = kind_of(i);
            let t = ts.value(i);
            let given_texts = given_op.is_valid(i) || given_scope.is_valid(i);
            if given_texts {
                op.append_option(given.key(given_op, i));
                scope.append_option(given.key(given_scope, i));
            }
            if let Some(l) = launch {
                step.append_option(if given_step.is_valid(i) {
                    Some(given_step.value(i))
                } else {
                    l.step()
                });
                if !given_texts {
                    op.append_option(l.op().map(|id| id as i32));
                    scope.append_option(l.scope().map(|id| id as i32));
                }
                continue;
            }
            // GPU work without a launch has only its own time and process to go by.
            let thread = if kind.is_gpu() || pid.is_null(i) || tid.is_null(i) {
                None
            } else {
                let key = (pid.value(i), tid.value(i));
                match last_thread {
                    Some((k, id)) if k == key => id,
                    _ => {
                        let id = self.thread_ids.get(key.0, key.1);
                        last_thread = Some((key, id));
                        id
                    }
                }
            };
            if given_step.is_valid(i) {
                step.append_value(given_step.value(i));
            } else {
                let process = match thread {
                    Some(k) => Some(self.thread_ids.keys()[k as usize].0),
                    None => pid.is_valid(i).then(|| pid.value(i)),
                };
                step.append_option(self.step_at(t, process, &mut step_hint));
            }
            if given_texts {
                continue;
            }
            let Some(thread) = thread else {
                op.append_null();
                scope.append_null();
                continue;
            };
            let (ops, annotations) = &self.threads[thread as usize];
            let [op_hint, scope_hint] = &mut nest_hints[thread as usize];
            let op_name = kind
                .is_launch()
                .then(|| self.innermost(ops, t, op_hint))
                .flatten()
                .map(|j| self.intervals[j].name);
            op.append_option(op_name.map(|id| id as i32));
            let scope_name = self
                .innermost(annotations, t, scope_hint)
                .and_then(|mut j| {
                    // An annotation's scope is the one around it, not itself.
                    let me = name_values.value(names.keys().value(i) as usize);
                    let end = t + dur.value(i);
                    let nest = self.nest(annotations);
                    loop {
                        let iv = &self.intervals[j];
                        if iv.start == t
                            && iv.end == end
                            && self.names.value(iv.name as usize) == me
                        {
                            j = annotations.start + nest.parent(j - annotations.start)?;
                        } else {
                            break;
                        }
                    }
                    Some(self.intervals[j].name)
                });
            scope.append_option(scope_name.map(|id| id as i32));
        }
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        let schema = batch.schema();
        let idx = |name: &str| schema.index_of(name).expect("events column");
        columns[idx("rank")] = Arc::new(Int32Array::from(vec![rank; n]));
        columns[idx("step")] = Arc::new(step.finish());
        let values = given.values(&(self.names.clone() as ArrayRef));
        let dictionary = |mut keys: Int32Builder| -> ArrayRef {
            Arc::new(
                DictionaryArray::<Int32Type>::try_new(keys.finish(), values.clone())
                    .expect("keys index the resolver's names and the given texts"),
            )
        };
        columns[idx("op")] = dictionary(op);
        columns[idx("scope")] = dictionary(scope);
        if time_base != 0 {
            columns[idx("ts")] = Arc::new(shifted(ts, time_base)?);
        }
        Ok(RecordBatch::try_new(schema, columns).expect("same schema"))
    }
}

/// Texts an adapter gave for `op` or `scope`, as dictionary keys that follow the resolver's
/// names.
struct GivenTexts<'a> {
    first_key: usize,
    texts: Vec<&'a str>,
    keys: HashMap<&'a str, i32>,
}

impl<'a> GivenTexts<'a> {
    fn new(first_key: usize) -> Self {
        GivenTexts {
            first_key,
            texts: Vec::new(),
            keys: HashMap::new(),
        }
    }

    /// The key of row `i` of `column`, null where it is null.
    fn key(&mut self, column: &'a DictionaryArray<Int32Type>, i: usize) -> Option<i32> {
        let text = column.values().as_string::<i32>().value(column.key(i)?);
        let next = (self.first_key + self.texts.len()) as i32;
        Some(*self.keys.entry(text).or_insert_with(|| {
            self.texts.push(text);
            next
        }))
    }

    /// The dictionary values: `names`, then the given texts.
    fn values(&self, names: &ArrayRef) -> ArrayRef {
        if self.texts.is_empty() {
            return names.clone();
        }
        let texts = StringArray::from_iter_values(self.texts.iter());
        concat(&[names.as_ref(), &texts]).expect("two text arrays concatenate")
    }
}

/// `ts + time_base` of every row; an error where that passes the 64-bit range (adapters
/// check their times first: this only keeps a time from ever wrapping).
fn shifted(ts: &Int64Array, time_base: i64) -> std::io::Result<Int64Array> {
    let values = ts
        .values()
        .iter()
        .map(|&v| v.checked_add(time_base))
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a timestamp plus the time base {time_base} passes 64-bit nanoseconds"),
            )
        })?;
    Ok(Int64Array::new(values.into(), ts.nulls().cloned()))
}

/// Sets `rank` and shifts `ts` of a counters batch.
pub fn resolve_counters(
    batch: &RecordBatch,
    rank: Option<i32>,
    time_base: i64,
) -> std::io::Result<RecordBatch> {
    let schema = batch.schema();
    let mut columns = batch.columns().to_vec();
    let n = batch.num_rows();
    columns[schema.index_of("rank").expect("rank")] = Arc::new(Int32Array::from(vec![rank; n]));
    if time_base != 0 {
        let i = schema.index_of("ts").expect("ts");
        columns[i] = Arc::new(shifted(columns[i].as_primitive::<Int64Type>(), time_base)?);
    }
    Ok(RecordBatch::try_new(schema, columns).expect("same schema"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(start: i64, end: i64, name: u32) -> HostInterval {
        HostInterval::new(0, start, end, name, false)
    }

    #[test]
    fn given_texts_get_keys_after_the_names_and_keep_their_text() {
        let names: ArrayRef = Arc::new(StringArray::from(vec!["aten::mm", "## forward ##"]));
        let given: DictionaryArray<Int32Type> =
            vec![Some("stage"), None, Some("aten::mm"), Some("stage")]
                .into_iter()
                .collect();
        let mut texts = GivenTexts::new(names.len());
        let keys: Vec<Option<i32>> = (0..given.len()).map(|i| texts.key(&given, i)).collect();
        assert_eq!(keys, vec![Some(2), None, Some(3), Some(2)]);
        let values = texts.values(&names);
        let values = values.as_string::<i32>();
        let text = |k: Option<i32>| k.map(|k| values.value(k as usize));
        let got: Vec<Option<&str>> = keys.iter().map(|&k| text(k)).collect();
        assert_eq!(
            got,
            vec![Some("stage"), None, Some("aten::mm"), Some("stage")]
        );
        // Without given texts the names are the values as they are (one shared array).
        assert!(Arc::ptr_eq(&GivenTexts::new(2).values(&names), &names));
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
