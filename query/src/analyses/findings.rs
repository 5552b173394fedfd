//! `findings(run)`: what to fix first, as an ordered list of findings with evidence and a
//! recommended action.
//!
//! Each finding has a `severity` (`high`, `medium`, `low`), a `category`, a one-line
//! `title`, the `evidence` (numbers and the events involved), the `action`, and `impact_ns`:
//! the time at stake (GPU time lost or exposed); `at_rank`, `at_ts`, `at_dur`: the worst
//! instance, where a timeline should point (the longest gap, the least busy launch-bound
//! stretch, the longest sync call, the slowest step; NULL for findings about totals). Rows are ordered by severity, then impact.
//! Severity is the impact's share of the GPU span (summed over devices): at least 10 % is
//! `high`, at least 3 % `medium`, else `low`.
//!
//! | category | fires when | from |
//! |---|---|---|
//! | `idle_gaps` | the GPU is idle ≥ 5 % of its span; names the dominant gap cause | `gpu_gaps`, `breakdown` |
//! | `launch_bound` | time chunks (30 per device) with GPU busy < 50 % where most kernels (≥ 20) are short (< 10 µs or shorter than their launch call) | `gpu_util`, `launch_stats` |
//! | `sync_memcpy` | Nsight Systems' `cuda_memcpy_sync` rule: `cudaMemcpy*` (not `Async`) copies, except host-to-device ≤ 64 000 B and device-to-device; impact = the time the calls block *not* waiting for earlier queued work | `launch_stats` |
//! | `memcpy_wait` | the part of those synchronous copy calls spent while the copy's own stream was still busy with work queued before the copy: an implicit synchronisation (`.item()`, `.cpu()`), not a slow copy | `launch_stats`, `breakdown` |
//! | `pageable_memcpy` | `cuda_memcpy_async`: `cudaMemcpy*Async` from or to pageable host memory (synchronous in fact) | memcpy names/args |
//! | `sync_api` | `cuda_api_sync`: host calls that block until the GPU is done ([`HOST_SYNC_CALLS`](super::gaps::HOST_SYNC_CALLS): device, stream, event, context and thread forms, runtime and driver, CUDA and HIP; at most `medium`); their time is host time, unlike `breakdown`'s GPU-side `sync` column | `runtime` |
//! | `exposed_memcpy` | copies not overlapped by compute or communication ≥ 5 % of busy | `breakdown` |
//! | `exposed_comm` | communication not hidden by compute ≥ 5 % of busy | `breakdown` |
//! | `dominant_class` | one kernel class has ≥ 40 % of kernel time; its likely bound by class (always `low`: a hint, not a defect) | `kernel_class` |
//! | `roofline` | GEMM-like operators with known FLOPs (≥ 10 % of kernel time) run under 70 % of their roof (`min(peak, intensity × bandwidth)`); the bound by arithmetic intensity; impact = the kernel time saved at 70 % (at most `medium`) | `roofline` |
//! | `slow_steps` | steps whose wall or GPU busy time is over 1.5 × the rank's median (`vs_median`) | `step_stats` |
//! | `profiler_overhead` | the profiler's own recorded work (buffer flushes, ...) covers ≥ 2 % of a rank's window: the profile is partly the profiler's (at most `medium`) | `profiler_overhead` |
//!
//! ROCm runs (host calls named `hip*`) get HIP wording in titles and actions (`hipMemcpyAsync`,
//! `hipHostMalloc`, `hipDeviceSynchronize`, HIP graphs). With a step range (`findings('r',
//! '3..5')`) every rule looks only at the selected steps (see [`Scope`]).
//!
//! ```sql
//! SELECT severity, title, action FROM findings('llama-bs8');
//! ```

mod rules;

use super::data::{ranges, Host, Names, Scope, Timelines};
use super::{batch, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use rules::RunData;
use std::sync::Arc;

pub static FINDINGS: Spec =
    Spec::of_run("findings", schema, |ctx, call| compute(ctx, call).boxed());

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("severity", DataType::Utf8, false),
        Field::new("category", DataType::Utf8, false),
        Field::new("title", DataType::Utf8, false),
        Field::new("evidence", DataType::Utf8, false),
        Field::new("action", DataType::Utf8, false),
        Field::new("impact_ns", DataType::Int64, false),
        Field::new("at_rank", DataType::Int32, true),
        Field::new("at_ts", DataType::Int64, true),
        Field::new("at_dur", DataType::Int64, true),
    ]))
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub severity: &'static str,
    pub category: &'static str,
    pub title: String,
    pub evidence: String,
    pub action: String,
    pub impact_ns: i64,
    /// Where to look: the worst instance (the longest gap, the slowest step, ...), for a
    /// timeline's marker. `None` for findings about totals (exposed copies, kernel classes).
    pub at: Option<At>,
}

