//! Loading one run's rows for the analyses: GPU operations per device timeline, host calls,
//! annotations, in compact typed form.

use super::{literal, StepRange};
use crate::functions::kernel_class::kernel_class;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use std::collections::HashMap;

/// Runs `sql` and collects its batches; stoppable like a statement of the shell (dropping
/// the future stops the work: [`crate::cancel`]).
pub async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    crate::cancel::collect(ctx.sql(sql).await?).await
}

/// Splits `[lo, hi)` into consecutive windows that each hold about `per_window` of the run's
/// GPU operations starting in them, so that work over a large run can be done a window at a
/// time however its operations bunch up in time. One pass counts the operations in
/// [`WINDOW_SLICES`] equal slices of time, and the windows are cut between slices where the
/// running count reaches `per_window`: integer arithmetic, memory of the slices only. A slice
/// that holds more than `per_window` on its own (a burst) is one window.
pub async fn op_windows(
    ctx: &SessionContext,
    run: &str,
    lo: i64,
    hi: i64,
    per_window: usize,
) -> Result<Vec<(i64, i64)>> {
    if hi <= lo {
        return Ok(Vec::new());
    }
    let span = hi - lo;
    let width = (span / WINDOW_SLICES + i64::from(span % WINDOW_SLICES != 0)).max(1);
    let sql = format!(
        "SELECT (ts - {lo}) / {width} AS slice, count(*) AS n FROM gpu_ops \
         WHERE run = {} AND ts > 0 AND dur >= 0 AND ts >= {lo} AND ts < {hi} GROUP BY slice",
        literal(run)
    );
    let mut counts: Vec<(i64, i64)> = Vec::new();
    for b in collect(ctx, &sql).await? {
        let (slice, count) = (ints(&b, 0)?, ints(&b, 1)?);
        counts.extend(
            slice
                .into_iter()
                .zip(count)
                .filter_map(|(s, c)| Some((s?, c?))),
        );
    }
    counts.sort_unstable();
    let per_window = per_window.max(1) as i64;
    let mut windows = Vec::new();
    let (mut start, mut held) = (lo, 0i64);
    for (slice, count) in counts {
        held += count;
        let end = lo.saturating_add((slice + 1).saturating_mul(width)).min(hi);
        if held >= per_window && end < hi {
            windows.push((start, end));
            (start, held) = (end, 0);
        }
    }
    windows.push((start, hi));
    Ok(windows)
}

/// The slices of time [`op_windows`] counts operations in (rows of its one GROUP BY): fine
/// enough that a window of 50,000 comes close to its share in a run of billions.
const WINDOW_SLICES: i64 = 1 << 16;

/// Column `i` of `b` as Int64 values (NULL -> None).
pub fn ints(b: &RecordBatch, i: usize) -> Result<Vec<Option<i64>>> {
    let c = cast(b.column(i), &DataType::Int64)?;
    Ok(c.as_primitive::<Int64Type>().iter().collect())
}

/// Column `i` of `b` as text (NULL -> None).
pub fn strings(b: &RecordBatch, i: usize) -> Result<Vec<Option<String>>> {
    let c = cast(b.column(i), &DataType::Utf8)?;
    Ok(c.as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_string))
        .collect())
}

/// Interned strings: rows refer to names by index.
#[derive(Debug, Default, Clone)]
pub struct Names {
    pub names: Vec<String>,
    index: HashMap<String, u32>,
}

impl Names {
    pub fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    pub fn get(&self, id: u32) -> &str {
        &self.names[id as usize]
    }
}

/// What a GPU operation does, for the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    Compute,
    Communication,
    Memcpy,
    Memset,
    /// Profiler overhead counted as device work, as Nsight Systems does.
    Overhead,
}

/// One device timeline: Nsight Systems' (pid, deviceId), within a rank.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub rank: Option<i32>,
    pub pid: Option<i64>,
    pub device: Option<i32>,
}

