//! `scaling(selector, tag [, level])`: how each kernel's (operator's, class's) time grows with
//! an input dimension that runs are tagged with (`gpuq ingest --tag seq_len=4096`), so that
//! "does attention grow quadratically with the sequence length?" has a number.
//!
//! The runs the [selector](super::selector) matches and whose `tag` is a positive number are
//! the points. A key's value in a run is trend's ([`trend`](super::trend)): the median over the
//! run's steps of the key's GPU time per step (its total without steps). Per key with a value
//! in at least two runs of different tag values, the exponent `k` of `time ≈ c · tag^k` is the
//! least-squares slope of ln(time) against ln(tag); `ci_low` / `ci_high` bound it at 95 %
//! (Student's t with runs − 2 degrees of freedom; NULL with two runs). `growth` reads the
//! interval: `super-linear` when it lies above 1, `linear` when it holds 1, `sub-linear` when
//! it lies between 0 and 1, `constant` when it is below 1 and holds 0; NULL without one. `time_at_max` is the key's value at the largest tag, the order
//! of the rows (what costs the most where the input is largest), and `r2` the fit's R².
//!
//! Levels: `kernel` (default), `op`, `class`, `stage` and `summary` (step_time, gpu_busy, ...).
//!
//! ```sql
//! SELECT name, exponent, ci_low, ci_high, growth FROM scaling('tags[''model''] = ''llama''', 'seq_len')
//! WHERE growth = 'super-linear';
//! ```

use super::profile::{load_profiles, Level};
use super::selector::resolve;
use super::stats::student_t_two_sided;
use super::trend::samples_of;
use crate::analyses::{FnArgs, LazyTable};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use gpuq_engine::Store;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::stats::median;

/// The confidence of the exponent's interval.
pub const CONFIDENCE: f64 = 0.95;

/// One key's fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Scaling {
    pub name: String,
    pub exponent: f64,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    pub runs: i64,
    pub tag_min: f64,
    pub tag_max: f64,
    pub time_at_max: f64,
    pub r2: Option<f64>,
    pub growth: Option<&'static str>,
}

/// The least-squares fit of ln(y) = a + k ln(x) over `points` (x, y > 0): the exponent, its
/// interval at [`CONFIDENCE`] (with three points or more) and R². `None` when the x values do
/// not differ.
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, Option<(f64, f64)>, Option<f64>)> {
    let n = points.len();
    let logs: Vec<(f64, f64)> = points.iter().map(|(x, y)| (x.ln(), y.ln())).collect();
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n as f64;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if n < 2 || sxx <= 1e-12 {
        return None;
    }
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = logs.iter().map(|p| (p.1 - my).powi(2)).sum();
    let k = sxy / sxx;
    let residual: f64 = logs
        .iter()
        .map(|p| (p.1 - my - k * (p.0 - mx)).powi(2))
        .sum();
    let r2 = (syy > 0.0).then(|| (1.0 - residual / syy).clamp(0.0, 1.0));
    if n < 3 {
        return Some((k, None, r2));
    }
    let df = (n - 2) as f64;
    let se = (residual / df / sxx).sqrt();
    let half = t_quantile(1.0 - CONFIDENCE, df) * se;
    Some((k, Some((k - half, k + half)), r2))
}

/// The t for which P(|T| >= t) = `p` with `df` degrees of freedom (bisection).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while student_t_two_sided(hi, df) > p && hi < 1e9 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if student_t_two_sided(mid, df) > p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// How the interval reads against linear growth.
fn growth(ci: Option<(f64, f64)>) -> Option<&'static str> {
    let (lo, hi) = ci?;
    Some(if lo > 1.0 {
        "super-linear"
    } else if hi < 1.0 && lo > 0.0 {
        "sub-linear"
    } else if hi < 1.0 {
        "constant"
    } else {
        "linear"
    })
}

/// The fits of every key at `level` over the runs of `selector` tagged with a positive
/// number `tag`, the costliest at the largest tag first.
pub async fn scaling(
    ctx: &SessionContext,
    store: &Store,
    selector: &str,
    tag: &str,
    level: Level,
) -> Result<Vec<Scaling>> {
    let runs = resolve(ctx, store, selector).await?;
    let tagged: Vec<(String, f64)> = runs
        .iter()
        .filter_map(|r| {
            let x = r.tags.get(tag)?.trim().parse::<f64>().ok()?;
            (x.is_finite() && x > 0.0).then(|| (r.run.clone(), x))
        })
        .collect();
    if tagged.len() < 2 {
        return Err(DataFusionError::Plan(format!(
            "scaling needs at least two runs tagged with a positive number {tag}=...; the \
             selector matches {} run(s), {} of them so tagged (tag runs with gpuq ingest \
             --tag {tag}=N or gpuq runs tag)",
            runs.len(),
            tagged.len()
        )));
    }
    let names: Vec<String> = tagged.iter().map(|t| t.0.clone()).collect();
    let profiles = load_profiles(ctx, &names, level, &[]).await?;
    let mut points: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (p, (_, x)) in profiles.iter().zip(&tagged) {
        for key in p.keys.keys() {
            if let Some(y) = median(&samples_of(p, key)).filter(|y| *y > 0.0) {
                points.entry(key.as_str()).or_default().push((*x, y));
            }
        }
    }
    let mut out: Vec<Scaling> = points
        .into_iter()
        .filter_map(|(name, pts)| {
            let (k, ci, r2) = fit(&pts)?;
            let xmin = pts.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let xmax = pts.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
            let at_max: Vec<f64> = pts.iter().filter(|p| p.0 == xmax).map(|p| p.1).collect();
            Some(Scaling {
                name: name.to_string(),
                exponent: k,
                ci_low: ci.map(|c| c.0),
                ci_high: ci.map(|c| c.1),
                runs: pts.len() as i64,
                tag_min: xmin,
                tag_max: xmax,
                time_at_max: median(&at_max).unwrap_or(0.0),
                r2,
                growth: growth(ci),
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.time_at_max
            .total_cmp(&a.time_at_max)
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(out)
}

pub fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("name", DataType::Utf8, false),
        f("exponent", DataType::Float64, false),
        f("ci_low", DataType::Float64, true),
        f("ci_high", DataType::Float64, true),
        f("growth", DataType::Utf8, true),
        f("runs", DataType::Int64, false),
        f("tag_min", DataType::Float64, false),
        f("tag_max", DataType::Float64, false),
        f("time_at_max", DataType::Float64, false),
        f("r2", DataType::Float64, true),
    ]))
}

