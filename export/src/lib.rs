//! Seeing a stored run. `gpuq export`: the run as a timeline, for Perfetto ([`perfetto`], its
//! protobuf trace format: exact nanoseconds, interned names) or chrome://tracing and
//! TensorBoard ([`chrome`], JSON). `gpuq report`: one self-contained HTML page ([`report`]).
//!
//! Tracks: a process per rank; in it a track per GPU stream (kernels, copies, sets, syncs),
//! per GPU's annotations, per host thread (operators, annotations, runtime calls), flows from
//! each launch call to its GPU work (by correlation id), the `counters` table as counter
//! tracks, and gpuq's own knowledge: a `steps` track, a counter of each step's GPU-busy share
//! (`step_stats`), an `idle gaps` track per GPU whose slices are named by their cause
//! (`gpu_gaps`), and a `findings` track: each finding over the moment it points to (its
//! worst instance: `findings`' `at_ts`/`at_dur`), with its evidence and action.
//!
//! A [`Window`] (steps, a time range, ranks, a minimum duration) picks the part of a large run
//! a viewer can hold. Rows are read as a stream and written a batch at a time; the step and
//! idle-gap tracks read the run's GPU work a part at a time ([`GapWindows`],
//! [`busy_within`]), so they hold a part of the run, not all of it. The findings
//! (`--no-findings` leaves them out) analyse the whole run at once.
//!
//! [`GapWindows`]: gpuq_query::analyses::gaps::GapWindows
//! [`busy_within`]: gpuq_query::analyses::stages::busy_within

pub mod chrome;
pub mod perfetto;
mod protobuf;
pub mod report;
mod whole_file;

pub use whole_file::WholeFile;

use datafusion::arrow::array::{
    Array, ArrowPrimitiveType, AsArray, Int32Array, Int64Array, PrimitiveArray, RecordBatch,
    StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int32Type, Int64Type};
use datafusion::common::runtime::SpawnedTask;
use datafusion::execution::context::SessionContext;
use futures::{SinkExt, StreamExt};
use gpuq_query::analyses::StepRange;
use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Query(#[from] datafusion::error::DataFusionError),
    #[error("{0}")]
    Arrow(#[from] datafusion::arrow::error::ArrowError),
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Window(String),
}

pub(crate) type Result<T> = std::result::Result<T, ExportError>;

/// GPU operations per read for the idle gaps: what bounds an export's memory, whatever the
/// run's size (the step-busy counter reads as many: [`busy_within`]).
const OPS_PER_READ: usize = 50_000;

/// The counter track of each step's GPU-busy share.
pub const STEP_BUSY_COUNTER: &str = "GPU busy per step (%)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Perfetto,
    Chrome,
}

/// The part of a run to export.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Steps, as `3..5`, `3..`, `..5` or `4`: from the first one's start to the last one's end.
    pub steps: Option<String>,
    /// ns after the run's first event.
    pub from: Option<i64>,
    pub to: Option<i64>,
    /// Only these ranks (all when empty).
    pub ranks: Vec<i32>,
    /// Leave out slices shorter than this (ns); instants and counters stay.
    pub min_dur: i64,
    /// Leave out the findings track: the one part of an export that analyses the whole run
    /// at once, so its memory grows with the run.
    pub skip_findings: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub slices: u64,
    pub instants: u64,
    pub counters: u64,
    pub flows: u64,
    pub tracks: u64,
    /// The window's times (ns), as resolved.
    pub from_ns: i64,
    pub to_ns: i64,
}

/// A timeline track.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Track {
    Stream {
        rank: Option<i32>,
        device: i32,
        stream: Option<i64>,
    },
    GpuAnnotations {
        rank: Option<i32>,
        device: i32,
    },
    Thread {
        rank: Option<i32>,
        pid: Option<i64>,
        tid: Option<i64>,
    },
    Steps {
        rank: Option<i32>,
    },
    Gaps {
        rank: Option<i32>,
        device: Option<i32>,
    },
    /// `findings`, each over the moment it points to (its worst instance).
    Findings {
        rank: Option<i32>,
    },
    Counter {
        rank: Option<i32>,
        device: Option<i32>,
        name: String,
    },
}

impl Track {
    pub fn rank(&self) -> Option<i32> {
        match self {
            Track::Stream { rank, .. }
            | Track::GpuAnnotations { rank, .. }
            | Track::Thread { rank, .. }
            | Track::Steps { rank }
            | Track::Gaps { rank, .. }
            | Track::Findings { rank }
            | Track::Counter { rank, .. } => *rank,
        }
    }

