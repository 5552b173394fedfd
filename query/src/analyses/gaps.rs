//! `gpu_gaps(run [, min_gap_ns])` and `stream_gaps(run [, min_gap_ns])`: when the GPU sat
//! idle, and why.
//!
//! **Device gaps** (`gpu_gaps`): per device timeline (rank, pid, device), the idle intervals
//! between the first and the last GPU operation (kernels, memcpy, memset with `ts > 0`; plus
//! the profiler-overhead rows Nsight Systems counts as device work): every stretch where no
//! operation runs, longer than `min_gap_ns` (default 0: every gap). This is Nsight Systems'
//! `gpu_gaps` rule exactly (its sort-merge of starts and ends finds the same intervals).
//!
//! Each gap gets one `cause`, the first that applies: the specific causes first, an enclosing
//! stage only where none of them explains the gap (a stage log's `train` or `inference`
//! encloses every gap of the trace and must not hide why the GPU waited):
//! 1. `sync`: host synchronisation calls ([`HOST_SYNC_CALLS`]: runtime, driver and deprecated
//!    forms, CUDA and HIP) of the launching process cover at least half of the gap: the host
//!    waited instead of feeding the GPU;
//! 2. `dataloader`: a data-loading range (annotation or stage whose name looks like data
//!    loading, e.g. `enumerate(DataLoader)#...`, stage `dataloader`) covers at least half;
//! 3. `host_wait`: the call that launched the work ending the gap began after the GPU went
//!    idle: the host was late;
//! 4. `short`: under 30 µs with the work already queued (back-to-back work);
//! 5. `stage`: another stage-log stage covers at least half (`detail` names it); a stage that
//!    encloses all of the rank's GPU work is context, never a cause;
//! 6. `other`.
//!
//! With a step range (`gpu_gaps('r', 0, '3..5')`) the gaps are those between the operations
//! launched in the selected steps, clipped to the steps' span.
//!
//! `detail` names the sync call, range or launch call behind the cause; `next_name` is the
//! operation that ended the gap.
//!
//! **Stream gaps** (`stream_gaps`): HTA's idle time breakdown: per stream, the time between
//! consecutive operations (sorted by start, against the latest end so far); `host_wait` when
//! the next launch began after the previous operation ended, else `kernel_wait` when under
//! 30 µs, else `other`.
//!
//! ```sql
//! SELECT cause, count(*), fmt_dur(sum(dur)) FROM gpu_gaps('llama-bs8', dur('100us')) GROUP BY cause;
//! ```

use super::data::{
    collect, device_spans, ints, ranges, ranges_rows, DeviceKey, Host, HostCall, Names, Range,
    Rows, Scope, Timelines,
};
use super::{batch, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use regex::Regex;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// Gaps shorter than this between queued work are `short` (HTA's kernel_wait threshold).
pub const SHORT_GAP_NS: i64 = 30_000;

pub static GPU_GAPS: Spec = Spec {
    name: "gpu_gaps",
    params: &["min_gap_ns"],
    schema: gpu_gaps_schema,
    compute: |ctx, call| gpu_gaps(ctx, call).boxed(),
    validate: validate_min_gap,
};

pub static STREAM_GAPS: Spec = Spec {
    name: "stream_gaps",
    params: &["min_gap_ns"],
    schema: stream_gaps_schema,
    compute: |ctx, call| stream_gaps(ctx, call).boxed(),
    validate: validate_min_gap,
};

fn validate_min_gap(call: &Call) -> std::result::Result<(), String> {
    match call.int(0) {
        Some(n) if n < 0 => Err(format!("min_gap_ns must be >= 0, got {n}")),
        _ => Ok(()),
    }
}

fn key_fields() -> Vec<Field> {
    vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("pid", DataType::Int64, true),
        Field::new("device", DataType::Int32, true),
    ]
}

fn gpu_gaps_schema() -> SchemaRef {
    let mut f = key_fields();
    f.extend([
        Field::new("ts", DataType::Int64, false),
        Field::new("dur", DataType::Int64, false),
        Field::new("cause", DataType::Utf8, false),
        Field::new("detail", DataType::Utf8, true),
        Field::new("next_name", DataType::Utf8, true),
    ]);
    Arc::new(Schema::new(f))
}

