//! `roofline(run)`: achieved throughput and arithmetic intensity of the operators whose FLOPs
//! are known, against the GPU's peak: is a GEMM compute- or memory-bound, and how far from
//! its roof does it run?
//!
//! An operator instance's FLOPs come from a `flops` arg when the trace has one (PyTorch's
//! `with_flops`), otherwise from its input shapes (`record_shapes`: `Input Dims` and
//! `Input type`) for the GEMM-like operators below, with PyTorch's own formulas. Its bytes are
//! the least traffic the operation needs: every input and the output read or written once.
//!
//! | operator | FLOPs | bytes (× element size) |
//! |---|---|---|
//! | `aten::mm(a[M,K], b[K,N])` | 2·M·K·N | M·K + K·N + M·N |
//! | `aten::addmm(bias, a[M,K], b[K,N])` | 2·M·K·N | bias + M·K + K·N + M·N |
//! | `aten::bmm(a[B,M,K], b[B,K,N])` | 2·B·M·K·N | B·(M·K + K·N + M·N) |
//! | `aten::baddbmm(bias, a[B,M,K], b[B,K,N])` | 2·B·M·K·N | bias + B·(M·K + K·N + M·N) |
//! | `aten::linear(x[..,K], w[N,K] [, bias])`, `aten::matmul(x[..,K], w[K,N])` | 2·R·K·N, R = rows of x | x + w + bias + R·N |
//! | `aten::_scaled_mm(a[M,K], b[K,N], ..)` (fp8) | 2·M·K·N | M·K + K·N (1 B) + M·N (2 B: a bf16 result) |
//!
//! Each kernel counts for the innermost such operator around its launch call (same rank,
//! process and thread), so `aten::linear` around `aten::addmm` is counted once, by the
//! `addmm`; communication kernels, copies and memsets never count. Operator instances that
//! launched no kernel in the trace are left out.
//!
//! Rows are per (operator, dtype, GPU), by kernel time:
//!
//! | column | definition |
//! |---|---|
//! | `tflops` | `flop / kernel_time`: achieved TFLOP/s |
//! | `intensity` | `flop / bytes`: FLOP per byte of least traffic |
//! | `peak_tflops`, `peak_tbps` | the GPU's dense peak for the dtype and its memory bandwidth (datasheet figures, below) |
//! | `ridge` | `peak_tflops / peak_tbps`: the intensity where the roofline bends |
//! | `bound` | `compute` when `intensity >= ridge`, else `memory` |
//! | `attainable_tflops` | `min(peak_tflops, intensity × peak_tbps)` |
//! | `pct_of_attainable` | `tflops / attainable_tflops`, in % |
//!
//! fp32 operators are measured against the plain FP32 peak (PyTorch's default for matmul);
//! one running faster than that must use TF32 tensor cores and is measured against the TF32
//! peak, its dtype shown as `fp32 (tf32)`.
//!
//! A run without shapes or FLOPs gives no row, a GPU not in the table rows without a peak or
//! bound: [`notes`] says which and how to fix it (`gpuq roofline` prints them). With a step
//! range (`roofline('r', '3..5')`) only kernels launched in the selected steps count.
//!
//! ```sql
//! SELECT op, dtype, fmt_dur(kernel_time), tflops, intensity, bound, pct_of_attainable
//! FROM roofline('llama-bs8');
//! ```

use super::data::{collect, ints, strings, DeviceKey, Host, Names, OpClass, Scope, Timelines};
use super::{batch, literal, Call, Spec};
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub static ROOFLINE: Spec =
    Spec::of_run("roofline", schema, |ctx, call| compute(ctx, call).boxed());

fn schema() -> SchemaRef {
    let f = |n, t, null| Field::new(n, t, null);
    Arc::new(Schema::new(vec![
        f("run", DataType::Utf8, false),
        f("op", DataType::Utf8, false),
        f("dtype", DataType::Utf8, true),
        f("gpu", DataType::Utf8, true),
        f("source", DataType::Utf8, false),
        f("instances", DataType::Int64, false),
        f("kernels", DataType::Int64, false),
        f("kernel_time", DataType::Int64, false),
        f("flop", DataType::Float64, false),
        f("bytes", DataType::Float64, true),
        f("tflops", DataType::Float64, false),
        f("intensity", DataType::Float64, true),
        f("peak_tflops", DataType::Float64, true),
        f("peak_tbps", DataType::Float64, true),
        f("ridge", DataType::Float64, true),
        f("bound", DataType::Utf8, true),
        f("attainable_tflops", DataType::Float64, true),
        f("pct_of_attainable", DataType::Float64, true),
    ]))
}

