//! What attribution reads from the host side of a trace: operator and annotation intervals,
//! launch calls, profiler steps and threads ([`HostStructure`]), gathered by the adapters while
//! parsing or from spooled rows ([`host_structure`]).

use crate::columns::{kinds_of, Kind};
use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use std::collections::HashMap;
use std::sync::Arc;

/// Interns strings into dense ids.
#[derive(Debug, Default)]
pub struct Interner {
    ids: HashMap<Arc<str>, u32, ahash::RandomState>,
    names: Vec<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.names.len() as u32;
        let s: Arc<str> = Arc::from(s);
        self.names.push(s.clone());
        self.ids.insert(s, id);
        id
    }

    pub fn name(&self, id: u32) -> &Arc<str> {
        &self.names[id as usize]
    }

    pub fn names(&self) -> &[Arc<str>] {
        &self.names
    }
}

/// A host interval (an operator or an annotation) on one thread. 24 bytes: a large trace holds
/// millions of these until it is attributed.
#[derive(Debug, Clone, Copy)]
pub struct HostInterval {
    pub start: i64,
    pub end: i64,
    /// Id in [`HostStructure::names`].
    pub name: u32,
    /// Id in [`HostStructure::threads`] shifted left by one; the low bit marks an annotation.
    thread_and_kind: u32,
}

impl HostInterval {
    pub fn new(thread: u32, start: i64, end: i64, name: u32, annotation: bool) -> HostInterval {
        HostInterval {
            start,
            end,
            name,
            thread_and_kind: thread << 1 | annotation as u32,
        }
    }

    pub fn thread(&self) -> u32 {
        self.thread_and_kind >> 1
    }

    pub fn annotation(&self) -> bool {
        self.thread_and_kind & 1 == 1
    }

    /// Sort key: thread, operators before annotations, start, longest first.
    pub fn order_key(&self) -> (u32, i64, std::cmp::Reverse<i64>) {
        (
            self.thread_and_kind,
            self.start,
            std::cmp::Reverse(self.end),
        )
    }
}

/// A launch call: where the GPU work with this correlation id was issued from.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub correlation: i64,
    pub ts: i64,
    /// Id in [`HostStructure::threads`].
    pub thread: u32,
}

impl Launch {
    pub fn new(correlation: i64, ts: i64, thread: u32) -> Launch {
        Launch {
            correlation,
            ts,
            thread,
        }
    }
}

/// Dense ids of host threads (pid, tid).
#[derive(Debug, Default, Clone)]
pub struct Threads {
    ids: HashMap<(i64, i64), u32, ahash::RandomState>,
    keys: Vec<(i64, i64)>,
}

impl Threads {
    pub fn intern(&mut self, pid: i64, tid: i64) -> u32 {
        let next = self.keys.len() as u32;
        *self.ids.entry((pid, tid)).or_insert_with(|| {
            self.keys.push((pid, tid));
            next
        })
    }

    pub fn get(&self, pid: i64, tid: i64) -> Option<u32> {
        self.ids.get(&(pid, tid)).copied()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn keys(&self) -> &[(i64, i64)] {
        &self.keys
    }
}

/// A profiler step range. `process` is the pid it applies to when correlation ids (and steps)
/// are per process ([`HostStructure::correlation_per_process`]), else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Step {
    pub process: i64,
    pub start: i64,
    pub end: i64,
    pub number: i64,
}

/// Host-side structure gathered while parsing; ids refer to its interners.
#[derive(Debug, Default)]
pub struct HostStructure {
    pub names: Interner,
    pub threads: Threads,
    pub intervals: Vec<HostInterval>,
    pub launches: Vec<Launch>,
    /// Launch calls that no row holds (the tails of legacy `export_chrome_trace` flow arrows):
    /// kept when the other ranges and launches are left to be found again in the rows, a
    /// window at a time. One per kernel of such a trace, 24 bytes each.
    pub unstored_launches: Vec<Launch>,
    /// `(start, end, step number)` of `ProfilerStep#N` ranges.
    pub steps: Vec<Step>,
    /// Earliest start and latest end of any host (non-GPU) event.
    pub host_span: Option<(i64, i64)>,
    /// Correlation ids are unique per process only (Nsight Systems): GPU work is matched to
    /// the launch with the same correlation id *and* the same `pid`.
    pub correlation_per_process: bool,
}

impl HostStructure {
    /// Appends `other`, translating its name and thread ids into this structure's.
    pub fn absorb(&mut self, other: HostStructure) {
        let names: Vec<u32> = other
            .names
            .names()
            .iter()
            .map(|n| self.names.intern(n))
            .collect();
        let threads: Vec<u32> = other
            .threads
            .keys()
            .iter()
            .map(|&(p, t)| self.threads.intern(p, t))
            .collect();
        self.intervals.extend(other.intervals.into_iter().map(|iv| {
            HostInterval::new(
                threads[iv.thread() as usize],
                iv.start,
                iv.end,
                names[iv.name as usize],
                iv.annotation(),
            )
        }));
        let translate = |mut l: Launch| {
            l.thread = threads[l.thread as usize];
            l
        };
        self.launches
            .extend(other.launches.into_iter().map(translate));
        self.unstored_launches
            .extend(other.unstored_launches.into_iter().map(translate));
        self.steps.extend(other.steps);
        if let Some((lo, hi)) = other.host_span {
            self.extend_host_span(lo, hi);
        }
    }

