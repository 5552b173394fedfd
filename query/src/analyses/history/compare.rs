//! `compare(a, b [, level [, threshold_pct]])`: what got slower, faster, appeared or vanished
//! between two runs (or two sets of runs), telling real changes from noise.
//!
//! `a` and `b` are [selectors](super::selector): a run name or a SQL condition on `runs`.
//! `level` is `kernel` (default: per kernel name), `op` (per launching operator, GPU
//! operations), `class` (per `kernel_class`), `stage` (per stage of `stages()`) or `summary`
//! (step time, GPU busy / idle, kernel time and the breakdown, see [`profile`](super::profile)).
//!
//! **What is compared.** When every run on both sides has steps, a key's *time per step*
//! (mean over the steps; a step where the key did not run counts 0). Without steps, a key's
//! *mean time per instance*: how many instances fell into a capture window says how long the
//! window was, not how fast the work ran (`per_sec_a/b` give the rate per second of window).
//! Summary metrics without steps are per second of window (see [`apply_kernel_evidence`]).
//! `delta` = b − a of that value in ns, `ratio` = b / a. With several runs on a side, each
//! number is the median over that side's runs and the samples are pooled.
//!
//! **Significance.** A change is `slower` / `faster` only when it exceeds the threshold
//! (default 2 %) *and* it is significant at p < 0.01. The change judged is `typical_ratio`
//! where the test has one (the mean of the per-step summaries below, or the median instance),
//! so that an occasional 3× instance neither makes nor hides a change; else `ratio`.
//! - `test = 'per-step'` (two steps or more a side): Student's t-test over the steps, each
//!   step summarised by its instance count × the median of its instances' durations. Steps
//!   are the independent units, so a step that was slow as a whole (every kernel in it) counts
//!   once: one deviant step among n gives |t| = 1 whatever its size, never p < 0.01;
//! - `test = 'per-instance'` (no steps, or one step on a side): Mann–Whitney on the instance
//!   durations, **relative to the run-wide shift** ([`run_shift`](super::run_shift)) when 8
//!   keys or more are tested: b's instances are divided by the shift (by the nearer end of its
//!   99 % interval), so a run slowed as a whole, or its one step, is not every kernel's
//!   regression; the change held against the threshold is `typical_ratio / run_shift`.
//!   Holm's correction over the comparison's per-instance rows counts only the keys whose
//!   instance counts can reach significance (Tarone); the others are `(untested)` past the
//!   threshold, with a `note` saying how many instances were needed;
//! - `test = 'kernels'` (summary metrics): the kernels that changed significantly, and the
//!   run-wide shift when it is significant, explain a change of the metric beyond the
//!   threshold, see [`apply_kernel_evidence`];
//! - `test = 'none'`: nothing to test (one value a side); the status says `(untested)` and the
//!   `note` says why.
//!
//! `p_adjusted` is the p-value the status rests on: Holm-adjusted for per-instance rows, the
//! test's own for per-step rows, and for `test = 'kernels'` the largest adjusted p-value of the
//! evidence counted (NULL unless that made it `slower` / `faster`).
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
use super::run_shift::{short_p, RunShift};
use super::selector::run_names;
use super::stats::{
    holm_tarone, mann_whitney, mann_whitney_min_p, mean, median, median_ints, t_test,
};
use crate::analyses::{FnArgs, LazyTable};
use crate::functions::kernel_class::kernel_class;
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

