//! `trend(selector, metric [, order_tag [, threshold_pct]])`: one metric across every run a
//! [selector](super::selector) matches, in capture order (or by a tag), with change points.
//!
//! Metrics: the summary metrics of [`profile`](super::profile) (`step_time`, `gpu_busy`,
//! `gpu_idle`, `kernel_time`, `compute`, `communication`, `memcpy`, `memset`), `idle_pct`
//! (100 × gpu_idle / step_time), and one key's GPU time: `kernel:NAME`, `op:NAME`,
//! `class:NAME` (e.g. `class:gemm`). A run's `value` is the **median over its steps** of the
//! metric per step (a step without the kernel counts 0), or its total when it has no steps.
//!
//! **Change points.** At each run i, the runs before it (up to 5) are compared with i and
//! the runs after it (up to 5, i included): `change_pct` is the shift of the medians of the
//! two windows' values; the shift is a change point when it exceeds the threshold (default
//! 5 %), a Mann–Whitney test on the two windows' pooled per-step samples (per-run values
//! without steps) gives p < 0.01, and no qualifying run within the window separates the two
//! sides better (smaller p; then larger shift; then earlier).
//!
//! ```sql
//! SELECT run, fmt_dur(CAST(value AS BIGINT)), change_pct, change_point
//! FROM trend('tags[''model''] = ''llama''', 'step_time');
//! SELECT run, order_key, value FROM trend('run LIKE ''nightly-%''', 'kernel:ncclDevKernel_AllReduce_Sum_f32_RING_LL', 'commit');
//! ```

use super::compare::ALPHA;
use super::profile::{load_profiles, Level, Profile, SUMMARY_METRICS};
use super::selector::{resolve, RunInfo};
use super::stats::{mann_whitney, median};
use crate::analyses::{FnArgs, LazyTable};
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampNanosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use gpuq_engine::Store;
use std::cmp::Ordering;
use std::sync::Arc;

pub const DEFAULT_THRESHOLD_PCT: f64 = 5.0;
/// Runs on each side of a candidate change point.
pub const WINDOW: usize = 5;

/// A metric a trend follows.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    Summary(&'static str),
    IdlePct,
    Key(Level, String),
}

impl Metric {
    pub fn parse(s: &str) -> std::result::Result<Metric, String> {
        let s = s.trim();
        if let Some(m) = SUMMARY_METRICS.iter().find(|m| **m == s) {
            return Ok(Metric::Summary(m));
        }
        if s == "idle_pct" || s == "idle_ratio" {
            return Ok(Metric::IdlePct);
        }
        if let Some((level, key)) = s.split_once(':') {
            let level = match level {
                "kernel" => Level::Kernel,
                "op" => Level::Op,
                "class" => Level::Class,
                _ => return Err(format!("unknown metric prefix {level:?} in {s:?}")),
            };
            if !key.is_empty() {
                return Ok(Metric::Key(level, key.to_string()));
            }
        }
        Err(format!(
            "unknown metric {s:?} (one of {}, idle_pct, kernel:NAME, op:NAME, class:NAME)",
            SUMMARY_METRICS.join(", ")
        ))
    }

    pub fn unit(&self) -> &'static str {
        match self {
            Metric::IdlePct => "%",
            _ => "ns",
        }
    }
}

/// One run of a trend.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub run: String,
    pub captured_ns: i64,
    pub order_key: Option<String>,
    /// Per-step values (per-run value when the run has no steps).
    pub samples: Vec<f64>,
    pub value: Option<f64>,
    pub change_pct: Option<f64>,
    pub p_value: Option<f64>,
    pub change_point: bool,
}

/// The per-step values of `key` in `p` (zero where a step lacks it), or its total without
/// steps.
pub(crate) fn samples_of(p: &Profile, key: &str) -> Vec<f64> {
    let measures = p.keys.get(key);
    if p.steps.is_empty() {
        let total: i64 = measures.into_iter().flatten().map(|(_, m)| m.total).sum();
        return if measures.is_some() {
            vec![total as f64]
        } else {
            Vec::new()
        };
    }
    p.steps
        .keys()
        .map(|(rank, step)| {
            measures
                .and_then(|m| m.get(rank))
                .and_then(|m| m.per_step.get(step))
                .copied()
                .unwrap_or(0) as f64
        })
        .collect()
}

