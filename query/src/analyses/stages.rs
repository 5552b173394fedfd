//! `stages(run)`: the macro stages of a run; `step_stats(run)`: one row per profiler step.
//!
//! **stages**: one row per (rank, kind, name):
//! - kind `stage`: stage-log stages (`scope = 'stage'`), by stage name;
//! - kind `steps`: all `ProfilerStep#N` ranges together;
//! - kind `phase`: user/NVTX annotations classified by name into `dataloader`
//!   (`enumerate(DataLoader)...`), `optimizer` (`Optimizer.step#...`, `zero_grad`),
//!   `backward` and `forward` (`## forward ##`, `fwd`).
//!
//! `wall` is the length of the union of the instances (nested or repeated ranges are not
//! counted twice), `share_pct` its share of the rank's wall time (first to last event, widened
//! by the stage log's stages so that an enclosing stage is 100 %, not more),
//! `gpu_busy` the union of the rank's GPU operations inside those ranges, `gpu_busy_pct` its
//! share of `wall`. Rank-less stages (a stage log added to a run) are measured against every
//! rank's GPU work.
//!
//! **step_stats**: per (rank, step) of the `steps` view: `ts`, `dur`, `gpu_busy` (union of
//! the rank's GPU operations inside the step's window), `idle_pct`, `kernels` and
//! `kernel_time` (kernels *launched* in the step), the step's `top_kernel` by time,
//! `busy_vs_median` = `gpu_busy` / the rank's median step `gpu_busy`, and `vs_median` = the
//! larger of `dur` / the rank's median step duration and `busy_vs_median` (1.5 = 50 % more than
//! usual): a step whose GPU works 32 % longer is an outlier even when its wall time hides it.
//!
//! With a step range (`stages('r', '3..5')`, `step_stats('r', '3..5')`) only the selected steps
//! count: stages are clipped to their span, GPU work is that launched in them, and the medians
//! are those of the selected steps.
//!
//! ```sql
//! SELECT kind, name, fmt_dur(wall), share_pct, gpu_busy_pct FROM stages('llama-bs8');
//! SELECT step, fmt_dur(dur), idle_pct, top_kernel FROM step_stats('llama-bs8') WHERE vs_median > 1.2;
//! ```

use super::data::{
    op_windows, ranges, steps, walls_with_stages, Names, OpClass, Rows, Scope, Timelines,
};
use super::history::stats::median_ints as median;
use super::intervals::{covered, intersect, length, union};
use super::{batch, Call, Spec};
use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use regex::Regex;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

pub static STAGES: Spec = Spec::of_run("stages", stages_schema, |ctx, call| {
    stages(ctx, call).boxed()
});

pub static STEP_STATS: Spec = Spec::of_run("step_stats", step_stats_schema, |ctx, call| {
    step_stats(ctx, call).boxed()
});

fn stages_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("kind", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("instances", DataType::Int64, false),
        Field::new("first_ts", DataType::Int64, false),
        Field::new("wall", DataType::Int64, false),
        Field::new("share_pct", DataType::Float64, true),
        Field::new("gpu_busy", DataType::Int64, false),
        Field::new("gpu_busy_pct", DataType::Float64, true),
    ]))
}

fn step_stats_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("step", DataType::Int64, false),
        Field::new("ts", DataType::Int64, false),
        Field::new("dur", DataType::Int64, false),
        Field::new("gpu_busy", DataType::Int64, false),
        Field::new("idle_pct", DataType::Float64, true),
        Field::new("kernels", DataType::Int64, false),
        Field::new("kernel_time", DataType::Int64, false),
        Field::new("top_kernel", DataType::Utf8, true),
        Field::new("vs_median", DataType::Float64, true),
        Field::new("busy_vs_median", DataType::Float64, true),
    ]))
}