    pub fn extend_host_span(&mut self, start: i64, end: i64) {
        self.host_span = Some(match self.host_span {
            Some((lo, hi)) => (lo.min(start), hi.max(end)),
            None => (start, end),
        });
    }
}

/// How an adapter reads host ranges from its rows ([`host_structure`]).
#[derive(Clone)]
pub struct RangeRules {
    /// Shortest duration of a range: rows that last less contain no time of theirs.
    pub min_dur: i64,
    /// Whether a range needs its row's pid and tid; else a missing one counts as 0.
    pub needs_thread: bool,
    /// A range's name and whether it is an annotation, from its kind (`CpuOp` or
    /// `Annotation`), the row's name and [`RangeRules::step_pattern`].
    pub name: for<'a> fn(Kind, &'a str, Option<&regex::Regex>) -> (&'a str, bool),
    /// The pattern the trace's steps were found by (`--step-pattern`), if not the adapter's
    /// default: a range that marks a step is a scope, never an operator.
    pub step_pattern: Option<regex::Regex>,
}

/// Adds the host ranges (operator and annotation rows lasting at least `rules.min_dur`) and
/// the launch calls (runtime and driver rows with a correlation id, a pid and a tid) among
/// the rows of `batch` to `host`, whose names and threads they are interned in. Steps are not
/// added. Used where attribution reads ranges from spooled rows, a time window at a time.
pub fn host_structure(batch: &RecordBatch, host: &mut HostStructure, rules: &RangeRules) {
    let col = |name: &str| batch.column_by_name(name).expect("events column");
    let (kinds, kind_values) = kinds_of(batch);
    let names = col("name").as_dictionary::<Int32Type>();
    let name_values = names.values().as_string::<i32>();
    // Per name, for an operator row and for an annotation row: its range name's id, and
    // whether that is an annotation.
    let mut name_ids: Vec<[Option<(u32, bool)>; 2]> = vec![[None; 2]; name_values.len()];
    let pid = col("pid").as_primitive::<Int64Type>();
    let tid = col("tid").as_primitive::<Int64Type>();
    let ts = col("ts").as_primitive::<Int64Type>();
    let dur = col("dur").as_primitive::<Int64Type>();
    let corr = col("correlation").as_primitive::<Int64Type>();
    // Rows come in runs of one thread: its id is looked up once per run.
    let mut last_thread: Option<((i64, i64), u32)> = None;
    let mut thread_of = |threads: &mut Threads, key: (i64, i64)| match last_thread {
        Some((k, id)) if k == key => id,
        _ => {
            let id = threads.intern(key.0, key.1);
            last_thread = Some((key, id));
            id
        }
    };
    let has_thread = |i: usize| pid.is_valid(i) && tid.is_valid(i);
    let value = |a: &Int64Array, i: usize| if a.is_valid(i) { a.value(i) } else { 0 };
    for i in 0..batch.num_rows() {
        let Some(kind) = kind_values[kinds.keys().value(i) as usize] else {
            continue;
        };
        if kind.is_launch() {
            if corr.is_valid(i) && has_thread(i) {
                let thread = thread_of(&mut host.threads, (pid.value(i), tid.value(i)));
                host.launches
                    .push(Launch::new(corr.value(i), ts.value(i), thread));
            }
            continue;
        }
        let is_range = matches!(kind, Kind::CpuOp | Kind::Annotation)
            && dur.value(i) >= rules.min_dur
            && (has_thread(i) || !rules.needs_thread);
        if !is_range {
            continue;
        }
        let key = names.keys().value(i) as usize;
        let (name, annotation) = *name_ids[key][(kind == Kind::Annotation) as usize]
            .get_or_insert_with(|| {
                let (name, annotation) =
                    (rules.name)(kind, name_values.value(key), rules.step_pattern.as_ref());
                (host.names.intern(name), annotation)
            });
        let thread = thread_of(&mut host.threads, (value(pid, i), value(tid, i)));
        let start = ts.value(i);
        host.intervals.push(HostInterval::new(
            thread,
            start,
            start + dur.value(i),
            name,
            annotation,
        ));
    }
}

/// `N` of `ProfilerStep#N`.
pub fn profiler_step_number(name: &str) -> Option<i64> {
    name.strip_prefix("ProfilerStep#")?.parse().ok()
}

// The attribution index is held for a whole trace file: keep its entries small.
const _: () = assert!(std::mem::size_of::<HostInterval>() == 24);
const _: () = assert!(std::mem::size_of::<Launch>() == 24);