const NS_PER_S: f64 = 1e9;

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
        f("per_sec_a", DataType::Float64, true),
        f("per_sec_b", DataType::Float64, true),
        f("value_a", DataType::Float64, false),
        f("value_b", DataType::Float64, false),
        f("delta", DataType::Int64, false),
        f("ratio", DataType::Float64, true),
        f("typical_ratio", DataType::Float64, true),
        f("run_shift", DataType::Float64, true),
        f("p_value", DataType::Float64, true),
        f("p_adjusted", DataType::Float64, true),
        f("note", DataType::Utf8, true),
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
    /// Runs without steps: the side's window in ns (summed over ranks, median over runs).
    pub window_a: Option<i64>,
    pub window_b: Option<i64>,
    /// Time per step (with steps), mean time per instance (without), or a summary metric.
    pub value_a: f64,
    pub value_b: f64,
    /// b / a of what the test compares, outliers aside: the mean per-step summary (per-step
    /// test) or the median instance (per-instance test).
    pub typical_ratio: Option<f64>,
    /// Per-instance rows of 8 keys or more: how much the run moved as a whole, which the key
    /// is judged against.
    pub run_shift: Option<RunShift>,
    /// The test's own p-value.
    pub p_value: Option<f64>,
    /// The p-value the status rests on (see the module documentation).
    pub p_adjusted: Option<f64>,
    pub test: &'static str,
    pub status: &'static str,
    /// Why a change could not be tested, or what its test could not see.
    pub note: Option<String>,
}

impl Row {
    /// A key's row before it is judged: both sides' numbers (a, b), no test, `unchanged`.
    pub(crate) fn unjudged(
        rank: Option<i32>,
        name: &str,
        counts: (i64, i64),
        totals: (i64, i64),
        values: (f64, f64),
        windows: (Option<i64>, Option<i64>),
    ) -> Row {
        Row {
            rank,
            name: name.to_string(),
            count_a: counts.0,
            count_b: counts.1,
            total_a: totals.0,
            total_b: totals.1,
            share_a: None,
            share_b: None,
            window_a: windows.0,
            window_b: windows.1,
            value_a: values.0,
            value_b: values.1,
            typical_ratio: None,
            run_shift: None,
            p_value: None,
            p_adjusted: None,
            test: "none",
            status: "unchanged",
            note: None,
        }
    }

    pub fn delta(&self) -> i64 {
        (self.value_b - self.value_a).round() as i64
    }

    pub fn ratio(&self) -> Option<f64> {
        (self.value_a > 0.0).then(|| self.value_b / self.value_a)
    }

    /// The change held against the threshold, as a ratio: `typical_ratio` (else `ratio`),
    /// relative to the run-wide shift where there is one.
    pub fn judged_ratio(&self) -> Option<f64> {
        let shift = self.run_shift.map_or(1.0, |s| s.ratio);
        self.typical_ratio.or(self.ratio()).map(|r| r / shift)
    }

    /// Instances per second of side a's window (runs without steps).
    pub fn per_sec_a(&self) -> Option<f64> {
        per_sec(self.count_a, self.window_a)
    }

    pub fn per_sec_b(&self) -> Option<f64> {
        per_sec(self.count_b, self.window_b)
    }

    /// A significant change (not `unchanged`, not untested, not added / removed).
    pub fn is_significant(&self) -> bool {
        matches!(self.status, "slower" | "faster")
    }

    /// Past the threshold, but nothing could test it.
    pub fn is_untested(&self) -> bool {
        self.status.ends_with("(untested)")
    }
}

fn per_sec(count: i64, window: Option<i64>) -> Option<f64> {
    window
        .filter(|w| *w > 0)
        .map(|w| count as f64 * NS_PER_S / w as f64)
}

/// One side's numbers for one key and rank selection.
struct SideStats {
    count: i64,
    total: i64,
    value: f64,
    window: Option<i64>,
    /// Per step (pooled over runs): instance count × median instance duration, or the step's
    /// value where instances are not kept (summary metrics).
    step_values: Vec<f64>,
    instances: Vec<i64>,
}

fn median_i64(v: Vec<i64>) -> i64 {
    median_ints(v).map_or(0, |m| m.round() as i64)
}

/// A step's time robust to the occasional 3× instance: a kernel whose every instance got
/// slower moves it by the same factor, a single outlier does not.
fn robust_step_time(instances: &[i64]) -> f64 {
    instances.len() as f64 * median_ints(instances.to_vec()).unwrap_or(0.0)
}