static PHASES: LazyLock<[(&'static str, Regex); 3]> = LazyLock::new(|| {
    let re = |s| Regex::new(s).expect("valid regex");
    [
        (
            "optimizer",
            re(r"(?i)optimizer|\boptim\b|zero_grad|\.step#"),
        ),
        ("backward", re(r"(?i)backward|\bbwd\b")),
        ("forward", re(r"(?i)forward|\bfwd\b")),
    ]
});

/// The phase an annotation name belongs to, if any.
pub fn phase_of(name: &str) -> Option<&'static str> {
    if name.starts_with("ProfilerStep#") {
        return None;
    }
    if super::gaps::is_data_loading(name) {
        return Some("dataloader");
    }
    PHASES
        .iter()
        .find(|(_, re)| re.is_match(name))
        .map(|(p, _)| *p)
}

fn pct(a: i64, b: i64) -> Option<f64> {
    (b > 0).then(|| (1000.0 * a as f64 / b as f64).round() / 10.0)
}

/// The union of GPU work per rank (all devices of the rank), and of the whole run (key None
/// of the second map).
fn busy_by_rank(t: &Timelines) -> (HashMap<Option<i32>, Vec<(i64, i64)>>, Vec<(i64, i64)>) {
    let mut by: HashMap<Option<i32>, Vec<(i64, i64)>> = HashMap::new();
    for (key, ops) in &t.devices {
        by.entry(key.rank).or_default().extend(
            ops.iter()
                .filter(|o| o.class != OpClass::Overhead)
                .map(|o| (o.start, o.end)),
        );
    }
    let all = union(by.values().flatten().copied());
    (by.into_iter().map(|(k, v)| (k, union(v))).collect(), all)
}

/// One stage row.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub rank: Option<i32>,
    pub kind: &'static str,
    pub name: String,
    pub instances: i64,
    pub first_ts: i64,
    pub wall: i64,
    pub share_pct: Option<f64>,
    pub gpu_busy: i64,
    pub gpu_busy_pct: Option<f64>,
    /// The union of the instances (what `wall` measures), sorted and disjoint: what a
    /// comparison needs to measure the stage step by step.
    pub intervals: Vec<(i64, i64)>,
}

/// The stages of the whole run.
pub async fn load_stages(ctx: &SessionContext, run: &str) -> Result<Vec<Stage>> {
    load_stages_in(ctx, run, &Scope::whole()).await
}

/// The stages of `run` within `scope`.
pub async fn load_stages_in(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<Stage>> {
    let mut timelines = Timelines::load(ctx, run, false).await?;
    scope.restrict(&mut timelines);
    let mut names = Names::default();
    let mut ranges = ranges(ctx, run, &mut names).await?;
    scope.clip_ranges(&mut ranges);
    let steps = scoped_steps(ctx, run, scope).await?;
    let mut walls = walls_with_stages(ctx, run).await?;
    scope.clip_walls(&mut walls);
    let (busy, all_busy) = busy_by_rank(&timelines);
    let run_wall = walls
        .values()
        .map(|w| w.0)
        .min()
        .zip(walls.values().map(|w| w.1).max());
    // (rank, kind, name) -> intervals.
    let mut groups: BTreeMap<(Option<i32>, &'static str, String), Vec<(i64, i64)>> =
        BTreeMap::new();
    for r in &ranges {
        let name = names.get(r.name);
        if r.scope.is_some_and(|s| names.get(s) == "stage") {
            groups
                .entry((r.rank, "stage", name.to_string()))
                .or_default()
                .push((r.start, r.end));
        } else if let Some(p) = phase_of(name) {
            groups
                .entry((r.rank, "phase", p.to_string()))
                .or_default()
                .push((r.start, r.end));
        }
    }
    for &(rank, _, s, e) in &steps {
        groups
            .entry((rank, "steps", "ProfilerStep".to_string()))
            .or_default()
            .push((s, e));
    }
    let mut out = Vec::new();
    for ((rank, kind, name), iv) in groups {
        let instances = iv.len() as i64;
        let set = union(iv);
        let wall = length(&set);
        let (gpu, whole) = match rank {
            Some(_) => (
                busy.get(&rank).map(Vec::as_slice).unwrap_or(&[]),
                walls.get(&rank).copied(),
            ),
            None => (all_busy.as_slice(), run_wall),
        };
        let gpu_busy = length(&intersect(&set, gpu));
        out.push(Stage {
            rank,
            kind,
            name,
            instances,
            first_ts: set.first().map_or(0, |s| s.0),
            wall,
            share_pct: whole.and_then(|(lo, hi)| pct(wall, hi - lo)),
            gpu_busy,
            gpu_busy_pct: pct(gpu_busy, wall),
            intervals: set,
        });
    }
    out.sort_by(|a, b| {
        (a.rank, a.kind != "stage", a.first_ts).cmp(&(b.rank, b.kind != "stage", b.first_ts))
    });
    Ok(out)
}

/// The steps of `run` in `scope` (all of them for the whole run).
async fn scoped_steps(
    ctx: &SessionContext,
    run: &str,
    scope: &Scope,
) -> Result<Vec<(Option<i32>, i64, i64, i64)>> {
    match scope.range {
        Some(_) => Ok(scope.steps.clone()),
        None => steps(ctx, run).await,
    }
}

async fn stages(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load_stages_in(&ctx, &call.run, &scope).await?;
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.kind))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.name.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.instances),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.first_ts),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.wall))),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.share_pct))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.gpu_busy),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.gpu_busy_pct))),
    ];
    batch(stages_schema(), columns)
}