#[derive(Debug, Clone)]
pub struct Op {
    pub start: i64,
    pub end: i64,
    pub stream: Option<i64>,
    pub class: OpClass,
    pub name: u32,
    pub correlation: Option<i64>,
    /// The launching operator (`op` column).
    pub op: Option<u32>,
    pub step: Option<i64>,
}

/// A host API call (runtime/driver).
#[derive(Debug, Clone)]
pub struct HostCall {
    pub rank: Option<i32>,
    pub pid: Option<i64>,
    pub tid: Option<i64>,
    pub name: u32,
    pub start: i64,
    pub end: i64,
}

/// An annotation range (user annotation, NVTX range, stage-log stage).
#[derive(Debug, Clone)]
pub struct Range {
    pub rank: Option<i32>,
    pub pid: Option<i64>,
    pub name: u32,
    pub scope: Option<u32>,
    pub start: i64,
    pub end: i64,
}

/// The overhead names Nsight Systems' rules count as GPU work (`gpu_gaps`, `gpu_time_util`).
pub const NSYS_GPU_OVERHEAD: &[&str] = &[
    "CUDA profiling data flush overhead",
    "CUDA profiling stop overhead",
    "CUDA profiling overhead",
];

/// Which of a run's rows a loader reads: all of them, or those of a time window (so that an
/// analysis can go through a large run a window at a time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Rows {
    #[default]
    All,
    /// Rows starting in `[lo, hi)`.
    Starting(i64, i64),
    /// Rows overlapping `[lo, hi)`.
    Overlapping(i64, i64),
    /// Rows starting before `hi`.
    Before(i64),
}

impl Rows {
    /// The condition, as ` AND ...` on columns `ts` and `dur`.
    fn sql(self) -> String {
        match self {
            Rows::All => String::new(),
            Rows::Starting(lo, hi) => format!(" AND ts >= {lo} AND ts < {hi}"),
            Rows::Overlapping(lo, hi) => format!(" AND ts < {hi} AND ts + dur > {lo}"),
            Rows::Before(hi) => format!(" AND ts < {hi}"),
        }
    }
}

/// Each device timeline's whole-run span (first start, last end of its operations, as
/// [`Timelines::load`] reads them), and its latest end among operations starting before
/// `before`: aggregates, so a window's loader knows the run around it without reading it.
pub async fn device_spans(
    ctx: &SessionContext,
    run: &str,
    before: i64,
) -> Result<(HashMap<DeviceKey, (i64, i64)>, HashMap<DeviceKey, i64>)> {
    let sql = format!(
        "SELECT rank, pid, device, min(ts), max(ts + dur), max(CASE WHEN ts < {before} THEN ts + dur END) \
         FROM gpu_ops WHERE run = {} AND ts > 0 AND dur >= 0 GROUP BY rank, pid, device",
        literal(run)
    );
    let (mut spans, mut carry) = (HashMap::new(), HashMap::new());
    for b in collect(ctx, &sql).await? {
        let (rank, pid, device) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (lo, hi, last) = (ints(&b, 3)?, ints(&b, 4)?, ints(&b, 5)?);
        for i in 0..b.num_rows() {
            let key = DeviceKey {
                rank: rank[i].map(|r| r as i32),
                pid: pid[i],
                device: device[i].map(|d| d as i32),
            };
            if let (Some(lo), Some(hi)) = (lo[i], hi[i]) {
                spans.insert(key.clone(), (lo, hi));
            }
            if let Some(e) = last[i] {
                carry.insert(key, e);
            }
        }
    }
    Ok((spans, carry))
}

/// One run's GPU operations, per device timeline, sorted by start.
#[derive(Debug, Default)]
pub struct Timelines {
    pub devices: Vec<(DeviceKey, Vec<Op>)>,
    pub names: Names,
}

