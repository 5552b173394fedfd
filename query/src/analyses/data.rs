//! Loading one run's rows for the analyses: GPU operations per device timeline, host calls,
//! annotations, in compact typed form.

use super::literal;
use crate::functions::kernel_class::kernel_class;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use std::collections::HashMap;

/// Runs `sql` and collects its batches.
pub async fn collect(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

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
        let sql = format!(
            "SELECT rank, pid, device, stream, kind, name, ts, ts + dur, correlation, op, step \
             FROM gpu_ops WHERE run = {} AND ts > 0 AND dur >= 0",
            literal(run)
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
        if with_overhead && !by_key.is_empty() {
            let list = NSYS_GPU_OVERHEAD
                .iter()
                .map(|n| literal(n))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT rank, pid, ts, ts + dur FROM events WHERE run = {} AND kind = 'overhead' \
                 AND name IN ({list})",
                literal(run)
            );
            let overhead_name = names.id("[profiler overhead]");
            let spans: HashMap<DeviceKey, (i64, i64)> = by_key
                .iter()
                .map(|(k, ops)| {
                    let lo = ops.iter().map(|o| o.start).min().unwrap_or(0);
                    let hi = ops.iter().map(|o| o.end).max().unwrap_or(0);
                    (k.clone(), (lo, hi))
                })
                .collect();
            for b in collect(ctx, &sql).await? {
                let (rank, pid, ts, end) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
                for i in 0..b.num_rows() {
                    let (Some(s), Some(e)) = (ts[i], end[i]) else {
                        continue;
                    };
                    for (key, ops) in by_key.iter_mut() {
                        let (lo, hi) = spans[key];
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
        }
        let mut devices: Vec<(DeviceKey, Vec<Op>)> = by_key.into_iter().collect();
        devices.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, ops) in devices.iter_mut() {
            ops.sort_by_key(|o| (o.start, o.end));
        }
        Ok(Timelines { devices, names })
    }
}

/// Host calls of a run, and the launch of each GPU operation by correlation id.
#[derive(Debug, Default)]
pub struct Host {
    pub calls: Vec<HostCall>,
    /// (rank, correlation) -> indexes into `calls`.
    by_correlation: HashMap<(Option<i32>, i64), Vec<u32>>,
}

impl Host {
    /// Loads the runtime/driver calls of `run`; names are interned into `names`.
    pub async fn load(ctx: &SessionContext, run: &str, names: &mut Names) -> Result<Self> {
        let sql = format!(
            "SELECT rank, pid, tid, name, ts, ts + dur, correlation FROM runtime \
             WHERE run = {} AND dur >= 0",
            literal(run)
        );
        let mut host = Host::default();
        for b in collect(ctx, &sql).await? {
            let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
            let name = strings(&b, 3)?;
            let (ts, end, corr) = (ints(&b, 4)?, ints(&b, 5)?, ints(&b, 6)?);
            for i in 0..b.num_rows() {
                let (Some(start), Some(end)) = (ts[i], end[i]) else {
                    continue;
                };
                let call = HostCall {
                    rank: rank[i].map(|r| r as i32),
                    pid: pid[i],
                    tid: tid[i],
                    name: names.id(name[i].as_deref().unwrap_or("")),
                    start,
                    end,
                };
                host.push(call, corr[i]);
            }
        }
        Ok(host)
    }

    /// Adds a call with its correlation id.
    pub fn push(&mut self, call: HostCall, correlation: Option<i64>) {
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
    /// unique call of another pid is taken as is (Kineto gives GPU rows the device as pid).
    pub fn launch(&self, key: &DeviceKey, correlation: Option<i64>) -> Option<&HostCall> {
        let found = self.by_correlation.get(&(key.rank, correlation?))?;
        let calls = found.iter().map(|&i| &self.calls[i as usize]);
        if found.len() == 1 {
            return calls.into_iter().next();
        }
        calls.into_iter().find(|c| c.pid == key.pid)
    }
}

/// The annotation ranges of a run (kinds `annotation`, `gpu_annotation` excluded: those are
/// GPU-side projections).
pub async fn ranges(ctx: &SessionContext, run: &str, names: &mut Names) -> Result<Vec<Range>> {
    let sql = format!(
        "SELECT rank, pid, name, scope, ts, ts + dur FROM events \
         WHERE run = {} AND kind = 'annotation' AND dur > 0",
        literal(run)
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

/// First start and last end of any event, per rank.
pub async fn walls(ctx: &SessionContext, run: &str) -> Result<HashMap<Option<i32>, (i64, i64)>> {
    let mut walls = HashMap::new();
    let sql = format!(
        "SELECT rank, min(ts), max(ts + dur) FROM events WHERE run = {} GROUP BY rank",
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