fn idle_samples(p: &Profile) -> Vec<f64> {
    let idle = samples_of(p, "gpu_idle");
    let base = if p.steps.is_empty() {
        // Without steps: idle / (idle + busy) of the whole run.
        let busy = samples_of(p, "gpu_busy");
        idle.iter().zip(&busy).map(|(i, b)| i + b).collect()
    } else {
        samples_of(p, "step_time")
    };
    idle.iter()
        .zip(&base)
        .filter(|(_, b)| **b > 0.0)
        .map(|(i, b)| 100.0 * i / b)
        .collect()
}

/// Orders runs by a tag (numerically when every value is a number; runs without it last),
/// else keeps capture order.
fn order(runs: &mut [RunInfo], tag: Option<&str>) {
    let Some(tag) = tag else { return };
    let numeric = runs
        .iter()
        .filter_map(|r| r.tags.get(tag))
        .all(|v| v.parse::<f64>().is_ok());
    runs.sort_by(|a, b| match (a.tags.get(tag), b.tags.get(tag)) {
        (Some(x), Some(y)) if numeric => {
            let (x, y) = (
                x.parse::<f64>().unwrap_or(0.0),
                y.parse::<f64>().unwrap_or(0.0),
            );
            x.total_cmp(&y)
        }
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    });
}

/// Flags change points in `points` (values and samples already set).
pub fn change_points(points: &mut [Point], threshold_pct: f64) {
    let n = points.len();
    let as_ints = |v: &[f64]| {
        v.iter()
            .map(|x| (x * 1000.0).round() as i64)
            .collect::<Vec<_>>()
    };
    let mut shifts: Vec<Option<(f64, f64)>> = vec![None; n];
    for i in 1..n {
        let before = &points[i.saturating_sub(WINDOW)..i];
        let after = &points[i..(i + WINDOW).min(n)];
        let values = |w: &[Point]| w.iter().filter_map(|p| p.value).collect::<Vec<_>>();
        let (Some(mb), Some(ma)) = (median(&values(before)), median(&values(after))) else {
            continue;
        };
        if mb == 0.0 {
            continue;
        }
        let pooled =
            |w: &[Point]| as_ints(&w.iter().flat_map(|p| p.samples.clone()).collect::<Vec<_>>());
        let p = mann_whitney(&pooled(before), &pooled(after));
        let shift = 100.0 * (ma / mb - 1.0);
        points[i].change_pct = Some((shift * 100.0).round() / 100.0);
        points[i].p_value = p;
        if shift.abs() > threshold_pct && p.is_some_and(|p| p < ALPHA) {
            shifts[i] = Some((shift.abs(), p.unwrap_or(1.0)));
        }
    }
    for i in 0..n {
        let Some((s, p)) = shifts[i] else { continue };
        let lo = i.saturating_sub(WINDOW - 1);
        let hi = (i + WINDOW).min(n);
        // Near a step change every window that straddles it qualifies with the same medians;
        // the one that separates the two sides best (smallest p, then largest shift, then
        // earliest) is the change.
        let beats =
            |j: usize, (t, q): (f64, f64)| q < p || (q == p && (t > s || (t == s && j < i)));
        let beaten = (lo..hi).any(|j| j != i && shifts[j].is_some_and(|x| beats(j, x)));
        points[i].change_point = !beaten;
    }
}