/// Dense peak throughputs of a GPU model (vendor datasheets; no structured sparsity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuPeak {
    /// Model name as shown in `gpu` (the first pattern that matched).
    pub model: &'static str,
    /// TFLOP/s with fp16/bf16 tensor (matrix) cores, fp32 accumulate.
    pub tensor16: f64,
    pub fp8: Option<f64>,
    pub tf32: Option<f64>,
    /// Plain (non-tensor) fp32, and fp64 (tensor where the GPU has it).
    pub fp32: f64,
    pub fp64: f64,
    /// Memory bandwidth, TB/s.
    pub tbps: f64,
}

/// Every pattern must occur in the device name (case-insensitive); the first row that
/// matches wins, so the more specific rows come first.
const PEAKS: &[(&[&str], GpuPeak)] = {
    const fn p(
        model: &'static str,
        tensor16: f64,
        fp8: Option<f64>,
        tf32: Option<f64>,
        fp32: f64,
        fp64: f64,
        tbps: f64,
    ) -> GpuPeak {
        GpuPeak {
            model,
            tensor16,
            fp8,
            tf32,
            fp32,
            fp64,
            tbps,
        }
    }
    &[
        (
            &["b200"],
            p("B200", 2250.0, Some(4500.0), Some(1100.0), 75.0, 37.0, 8.0),
        ),
        (
            &["h200"],
            p("H200", 989.4, Some(1978.9), Some(494.7), 66.9, 66.9, 4.8),
        ),
        (
            &["h100", "pcie"],
            p(
                "H100 PCIe",
                756.5,
                Some(1513.0),
                Some(378.0),
                51.2,
                51.2,
                2.0,
            ),
        ),
        (
            &["h100"],
            p(
                "H100 SXM",
                989.4,
                Some(1978.9),
                Some(494.7),
                66.9,
                66.9,
                3.35,
            ),
        ),
        (
            &["a100", "80gb", "pcie"],
            p(
                "A100 80GB PCIe",
                312.0,
                None,
                Some(156.0),
                19.5,
                19.5,
                1.935,
            ),
        ),
        (
            &["a100", "80gb"],
            p("A100 80GB SXM", 312.0, None, Some(156.0), 19.5, 19.5, 2.039),
        ),
        (
            &["a100"],
            p("A100 40GB", 312.0, None, Some(156.0), 19.5, 19.5, 1.555),
        ),
        (
            &["v100", "pcie"],
            p("V100 PCIe", 112.0, None, None, 14.0, 7.0, 0.9),
        ),
        (&["v100"], p("V100 SXM2", 125.0, None, None, 15.7, 7.8, 0.9)),
        (
            &["rtx 3080"],
            p("RTX 3080", 59.5, None, Some(29.8), 29.8, 0.47, 0.76),
        ),
        (
            &["mi300x"],
            p(
                "MI300X",
                1307.4,
                Some(2614.9),
                Some(653.7),
                163.4,
                163.4,
                5.3,
            ),
        ),
        (&["mi250x"], p("MI250X", 383.0, None, None, 95.7, 95.7, 3.2)),
        (&["mi250"], p("MI250", 362.1, None, None, 90.5, 90.5, 3.2)),
    ]
};

/// The peaks of a device name, `None` for a GPU not in the table.
pub fn gpu_peak(device_name: &str) -> Option<GpuPeak> {
    let lower = device_name.to_ascii_lowercase();
    PEAKS
        .iter()
        .find(|(patterns, _)| patterns.iter().all(|p| lower.contains(p)))
        .map(|(_, peak)| *peak)
}

/// Element type of an operator's operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dtype {
    Fp8,
    Fp16,
    Bf16,
    Fp32,
    Fp64,
    Int8,
}