impl Timelines {
    /// The same timelines without the profiler-overhead pseudo-operations: what
    /// `load(ctx, run, false)` returns, without reading the run again.
    pub fn without_overhead(&self) -> Timelines {
        let devices = self
            .devices
            .iter()
            .map(|(key, ops)| {
                let ops = ops.iter().filter(|o| o.class != OpClass::Overhead).cloned();
                (key.clone(), ops.collect())
            })
            .collect();
        Timelines {
            devices,
            names: self.names.clone(),
        }
    }

    /// Loads kernels, memcpy and memset of `run` (rows with `ts > 0`, as Nsight Systems'
    /// rules take them), and, when `with_overhead`, the profiler-overhead rows Nsight Systems
    /// counts as work of every device of their process within that device's span.
    pub async fn load(ctx: &SessionContext, run: &str, with_overhead: bool) -> Result<Self> {
        let mut t = Timelines::load_rows(ctx, run, Rows::All).await?;
        if with_overhead && !t.devices.is_empty() {
            let spans = t.spans();
            t.add_overhead(ctx, run, Rows::All, &spans).await?;
        }
        t.sort();
        Ok(t)
    }

    /// Each device timeline's first start and last end.
    pub fn spans(&self) -> HashMap<DeviceKey, (i64, i64)> {
        self.devices
            .iter()
            .map(|(k, ops)| {
                let lo = ops.iter().map(|o| o.start).min().unwrap_or(0);
                let hi = ops.iter().map(|o| o.end).max().unwrap_or(0);
                (k.clone(), (lo, hi))
            })
            .collect()
    }

