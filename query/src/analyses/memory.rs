//! `memory_usage(run [, steps])`: the allocator's memory per device, its peak and what was
//! running at the peak, per step and over the selection, and the allocation churn.
//!
//! The source is the `[memory]` instants PyTorch's profiler writes with `profile_memory=True`:
//! one per allocation (`Bytes` > 0) or release (`Bytes` < 0) of the caching allocator, with
//! the device (`Device Type` 0 is host memory, reported with `device` NULL) and, from
//! PyTorch 1.10 on, the totals after it (`Total Allocated`, `Total Reserved`). The same totals
//! are the `[memory] Total Allocated` / `[memory] Total Reserved` series of the `counters`
//! table, which is the memory over time (and what `gpuq export` draws as counter tracks).
//!
//! Per (rank, device) one row for the whole selection (`step` NULL), then one per step:
//! - `start_allocated`: the allocated bytes when the selection or step began (the total after
//!   the last event before it; before the first event, that event's total less its `Bytes`);
//! - `peak_allocated`: the most allocated at any moment in it (the start level included);
//!   `peak_ts` is the first event that reached it, NULL when the start level is the peak;
//! - `peak_op`: the outermost operator (`cpu_op`) running on the allocating thread at the
//!   peak (what the model was doing), `peak_alloc_op` the innermost one (what allocated);
//! - `end_allocated`: allocated after its last event;
//! - `peak_reserved`: the most the allocator held from the device (NULL when not recorded);
//! - `allocs` / `alloc_bytes`, `frees` / `freed_bytes`: the churn, counted and summed.
//!
//! Traces without totals (PyTorch before 1.10) give only `Bytes`: the levels are then the
//! running sum from the trace's first event, so they are relative to an unknown baseline:
//! `relative` is true, and only differences between them mean something.
//!
//! Events at the same nanosecond are ordered by their `Ev Idx` (PyTorch's event index); without
//! one (older traces, whose timestamps are whole microseconds), allocations come before
//! releases, so a relative peak is the most the trace's resolution allows.
//!
//! `ProfilerStep#N` ranges, which older traces file as operators, are never the `peak_op`.
//!
//! ```sql
//! SELECT device, step, peak_allocated / 1048576 AS peak_mib, peak_op, alloc_bytes
//! FROM memory_usage('r') WHERE step IS NOT NULL ORDER BY peak_allocated DESC LIMIT 5;
//! ```

use super::data::{collect, ints, strings, Scope};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, BooleanArray, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub static MEMORY: Spec = Spec::of_run("memory_usage", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("run", DataType::Utf8, false),
        f("rank", DataType::Int32, true),
        f("device", DataType::Int32, true),
        f("step", DataType::Int64, true),
        f("relative", DataType::Boolean, false),
        f("start_allocated", DataType::Int64, false),
        f("peak_allocated", DataType::Int64, false),
        f("peak_ts", DataType::Int64, true),
        f("peak_op", DataType::Utf8, true),
        f("peak_alloc_op", DataType::Utf8, true),
        f("end_allocated", DataType::Int64, false),
        f("peak_reserved", DataType::Int64, true),
        f("allocs", DataType::Int64, false),
        f("alloc_bytes", DataType::Int64, false),
        f("frees", DataType::Int64, false),
        f("freed_bytes", DataType::Int64, false),
    ]))
}

/// One row of `memory_usage`.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRow {
    pub rank: Option<i32>,
    /// NULL: host memory.
    pub device: Option<i32>,
    /// NULL: the whole selection.
    pub step: Option<i64>,
    pub relative: bool,
    pub start_allocated: i64,
    pub peak_allocated: i64,
    pub peak_ts: Option<i64>,
    pub peak_op: Option<String>,
    pub peak_alloc_op: Option<String>,
    pub end_allocated: i64,
    pub peak_reserved: Option<i64>,
    pub allocs: i64,
    pub alloc_bytes: i64,
    pub frees: i64,
    pub freed_bytes: i64,
    /// The thread of the event that reached the peak: (pid, tid).
    thread: Option<(i64, i64)>,
}

/// The members of a `[memory]` instant's args that matter here.
#[derive(Deserialize)]
struct MemoryArgs {
    #[serde(rename = "Device Type")]
    device_type: Option<f64>,
    #[serde(rename = "Device Id")]
    device_id: Option<f64>,
    #[serde(rename = "Bytes")]
    bytes: Option<f64>,
    #[serde(rename = "Total Allocated")]
    allocated: Option<f64>,
    #[serde(rename = "Total Reserved")]
    reserved: Option<f64>,
    #[serde(rename = "Ev Idx")]
    index: Option<f64>,
}

/// One allocator event, with the level after it.
#[derive(Debug, Clone)]
struct Event {
    ts: i64,
    index: i64,
    step: Option<i64>,
    thread: Option<(i64, i64)>,
    bytes: i64,
    /// Allocated after the event (absolute, or the running sum when `relative`).
    level: i64,
    reserved: Option<i64>,
}