fn stream_gaps_schema() -> SchemaRef {
    let mut f = key_fields();
    f.extend([
        Field::new("stream", DataType::Int64, true),
        Field::new("ts", DataType::Int64, false),
        Field::new("dur", DataType::Int64, false),
        Field::new("cause", DataType::Utf8, false),
        Field::new("next_name", DataType::Utf8, true),
    ]);
    Arc::new(Schema::new(f))
}

/// One idle interval of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    pub key: DeviceKey,
    pub start: i64,
    pub dur: i64,
    pub cause: &'static str,
    pub detail: Option<String>,
    pub next_name: String,
}

static DATA_LOADING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)data\s*_?loader|dataloader|data[_ ]?load|load[_ ]?data|fetch[_ ]?batch|next_batch|prefetch|^data$|^input$|collate")
        .expect("valid regex")
});

/// Whether a range or stage name looks like data loading.
pub fn is_data_loading(name: &str) -> bool {
    DATA_LOADING.is_match(name)
}

/// Host calls that block until GPU work finishes: the runtime, driver and deprecated forms,
/// and their HIP twins. A name matches when it starts with one of these (versioned driver
/// entry points such as `cuStreamSynchronize_v2` included).
pub const HOST_SYNC_CALLS: &[&str] = &[
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaThreadSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "hipCtxSynchronize",
    "hipThreadSynchronize",
];

/// Whether a host call blocks until GPU work finishes (see [`HOST_SYNC_CALLS`]).
pub fn is_sync_call(name: &str) -> bool {
    HOST_SYNC_CALLS.iter().any(|p| name.starts_with(p))
}

/// Ranges sorted by start, with the running maximum end, for "which ranges overlap
/// `[lo, hi)`" without scanning them all.
struct Index<T> {
    items: Vec<(i64, i64, T)>,
    max_end: Vec<i64>,
}

impl<T> Index<T> {
    fn new(mut items: Vec<(i64, i64, T)>) -> Self {
        items.sort_by_key(|i| (i.0, i.1));
        let mut m = i64::MIN;
        let max_end = items
            .iter()
            .map(|i| {
                m = m.max(i.1);
                m
            })
            .collect();
        Index { items, max_end }
    }

    /// Items overlapping `[lo, hi)`, latest start first.
    fn overlapping(&self, lo: i64, hi: i64) -> impl Iterator<Item = &(i64, i64, T)> {
        let end = self.items.partition_point(|i| i.0 < hi);
        (0..end)
            .rev()
            .take_while(move |&i| self.max_end[i] > lo)
            .map(|i| &self.items[i])
            .filter(move |i| i.1 > lo)
    }

    /// Length of `[lo, hi)` covered by the items, and the item covering the most of it.
    fn coverage(&self, lo: i64, hi: i64) -> (i64, Option<&T>) {
        let mut set = Vec::new();
        let mut best: Option<(i64, &T)> = None;
        for (s, e, t) in self.overlapping(lo, hi) {
            let (s, e) = ((*s).max(lo), (*e).min(hi));
            set.push((s, e));
            if best.is_none_or(|b| e - s > b.0) {
                best = Some((e - s, t));
            }
        }
        (
            super::intervals::length(&super::intervals::union(set)),
            best.map(|b| b.1),
        )
    }
}

/// What the cause rules look at, for one run.
struct Context<'a> {
    host: &'a Host,
    names: &'a Names,
    /// (rank, pid) -> the process's synchronisation calls.
    syncs: HashMap<(Option<i32>, Option<i64>), Index<u32>>,
    /// rank -> data-loading ranges and stages (rank-less ranges, e.g. a stage log added to a
    /// run, apply to every rank).
    loading: HashMap<Option<i32>, Index<u32>>,
    /// rank -> the other stage-log stages.
    stages: HashMap<Option<i32>, Index<u32>>,
}