fn side_stats(
    side: &[Profile],
    key: &str,
    rank: Option<Option<i32>>,
    per_step: bool,
    alike: bool,
) -> SideStats {
    let mut counts = Vec::new();
    let mut totals = Vec::new();
    let mut values = Vec::new();
    let mut windows = Vec::new();
    let mut step_values = Vec::new();
    let mut instances = Vec::new();
    let of_rank = |r: Option<i32>| rank.is_none_or(|want| want == r);
    for p in side {
        let measures = p.keys.get(key);
        let (mut count, mut total) = (0, 0);
        for (r, m) in measures.into_iter().flatten() {
            if of_rank(*r) {
                count += m.count;
                total += m.total;
                instances.extend_from_slice(&m.instances);
                instances.extend(m.step_instances.values().flatten());
            }
        }
        counts.push(count);
        totals.push(total);
        if per_step {
            let steps: Vec<_> = p.steps_of(rank).collect();
            let mut sum = 0;
            for (r, step) in &steps {
                let m = measures.and_then(|m| m.get(r));
                let v = m.and_then(|m| m.per_step.get(step)).copied().unwrap_or(0);
                sum += v;
                step_values.push(match m.and_then(|m| m.step_instances.get(step)) {
                    Some(xs) if alike => robust_step_time(xs),
                    _ => v as f64,
                });
            }
            values.push(sum as f64 / steps.len().max(1) as f64);
        } else {
            if count > 0 {
                values.push(total as f64 / count as f64);
            }
            let window: i64 = p
                .windows
                .iter()
                .filter(|(r, _)| of_rank(**r))
                .map(|w| w.1)
                .sum();
            if window > 0 {
                windows.push(window);
            }
        }
    }
    SideStats {
        count: median_i64(counts),
        total: median_i64(totals),
        value: median(&values).unwrap_or(0.0),
        window: (!windows.is_empty()).then(|| median_i64(windows)),
        step_values,
        instances,
    }
}

/// Compares sides `a` and `b` (profiles at `level`); rows for all ranks, then per rank.
pub fn compare(a: &[Profile], b: &[Profile], threshold_pct: f64, level: Level) -> Vec<Row> {
    let summary = level == Level::Summary;
    // A kernel's instances are alike, so a step is summarised robustly (count × median); an
    // op's or a class's mix different kernels, whose median does not move when one of them
    // slows down: their steps are summarised by their sum.
    let alike = level == Level::Kernel;
    let keys: BTreeSet<&String> = a.iter().chain(b).flat_map(|p| p.keys.keys()).collect();
    let mut out = Vec::new();
    for rank in rank_selections(a, b) {
        let per_step = a.iter().chain(b).all(|p| p.steps_of(rank).next().is_some());
        let mut rows = Vec::new();
        // The instances of each per-instance row, for the tests relative to the run.
        let mut samples = Vec::new();
        for key in &keys {
            let sa = side_stats(a, key, rank, per_step, alike);
            let sb = side_stats(b, key, rank, per_step, alike);
            let row = judge(rank.flatten(), key, &sa, &sb, per_step, threshold_pct);
            if row.count_a > 0 || row.count_b > 0 {
                samples.push((row.test == PER_INSTANCE).then_some((sa.instances, sb.instances)));
                rows.push(row);
            }
        }
        if summary {
            // A handful of metrics of one run: each on its own test.
            for row in rows.iter_mut().filter(|r| r.test == PER_INSTANCE) {
                row.p_adjusted = row.p_value;
                let evidence = Evidence::of(row.p_adjusted);
                set_status(row, threshold_pct, evidence);
            }
            let order = |n: &str| SUMMARY_METRICS.iter().position(|m| *m == n);
            rows.sort_by_key(|r| order(&r.name));
        } else {
            judge_instances(&mut rows, &samples, per_step, threshold_pct);
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
        }
        out.extend(rows);
    }
    out
}

/// All ranks together (`None`), then each rank when there are several.
fn rank_selections(a: &[Profile], b: &[Profile]) -> Vec<Option<Option<i32>>> {
    let ranks: BTreeSet<Option<i32>> = a.iter().chain(b).flat_map(Profile::ranks).collect();
    let mut selections = vec![None];
    if ranks.iter().flatten().count() > 1 {
        selections.extend(ranks.iter().map(|r| Some(*r)));
    }
    selections
}

fn share(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| (1000.0 * part as f64 / whole as f64).round() / 10.0)
}