pub async fn trend(
    ctx: &SessionContext,
    store: &Store,
    selector: &str,
    metric: &Metric,
    order_tag: Option<&str>,
    threshold_pct: f64,
) -> Result<Vec<Point>> {
    let mut runs = resolve(ctx, store, selector).await?;
    order(&mut runs, order_tag);
    let names: Vec<String> = runs.iter().map(|r| r.run.clone()).collect();
    let profiles = match metric {
        Metric::Summary(m) => load_profiles(ctx, &names, Level::Summary, &[m]).await?,
        Metric::IdlePct => {
            load_profiles(
                ctx,
                &names,
                Level::Summary,
                &["gpu_idle", "gpu_busy", "step_time"],
            )
            .await?
        }
        Metric::Key(level, key) => load_profiles(ctx, &names, *level, &[key.as_str()]).await?,
    };
    let mut points: Vec<Point> = runs
        .into_iter()
        .zip(&profiles)
        .map(|(info, p)| {
            let samples = match metric {
                Metric::Summary(m) => samples_of(p, m),
                Metric::IdlePct => idle_samples(p),
                Metric::Key(_, key) => samples_of(p, key),
            };
            Point {
                order_key: order_tag.and_then(|t| info.tags.get(t).cloned()),
                run: info.run,
                captured_ns: info.captured_ns,
                value: median(&samples),
                samples,
                change_pct: None,
                p_value: None,
                change_point: false,
            }
        })
        .collect();
    change_points(&mut points, threshold_pct);
    Ok(points)
}

pub fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("position", DataType::Int64, false),
        f("run", DataType::Utf8, false),
        f(
            "captured",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        f("order_key", DataType::Utf8, true),
        f("samples", DataType::Int64, false),
        f("value", DataType::Float64, true),
        f("unit", DataType::Utf8, false),
        f("change_pct", DataType::Float64, true),
        f("p_value", DataType::Float64, true),
        f("change_point", DataType::Boolean, false),
    ]))
}

pub fn to_batch(points: &[Point], unit: &str) -> Result<Vec<RecordBatch>> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(1..=points.len() as i64)),
        Arc::new(StringArray::from_iter_values(points.iter().map(|p| &p.run))),
        Arc::new(
            TimestampNanosecondArray::from_iter_values(points.iter().map(|p| p.captured_ns))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter(
            points.iter().map(|p| p.order_key.as_deref()),
        )),
        Arc::new(Int64Array::from_iter_values(
            points.iter().map(|p| p.samples.len() as i64),
        )),
        Arc::new(Float64Array::from_iter(points.iter().map(|p| p.value))),
        Arc::new(StringArray::from_iter_values(points.iter().map(|_| unit))),
        Arc::new(Float64Array::from_iter(points.iter().map(|p| p.change_pct))),
        Arc::new(Float64Array::from_iter(points.iter().map(|p| p.p_value))),
        Arc::new(BooleanArray::from_iter(
            points.iter().map(|p| Some(p.change_point)),
        )),
    ];
    Ok(vec![RecordBatch::try_new(schema(), columns)?])
}

/// The `trend` table function.
#[derive(Debug)]
pub struct TrendFunction {
    pub store: Store,
}

const USAGE: &str = "trend(selector, metric [, order_tag [, threshold_pct]])";

impl TableFunctionImpl for TrendFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let args = FnArgs::parse(args.exprs(), USAGE, 2..=4)?;
        let selector = args.required_text(0, "selector")?;
        let metric = Metric::parse(&args.required_text(1, "metric")?).map_err(|m| args.error(m))?;
        let order_tag = args.text(2, "order_tag")?;
        let threshold = args
            .number(3, "threshold_pct", "a number >= 0", |t| t >= 0.0)?
            .unwrap_or(DEFAULT_THRESHOLD_PCT);
        let store = self.store.clone();
        Ok(Arc::new(LazyTable {
            name: "trend",
            schema: schema(),
            compute: Arc::new(move |ctx| {
                let (store, selector, metric, tag) = (
                    store.clone(),
                    selector.clone(),
                    metric.clone(),
                    order_tag.clone(),
                );
                async move {
                    let points =
                        trend(&ctx, &store, &selector, &metric, tag.as_deref(), threshold).await?;
                    to_batch(&points, metric.unit())
                }
                .boxed()
            }),
        }))
    }
}
