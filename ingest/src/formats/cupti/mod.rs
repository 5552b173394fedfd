//! CUPTI activity recorded live (`gpuq record`): the collector's segments (`gpuq-cupti-wal`)
//! into canonical rows, attributed as they arrive.
//!
//! | record | kind | name | notes |
//! |---|---|---|---|
//! | kernel | `kernel` | demangled name (mangled in `args.mangled`) | `shared_mem` = static + dynamic; context, graph ids, launch type in `args` |
//! | memcpy | `memcpy` | `[CUDA memcpy <label>]` (nsys's labels) | `copy_kind` `HtoD`, ...; memory kinds in `args` |
//! | memset | `memset` | `[CUDA memset]` | value, memory kind in `args` |
//! | sync | `sync` | `Stream Sync`, `Event Sync`, `Context Sync`, `Stream Wait Event` | device from the context |
//! | runtime / driver API | `runtime` / `driver` | nsys's rule: `_vNNNN` dropped (raw in `args.api`) | external correlation ids in `args.external` |
//! | NVTX range (start + end marker) | `annotation`, or `cpu_op` when it names an operator | the text | steps from the step pattern |
//! | NVTX instant | `instant` | the text | |
//! | overhead | `overhead` | `CUPTI buffer flush`, ... | |
//! | device / context | no row | | run `devices`, context -> device map |
//!
//! A run is recorded a segment at a time, and a GPU record may come before the call that
//! launched it (CUPTI does not order its buffers), so a [`Recording`] keeps, per process, the
//! launches, NVTX ranges and steps seen so far, and holds GPU records until their launch is
//! known: then they take its step, operator and scope, as in the other adapters. A GPU record
//! whose launch has not come after [`HOLD_SEGMENTS`] more segments is stored without them, and
//! counted in the run's warnings.
//!
//! Times: CUPTI's clock is read with the realtime clock when the collector starts; where the
//! two differ by more than a second, times are moved onto the realtime clock, so `ts` is
//! always epoch ns.

use crate::columns::{CounterColumns, Event, EventColumns, Kind};
use crate::formats::nsys::{
    api_display_name, copy_code, operator_name, sync_name, MEMCPY_OPER, MEM_KIND,
};
use crate::redact;
use datafusion::arrow::array::{
    ArrayRef, Int32Array, Int64Array, RecordBatch, StringDictionaryBuilder,
};
use datafusion::arrow::datatypes::Int32Type;
use gpuq_cupti_wal::{RawRecord, RecordKind, Segment};
use gpuq_engine::manifest::DeviceInfo;
use regex::Regex;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

/// Segments a GPU record waits for the call that launched it.
pub const HOLD_SEGMENTS: u64 = 3;

/// Launches older than this (ns before the newest host time of their process) are forgotten:
/// GPU work does not wait longer than this for its launch's records.
const LAUNCH_MEMORY_NS: i64 = 30_000_000_000;

/// External correlation ids kept waiting for their API record (normally it comes in the same
/// buffer, right after).
const EXTERNAL_KEPT: usize = 1 << 20;

/// The process a segment came from, as its meta block says.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct SegmentMeta {
    pub pid: u32,
    pub rank: Option<i32>,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub cupti_version: u64,
    #[serde(default)]
    pub library: String,
    pub clock: Clock,
    #[serde(default)]
    pub seq: u64,
}

#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub struct Clock {
    pub cupti_ns: i64,
    pub realtime_ns: i64,
}

/// Counts a segment's health block carries.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct SegmentHealth {
    #[serde(default)]
    pub records: u64,
    #[serde(default)]
    pub dropped_records: u64,
    #[serde(default)]
    pub refused_buffers: u64,
    #[serde(default)]
    pub over_cap_buffers: u64,
    #[serde(default)]
    pub zero_timestamp_records: u64,
    #[serde(default)]
    pub unknown_records: u64,
    #[serde(default)]
    pub invalid_buffers: u64,
    #[serde(default)]
    pub decode_ns: u64,
}

/// A host range (an NVTX start/end pair) on a thread.
#[derive(Debug, Clone)]
struct Range {
    /// The NVTX marker id its start and end share.
    id: u32,
    tid: u32,
    start: i64,
    /// `None` while only its start is known.
    end: Option<i64>,
    name: Arc<str>,
    /// The operator it names, if any.
    op: Option<Arc<str>>,
    step: Option<i64>,
}