const PER_INSTANCE: &str = "per-instance";
const ONE_STEP: &str = "one step on a side and fewer than 8 keys to measure the run-wide shift \
                        by: a step slow as a whole cannot be told from a regression";
const ONE_SAMPLE: &str = "one value a side (one step, one window or one stage): noise cannot \
                          be judged";

fn judge(
    rank: Option<i32>,
    key: &str,
    a: &SideStats,
    b: &SideStats,
    per_step: bool,
    threshold_pct: f64,
) -> Row {
    let mut row = Row::unjudged(
        rank,
        key,
        (a.count, b.count),
        (a.total, b.total),
        (a.value, b.value),
        (a.window, b.window),
    );
    if a.count == 0 {
        row.status = "added";
        return row;
    }
    if b.count == 0 {
        row.status = "removed";
        return row;
    }
    let ratio_of = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x > 0.0 => Some(y / x),
        _ => None,
    };
    if per_step && a.step_values.len() >= 2 && b.step_values.len() >= 2 {
        row.test = "per-step";
        row.p_value = t_test(&a.step_values, &b.step_values);
        row.p_adjusted = row.p_value;
        row.typical_ratio = ratio_of(mean(&a.step_values), mean(&b.step_values));
    } else if a.instances.len() >= 2 && b.instances.len() >= 2 {
        // Tested and judged with the other keys: see `judge_instances`.
        row.test = PER_INSTANCE;
        row.p_value = mann_whitney(&a.instances, &b.instances);
        let typical = |v: &[i64]| median_ints(v.to_vec());
        row.typical_ratio = ratio_of(typical(&a.instances), typical(&b.instances));
        return row;
    } else {
        row.note = Some(ONE_SAMPLE.into());
    }
    let evidence = Evidence::of(row.p_adjusted);
    set_status(&mut row, threshold_pct, evidence);
    row
}

/// Judges a comparison's per-instance rows together (no steps, or one step on a side), where
/// nothing like steps absorbs what the run shares:
///
/// - **the run-wide shift**: with 8 keys or more, each key is tested relative to how much
///   the run moved as a whole ([`RunShift`]): Mann–Whitney of a's instances against b's
///   divided by the nearer end of the shift's 99 % interval (p = 1 inside it), and the change
///   held against the threshold is `typical_ratio / run_shift`. A run slowed as a whole
///   (clocks, a noisy neighbour, its one step) is then no kernel's regression; the summary
///   metrics still see it ([`apply_kernel_evidence`]);
/// - **Holm's correction** with Tarone's count (see [`holm_tarone`]): testing dozens of
///   kernels at [`ALPHA`] each would call about [`ALPHA`] of them slower or faster on noise
///   alone; the correction holds the chance of any false `slower` / `faster` at [`ALPHA`].
///   Keys whose instance counts cannot reach significance under it (6 against 6 instances can
///   give p = 0.0022 at best) are not counted; they are `(untested)` past the threshold, with
///   a note saying how many instances a side would do.
fn judge_instances(
    rows: &mut [Row],
    samples: &[Option<(Vec<i64>, Vec<i64>)>],
    per_step: bool,
    threshold_pct: f64,
) {
    let tested: Vec<usize> = (0..rows.len()).filter(|&i| samples[i].is_some()).collect();
    let ratios: Vec<f64> = tested
        .iter()
        .filter_map(|&i| rows[i].typical_ratio)
        .collect();
    let shift = RunShift::estimate(&ratios);
    let mut tests = Vec::with_capacity(tested.len());
    for &i in &tested {
        let (a, b) = samples[i].as_ref().expect("samples of a per-instance row");
        let row = &mut rows[i];
        if let Some(shift) = shift {
            row.run_shift = Some(shift);
            row.p_value = Some(relative_p(a, b, row.typical_ratio, &shift));
        } else if per_step {
            row.note = Some(ONE_STEP.into());
        }
        tests.push((
            row.p_value.unwrap_or(1.0),
            mann_whitney_min_p(a.len(), b.len()),
        ));
    }
    let (adjusted, counted) = holm_tarone(&tests, ALPHA);
    for (j, &i) in tested.iter().enumerate() {
        let row = &mut rows[i];
        row.p_adjusted = adjusted[j];
        if row.p_adjusted.is_none() {
            let (a, b) = samples[i].as_ref().expect("samples of a per-instance row");
            row.note = Some(too_few_instances(a.len(), b.len(), counted));
        }
        let evidence = Evidence::of(row.p_adjusted);
        set_status(row, threshold_pct, evidence);
    }
}

