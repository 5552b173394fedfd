//! `breakdown(run)`: per device timeline (rank, pid, device), where the GPU time went.
//!
//! All figures are exact ns over interval unions (`docs/analyses.md` compares them with HTA,
//! TraceLens and Nsight Systems):
//!
//! | column | definition |
//! |---|---|
//! | `span` | first start to last end of the device's kernels, memcpy and memset |
//! | `busy` | length of the union of those operations |
//! | `idle`, `idle_pct` | `span - busy`, and its share of `span` |
//! | `compute` | union of compute kernels (every kernel whose `kernel_class` is not `communication`) |
//! | `comm`, `comm_exposed` | union of communication kernels; the part of it no compute kernel overlaps |
//! | `comm_overlap_pct` | `100 · |comm ∩ compute| / |comm|` (HTA's comm/compute overlap) |
//! | `memcpy`, `memcpy_exposed` | union of copies; the part overlapped by neither compute nor communication |
//! | `memset`, `memset_exposed` | union of memsets; the part overlapped by nothing above |
//! | `kernel_sum`, `gpu_sum` | plain sums of kernel / all operation durations (what per-op tables add up to) |
//! | `sync` | union of the device's `sync` events (GPU-side waits: stream/event waits the GPU records), not part of `busy`; host calls that block (`cudaDeviceSynchronize`, ...) are `findings`' `sync_api`, on the host |
//! | `wall` | the trace's window: first to last event of the rank, host events included, stage-log stages not |
//! | `unaccounted` | `wall - busy`: wall time no GPU operation accounts for (startup, host work, stalls) |
//! | `wall_with_stages`, `unaccounted_with_stages` | the same over the window widened by the stage log's stages (equal to `wall`, `unaccounted` without a stage log) |
//!
//! `compute + comm_exposed + memcpy_exposed + memset_exposed = busy` exactly. With a step
//! range (`breakdown('r', '3..5')`) the operations are those launched in the selected steps and
//! `wall` is the steps' span.
//!
//! ```sql
//! SELECT device, fmt_dur(busy), idle_pct, comm_overlap_pct FROM breakdown('llama-bs8');
//! ```

use super::data::{collect, ints, walls, walls_with_stages, DeviceKey, OpClass, Scope, Timelines};
use super::intervals::{intersect, length, subtract, union};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;

pub static BREAKDOWN: Spec =
    Spec::of_run("breakdown", schema, |ctx, call| compute(ctx, call).boxed());

const INT_COLUMNS: &[&str] = &[
    "span",
    "busy",
    "idle",
    "compute",
    "comm",
    "comm_exposed",
    "memcpy",
    "memcpy_exposed",
    "memset",
    "memset_exposed",
    "sync",
    "kernel_sum",
    "gpu_sum",
    "wall",
    "unaccounted",
    "wall_with_stages",
    "unaccounted_with_stages",
];

fn schema() -> SchemaRef {
    let mut f = vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("pid", DataType::Int64, true),
        Field::new("device", DataType::Int32, true),
    ];
    for name in INT_COLUMNS {
        f.push(Field::new(*name, DataType::Int64, false));
        if *name == "idle" {
            f.push(Field::new("idle_pct", DataType::Float64, false));
        }
        if *name == "comm_exposed" {
            f.push(Field::new("comm_overlap_pct", DataType::Float64, true));
        }
    }
    Arc::new(Schema::new(f))
}

/// One device timeline's breakdown (ns).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Breakdown {
    pub key: DeviceKey,
    pub span: i64,
    pub busy: i64,
    pub idle: i64,
    pub compute: i64,
    pub comm: i64,
    pub comm_exposed: i64,
    pub memcpy: i64,
    pub memcpy_exposed: i64,
    pub memset: i64,
    pub memset_exposed: i64,
    pub sync: i64,
    pub kernel_sum: i64,
    pub gpu_sum: i64,
    pub wall: i64,
    pub unaccounted: i64,
    pub wall_with_stages: i64,
    pub unaccounted_with_stages: i64,
}

impl Breakdown {
    fn ints(&self) -> [i64; 17] {
        [
            self.span,
            self.busy,
            self.idle,
            self.compute,
            self.comm,
            self.comm_exposed,
            self.memcpy,
            self.memcpy_exposed,
            self.memset,
            self.memset_exposed,
            self.sync,
            self.kernel_sum,
            self.gpu_sum,
            self.wall,
            self.unaccounted,
            self.wall_with_stages,
            self.unaccounted_with_stages,
        ]
    }

    pub fn idle_pct(&self) -> f64 {
        pct(self.idle, self.span).unwrap_or(0.0)
    }

    /// `100 · |comm ∩ compute| / |comm|`; None without communication.
    pub fn comm_overlap_pct(&self) -> Option<f64> {
        pct(self.comm - self.comm_exposed, self.comm)
    }
}

fn pct(a: i64, b: i64) -> Option<f64> {
    (b > 0).then(|| (1000.0 * a as f64 / b as f64).round() / 10.0)
}

/// The trace's window per rank, and the same widened by the stage log's stages.
#[derive(Debug, Clone, Default)]
pub struct Walls {
    pub trace: HashMap<Option<i32>, (i64, i64)>,
    pub with_stages: HashMap<Option<i32>, (i64, i64)>,
}

