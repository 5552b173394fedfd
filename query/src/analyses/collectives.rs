//! `collectives(run [, steps])`: one row per collective kernel, with what it moved, how fast
//! (nccl-tests' algorithm and bus bandwidth), how long it sat waiting for the other ranks, and
//! which rank arrived last.
//!
//! Rows are the kernels of class `communication` ([`kernel_class`](crate::functions)): NCCL and
//! RCCL kernels, and the other communication kernels the class rules name (symmetric-memory
//! and custom all-reduces, DeepEP, NVSHMEM, ...). Those others get a row with their time, wait
//! and last rank, and NULL in every column below that comes from NCCL.
//!
//! **What was sent.** PyTorch's `record_param_comms` records per collective its `Collective
//! name` (`allreduce`, `_allgather_base`, `broadcast`, ...), `Process Group Name`, `dtype`,
//! `Group size`, `In msg nelems` and `Out msg nelems`; recent Kineto copies them onto the
//! kernel's args. Where the kernel's args lack them (older PyTorch writes them on the
//! `record_param_comms` operator only) they are taken from the innermost `record_param_comms`
//! of the same rank, process and thread enclosing the kernel's launch call (`sizes_from` =
//! `enclosing_op`), or, when the launch call is not in the trace, from the one of the same
//! rank with the kernel's `External id` (HTA's rule; `external_id`). The enclosing operator
//! comes first because it is exact on every Kineto version, whereas the `External id` of a
//! kernel in older Kineto traces (the DLRM job in `../shared`) is its correlation id, which can
//! equal an unrelated operator's id; both give the kernel's own args on the traces where the
//! kernel carries them. Only NCCL/RCCL/MSCCL kernels (names containing `nccl`, `rccl`,
//! `msccl`) take sizes.
//!
//! **Bandwidth** as nccl-tests defines it (its `doc/PERFORMANCE.md`): `bytes` = S = the larger
//! of `in_nelems` and `out_nelems` × the dtype's size (the whole buffer: for all-gather the
//! output, for reduce-scatter the input, for all-to-all the send buffer), `algbw_gbps` = S /
//! `dur` (GB/s, 10⁹ bytes), `busbw_gbps` = algbw × factor with n = `group_size`: all-reduce
//! 2(n−1)/n; reduce-scatter, all-gather, all-to-all, gather, scatter (n−1)/n; broadcast,
//! reduce, send/recv 1. (nccl-tests' output uses 2(n−1)/n for in-network reductions too, as
//! here.) `algorithm` and `protocol` are read off the NCCL kernel name
//! (`ncclKernel_AllReduce_RING_LL_Sum_float`, `ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE`):
//! RING, TREE, NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN, PAT and LL, LL128, SIMPLE; NULL
//! where the name does not say (`ncclDevKernel_Generic`, `ncclDevKernel_SendRecv`).
//!
//! **Wait and transfer.** A collective's kernel cannot finish before every rank of its group
//! has started its own: the time a rank's kernel runs before the last rank starts is spent
//! waiting. The k-th kernel of a (process group, kernel name) on each rank is taken to be the
//! same call (`instance` = k, from 0; collectives run in the same order on every rank of a
//! group), among the ranks that have a k-th (`ranks`). Per call, `last_rank` is the rank whose
//! kernel started last (NULL when all started together or only one rank has the call; ties go
//! to the higher rank, as `collective_skew`'s straggler), `wait` = last start − this kernel's
//! start, clipped to [0, `dur`] (clock offsets between hosts can put the last start after a
//! kernel's end), `transfer` = `dur` − `wait`, `busbw_transfer_gbps` = the bus bandwidth over
//! `transfer`. `wait`, `transfer`, `busbw_transfer_gbps` are NULL when only one rank has the
//! call (a one-rank trace of a multi-rank job). Calls are matched over the whole run; a step
//! range then keeps the kernels launched in its steps.
//!
//! ```sql
//! SELECT coalesce(collective, name) AS collective, algorithm, protocol, group_size,
//!        count(*) AS kernels, fmt_dur(sum(dur)) AS total, sum(bytes) AS bytes,
//!        median(busbw_gbps) AS busbw_med,
//!        100.0 * sum(wait) / sum(dur) FILTER (WHERE wait IS NOT NULL) AS wait_pct
//! FROM collectives('llama-8gpu') GROUP BY 1, 2, 3, 4 ORDER BY sum(dur) DESC;
//! ```