impl<'a> Context<'a> {
    /// `gpu_spans`: per rank, the first start and last end of its GPU work. `ranks`: the
    /// ranks with host calls or ranges in the run (rank-less ranges apply to each), when
    /// `host` and `ranges` hold only a window of it.
    fn new(
        host: &'a Host,
        names: &'a Names,
        ranges: &[Range],
        gpu_spans: &HashMap<Option<i32>, (i64, i64)>,
        ranks: Option<Vec<Option<i32>>>,
    ) -> Self {
        let mut syncs: HashMap<_, Vec<(i64, i64, u32)>> = HashMap::new();
        for c in &host.calls {
            if is_sync_call(names.get(c.name)) {
                syncs
                    .entry((c.rank, c.pid))
                    .or_default()
                    .push((c.start, c.end, c.name));
            }
        }
        let ranks = ranks.unwrap_or_else(|| {
            let mut ranks: Vec<Option<i32>> = host.calls.iter().map(|c| c.rank).collect();
            ranks.extend(ranges.iter().map(|r| r.rank));
            ranks.sort_unstable();
            ranks.dedup();
            ranks
        });
        let stage_scope = |r: &Range| r.scope.is_some_and(|s| names.get(s) == "stage");
        let mut loading: HashMap<_, Vec<(i64, i64, u32)>> = HashMap::new();
        let mut stages: HashMap<_, Vec<(i64, i64, u32)>> = HashMap::new();
        for r in ranges {
            let into = if is_data_loading(names.get(r.name)) {
                &mut loading
            } else if stage_scope(r) {
                &mut stages
            } else {
                continue;
            };
            let targets: Vec<Option<i32>> = match r.rank {
                None => ranks.clone(),
                rank => vec![rank],
            };
            for t in targets {
                // A stage around all of the rank's GPU work (`train`, `inference`: the trace
                // was taken inside it) is context, not a cause.
                let encloses = gpu_spans
                    .get(&t)
                    .is_some_and(|&(lo, hi)| r.start <= lo && r.end >= hi);
                if !(encloses && stage_scope(r) && !is_data_loading(names.get(r.name))) {
                    into.entry(t).or_default().push((r.start, r.end, r.name));
                }
            }
        }
        let index = |m: HashMap<Option<i32>, Vec<(i64, i64, u32)>>| {
            m.into_iter().map(|(k, v)| (k, Index::new(v))).collect()
        };
        Context {
            host,
            names,
            syncs: syncs.into_iter().map(|(k, v)| (k, Index::new(v))).collect(),
            loading: index(loading),
            stages: index(stages),
        }
    }

    fn cause(
        &self,
        key: &DeviceKey,
        lo: i64,
        hi: i64,
        launch: Option<&HostCall>,
    ) -> (&'static str, Option<String>) {
        let half = (hi - lo + 1) / 2;
        let host_pid = launch.map_or(key.pid, |l| l.pid);
        if let Some(idx) = self.syncs.get(&(key.rank, host_pid)) {
            let (n, best) = idx.coverage(lo, hi);
            if n >= half {
                return ("sync", best.map(|&id| self.names.get(id).to_string()));
            }
        }
        let covering = |ranges: &HashMap<Option<i32>, Index<u32>>| {
            let (n, best) = ranges.get(&key.rank)?.coverage(lo, hi);
            (n >= half)
                .then(|| best.map(|&name| self.names.get(name).to_string()))
                .flatten()
        };
        if let Some(name) = covering(&self.loading) {
            return ("dataloader", Some(name));
        }
        if let Some(l) = launch {
            if l.start > lo {
                return ("host_wait", Some(self.names.get(l.name).to_string()));
            }
        }
        if hi - lo < SHORT_GAP_NS {
            return ("short", None);
        }
        if let Some(name) = covering(&self.stages) {
            return ("stage", Some(name));
        }
        ("other", None)
    }
}

/// Per rank, the first start and last end of the device timelines' spans.
fn rank_spans<'k>(
    spans: impl Iterator<Item = (&'k DeviceKey, (i64, i64))>,
) -> HashMap<Option<i32>, (i64, i64)> {
    let mut out: HashMap<Option<i32>, (i64, i64)> = HashMap::new();
    for (key, (lo, hi)) in spans {
        let span = out.entry(key.rank).or_insert((lo, hi));
        *span = (span.0.min(lo), span.1.max(hi));
    }
    out
}