    /// Sorts the timelines by key and each one's operations by start.
    pub fn sort(&mut self) {
        self.devices.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, ops) in self.devices.iter_mut() {
            ops.sort_by_key(|o| (o.start, o.end));
        }
    }

    /// Loads the kernels, memcpy and memset of `run` that `rows` selects (see [`Self::load`]),
    /// unsorted: [`Self::sort`] when complete.
    pub async fn load_rows(ctx: &SessionContext, run: &str, rows: Rows) -> Result<Self> {
        let sql = format!(
            "SELECT rank, pid, device, stream, kind, name, ts, ts + dur, correlation, op, step \
             FROM gpu_ops WHERE run = {} AND ts > 0 AND dur >= 0{}",
            literal(run),
            rows.sql()
        );
        let mut names = Names::default();
        let mut by_key: HashMap<DeviceKey, Vec<Op>> = HashMap::new();
        let mut class_of: HashMap<u32, OpClass> = HashMap::new();
        for b in collect(ctx, &sql).await? {
            let (rank, pid, device, stream) =
                (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
            let (kind, name) = (strings(&b, 4)?, strings(&b, 5)?);
            let (ts, end, corr, op, step) = (
                ints(&b, 6)?,
                ints(&b, 7)?,
                ints(&b, 8)?,
                strings(&b, 9)?,
                ints(&b, 10)?,
            );
            for i in 0..b.num_rows() {
                let (Some(start), Some(end)) = (ts[i], end[i]) else {
                    continue;
                };
                let name_id = names.id(name[i].as_deref().unwrap_or(""));
                let class = match kind[i].as_deref() {
                    Some("memcpy") => OpClass::Memcpy,
                    Some("memset") => OpClass::Memset,
                    _ => *class_of.entry(name_id).or_insert_with(|| {
                        if kernel_class(names.get(name_id)) == "communication" {
                            OpClass::Communication
                        } else {
                            OpClass::Compute
                        }
                    }),
                };
                let key = DeviceKey {
                    rank: rank[i].map(|r| r as i32),
                    pid: pid[i],
                    device: device[i].map(|d| d as i32),
                };
                by_key.entry(key).or_default().push(Op {
                    start,
                    end,
                    stream: stream[i],
                    class,
                    name: name_id,
                    correlation: corr[i],
                    op: op[i].as_deref().map(|s| names.id(s)),
                    step: step[i],
                });
            }
        }
        Ok(Timelines {
            devices: by_key.into_iter().collect(),
            names,
        })
    }

    /// Adds the profiler-overhead rows (selected by `rows`) that Nsight Systems counts as
    /// work of every device of their process strictly within that device's span (`spans`:
    /// whole-run spans, [`Self::spans`] or [`device_spans`]).
    pub async fn add_overhead(
        &mut self,
        ctx: &SessionContext,
        run: &str,
        rows: Rows,
        spans: &HashMap<DeviceKey, (i64, i64)>,
    ) -> Result<()> {
        let list = NSYS_GPU_OVERHEAD
            .iter()
            .map(|n| literal(n))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "SELECT rank, pid, ts, ts + dur FROM events WHERE run = {} AND kind = 'overhead' \
             AND name IN ({list}){}",
            literal(run),
            rows.sql()
        );
        let overhead_name = self.names.id("[profiler overhead]");
        for b in collect(ctx, &sql).await? {
            let (rank, pid, ts, end) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
            for i in 0..b.num_rows() {
                let (Some(s), Some(e)) = (ts[i], end[i]) else {
                    continue;
                };
                for (key, ops) in self.devices.iter_mut() {
                    let Some(&(lo, hi)) = spans.get(key) else {
                        continue;
                    };
                    let same = key.pid == pid[i] && key.rank.map(i64::from) == rank[i];
                    // Strictly inside the device's span, like the rule's SQL.
                    if same && s > lo && e < hi {
                        ops.push(Op {
                            start: s,
                            end: e,
                            stream: None,
                            class: OpClass::Overhead,
                            name: overhead_name,
                            correlation: None,
                            op: None,
                            step: None,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Host calls of a run, and the launch of each GPU operation by correlation id.
#[derive(Debug, Default)]
pub struct Host {
    pub calls: Vec<HostCall>,
    /// (rank, correlation) -> indexes into `calls`.
    by_correlation: HashMap<(Option<i32>, i64), Vec<u32>>,
    /// The (rank, pid) of every call: processes that launch, as opposed to Kineto's GPU pids.
    launching: std::collections::HashSet<(Option<i32>, Option<i64>)>,
}

impl Host {
    /// Loads the runtime/driver calls of `run`; names are interned into `names`.
    pub async fn load(ctx: &SessionContext, run: &str, names: &mut Names) -> Result<Self> {
        let mut host = Host::default();
        host.add(ctx, run, names, Rows::All.sql(), |_| true).await?;
        Ok(host)
    }

    /// Loads the calls of `run` that `rows` selects (see [`Self::load`]).
    pub async fn load_rows(
        ctx: &SessionContext,
        run: &str,
        names: &mut Names,
        rows: Rows,
    ) -> Result<Self> {
        let mut host = Host::default();
        host.add(ctx, run, names, rows.sql(), |_| true).await?;
        Ok(host)
    }

    /// Adds every call with a (rank, correlation id) in `wanted` (the GPU operations of a
    /// window) other than those overlapping `[loaded_lo, loaded_hi)` (loaded already): with
    /// them, [`Self::launch`] finds for those operations what it finds with the whole run
    /// loaded (correlation ids repeat across processes). Read by each rank's range of ids,
    /// which stays as small as the window whatever the run's size.
    pub async fn add_launches(
        &mut self,
        ctx: &SessionContext,
        run: &str,
        names: &mut Names,
        wanted: &std::collections::HashSet<(Option<i32>, i64)>,
        (loaded_lo, loaded_hi): (i64, i64),
    ) -> Result<()> {
        let mut ranges: HashMap<Option<i32>, (i64, i64)> = HashMap::new();
        for &(rank, c) in wanted {
            let r = ranges.entry(rank).or_insert((c, c));
            *r = (r.0.min(c), r.1.max(c));
        }
        if ranges.is_empty() {
            return Ok(());
        }
        let by_rank: Vec<String> = ranges
            .iter()
            .map(|(rank, (a, b))| {
                let rank = rank.map_or("rank IS NULL".to_string(), |r| format!("rank = {r}"));
                format!("({rank} AND correlation BETWEEN {a} AND {b})")
            })
            .collect();
        let cond = format!(
            " AND NOT (ts < {loaded_hi} AND ts + dur > {loaded_lo}) AND ({})",
            by_rank.join(" OR ")
        );
        self.add(ctx, run, names, cond, |key| wanted.contains(&key))
            .await
    }

    /// Adds the runtime/driver calls matching `cond` (` AND ...`) whose (rank, correlation)
    /// `keep` accepts (calls without a correlation are always kept).
    async fn add(
        &mut self,
        ctx: &SessionContext,
        run: &str,
        names: &mut Names,
        cond: String,
        keep: impl Fn((Option<i32>, i64)) -> bool,
    ) -> Result<()> {
        let sql = format!(
            "SELECT rank, pid, tid, name, ts, ts + dur, correlation FROM runtime \
             WHERE run = {} AND dur >= 0{cond}",
            literal(run)
        );
        let host = self;
        for b in collect(ctx, &sql).await? {
            let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
            let name = strings(&b, 3)?;
            let (ts, end, corr) = (ints(&b, 4)?, ints(&b, 5)?, ints(&b, 6)?);
            for i in 0..b.num_rows() {
                let (Some(start), Some(end)) = (ts[i], end[i]) else {
                    continue;
                };
                let rank = rank[i].map(|r| r as i32);
                if corr[i].is_some_and(|c| !keep((rank, c))) {
                    continue;
                }
                let call = HostCall {
                    rank,
                    pid: pid[i],
                    tid: tid[i],
                    name: names.id(name[i].as_deref().unwrap_or("")),
                    start,
                    end,
                };
                host.push(call, corr[i]);
            }
        }
        Ok(())
    }

    /// Adds a call with its correlation id.
    pub fn push(&mut self, call: HostCall, correlation: Option<i64>) {
        self.launching.insert((call.rank, call.pid));
        if let Some(c) = correlation {
            let idx = self.calls.len() as u32;
            self.by_correlation
                .entry((call.rank, c))
                .or_default()
                .push(idx);
        }
        self.calls.push(call);
    }

    /// The call that launched a GPU operation of `key` with `correlation`: correlation ids
    /// are per process in multi-process captures, so a call of the same process wins; a
    /// unique call of another pid is taken when the operation's pid launches nothing itself
    /// (Kineto gives GPU rows the device as pid). A process whose own call is missing (a
    /// capture cut short) does not borrow another process's call with the same id.
    pub fn launch(&self, key: &DeviceKey, correlation: Option<i64>) -> Option<&HostCall> {
        self.launch_index(key, correlation).map(|i| &self.calls[i])
    }

    /// [`Self::launch`]'s index into `calls`.
    pub fn launch_index(&self, key: &DeviceKey, correlation: Option<i64>) -> Option<usize> {
        let found = self.by_correlation.get(&(key.rank, correlation?))?;
        if let [only] = found.as_slice() {
            let call = &self.calls[*only as usize];
            let foreign = call.pid != key.pid && self.launching.contains(&(key.rank, key.pid));
            return (!foreign).then_some(*only as usize);
        }
        found
            .iter()
            .map(|&i| i as usize)
            .find(|&i| self.calls[i].pid == key.pid)
    }
}

/// The annotation ranges of a run (kinds `annotation`, `gpu_annotation` excluded: those are
/// GPU-side projections).
pub async fn ranges(ctx: &SessionContext, run: &str, names: &mut Names) -> Result<Vec<Range>> {
    ranges_rows(ctx, run, names, Rows::All).await
}

/// The annotation ranges of `run` that `rows` selects (see [`ranges`]).
pub async fn ranges_rows(
    ctx: &SessionContext,
    run: &str,
    names: &mut Names,
    rows: Rows,
) -> Result<Vec<Range>> {
    let sql = format!(
        "SELECT rank, pid, name, scope, ts, ts + dur FROM events \
         WHERE run = {} AND kind = 'annotation' AND dur > 0{}",
        literal(run),
        rows.sql()
    );
    let mut out = Vec::new();
    for b in collect(ctx, &sql).await? {
        let (rank, pid) = (ints(&b, 0)?, ints(&b, 1)?);
        let (name, scope) = (strings(&b, 2)?, strings(&b, 3)?);
        let (ts, end) = (ints(&b, 4)?, ints(&b, 5)?);
        for i in 0..b.num_rows() {
            let (Some(start), Some(end)) = (ts[i], end[i]) else {
                continue;
            };
            out.push(Range {
                rank: rank[i].map(|r| r as i32),
                pid: pid[i],
                name: names.id(name[i].as_deref().unwrap_or("")),
                scope: scope[i].as_deref().map(|s| names.id(s)),
                start,
                end,
            });
        }
    }
    Ok(out)
}

/// Rows that are not a stage log's stages: the trace's own events.
const NOT_STAGE_LOG: &str = "(kind <> 'annotation' OR scope IS NULL OR scope <> 'stage')";

/// First start and last end of the trace's events, per rank: the trace's window. A stage log
/// added to the run does not widen it (see [`walls_with_stages`]).
pub async fn walls(ctx: &SessionContext, run: &str) -> Result<HashMap<Option<i32>, (i64, i64)>> {
    spans(ctx, run, NOT_STAGE_LOG).await
}

/// The trace's window per rank, widened by the stage-log stages (rank-less stages widen
/// every rank's window).
pub async fn walls_with_stages(
    ctx: &SessionContext,
    run: &str,
) -> Result<HashMap<Option<i32>, (i64, i64)>> {
    let mut walls = walls(ctx, run).await?;
    let stages = spans(ctx, run, &format!("NOT {NOT_STAGE_LOG}")).await?;
    let widen = |w: &mut (i64, i64), s: (i64, i64)| *w = (w.0.min(s.0), w.1.max(s.1));
    for (&rank, w) in walls.iter_mut() {
        for (_, &s) in stages.iter().filter(|(r, _)| r.is_none() || **r == rank) {
            widen(w, s);
        }
    }
    for (rank, s) in stages {
        walls.entry(rank).or_insert(s);
    }
    Ok(walls)
}

/// First start and last end of the rows matching `filter`, per rank.
async fn spans(
    ctx: &SessionContext,
    run: &str,
    filter: &str,
) -> Result<HashMap<Option<i32>, (i64, i64)>> {
    let mut walls = HashMap::new();
    let sql = format!(
        "SELECT rank, min(ts), max(ts + dur) FROM events WHERE run = {} AND {filter} GROUP BY rank",
        literal(run)
    );
    for b in collect(ctx, &sql).await? {
        let (rank, lo, hi) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        for i in 0..b.num_rows() {
            if let (Some(lo), Some(hi)) = (lo[i], hi[i]) {
                walls.insert(rank[i].map(|r| r as i32), (lo, hi));
            }
        }
    }
    Ok(walls)
}

/// `ProfilerStep` ranges: (rank, step, start, end), ordered.
pub async fn steps(ctx: &SessionContext, run: &str) -> Result<Vec<(Option<i32>, i64, i64, i64)>> {
    let sql = format!(
        "SELECT rank, step, ts, ts + dur FROM steps WHERE run = {} AND step IS NOT NULL \
         ORDER BY rank, ts",
        literal(run)
    );
    let mut out = Vec::new();
    for b in collect(ctx, &sql).await? {
        let (rank, step, ts, end) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
        for i in 0..b.num_rows() {
            if let (Some(n), Some(s), Some(e)) = (step[i], ts[i], end[i]) {
                out.push((rank[i].map(|r| r as i32), n, s, e));
            }
        }
    }
    Ok(out)
}

/// The part of a run an analysis looks at: the whole run, or the profiler steps of a
/// [`StepRange`]. GPU work belongs to the step of its launch (the `step` column), so with a
/// range only operations launched in a selected step count; time windows (walls, gaps, host
/// calls, stages) are clipped to the selected steps' span on each rank.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub range: Option<StepRange>,
    /// rank -> first start and last end of the rank's selected steps.
    windows: HashMap<Option<i32>, (i64, i64)>,
    /// The run's selected steps: (rank, step, start, end).
    pub steps: Vec<(Option<i32>, i64, i64, i64)>,
}

impl Scope {
    /// The whole run.
    pub fn whole() -> Scope {
        Scope::default()
    }

    /// The scope of `range` in `run`; a range that selects no step is an error listing the
    /// run's steps.
    pub async fn load(ctx: &SessionContext, run: &str, range: Option<StepRange>) -> Result<Scope> {
        let Some(range) = range else {
            return Ok(Scope::whole());
        };
        let all = steps(ctx, run).await?;
        let selected: Vec<_> = all
            .iter()
            .copied()
            .filter(|s| range.contains(s.1))
            .collect();
        if selected.is_empty() {
            let mut numbers: Vec<i64> = all.iter().map(|s| s.1).collect();
            numbers.sort_unstable();
            numbers.dedup();
            let has = if numbers.is_empty() {
                "it has no profiler steps".to_string()
            } else {
                format!("its steps: {}", step_list(&numbers))
            };
            return Err(DataFusionError::Plan(format!(
                "no step of run {run} is in the range {range} ({has})"
            )));
        }
        let mut windows: HashMap<Option<i32>, (i64, i64)> = HashMap::new();
        for &(rank, _, s, e) in &selected {
            let w = windows.entry(rank).or_insert((s, e));
            *w = (w.0.min(s), w.1.max(e));
        }
        Ok(Scope {
            range: Some(range),
            windows,
            steps: selected,
        })
    }

    /// The window of `rank` (the selected steps' span); `None` when the scope is the whole
    /// run. A rank without steps of its own (a stage log's rank-less rows) gets the span of
    /// every rank's selected steps.
    pub fn window(&self, rank: Option<i32>) -> Option<(i64, i64)> {
        self.range?;
        self.windows.get(&rank).copied().or_else(|| {
            let lo = self.windows.values().map(|w| w.0).min()?;
            let hi = self.windows.values().map(|w| w.1).max()?;
            Some((lo, hi))
        })
    }

    /// `[start, end)` clipped to the window of `rank`; `None` when nothing is left.
    pub fn clip(&self, rank: Option<i32>, start: i64, end: i64) -> Option<(i64, i64)> {
        let Some((lo, hi)) = self.window(rank) else {
            return Some((start, end));
        };
        if end <= start {
            return (start >= lo && start <= hi).then_some((start, end));
        }
        let (s, e) = (start.max(lo), end.min(hi));
        (s < e).then_some((s, e))
    }

    /// Whether GPU work launched in `step` is in the scope.
    pub fn keeps(&self, step: Option<i64>) -> bool {
        match self.range {
            None => true,
            Some(range) => step.is_some_and(|s| range.contains(s)),
        }
    }

    /// Keeps the operations of the selected steps (and the profiler-overhead rows inside the
    /// window); timelines left without an operation are dropped.
    pub fn restrict(&self, timelines: &mut Timelines) {
        if self.range.is_none() {
            return;
        }
        for (key, ops) in timelines.devices.iter_mut() {
            let window = self.window(key.rank);
            ops.retain(|o| match o.class {
                OpClass::Overhead => window.is_some_and(|(lo, hi)| o.start >= lo && o.end <= hi),
                _ => self.keeps(o.step),
            });
        }
        timelines.devices.retain(|(_, ops)| !ops.is_empty());
    }

    /// Per-rank walls clipped to the window.
    pub fn clip_walls(&self, walls: &mut HashMap<Option<i32>, (i64, i64)>) {
        if self.range.is_none() {
            return;
        }
        let mut out: HashMap<Option<i32>, (i64, i64)> = HashMap::new();
        for (&rank, &(s, e)) in walls.iter() {
            if let Some(w) = self.clip(rank, s, e) {
                out.insert(rank, w);
            }
        }
        *walls = out;
    }

    /// Ranges clipped to the window (those outside it dropped).
    pub fn clip_ranges(&self, ranges: &mut Vec<Range>) {
        if self.range.is_none() {
            return;
        }
        ranges.retain_mut(|r| match self.clip(r.rank, r.start, r.end) {
            Some((s, e)) if e > s => {
                (r.start, r.end) = (s, e);
                true
            }
            _ => false,
        });
    }
}

/// Step numbers as a short list: `0..4, 7, 9..10`.
fn step_list(sorted: &[i64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if j > i {
            format!("{}..{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// A host thread: (rank, pid, tid).
pub type Thread = (Option<i32>, Option<i64>, Option<i64>);

/// One GPU operation: its span and interned name.
#[derive(Debug, Clone, Copy)]
pub struct GpuOp {
    pub start: i64,
    pub end: i64,
    pub name: u32,
}

/// A launch call and the GPU operations it launched.
#[derive(Debug, Clone)]
pub struct LaunchedCall {
    pub start: i64,
    pub end: i64,
    pub ops: Vec<GpuOp>,
}

/// GPU operations under the calls that launched them.
#[derive(Debug, Default)]
pub struct Launches {
    pub by_thread: HashMap<Thread, Vec<LaunchedCall>>,
    /// Operations whose call is not in the trace, with their rank.
    pub unlaunched: Vec<(Option<i32>, GpuOp)>,
}

/// The GPU operations of `kinds` in `run` under the launch calls that made them, by host
/// thread. A call is matched to its operations as [`Host::launch`] does (correlation ids are
/// per process).
pub async fn launches_by_thread(
    ctx: &SessionContext,
    run: &str,
    names: &mut Names,
    kinds: &[&str],
) -> Result<Launches> {
    let host = Host::load(ctx, run, names).await?;
    let mut ops_of: HashMap<usize, Vec<GpuOp>> = HashMap::new();
    let mut out = Launches::default();
    let sql = format!(
        "SELECT rank, pid, device, correlation, ts, ts + dur, name FROM events \
         WHERE run = {} AND kind IN ({})",
        literal(run),
        kinds
            .iter()
            .map(|k| literal(k))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for b in collect(ctx, &sql).await? {
        let (rank, pid, device, corr) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
        let (ts, end, name) = (ints(&b, 4)?, ints(&b, 5)?, strings(&b, 6)?);
        for i in 0..b.num_rows() {
            let (Some(start), Some(end)) = (ts[i], end[i]) else {
                continue;
            };
            let key = DeviceKey {
                rank: rank[i].map(|r| r as i32),
                pid: pid[i],
                device: device[i].map(|d| d as i32),
            };
            let op = GpuOp {
                start,
                end,
                name: names.id(name[i].as_deref().unwrap_or("")),
            };
            match host.launch_index(&key, corr[i]) {
                Some(call) => ops_of.entry(call).or_default().push(op),
                None => out.unlaunched.push((key.rank, op)),
            }
        }
    }
    for (i, ops) in ops_of {
        let c = &host.calls[i];
        out.by_thread
            .entry((c.rank, c.pid, c.tid))
            .or_default()
            .push(LaunchedCall {
                start: c.start,
                end: c.end,
                ops,
            });
    }
    Ok(out)
}
