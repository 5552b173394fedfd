//! Profiles: what a run spends its time on, per key (kernel name, launching operator, kernel
//! class, stage or summary metric), per rank, with the per-step or per-instance samples a
//! comparison needs to tell a real change from noise.
//!
//! A run *with steps* (`ProfilerStep#N` ranges in the `steps` view) is described per
//! (rank, step): the GPU time each key took in the step (work is attributed to the step of its
//! launch, as in the `step` column), and at the GPU-time levels each instance's duration in
//! the step. At the stage level a step holds the stage's wall time inside the step's window.
//! A run *without steps* keeps each instance's duration and the length of each
//! rank's window (first to last event), so that counts can be read as rates.
//! Summary metrics (per step, or per rank over the whole run without steps):
//!
//! | metric | definition |
//! |---|---|
//! | `step_time` | the step's wall time (duration of its `ProfilerStep` range) |
//! | `gpu_busy` | union of the kernels, copies and memsets launched in the step (`busy_time`) |
//! | `gpu_idle` | `step_time - gpu_busy` (with steps), `wall - gpu_busy` without |
//! | `kernel_time` | summed kernel durations |
//! | `compute` | `kernel_time` of every class but communication |
//! | `communication` | summed durations of communication kernels (`kernel_class`) |
//! | `memcpy`, `memset` | summed copy / memset durations |

use crate::analyses::data::{collect, ints, steps, strings, walls};
use crate::analyses::intervals::{intersect, length};
use crate::analyses::literal;
use crate::analyses::stages::load_stages;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a comparison groups time by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Kernel,
    Op,
    Class,
    Stage,
    Summary,
}

pub const LEVELS: &str = "kernel, op, class, stage, summary";

/// The summary metrics, in the order they are reported.
pub const SUMMARY_METRICS: &[&str] = &[
    "step_time",
    "gpu_busy",
    "gpu_idle",
    "kernel_time",
    "compute",
    "communication",
    "memcpy",
    "memset",
];

impl Level {
    /// The name `parse` accepts first.
    pub fn name(self) -> &'static str {
        match self {
            Level::Kernel => "kernel",
            Level::Op => "op",
            Level::Class => "class",
            Level::Stage => "stage",
            Level::Summary => "summary",
        }
    }

    pub fn parse(s: &str) -> std::result::Result<Level, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "kernel" | "kernels" | "name" => Level::Kernel,
            "op" | "ops" | "operator" => Level::Op,
            "class" | "classes" => Level::Class,
            "stage" | "stages" => Level::Stage,
            "summary" | "run" => Level::Summary,
            other => return Err(format!("unknown level {other:?} (one of {LEVELS})")),
        })
    }

    /// The view and key expression a GPU-time level groups by.
    fn source(self) -> Option<(&'static str, &'static str)> {
        match self {
            Level::Kernel => Some(("kernels", "name")),
            Level::Op => Some(("gpu_ops", "coalesce(op, '(no op)')")),
            Level::Class => Some(("kernels", "kernel_class(name)")),
            Level::Stage | Level::Summary => None,
        }
    }
}

/// (rank, step)
pub type StepKey = (Option<i32>, i64);

/// One key's time in one rank of a run.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Measure {
    pub count: i64,
    pub total: i64,
    /// Time per step of the rank (steps where the key did not appear are absent).
    pub per_step: HashMap<i64, i64>,
    /// Each instance's time in each step (GPU-time levels of runs with steps).
    pub step_instances: HashMap<i64, Vec<i64>>,
    /// Each instance's time, for runs without steps.
    pub instances: Vec<i64>,
}

/// One run's profile at one level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    pub run: String,
    /// Step durations per (rank, step).
    pub steps: BTreeMap<StepKey, i64>,
    /// key -> rank -> measure.
    pub keys: BTreeMap<String, BTreeMap<Option<i32>, Measure>>,
    /// Runs without steps: each rank's window (last event end − first event start), in ns.
    pub windows: BTreeMap<Option<i32>, i64>,
}

impl Profile {
    pub fn ranks(&self) -> BTreeSet<Option<i32>> {
        let mut ranks: BTreeSet<Option<i32>> = self.steps.keys().map(|k| k.0).collect();
        for per_rank in self.keys.values() {
            ranks.extend(per_rank.keys().copied());
        }
        ranks
    }

    /// The steps of `rank` (every rank when `None`).
    pub fn steps_of(&self, rank: Option<Option<i32>>) -> impl Iterator<Item = StepKey> + '_ {
        self.steps
            .keys()
            .copied()
            .filter(move |k| rank.is_none_or(|r| k.0 == r))
    }

    fn measure(&mut self, key: &str, rank: Option<i32>) -> &mut Measure {
        self.keys
            .entry(key.to_string())
            .or_default()
            .entry(rank)
            .or_default()
    }
}