#[derive(Debug, Clone, Copy)]
struct Launch {
    ts: i64,
    tid: u32,
}

/// What a launch's time and thread give its work: step, operator, scope.
#[derive(Debug, Clone, Default)]
struct Attribution {
    step: Option<i64>,
    op: Option<Arc<str>>,
    scope: Option<Arc<str>>,
}

/// A row ready to be built: the record, its texts, and what it was attributed.
struct Row {
    kind: Kind,
    record: RawRecord,
    name: Arc<str>,
    args: Option<String>,
    copy_kind: Option<&'static str>,
    attribution: Attribution,
}

/// A GPU record waiting for its launch.
struct Pending {
    row: Row,
    /// The segment count of its process when it arrived.
    arrived: u64,
}

/// One process's state across segments.
#[derive(Default)]
struct Process {
    rank: Option<i32>,
    /// Added to CUPTI times to make them epoch ns.
    shift: i64,
    segments: u64,
    launches: HashMap<u32, Launch>,
    external: HashMap<u32, (u32, u64)>,
    contexts: HashMap<u32, u32>,
    /// NVTX ranges other than steps, by thread, in start order; open ones have no end yet.
    ranges: HashMap<u32, Vec<Range>>,
    /// Step ranges (any thread), in start order.
    steps: Vec<Range>,
    /// Ranges not ended yet, by marker id: their thread, whether a step, and their start.
    open_markers: HashMap<u32, (u32, bool, i64)>,
    pending: Vec<Pending>,
    /// Demangled kernel names by the collector's string id.
    names: HashMap<u32, Arc<str>>,
    newest_host_ts: i64,
    last_seq: u64,
}

/// Rows and counters taken from a [`Recording`], ready to be written as parts.
#[derive(Default)]
pub struct Taken {
    pub events: Option<RecordBatch>,
    pub counters: Option<RecordBatch>,
    pub rows: u64,
    pub kernels: u64,
    pub first_ts: Option<i64>,
    pub last_ts: Option<i64>,
}

/// A recorded run in the making: segments in, attributed rows out.
pub struct Recording {
    step_pattern: Regex,
    processes: BTreeMap<u32, Process>,
    ready: Vec<Row>,
    counters: Vec<(Option<i32>, u32, &'static str, i64, f64)>,
    pub devices: Vec<DeviceInfo>,
    /// Device details for the run's metadata, by device id.
    pub device_details: BTreeMap<u32, serde_json::Value>,
    /// Warnings since the last [`Recording::take_warnings`].
    warnings: BTreeMap<String, u64>,
    /// The processes seen, with their meta (for the run's sources and metadata).
    pub metas: BTreeMap<u32, SegmentMeta>,
}

impl Recording {
    pub fn new(step_pattern: Option<Regex>) -> Recording {
        Recording {
            step_pattern: step_pattern.unwrap_or_else(|| {
                Regex::new(crate::formats::nsys::DEFAULT_STEP_PATTERN).expect("valid pattern")
            }),
            processes: BTreeMap::new(),
            ready: Vec::new(),
            counters: Vec::new(),
            devices: Vec::new(),
            device_details: BTreeMap::new(),
            warnings: BTreeMap::new(),
            metas: BTreeMap::new(),
        }
    }

    fn warn(&mut self, message: impl Into<String>, n: u64) {
        if n > 0 {
            *self.warnings.entry(message.into()).or_default() += n;
        }
    }

    /// The warnings gathered since the last call.
    pub fn take_warnings(&mut self) -> BTreeMap<String, u64> {
        std::mem::take(&mut self.warnings)
    }