/// The breakdown of every device timeline of a loaded run. `syncs` are the GPU-side sync
/// intervals per timeline, `walls` the first/last event per rank.
pub fn breakdowns(
    timelines: &Timelines,
    syncs: &HashMap<DeviceKey, Vec<(i64, i64)>>,
    walls: &Walls,
) -> Vec<Breakdown> {
    let mut out = Vec::new();
    for (key, ops) in &timelines.devices {
        let of = |c: OpClass| {
            union(
                ops.iter()
                    .filter(|o| o.class == c)
                    .map(|o| (o.start, o.end)),
            )
        };
        let (compute, comm, memcpy, memset) = (
            of(OpClass::Compute),
            of(OpClass::Communication),
            of(OpClass::Memcpy),
            of(OpClass::Memset),
        );
        let all = union(
            ops.iter()
                .filter(|o| o.class != OpClass::Overhead)
                .map(|o| (o.start, o.end)),
        );
        let (Some(first), Some(last)) = (all.first(), all.last()) else {
            continue;
        };
        let span = last.1 - first.0;
        let busy = length(&all);
        let comm_exposed = subtract(&comm, &compute);
        let above_copies = union(compute.iter().chain(comm.iter()).copied());
        let memcpy_exposed = subtract(&memcpy, &above_copies);
        let above_memset = union(above_copies.iter().chain(memcpy.iter()).copied());
        let memset_exposed = subtract(&memset, &above_memset);
        let sync = syncs
            .get(key)
            .map_or(0, |s| length(&union(s.iter().copied())));
        let wall_of = |walls: &HashMap<Option<i32>, (i64, i64)>| {
            let (w0, w1) = walls.get(&key.rank).copied().unwrap_or((first.0, last.1));
            w1.max(last.1) - w0.min(first.0)
        };
        let (wall, wall_with_stages) = (wall_of(&walls.trace), wall_of(&walls.with_stages));
        debug_assert_eq!(length(&intersect(&comm_exposed, &compute)), 0);
        out.push(Breakdown {
            key: key.clone(),
            span,
            busy,
            idle: span - busy,
            compute: length(&compute),
            comm: length(&comm),
            comm_exposed: length(&comm_exposed),
            memcpy: length(&memcpy),
            memcpy_exposed: length(&memcpy_exposed),
            memset: length(&memset),
            memset_exposed: length(&memset_exposed),
            sync,
            kernel_sum: ops
                .iter()
                .filter(|o| matches!(o.class, OpClass::Compute | OpClass::Communication))
                .map(|o| o.end - o.start)
                .sum(),
            gpu_sum: ops
                .iter()
                .filter(|o| o.class != OpClass::Overhead)
                .map(|o| o.end - o.start)
                .sum(),
            wall,
            unaccounted: wall - busy,
            wall_with_stages,
            unaccounted_with_stages: wall_with_stages - busy,
        });
    }
    out
}

/// The breakdown of `timelines` (loaded by the caller, restricted to `scope`), with the sync
/// events and wall times it reads from `run`.
pub async fn load(
    ctx: &SessionContext,
    run: &str,
    timelines: &Timelines,
    scope: &Scope,
) -> Result<Vec<Breakdown>> {
    let mut syncs: HashMap<DeviceKey, Vec<(i64, i64)>> = HashMap::new();
    let sql = format!(
        "SELECT rank, pid, device, ts, ts + dur FROM sync WHERE run = {} AND dur >= 0",
        literal(run)
    );
    for b in collect(ctx, &sql).await? {
        let (rank, pid, device, ts, end) = (
            ints(&b, 0)?,
            ints(&b, 1)?,
            ints(&b, 2)?,
            ints(&b, 3)?,
            ints(&b, 4)?,
        );
        for i in 0..b.num_rows() {
            if let (Some(s), Some(e)) = (ts[i], end[i]) {
                let key = DeviceKey {
                    rank: rank[i].map(|r| r as i32),
                    pid: pid[i],
                    device: device[i].map(|d| d as i32),
                };
                if let Some(iv) = scope.clip(key.rank, s, e) {
                    syncs.entry(key).or_default().push(iv);
                }
            }
        }
    }
    let mut walls = Walls {
        trace: walls(ctx, run).await?,
        with_stages: walls_with_stages(ctx, run).await?,
    };
    scope.clip_walls(&mut walls.trace);
    scope.clip_walls(&mut walls.with_stages);
    Ok(breakdowns(timelines, &syncs, &walls))
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let mut timelines = Timelines::load(&ctx, &call.run, false).await?;
    scope.restrict(&mut timelines);
    let rows = load(&ctx, &call.run, &timelines, &scope).await?;
    let mut columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.key.rank))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.key.pid))),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.key.device))),
    ];
    for (i, name) in INT_COLUMNS.iter().enumerate() {
        columns.push(Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.ints()[i]),
        )));
        if *name == "idle" {
            columns.push(Arc::new(Float64Array::from_iter_values(
                rows.iter().map(Breakdown::idle_pct),
            )));
        }
        if *name == "comm_exposed" {
            columns.push(Arc::new(Float64Array::from_iter(
                rows.iter().map(Breakdown::comm_overlap_pct),
            )));
        }
    }
    batch(schema(), columns)
}