impl Dtype {
    fn of(type_name: &str) -> Option<Dtype> {
        Some(match type_name {
            "c10::BFloat16" => Dtype::Bf16,
            "c10::Half" => Dtype::Fp16,
            "float" => Dtype::Fp32,
            "double" => Dtype::Fp64,
            "signed char" | "unsigned char" => Dtype::Int8,
            t if t.starts_with("c10::Float8") => Dtype::Fp8,
            _ => return None,
        })
    }

    fn bytes(self) -> f64 {
        match self {
            Dtype::Fp8 | Dtype::Int8 => 1.0,
            Dtype::Fp16 | Dtype::Bf16 => 2.0,
            Dtype::Fp32 => 4.0,
            Dtype::Fp64 => 8.0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::Fp8 => "fp8",
            Dtype::Fp16 => "fp16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp32 => "fp32",
            Dtype::Fp64 => "fp64",
            Dtype::Int8 => "int8",
        }
    }

    /// The peak this dtype runs against, and its label (`fp32 (tf32)` when an fp32 operator
    /// beats the plain FP32 peak).
    fn peak(self, gpu: &GpuPeak, achieved_tflops: f64) -> Option<(f64, String)> {
        let plain = |v: f64| Some((v, self.name().to_string()));
        match self {
            Dtype::Fp16 | Dtype::Bf16 => plain(gpu.tensor16),
            Dtype::Fp8 => gpu.fp8.and_then(plain),
            Dtype::Fp64 => plain(gpu.fp64),
            Dtype::Int8 => None,
            Dtype::Fp32 => match gpu.tf32 {
                Some(tf32) if achieved_tflops > gpu.fp32 * 1.05 => {
                    Some((tf32, "fp32 (tf32)".to_string()))
                }
                _ => plain(gpu.fp32),
            },
        }
    }
}

/// FLOPs and least bytes of one operator call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Work {
    pub flop: f64,
    pub bytes: Option<f64>,
    pub dtype: Option<Dtype>,
    /// True when `flop` came from a `flops` arg, false when from the shapes.
    pub counted: bool,
}

/// Operators whose FLOPs gpuq derives from their input shapes.
pub const SHAPED_OPS: &[&str] = &[
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_scaled_mm",
];

