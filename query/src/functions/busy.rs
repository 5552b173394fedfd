//! `busy_time` and `idle_ratio`: aggregates over the union of `[ts, ts + dur)` intervals.
//!
//! Both share one exact, mergeable state, [`IntervalSet`]: the busy set as a list of runs
//! `(start, end)` plus the span (`lo`, `hi`). Input that arrives sorted by `ts` (the usual case
//! within a stream) is coalesced on the fly — an interval starting at or before the end of the
//! last run extends it, otherwise it opens a new run — so a busy GPU keeps a handful of runs per
//! group. Out-of-order input (the next stream of a device, in the store's order) goes to a tail
//! that is merged into the sorted runs in linear time once it is as long as they are, and
//! before a state is emitted or evaluated. Partial states (one per partition) are lists of sorted, disjoint runs and merge the
//! same way, so results are exact across batch and partition boundaries. A native
//! [`GroupsAccumulator`] serves `GROUP BY`.

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, LargeListArray,
};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::{format_state_name, AggregateOrderSensitivity};
use datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, Signature,
    TypeSignature, Volatility,
};
use std::sync::{Arc, LazyLock};

/// The union of a set of half-open intervals, plus the span of the rows that produced them.
#[derive(Debug, Clone)]
pub struct IntervalSet {
    /// Runs whose union is the busy set. `runs[..prefix]` are sorted by start and pairwise
    /// disjoint (not touching); the tail after them holds out-of-order input until the next
    /// [`normalize`](Self::normalize).
    runs: Vec<(i64, i64)>,
    prefix: usize,
    /// Span: min start and max end over all rows seen (window bounds for the windowed form);
    /// `lo > hi` means no row yet.
    lo: i64,
    hi: i64,
}

impl Default for IntervalSet {
    fn default() -> Self {
        Self {
            runs: Vec::new(),
            prefix: 0,
            lo: i64::MAX,
            hi: i64::MIN,
        }
    }
}

impl IntervalSet {
    /// Adds the busy interval `[s, e)` (empty when `e <= s`) and widens the span to `[lo, hi)`.
    #[inline]
    pub fn add(&mut self, s: i64, e: i64, lo: i64, hi: i64) {
        self.lo = self.lo.min(lo);
        self.hi = self.hi.max(hi);
        self.push_run(s, e);
    }

    #[inline]
    fn push_run(&mut self, s: i64, e: i64) {
        if e <= s {
            return;
        }
        let n = self.runs.len();
        match self.runs.last_mut() {
            Some(last) if s >= last.0 => {
                if s <= last.1 {
                    if e > last.1 {
                        last.1 = e;
                    }
                } else {
                    self.runs.push((s, e));
                    if self.prefix == n {
                        self.prefix = n + 1;
                    }
                }
            }
            Some(_) => {
                self.runs.push((s, e));
                // Merge once the tail is as long as the sorted prefix: each merge costs at most
                // twice the tail it absorbs, so the total stays linear.
                if n + 1 - self.prefix >= self.prefix + 64 {
                    self.normalize();
                }
            }
            None => {
                self.runs.push((s, e));
                self.prefix = 1;
            }
        }
    }

    /// Sorts the tail (usually already sorted: one stream after another) and merges it into the
    /// prefix, coalescing overlapping and touching runs.
    pub fn normalize(&mut self) {
        if self.prefix == self.runs.len() {
            return;
        }
        let len = self.runs.len();
        let (head, tail) = self.runs.split_at_mut(self.prefix);
        if !tail.is_sorted_by_key(|r| r.0) {
            // Stable sort: it finds the sorted stretches (streams) and merges them.
            tail.sort_by_key(|r| r.0);
        }
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(len);
        let (mut i, mut j) = (0, 0);
        while i < head.len() || j < tail.len() {
            let next = if j == tail.len() || (i < head.len() && head[i].0 <= tail[j].0) {
                i += 1;
                head[i - 1]
            } else {
                j += 1;
                tail[j - 1]
            };
            crate::analyses::intervals::push_coalesced(&mut merged, next);
        }
        self.runs = merged;
        self.prefix = self.runs.len();
    }

    /// True when no row has been added.
    pub fn is_empty(&self) -> bool {
        self.lo > self.hi
    }

    /// Length of the union (normalises first).
    pub fn busy(&mut self) -> i64 {
        self.normalize();
        let total: i128 = self
            .runs
            .iter()
            .map(|&(s, e)| (e as i128) - (s as i128))
            .sum();
        total.min(i64::MAX as i128) as i64
    }

    /// `hi - lo`, saturating.
    pub fn span(&self) -> i64 {
        self.hi.saturating_sub(self.lo)
    }