/// The device gaps longer than `min_gap_ns`, ordered by device timeline, then start.
pub fn device_gaps(
    timelines: &Timelines,
    host: &Host,
    names: &Names,
    ranges: &[Range],
    min_gap_ns: i64,
) -> Vec<Gap> {
    let spans = timelines.spans();
    let gpu_spans = rank_spans(
        timelines
            .devices
            .iter()
            .filter(|(_, ops)| !ops.is_empty())
            .map(|(k, _)| (k, spans[k])),
    );
    let cx = Context::new(host, names, ranges, &gpu_spans, None);
    sweep(timelines, &cx, min_gap_ns, &mut HashMap::new(), i64::MIN)
}

/// The gaps of `run` ended by an operation starting in `[lo, hi)`, each exactly as
/// [`device_gaps`] finds it over the whole run (see [`GapWindows`]).
pub async fn gaps_between(
    ctx: &SessionContext,
    run: &str,
    lo: i64,
    hi: i64,
    min_gap_ns: i64,
) -> Result<Vec<Gap>> {
    GapWindows::start(ctx, run, lo)
        .await?
        .next(ctx, hi, min_gap_ns)
        .await
}

/// A run's gaps read window after window in time order, each gap exactly as
/// [`device_gaps`] finds it over the whole run, while holding one window: the operations
/// starting in it, aggregates of the rest (each device's span; its latest end before the
/// window, carried from one window to the next), the host calls and ranges from the earliest
/// gap's start, and the calls sharing a correlation id with the window's operations.
pub struct GapWindows {
    run: String,
    /// Whole-run span of each device timeline, and per rank.
    spans: HashMap<DeviceKey, (i64, i64)>,
    gpu_spans: HashMap<Option<i32>, (i64, i64)>,
    /// The ranks with host calls or ranges (rank-less ranges apply to each).
    ranks: Vec<Option<i32>>,
    /// Each device's latest end among the operations before `lo`.
    carry: HashMap<DeviceKey, i64>,
    lo: i64,
    /// Whether overhead rows before `lo` are yet to be read (they are not in `carry`).
    first: bool,
}

impl GapWindows {
    /// Windows of `run` from `lo` on.
    pub async fn start(ctx: &SessionContext, run: &str, lo: i64) -> Result<GapWindows> {
        let (spans, carry) = device_spans(ctx, run, lo).await?;
        let ranks_sql = format!(
            "SELECT DISTINCT rank FROM runtime WHERE run = {run_sql} AND dur >= 0 UNION \
             SELECT DISTINCT rank FROM events WHERE run = {run_sql} AND kind = 'annotation' AND dur > 0",
            run_sql = super::literal(run)
        );
        let mut ranks: Vec<Option<i32>> = Vec::new();
        for b in collect(ctx, &ranks_sql).await? {
            ranks.extend(ints(&b, 0)?.into_iter().map(|r| r.map(|r| r as i32)));
        }
        ranks.sort_unstable();
        ranks.dedup();
        let gpu_spans = rank_spans(spans.iter().map(|(k, v)| (k, *v)));
        Ok(GapWindows {
            run: run.to_string(),
            spans,
            gpu_spans,
            ranks,
            carry,
            lo,
            first: true,
        })
    }