    /// Reads one segment. Segments of a process must come in sequence order.
    pub fn push(&mut self, seg: &Segment) -> Result<(), String> {
        let meta: SegmentMeta = serde_json::from_str(&seg.meta)
            .map_err(|e| format!("the segment's meta block: {e}"))?;
        let health: SegmentHealth = if seg.health.is_empty() {
            SegmentHealth::default()
        } else {
            serde_json::from_str(&seg.health)
                .map_err(|e| format!("the segment's health block: {e}"))?
        };
        let pid = meta.pid;
        if !self.processes.contains_key(&pid) {
            // The clock pair is read once, when the process's collector starts.
            let d = meta.clock.realtime_ns.saturating_sub(meta.clock.cupti_ns);
            let shift = if d.saturating_abs() > 1_000_000_000 {
                self.warn(
                    "CUPTI's clock is not the realtime clock: its times were moved by the difference read at start",
                    1,
                );
                d
            } else {
                0
            };
            self.processes.insert(
                pid,
                Process {
                    rank: meta.rank,
                    shift,
                    ..Process::default()
                },
            );
        }
        let p = self.processes.get_mut(&pid).expect("inserted above");
        if meta.seq != 0 && meta.seq <= p.last_seq {
            return Err(format!(
                "segment {} of process {pid} comes after segment {}",
                meta.seq, p.last_seq
            ));
        }
        p.last_seq = meta.seq;
        p.segments += 1;
        let shift = p.shift;
        let ts_of = |t: i64| t.saturating_add(shift);
        let health_ts = seg
            .records
            .iter()
            .map(|r| r.end)
            .max()
            .map(ts_of)
            .unwrap_or(meta.clock.realtime_ns);
        for (name, value) in [
            ("cupti.dropped_records", health.dropped_records),
            ("gpuq.refused_buffers", health.refused_buffers),
            ("gpuq.zero_timestamp_records", health.zero_timestamp_records),
        ] {
            if value > 0 {
                self.counters
                    .push((meta.rank, pid, name, health_ts, value as f64));
            }
        }
        self.warn(
            "records CUPTI dropped (no buffer free: raise GPUQ_MAX_BUFFER_MB or flush more often)",
            health.dropped_records,
        );
        self.warn(
            "GPU records without timestamps (CUPTI's device buffer ran out)",
            health.zero_timestamp_records,
        );
        self.warn(
            "CUPTI buffers handed out past GPUQ_MAX_BUFFER_MB (CUPTI before 12.9 cannot be refused one)",
            health.over_cap_buffers,
        );
        self.warn(
            "CUPTI records of kinds gpuq does not store",
            health.unknown_records,
        );
        self.warn(
            "CUPTI buffers with an invalid record (rest of the buffer skipped)",
            health.invalid_buffers,
        );
        self.metas.entry(pid).or_insert(meta.clone());

        // Devices, contexts and external ids first: rows of this segment need them.
        for r in &seg.records {
            match r.kind {
                RecordKind::Context => {
                    self.processes
                        .get_mut(&pid)
                        .expect("entry made above")
                        .contexts
                        .insert(r.context, r.device);
                }
                RecordKind::Device => {
                    let name = redacted(seg.text(r.name).unwrap_or("")).to_string();
                    let info = DeviceInfo {
                        rank: meta.rank,
                        id: r.device as i32,
                        name: name.clone(),
                    };
                    if !self.devices.contains(&info) {
                        self.devices.push(info);
                    }
                    self.device_details.insert(
                        r.device,
                        serde_json::json!({
                            "name": name,
                            "uuid": seg.text(r.detail),
                            "memory_bytes": r.bytes,
                            "multiprocessors": r.value,
                            "compute_capability": format!("{}.{}", r.grid[0], r.grid[1]),
                        }),
                    );
                }
                RecordKind::ExternalCorrelation => {
                    self.processes
                        .get_mut(&pid)
                        .expect("entry made above")
                        .external
                        .insert(r.correlation, (r.value, r.bytes));
                }
                _ => {}
            }
        }
        let p = self.processes.get_mut(&pid).expect("entry made above");
        // Host structure next: launches and ranges, so that GPU rows of this segment find them.
        let mut host_rows = Vec::new();
        // Marker starts, ends and instants, in time order per thread.
        let mut markers: Vec<&RawRecord> = seg
            .records
            .iter()
            .filter(|r| r.kind == RecordKind::Marker)
            .collect();
        markers.sort_by_key(|r| (r.start, r.code != 2));
        for r in markers {
            let text = seg.text(r.name);
            match r.code {
                2 => {
                    let name: Arc<str> = redacted(text.unwrap_or(""));
                    let step = self
                        .step_pattern
                        .captures(&name)
                        .and_then(|c| c.get(1))
                        .and_then(|m| m.as_str().parse::<i64>().ok());
                    let op = if step.is_none() {
                        operator_name(&name).map(Arc::from)
                    } else {
                        None
                    };
                    let start = ts_of(r.start);
                    let is_step = step.is_some();
                    let list = if is_step {
                        &mut p.steps
                    } else {
                        p.ranges.entry(r.tid).or_default()
                    };
                    let at = list.partition_point(|x| x.start <= start);
                    list.insert(
                        at,
                        Range {
                            id: r.value,
                            tid: r.tid,
                            start,
                            end: None,
                            name,
                            op,
                            step,
                        },
                    );
                    p.open_markers.insert(r.value, (r.tid, is_step, start));
                    p.newest_host_ts = p.newest_host_ts.max(ts_of(r.start));
                }
                4 => {
                    let Some((tid, is_step, start)) = p.open_markers.remove(&r.value) else {
                        *self
                            .warnings
                            .entry("NVTX range ends without their start".into())
                            .or_default() += 1;
                        continue;
                    };
                    let list = if is_step {
                        &mut p.steps
                    } else {
                        p.ranges.entry(tid).or_default()
                    };
                    let from = list.partition_point(|x| x.start < start);
                    if let Some(range) = list[from..]
                        .iter_mut()
                        .take_while(|x| x.start == start)
                        .find(|x| x.end.is_none() && x.id == r.value)
                    {
                        range.end = Some(ts_of(r.start).max(range.start));
                        host_rows.push(range.clone());
                    }
                    p.newest_host_ts = p.newest_host_ts.max(ts_of(r.start));
                }
                _ => {
                    let name: Arc<str> = redacted(text.unwrap_or(""));
                    let mut rec = *r;
                    rec.start = ts_of(r.start);
                    rec.end = rec.start;
                    let attribution = attribute(p, r.tid, rec.start);
                    self.ready.push(Row {
                        kind: Kind::Instant,
                        record: rec,
                        name,
                        args: domain_args(seg.text(r.detail)),
                        copy_kind: None,
                        attribution,
                    });
                }
            }
        }
        for range in host_rows {
            let mut rec = RawRecord {
                kind: RecordKind::Marker,
                start: range.start,
                end: range.end.unwrap_or(range.start),
                pid,
                tid: range.tid,
                ..RawRecord::default()
            };
            rec.code = 2;
            let mut attribution = attribute(p, range.tid, range.start);
            let kind = if let Some(op) = &range.op {
                attribution.op = Some(op.clone());
                Kind::CpuOp
            } else {
                Kind::Annotation
            };
            if range.step.is_some() {
                attribution.step = range.step;
                attribution.scope = Some(Arc::from("step"));
            }
            self.ready.push(Row {
                kind,
                record: rec,
                name: range.name.clone(),
                args: None,
                copy_kind: None,
                attribution,
            });
        }
        for r in &seg.records {
            if let RecordKind::Runtime | RecordKind::Driver = r.kind {
                p.launches.insert(
                    r.correlation,
                    Launch {
                        ts: ts_of(r.start),
                        tid: r.tid,
                    },
                );
                p.newest_host_ts = p.newest_host_ts.max(ts_of(r.end));
            }
        }
        // Then every row.
        for r in &seg.records {
            let mut rec = *r;
            rec.start = ts_of(r.start);
            rec.end = ts_of(r.end).max(rec.start);
            rec.pid = if rec.pid == 0 { pid } else { rec.pid };
            let row = match r.kind {
                RecordKind::Kernel => {
                    let name = p
                        .names
                        .entry(r.name)
                        .or_insert_with(|| {
                            let raw = seg.text(r.name).unwrap_or("");
                            redacted(&demangle(raw))
                        })
                        .clone();
                    let mangled = seg.text(r.name).filter(|m| **m != *name);
                    gpu_row(Kind::Kernel, rec, name, kernel_args(r, mangled), None)
                }
                RecordKind::Memcpy => {
                    let label = MEMCPY_OPER
                        .iter()
                        .find(|(k, _)| *k == r.copy_kind as i64)
                        .map_or("Unknown", |(_, l)| l);
                    let name: Arc<str> = format!("[CUDA memcpy {label}]").into();
                    let args = memcpy_args(r);
                    gpu_row(
                        Kind::Memcpy,
                        rec,
                        name,
                        Some(args),
                        Some(copy_code(r.copy_kind as i64)),
                    )
                }
                RecordKind::Memset => {
                    let mut args = String::new();
                    let _ = write!(
                        args,
                        "{{\"value\":{},\"memory_kind\":\"{}\",\"context\":{}}}",
                        r.value,
                        memory_kind(r.code as u8),
                        r.context
                    );
                    gpu_row(Kind::Memset, rec, "[CUDA memset]".into(), Some(args), None)
                }
                RecordKind::Sync => {
                    let name: Arc<str> = sync_name(Some(r.code as i64)).into();
                    rec.device = p.contexts.get(&r.context).copied().unwrap_or(u32::MAX);
                    let args = format!("{{\"context\":{},\"event\":{}}}", r.context, r.value);
                    gpu_row(Kind::Sync, rec, name, Some(args), None)
                }
                RecordKind::Runtime | RecordKind::Driver => {
                    let raw = seg.text(r.name).unwrap_or("");
                    let name: Arc<str> = if raw.is_empty() {
                        format!("cbid {}", r.code).into()
                    } else {
                        api_display_name(raw).into()
                    };
                    let mut args = format!("{{\"api\":{},\"cbid\":{}", json(raw), r.code);
                    if r.return_value != 0 {
                        let _ = write!(args, ",\"return\":{}", r.return_value);
                    }
                    if let Some((kind, id)) = p.external.remove(&r.correlation) {
                        let _ = write!(args, ",\"external\":{{\"kind\":{kind},\"id\":{id}}}");
                    }
                    args.push('}');
                    let attribution = attribute(p, r.tid, rec.start);
                    Some(Row {
                        kind: if r.kind == RecordKind::Runtime {
                            Kind::Runtime
                        } else {
                            Kind::Driver
                        },
                        record: rec,
                        name,
                        args: Some(args),
                        copy_kind: None,
                        attribution,
                    })
                }
                RecordKind::Overhead => {
                    let attribution = attribute(p, r.tid, rec.start);
                    Some(Row {
                        kind: Kind::Overhead,
                        record: rec,
                        name: overhead_name(r.code).into(),
                        args: Some(format!("{{\"overhead_kind\":{}}}", r.code)),
                        copy_kind: None,
                        attribution,
                    })
                }
                RecordKind::Marker
                | RecordKind::Device
                | RecordKind::Context
                | RecordKind::ExternalCorrelation => None,
            };
            if let Some(row) = row {
                if row.kind.is_gpu() {
                    let arrived = p.segments;
                    p.pending.push(Pending { row, arrived });
                } else {
                    self.ready.push(row);
                }
            }
        }
        // GPU rows whose launch is known now take its attribution; those waiting too long go
        // without.
        let mut waiting = Vec::new();
        let mut unattributed = 0;
        for mut pending in std::mem::take(&mut p.pending) {
            let corr = pending.row.record.correlation;
            match p.launches.get(&corr).copied() {
                Some(launch) => {
                    pending.row.attribution = attribute(p, launch.tid, launch.ts);
                    self.ready.push(pending.row);
                }
                None if corr == 0 || p.segments - pending.arrived >= HOLD_SEGMENTS => {
                    unattributed += u64::from(corr != 0);
                    self.ready.push(pending.row);
                }
                None => waiting.push(pending),
            }
        }
        p.pending = waiting;
        // Forget what no later record can need.
        let horizon = p.newest_host_ts.saturating_sub(LAUNCH_MEMORY_NS);
        p.launches.retain(|_, l| l.ts >= horizon);
        // Ranges that ended before the horizon go; open ones stay, however old (a range
        // around the whole loop). Only every so often: it is a pass over the ranges.
        if p.segments % 8 == 0 {
            for list in p.ranges.values_mut().chain(std::iter::once(&mut p.steps)) {
                list.retain(|r| r.end.is_none_or(|e| e >= horizon));
            }
            if p.external.len() > EXTERNAL_KEPT {
                p.external.clear();
            }
        }
        self.warn(
            "GPU records stored without the call that launched them (no step, operator or scope)",
            unattributed,
        );
        Ok(())
    }

