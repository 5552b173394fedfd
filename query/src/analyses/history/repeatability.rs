//! `repeatability(selector [, n])`: can a profile be trusted? Over repeated runs of one
//! configuration, per kernel: its time per step (mean over steps, total without steps) in
//! each run, and across the runs its mean, standard deviation and coefficient of variation
//! (`cv_pct`). `ranking_tau` is the stability of the top-`n` ranking (default 10): the mean
//! over every pair of runs of Kendall's tau-b between the two runs' times of the `n` kernels
//! with the largest mean (1 = same order in every repeat; under ~0.7 the "top kernels"
//! depend on which run one looks at). Rows are ordered by mean time, descending.
//!
//! ```sql
//! SELECT name, cv_pct, top_rank, ranking_tau FROM repeatability('tags[''config''] = ''bs8''', 5);
//! ```

use super::profile::{load_profiles, Level, Profile};
use super::selector::run_names;
use super::stats::{cv, kendall_tau, mean};
use crate::analyses::{FnArgs, LazyTable};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use gpuq_engine::Store;
use std::collections::BTreeSet;
use std::sync::Arc;

pub const DEFAULT_TOP: usize = 10;

/// One kernel across the repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Repeat {
    pub name: String,
    /// Runs the kernel appears in.
    pub runs: i64,
    pub mean: f64,
    pub stddev: Option<f64>,
    pub cv_pct: Option<f64>,
    pub min: f64,
    pub max: f64,
    /// 1-based position by mean time.
    pub top_rank: i64,
}

/// A kernel's time in one run: per step (mean) with steps, else total; 0 when absent.
fn value(p: &Profile, name: &str) -> f64 {
    let total: i64 = p
        .keys
        .get(name)
        .into_iter()
        .flatten()
        .map(|(_, m)| m.total)
        .sum();
    let steps = p.steps.len();
    if steps == 0 {
        return total as f64;
    }
    let in_steps: i64 = p
        .keys
        .get(name)
        .into_iter()
        .flatten()
        .flat_map(|(_, m)| m.per_step.values())
        .sum();
    in_steps as f64 / steps as f64
}

/// Per-kernel variation and the top-`n` ranking's Kendall tau (None under two runs).
pub fn repeatability(profiles: &[Profile], n: usize) -> (Vec<Repeat>, Option<f64>) {
    let names: BTreeSet<&String> = profiles.iter().flat_map(|p| p.keys.keys()).collect();
    let mut rows: Vec<(Repeat, Vec<f64>)> = names
        .into_iter()
        .map(|name| {
            let values: Vec<f64> = profiles.iter().map(|p| value(p, name)).collect();
            let m = mean(&values).unwrap_or(0.0);
            let c = cv(&values);
            let row = Repeat {
                name: name.clone(),
                runs: profiles
                    .iter()
                    .filter(|p| p.keys.contains_key(name))
                    .count() as i64,
                mean: m,
                stddev: c.map(|c| c * m),
                cv_pct: c.map(|c| (c * 1000.0).round() / 10.0),
                min: values.iter().copied().fold(f64::INFINITY, f64::min),
                max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                top_rank: 0,
            };
            (row, values)
        })
        .collect();
    rows.sort_by(|a, b| {
        b.0.mean
            .total_cmp(&a.0.mean)
            .then_with(|| a.0.name.cmp(&b.0.name))
    });
    for (i, r) in rows.iter_mut().enumerate() {
        r.0.top_rank = i as i64 + 1;
    }
    let top: Vec<&Vec<f64>> = rows.iter().take(n).map(|r| &r.1).collect();
    let mut taus = Vec::new();
    for a in 0..profiles.len() {
        for b in a + 1..profiles.len() {
            let x: Vec<f64> = top.iter().map(|v| v[a]).collect();
            let y: Vec<f64> = top.iter().map(|v| v[b]).collect();
            if let Some(t) = kendall_tau(&x, &y) {
                taus.push(t);
            }
        }
    }
    let tau = mean(&taus).map(|t| (t * 1000.0).round() / 1000.0);
    (rows.into_iter().map(|r| r.0).collect(), tau)
}

pub fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("name", DataType::Utf8, false),
        f("runs", DataType::Int64, false),
        f("mean", DataType::Float64, false),
        f("stddev", DataType::Float64, true),
        f("cv_pct", DataType::Float64, true),
        f("min", DataType::Float64, false),
        f("max", DataType::Float64, false),
        f("top_rank", DataType::Int64, false),
        f("ranking_tau", DataType::Float64, true),
    ]))
}

fn to_batch(rows: &[Repeat], tau: Option<f64>) -> Result<Vec<RecordBatch>> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.runs))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.mean))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.stddev))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.cv_pct))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.min))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.max))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.top_rank),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|_| tau))),
    ];
    Ok(vec![RecordBatch::try_new(schema(), columns)?])
}

/// The `repeatability` table function.
#[derive(Debug)]
pub struct RepeatabilityFunction {
    pub store: Store,
}

const USAGE: &str = "repeatability(selector [, n])";

impl TableFunctionImpl for RepeatabilityFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let args = FnArgs::parse(args.exprs(), USAGE, 1..=2)?;
        let selector = args.required_text(0, "selector")?;
        let n = args
            .number(1, "n", "an integer >= 1", |n| n >= 1.0 && n.fract() == 0.0)?
            .map_or(DEFAULT_TOP, |n| n as usize);
        let store = self.store.clone();
        Ok(Arc::new(LazyTable {
            name: "repeatability",
            schema: schema(),
            compute: Arc::new(move |ctx: SessionContext| {
                let (store, selector) = (store.clone(), selector.clone());
                async move {
                    let runs = run_names(&ctx, &store, &selector).await?;
                    let profiles = load_profiles(&ctx, &runs, Level::Kernel, &[]).await?;
                    let (rows, tau) = repeatability(&profiles, n);
                    to_batch(&rows, tau)
                }
                .boxed()
            }),
        }))
    }
}