/// The moment a finding points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    pub rank: Option<i32>,
    pub ts: i64,
    pub dur: i64,
}

fn severity_rank(s: &str) -> u8 {
    match s {
        "high" => 0,
        "medium" => 1,
        _ => 2,
    }
}

/// CUDA names in findings' text and their HIP twins, for ROCm runs.
const HIP_WORDING: &[(&str, &str)] = &[
    ("cudaMemcpyAsync", "hipMemcpyAsync"),
    ("cudaHostAlloc", "hipHostMalloc"),
    ("cudaDeviceSynchronize", "hipDeviceSynchronize"),
    ("cudaStreamSynchronize", "hipStreamSynchronize"),
    ("cudaMemcpy*", "hipMemcpy*"),
    ("CUDA graphs", "HIP graphs"),
    ("cuBLASLt", "hipBLASLt"),
    ("cuBLAS", "rocBLAS"),
];

/// `text` in HIP wording (see [`HIP_WORDING`]).
fn hip_wording(text: &str) -> String {
    HIP_WORDING
        .iter()
        .fold(text.to_string(), |t, (cuda, hip)| t.replace(cuda, hip))
}

/// Whether a run's host calls are HIP's: a ROCm run.
fn is_rocm(host: &Host, names: &Names) -> bool {
    let (mut hip, mut cuda) = (0usize, 0usize);
    for c in &host.calls {
        let n = names.get(c.name);
        if n.starts_with("hip") {
            hip += 1;
        } else if n.starts_with("cu") {
            cuda += 1;
        }
    }
    hip > cuda
}

/// All findings of a run, ordered.
pub async fn load(ctx: &SessionContext, run: &str) -> Result<Vec<Finding>> {
    load_in(ctx, run, &Scope::whole()).await
}

/// The findings of `run` within `scope`, ordered.
pub async fn load_in(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<Finding>> {
    let mut timelines = Timelines::load(ctx, run, true).await?;
    scope.restrict(&mut timelines);
    let mut names = Names::default();
    let host = Host::load(ctx, run, &mut names).await?;
    let ranges = ranges(ctx, run, &mut names).await?;
    // One read of the run's GPU operations serves every rule.
    let plain = timelines.without_overhead();
    let breakdown = super::breakdown::load(ctx, run, &plain, scope).await?;
    let span: i64 = breakdown.iter().map(|r| r.span).sum();
    let busy: i64 = breakdown.iter().map(|r| r.busy).sum();
    let d = RunData {
        ctx,
        run,
        scope,
        timelines,
        plain,
        host,
        names,
        ranges,
        breakdown,
        span,
        busy,
    };
    let copies = rules::copy_calls(&d).await?;
    let classes = rules::kernel_classes(&d.plain);
    let mut out: Vec<Finding> = [
        rules::idle_gaps(&d),
        rules::launch_bound(&d),
        rules::memcpy_wait(&d, &copies),
        rules::sync_memcpy(&d, &copies),
        rules::pageable_memcpy(&d, &copies),
        rules::sync_api(&d),
        rules::exposed_memcpy(&d, &copies),
        rules::exposed_comm(&d),
        rules::dominant_class(&classes),
        rules::roofline(&d, classes.total).await?,
        rules::slow_steps(&d).await?,
        rules::profiler_overhead(&d).await?,
    ]
    .into_iter()
    .flatten()
    .collect();

    out.sort_by(|a, b| {
        (severity_rank(a.severity), std::cmp::Reverse(a.impact_ns))
            .cmp(&(severity_rank(b.severity), std::cmp::Reverse(b.impact_ns)))
    });
    if is_rocm(&d.host, &d.names) {
        for f in &mut out {
            f.title = hip_wording(&f.title);
            f.action = hip_wording(&f.action);
        }
    }
    Ok(out)
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load_in(&ctx, &call.run, &scope).await?;
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.severity),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.category),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.title.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.evidence.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.action.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|r| r.impact_ns),
        )),
        Arc::new(Int32Array::from_iter(
            rows.iter().map(|r| r.at.and_then(|a| a.rank)),
        )),
        Arc::new(Int64Array::from_iter(
            rows.iter().map(|r| r.at.map(|a| a.ts)),
        )),
        Arc::new(Int64Array::from_iter(
            rows.iter().map(|r| r.at.map(|a| a.dur)),
        )),
    ];
    batch(schema(), columns)
}