    /// The name a viewer shows.
    pub fn name(&self) -> String {
        let or_q = |v: Option<i64>| v.map_or("?".to_string(), |v| v.to_string());
        match self {
            Track::Stream { device, stream, .. } => {
                format!("GPU {device} stream {}", or_q(*stream))
            }
            Track::GpuAnnotations { device, .. } => format!("GPU {device} annotations"),
            Track::Thread { pid, tid, .. } => format!("thread {} (pid {})", or_q(*tid), or_q(*pid)),
            Track::Steps { .. } => "steps".into(),
            Track::Gaps { device, .. } => {
                format!("GPU {} idle gaps (by cause)", or_q(device.map(i64::from)))
            }
            Track::Findings { .. } => "findings".into(),
            Track::Counter { device, name, .. } => match device {
                Some(d) => format!("{name} (GPU {d})"),
                None => name.clone(),
            },
        }
    }

    /// The name of the process (rank) the track belongs to.
    pub fn process_name(rank: Option<i32>) -> String {
        rank.map_or("run".into(), |r| format!("rank {r}"))
    }
}

/// An argument shown with a slice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Int(i64),
    Text(&'a str),
}

/// The arguments a slice may carry (no allocation per row).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Args<'a> {
    pub step: Option<i64>,
    pub op: Option<&'a str>,
    pub scope: Option<&'a str>,
    pub correlation: Option<i64>,
    pub bytes: Option<i64>,
    pub detail: Option<&'a str>,
    pub severity: Option<&'a str>,
    pub action: Option<&'a str>,
}

impl<'a> Args<'a> {
    /// The arguments present, named.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Arg<'a>)> + '_ {
        [
            self.step.map(|v| ("step", Arg::Int(v))),
            self.op.map(|v| ("op", Arg::Text(v))),
            self.scope.map(|v| ("scope", Arg::Text(v))),
            self.correlation.map(|v| ("correlation", Arg::Int(v))),
            self.bytes.map(|v| ("bytes", Arg::Int(v))),
            self.detail.map(|v| ("detail", Arg::Text(v))),
            self.severity.map(|v| ("severity", Arg::Text(v))),
            self.action.map(|v| ("action", Arg::Text(v))),
        ]
        .into_iter()
        .flatten()
    }
}

/// What a writer is given, a batch at a time; texts borrowed from the batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Item<'a> {
    Slice {
        track: Track,
        ts: i64,
        dur: i64,
        name: &'a str,
        category: &'static str,
        /// The flow that starts here (a launch call) or ends here (its GPU work).
        flow_out: Option<u64>,
        flow_in: Option<u64>,
        args: Args<'a>,
    },
    Instant {
        track: Track,
        ts: i64,
        name: &'a str,
        category: &'static str,
    },
    Counter {
        track: Track,
        ts: i64,
        value: f64,
    },
}