use super::data::{collect, ints, strings, DeviceKey, Host, Names, Scope};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// The query that sums `rows` (a `collectives(...)` query) per kind of collective: the
/// collective (or the kernel name where it is not known), `algorithm`, `protocol` and
/// `group_size`, with `kernels`, `total` (ns), `bytes`, the median `busbw_gbps` over the
/// kernel and `transfer_busbw_gbps` over the transfer, `wait_pct` (waiting's share of the
/// time of the kernels matched across ranks), and the rank that came last in most calls
/// (`last_rank`) with how many (`last_calls`); by total time. What `gpuq collectives` and the
/// report print.
pub fn kinds_sql(rows: &str) -> String {
    let same = |a: &str| format!("(k.{a} IS NOT DISTINCT FROM m.{a})");
    // A call's last rank is on the row whose rank is that last rank: one row per call.
    format!(
        "WITH k AS (SELECT coalesce(collective, name) AS collective, algorithm, protocol, \
         group_size, * EXCLUDE (collective, algorithm, protocol, group_size) FROM ({rows})), \
         l AS (SELECT collective, algorithm, protocol, group_size, last_rank, count(*) AS n \
         FROM k WHERE rank = last_rank GROUP BY 1, 2, 3, 4, 5), \
         m AS (SELECT collective, algorithm, protocol, group_size, \
         first_value(last_rank ORDER BY n DESC, last_rank) AS last_rank, max(n) AS n \
         FROM l GROUP BY 1, 2, 3, 4) \
         SELECT k.collective, k.algorithm, k.protocol, k.group_size, count(*) AS kernels, \
         sum(k.dur) AS total, sum(k.bytes) AS bytes, median(k.busbw_gbps) AS busbw_gbps, \
         median(k.busbw_transfer_gbps) AS transfer_busbw_gbps, \
         100.0 * sum(k.wait) / sum(k.dur) FILTER (WHERE k.wait IS NOT NULL) AS wait_pct, \
         min(m.last_rank) AS last_rank, min(m.n) AS last_calls \
         FROM k LEFT JOIN m ON k.collective = m.collective AND {} AND {} AND {} \
         GROUP BY k.collective, k.algorithm, k.protocol, k.group_size \
         ORDER BY total DESC, k.collective, k.algorithm, k.protocol, k.group_size",
        same("algorithm"),
        same("protocol"),
        same("group_size"),
    )
}

pub static COLLECTIVES: Spec = Spec::of_run("collectives", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    use DataType::{Float64, Int32, Int64, Utf8};
    Arc::new(Schema::new(vec![
        f("run", Utf8, false),
        f("rank", Int32, true),
        f("device", Int32, true),
        f("stream", Int64, true),
        f("step", Int64, true),
        f("ts", Int64, false),
        f("dur", Int64, false),
        f("name", Utf8, false),
        f("collective", Utf8, true),
        f("process_group", Utf8, true),
        f("algorithm", Utf8, true),
        f("protocol", Utf8, true),
        f("dtype", Utf8, true),
        f("group_size", Int64, true),
        f("in_nelems", Int64, true),
        f("out_nelems", Int64, true),
        f("bytes", Int64, true),
        f("algbw_gbps", Float64, true),
        f("busbw_gbps", Float64, true),
        f("sizes_from", Utf8, true),
        f("instance", Int64, false),
        f("ranks", Int64, false),
        f("wait", Int64, true),
        f("transfer", Int64, true),
        f("busbw_transfer_gbps", Float64, true),
        f("last_rank", Int32, true),
    ]))
}

/// A collective operation, as nccl-tests' bandwidth formulas tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    Gather,
    Scatter,
    Broadcast,
    Reduce,
    SendRecv,
}

impl Collective {
    /// The operation of a PyTorch `Collective name` (`allreduce`, `_allgather_base`,
    /// `reduce_scatter_tensor_coalesced`, `all_to_allv`, `send`, ...); `None` for what moves
    /// no data by these formulas (`barrier`, `wait`, `coalesced`) and unknown names.
    pub fn of_name(name: &str) -> Option<Collective> {
        let n: String = name
            .chars()
            .filter(|c| *c != '_')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        use Collective::*;
        Some(if n.contains("allreduce") {
            AllReduce
        } else if n.contains("reducescatter") {
            ReduceScatter
        } else if n.contains("allgather") {
            AllGather
        } else if n.contains("alltoall") {
            AllToAll
        } else if n.contains("broadcast") {
            Broadcast
        } else if n.starts_with("reduce") {
            Reduce
        } else if n.starts_with("gather") {
            Gather
        } else if n.starts_with("scatter") {
            Scatter
        } else if n.starts_with("send") || n.starts_with("recv") {
            SendRecv
        } else {
            return None;
        })
    }

    /// nccl-tests' bus bandwidth factor for a group of `n` ranks (`None` when n < 1).
    pub fn busbw_factor(self, n: i64) -> Option<f64> {
        if n < 1 {
            return None;
        }
        let n = n as f64;
        use Collective::*;
        Some(match self {
            AllReduce => 2.0 * (n - 1.0) / n,
            ReduceScatter | AllGather | AllToAll | Gather | Scatter => (n - 1.0) / n,
            Broadcast | Reduce | SendRecv => 1.0,
        })
    }
}

