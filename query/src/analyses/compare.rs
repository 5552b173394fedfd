//! `compare(a, b [, level [, threshold_pct]])`: what got slower, faster, appeared or vanished
//! between two runs (or two sets of runs), telling real changes from noise.
//!
//! `a` and `b` are [selectors](super::selector): a run name or a SQL condition on `runs`.
//! `level` is `kernel` (default: per kernel name), `op` (per launching operator, GPU
//! operations), `class` (per `kernel_class`), `stage` (per stage of `stages()`) or `summary`
//! (step time, GPU busy / idle, kernel time and the breakdown, see [`profile`](super::profile)).
//!
//! **What is compared.** When every run on both sides has steps, a key's *time per step*
//! (mean over the steps; a step where the key did not run counts 0), else its *total*.
//! `delta` = b − a of that value in ns, `ratio` = b / a. With several runs on a side, each
//! number is the median over that side's runs and the samples are pooled.
//!
//! **Significance.** A change is `slower` / `faster` only when `|ratio − 1|` exceeds the
//! threshold (default 2 %) *and* it is significant:
//! - `test = 'per-step'`: a two-sided Mann–Whitney U test on the per-step times of both
//!   sides gives `p_value` < 0.01 (exact for up to 30 steps a side without ties, so at least
//!   5 steps a side are needed to reach it);
//! - `test = 'per-instance'` (no steps): the Mann–Whitney test on the instance durations
//!   gives `p_value` < 0.01;
//! - `test = 'count'` (no steps): the instance counts differ; counts are not noisy, so the
//!   change is real (no p-value);
//! - `test = 'none'`: fewer than two samples a side (a stage, a run-level metric without
//!   steps): the status says `(untested)`.
//!
//! Otherwise the status is `unchanged` (under the threshold) or `unchanged (noise)` (over it
//! but not significant). A key only on one side is `added` / `removed`. Multi-rank runs get
//! one row per key for all ranks together (`rank` NULL) and one per rank.
//!
//! ```sql
//! SELECT name, fmt_dur(delta), ratio, status FROM compare('main-0412', 'pr-1234')
//! WHERE rank IS NULL AND status <> 'unchanged' ORDER BY abs(delta) DESC;
//! SELECT * FROM compare('tags[''branch''] = ''main''', 'pr-1234', 'summary', 3);
//! ```

use super::profile::{load_profiles, Level, Profile, SUMMARY_METRICS};
use super::selector::run_names;
use super::stats::{mann_whitney, median, median_ints};
use super::{FnArgs, LazyTable};
use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use gpuq_engine::Store;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Default: changes under 2 % are `unchanged`.
pub const DEFAULT_THRESHOLD_PCT: f64 = 2.0;
/// Significance level of the tests.
pub const ALPHA: f64 = 0.01;

pub fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("rank", DataType::Int32, true),
        f("name", DataType::Utf8, false),
        f("count_a", DataType::Int64, false),
        f("count_b", DataType::Int64, false),
        f("total_a", DataType::Int64, false),
        f("total_b", DataType::Int64, false),
        f("avg_a", DataType::Float64, true),
        f("avg_b", DataType::Float64, true),
        f("share_a", DataType::Float64, true),
        f("share_b", DataType::Float64, true),
        f("value_a", DataType::Float64, false),
        f("value_b", DataType::Float64, false),
        f("delta", DataType::Int64, false),
        f("ratio", DataType::Float64, true),
        f("p_value", DataType::Float64, true),
        f("test", DataType::Utf8, false),
        f("status", DataType::Utf8, false),
    ]))
}

/// One compared key.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub rank: Option<i32>,
    pub name: String,
    pub count_a: i64,
    pub count_b: i64,
    pub total_a: i64,
    pub total_b: i64,
    pub share_a: Option<f64>,
    pub share_b: Option<f64>,
    /// Time per step (per-step test) or total.
    pub value_a: f64,
    pub value_b: f64,
    pub p_value: Option<f64>,
    pub test: &'static str,
    pub status: &'static str,
}

impl Row {
    pub fn delta(&self) -> i64 {
        (self.value_b - self.value_a).round() as i64
    }