    /// Merges a partial state: flattened `(start, end)` pairs plus its span.
    fn merge_flat(&mut self, flat: &[i64], lo: i64, hi: i64) {
        self.lo = self.lo.min(lo);
        self.hi = self.hi.max(hi);
        if self.runs.is_empty() {
            // The usual final-stage case: one partial state per group, already normalised.
            self.runs.extend(
                flat.chunks_exact(2)
                    .map(|p| (p[0], p[1]))
                    .filter(|r| r.1 > r.0),
            );
            let disjoint = self.runs.windows(2).all(|w| w[0].1 < w[1].0);
            self.prefix = if disjoint { self.runs.len() } else { 0 };
            return;
        }
        for pair in flat.chunks_exact(2) {
            self.push_run(pair[0], pair[1]);
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.runs.capacity() * std::mem::size_of::<(i64, i64)>()
    }
}

/// Which aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    BusyTime,
    IdleRatio,
}

impl Kind {
    fn result(self, set: &mut IntervalSet) -> ScalarValue {
        match self {
            Kind::BusyTime => ScalarValue::Int64((!set.is_empty()).then(|| set.busy())),
            Kind::IdleRatio => ScalarValue::Float64(idle_ratio(set)),
        }
    }
}

fn idle_ratio(set: &mut IntervalSet) -> Option<f64> {
    if set.is_empty() || set.span() <= 0 {
        return None;
    }
    let busy = set.busy() as f64;
    Some(1.0 - busy / set.span() as f64)
}

/// Calls `f(row, start, end, span_lo, span_hi)` for every row of `values` that is an interval
/// (2 arguments `ts, dur`, or 4 with `window_start, window_end`; see the function docs).
#[inline]
fn for_each_interval(
    values: &[ArrayRef],
    filter: Option<&BooleanArray>,
    mut f: impl FnMut(usize, i64, i64, i64, i64),
) {
    let ts = values[0].as_primitive::<Int64Type>();
    let dur = values[1].as_primitive::<Int64Type>();
    let n = ts.len();
    let window = (values.len() == 4).then(|| {
        (
            values[2].as_primitive::<Int64Type>(),
            values[3].as_primitive::<Int64Type>(),
        )
    });
    let any_nulls = values.iter().any(|v| v.null_count() > 0);
    let keep = |i: usize| filter.is_none_or(|f| f.is_valid(i) && f.value(i));
    match window {
        None if !any_nulls && filter.is_none() => {
            let (t, d) = (ts.values(), dur.values());
            for i in 0..n {
                let (t, d) = (t[i], d[i]);
                if d >= 0 {
                    let e = t.saturating_add(d);
                    f(i, t, e, t, e);
                }
            }
        }
        None => {
            for i in 0..n {
                if ts.is_valid(i) && dur.is_valid(i) && keep(i) {
                    let (t, d) = (ts.value(i), dur.value(i));
                    if d >= 0 {
                        let e = t.saturating_add(d);
                        f(i, t, e, t, e);
                    }
                }
            }
        }
        Some((ws, we)) => {
            for i in 0..n {
                if !any_nulls
                    || (ts.is_valid(i) && dur.is_valid(i) && ws.is_valid(i) && we.is_valid(i))
                {
                    if !keep(i) {
                        continue;
                    }
                    let (t, d, lo, hi) = (ts.value(i), dur.value(i), ws.value(i), we.value(i));
                    if d >= 0 && hi >= lo {
                        let s = t.max(lo);
                        let e = t.saturating_add(d).min(hi);
                        f(i, s, e.max(s), lo, hi);
                    }
                }
            }
        }
    }
}

fn item_field() -> FieldRef {
    Arc::new(Field::new_list_field(DataType::Int64, true))
}

fn state_fields(name: &str) -> Vec<FieldRef> {
    vec![
        Arc::new(Field::new_large_list(
            format_state_name(name, "runs"),
            item_field(),
            true,
        )),
        Arc::new(Field::new(
            format_state_name(name, "lo"),
            DataType::Int64,
            true,
        )),
        Arc::new(Field::new(
            format_state_name(name, "hi"),
            DataType::Int64,
            true,
        )),
    ]
}