    /// The gaps ended by an operation starting from the last window's end up to `hi`.
    pub async fn next(
        &mut self,
        ctx: &SessionContext,
        hi: i64,
        min_gap_ns: i64,
    ) -> Result<Vec<Gap>> {
        let (run, lo) = (self.run.as_str(), self.lo);
        let mut timelines = Timelines::load_rows(ctx, run, Rows::Starting(lo, hi)).await?;
        // Overhead rows count as work; on the first window the earlier ones may end the last
        // operation before `lo`.
        let overhead = if self.first {
            Rows::Before(hi)
        } else {
            Rows::Starting(lo, hi)
        };
        timelines
            .add_overhead(ctx, run, overhead, &self.spans)
            .await?;
        timelines.sort();
        // Where the earliest gap that ends in the window starts.
        let mut host_lo = lo;
        for (key, ops) in &timelines.devices {
            let mut end = self.carry.get(key).copied();
            for op in ops {
                if op.start >= lo {
                    if let Some(e) = end {
                        host_lo = host_lo.min(e);
                    }
                    break;
                }
                end = Some(end.map_or(op.end, |e| e.max(op.end)));
            }
        }
        let mut names = Names::default();
        let window = Rows::Overlapping(host_lo, hi);
        let mut host = Host::load_rows(ctx, run, &mut names, window).await?;
        let ranges = ranges_rows(ctx, run, &mut names, window).await?;
        // Launch calls outside what is loaded (work queued long before it ran), and the calls
        // of other processes sharing a correlation id, so that each operation's launch is the
        // one the whole run gives.
        let mut wanted = std::collections::HashSet::new();
        for (key, ops) in &timelines.devices {
            for op in ops.iter().filter(|o| o.start >= lo) {
                if let Some(c) = op.correlation {
                    wanted.insert((key.rank, c));
                }
            }
        }
        host.add_launches(ctx, run, &mut names, &wanted, (host_lo, hi))
            .await?;
        let cx = Context::new(
            &host,
            &names,
            &ranges,
            &self.gpu_spans,
            Some(self.ranks.clone()),
        );
        let gaps = sweep(&timelines, &cx, min_gap_ns, &mut self.carry, lo);
        self.lo = hi;
        self.first = false;
        Ok(gaps)
    }
}

/// The gaps of `timelines` ended by operations starting at or after `from`; `carry`: each
/// device's latest end before its first operation here, updated to its latest end of all.
fn sweep(
    timelines: &Timelines,
    cx: &Context,
    min_gap_ns: i64,
    carry: &mut HashMap<DeviceKey, i64>,
    from: i64,
) -> Vec<Gap> {
    let mut out = Vec::new();
    for (key, ops) in &timelines.devices {
        let mut end = carry.get(key).copied().unwrap_or(i64::MIN);
        for op in ops {
            if op.start >= from && end != i64::MIN && op.start > end && op.start - end > min_gap_ns
            {
                let launch = cx.host.launch(key, op.correlation);
                let (cause, detail) = cx.cause(key, end, op.start, launch);
                out.push(Gap {
                    key: key.clone(),
                    start: end,
                    dur: op.start - end,
                    cause,
                    detail,
                    next_name: timelines.names.get(op.name).to_string(),
                });
            }
            end = end.max(op.end);
        }
        if end != i64::MIN {
            carry.insert(key.clone(), end);
        }
    }
    out
}

/// Loads what the gap analyses read.
async fn load(ctx: &SessionContext, run: &str) -> Result<(Timelines, Host, Names, Vec<Range>)> {
    let timelines = Timelines::load(ctx, run, true).await?;
    let mut names = Names::default();
    let host = Host::load(ctx, run, &mut names).await?;
    let ranges = ranges(ctx, run, &mut names).await?;
    Ok((timelines, host, names, ranges))
}

/// A gap `(start, dur)` of `rank` clipped to the scope's window (the selected steps' span),
/// `None` when what is left is not longer than `min_gap_ns`.
fn clipped(
    scope: &Scope,
    rank: Option<i32>,
    gap: (i64, i64),
    min_gap_ns: i64,
) -> Option<(i64, i64)> {
    let (s, e) = scope.clip(rank, gap.0, gap.0 + gap.1)?;
    (e - s > min_gap_ns).then_some((s, e - s))
}

/// The device gaps of `timelines` restricted to `scope` (see [`device_gaps`]).
pub fn scoped_gaps(
    timelines: &Timelines,
    host: &Host,
    names: &Names,
    ranges: &[Range],
    scope: &Scope,
    min_gap_ns: i64,
) -> Vec<Gap> {
    device_gaps(timelines, host, names, ranges, min_gap_ns)
        .into_iter()
        .filter_map(|mut g| {
            (g.start, g.dur) = clipped(scope, g.key.rank, (g.start, g.dur), min_gap_ns)?;
            Some(g)
        })
        .collect()
}