/// One step row.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStat {
    pub rank: Option<i32>,
    pub step: i64,
    pub ts: i64,
    pub dur: i64,
    pub gpu_busy: i64,
    pub idle_pct: Option<f64>,
    pub kernels: i64,
    pub kernel_time: i64,
    pub top_kernel: Option<String>,
    /// The larger of `dur` and `gpu_busy` over their medians.
    pub vs_median: Option<f64>,
    pub busy_vs_median: Option<f64>,
    /// The rank's median step duration and GPU busy time.
    pub median_dur: Option<f64>,
    pub median_busy: Option<f64>,
}

impl StepStat {
    /// Time over the median: the larger of the wall and the GPU busy time above theirs.
    pub fn excess(&self) -> i64 {
        let over = |v: i64, m: Option<f64>| m.map_or(0, |m| v - m.round() as i64);
        over(self.dur, self.median_dur)
            .max(over(self.gpu_busy, self.median_busy))
            .max(0)
    }
}

/// `v / median`, rounded to 0.01; `None` without a positive median.
fn ratio(v: i64, median: Option<f64>) -> Option<f64> {
    median
        .filter(|m| *m > 0.0)
        .map(|m| (100.0 * v as f64 / m).round() / 100.0)
}

/// The step rows of `timelines` (restricted to `scope` by the caller) in `scope`.
/// The GPU busy time (the union of the rank's GPU operations) within each of `steps`
/// (`(rank, start, end)`): [`StepStat::gpu_busy`]. The operations are read a window of about
/// [`OPS_PER_WINDOW`] at a time ([`op_windows`]), each window's union clipped to it, so memory
/// stays bounded however long the run and however many operations a step holds: the windows
/// partition time, so the clipped unions add up to the whole union.
pub async fn busy_within(
    ctx: &SessionContext,
    run: &str,
    steps: &[(Option<i32>, i64, i64)],
) -> Result<Vec<i64>> {
    busy_within_windows(ctx, run, steps, OPS_PER_WINDOW).await
}