/// Builds the three state columns for `sets` (normalising each).
fn state_arrays(sets: &mut [IntervalSet]) -> Vec<ArrayRef> {
    let mut offsets = Vec::with_capacity(sets.len() + 1);
    offsets.push(0i64);
    let mut flat = Vec::new();
    let mut lo = Vec::with_capacity(sets.len());
    let mut hi = Vec::with_capacity(sets.len());
    for set in sets.iter_mut() {
        set.normalize();
        for &(s, e) in &set.runs {
            flat.push(s);
            flat.push(e);
        }
        offsets.push(flat.len() as i64);
        lo.push(set.lo);
        hi.push(set.hi);
    }
    let list = LargeListArray::new(
        item_field(),
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Arc::new(Int64Array::from(flat)),
        None,
    );
    vec![
        Arc::new(list),
        Arc::new(Int64Array::from(lo)),
        Arc::new(Int64Array::from(hi)),
    ]
}

/// Calls `f(row, flat_pairs, lo, hi)` for every row of partial states.
fn for_each_state(states: &[ArrayRef], mut f: impl FnMut(usize, &[i64], i64, i64)) {
    let list = states[0].as_list::<i64>();
    let lo = states[1].as_primitive::<Int64Type>();
    let hi = states[2].as_primitive::<Int64Type>();
    let values = list.values().as_primitive::<Int64Type>().values();
    let offsets = list.value_offsets();
    for i in 0..list.len() {
        if list.is_null(i) || lo.is_null(i) || hi.is_null(i) {
            continue;
        }
        let flat = &values[offsets[i] as usize..offsets[i + 1] as usize];
        f(i, flat, lo.value(i), hi.value(i));
    }
}

/// Single-group accumulator (no `GROUP BY`, or window use).
#[derive(Debug)]
struct IntervalAccumulator {
    kind: Kind,
    set: IntervalSet,
}

impl Accumulator for IntervalAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let set = &mut self.set;
        for_each_interval(values, None, |_, s, e, lo, hi| set.add(s, e, lo, hi));
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(self.kind.result(&mut self.set))
    }

    fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.set.size() - std::mem::size_of::<IntervalSet>()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let arrays = state_arrays(std::slice::from_mut(&mut self.set));
        arrays
            .iter()
            .map(|a| ScalarValue::try_from_array(a, 0))
            .collect()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let set = &mut self.set;
        for_each_state(states, |_, flat, lo, hi| set.merge_flat(flat, lo, hi));
        Ok(())
    }
}

/// Accumulator for all groups of a `GROUP BY`.
#[derive(Debug)]
struct IntervalGroupsAccumulator {
    kind: Kind,
    groups: Vec<IntervalSet>,
}

impl IntervalGroupsAccumulator {
    fn resize(&mut self, total_num_groups: usize) {
        if self.groups.len() < total_num_groups {
            self.groups
                .resize_with(total_num_groups, IntervalSet::default);
        }
    }
}

impl GroupsAccumulator for IntervalGroupsAccumulator {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let groups = &mut self.groups;
        for_each_interval(values, opt_filter, |i, s, e, lo, hi| {
            groups[group_indices[i]].add(s, e, lo, hi)
        });
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let mut sets = emit_to.take_needed(&mut self.groups);
        Ok(match self.kind {
            Kind::BusyTime => Arc::new(
                sets.iter_mut()
                    .map(|s| (!s.is_empty()).then(|| s.busy()))
                    .collect::<Int64Array>(),
            ),
            Kind::IdleRatio => Arc::new(sets.iter_mut().map(idle_ratio).collect::<Float64Array>()),
        })
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let mut sets = emit_to.take_needed(&mut self.groups);
        Ok(state_arrays(&mut sets))
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        let groups = &mut self.groups;
        for_each_state(values, |i, flat, lo, hi| {
            groups[group_indices[i]].merge_flat(flat, lo, hi)
        });
        Ok(())
    }

    /// One single-interval state per row (skip-partial aggregation for many small groups).
    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let mut sets = vec![IntervalSet::default(); values[0].len()];
        for_each_interval(values, opt_filter, |i, s, e, lo, hi| {
            sets[i].add(s, e, lo, hi)
        });
        Ok(state_arrays(&mut sets))
    }

    fn size(&self) -> usize {
        // O(groups) but cheap next to a batch; runs are the only heap state.
        std::mem::size_of::<Self>()
            + self.groups.capacity() * std::mem::size_of::<IntervalSet>()
            + self
                .groups
                .iter()
                .map(|g| g.runs.capacity() * std::mem::size_of::<(i64, i64)>())
                .sum::<usize>()
    }
}

fn interval_signature() -> Signature {
    Signature::one_of(
        vec![
            TypeSignature::Uniform(2, vec![DataType::Int64]),
            TypeSignature::Uniform(4, vec![DataType::Int64]),
        ],
        Volatility::Immutable,
    )
}