/// Mann–Whitney of `a` against `b` divided by the shift, at the end of its interval nearer to
/// the key's own ratio: the key must have moved more than the run even there. A key whose
/// ratio is inside the interval cannot be told from the run (p = 1).
fn relative_p(a: &[i64], b: &[i64], typical: Option<f64>, shift: &RunShift) -> f64 {
    let edge = match typical {
        Some(t) if t > shift.high => shift.high,
        Some(t) if t < shift.low => shift.low,
        _ => return 1.0,
    };
    let scaled: Vec<i64> = b
        .iter()
        .map(|&x| (x as f64 / edge).round() as i64)
        .collect();
    mann_whitney(a, &scaled).unwrap_or(1.0)
}

/// Why a key was not tested: its instance counts, and how many a side the correction needs.
fn too_few_instances(na: usize, nb: usize, counted: usize) -> String {
    let needed = (2..=1000)
        .find(|&n| mann_whitney_min_p(n, n) < ALPHA / counted as f64)
        .unwrap_or(1000);
    format!(
        "too few instances ({na} vs {nb}) for a rank test to pass Holm's correction over the \
         {counted} keys that can: about {needed} a side needed"
    )
}

/// What decides a status past the threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Evidence {
    /// Significant at [`ALPHA`] (adjusted where it applies).
    Significant,
    /// Tested, not significant.
    Noise,
    /// Nothing could test it.
    Untested,
}

impl Evidence {
    /// From the p-value a status rests on (`None`: untested).
    fn of(p: Option<f64>) -> Evidence {
        match p {
            None => Evidence::Untested,
            Some(p) if p < ALPHA => Evidence::Significant,
            Some(_) => Evidence::Noise,
        }
    }
}

/// The status from the change against the threshold and the evidence.
fn set_status(row: &mut Row, threshold_pct: f64, evidence: Evidence) {
    let change = match row.judged_ratio() {
        Some(r) => r - 1.0,
        None if row.value_b > 0.0 => f64::INFINITY,
        None => 0.0,
    };
    let slower = change > 0.0;
    row.status = if change.abs() * 100.0 <= threshold_pct {
        "unchanged"
    } else {
        match (evidence, slower) {
            (Evidence::Untested, true) => "slower (untested)",
            (Evidence::Untested, false) => "faster (untested)",
            (Evidence::Significant, true) => "slower",
            (Evidence::Significant, false) => "faster",
            (Evidence::Noise, _) => "unchanged (noise)",
        }
    };
}

/// The kernels a summary metric is made of; `None` for metrics kernels do not explain.
fn kernels_of(metric: &str) -> Option<fn(&str) -> bool> {
    match metric {
        "step_time" | "gpu_busy" | "kernel_time" => Some(|_| true),
        "compute" => Some(|k| kernel_class(k) != "communication"),
        "communication" => Some(|k| kernel_class(k) == "communication"),
        _ => None,
    }
}