/// [`busy_within`], reading about `per_window` operations at a time.
pub(crate) async fn busy_within_windows(
    ctx: &SessionContext,
    run: &str,
    steps: &[(Option<i32>, i64, i64)],
    per_window: usize,
) -> Result<Vec<i64>> {
    let (Some(lo), Some(hi)) = (
        steps.iter().map(|s| s.1).min(),
        steps.iter().map(|s| s.2).max(),
    ) else {
        return Ok(Vec::new());
    };
    let mut busy = vec![0; steps.len()];
    for (a, b) in op_windows(ctx, run, lo, hi, per_window).await? {
        let timelines = Timelines::load_rows(ctx, run, Rows::Overlapping(a, b)).await?;
        let (by_rank, _) = busy_by_rank(&timelines);
        for (i, &(rank, s, e)) in steps.iter().enumerate() {
            let (s, e) = (s.max(a), e.min(b));
            if s < e {
                busy[i] += by_rank.get(&rank).map_or(0, |u| covered(u, s, e));
            }
        }
    }
    Ok(busy)
}

/// GPU operations read at a time by [`busy_within`].
pub const OPS_PER_WINDOW: usize = 50_000;

pub async fn load_step_stats(
    ctx: &SessionContext,
    run: &str,
    timelines: &Timelines,
    scope: &Scope,
) -> Result<Vec<StepStat>> {
    let steps = scoped_steps(ctx, run, scope).await?;
    let (busy, _) = busy_by_rank(&timelines);
    // (rank, step) -> (kernels, time, per-name time).
    let mut kernels: HashMap<(Option<i32>, i64), (i64, i64, HashMap<u32, i64>)> = HashMap::new();
    for (key, ops) in &timelines.devices {
        for o in ops {
            if let (Some(step), OpClass::Compute | OpClass::Communication) = (o.step, o.class) {
                let k = kernels.entry((key.rank, step)).or_default();
                k.0 += 1;
                k.1 += o.end - o.start;
                *k.2.entry(o.name).or_default() += o.end - o.start;
            }
        }
    }
    let busy_of =
        |rank: Option<i32>, s: i64, e: i64| busy.get(&rank).map_or(0, |b| covered(b, s, e));
    // rank -> (durations, GPU busy times) of its steps.
    let mut per_rank: HashMap<Option<i32>, (Vec<i64>, Vec<i64>)> = HashMap::new();
    for &(rank, _, s, e) in &steps {
        let v = per_rank.entry(rank).or_default();
        v.0.push(e - s);
        v.1.push(busy_of(rank, s, e));
    }
    let medians: HashMap<_, _> = per_rank
        .into_iter()
        .map(|(k, (d, b))| (k, (median(d), median(b))))
        .collect();
    let mut out = Vec::new();
    for &(rank, step, s, e) in &steps {
        let gpu_busy = busy_of(rank, s, e);
        let dur = e - s;
        let (median_dur, median_busy) = medians.get(&rank).copied().unwrap_or((None, None));
        let busy_vs_median = ratio(gpu_busy, median_busy);
        let k = kernels.get(&(rank, step));
        let top = k.and_then(|k| {
            k.2.iter()
                .max_by_key(|(id, t)| (**t, std::cmp::Reverse(timelines.names.get(**id))))
                .map(|(id, _)| timelines.names.get(*id).to_string())
        });
        out.push(StepStat {
            rank,
            step,
            ts: s,
            dur,
            gpu_busy,
            idle_pct: pct(dur - gpu_busy, dur),
            kernels: k.map_or(0, |k| k.0),
            kernel_time: k.map_or(0, |k| k.1),
            top_kernel: top,
            vs_median: match (ratio(dur, median_dur), busy_vs_median) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            busy_vs_median,
            median_dur,
            median_busy,
        });
    }
    Ok(out)
}

async fn step_stats(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let mut timelines = Timelines::load(&ctx, &call.run, false).await?;
    scope.restrict(&mut timelines);
    let rows = load_step_stats(&ctx, &call.run, &timelines, &scope).await?;
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.step))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ts))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.dur))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.gpu_busy),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.idle_pct))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.kernels))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.kernel_time),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.top_kernel.as_deref()),
        )),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.vs_median))),
        Arc::new(Float64Array::from_iter(
            rows.iter().map(|r| r.busy_vs_median),
        )),
    ];
    batch(step_stats_schema(), columns)
}