macro_rules! interval_udaf {
    ($ty:ident, $name:literal, $kind:expr, $ret:expr, $doc:ident) => {
        impl $ty {
            pub fn new() -> Self {
                Self {
                    signature: interval_signature(),
                }
            }
        }

        impl Default for $ty {
            fn default() -> Self {
                Self::new()
            }
        }

        impl AggregateUDFImpl for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn signature(&self) -> &Signature {
                &self.signature
            }

            fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
                Ok($ret)
            }

            fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
                Ok(Box::new(IntervalAccumulator {
                    kind: $kind,
                    set: IntervalSet::default(),
                }))
            }

            fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
                Ok(state_fields(args.name))
            }

            fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
                true
            }

            fn create_groups_accumulator(
                &self,
                _args: AccumulatorArgs,
            ) -> Result<Box<dyn GroupsAccumulator>> {
                Ok(Box::new(IntervalGroupsAccumulator {
                    kind: $kind,
                    groups: Vec::new(),
                }))
            }

            fn order_sensitivity(&self) -> AggregateOrderSensitivity {
                AggregateOrderSensitivity::Insensitive
            }

            fn documentation(&self) -> Option<&Documentation> {
                Some(&$doc)
            }
        }
    };
}

/// `busy_time(ts, dur) -> Int64`: nanoseconds covered by the union of the group's intervals
/// `[ts, ts + dur)` (overlaps counted once).
///
/// `busy_time(ts, dur, window_start, window_end)` clips each interval to its row's window
/// `[window_start, window_end)` first. Rows with a NULL argument, a negative `dur` or
/// `window_end < window_start` are skipped; NULL when no row is left. Exact across batches
/// and partitions.
///
/// ```sql
/// SELECT run, device, fmt_dur(busy_time(ts, dur)) FROM kernels GROUP BY run, device;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct BusyTime {
    signature: Signature,
}

/// `idle_ratio(ts, dur) -> Float64`: `1 - busy_time(ts, dur) / (max(ts + dur) - min(ts))`, the
/// idle share of the group's span. NULL when no row is left or the span is 0.
///
/// `idle_ratio(ts, dur, window_start, window_end)`: intervals are clipped to their row's window
/// and the ratio is `1 - busy / (max(window_end) - min(window_start))` — with a constant window
/// (the usual case, e.g. one step per group) that is `1 - busy / (window_end - window_start)`;
/// a row whose interval lies outside its window still contributes the window (ratio 1.0 when
/// nothing ran). Row skipping as for [`BusyTime`].
///
/// ```sql
/// SELECT run, device, idle_ratio(ts, dur) FROM kernels GROUP BY run, device;
/// SELECT s.step, idle_ratio(k.ts, k.dur, s.ts, s.ts + s.dur)
///   FROM steps s JOIN kernels k ON k.run = s.run AND k.ts < s.ts + s.dur AND k.ts + k.dur > s.ts
///   GROUP BY s.step;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct IdleRatio {
    signature: Signature,
}

static BUSY_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Nanoseconds covered by the union of the intervals [ts, ts + dur) (overlaps counted \
         once). With window_start/window_end, intervals are clipped to [window_start, window_end). \
         Rows with NULLs, negative dur or window_end < window_start are skipped; NULL when no row \
         is left.",
        "busy_time(ts, dur [, window_start, window_end])",
    )
    .with_sql_example("SELECT run, device, busy_time(ts, dur) FROM kernels GROUP BY run, device;")
    .with_argument("ts", "interval start (ns)")
    .with_argument("dur", "interval length (ns)")
    .with_argument(
        "window_start",
        "optional: start of the window to clip to (ns)",
    )
    .with_argument("window_end", "optional: end of the window to clip to (ns)")
    .build()
});

static IDLE_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Idle share of the group's span: 1 - busy_time(ts, dur) / (max(ts + dur) - min(ts)); \
         NULL when there are no rows or the span is 0. With window_start/window_end: intervals \
         are clipped to the window and the span is max(window_end) - min(window_start).",
        "idle_ratio(ts, dur [, window_start, window_end])",
    )
    .with_sql_example("SELECT run, device, idle_ratio(ts, dur) FROM kernels GROUP BY run, device;")
    .with_argument("ts", "interval start (ns)")
    .with_argument("dur", "interval length (ns)")
    .with_argument("window_start", "optional: window start (ns)")
    .with_argument("window_end", "optional: window end (ns)")
    .build()
});

interval_udaf!(
    BusyTime,
    "busy_time",
    Kind::BusyTime,
    DataType::Int64,
    BUSY_DOC
);
interval_udaf!(
    IdleRatio,
    "idle_ratio",
    Kind::IdleRatio,
    DataType::Float64,
    IDLE_DOC
);