pub fn to_batch(rows: &[Scaling]) -> Result<Vec<RecordBatch>> {
    let float = |f: fn(&Scaling) -> f64| -> ArrayRef {
        Arc::new(Float64Array::from_iter_values(rows.iter().map(f)))
    };
    let opt = |f: fn(&Scaling) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from_iter(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name))),
        float(|r| r.exponent),
        opt(|r| r.ci_low),
        opt(|r| r.ci_high),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.growth))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.runs))),
        float(|r| r.tag_min),
        float(|r| r.tag_max),
        float(|r| r.time_at_max),
        opt(|r| r.r2),
    ];
    Ok(vec![RecordBatch::try_new(schema(), columns)?])
}

#[derive(Debug)]
pub struct ScalingFunction {
    pub store: Store,
}

const USAGE: &str = "scaling(selector, tag [, level])";

impl TableFunctionImpl for ScalingFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let args = FnArgs::parse(args.exprs(), USAGE, 2..=3)?;
        let selector = args.required_text(0, "selector")?;
        let tag = args.required_text(1, "tag")?;
        let level = match args.text(2, "level")? {
            Some(l) => Level::parse(&l).map_err(|m| args.error(m))?,
            None => Level::Kernel,
        };
        let store = self.store.clone();
        Ok(Arc::new(LazyTable {
            name: "scaling",
            schema: schema(),
            compute: Arc::new(move |ctx| {
                let (store, selector, tag) = (store.clone(), selector.clone(), tag.clone());
                async move { to_batch(&scaling(&ctx, &store, &selector, &tag, level).await?) }
                    .boxed()
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, t) in [(1.0, 12.706), (2.0, 4.303), (10.0, 2.228), (30.0, 2.042)] {
            assert!((t_quantile(0.05, df) - t).abs() < 1e-3, "df {df}");
        }
    }

    #[test]
    fn an_exact_power_law_is_fitted_exactly() {
        let pts: Vec<(f64, f64)> = [512.0, 1024.0, 2048.0, 4096.0]
            .iter()
            .map(|x: &f64| (*x, 3.0 * x.powi(2)))
            .collect();
        let (k, ci, r2) = fit(&pts).unwrap();
        assert!((k - 2.0).abs() < 1e-9);
        let (lo, hi) = ci.unwrap();
        assert!((lo - 2.0).abs() < 1e-6 && (hi - 2.0).abs() < 1e-6);
        assert_eq!(growth(ci), Some("super-linear"));
        assert!((r2.unwrap() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn noise_widens_the_interval_around_the_true_exponent() {
        // time = x^1.5 · (1 ± 5 %), alternating.
        let pts: Vec<(f64, f64)> = (0..8)
            .map(|i| {
                let x = 256.0 * 2f64.powi(i / 2) * if i % 2 == 0 { 1.0 } else { 1.5 };
                let noise = if i % 3 == 0 { 1.05 } else { 0.95 };
                (x, x.powf(1.5) * noise)
            })
            .collect();
        let (k, ci, _) = fit(&pts).unwrap();
        let (lo, hi) = ci.unwrap();
        assert!(lo < 1.5 && 1.5 < hi, "{lo} {k} {hi}");
        assert!(hi - lo < 0.2 && hi - lo > 0.0);
        assert_eq!(growth(ci), Some("super-linear"));
        // Linear data with the same noise holds 1.
        let linear: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (*x, y / x.sqrt())).collect();
        assert_eq!(growth(fit(&linear).unwrap().1), Some("linear"));
    }

    #[test]
    fn two_runs_give_an_exponent_without_an_interval_and_one_tag_value_none() {
        let (k, ci, _) = fit(&[(1.0, 10.0), (2.0, 20.0)]).unwrap();
        assert!((k - 1.0).abs() < 1e-12);
        assert_eq!(ci, None);
        assert_eq!(fit(&[(2.0, 10.0), (2.0, 20.0), (2.0, 30.0)]), None);
    }
}