/// Summary metrics have one value per step (per window without steps): too few to test with
/// one step a side, and nothing to judge a window by. Their evidence is then the kernels
/// (`kernels`, compared at the kernel level over the same runs):
///
/// - **with steps**, a metric made of kernels (`step_time`, `gpu_busy`, `kernel_time`: every
///   kernel; `compute`, `communication`: their class) is `slower` / `faster` when it moved past
///   the threshold and the evidence adds up, per step, to a change past the threshold of the
///   metric, in the same direction. Either this or the metric's own per-step test suffices.
/// - **without steps**, `kernel_time`, `compute` and `communication` are per second of side
///   a's window: Σ over a's kernels of a's instance rate × the mean instance duration of each
///   side. A different window length, or more instances falling into it, changes nothing;
///   only per-instance durations do. Significant when the evidence explains more than the
///   threshold. The other metrics are rates per second of each side's window and stay
///   untested: the work that fell into a window is not a speed.
///
/// The evidence: each kernel that changed significantly (by its own test, relative to the run
/// where it was judged so) counts with its whole change; when the run moved as a whole (its
/// [`RunShift`] is significant) every other kernel counts with the run-wide shift. So a run
/// slower as a whole is no kernel's regression, but it is the run's, and the gate sees it.
/// `p_adjusted` is the largest adjusted p-value of what was counted; the metric's own p-value
/// (if any) is in the `note`.
pub fn apply_kernel_evidence(summary: &mut [Row], kernels: &[Row], threshold_pct: f64) {
    for row in summary.iter_mut() {
        let flat = row.window_a.is_some() || row.window_b.is_some();
        let in_metric = kernels_of(&row.name);
        let mine: Vec<&Row> = kernels
            .iter()
            .filter(|k| k.rank == row.rank && in_metric.is_some_and(|f| f(&k.name)))
            .collect();
        let additive = !matches!(row.name.as_str(), "step_time" | "gpu_busy");
        match (flat, in_metric) {
            (true, Some(_)) if additive => {
                let Some(wa) = row.window_a.filter(|w| *w > 0) else {
                    continue;
                };
                let rate_a = |k: &Row| k.count_a as f64 * NS_PER_S / wa as f64;
                let at_b = |k: &Row| if k.count_b > 0 { k.value_b } else { k.value_a };
                let of_a: Vec<&Row> = mine.into_iter().filter(|k| k.count_a > 0).collect();
                row.value_a = of_a.iter().map(|k| rate_a(k) * k.value_a).sum();
                row.value_b = of_a.iter().map(|k| rate_a(k) * at_b(k)).sum();
                let evidence = KernelEvidence::gather(&of_a, rate_a);
                row.test = "kernels";
                row.p_value = None;
                row.typical_ratio = None;
                row.note = Some(format!(
                    "per second of a's window at each side's mean instance durations (counts \
                     and window lengths drop out); {}",
                    evidence.describe(row.value_a)
                ));
                evidence.judge(row, threshold_pct);
            }
            (true, _) => {
                let rate = |v: i64, w: Option<i64>| {
                    w.filter(|w| *w > 0)
                        .map_or(0.0, |w| v as f64 * NS_PER_S / w as f64)
                };
                row.value_a = rate(row.total_a, row.window_a);
                row.value_b = rate(row.total_b, row.window_b);
                row.test = "none";
                row.p_value = None;
                row.p_adjusted = None;
                row.typical_ratio = None;
                row.note = Some(
                    "no steps: a rate per second of each side's window, which says how much \
                     work fell into the window, not how fast it ran"
                        .into(),
                );
                set_status(row, threshold_pct, Evidence::Untested);
            }
            (false, Some(_)) if needs_kernels(row) && row.count_a > 0 && row.count_b > 0 => {
                let own = row.test == "per-step" && row.p_value.is_some_and(|p| p < ALPHA);
                if own {
                    row.p_adjusted = row.p_value;
                    set_status(row, threshold_pct, Evidence::Significant);
                    continue;
                }
                let evidence = KernelEvidence::gather(&mine, |_| 1.0);
                let own_test = match (row.test, row.p_value.take()) {
                    ("per-step", Some(p)) => format!("; its own per-step test: p = {}", short_p(p)),
                    _ => String::new(),
                };
                row.test = "kernels";
                row.note = Some(format!("{}{own_test}", evidence.describe(row.value_a)));
                evidence.judge(row, threshold_pct);
            }
            _ => {}
        }
    }
}

/// What the kernels say about a summary metric (see [`apply_kernel_evidence`]), in the
/// metric's unit (each kernel weighted: 1 per step, its instance rate without steps).
struct KernelEvidence {
    /// The change of the kernels that changed significantly.
    by_kernels: f64,
    kernels: usize,
    /// The other kernels' change at the run-wide shift, when that is significant.
    by_run: f64,
    shift: Option<RunShift>,
    /// The largest adjusted p-value of what was counted.
    p: Option<f64>,
}