    /// The process is done (it exited, or was killed): GPU records still waiting for their
    /// launch are stored without it, and NVTX ranges still open are counted.
    pub fn finish(&mut self) {
        let mut unattributed = 0;
        let mut open = 0;
        for p in self.processes.values_mut() {
            for pending in p.pending.drain(..) {
                unattributed += u64::from(pending.row.record.correlation != 0);
                self.ready.push(pending.row);
            }
            open += p.open_markers.len() as u64;
            p.open_markers.clear();
        }
        self.warn(
            "GPU records stored without the call that launched them (no step, operator or scope)",
            unattributed,
        );
        self.warn("NVTX ranges never ended (not stored)", open);
    }

    /// The rows attributed so far, as one events batch, and the health counters.
    pub fn take(&mut self) -> Taken {
        let rows = std::mem::take(&mut self.ready);
        let mut taken = Taken::default();
        if !rows.is_empty() {
            let mut cols = EventColumns::with_capacity(rows.len());
            let mut ranks = Vec::with_capacity(rows.len());
            let mut steps = Vec::with_capacity(rows.len());
            let mut ops: StringDictionaryBuilder<Int32Type> = StringDictionaryBuilder::new();
            for row in &rows {
                let r = &row.record;
                let gpu = row.kind.is_gpu();
                // API records carry CUPTI's process id; GPU rows the segment's. A pid that is
                // no collector's (a fake's scripted one) takes the only process's rank.
                let rank = match self.processes.get(&r.pid) {
                    Some(p) => p.rank,
                    None if self.processes.len() == 1 => {
                        self.processes.values().next().and_then(|p| p.rank)
                    }
                    None => None,
                };
                ranks.push(rank);
                steps.push(row.attribution.step);
                match &row.attribution.op {
                    Some(op) => ops.append_value(op),
                    None => ops.append_null(),
                }
                let device = (gpu && r.device != u32::MAX).then_some(r.device as i32);
                let stream = (gpu && r.kind != RecordKind::Marker && r.stream != u32::MAX)
                    .then_some(r.stream as i64);
                let is_api = matches!(row.kind, Kind::Runtime | Kind::Driver);
                let e = Event {
                    device,
                    stream,
                    pid: Some(r.pid as i64),
                    tid: (!gpu && r.tid != 0).then_some(r.tid as i64),
                    name: &row.name,
                    ts: r.start,
                    dur: r.end - r.start,
                    correlation: (r.correlation != 0 && (gpu || is_api))
                        .then_some(r.correlation as i64),
                    bytes: matches!(row.kind, Kind::Memcpy | Kind::Memset)
                        .then_some(r.bytes as i64),
                    copy_kind: row.copy_kind,
                    grid: if row.kind == Kind::Kernel {
                        r.grid.map(Some)
                    } else {
                        [None; 3]
                    },
                    block: if row.kind == Kind::Kernel {
                        r.block.map(Some)
                    } else {
                        [None; 3]
                    },
                    registers: (row.kind == Kind::Kernel).then_some(r.registers as i32),
                    shared_mem: (row.kind == Kind::Kernel)
                        .then_some(r.static_smem as i64 + r.dynamic_smem as i64),
                    args: row.args.as_deref(),
                    scope: row.attribution.scope.as_deref(),
                };
                cols.push(row.kind, &e);
                taken.kernels += u64::from(row.kind == Kind::Kernel);
                taken.first_ts = Some(taken.first_ts.map_or(r.start, |t| t.min(r.start)));
                taken.last_ts = Some(taken.last_ts.map_or(r.end, |t| t.max(r.end)));
            }
            let batch = cols.finish();
            let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
            columns[0] = Arc::new(Int32Array::from(ranks));
            columns[1] = Arc::new(Int64Array::from(steps));
            columns[11] = Arc::new(ops.finish());
            taken.rows = rows.len() as u64;
            taken.events = Some(
                RecordBatch::try_new(batch.schema(), columns).expect("events columns in order"),
            );
        }
        if !self.counters.is_empty() {
            let mut c = CounterColumns::default();
            let mut ranks = Vec::with_capacity(self.counters.len());
            for (rank, pid, name, ts, value) in self.counters.drain(..) {
                ranks.push(rank);
                c.push(None, Some(pid as i64), name, ts, value);
            }
            let batch = c.finish();
            let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
            columns[0] = Arc::new(Int32Array::from(ranks));
            taken.counters = Some(
                RecordBatch::try_new(batch.schema(), columns).expect("counters columns in order"),
            );
        }
        taken
    }
}

/// A GPU row: attributed once its launch is known.
fn gpu_row(
    kind: Kind,
    record: RawRecord,
    name: Arc<str>,
    args: Option<String>,
    copy_kind: Option<&'static str>,
) -> Option<Row> {
    Some(Row {
        kind,
        record,
        name,
        args,
        copy_kind,
        attribution: Attribution::default(),
    })
}

/// The step, operator and scope of work launched at `ts` on thread `tid`: the step whose range
/// holds `ts` (on any thread of the process: backward kernels launch from autograd's threads),
/// the innermost operator range and the innermost other range on the thread.
fn attribute(p: &Process, tid: u32, ts: i64) -> Attribution {
    let holds = |r: &Range| r.start <= ts && r.end.is_none_or(|e| ts < e);
    let mut a = Attribution::default();
    let before = p.steps.partition_point(|r| r.start <= ts);
    a.step = p.steps[..before]
        .iter()
        .rev()
        .find(|r| holds(r))
        .and_then(|r| r.step);
    if let Some(list) = p.ranges.get(&tid) {
        let before = list.partition_point(|r| r.start <= ts);
        // Ranges nest, so the innermost ones start last; a range that started long before
        // and still holds is found within a bounded look back.
        for r in list[..before]
            .iter()
            .rev()
            .take(RANGE_LOOK_BACK)
            .filter(|r| holds(r))
        {
            if r.op.is_some() {
                if a.op.is_none() {
                    a.op = r.op.clone();
                }
            } else if a.scope.is_none() {
                a.scope = Some(r.name.clone());
            }
            if a.op.is_some() && a.scope.is_some() {
                break;
            }
        }
    }
    a
}

/// Ranges of a thread looked at, newest first, for the one around a launch.
const RANGE_LOOK_BACK: usize = 4096;

fn kernel_args(r: &RawRecord, mangled: Option<&str>) -> Option<String> {
    let mut s = format!(
        "{{\"context\":{},\"static_smem\":{},\"dynamic_smem\":{}",
        r.context, r.static_smem, r.dynamic_smem
    );
    if r.graph_id != 0 {
        let _ = write!(s, ",\"graph_id\":{}", r.graph_id);
    }
    if r.graph_node != 0 {
        let _ = write!(s, ",\"graph_node\":{}", r.graph_node);
    }
    if r.launch_type != 0 {
        let _ = write!(s, ",\"launch_type\":{}", r.launch_type);
    }
    if let Some(m) = mangled {
        let _ = write!(s, ",\"mangled\":{}", json(m));
    }
    s.push('}');
    Some(s)
}

fn memcpy_args(r: &RawRecord) -> String {
    let mut s = format!(
        "{{\"src_kind\":\"{}\",\"dst_kind\":\"{}\",\"context\":{}",
        memory_kind(r.src_kind),
        memory_kind(r.dst_kind),
        r.context
    );
    if r.graph_node != 0 {
        let _ = write!(s, ",\"graph_node\":{}", r.graph_node);
    }
    s.push('}');
    s
}

/// CUPTI's memory kind label (nsys numbers them one less; CUPTI's 0 is unknown).
fn memory_kind(code: u8) -> &'static str {
    let nsys = if code == 0 { 7 } else { code as i64 - 1 };
    MEM_KIND
        .iter()
        .find(|(k, _)| *k == nsys)
        .map_or("Unknown", |(_, l)| l)
}