    pub fn ratio(&self) -> Option<f64> {
        (self.value_a > 0.0).then(|| self.value_b / self.value_a)
    }
}

/// One side's numbers for one key and rank selection.
struct SideStats {
    count: i64,
    total: i64,
    value: f64,
    samples: Vec<i64>,
}

fn median_i64(v: Vec<i64>) -> i64 {
    median_ints(v).map_or(0, |m| m.round() as i64)
}

fn side_stats(side: &[Profile], key: &str, rank: Option<Option<i32>>, per_step: bool) -> SideStats {
    let mut counts = Vec::new();
    let mut totals = Vec::new();
    let mut values = Vec::new();
    let mut samples = Vec::new();
    for p in side {
        let measures = p.keys.get(key);
        let of_rank = |r: Option<i32>| rank.is_none_or(|want| want == r);
        let (mut count, mut total) = (0, 0);
        for (r, m) in measures.into_iter().flatten() {
            if of_rank(*r) {
                count += m.count;
                total += m.total;
                if !per_step {
                    samples.extend_from_slice(&m.instances);
                }
            }
        }
        counts.push(count);
        totals.push(total);
        if per_step {
            let steps: Vec<_> = p.steps_of(rank).collect();
            let mut sum = 0;
            for (r, step) in &steps {
                let v = measures
                    .and_then(|m| m.get(r))
                    .and_then(|m| m.per_step.get(step))
                    .copied()
                    .unwrap_or(0);
                sum += v;
                samples.push(v);
            }
            values.push(sum as f64 / steps.len().max(1) as f64);
        } else {
            values.push(total as f64);
        }
    }
    SideStats {
        count: median_i64(counts),
        total: median_i64(totals),
        value: median(&values).unwrap_or(0.0),
        samples,
    }
}

/// Compares sides `a` and `b` (profiles at one level); rows for all ranks, then per rank.
pub fn compare(a: &[Profile], b: &[Profile], threshold_pct: f64, summary: bool) -> Vec<Row> {
    let keys: BTreeSet<&String> = a.iter().chain(b).flat_map(|p| p.keys.keys()).collect();
    let ranks: BTreeSet<Option<i32>> = a.iter().chain(b).flat_map(Profile::ranks).collect();
    let per_rank = ranks.iter().flatten().count() > 1;
    let mut selections = vec![None];
    if per_rank {
        selections.extend(ranks.iter().map(|r| Some(*r)));
    }
    let mut out = Vec::new();
    for rank in selections {
        let per_step = a.iter().chain(b).all(|p| p.steps_of(rank).next().is_some());
        let mut rows: Vec<Row> = keys
            .iter()
            .map(|key| {
                let sa = side_stats(a, key, rank, per_step);
                let sb = side_stats(b, key, rank, per_step);
                judge(rank.flatten(), key, sa, sb, per_step, threshold_pct)
            })
            .filter(|r| r.count_a > 0 || r.count_b > 0)
            .collect();
        if !summary {
            let (ta, tb) = (
                rows.iter().map(|r| r.total_a).sum::<i64>(),
                rows.iter().map(|r| r.total_b).sum::<i64>(),
            );
            for r in &mut rows {
                r.share_a = share(r.total_a, ta);
                r.share_b = share(r.total_b, tb);
            }
            rows.sort_by(|x, y| {
                (y.delta().abs().cmp(&x.delta().abs())).then_with(|| x.name.cmp(&y.name))
            });
        } else {
            let order = |n: &str| SUMMARY_METRICS.iter().position(|m| *m == n);
            rows.sort_by_key(|r| order(&r.name));
        }
        out.extend(rows);
    }
    out
}

fn share(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| (1000.0 * part as f64 / whole as f64).round() / 10.0)
}

