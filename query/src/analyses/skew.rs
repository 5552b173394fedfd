//! `collective_skew(run)`: in a multi-rank run, how far apart the ranks enter and leave each
//! collective, and which rank everyone waits for.
//!
//! Collectives are the kernels of class `communication` ([`kernel_class`](crate::functions)).
//! The k-th instance of a kernel name on each rank is taken to be the same collective call
//! (collectives run in the same order on every rank of a communicator); instances are matched
//! up to the smallest count over the ranks. Per call, the start skew is latest start −
//! earliest start and the end skew latest end − earliest end; the rank that started last is
//! the straggler of that call (the others sat in the collective waiting for it). Per name:
//! `calls`, mean and max of both skews, the most frequent straggler and how often it was
//! (`straggler_pct`). Ranks' clocks must be comparable (Kineto's epoch timestamps are; skews
//! under the clock offset between hosts are not meaningful).
//!
//! ```sql
//! SELECT name, calls, fmt_dur(CAST(start_skew_avg AS BIGINT)), straggler_rank, straggler_pct
//! FROM collective_skew('llama-8gpu') ORDER BY start_skew_avg DESC;
//! ```

use super::data::{collect, ints, strings};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub static COLLECTIVE_SKEW: Spec = Spec::of_run("collective_skew", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("name", DataType::Utf8, false),
        f("ranks", DataType::Int64, false),
        f("calls", DataType::Int64, false),
        f("start_skew_avg", DataType::Float64, false),
        f("start_skew_max", DataType::Int64, false),
        f("end_skew_avg", DataType::Float64, false),
        f("end_skew_max", DataType::Int64, false),
        f("straggler_rank", DataType::Int32, true),
        f("straggler_pct", DataType::Float64, true),
    ]))
}

/// One collective kernel name across the ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct Skew {
    pub name: String,
    pub ranks: i64,
    pub calls: i64,
    pub start_skew_avg: f64,
    pub start_skew_max: i64,
    pub end_skew_avg: f64,
    pub end_skew_max: i64,
    pub straggler_rank: Option<i32>,
    pub straggler_pct: Option<f64>,
}

/// Skews from (name -> rank -> [(start, end)] in start order).
pub fn skews(calls: &BTreeMap<String, BTreeMap<i32, Vec<(i64, i64)>>>) -> Vec<Skew> {
    let mut out = Vec::new();
    for (name, per_rank) in calls {
        if per_rank.len() < 2 {
            continue;
        }
        let n = per_rank.values().map(Vec::len).min().unwrap_or(0);
        if n == 0 {
            continue;
        }
        let (mut ss, mut es, mut smax, mut emax) = (0i128, 0i128, 0i64, 0i64);
        let mut stragglers: HashMap<i32, i64> = HashMap::new();
        for k in 0..n {
            let starts = per_rank.iter().map(|(r, v)| (v[k].0, *r));
            let (lo, hi) = (
                starts.clone().map(|s| s.0).min().unwrap_or(0),
                starts.clone().max().expect("two ranks"),
            );
            let ends = per_rank.values().map(|v| v[k].1);
            let (elo, ehi) = (ends.clone().min().unwrap_or(0), ends.max().unwrap_or(0));
            ss += (hi.0 - lo) as i128;
            es += (ehi - elo) as i128;
            smax = smax.max(hi.0 - lo);
            emax = emax.max(ehi - elo);
            if hi.0 > lo {
                *stragglers.entry(hi.1).or_default() += 1;
            }
        }
        let top = stragglers
            .iter()
            .max_by_key(|(r, c)| (**c, std::cmp::Reverse(**r)))
            .map(|(r, c)| (*r, *c));
        out.push(Skew {
            name: name.clone(),
            ranks: per_rank.len() as i64,
            calls: n as i64,
            start_skew_avg: ss as f64 / n as f64,
            start_skew_max: smax,
            end_skew_avg: es as f64 / n as f64,
            end_skew_max: emax,
            straggler_rank: top.map(|t| t.0),
            straggler_pct: top.map(|t| (1000.0 * t.1 as f64 / n as f64).round() / 10.0),
        });
    }
    out.sort_by(|a, b| {
        b.start_skew_avg
            .total_cmp(&a.start_skew_avg)
            .then_with(|| a.name.cmp(&b.name))
    });
    out
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let sql = format!(
        "SELECT name, rank, ts, ts + dur FROM kernels WHERE run = {} AND rank IS NOT NULL \
         AND kernel_class(name) = 'communication' ORDER BY rank, ts",
        literal(&call.run)
    );
    let mut calls: BTreeMap<String, BTreeMap<i32, Vec<(i64, i64)>>> = BTreeMap::new();
    for b in collect(&ctx, &sql).await? {
        let (name, rank, start, end) = (strings(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
        for i in 0..b.num_rows() {
            if let (Some(n), Some(r), Some(s), Some(e)) = (&name[i], rank[i], start[i], end[i]) {
                let per_rank = calls.entry(n.clone()).or_default();
                per_rank.entry(r as i32).or_default().push((s, e));
            }
        }
    }
    let rows = skews(&calls);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ranks))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.calls))),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.start_skew_avg),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.start_skew_max),
        )),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.end_skew_avg),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.end_skew_max),
        )),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.straggler_rank))),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| r.straggler_pct),
        )),
    ];
    batch(schema(), columns)
}