fn domain_args(domain: Option<&str>) -> Option<String> {
    domain.map(|d| format!("{{\"domain\":{}}}", json(d)))
}

/// CUPTI's overhead kinds (`CUpti_ActivityOverheadKind`).
fn overhead_name(kind: u32) -> &'static str {
    match kind {
        1 => "Driver compiler",
        0x10000 => "CUPTI buffer flush",
        0x20000 => "CUPTI instrumentation",
        0x30000 => "CUPTI resource",
        0x40000 => "Runtime triggered module loading",
        0x50000 => "Lazy function loading",
        0x60000 => "Command buffer full",
        0x70000 => "Activity buffer request",
        0x80000 => "UVM activity init",
        _ => "Overhead",
    }
}

/// A text with the secrets it may carry (tokens in NVTX texts, kernel names) redacted.
fn redacted(text: &str) -> Arc<str> {
    Arc::from(redact::redact_text(text).0.as_ref())
}

/// An Itanium C++ name demangled; any other name as it is. (The query layer's `demangle`
/// SQL function is the same rule; the query crate does not depend on the adapters.)
fn demangle(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.starts_with("_Z") {
        return name.into();
    }
    cpp_demangle::Symbol::new(name.as_bytes())
        .ok()
        .and_then(|s| s.demangle(&cpp_demangle::DemangleOptions::default()).ok())
        .map_or(name.into(), Into::into)
}

fn json(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests;
