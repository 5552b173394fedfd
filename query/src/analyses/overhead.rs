//! `profiler_overhead(run [, steps])`: what the profiler itself cost, so that a profile slowed
//! by its own recording is recognised before its numbers are trusted.
//!
//! Two kinds of rows per rank:
//! - `recorded`: the overhead the profiler wrote down itself, per name: Kineto's `overhead`
//!   events (`Buffer Flush`, `Activity Buffer Request`, `Lazy Function Loading`) and Nsight
//!   Systems' `PROFILER_OVERHEAD` rows (`CUPTI Buffer flush`, ...). `share_pct` is their time
//!   (the union per name, so that nested or parallel rows count once) over the rank's window.
//! - `launch_calls`: per kernel-launch API (`cudaLaunchKernel`, `cuLaunchKernel`,
//!   `hipLaunchKernel`, ...) the calls' count, median and longest duration and their share of
//!   the window. Activity tracing lengthens every launch call; a median far above the few
//!   microseconds a launch takes unprofiled says the host side of the profile is inflated.
//!
//! Columns: `rank`, `kind`, `name`, `instances`, `total`, `med`, `max`, `window` (the rank's
//! first to last event, or the selected steps), `share_pct`. `findings` reports recorded
//! overhead that covers at least [`DISTORTING_SHARE_PCT`] % of a rank's window.
//!
//! ```sql
//! SELECT rank, kind, name, fmt_dur(total), share_pct FROM profiler_overhead('r');
//! ```

use super::data::{collect, ints, strings, walls, Scope};
use super::history::stats::median_ints;
use super::intervals::{length, union};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::BTreeMap;
use std::sync::Arc;

pub static PROFILER_OVERHEAD: Spec = Spec::of_run("profiler_overhead", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

/// Recorded overhead at or above this share of a rank's window is a finding.
pub const DISTORTING_SHARE_PCT: f64 = 2.0;

/// The APIs that launch kernels (runtime and driver, CUDA and HIP).
pub const LAUNCH_CALLS: &[&str] = &[
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
];

/// Whether `name` is a kernel-launch API, with or without the version suffix Nsight Systems
/// keeps on some (`cudaLaunchKernelExC_v11060`).
pub fn is_launch_call(name: &str) -> bool {
    let base = match name.rfind("_v") {
        Some(at) if at + 2 < name.len() && name[at + 2..].bytes().all(|b| b.is_ascii_digit()) => {
            &name[..at]
        }
        _ => name,
    };
    LAUNCH_CALLS.contains(&base)
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("rank", DataType::Int32, true),
        Field::new("kind", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("instances", DataType::Int64, false),
        Field::new("total", DataType::Int64, false),
        Field::new("med", DataType::Float64, false),
        Field::new("max", DataType::Int64, false),
        Field::new("window", DataType::Int64, false),
        Field::new("share_pct", DataType::Float64, false),
    ]))
}

/// One row of `profiler_overhead`.
#[derive(Debug, Clone, PartialEq)]
pub struct OverheadRow {
    pub rank: Option<i32>,
    pub kind: &'static str,
    pub name: String,
    pub instances: i64,
    /// `recorded`: the union of the rows' intervals; `launch_calls`: the sum of the calls.
    pub total: i64,
    pub med: f64,
    pub max: i64,
    pub window: i64,
    pub share_pct: f64,
}

/// The rows of `profiler_overhead(run)` within `scope`, recorded overhead first, then by rank
/// and time.
pub async fn load(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<OverheadRow>> {
    let windows = walls(ctx, run).await?;
    let sql = format!(
        "SELECT rank, CAST(kind AS VARCHAR), name, ts, ts + dur FROM events WHERE run = {} \
         AND dur >= 0 AND (kind = 'overhead' OR (kind IN ('runtime', 'driver') AND name LIKE \
         '%Launch%Kernel%'))",
        literal(run)
    );
    // (rank, kind, name) -> spans
    let mut groups: BTreeMap<(Option<i32>, &'static str, String), Vec<(i64, i64)>> =
        BTreeMap::new();
    for b in collect(ctx, &sql).await? {
        let (rank, kind, name) = (ints(&b, 0)?, strings(&b, 1)?, strings(&b, 2)?);
        let (ts, end) = (ints(&b, 3)?, ints(&b, 4)?);
        for i in 0..b.num_rows() {
            let rank = rank[i].map(|r| r as i32);
            let (Some(s), Some(e)) = (ts[i], end[i]) else {
                continue;
            };
            let Some((s, e)) = scope.clip(rank, s, e) else {
                continue;
            };
            let name = name[i].clone().unwrap_or_default();
            let kind = if kind[i].as_deref() == Some("overhead") {
                "recorded"
            } else if is_launch_call(&name) {
                "launch_calls"
            } else {
                continue;
            };
            groups.entry((rank, kind, name)).or_default().push((s, e));
        }
    }
    let mut out = Vec::new();
    for ((rank, kind, name), spans) in groups {
        let window = match (scope.window(rank), windows.get(&rank)) {
            (Some((lo, hi)), _) => hi - lo,
            (None, Some((lo, hi))) => hi - lo,
            (None, None) => 0,
        };
        let mut durs: Vec<i64> = spans.iter().map(|(s, e)| e - s).collect();
        durs.sort_unstable();
        let total = if kind == "recorded" {
            length(&union(spans.iter().copied()))
        } else {
            durs.iter().sum()
        };
        out.push(OverheadRow {
            rank,
            kind,
            name,
            instances: durs.len() as i64,
            total,
            med: median_ints(durs.clone()).unwrap_or(0.0),
            max: durs.last().copied().unwrap_or(0),
            window,
            share_pct: if window > 0 {
                100.0 * total as f64 / window as f64
            } else {
                0.0
            },
        });
    }
    out.sort_by(|a, b| {
        (
            a.kind != "recorded",
            a.rank,
            std::cmp::Reverse(a.total),
            &a.name,
        )
            .cmp(&(
                b.kind != "recorded",
                b.rank,
                std::cmp::Reverse(b.total),
                &b.name,
            ))
    });
    Ok(out)
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load(&ctx, &call.run, &scope).await?;
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
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.total))),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.med))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.max))),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.window))),
        Arc::new(Float64Array::from_iter_values(
            rows.iter().map(|r| r.share_pct),
        )),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_calls_with_and_without_their_version() {
        assert!(is_launch_call("cudaLaunchKernel"));
        assert!(is_launch_call("cudaLaunchKernelExC_v11060"));
        assert!(is_launch_call("hipModuleLaunchKernel"));
        assert!(!is_launch_call("cudaLaunchHostFunc"));
        assert!(!is_launch_call("cudaLaunchKernel_vx"));
        assert!(!is_launch_call("cudaLaunchKernel_v"));
    }
}