async fn gpu_gaps(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let (mut timelines, host, names, ranges) = load(&ctx, &call.run).await?;
    scope.restrict(&mut timelines);
    let min_gap = call.int(0).unwrap_or(0);
    let gaps = scoped_gaps(&timelines, &host, &names, &ranges, &scope, min_gap);
    let columns: Vec<ArrayRef> = vec![
        call.run_column(gaps.len()),
        Arc::new(Int32Array::from_iter(gaps.iter().map(|g| g.key.rank))),
        Arc::new(Int64Array::from_iter(gaps.iter().map(|g| g.key.pid))),
        Arc::new(Int32Array::from_iter(gaps.iter().map(|g| g.key.device))),
        Arc::new(Int64Array::from_iter_values(gaps.iter().map(|g| g.start))),
        Arc::new(Int64Array::from_iter_values(gaps.iter().map(|g| g.dur))),
        Arc::new(StringArray::from_iter_values(gaps.iter().map(|g| g.cause))),
        Arc::new(StringArray::from_iter(
            gaps.iter().map(|g| g.detail.as_deref()),
        )),
        Arc::new(StringArray::from_iter_values(
            gaps.iter().map(|g| g.next_name.as_str()),
        )),
    ];
    batch(gpu_gaps_schema(), columns)
}

/// One idle interval of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamGap {
    pub key: DeviceKey,
    pub stream: Option<i64>,
    pub start: i64,
    pub dur: i64,
    pub cause: &'static str,
    pub next_name: String,
}

/// HTA's per-stream gaps longer than `min_gap_ns`.
pub fn per_stream_gaps(timelines: &Timelines, host: &Host, min_gap_ns: i64) -> Vec<StreamGap> {
    let mut out = Vec::new();
    for (key, ops) in &timelines.devices {
        let mut streams: Vec<Option<i64>> = ops.iter().map(|o| o.stream).collect();
        streams.sort_unstable();
        streams.dedup();
        for stream in streams {
            let mut end = i64::MIN;
            // Overhead pseudo-operations have no stream.
            for op in ops
                .iter()
                .filter(|o| o.stream == stream && stream.is_some())
            {
                if end != i64::MIN && op.start > end && op.start - end > min_gap_ns {
                    let dur = op.start - end;
                    let cause = match host.launch(key, op.correlation) {
                        Some(l) if l.start > end => "host_wait",
                        _ if dur < SHORT_GAP_NS => "kernel_wait",
                        _ => "other",
                    };
                    out.push(StreamGap {
                        key: key.clone(),
                        stream,
                        start: end,
                        dur,
                        cause,
                        next_name: timelines.names.get(op.name).to_string(),
                    });
                }
                end = end.max(op.end);
            }
        }
    }
    out
}

async fn stream_gaps(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let mut timelines = Timelines::load(&ctx, &call.run, false).await?;
    scope.restrict(&mut timelines);
    let mut names = Names::default();
    let host = Host::load(&ctx, &call.run, &mut names).await?;
    let min_gap = call.int(0).unwrap_or(0);
    let gaps: Vec<StreamGap> = per_stream_gaps(&timelines, &host, min_gap)
        .into_iter()
        .filter_map(|mut g| {
            (g.start, g.dur) = clipped(&scope, g.key.rank, (g.start, g.dur), min_gap)?;
            Some(g)
        })
        .collect();
    let columns: Vec<ArrayRef> = vec![
        call.run_column(gaps.len()),
        Arc::new(Int32Array::from_iter(gaps.iter().map(|g| g.key.rank))),
        Arc::new(Int64Array::from_iter(gaps.iter().map(|g| g.key.pid))),
        Arc::new(Int32Array::from_iter(gaps.iter().map(|g| g.key.device))),
        Arc::new(Int64Array::from_iter(gaps.iter().map(|g| g.stream))),
        Arc::new(Int64Array::from_iter_values(gaps.iter().map(|g| g.start))),
        Arc::new(Int64Array::from_iter_values(gaps.iter().map(|g| g.dur))),
        Arc::new(StringArray::from_iter_values(gaps.iter().map(|g| g.cause))),
        Arc::new(StringArray::from_iter_values(
            gaps.iter().map(|g| g.next_name.as_str()),
        )),
    ];
    batch(stream_gaps_schema(), columns)
}