/// Bytes per element of a PyTorch dtype as Kineto writes it (`Float`, `BFloat16`, `Long`,
/// `Float8_e4m3fn`, ...); `None` for sub-byte and unknown types.
pub fn dtype_size(dtype: &str) -> Option<i64> {
    Some(match dtype {
        "Bool" | "Byte" | "Char" | "QInt8" | "QUInt8" | "QUInt4x2" | "QUInt2x4" | "Bits8"
        | "Bits1x8" | "Bits2x4" | "Bits4x2" | "Float8_e5m2" | "Float8_e4m3fn"
        | "Float8_e5m2fnuz" | "Float8_e4m3fnuz" | "Float8_e8m0fnu" | "Float4_e2m1fn_x2" => 1,
        "Short" | "Half" | "BFloat16" | "UInt16" | "Bits16" => 2,
        "Int" | "Float" | "QInt32" | "UInt32" | "ComplexHalf" => 4,
        "Long" | "Double" | "UInt64" | "ComplexFloat" => 8,
        "ComplexDouble" => 16,
        _ => return None,
    })
}

/// Whether a kernel is NCCL's (or RCCL's, MSCCL's): the kernels whose sizes Kineto records.
pub fn is_nccl_kernel(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("nccl") || n.contains("rccl") || n.contains("msccl")
}

/// The algorithm and protocol an NCCL kernel name carries: `ncclKernel_AllReduce_RING_LL_Sum_float`
/// -> (RING, LL), `ncclDevKernel_AllReduce_Sum_bf16_NVLS_TREE_SIMPLE` -> (NVLS_TREE, SIMPLE);
/// (None, None) when it names none (`ncclDevKernel_Generic`, `ncclDevKernel_SendRecv`) or is
/// not NCCL's.
pub fn nccl_algorithm(kernel: &str) -> (Option<&'static str>, Option<&'static str>) {
    if !is_nccl_kernel(kernel) {
        return (None, None);
    }
    let base = kernel.split(['(', '<', ' ']).next().unwrap_or("");
    let tokens: Vec<&str> = base.split('_').collect();
    for i in 1..tokens.len() {
        let next = tokens.get(i + 1).copied();
        let (algorithm, width) = match (tokens[i], next) {
            ("NVLS", Some("TREE")) => ("NVLS_TREE", 2),
            ("COLLNET", Some("DIRECT")) => ("COLLNET_DIRECT", 2),
            ("COLLNET", Some("CHAIN")) => ("COLLNET_CHAIN", 2),
            ("RING", _) => ("RING", 1),
            ("TREE", _) => ("TREE", 1),
            ("NVLS", _) => ("NVLS", 1),
            ("COLLNET", _) => ("COLLNET", 1),
            ("PAT", _) => ("PAT", 1),
            _ => continue,
        };
        let protocol = match tokens.get(i + width).copied() {
            Some("LL") => Some("LL"),
            Some("LL128") => Some("LL128"),
            Some("SIMPLE") => Some("SIMPLE"),
            _ => None,
        };
        return (Some(algorithm), protocol);
    }
    (None, None)
}

/// What Kineto records about a collective call (a kernel's or `record_param_comms`' args).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommArgs {
    pub collective: Option<String>,
    pub process_group: Option<String>,
    pub dtype: Option<String>,
    pub group_size: Option<i64>,
    pub in_nelems: Option<i64>,
    pub out_nelems: Option<i64>,
}

fn int_of(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

impl CommArgs {
    /// The collective fields of an args object; `None` when it has neither a `Collective name`
    /// nor a message size.
    pub fn parse(args: &Value) -> Option<CommArgs> {
        let a = CommArgs {
            collective: text_of(args.get("Collective name")),
            process_group: text_of(args.get("Process Group Name"))
                .or_else(|| text_of(args.get("Process Group ID"))),
            dtype: text_of(args.get("dtype")),
            group_size: int_of(args.get("Group size")),
            in_nelems: int_of(args.get("In msg nelems")),
            out_nelems: int_of(args.get("Out msg nelems")),
        };
        (a.collective.is_some() || a.in_nelems.is_some() || a.out_nelems.is_some()).then_some(a)
    }
}

/// One row of `collectives`: a collective kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveCall {
    pub rank: Option<i32>,
    pub device: Option<i32>,
    pub stream: Option<i64>,
    pub step: Option<i64>,
    pub ts: i64,
    pub dur: i64,
    pub name: String,
    pub collective: Option<String>,
    pub process_group: Option<String>,
    pub algorithm: Option<&'static str>,
    pub protocol: Option<&'static str>,
    pub dtype: Option<String>,
    pub group_size: Option<i64>,
    pub in_nelems: Option<i64>,
    pub out_nelems: Option<i64>,
    /// S: the larger buffer's size in bytes.
    pub bytes: Option<i64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    /// `kernel`, `enclosing_op` or `external_id`: where the sizes came from.
    pub sizes_from: Option<&'static str>,
    /// k: this is the k-th kernel (from 0) of its (process group, name) on its rank.
    pub instance: i64,
    /// The ranks that have a k-th kernel of this (process group, name).
    pub ranks: i64,
    pub wait: Option<i64>,
    pub transfer: Option<i64>,
    pub busbw_transfer_gbps: Option<f64>,
    pub last_rank: Option<i32>,
}