/// The work of one operator call from its name and `args` JSON, `None` when neither a
/// `flops` arg nor usable shapes are there.
pub fn work_of(op: &str, args: &str) -> Option<Work> {
    let args: Value = serde_json::from_str(args).ok()?;
    let dims: Vec<Vec<f64>> = args
        .get("Input Dims")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|d| {
                    d.as_array()
                        .map(|d| d.iter().filter_map(Value::as_f64).collect())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    let types: Vec<&str> = args
        .get("Input type")
        .and_then(Value::as_array)
        .map(|l| l.iter().map(|t| t.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    let shaped = shape_work(op, &dims, &types);
    let counted = args.get("flops").and_then(|f| {
        f.as_f64()
            .or_else(|| f.as_str().and_then(|s| s.trim().parse().ok()))
    });
    match (counted, shaped) {
        (Some(flop), shaped) if flop > 0.0 => Some(Work {
            flop,
            bytes: shaped.and_then(|s| s.bytes),
            dtype: shaped
                .and_then(|s| s.dtype)
                .or_else(|| types.iter().find_map(|t| Dtype::of(t))),
            counted: true,
        }),
        (_, shaped) => shaped.filter(|s| s.flop > 0.0),
    }
}

fn shape_work(op: &str, dims: &[Vec<f64>], types: &[&str]) -> Option<Work> {
    let size = |d: &[f64]| d.iter().product::<f64>();
    let matrix = |d: &Vec<f64>| (d.len() == 2).then(|| (d[0], d[1]));
    let batch3 = |d: &Vec<f64>| (d.len() == 3).then(|| (d[0], d[1], d[2]));
    // (flop, elements of inputs and output, index of the first matrix operand)
    let (flop, elements, operand) = match op {
        "aten::mm" | "aten::_scaled_mm" => {
            let ((m, k), (k2, n)) = (matrix(dims.first()?)?, matrix(dims.get(1)?)?);
            (k == k2).then_some(())?;
            (2.0 * m * k * n, m * k + k * n + m * n, 0)
        }
        "aten::addmm" => {
            let ((m, k), (k2, n)) = (matrix(dims.get(1)?)?, matrix(dims.get(2)?)?);
            (k == k2).then_some(())?;
            (2.0 * m * k * n, size(&dims[0]) + m * k + k * n + m * n, 1)
        }
        "aten::bmm" => {
            let ((b, m, k), (b2, k2, n)) = (batch3(dims.first()?)?, batch3(dims.get(1)?)?);
            (b == b2 && k == k2).then_some(())?;
            (2.0 * b * m * k * n, b * (m * k + k * n + m * n), 0)
        }
        "aten::baddbmm" => {
            let ((b, m, k), (b2, k2, n)) = (batch3(dims.get(1)?)?, batch3(dims.get(2)?)?);
            (b == b2 && k == k2).then_some(())?;
            (
                2.0 * b * m * k * n,
                size(&dims[0]) + b * (m * k + k * n + m * n),
                1,
            )
        }
        "aten::linear" => {
            let x = dims.first()?;
            let (n, k) = matrix(dims.get(1)?)?;
            (x.last() == Some(&k)).then_some(())?;
            let rows = size(&x[..x.len() - 1]);
            let bias = dims.get(2).map_or(0.0, |b| size(b));
            (2.0 * rows * k * n, size(x) + n * k + bias + rows * n, 0)
        }
        "aten::matmul" => {
            // Only x[.., K] @ w[K, N]; batched-by-batched products run as bmm inside.
            let x = dims.first()?;
            let (k, n) = matrix(dims.get(1)?)?;
            (x.len() >= 2 && x.last() == Some(&k)).then_some(())?;
            let rows = size(&x[..x.len() - 1]);
            (2.0 * rows * k * n, size(x) + k * n + rows * n, 0)
        }
        _ => return None,
    };
    let dtype = types.get(operand).and_then(|t| Dtype::of(t));
    let bytes = dtype.map(|d| {
        if op == "aten::_scaled_mm" {
            // fp8 operands, a 16-bit result.
            let (m, n) = (dims[0][0], dims[1][1]);
            (elements - m * n) * d.bytes() + m * n * 2.0
        } else {
            elements * d.bytes()
        }
    });
    Some(Work {
        flop,
        bytes,
        dtype,
        counted: false,
    })
}

/// One row of `roofline(run)`.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflineRow {
    pub op: String,
    pub dtype: Option<String>,
    pub gpu: Option<String>,
    pub source: &'static str,
    pub instances: i64,
    pub kernels: i64,
    pub kernel_time: i64,
    pub flop: f64,
    pub bytes: Option<f64>,
    pub tflops: f64,
    pub intensity: Option<f64>,
    pub peak_tflops: Option<f64>,
    pub peak_tbps: Option<f64>,
    pub ridge: Option<f64>,
    pub bound: Option<&'static str>,
    pub attainable_tflops: Option<f64>,
    pub pct_of_attainable: Option<f64>,
}

/// A FLOP-carrying operator call on a host thread.
struct Instance {
    name: u32,
    start: i64,
    end: i64,
    work: Work,
    /// The nearest enclosing instance on the same thread.
    parent: Option<usize>,
}

/// Instances of one host thread, by start, with their nesting.
#[derive(Default)]
struct Thread {
    instances: Vec<Instance>,
}

impl Thread {
    fn link_parents(&mut self) {
        self.instances
            .sort_by_key(|i| (i.start, std::cmp::Reverse(i.end)));
        let mut open: Vec<usize> = Vec::new();
        for i in 0..self.instances.len() {
            let start = self.instances[i].start;
            while open.last().is_some_and(|&o| self.instances[o].end < start) {
                open.pop();
            }
            self.instances[i].parent = open.last().copied();
            open.push(i);
        }
    }

    /// The innermost instance whose range holds `t`.
    fn innermost(&self, t: i64) -> Option<usize> {
        let after = self.instances.partition_point(|i| i.start <= t);
        let mut at = after.checked_sub(1)?;
        loop {
            if self.instances[at].end >= t {
                return Some(at);
            }
            at = self.instances[at].parent?;
        }
    }
}

/// The rows of `roofline(run)`, by kernel time.
/// `timelines` are the run's GPU operations and `host` its launch calls.
pub async fn load(
    ctx: &SessionContext,
    run: &str,
    timelines: &Timelines,
    host: &Host,
) -> Result<Vec<RooflineRow>> {
    let mut names = Names::default();
    let shaped = SHAPED_OPS
        .iter()
        .map(|n| literal(n))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT rank, pid, tid, name, ts, ts + dur, args FROM cpu_ops \
         WHERE run = {} AND dur >= 0 AND args IS NOT NULL \
           AND (name IN ({shaped}) OR args LIKE '%\"flops\"%')",
        literal(run)
    );
    let mut threads: HashMap<(Option<i32>, Option<i64>, Option<i64>), Thread> = HashMap::new();
    for b in collect(ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (name, args) = (strings(&b, 3)?, strings(&b, 6)?);
        let (ts, end) = (ints(&b, 4)?, ints(&b, 5)?);
        for i in 0..b.num_rows() {
            let (Some(n), Some(a), Some(start), Some(end)) =
                (name[i].as_deref(), args[i].as_deref(), ts[i], end[i])
            else {
                continue;
            };
            let Some(work) = work_of(n, a) else {
                continue;
            };
            threads
                .entry((rank[i].map(|r| r as i32), pid[i], tid[i]))
                .or_default()
                .instances
                .push(Instance {
                    name: names.id(n),
                    start,
                    end,
                    work,
                    parent: None,
                });
        }
    }
    if threads.is_empty() {
        return Ok(Vec::new());
    }
    threads.values_mut().for_each(Thread::link_parents);
    let gpus = device_names(ctx, run).await?;

    // Kernel time and count per instance, and the GPU it ran on.
    let mut per_instance: HashMap<
        (Option<i32>, Option<i64>, Option<i64>, usize),
        (i64, i64, Option<String>),
    > = HashMap::new();
    for (key, ops) in &timelines.devices {
        for o in ops.iter().filter(|o| o.class == OpClass::Compute) {
            let Some(call) = host.launch(key, o.correlation) else {
                continue;
            };
            let thread_key = (call.rank, call.pid, call.tid);
            let Some(at) = threads
                .get(&thread_key)
                .and_then(|t| t.innermost(call.start))
            else {
                continue;
            };
            let entry = per_instance
                .entry((call.rank, call.pid, call.tid, at))
                .or_insert_with(|| (0, 0, gpu_name(&gpus, key)));
            entry.0 += o.end - o.start;
            entry.1 += 1;
        }
    }

    // Summed per (operator, dtype, GPU).
    #[derive(Default)]
    struct Sum {
        instances: i64,
        kernels: i64,
        kernel_time: i64,
        flop: f64,
        bytes: Option<f64>,
        all_bytes: bool,
        counted: bool,
    }
    let mut sums: BTreeMap<(String, Option<Dtype>, Option<String>), Sum> = BTreeMap::new();
    for ((rank, pid, tid, at), (time, kernels, gpu)) in per_instance {
        let inst = &threads[&(rank, pid, tid)].instances[at];
        let key = (names.get(inst.name).to_string(), inst.work.dtype, gpu);
        let s = sums.entry(key).or_insert_with(|| Sum {
            all_bytes: true,
            ..Default::default()
        });
        s.instances += 1;
        s.kernels += kernels;
        s.kernel_time += time;
        s.flop += inst.work.flop;
        match inst.work.bytes {
            Some(b) => *s.bytes.get_or_insert(0.0) += b,
            None => s.all_bytes = false,
        }
        s.counted |= inst.work.counted;
    }
    let mut rows: Vec<RooflineRow> = sums
        .into_iter()
        .filter(|(_, s)| s.kernel_time > 0)
        .map(|((op, dtype, gpu), s)| {
            let tflops = s.flop / s.kernel_time as f64 / 1e3;
            let bytes = s.bytes.filter(|_| s.all_bytes);
            let intensity = bytes.filter(|b| *b > 0.0).map(|b| s.flop / b);
            let peak = gpu.as_deref().and_then(gpu_peak);
            let dtype_peak = match (dtype, peak) {
                (Some(d), Some(p)) => d.peak(&p, tflops).map(|(v, label)| (v, label, p.tbps)),
                _ => None,
            };
            let label = dtype_peak
                .as_ref()
                .map(|(_, l, _)| l.clone())
                .or_else(|| dtype.map(|d| d.name().to_string()));
            let ridge = dtype_peak.as_ref().map(|(v, _, bw)| v / bw);
            let bound = match (intensity, ridge) {
                (Some(i), Some(r)) => Some(if i >= r { "compute" } else { "memory" }),
                _ => None,
            };
            let attainable = match (&dtype_peak, intensity) {
                (Some((v, _, bw)), Some(i)) => Some(v.min(i * bw)),
                _ => None,
            };
            RooflineRow {
                op,
                dtype: label,
                gpu: peak.map(|p| p.model.to_string()).or(gpu),
                source: if s.counted { "flops" } else { "shapes" },
                instances: s.instances,
                kernels: s.kernels,
                kernel_time: s.kernel_time,
                flop: s.flop,
                bytes,
                tflops,
                intensity,
                peak_tflops: dtype_peak.as_ref().map(|p| p.0),
                peak_tbps: dtype_peak.as_ref().map(|p| p.2),
                ridge,
                bound,
                attainable_tflops: attainable,
                pct_of_attainable: attainable.map(|a| 100.0 * tflops / a),
            }
        })
        .collect();
    rows.sort_by(|a, b| b.kernel_time.cmp(&a.kernel_time).then(a.op.cmp(&b.op)));
    Ok(rows)
}

/// Why `roofline(run)` (in `scope`) has no row, or rows without a verdict, and how to fix it:
/// one sentence per reason, none when every row has a bound. A table cannot carry a note, so
/// `gpuq roofline` prints these after an empty or verdict-less table.
pub async fn notes(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<String>> {
    let mut timelines = Timelines::load(ctx, run, false).await?;
    scope.restrict(&mut timelines);
    let host = Host::load(ctx, run, &mut Names::default()).await?;
    let rows = load(ctx, run, &timelines, &host).await?;
    let mut notes = Vec::new();
    if rows.is_empty() {
        let count = |sql: String| async move {
            let b = collect(ctx, &sql).await?;
            Ok::<i64, datafusion::error::DataFusionError>(
                b.first()
                    .and_then(|b| ints(b, 0).ok()?.first().copied().flatten())
                    .unwrap_or(0),
            )
        };
        let run_lit = literal(run);
        let ops = count(format!(
            "SELECT count(*) FROM cpu_ops WHERE run = {run_lit}"
        ))
        .await?;
        let shaped = count(format!(
            "SELECT count(*) FROM cpu_ops WHERE run = {run_lit} AND args LIKE '%\"Input Dims\"%'"
        ))
        .await?;
        let kernels: usize = timelines.devices.iter().map(|(_, ops)| ops.len()).sum();
        notes.push(if kernels == 0 {
            "roofline is empty: the run (or step range) has no GPU kernels.".to_string()
        } else if ops == 0 {
            "roofline is empty: the run has no PyTorch operator rows (cpu_op), so no FLOPs are \
             known. Rate GEMMs from a Kineto trace recorded with \
             torch.profiler.profile(record_shapes=True)."
                .to_string()
        } else if shaped == 0 {
            "roofline is empty: the trace has no input shapes (`Input Dims`), so no FLOPs are \
             known. Profile with torch.profiler.profile(record_shapes=True) (or with_flops=True)."
                .to_string()
        } else {
            format!(
                "roofline is empty: no operator with known FLOPs launched a kernel in the trace \
                 (rated: {}; a `flops` arg counts for any operator).",
                SHAPED_OPS.join(", ")
            )
        });
    }
    let mut unknown: Vec<String> = rows
        .iter()
        .filter(|r| r.peak_tflops.is_none())
        .map(|r| r.gpu.clone().unwrap_or_default())
        .collect();
    unknown.sort();
    unknown.dedup();
    for gpu in unknown {
        notes.push(if gpu.is_empty() {
            "GPU model unknown: the trace does not name the GPU (no deviceProperties entry for \
             its device), so rows have no peak and no bound. Profile with a PyTorch that writes \
             deviceProperties."
                .to_string()
        } else {
            format!(
                "GPU model unknown: no datasheet peak for {gpu:?}, so its rows have no peak and \
                 no bound (peaks are known for V100, A100, H100, H200, B200, MI250, MI250X, \
                 MI300X, RTX 3080)."
            )
        });
    }
    Ok(notes)
}

/// GPU names of a run by (rank, device id), from the `runs` table.
async fn device_names(
    ctx: &SessionContext,
    run: &str,
) -> Result<HashMap<(Option<i32>, i32), String>> {
    let sql = format!("SELECT devices FROM runs WHERE run = {}", literal(run));
    let mut out = HashMap::new();
    for b in collect(ctx, &sql).await? {
        for text in strings(&b, 0)?.into_iter().flatten() {
            let list: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            for d in list.as_array().into_iter().flatten() {
                let (Some(id), Some(name)) = (d["id"].as_i64(), d["name"].as_str()) else {
                    continue;
                };
                if !name.is_empty() {
                    let rank = d["rank"].as_i64().map(|r| r as i32);
                    out.insert((rank, id as i32), name.to_string());
                }
            }
        }
    }
    Ok(out)
}

fn gpu_name(gpus: &HashMap<(Option<i32>, i32), String>, key: &DeviceKey) -> Option<String> {
    let device = key.device?;
    gpus.get(&(key.rank, device))
        .or_else(|| gpus.get(&(None, device)))
        .cloned()
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let mut timelines = Timelines::load(&ctx, &call.run, false).await?;
    scope.restrict(&mut timelines);
    let host = Host::load(&ctx, &call.run, &mut Names::default()).await?;
    let rows = load(&ctx, &call.run, &timelines, &host).await?;
    let f = |get: fn(&RooflineRow) -> Option<f64>| -> ArrayRef {
        Arc::new(Float64Array::from(rows.iter().map(get).collect::<Vec<_>>()))
    };
    let s = |get: fn(&RooflineRow) -> Option<&str>| -> ArrayRef {
        Arc::new(StringArray::from(rows.iter().map(get).collect::<Vec<_>>()))
    };
    let i = |get: fn(&RooflineRow) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(get)))
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        s(|r| Some(r.op.as_str())),
        s(|r| r.dtype.as_deref()),
        s(|r| r.gpu.as_deref()),
        s(|r| Some(r.source)),
        i(|r| r.instances),
        i(|r| r.kernels),
        i(|r| r.kernel_time),
        f(|r| Some(r.flop)),
        f(|r| r.bytes),
        f(|r| Some(r.tflops)),
        f(|r| r.intensity),
        f(|r| r.peak_tflops),
        f(|r| r.peak_tbps),
        f(|r| r.ridge),
        s(|r| r.bound),
        f(|r| r.attainable_tflops),
        f(|r| r.pct_of_attainable),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_work_follows_pytorchs_formulas() {
        let w = work_of(
            "aten::addmm",
            r#"{"Input Dims": [[1024], [8944, 1024], [1024, 1024], [], []], "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]}"#,
        )
        .unwrap();
        assert_eq!(w.flop, 2.0 * 8944.0 * 1024.0 * 1024.0);
        let elements = 1024.0 + 8944.0 * 1024.0 + 1024.0 * 1024.0 + 8944.0 * 1024.0;
        assert_eq!(w.bytes, Some(elements * 2.0));
        assert_eq!(w.dtype, Some(Dtype::Bf16));
        assert!(!w.counted);
        let w = work_of(
            "aten::bmm",
            r#"{"Input Dims": [[8, 64, 32], [8, 32, 16]], "Input type": ["float", "float"]}"#,
        )
        .unwrap();
        assert_eq!(w.flop, 2.0 * 8.0 * 64.0 * 32.0 * 16.0);
        assert_eq!(
            w.bytes,
            Some(8.0 * (64.0 * 32.0 + 32.0 * 16.0 + 64.0 * 16.0) * 4.0)
        );
        let w = work_of(
            "aten::linear",
            r#"{"Input Dims": [[16, 559, 1024], [4096, 1024], [4096]], "Input type": ["c10::Half", "c10::Half", "c10::Half"]}"#,
        )
        .unwrap();
        assert_eq!(w.flop, 2.0 * 16.0 * 559.0 * 1024.0 * 4096.0);
        assert_eq!(w.dtype, Some(Dtype::Fp16));
        // A `flops` arg wins over the shapes; shapes still give the bytes.
        let w = work_of(
            "aten::mm",
            r#"{"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"], "flops": 100}"#,
        )
        .unwrap();
        assert_eq!(
            (w.flop, w.bytes, w.counted),
            (100.0, Some((32.0 + 16.0 + 8.0) * 4.0), true)
        );
        let conv = work_of(
            "aten::conv2d",
            r#"{"flops": 5e9, "Input type": ["c10::BFloat16"]}"#,
        )
        .unwrap();
        assert_eq!(
            (conv.flop, conv.bytes, conv.dtype),
            (5e9, None, Some(Dtype::Bf16))
        );
        // Mismatched inner dimensions, missing shapes, other operators: nothing.
        assert!(work_of(
            "aten::mm",
            r#"{"Input Dims": [[4, 8], [9, 2]], "Input type": ["float", "float"]}"#
        )
        .is_none());
        assert!(work_of("aten::mm", r#"{"External id": 3}"#).is_none());
        assert!(work_of("aten::relu", r#"{"Input Dims": [[4, 8]]}"#).is_none());
        assert!(work_of("aten::mm", "not json").is_none());
    }

    #[test]
    fn peaks_match_device_names_most_specific_first() {
        assert_eq!(gpu_peak("NVIDIA H100 80GB HBM3").unwrap().model, "H100 SXM");
        assert_eq!(gpu_peak("NVIDIA H100 PCIe").unwrap().model, "H100 PCIe");
        assert_eq!(
            gpu_peak("NVIDIA A100-SXM4-80GB").unwrap().model,
            "A100 80GB SXM"
        );
        assert_eq!(
            gpu_peak("NVIDIA A100-SXM4-40GB").unwrap().model,
            "A100 40GB"
        );
        assert_eq!(gpu_peak("Tesla V100-SXM2-16GB").unwrap().model, "V100 SXM2");
        assert_eq!(gpu_peak("AMD Instinct MI300X").unwrap().model, "MI300X");
        assert_eq!(gpu_peak("NVIDIA B200").unwrap().model, "B200");
        assert!(gpu_peak("AMD Radeon Graphics").is_none());
        // fp32 faster than the plain FP32 peak is TF32.
        let h100 = gpu_peak("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(
            Dtype::Fp32.peak(&h100, 30.0),
            Some((66.9, "fp32".to_string()))
        );
        assert_eq!(
            Dtype::Fp32.peak(&h100, 200.0),
            Some((494.7, "fp32 (tf32)".to_string()))
        );
    }

    #[test]
    fn innermost_instance_by_nesting() {
        let work = Work {
            flop: 1.0,
            bytes: None,
            dtype: None,
            counted: false,
        };
        let inst = |name, start, end| Instance {
            name,
            start,
            end,
            work,
            parent: None,
        };
        // linear [0, 100] holds addmm [10, 50]; a sibling mm [60, 70]; then mm [200, 210].
        let mut t = Thread {
            instances: vec![
                inst(3, 200, 210),
                inst(1, 10, 50),
                inst(0, 0, 100),
                inst(2, 60, 70),
            ],
        };
        t.link_parents();
        let name_at = |ts| t.innermost(ts).map(|i| t.instances[i].name);
        assert_eq!(name_at(20), Some(1));
        assert_eq!(name_at(55), Some(0), "between the children: the linear");
        assert_eq!(name_at(65), Some(2));
        assert_eq!(name_at(150), None);
        assert_eq!(name_at(205), Some(3));
        assert_eq!(name_at(-5), None);
    }
}