fn judge(
    rank: Option<i32>,
    key: &str,
    a: SideStats,
    b: SideStats,
    per_step: bool,
    threshold_pct: f64,
) -> Row {
    let mut row = Row {
        rank,
        name: key.to_string(),
        count_a: a.count,
        count_b: b.count,
        total_a: a.total,
        total_b: b.total,
        share_a: None,
        share_b: None,
        value_a: a.value,
        value_b: b.value,
        p_value: None,
        test: if per_step { "per-step" } else { "per-instance" },
        status: "unchanged",
    };
    if a.count == 0 {
        row.status = "added";
        row.test = "none";
        return row;
    }
    if b.count == 0 {
        row.status = "removed";
        row.test = "none";
        return row;
    }
    // Instance counts are not noisy: a different count is a real change.
    if !per_step && a.count != b.count {
        row.test = "count";
    } else if a.samples.len() < 2 || b.samples.len() < 2 {
        row.test = "none";
    } else {
        row.p_value = mann_whitney(&a.samples, &b.samples);
    }
    let change = match row.ratio() {
        Some(r) => r - 1.0,
        None if row.value_b > 0.0 => f64::INFINITY,
        None => 0.0,
    };
    if change.abs() * 100.0 <= threshold_pct {
        return row;
    }
    let slower = change > 0.0;
    row.status = match (row.test, slower) {
        ("none", true) => "slower (untested)",
        ("none", false) => "faster (untested)",
        ("count", true) => "slower",
        ("count", false) => "faster",
        _ if row.p_value.is_some_and(|p| p < ALPHA) => {
            if slower {
                "slower"
            } else {
                "faster"
            }
        }
        _ => "unchanged (noise)",
    };
    row
}

/// Resolves both selectors and compares their runs.
pub async fn compare_selectors(
    ctx: &SessionContext,
    store: &Store,
    a: &str,
    b: &str,
    level: Level,
    only: &[&str],
    threshold_pct: f64,
) -> Result<Vec<Row>> {
    let runs_a = run_names(ctx, store, a).await?;
    let runs_b = run_names(ctx, store, b).await?;
    compare_runs(ctx, &runs_a, &runs_b, level, only, threshold_pct).await
}

/// Loads the profiles of both sides' runs and compares them.
pub async fn compare_runs(
    ctx: &SessionContext,
    runs_a: &[String],
    runs_b: &[String],
    level: Level,
    only: &[&str],
    threshold_pct: f64,
) -> Result<Vec<Row>> {
    let pa = load_profiles(ctx, runs_a, level, only).await?;
    let pb = load_profiles(ctx, runs_b, level, only).await?;
    Ok(compare(&pa, &pb, threshold_pct, level == Level::Summary))
}

pub fn to_batch(rows: &[Row]) -> Result<Vec<RecordBatch>> {
    let avg = |t: i64, c: i64| (c > 0).then(|| t as f64 / c as f64);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.count_a))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.count_b))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.total_a))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.total_b))),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| avg(r.total_a, r.count_a)),
        )),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| avg(r.total_b, r.count_b)),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.share_a))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.share_b))),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.value_a),
        )),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.value_b),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(Row::delta))),
        Arc::new(Float64Array::from_iter(rows.iter().map(Row::ratio))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.p_value))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.test))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.status))),
    ];
    Ok(vec![RecordBatch::try_new(schema(), columns)?])
}

/// The `compare` table function.
#[derive(Debug)]
pub struct CompareFunction {
    pub store: Store,
}

const USAGE: &str = "compare(a, b [, level [, threshold_pct]])";

impl TableFunctionImpl for CompareFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let args = FnArgs::parse(args.exprs(), USAGE, 2..=4)?;
        let (a, b) = (args.required_text(0, "a")?, args.required_text(1, "b")?);
        let level = match args.text(2, "level")? {
            Some(l) => Level::parse(&l).map_err(|m| args.error(m))?,
            None => Level::Kernel,
        };
        let threshold = args
            .number(3, "threshold_pct", "a number >= 0", |t| t >= 0.0)?
            .unwrap_or(DEFAULT_THRESHOLD_PCT);
        let store = self.store.clone();
        Ok(Arc::new(LazyTable {
            name: "compare",
            schema: schema(),
            compute: Arc::new(move |ctx| {
                let (store, a, b) = (store.clone(), a.clone(), b.clone());
                async move {
                    let rows =
                        compare_selectors(&ctx, &store, &a, &b, level, &[], threshold).await?;
                    to_batch(&rows)
                }
                .boxed()
            }),
        }))
    }
}