impl KernelEvidence {
    fn gather(kernels: &[&Row], weight: impl Fn(&Row) -> f64) -> KernelEvidence {
        let shift = kernels.iter().find_map(|k| k.run_shift);
        let moved = shift.filter(RunShift::is_significant);
        let mut e = KernelEvidence {
            by_kernels: 0.0,
            kernels: 0,
            by_run: 0.0,
            shift,
            p: None,
        };
        let worst = |p: Option<f64>, q: Option<f64>| match (p, q) {
            (Some(p), Some(q)) => Some(p.max(q)),
            (p, q) => p.or(q),
        };
        for k in kernels {
            if k.is_significant() {
                e.by_kernels += weight(k) * (k.value_b - k.value_a);
                e.kernels += 1;
                e.p = worst(e.p, k.p_adjusted);
            } else if let Some(s) = moved {
                e.by_run += weight(k) * k.value_a * (s.ratio - 1.0);
            }
        }
        if let Some(s) = moved.filter(|_| e.by_run != 0.0) {
            e.p = worst(e.p, Some(s.p_value));
        }
        e
    }

    fn explained(&self) -> f64 {
        self.by_kernels + self.by_run
    }

    /// The note: what explains how much of `value_a`.
    fn describe(&self, value_a: f64) -> String {
        let pct = |x: f64| 100.0 * x / value_a.max(1.0);
        let mut text = format!(
            "the {} kernel(s) that changed significantly explain {:+.1} %",
            self.kernels,
            pct(self.by_kernels)
        );
        if let Some(s) = self.shift {
            let counted = if s.is_significant() {
                format!(
                    "; the others at the {}: {:+.1} %",
                    s.describe(),
                    pct(self.by_run)
                )
            } else {
                format!("; {} (not significant)", s.describe())
            };
            text.push_str(&counted);
        }
        text
    }

    /// Sets `row`'s status (and `p_adjusted`) from this evidence.
    fn judge(&self, row: &mut Row, threshold_pct: f64) {
        let explained = self.explained();
        let significant = explains(explained, row.value_a, threshold_pct)
            && (explained > 0.0) == (row.value_b > row.value_a);
        let evidence = if significant {
            Evidence::Significant
        } else {
            Evidence::Noise
        };
        set_status(row, threshold_pct, evidence);
        row.p_adjusted = self.p.filter(|_| row.is_significant());
    }
}

/// Whether [`apply_kernel_evidence`] needs the kernels to judge `row`.
fn needs_kernels(row: &Row) -> bool {
    let flat = row.window_a.is_some() || row.window_b.is_some();
    let own = row.test == "per-step" && row.is_significant();
    kernels_of(&row.name).is_some() && (flat || (row.status != "unchanged" && !own))
}

fn explains(explained: f64, value_a: f64, threshold_pct: f64) -> bool {
    value_a > 0.0 && (explained / value_a).abs() * 100.0 > threshold_pct
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
    let mut rows = compare(&pa, &pb, threshold_pct, level);
    if level == Level::Summary {
        // The kernels are loaded only when a metric needs their evidence: a gate over hundreds
        // of runs with many steps and nothing moved stays cheap.
        let kernels = if rows.iter().any(needs_kernels) {
            let ka = load_profiles(ctx, runs_a, Level::Kernel, &[]).await?;
            let kb = load_profiles(ctx, runs_b, Level::Kernel, &[]).await?;
            compare(&ka, &kb, threshold_pct, Level::Kernel)
        } else {
            Vec::new()
        };
        apply_kernel_evidence(&mut rows, &kernels, threshold_pct);
    }
    Ok(rows)
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
        Arc::new(Float64Array::from_iter(rows.iter().map(Row::per_sec_a))),
        Arc::new(Float64Array::from_iter(rows.iter().map(Row::per_sec_b))),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.value_a),
        )),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.value_b),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(Row::delta))),
        Arc::new(Float64Array::from_iter(rows.iter().map(Row::ratio))),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| r.typical_ratio),
        )),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| r.run_shift.map(|s| s.ratio)),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.p_value))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.p_adjusted))),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.note.as_deref()),
        )),
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