impl CollectiveCall {
    /// A kernel's row from its fields and what was recorded about it (and where), with the
    /// size and bandwidth columns computed; the cross-rank columns are left for
    /// [`match_across_ranks`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: Option<i32>,
        device: Option<i32>,
        stream: Option<i64>,
        step: Option<i64>,
        ts: i64,
        dur: i64,
        name: String,
        comm: Option<(CommArgs, &'static str)>,
    ) -> CollectiveCall {
        let (algorithm, protocol) = nccl_algorithm(&name);
        let (args, sizes_from) = match comm {
            Some((a, from)) => (a, Some(from)),
            None => (CommArgs::default(), None),
        };
        let bytes = match (
            args.collective.as_deref().and_then(Collective::of_name),
            args.dtype.as_deref().and_then(dtype_size),
            args.in_nelems.max(args.out_nelems),
        ) {
            (Some(_), Some(size), Some(n)) if n >= 0 => Some(n * size),
            _ => None,
        };
        let mut call = CollectiveCall {
            rank,
            device,
            stream,
            step,
            ts,
            dur,
            name,
            collective: args.collective,
            process_group: args.process_group,
            algorithm,
            protocol,
            dtype: args.dtype,
            group_size: args.group_size,
            in_nelems: args.in_nelems,
            out_nelems: args.out_nelems,
            bytes,
            algbw_gbps: None,
            busbw_gbps: None,
            sizes_from,
            instance: 0,
            ranks: 1,
            wait: None,
            transfer: None,
            busbw_transfer_gbps: None,
            last_rank: None,
        };
        call.algbw_gbps = call.bytes.and_then(|b| per_ns(b as f64, dur));
        call.busbw_gbps = call.bus_bytes().and_then(|b| per_ns(b, dur));
        call
    }

    /// S × the bus bandwidth factor: the bytes the busiest link carries, by nccl-tests' model.
    fn bus_bytes(&self) -> Option<f64> {
        let factor =
            Collective::of_name(self.collective.as_deref()?)?.busbw_factor(self.group_size?)?;
        Some(self.bytes? as f64 * factor)
    }
}

/// Bytes per nanosecond (= GB/s); `None` over no time.
fn per_ns(bytes: f64, ns: i64) -> Option<f64> {
    (ns > 0).then(|| bytes / ns as f64)
}

/// Sets the cross-rank columns: the k-th kernel of a (process group, kernel name) on each rank
/// is one call (kernels of a rank in start order); see the module doc.
pub fn match_across_ranks(calls: &mut [CollectiveCall]) {
    // (process group, name) -> rank -> indexes in start order.
    let mut groups: BTreeMap<(Option<String>, String), BTreeMap<Option<i32>, Vec<usize>>> =
        BTreeMap::new();
    let mut order: Vec<usize> = (0..calls.len()).collect();
    order.sort_by_key(|&i| (calls[i].ts, calls[i].stream, calls[i].dur, i));
    for i in order {
        let c = &calls[i];
        groups
            .entry((c.process_group.clone(), c.name.clone()))
            .or_default()
            .entry(c.rank)
            .or_default()
            .push(i);
    }
    for per_rank in groups.values() {
        for list in per_rank.values() {
            for (k, &i) in list.iter().enumerate() {
                calls[i].instance = k as i64;
            }
        }
        // Kernels without a rank are not matched with anything.
        let ranked: Vec<(i32, &Vec<usize>)> = per_rank
            .iter()
            .filter_map(|(r, l)| r.map(|r| (r, l)))
            .collect();
        let longest = ranked.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
        for k in 0..longest {
            let members: Vec<(i32, usize)> = ranked
                .iter()
                .filter_map(|(r, l)| l.get(k).map(|&i| (*r, i)))
                .collect();
            if members.len() < 2 {
                continue;
            }
            let (last_start, last_rank) = members
                .iter()
                .map(|&(r, i)| (calls[i].ts, r))
                .max()
                .expect("two ranks");
            let first_start = members.iter().map(|&(_, i)| calls[i].ts).min().unwrap_or(0);
            for &(_, i) in &members {
                let c = &mut calls[i];
                c.ranks = members.len() as i64;
                let wait = (last_start - c.ts).clamp(0, c.dur.max(0));
                c.wait = Some(wait);
                c.transfer = Some(c.dur - wait);
                c.busbw_transfer_gbps = c.bus_bytes().and_then(|b| per_ns(b, c.dur - wait));
                c.last_rank = (last_start > first_start).then_some(last_rank);
            }
        }
    }
}

