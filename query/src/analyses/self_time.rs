//! `self_time(run [, steps])`: exclusive (self) time of host ranges, per (rank, kind, name).
//!
//! Host ranges nest: a `python` function holds `cpu_op`s, which hold runtime calls, so summing
//! `dur` by kind counts the same moment several times (42.5 s of "python" in a 1.29 s trace).
//! A range's **self time** is the time it is the innermost open range of its thread (rank, pid,
//! tid): for properly nested ranges, `dur` minus the union of its direct children. Every moment
//! of a thread counts for exactly one range, so the self times of a thread add up to the union
//! of its ranges, and summing `self_dur` by kind is a true split of host time.
//!
//! Host ranges are the rows of kinds `python`, `cpu_op`, `annotation` (stage-log stages left
//! out: they are not on a traced thread), `runtime` and `driver`. Columns: `calls`, `total`
//! (summed `dur`), `self_dur` (summed self time, exact ns) and `self_pct` (`self_dur` / `total`).
//! With a step range (`self_time('r', '3..5')`) the ranges are clipped to the selected steps'
//! span.
//!
//! ```sql
//! SELECT kind, fmt_dur(sum(self_dur)) FROM self_time('llama-bs8') GROUP BY kind;
//! SELECT name, fmt_dur(self_dur), self_pct FROM self_time('llama-bs8') WHERE kind = 'python' LIMIT 10;
//! ```

use super::data::{collect, ints, strings, Names, Scope};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

pub static SELF_TIME: Spec =
    Spec::of_run("self_time", schema, |ctx, call| compute(ctx, call).boxed());

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("kind", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("calls", DataType::Int64, false),
        Field::new("total", DataType::Int64, false),
        Field::new("self_dur", DataType::Int64, false),
        Field::new("self_pct", DataType::Float64, true),
    ]))
}

/// The self time of each of one thread's ranges `(start, end)`: the time it is the innermost
/// open range (the latest-started one still open; of two starting together, the shorter).
pub fn self_times(ranges: &[(i64, i64)]) -> Vec<i64> {
    let mut points: Vec<(i64, bool, Reverse<i64>, usize)> = Vec::with_capacity(2 * ranges.len());
    for (i, &(s, e)) in ranges.iter().enumerate() {
        if e > s {
            // At the same instant ends come first (`false`), and the longer of two ranges that
            // start together opens first, so the shorter is the inner one.
            points.push((s, true, Reverse(e), i));
            points.push((e, false, Reverse(e), i));
        }
    }
    points.sort_unstable();
    let mut out = vec![0i64; ranges.len()];
    let mut open: Vec<usize> = Vec::new();
    let mut now = i64::MIN;
    for (t, start, _, i) in points {
        if let Some(&top) = open.last() {
            out[top] += t - now;
        }
        now = t;
        if start {
            open.push(i);
        } else if let Some(at) = open.iter().rposition(|&j| j == i) {
            open.remove(at);
        }
    }
    out
}

/// One (rank, kind, name) row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelfTime {
    pub rank: Option<i32>,
    pub kind: String,
    pub name: String,
    pub calls: i64,
    pub total: i64,
    pub self_dur: i64,
}

/// The self times of `run`'s host ranges in `scope`, by self time.
pub async fn load(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<SelfTime>> {
    let sql = format!(
        "SELECT rank, pid, tid, kind, name, ts, ts + dur FROM events WHERE run = {} \
         AND kind IN ('python', 'cpu_op', 'annotation', 'runtime', 'driver') AND dur >= 0 \
         AND (kind <> 'annotation' OR scope IS NULL OR scope <> 'stage')",
        literal(run)
    );
    let mut names = Names::default();
    // (rank, pid, tid) -> (start, end, kind, name) of its ranges.
    type Key = (Option<i32>, u32, u32);
    let mut threads: HashMap<(Option<i32>, Option<i64>, Option<i64>), Vec<(i64, i64, Key)>> =
        HashMap::new();
    for b in collect(ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (kind, name) = (strings(&b, 3)?, strings(&b, 4)?);
        let (ts, end) = (ints(&b, 5)?, ints(&b, 6)?);
        for i in 0..b.num_rows() {
            let rank_i = rank[i].map(|r| r as i32);
            let (Some(s), Some(e)) = (ts[i], end[i]) else {
                continue;
            };
            let Some((s, e)) = scope.clip(rank_i, s, e) else {
                continue;
            };
            let key = (
                rank_i,
                names.id(kind[i].as_deref().unwrap_or("")),
                names.id(name[i].as_deref().unwrap_or("")),
            );
            threads
                .entry((rank_i, pid[i], tid[i]))
                .or_default()
                .push((s, e, key));
        }
    }
    let mut rows: HashMap<Key, SelfTime> = HashMap::new();
    for ranges in threads.values() {
        let spans: Vec<(i64, i64)> = ranges.iter().map(|r| (r.0, r.1)).collect();
        for (r, own) in ranges.iter().zip(self_times(&spans)) {
            let row = rows.entry(r.2).or_insert_with(|| SelfTime {
                rank: r.2 .0,
                kind: names.get(r.2 .1).to_string(),
                name: names.get(r.2 .2).to_string(),
                ..Default::default()
            });
            row.calls += 1;
            row.total += r.1 - r.0;
            row.self_dur += own;
        }
    }
    let mut out: Vec<SelfTime> = rows.into_values().collect();
    out.sort_by(|a, b| {
        (Reverse(a.self_dur), a.rank, &a.kind, &a.name).cmp(&(
            Reverse(b.self_dur),
            b.rank,
            &b.kind,
            &b.name,
        ))
    });
    Ok(out)
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load(&ctx, &call.run, &scope).await?;
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.kind.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.name.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.calls))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.total))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.self_dur),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| {
            (r.total > 0).then(|| (1000.0 * r.self_dur as f64 / r.total as f64).round() / 10.0)
        }))),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::self_times;

    #[test]
    fn self_time_is_the_time_a_range_is_the_innermost_one() {
        // python [0,100) holds cpu_op [10,50), which holds runtime [20,30); a second cpu_op
        // [60,90) holds nothing; a range equal to its parent [60,90) is the inner one.
        let ranges = [(0, 100), (10, 50), (20, 30), (60, 90), (60, 90)];
        let own = self_times(&ranges);
        assert_eq!(own, vec![100 - 40 - 30, 40 - 10, 10, 0, 30]);
        // Every moment counts once: the self times add up to the union of the ranges.
        assert_eq!(own.iter().sum::<i64>(), 100);
        // A range that outlives its parent: [40,80) inside [0,50) only until 50.
        let own = self_times(&[(0, 50), (40, 80), (100, 100)]);
        assert_eq!(own, vec![40, 40, 0]);
    }
}