/// A format's writer.
pub trait Writer {
    fn write(&mut self, items: &[Item<'_>]) -> std::io::Result<()>;
    fn finish(&mut self) -> std::io::Result<()>;
    fn tracks(&self) -> u64;
}

/// Exports `run` (its rows within `window`) to `out` in `format`.
pub async fn export(
    ctx: &SessionContext,
    run: &str,
    window: &Window,
    format: Format,
    out: &mut (dyn Write + Send),
) -> Result<Summary> {
    let (from_ns, to_ns) = resolve(ctx, run, window).await?;
    let mut out = Output {
        writer: match format {
            Format::Perfetto => Box::new(perfetto::PerfettoWriter::new(out)),
            Format::Chrome => Box::new(chrome::ChromeWriter::new(out, from_ns)),
        },
        summary: Summary {
            from_ns,
            to_ns,
            ..Summary::default()
        },
    };
    let run_sql = sql_text(run);
    // The window as a condition on columns named `ts`, `dur` and `rank` by default.
    let within = |ts: &str, dur: &str, rank: &str| {
        let ranks = if window.ranks.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = window.ranks.iter().map(|r| r.to_string()).collect();
            format!(" AND {rank} IN ({})", list.join(", "))
        };
        format!("{ts} + {dur} >= {from_ns} AND {ts} < {to_ns}{ranks}")
    };
    let in_window = within("ts", "dur", "rank");
    let events = format!(
        "SELECT rank, device, stream, pid, tid, CAST(kind AS VARCHAR) AS kind, \
         CAST(name AS VARCHAR) AS name, ts, dur, correlation, step, CAST(op AS VARCHAR) AS op, \
         CAST(scope AS VARCHAR) AS scope, bytes FROM events \
         WHERE run = {run_sql} AND {in_window} AND (dur >= {} OR kind = 'instant')",
        window.min_dur
    );
    for_each_batch(ctx, &events, |b| {
        let columns = EventColumns::of(&b)?;
        out.emit(&columns.items())
    })
    .await?;
    let steps =
        format!("SELECT rank, step, ts, dur FROM steps WHERE run = {run_sql} AND {in_window}");
    for_each_batch(ctx, &steps, |b| {
        let rank = i32s(&b, "rank")?;
        let step = i64s(&b, "step")?;
        let ts = i64s(&b, "ts")?;
        let dur = i64s(&b, "dur")?;
        let names: Vec<String> = (0..b.num_rows())
            .map(|i| opt(&step, i).map_or("step".into(), |s| format!("step {s}")))
            .collect();
        let items: Vec<Item> = (0..b.num_rows())
            .map(|i| Item::Slice {
                track: Track::Steps {
                    rank: opt(&rank, i),
                },
                ts: ts.value(i),
                dur: dur.value(i),
                name: &names[i],
                category: "step",
                flow_out: None,
                flow_in: None,
                args: Args {
                    step: opt(&step, i),
                    ..Args::default()
                },
            })
            .collect();
        out.emit(&items)
    })
    .await?;
    // Per step, the share of it the GPU was busy (`step_stats`' gpu_busy), as a counter
    // sampled at each step's start. The steps are few (24 bytes each); their GPU operations
    // are read a window at a time.
    let steps = format!(
        "SELECT rank, ts, dur FROM steps WHERE run = {run_sql} AND {in_window} AND dur > 0 ORDER BY ts"
    );
    let mut spans: Vec<(Option<i32>, i64, i64)> = Vec::new();
    let mut stream = ctx.sql(&steps).await?.execute_stream().await?;
    while let Some(b) = stream.next().await.transpose()? {
        let (rank, ts, dur) = (i32s(&b, "rank")?, i64s(&b, "ts")?, i64s(&b, "dur")?);
        spans.extend(
            (0..b.num_rows()).map(|i| (opt(&rank, i), ts.value(i), ts.value(i) + dur.value(i))),
        );
    }
    let busy = gpuq_query::analyses::stages::busy_within(ctx, run, &spans).await?;
    let items: Vec<Item> = spans
        .iter()
        .zip(busy)
        .map(|(&(rank, s, e), busy)| Item::Counter {
            track: Track::Counter {
                rank,
                device: None,
                name: STEP_BUSY_COUNTER.into(),
            },
            ts: s,
            value: busy as f64 / (e - s) as f64 * 100.0,
        })
        .collect();
    out.emit(&items)?;
    // Idle gaps by cause, exactly `gpu_gaps`' rows, computed a window at a time: the gaps
    // ended in each part of the window, then the one each GPU is in at its end.
    let gpu_ops = |cond: &str| {
        format!(
            "SELECT count(*) AS n, max(first) AS last_first FROM (SELECT min(ts) AS first FROM gpu_ops \
             WHERE run = {run_sql} AND ts > 0 AND dur >= 0 AND {cond} GROUP BY rank, pid, device)"
        )
    };
    let mut bounds =
        gpuq_query::analyses::data::op_windows(ctx, run, from_ns, to_ns, OPS_PER_READ).await?;
    let after = ctx
        .sql(&gpu_ops(&format!("ts >= {to_ns}")))
        .await?
        .collect()
        .await?;
    if let Some(last_first) = after.first().and_then(|b| first(b, "last_first")) {
        bounds.push((to_ns, last_first + 1));
    }
    let mut windows = gpuq_query::analyses::gaps::GapWindows::start(ctx, run, from_ns).await?;
    for (_, z) in bounds {
        let gaps = windows.next(ctx, z, 0).await?;
        let items: Vec<Item> = gaps
            .iter()
            .filter(|g| g.start < to_ns && g.dur >= window.min_dur)
            .filter(|g| {
                window.ranks.is_empty() || g.key.rank.is_some_and(|r| window.ranks.contains(&r))
            })
            .map(|g| Item::Slice {
                track: Track::Gaps {
                    rank: g.key.rank,
                    device: g.key.device,
                },
                ts: g.start,
                dur: g.dur,
                name: g.cause,
                category: "idle",
                flow_out: None,
                flow_in: None,
                args: Args {
                    detail: g.detail.as_deref(),
                    ..Args::default()
                },
            })
            .collect();
        out.emit(&items)?;
    }
    // Findings at the moment each points to (those about totals have none). With steps,
    // the findings of those steps.
    let steps_arg = window
        .steps
        .as_deref()
        .map_or(String::new(), |s| format!(", {}", sql_text(s)));
    let findings = (!window.skip_findings).then(|| {
        format!(
        "SELECT at_rank AS rank, at_ts AS ts, at_dur AS dur, severity, title, evidence, action \
         FROM findings({run_sql}{steps_arg}) WHERE at_ts IS NOT NULL AND {}",
        within("at_ts", "at_dur", "at_rank")
    )
    });
    if let Some(findings) = findings {
        for_each_batch(ctx, &findings, |b| {
            let rank = i32s(&b, "rank")?;
            let ts = i64s(&b, "ts")?;
            let dur = i64s(&b, "dur")?;
            let severity = strs(&b, "severity")?;
            let title = strs(&b, "title")?;
            let evidence = strs(&b, "evidence")?;
            let action = strs(&b, "action")?;
            let items: Vec<Item> = (0..b.num_rows())
                .map(|i| Item::Slice {
                    track: Track::Findings {
                        rank: opt(&rank, i),
                    },
                    ts: ts.value(i),
                    dur: dur.value(i).max(1),
                    name: text(&title, i).unwrap_or(""),
                    category: "finding",
                    flow_out: None,
                    flow_in: None,
                    args: Args {
                        detail: text(&evidence, i),
                        severity: text(&severity, i),
                        action: text(&action, i),
                        ..Args::default()
                    },
                })
                .collect();
            out.emit(&items)
        })
        .await?;
    }
    // Ordered, so that each counter track gets the same uuid in every export of the run (the
    // scan's batches of several ranks arrive in any order). The order is the files' own
    // (nulls first, on the stored `name`), so the files are merged as they stream, not
    // sorted in memory: a run's counters can be many.
    let counters = format!(
        "SELECT rank, device, CAST(name AS VARCHAR) AS track, ts, value FROM counters \
         WHERE run = {run_sql} AND {} \
         ORDER BY rank NULLS FIRST, device NULLS FIRST, name NULLS FIRST, ts NULLS FIRST",
        within("ts", "0", "rank")
    );
    for_each_batch(ctx, &counters, |b| {
        let rank = i32s(&b, "rank")?;
        let device = i32s(&b, "device")?;
        let name = strs(&b, "track")?;
        let ts = i64s(&b, "ts")?;
        let value = b
            .column_by_name("value")
            .map(|c| c.as_primitive::<Float64Type>().clone())
            .ok_or_else(|| ExportError::Window("counters without values".into()))?;
        let items: Vec<Item> = (0..b.num_rows())
            .map(|i| Item::Counter {
                track: Track::Counter {
                    rank: opt(&rank, i),
                    device: opt(&device, i),
                    name: text(&name, i).unwrap_or("").to_string(),
                },
                ts: ts.value(i),
                value: value.value(i),
            })
            .collect();
        out.emit(&items)
    })
    .await?;
    out.writer.finish()?;
    out.summary.tracks = out.writer.tracks();
    Ok(out.summary)
}

/// The writer and what it was given.
struct Output<'w> {
    writer: Box<dyn Writer + Send + 'w>,
    summary: Summary,
}