/// A kernel as read, before its row is made.
struct Kernel {
    key: DeviceKey,
    stream: Option<i64>,
    step: Option<i64>,
    ts: i64,
    dur: i64,
    name: String,
    correlation: Option<i64>,
    external_id: Option<i64>,
    comm: Option<(CommArgs, &'static str)>,
}

/// A `record_param_comms` operator with collective args.
struct ParamComms {
    start: i64,
    end: i64,
    args: CommArgs,
}

/// The rows of `collectives(run)` within `scope`, by rank and start.
pub async fn load(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<CollectiveCall>> {
    let sql = format!(
        "SELECT rank, pid, device, stream, step, ts, dur, name, correlation, args FROM kernels \
         WHERE run = {} AND dur >= 0 AND kernel_class(name) = 'communication'",
        literal(run)
    );
    let mut kernels = Vec::new();
    for b in collect(ctx, &sql).await? {
        let (rank, pid, device, stream) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?, ints(&b, 3)?);
        let (step, ts, dur, name) = (ints(&b, 4)?, ints(&b, 5)?, ints(&b, 6)?, strings(&b, 7)?);
        let (corr, args) = (ints(&b, 8)?, strings(&b, 9)?);
        for i in 0..b.num_rows() {
            let (Some(ts), Some(dur)) = (ts[i], dur[i]) else {
                continue;
            };
            let name = name[i].clone().unwrap_or_default();
            let args: Value = args[i]
                .as_deref()
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or(Value::Null);
            let nccl = is_nccl_kernel(&name);
            kernels.push(Kernel {
                key: DeviceKey {
                    rank: rank[i].map(|r| r as i32),
                    pid: pid[i],
                    device: device[i].map(|d| d as i32),
                },
                stream: stream[i],
                step: step[i],
                ts,
                dur,
                correlation: corr[i],
                external_id: int_of(args.get("External id")),
                comm: nccl
                    .then(|| CommArgs::parse(&args).map(|a| (a, "kernel")))
                    .flatten(),
                name,
            });
        }
    }
    let missing = kernels
        .iter()
        .any(|k| k.comm.is_none() && is_nccl_kernel(&k.name));
    if missing {
        from_param_comms(ctx, run, &mut kernels).await?;
    }
    let mut calls: Vec<CollectiveCall> = kernels
        .into_iter()
        .map(|k| {
            CollectiveCall::new(
                k.key.rank,
                k.key.device,
                k.stream,
                k.step,
                k.ts,
                k.dur,
                k.name,
                k.comm,
            )
        })
        .collect();
    match_across_ranks(&mut calls);
    calls.retain(|c| scope.keeps(c.step));
    calls.sort_by(|a, b| (a.rank, a.ts, a.stream, &a.name).cmp(&(b.rank, b.ts, b.stream, &b.name)));
    Ok(calls)
}

/// Fills the sizes of the NCCL kernels whose args lack them from `record_param_comms`: the
/// innermost one around the kernel's launch call, else (launch not in the trace) the one with
/// the kernel's `External id`.
async fn from_param_comms(ctx: &SessionContext, run: &str, kernels: &mut [Kernel]) -> Result<()> {
    let sql = format!(
        "SELECT rank, pid, tid, ts, ts + dur, args FROM cpu_ops WHERE run = {} \
         AND name = 'record_param_comms' AND dur >= 0 AND args LIKE '%Collective name%'",
        literal(run)
    );
    // (rank, pid, tid) -> operators by start; (rank, External id) -> operator.
    let mut by_thread: HashMap<(Option<i32>, Option<i64>, Option<i64>), Vec<ParamComms>> =
        HashMap::new();
    let mut by_external: HashMap<
        (Option<i32>, i64),
        (Option<i32>, Option<i64>, Option<i64>, usize),
    > = HashMap::new();
    for b in collect(ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (ts, end, args) = (ints(&b, 3)?, ints(&b, 4)?, strings(&b, 5)?);
        for i in 0..b.num_rows() {
            let (Some(start), Some(end)) = (ts[i], end[i]) else {
                continue;
            };
            let Some(v) = args[i]
                .as_deref()
                .and_then(|a| serde_json::from_str::<Value>(a).ok())
            else {
                continue;
            };
            let Some(parsed) = CommArgs::parse(&v) else {
                continue;
            };
            let thread = (rank[i].map(|r| r as i32), pid[i], tid[i]);
            let list = by_thread.entry(thread).or_default();
            if let Some(ext) = int_of(v.get("External id")) {
                by_external.insert((thread.0, ext), (thread.0, thread.1, thread.2, list.len()));
            }
            list.push(ParamComms {
                start,
                end,
                args: parsed,
            });
        }
    }
    if by_thread.is_empty() {
        return Ok(());
    }
    // The launch calls of the kernels that need them.
    let wanted: HashSet<(Option<i32>, i64)> = kernels
        .iter()
        .filter(|k| k.comm.is_none() && is_nccl_kernel(&k.name))
        .filter_map(|k| k.correlation.map(|c| (k.key.rank, c)))
        .collect();
    let mut names = Names::default();
    let mut host = Host::default();
    host.add_launches(ctx, run, &mut names, &wanted, (0, 0))
        .await?;
    // The innermost operator around the launch call is the latest-starting one.
    for k in kernels.iter_mut() {
        if k.comm.is_some() || !is_nccl_kernel(&k.name) {
            continue;
        }
        if let Some(call) = host.launch(&k.key, k.correlation) {
            let ops = by_thread.get(&(call.rank, call.pid, call.tid));
            let around = ops.and_then(|ops| {
                ops.iter()
                    .filter(|o| o.start <= call.start && o.end >= call.end)
                    .max_by_key(|o| (o.start, std::cmp::Reverse(o.end)))
            });
            k.comm = around.map(|o| (o.args.clone(), "enclosing_op"));
            continue;
        }
        let found = k
            .external_id
            .and_then(|ext| by_external.get(&(k.key.rank, ext)))
            .and_then(|&(r, p, t, idx)| by_thread.get(&(r, p, t)).map(|ops| &ops[idx]))
            .filter(|o| o.start <= k.ts);
        k.comm = found.map(|o| (o.args.clone(), "external_id"));
    }
    Ok(())
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load(&ctx, &call.run, &scope).await?;
    let text = |f: fn(&CollectiveCall) -> Option<&str>| -> ArrayRef {
        Arc::new(StringArray::from_iter(rows.iter().map(f)))
    };
    let int = |f: fn(&CollectiveCall) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(rows.iter().map(f)))
    };
    let float = |f: fn(&CollectiveCall) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from_iter(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.device))),
        int(|r| r.stream),
        int(|r| r.step),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ts))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.dur))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.name.as_str()),
        )),
        text(|r| r.collective.as_deref()),
        text(|r| r.process_group.as_deref()),
        text(|r| r.algorithm),
        text(|r| r.protocol),
        text(|r| r.dtype.as_deref()),
        int(|r| r.group_size),
        int(|r| r.in_nelems),
        int(|r| r.out_nelems),
        int(|r| r.bytes),
        float(|r| r.algbw_gbps),
        float(|r| r.busbw_gbps),
        text(|r| r.sizes_from),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.instance),
        )),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.ranks))),
        int(|r| r.wait),
        int(|r| r.transfer),
        float(|r| r.busbw_transfer_gbps),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.last_rank))),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_and_protocol_from_real_kernel_names() {
        let cases = [
            (
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                (Some("RING"), Some("LL")),
            ),
            (
                "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                (Some("RING"), Some("LL")),
            ),
            (
                "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
                (Some("RING"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                (Some("RING"), Some("LL")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                (Some("RING"), Some("LL")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_bf16_TREE_LL128",
                (Some("TREE"), Some("LL128")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_bf16_NVLS_TREE_SIMPLE",
                (Some("NVLS_TREE"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f16_NVLS_SIMPLE",
                (Some("NVLS"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f32_COLLNET_DIRECT_SIMPLE",
                (Some("COLLNET_DIRECT"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f32_COLLNET_CHAIN_SIMPLE",
                (Some("COLLNET_CHAIN"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_ReduceScatter_Sum_bf16_PAT_SIMPLE",
                (Some("PAT"), Some("SIMPLE")),
            ),
            (
                "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
                (None, None),
            ),
            ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", (None, None)),
            (
                "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
                (None, None),
            ),
            ("void my_RING_LL_kernel()", (None, None)),
        ];
        for (name, want) in cases {
            assert_eq!(nccl_algorithm(name), want, "{name}");
        }
    }

    #[test]
    fn collectives_and_their_bus_bandwidth_factors() {
        use Collective::*;
        for (name, want) in [
            ("allreduce", Some(AllReduce)),
            ("allreduce_coalesced", Some(AllReduce)),
            ("_allgather_base", Some(AllGather)),
            ("all_gather", Some(AllGather)),
            ("allgather_into_tensor_coalesced", Some(AllGather)),
            ("reduce_scatter", Some(ReduceScatter)),
            ("_reduce_scatter_base", Some(ReduceScatter)),
            ("all_to_all", Some(AllToAll)),
            ("all_to_allv", Some(AllToAll)),
            ("alltoall_base", Some(AllToAll)),
            ("broadcast", Some(Broadcast)),
            ("_broadcast_oop", Some(Broadcast)),
            ("reduce", Some(Reduce)),
            ("_reduce_oop", Some(Reduce)),
            ("gather", Some(Gather)),
            ("scatter", Some(Scatter)),
            ("send", Some(SendRecv)),
            ("recv", Some(SendRecv)),
            ("recvAnySource", Some(SendRecv)),
            ("barrier", None),
            ("wait", None),
            ("coalesced", None),
        ] {
            assert_eq!(Collective::of_name(name), want, "{name}");
        }
        // nccl-tests' doc/PERFORMANCE.md summary.
        assert_eq!(AllReduce.busbw_factor(8), Some(1.75));
        assert_eq!(AllReduce.busbw_factor(2), Some(1.0));
        assert_eq!(AllReduce.busbw_factor(1), Some(0.0));
        for c in [ReduceScatter, AllGather, AllToAll, Gather, Scatter] {
            assert_eq!(c.busbw_factor(8), Some(0.875));
            assert_eq!(c.busbw_factor(4), Some(0.75));
        }
        for c in [Broadcast, Reduce, SendRecv] {
            assert_eq!(c.busbw_factor(8), Some(1.0));
        }
        assert_eq!(AllReduce.busbw_factor(0), None);
        assert_eq!(dtype_size("BFloat16"), Some(2));
        assert_eq!(dtype_size("Float"), Some(4));
        assert_eq!(dtype_size("Long"), Some(8));
        assert_eq!(dtype_size("Float8_e4m3fn"), Some(1));
        assert_eq!(dtype_size("ComplexFloat"), Some(8));
        assert_eq!(dtype_size("Int4"), None);
    }

    fn args(c: &str, dtype: &str, n: i64, inn: i64, out: i64) -> Option<(CommArgs, &'static str)> {
        Some((
            CommArgs {
                collective: Some(c.into()),
                process_group: Some("0".into()),
                dtype: Some(dtype.into()),
                group_size: Some(n),
                in_nelems: Some(inn),
                out_nelems: Some(out),
            },
            "kernel",
        ))
    }

    #[test]
    fn sizes_and_bandwidths_follow_nccl_tests() {
        let k = |comm| {
            CollectiveCall::new(
                Some(0),
                Some(0),
                Some(7),
                None,
                0,
                1000,
                "nccl".into(),
                comm,
            )
        };
        // 1M floats all-reduced by 8 ranks in 1 µs: S = 4 MB, algbw 4000 GB/s, busbw 7000.
        let c = k(args("allreduce", "Float", 8, 1 << 20, 1 << 20));
        assert_eq!(c.bytes, Some(4 << 20));
        assert_eq!(c.algbw_gbps, Some(4194.304));
        assert_eq!(c.busbw_gbps, Some(4194.304 * 1.75));
        // All-gather: S is the output (total) buffer.
        let c = k(args("_allgather_base", "BFloat16", 8, 25136, 201088));
        assert_eq!(c.bytes, Some(402176));
        assert_eq!(c.busbw_gbps, Some(402176.0 * 0.875 / 1000.0));
        // Reduce-scatter: S is the input.
        let c = k(args("reduce_scatter", "Half", 4, 4096, 1024));
        assert_eq!(c.bytes, Some(8192));
        assert_eq!(c.busbw_gbps, Some(8192.0 * 0.75 / 1000.0));
        let c = k(args("broadcast", "Long", 8, 20, 20));
        assert_eq!(c.busbw_gbps, c.algbw_gbps);
        // Unknown dtype or collective: no size.
        assert_eq!(k(args("allreduce", "Int4", 8, 10, 10)).bytes, None);
        assert_eq!(k(args("barrier", "Float", 8, 1, 1)).bytes, None);
        let c = k(None);
        assert_eq!((c.bytes, c.busbw_gbps, c.collective), (None, None, None));
    }

    #[test]
    fn wait_is_the_time_before_the_last_rank_started() {
        let k = |rank: i32, ts: i64, dur: i64, name: &str| {
            CollectiveCall::new(
                Some(rank),
                Some(rank),
                Some(7),
                Some(1),
                ts,
                dur,
                name.into(),
                args("allreduce", "Float", 3, 1000, 1000),
            )
        };
        let mut calls = vec![
            // Call 0 of AR: rank 2 starts last at 150.
            k(0, 100, 100, "AR"),
            k(1, 120, 80, "AR"),
            k(2, 150, 50, "AR"),
            // Call 1 of AR: all start together.
            k(0, 1000, 30, "AR"),
            k(1, 1000, 30, "AR"),
            k(2, 1000, 30, "AR"),
            // Call 2 of AR on ranks 0 and 1 only; rank 0 ends before rank 1 starts (clock
            // offsets): its wait is clipped to its duration.
            k(1, 2000, 10, "AR"),
            k(0, 1900, 40, "AR"),
            // A kernel of another name on one rank: not matched.
            k(0, 3000, 10, "BC"),
        ];
        match_across_ranks(&mut calls);
        let got: Vec<_> = calls
            .iter()
            .map(|c| (c.instance, c.ranks, c.wait, c.transfer, c.last_rank))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 3, Some(50), Some(50), Some(2)),
                (0, 3, Some(30), Some(50), Some(2)),
                (0, 3, Some(0), Some(50), Some(2)),
                (1, 3, Some(0), Some(30), None),
                (1, 3, Some(0), Some(30), None),
                (1, 3, Some(0), Some(30), None),
                (2, 2, Some(0), Some(10), Some(1)),
                (2, 2, Some(40), Some(0), Some(1)),
                (0, 1, None, None, None),
            ]
        );
        // Bus bandwidth over the transfer: 4000 bytes × 4/3 over 50 ns.
        let want = 4000.0 * (4.0 / 3.0) / 50.0;
        assert!((calls[0].busbw_transfer_gbps.unwrap() - want).abs() < 1e-9);
        assert_eq!(calls[7].busbw_transfer_gbps, None);
    }

    /// A one-rank trace whose kernels lack the message args: they come from the
    /// `record_param_comms` around the launch, or with the kernel's External id when the launch
    /// is not in the trace; a non-NCCL communication kernel takes none.
    const OLD_SHAPE: &str = r###"{
  "schemaVersion": 1,
  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 4},
  "traceEvents": [
  {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 10, "tid": 11, "ts": 100, "dur": 900, "args": {"External id": 1}},
  {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 11, "ts": 110, "dur": 50,
   "args": {"External id": 5, "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1000, "Out msg nelems": 1000, "Group size": 4, "Process Group Name": "0"}},
  {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "pid": 10, "tid": 11, "ts": 120, "dur": 30, "args": {"External id": 6}},
  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 125, "dur": 5, "args": {"External id": 6, "correlation": 900}},
  {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclDevComm*, unsigned long, ncclWork*)", "pid": 0, "tid": 7, "ts": 200, "dur": 2,
   "args": {"External id": 6, "device": 0, "stream": 7, "correlation": 900}},
  {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 10, "tid": 11, "ts": 300, "dur": 50,
   "args": {"External id": 8, "Collective name": "_allgather_base", "dtype": "Float", "In msg nelems": 250, "Out msg nelems": 1000, "Group size": 4, "Process Group Name": "0"}},
  {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 7, "ts": 400, "dur": 4,
   "args": {"External id": 8, "device": 0, "stream": 7, "correlation": 901}},
  {"ph": "X", "cat": "kernel", "name": "one_shot_all_reduce_kernel", "pid": 0, "tid": 7, "ts": 500, "dur": 3,
   "args": {"External id": 8, "device": 0, "stream": 7, "correlation": 902}}
  ]
}"###;

    #[tokio::test]
    async fn sizes_come_from_record_param_comms_when_the_kernel_lacks_them() {
        use gpuq_engine::{RunId, Store};
        use gpuq_ingest::{IngestOptions, NoProgress};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let path = dir.path().join("trace.json");
        std::fs::write(&path, OLD_SHAPE).unwrap();
        let opts = IngestOptions {
            run: Some(RunId::new("old").unwrap()),
            ..Default::default()
        };
        gpuq_ingest::ingest(&store, &[path], &opts, &NoProgress).unwrap();
        let ctx = crate::open_session(&store).await.unwrap();
        let rows = load(&ctx, "old", &Scope::whole()).await.unwrap();
        let got: Vec<_> = rows
            .iter()
            .map(|r| (r.collective.as_deref(), r.bytes, r.sizes_from, r.algorithm))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Some("allreduce"),
                    Some(2000),
                    Some("enclosing_op"),
                    Some("RING")
                ),
                (
                    Some("_allgather_base"),
                    Some(4000),
                    Some("external_id"),
                    Some("RING")
                ),
                (None, None, None, None),
            ]
        );
        assert_eq!(rows[0].busbw_gbps, Some(2000.0 * 1.5 / 2000.0));
        assert_eq!(rows[1].busbw_gbps, Some(4000.0 * 0.75 / 4000.0));
        assert!(rows.iter().all(|r| r.wait.is_none() && r.ranks == 1));
        // Through SQL, with a step range.
        let n = ctx
            .sql("SELECT count(*) FROM collectives('old', '3') WHERE bytes IS NOT NULL")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let n = datafusion::arrow::compute::cast(n[0].column(0), &DataType::Int64).unwrap();
        assert_eq!(n.as_any().downcast_ref::<Int64Array>().unwrap().value(0), 2);
    }
}