/// The profiles of `runs` at `level`, in the order of `runs`; with `only` non-empty, just
/// those keys (kernel names, ops, classes or metrics), which keeps a trend or a gate over
/// hundreds of runs cheap.
pub async fn load_profiles(
    ctx: &SessionContext,
    runs: &[String],
    level: Level,
    only: &[&str],
) -> Result<Vec<Profile>> {
    let mut profiles: BTreeMap<String, Profile> = runs
        .iter()
        .map(|r| {
            let p = Profile {
                run: r.clone(),
                ..Default::default()
            };
            (r.clone(), p)
        })
        .collect();
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    let all = in_list(runs.iter());
    let sql = format!(
        "SELECT run, rank, step, max(dur) FROM steps WHERE run IN ({all}) AND step IS NOT NULL \
         GROUP BY run, rank, step"
    );
    for b in collect(ctx, &sql).await? {
        let (run, rank, step, dur) = (strings(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
        for i in 0..b.num_rows() {
            if let (Some(run), Some(step), Some(dur)) = (&run[i], step[i], dur[i]) {
                if let Some(p) = profiles.get_mut(run) {
                    p.steps.insert((rank[i].map(|r| r as i32), step), dur);
                }
            }
        }
    }
    let (stepped, flat): (Vec<&String>, Vec<&String>) =
        runs.iter().partition(|r| !profiles[*r].steps.is_empty());
    for run in &flat {
        let p = profiles.get_mut(*run).expect("profile of every run");
        p.windows = walls(ctx, run)
            .await?
            .into_iter()
            .map(|(rank, (lo, hi))| (rank, hi - lo))
            .collect();
    }
    match level {
        Level::Stage => {
            for run in runs {
                let run_steps = if profiles[run].steps.is_empty() {
                    Vec::new()
                } else {
                    steps(ctx, run).await?
                };
                let p = profiles.get_mut(run).expect("profile of every run");
                for s in load_stages(ctx, run).await? {
                    let key = format!("{}: {}", s.kind, s.name);
                    if !only.is_empty() && !only.contains(&key.as_str()) {
                        continue;
                    }
                    let m = p.measure(&key, s.rank);
                    m.count += s.instances;
                    m.total += s.wall;
                    m.instances.push(s.wall);
                    // With steps, the stage's wall inside each step of its rank; a stage of no
                    // rank of its own (a stage log's) is measured in every rank's steps.
                    let own_rank = run_steps.iter().any(|st| st.0 == s.rank);
                    for &(rank, step, start, end) in &run_steps {
                        if own_rank && rank != s.rank {
                            continue;
                        }
                        let wall = length(&intersect(&s.intervals, &[(start, end)]));
                        let per_step = p.measure(&key, rank).per_step.entry(step).or_default();
                        *per_step = (*per_step).max(wall);
                    }
                }
            }
        }
        Level::Summary => summary(ctx, &mut profiles, &stepped, &flat, only).await?,
        _ => {
            let (view, key) = level.source().expect("a GPU-time level");
            let filter = if only.is_empty() {
                String::new()
            } else {
                let keys: Vec<String> = only.iter().map(|o| literal(o)).collect();
                format!(" AND {key} IN ({})", keys.join(", "))
            };
            // Every instance: with steps its step too (the per-step tests need each step's
            // instances, not only their sum).
            for (runs, stepped) in [(&stepped, true), (&flat, false)] {
                if runs.is_empty() {
                    continue;
                }
                let runs = in_list(runs.iter().copied());
                let step = if stepped {
                    "step"
                } else {
                    "CAST(NULL AS BIGINT)"
                };
                let sql = format!(
                    "SELECT run, rank, {step}, {key}, dur FROM {view} WHERE run IN ({runs}){filter}"
                );
                for b in collect(ctx, &sql).await? {
                    let (run, rank, step, name) =
                        (strings(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, strings(&b, 3)?);
                    let dur = ints(&b, 4)?;
                    for i in 0..b.num_rows() {
                        let (Some(run), Some(name)) = (&run[i], &name[i]) else {
                            continue;
                        };
                        let Some(p) = profiles.get_mut(run) else {
                            continue;
                        };
                        let m = p.measure(name, rank[i].map(|r| r as i32));
                        let d = dur[i].unwrap_or(0);
                        m.count += 1;
                        m.total += d;
                        match (stepped, step[i]) {
                            (false, _) => m.instances.push(d),
                            (true, Some(step)) => {
                                *m.per_step.entry(step).or_default() += d;
                                m.step_instances.entry(step).or_default().push(d);
                            }
                            // Launched outside every step: counted, in no step.
                            (true, None) => {}
                        }
                    }
                }
            }
        }
    }
    runs.iter()
        .map(|r| {
            profiles
                .remove(r)
                .ok_or_else(|| DataFusionError::Plan(format!("run {r} given twice")))
        })
        .collect()
}

fn in_list<'a>(runs: impl Iterator<Item = &'a String>) -> String {
    runs.map(|r| literal(r)).collect::<Vec<_>>().join(", ")
}

/// The measured columns of the summary, as [`SUMMARY_METRICS`] define them: (the metrics
/// that need it, its SQL over `gpu_ops`, whether kernels alone suffice).
const SUMMARY_COLUMNS: [(&[&str], &str, bool); 5] = [
    (&["gpu_busy", "gpu_idle"], "busy_time(ts, dur)", false),
    (&["kernel_time", "compute"], "sum(CASE WHEN kind = 'kernel' THEN dur ELSE 0 END)", true),
    (
        &["compute", "communication"],
        "sum(CASE WHEN kind = 'kernel' AND kernel_class(name) = 'communication' THEN dur ELSE 0 END)",
        true,
    ),
    (&["memcpy"], "sum(CASE WHEN kind = 'memcpy' THEN dur ELSE 0 END)", false),
    (&["memset"], "sum(CASE WHEN kind = 'memset' THEN dur ELSE 0 END)", false),
];

/// The metrics of one group: gpu_busy, kernel_time, communication, memcpy, memset.
type Metrics = [i64; 5];

async fn summary(
    ctx: &SessionContext,
    profiles: &mut BTreeMap<String, Profile>,
    stepped: &[&String],
    flat: &[&String],
    only: &[&str],
) -> Result<()> {
    let wants = |m: &str| only.is_empty() || only.contains(&m);
    let needed: Vec<bool> = SUMMARY_COLUMNS
        .iter()
        .map(|(metrics, _, _)| metrics.iter().any(|m| wants(m)))
        .collect();
    let needs_gpu = needed.iter().any(|n| *n);
    let select: Vec<String> = SUMMARY_COLUMNS
        .iter()
        .zip(&needed)
        .enumerate()
        .map(|(i, ((_, sql, _), n))| {
            let sql = if *n { sql } else { "CAST(0 AS BIGINT)" };
            format!("{sql} AS m{i}")
        })
        .collect();
    let select = select.join(", ");
    // Kernel metrics alone need only the kernels' rows.
    let kernels_only = SUMMARY_COLUMNS
        .iter()
        .zip(&needed)
        .all(|((_, _, kernels), n)| *kernels || !n);
    let view = if kernels_only { "kernels" } else { "gpu_ops" };
    // (run, rank, step) -> metrics
    let mut groups: HashMap<(String, Option<i32>, Option<i64>), Metrics> = HashMap::new();
    for (runs, group_by) in [(stepped, "run, rank, step"), (flat, "run, rank")] {
        if runs.is_empty() || !needs_gpu {
            continue;
        }
        let step = if group_by.ends_with("step") {
            "step"
        } else {
            "CAST(NULL AS BIGINT)"
        };
        let sql = format!(
            "SELECT run, rank, {step}, {select} FROM {view} WHERE run IN ({}) \
             GROUP BY {group_by}",
            in_list(runs.iter().copied())
        );
        for b in collect(ctx, &sql).await? {
            let (run, rank, step) = (strings(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
            let cols = (3..8).map(|i| ints(&b, i)).collect::<Result<Vec<_>>>()?;
            for i in 0..b.num_rows() {
                let Some(run) = &run[i] else { continue };
                let metrics: Metrics = std::array::from_fn(|c| cols[c][i].unwrap_or(0));
                groups.insert((run.clone(), rank[i].map(|r| r as i32), step[i]), metrics);
            }
        }
    }
    let record = |p: &mut Profile, rank: Option<i32>, step: Option<i64>, name: &str, v: i64| {
        if !wants(name) {
            return;
        }
        let m = p.measure(name, rank);
        m.count += 1;
        m.total += v;
        match step {
            Some(s) => {
                m.per_step.insert(s, v);
            }
            None => m.instances.push(v),
        }
    };
    let derived = |m: &Metrics| {
        [
            ("gpu_busy", m[0]),
            ("kernel_time", m[1]),
            ("compute", m[1] - m[2]),
            ("communication", m[2]),
            ("memcpy", m[3]),
            ("memset", m[4]),
        ]
    };
    for run in stepped {
        let p = profiles.get_mut(*run).expect("profile of every run");
        let steps: Vec<(StepKey, i64)> = p.steps.iter().map(|(k, d)| (*k, *d)).collect();
        for ((rank, step), dur) in steps {
            let m = groups
                .get(&((*run).clone(), rank, Some(step)))
                .copied()
                .unwrap_or_default();
            record(p, rank, Some(step), "step_time", dur);
            record(p, rank, Some(step), "gpu_idle", (dur - m[0]).max(0));
            for (name, v) in derived(&m) {
                record(p, rank, Some(step), name, v);
            }
        }
    }
    for run in flat {
        let p = profiles.get_mut(*run).expect("profile of every run");
        let windows = p.windows.clone();
        let mut ranks: Vec<(Option<i32>, Metrics)> = groups
            .iter()
            .filter(|((r, _, _), _)| r == *run)
            .map(|((_, rank, _), m)| (*rank, *m))
            .collect();
        ranks.sort_unstable();
        for (rank, m) in ranks {
            if let Some(window) = windows.get(&rank) {
                record(p, rank, None, "gpu_idle", (window - m[0]).max(0));
            }
            for (name, v) in derived(&m) {
                record(p, rank, None, name, v);
            }
        }
    }
    Ok(())
}