impl Output<'_> {
    fn emit(&mut self, items: &[Item<'_>]) -> Result<()> {
        count(&mut self.summary, items);
        Ok(self.writer.write(items)?)
    }
}

/// Runs `sql` and hands each batch of its result to `each` as the rows stream in, in an order
/// that is the same on every export of the run (so are its packets and flow ids): the plan's
/// partitions one after another, each read ahead [`READ_AHEAD`] batches while those before it
/// are written. Round-robin repartitioning, whose interleaving depends on timing, is off.
///
/// A run's files are a partition each (they overlap in sort order), so a large run has many
/// partitions: only [`PARTITIONS_AHEAD`] are read at a time besides the one being written,
/// each started as one before it ends. Reading them all at once held an open row group and
/// its read-ahead per file, memory that grew with the run.
async fn for_each_batch(
    ctx: &SessionContext,
    sql: &str,
    mut each: impl FnMut(RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut state = ctx.state();
    state
        .config_mut()
        .options_mut()
        .optimizer
        .enable_round_robin_repartition = false;
    let ordered = SessionContext::new_with_state(state);
    let partitions = ordered.sql(sql).await?.execute_stream_partitioned().await?;
    let spawn = |mut partition: datafusion::physical_plan::SendableRecordBatchStream| {
        let (mut tx, rx) = futures::channel::mpsc::channel(READ_AHEAD);
        let task = SpawnedTask::spawn(async move {
            while let Some(batch) = partition.next().await {
                if tx.send(batch).await.is_err() {
                    break;
                }
            }
        });
        (rx, task)
    };
    let mut waiting: std::collections::VecDeque<_> = partitions.into();
    let mut reading = std::collections::VecDeque::new();
    while reading.len() < PARTITIONS_AHEAD {
        let Some(partition) = waiting.pop_front() else {
            break;
        };
        reading.push_back(spawn(partition));
    }
    // Dropping the readers (on an error) ends their tasks.
    while let Some((mut rx, _task)) = reading.pop_front() {
        if let Some(partition) = waiting.pop_front() {
            reading.push_back(spawn(partition));
        }
        while let Some(batch) = rx.next().await {
            each(batch?)?;
        }
    }
    Ok(())
}

/// Batches each partition of an export's query reads ahead of the writer.
const READ_AHEAD: usize = 2;
/// Partitions of an export's query read at a time (files of the run, read ahead of the one
/// being written): enough to keep two cores busy decoding.
const PARTITIONS_AHEAD: usize = 2;

fn count(s: &mut Summary, items: &[Item<'_>]) {
    for item in items {
        match item {
            Item::Slice { flow_out, .. } => {
                s.slices += 1;
                s.flows += u64::from(flow_out.is_some());
            }
            Item::Instant { .. } => s.instants += 1,
            Item::Counter { .. } => s.counters += 1,
        }
    }
}

/// A SQL string literal.
fn sql_text(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The window's absolute times: [from, to) in ns.
async fn resolve(ctx: &SessionContext, run: &str, window: &Window) -> Result<(i64, i64)> {
    let run_sql = sql_text(run);
    let span = ctx
        .sql(&format!(
            "SELECT min(ts) AS lo, max(ts + dur) AS hi FROM events WHERE run = {run_sql}"
        ))
        .await?
        .collect()
        .await?;
    let (lo, hi) = span
        .first()
        .and_then(|b| Some((first(b, "lo")?, first(b, "hi")?)))
        .ok_or_else(|| {
            ExportError::Window(format!("run {run} has no events (or does not exist)"))
        })?;
    let (mut from, mut to) = (lo, hi + 1);
    if let Some(text) = &window.steps {
        let range = StepRange::parse(text).map_err(ExportError::Window)?;
        let mut cond = Vec::new();
        if let Some(a) = range.first {
            cond.push(format!("step >= {a}"));
        }
        if let Some(b) = range.last {
            cond.push(format!("step <= {b}"));
        }
        let cond = if cond.is_empty() {
            String::new()
        } else {
            format!(" AND {}", cond.join(" AND "))
        };
        let b = ctx
            .sql(&format!(
                "SELECT min(ts) AS lo, max(ts + dur) AS hi FROM steps WHERE run = {run_sql}{cond}"
            ))
            .await?
            .collect()
            .await?;
        let found = b
            .first()
            .and_then(|b| Some((first(b, "lo")?, first(b, "hi")?)));
        let Some((a, z)) = found else {
            return Err(ExportError::Window(format!(
                "run {run} has no steps {text} (see `SELECT DISTINCT step FROM steps WHERE run = {run_sql}`)"
            )));
        };
        from = from.max(a);
        to = to.min(z);
    }
    if let Some(f) = window.from {
        from = from.max(lo + f);
    }
    if let Some(t) = window.to {
        to = to.min(lo + t);
    }
    if from >= to {
        return Err(ExportError::Window(format!(
            "the window is empty (from {} to {} ns after the run's start)",
            from - lo,
            to - lo
        )));
    }
    Ok((from, to))
}

fn column<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a std::sync::Arc<dyn Array>> {
    b.column_by_name(name)
        .ok_or_else(|| ExportError::Window(format!("no column {name}")))
}

fn i64s(b: &RecordBatch, name: &str) -> Result<Int64Array> {
    Ok(cast(column(b, name)?, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

fn i32s(b: &RecordBatch, name: &str) -> Result<Int32Array> {
    Ok(cast(column(b, name)?, &DataType::Int32)?
        .as_primitive::<Int32Type>()
        .clone())
}

fn strs(b: &RecordBatch, name: &str) -> Result<StringArray> {
    Ok(cast(column(b, name)?, &DataType::Utf8)?
        .as_string::<i32>()
        .clone())
}

/// The first value of an integer column (an aggregate's), if not null.
fn first(b: &RecordBatch, name: &str) -> Option<i64> {
    let a = i64s(b, name).ok()?;
    opt(&a, 0)
}

fn opt<T: ArrowPrimitiveType>(a: &PrimitiveArray<T>, i: usize) -> Option<T::Native> {
    (i < a.len() && a.is_valid(i)).then(|| a.value(i))
}

fn text(a: &StringArray, i: usize) -> Option<&str> {
    a.is_valid(i).then(|| a.value(i))
}

/// A flow's id: a launch and its GPU work share (rank, correlation id).
fn flow_id(rank: Option<i32>, correlation: i64) -> u64 {
    let mut key = [0u8; 12];
    key[..4].copy_from_slice(&rank.unwrap_or(-1).to_le_bytes());
    key[4..].copy_from_slice(&correlation.to_le_bytes());
    twox_hash::XxHash3_64::oneshot(&key)
}

/// A batch of events, its columns cast to plain arrays that the items borrow from.
struct EventColumns {
    rank: Int32Array,
    device: Int32Array,
    stream: Int64Array,
    pid: Int64Array,
    tid: Int64Array,
    kind: StringArray,
    name: StringArray,
    ts: Int64Array,
    dur: Int64Array,
    correlation: Int64Array,
    step: Int64Array,
    op: StringArray,
    scope: StringArray,
    bytes: Int64Array,
}

impl EventColumns {
    fn of(b: &RecordBatch) -> Result<EventColumns> {
        Ok(EventColumns {
            rank: i32s(b, "rank")?,
            device: i32s(b, "device")?,
            stream: i64s(b, "stream")?,
            pid: i64s(b, "pid")?,
            tid: i64s(b, "tid")?,
            kind: strs(b, "kind")?,
            name: strs(b, "name")?,
            ts: i64s(b, "ts")?,
            dur: i64s(b, "dur")?,
            correlation: i64s(b, "correlation")?,
            step: i64s(b, "step")?,
            op: strs(b, "op")?,
            scope: strs(b, "scope")?,
            bytes: i64s(b, "bytes")?,
        })
    }

    /// The timeline items of the batch.
    fn items(&self) -> Vec<Item<'_>> {
        let mut items = Vec::with_capacity(self.ts.len());
        for i in 0..self.ts.len() {
            let kind = text(&self.kind, i).unwrap_or("other");
            let category: &'static str = match kind {
                "kernel" => "kernel",
                "memcpy" => "memcpy",
                "memset" => "memset",
                "sync" => "sync",
                "runtime" => "runtime",
                "driver" => "driver",
                "cpu_op" => "cpu_op",
                "annotation" => "annotation",
                "gpu_annotation" => "gpu_annotation",
                "python" => "python",
                "overhead" => "overhead",
                "instant" => "instant",
                _ => "other",
            };
            let rank = opt(&self.rank, i);
            let gpu = matches!(category, "kernel" | "memcpy" | "memset" | "sync");
            let track = match (category, opt(&self.device, i)) {
                ("gpu_annotation", Some(device)) => Track::GpuAnnotations { rank, device },
                (_, Some(device)) if gpu => Track::Stream {
                    rank,
                    device,
                    stream: opt(&self.stream, i),
                },
                _ => Track::Thread {
                    rank,
                    pid: opt(&self.pid, i),
                    tid: opt(&self.tid, i),
                },
            };
            let name = text(&self.name, i).unwrap_or("");
            let ts = self.ts.value(i);
            if category == "instant" {
                items.push(Item::Instant {
                    track,
                    ts,
                    name,
                    category,
                });
                continue;
            }
            let correlation = opt(&self.correlation, i);
            let flow = correlation.filter(|c| *c != 0).map(|c| flow_id(rank, c));
            items.push(Item::Slice {
                track,
                ts,
                dur: self.dur.value(i).max(0),
                name,
                category,
                flow_out: if matches!(category, "runtime" | "driver") {
                    flow
                } else {
                    None
                },
                flow_in: if gpu { flow } else { None },
                args: Args {
                    step: opt(&self.step, i),
                    op: text(&self.op, i),
                    scope: text(&self.scope, i),
                    correlation,
                    bytes: opt(&self.bytes, i),
                    ..Args::default()
                },
            });
        }
        items
    }
}