/// The rows of `memory_usage(run)` within `scope`: per (rank, device) the selection's row,
/// then its steps in order.
pub async fn load(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<MemoryRow>> {
    let sql = format!(
        "SELECT rank, step, pid, tid, ts, args FROM events WHERE run = {} AND kind = 'instant' \
         AND name = '[memory]' AND args IS NOT NULL",
        literal(run)
    );
    // (rank, device) -> events, with `level` filled in below
    let mut series: BTreeMap<(Option<i32>, Option<i32>), Vec<(Event, Option<i64>)>> =
        BTreeMap::new();
    for b in collect(ctx, &sql).await? {
        let (rank, step, pid, tid, ts) = (
            ints(&b, 0)?,
            ints(&b, 1)?,
            ints(&b, 2)?,
            ints(&b, 3)?,
            ints(&b, 4)?,
        );
        let args = strings(&b, 5)?;
        for i in 0..b.num_rows() {
            let (Some(ts), Some(text)) = (ts[i], &args[i]) else {
                continue;
            };
            let Ok(a) = serde_json::from_str::<MemoryArgs>(text) else {
                continue;
            };
            let device = match a.device_type {
                Some(t) if t != 0.0 => a.device_id.map(|d| d as i32),
                _ => None,
            };
            let event = Event {
                ts,
                index: a.index.map_or(i64::MAX, |x| x as i64),
                step: step[i],
                thread: pid[i].zip(tid[i]),
                bytes: a.bytes.unwrap_or(0.0) as i64,
                level: 0,
                reserved: a.reserved.map(|r| r as i64),
            };
            let key = (rank[i].map(|r| r as i32), device);
            series
                .entry(key)
                .or_default()
                .push((event, a.allocated.map(|x| x as i64)));
        }
    }
    let mut out = Vec::new();
    for ((rank, device), mut events) in series {
        events.sort_by_key(|(e, _)| (e.ts, e.index, -e.bytes));
        let relative = events.iter().all(|(_, total)| total.is_none());
        // The level before the first event: 0 for a running sum, else the first total less
        // the first event's bytes (a total is the level after its event).
        let mut level = match events.first() {
            Some((e, Some(total))) => total - e.bytes,
            _ => 0,
        };
        let before = level;
        let events: Vec<Event> = events
            .into_iter()
            .map(|(mut e, total)| {
                level = total.unwrap_or(level + e.bytes);
                e.level = level;
                e
            })
            .collect();
        // The level just before each event.
        let starts: Vec<i64> = std::iter::once(before)
            .chain(events.iter().map(|e| e.level))
            .collect();
        let kept: Vec<usize> = (0..events.len())
            .filter(|&i| scope.range.is_none() || scope.keeps(events[i].step))
            .collect();
        if kept.is_empty() {
            continue;
        }
        let row = |step: Option<i64>, idx: &[usize]| -> MemoryRow {
            summarise(rank, device, step, relative, &events, &starts, idx)
        };
        out.push(row(None, &kept));
        let mut by_step: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for &i in &kept {
            if let Some(s) = events[i].step {
                by_step.entry(s).or_default().push(i);
            }
        }
        for (step, idx) in by_step {
            out.push(row(Some(step), &idx));
        }
    }
    name_peak_ops(ctx, run, &mut out).await?;
    Ok(out)
}

/// The row of the events `idx` (in time order) of one (rank, device) series.
fn summarise(
    rank: Option<i32>,
    device: Option<i32>,
    step: Option<i64>,
    relative: bool,
    events: &[Event],
    starts: &[i64],
    idx: &[usize],
) -> MemoryRow {
    let first = idx[0];
    let start = starts[first];
    let mut row = MemoryRow {
        rank,
        device,
        step,
        relative,
        start_allocated: start,
        peak_allocated: start,
        peak_ts: None,
        peak_op: None,
        peak_alloc_op: None,
        end_allocated: events[*idx.last().expect("one event")].level,
        peak_reserved: None,
        allocs: 0,
        alloc_bytes: 0,
        frees: 0,
        freed_bytes: 0,
        thread: None,
    };
    for &i in idx {
        let e = &events[i];
        if e.level > row.peak_allocated {
            row.peak_allocated = e.level;
            row.peak_ts = Some(e.ts);
            row.thread = e.thread;
        }
        row.peak_reserved = row.peak_reserved.max(e.reserved);
        if e.bytes > 0 {
            row.allocs += 1;
            row.alloc_bytes += e.bytes;
        } else if e.bytes < 0 {
            row.frees += 1;
            row.freed_bytes -= e.bytes;
        }
    }
    row
}

/// Peaks are looked up this many at a time, in one scan each.
const PEAKS_PER_QUERY: usize = 256;

/// Fills `peak_op` and `peak_alloc_op`: the outermost and innermost `cpu_op` of the peak's
/// thread that contain the peak's moment.
async fn name_peak_ops(ctx: &SessionContext, run: &str, rows: &mut [MemoryRow]) -> Result<()> {
    let mut peaks: Vec<(i64, i64, i64)> = rows
        .iter()
        .filter_map(|r| Some((r.thread?.0, r.thread?.1, r.peak_ts?)))
        .collect();
    peaks.sort_unstable();
    peaks.dedup();
    peaks.sort_by_key(|p| p.2);
    // (pid, tid, ts) -> (outermost, innermost) as ((start, -end), name)
    type Op = ((i64, i64), String);
    let mut found: HashMap<(i64, i64, i64), (Op, Op)> = HashMap::new();
    for chunk in peaks.chunks(PEAKS_PER_QUERY) {
        let (lo, hi) = (chunk[0].2, chunk[chunk.len() - 1].2);
        let conditions: Vec<String> = chunk
            .iter()
            .map(|(p, t, ts)| {
                format!("(pid = {p} AND tid = {t} AND ts <= {ts} AND ts + dur >= {ts})")
            })
            .collect();
        let sql = format!(
            "SELECT pid, tid, ts, ts + dur, name FROM events WHERE run = {} AND kind = 'cpu_op' \
             AND dur >= 0 AND name NOT LIKE 'ProfilerStep#%' AND ts <= {hi} AND ts + dur >= {lo} \
             AND ({})",
            literal(run),
            conditions.join(" OR ")
        );
        for b in collect(ctx, &sql).await? {
            let (pid, tid, start, end) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
            let name = strings(&b, 4)?;
            for i in 0..b.num_rows() {
                let (Some(p), Some(t), Some(s), Some(e), Some(n)) =
                    (pid[i], tid[i], start[i], end[i], &name[i])
                else {
                    continue;
                };
                for &(pp, tt, ts) in chunk {
                    if (pp, tt) != (p, t) || s > ts || e < ts {
                        continue;
                    }
                    let op: Op = ((s, -e), n.clone());
                    let entry = found
                        .entry((p, t, ts))
                        .or_insert_with(|| (op.clone(), op.clone()));
                    // Outermost: earliest start, then latest end; innermost: the reverse.
                    if op.0 < entry.0 .0 || (op.0 == entry.0 .0 && op.1 < entry.0 .1) {
                        entry.0 = op.clone();
                    }
                    if op.0 > entry.1 .0 || (op.0 == entry.1 .0 && op.1 < entry.1 .1) {
                        entry.1 = op;
                    }
                }
            }
        }
    }
    for r in rows.iter_mut() {
        let Some(((p, t), ts)) = r.thread.zip(r.peak_ts) else {
            continue;
        };
        if let Some((outer, inner)) = found.get(&(p, t, ts)) {
            r.peak_op = Some(outer.1.clone());
            r.peak_alloc_op = Some(inner.1.clone());
        }
    }
    Ok(())
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load(&ctx, &call.run, &scope).await?;
    let int64 = |f: fn(&MemoryRow) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
    };
    let opt64 = |f: fn(&MemoryRow) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(rows.iter().map(f)))
    };
    let text = |f: fn(&MemoryRow) -> Option<&str>| -> ArrayRef {
        Arc::new(StringArray::from_iter(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.device))),
        opt64(|r| r.step),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.relative)),
        )),
        int64(|r| r.start_allocated),
        int64(|r| r.peak_allocated),
        opt64(|r| r.peak_ts),
        text(|r| r.peak_op.as_deref()),
        text(|r| r.peak_alloc_op.as_deref()),
        int64(|r| r.end_allocated),
        opt64(|r| r.peak_reserved),
        int64(|r| r.allocs),
        int64(|r| r.alloc_bytes),
        int64(|r| r.frees),
        int64(|r| r.freed_bytes),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts: i64, step: i64, bytes: i64, level: i64) -> Event {
        Event {
            ts,
            index: 0,
            step: Some(step),
            thread: Some((1, 1)),
            bytes,
            level,
            reserved: None,
        }
    }

    #[test]
    fn a_step_that_only_frees_peaks_at_the_level_it_began_with() {
        // Step 1 allocates to 300; step 2 only frees.
        let events = vec![
            event(10, 1, 100, 200),
            event(20, 1, 100, 300),
            event(30, 2, -50, 250),
            event(40, 2, -150, 100),
        ];
        let starts = vec![100, 200, 300, 250, 100];
        let one = summarise(None, Some(0), Some(1), false, &events, &starts, &[0, 1]);
        assert_eq!((one.start_allocated, one.peak_allocated), (100, 300));
        assert_eq!((one.peak_ts, one.end_allocated), (Some(20), 300));
        assert_eq!((one.allocs, one.alloc_bytes, one.frees), (2, 200, 0));
        let two = summarise(None, Some(0), Some(2), false, &events, &starts, &[2, 3]);
        assert_eq!((two.start_allocated, two.peak_allocated), (300, 300));
        assert_eq!(two.peak_ts, None, "the peak was carried in, not reached");
        assert_eq!(
            (two.frees, two.freed_bytes, two.end_allocated),
            (2, 200, 100)
        );
    }
}
