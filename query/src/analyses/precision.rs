//! `precision(run [, steps])`: the numeric precision each kernel ran in, and the GPU time per
//! precision, so "is anything still in FP32?" has an answer.
//!
//! A kernel's precision comes from what ran first, then from what was asked for:
//! 1. **its name** (`source = 'kernel'`): cuBLAS/CUTLASS type tags (`bf16bf16_bf16f32`,
//!    `f32f32_tf32f32`, `sgemm`, `h884gemm`), NCCL's (`_bf16_`, `_f32_`), MIOpen's (`_half`),
//!    and the C++ template arguments of PyTorch's and other libraries' kernels (`<c10::BFloat16>`,
//!    `<float>`, `c10::Float8_e4m3fn`). A name with several types counts as its narrowest one:
//!    `bf16bf16_bf16f32_f32` computes in bf16 and accumulates in f32; a cast `bf16 <- float`
//!    counts as bf16.
//! 2. **its operator's inputs** (`source = 'operator'`): the narrowest floating-point type among
//!    the `Input type`s of the innermost operator around its launch call that has one (PyTorch
//!    records them with `record_shapes=True`).
//!
//! NCCL/RCCL kernels of collectives that do not reduce move bytes as `int8_t` whatever the data
//! is; that is not their precision, so they take their operator's. Otherwise `dtype` is NULL. Precisions, narrowest first: `fp8`, `int8`, `bf16`, `fp16`,
//! `tf32`, `fp32`, `fp64`. Columns per (kernel name, dtype): `class`, `dtype`, `source`, `op`
//! (the operator with most of its time), `gpu_time`, `kernels`, `share` (% of the run's kernel
//! time); by `gpu_time`. With a step range the kernels that start in those steps count.
//!
//! ```sql
//! SELECT dtype, fmt_dur(sum(gpu_time)), round(sum(share), 1) FROM precision('r') GROUP BY dtype;
//! ```

use super::data::{collect, ints, launches_by_thread, strings, Names, Scope, Thread};
use super::{batch, literal, Call, Spec};
use crate::functions::kernel_class::kernel_class;
use datafusion::arrow::array::{ArrayRef, Float64Array, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::HashMap;
use std::sync::Arc;

pub static PRECISION: Spec =
    Spec::of_run("precision", schema, |ctx, call| compute(ctx, call).boxed());

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("run", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("class", DataType::Utf8, false),
        Field::new("dtype", DataType::Utf8, true),
        Field::new("source", DataType::Utf8, true),
        Field::new("op", DataType::Utf8, true),
        Field::new("gpu_time", DataType::Int64, false),
        Field::new("kernels", DataType::Int64, false),
        Field::new("share", DataType::Float64, false),
    ]))
}

/// A numeric precision, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Precision {
    Fp8,
    Int8,
    Bf16,
    Fp16,
    Tf32,
    Fp32,
    Fp64,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp8 => "fp8",
            Precision::Int8 => "int8",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Tf32 => "tf32",
            Precision::Fp32 => "fp32",
            Precision::Fp64 => "fp64",
        }
    }

    /// The precision of one of PyTorch's `Input type` names (floating-point types only: an
    /// index or mask input says nothing about the arithmetic).
    pub fn of_input_type(t: &str) -> Option<Precision> {
        Some(match t {
            "c10::BFloat16" => Precision::Bf16,
            "c10::Half" => Precision::Fp16,
            "float" => Precision::Fp32,
            "double" => Precision::Fp64,
            t if t.starts_with("c10::Float8") => Precision::Fp8,
            _ => return None,
        })
    }
}

/// Tags inside a word of a kernel name (lower case), and the precision each says.
const TAGS: &[(&str, Precision)] = &[
    ("float8", Precision::Fp8),
    ("fp8", Precision::Fp8),
    ("e4m3", Precision::Fp8),
    ("e5m2", Precision::Fp8),
    ("int8", Precision::Int8),
    ("imma", Precision::Int8),
    ("bfloat16", Precision::Bf16),
    ("bf16", Precision::Bf16),
    ("fp16", Precision::Fp16),
    ("half", Precision::Fp16),
    ("hgemm", Precision::Fp16),
    ("h884", Precision::Fp16),
    ("h1688", Precision::Fp16),
    ("h16816", Precision::Fp16),
    ("tf32", Precision::Tf32),
    ("fp32", Precision::Fp32),
    ("sgemm", Precision::Fp32),
    ("fp64", Precision::Fp64),
    ("dgemm", Precision::Fp64),
];

/// The precision a kernel name states, its narrowest when it states several.
pub fn precision_of_kernel(name: &str) -> Option<Precision> {
    let lower = name.to_ascii_lowercase();
    let mut best: Option<Precision> = None;
    let mut take = |p: Precision| best = Some(best.map_or(p, |b| b.min(p)));
    for word in lower.split(|c: char| !c.is_ascii_alphanumeric()) {
        match word {
            "float" => take(Precision::Fp32),
            "double" => take(Precision::Fp64),
            _ => {}
        }
        for (tag, p) in TAGS {
            if word.contains(tag) {
                take(*p);
            }
        }
        // cuBLAS/CUTLASS and NCCL spell types as f16 / f32 / f64 / i8 inside words
        // (`bf16f32`, `_f32_`): f16 not part of bf16.
        let bytes = word.as_bytes();
        for (at, _) in word.match_indices('f') {
            let prev = at.checked_sub(1).map(|i| bytes[i]);
            let rest = &word[at + 1..];
            let digits = |d: &str| {
                rest.starts_with(d) && !rest[d.len()..].starts_with(|c: char| c.is_ascii_digit())
            };
            if digits("16") && prev != Some(b'b') {
                take(Precision::Fp16);
            } else if digits("32") && prev != Some(b't') {
                take(Precision::Fp32);
            } else if digits("64") {
                take(Precision::Fp64);
            }
        }
        if word.starts_with("i8") || word.contains("_i8") || word == "s8" {
            take(Precision::Int8);
        }
    }
    // NCCL and RCCL move the bytes of collectives that do not reduce (send/recv, broadcast,
    // all-gather) as int8 whatever the data is: `ncclKernel_Broadcast_RING_LL_Sum_int8_t`
    // broadcasts floats. Their int8 is the wire, not the precision.
    if best == Some(Precision::Int8) && (lower.contains("nccl") || lower.contains("rccl")) {
        return None;
    }
    best
}

/// The narrowest floating-point precision among an operator's `Input type`s (its `args`).
pub fn precision_of_inputs(args: &str) -> Option<Precision> {
    let v: serde_json::Value = serde_json::from_str(args).ok()?;
    v.get("Input type")?
        .as_array()?
        .iter()
        .filter_map(|t| t.as_str().and_then(Precision::of_input_type))
        .min()
}

/// For each span (in the order given), the innermost of `ranges` (sorted by start, then
/// longest first) that holds it, as an index into `ranges`.
pub fn innermost_holding(ranges: &[(i64, i64)], spans: &[(i64, i64)]) -> Vec<Option<usize>> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].0);
    let mut out = vec![None; spans.len()];
    let mut open: Vec<usize> = Vec::new();
    let mut next = 0;
    for i in order {
        let (s, e) = spans[i];
        while next < ranges.len() && ranges[next].0 <= s {
            open.push(next);
            next += 1;
        }
        open.retain(|&r| ranges[r].1 >= s);
        out[i] = open
            .iter()
            .rev()
            .copied()
            .find(|&r| ranges[r].0 <= s && e <= ranges[r].1);
    }
    out
}

/// Per (kernel name, precision, source).
#[derive(Default)]
struct Row {
    time: i64,
    kernels: i64,
    by_op: HashMap<u32, i64>,
}

type Key = (u32, Option<Precision>, Option<&'static str>);

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope: Scope = call.scope(&ctx).await?;
    let mut names = Names::default();
    // Operators with floating-point inputs, by thread: (start, end, name, precision).
    let mut ops: HashMap<Thread, Vec<(i64, i64, u32, Precision)>> = HashMap::new();
    let sql = format!(
        "SELECT rank, pid, tid, name, ts, ts + dur, args FROM events WHERE run = {} \
         AND kind = 'cpu_op' AND dur >= 0 AND args LIKE '%Input type%'",
        literal(&call.run)
    );
    for b in collect(&ctx, &sql).await? {
        let (rank, pid, tid) = (ints(&b, 0)?, ints(&b, 1)?, ints(&b, 2)?);
        let (name, ts, end, args) = (strings(&b, 3)?, ints(&b, 4)?, ints(&b, 5)?, strings(&b, 6)?);
        for i in 0..b.num_rows() {
            let (Some(s), Some(e), Some(args)) = (ts[i], end[i], args[i].as_deref()) else {
                continue;
            };
            let Some(p) = precision_of_inputs(args) else {
                continue;
            };
            let name = names.id(name[i].as_deref().unwrap_or(""));
            ops.entry((rank[i].map(|r| r as i32), pid[i], tid[i]))
                .or_default()
                .push((s, e, name, p));
        }
    }
    let mut kernel_precision: HashMap<u32, Option<Precision>> = HashMap::new();
    let mut rows: HashMap<Key, Row> = HashMap::new();
    let mut total = 0i64;
    let mut add =
        |names: &Names, kernel: u32, start: i64, dur: i64, rank, op: Option<(u32, Precision)>| {
            if scope
                .window(rank)
                .is_some_and(|(lo, hi)| start < lo || start >= hi)
            {
                return;
            }
            let by_name = *kernel_precision
                .entry(kernel)
                .or_insert_with(|| precision_of_kernel(names.get(kernel)));
            let (precision, source) = match (by_name, op) {
                (Some(p), _) => (Some(p), Some("kernel")),
                (None, Some((_, p))) => (Some(p), Some("operator")),
                (None, None) => (None, None),
            };
            let row = rows.entry((kernel, precision, source)).or_default();
            row.time += dur;
            row.kernels += 1;
            if let Some((op, _)) = op {
                *row.by_op.entry(op).or_default() += dur;
            }
            total += dur;
        };
    let launches = launches_by_thread(&ctx, &call.run, &mut names, &["kernel"]).await?;
    for (rank, k) in &launches.unlaunched {
        add(&names, k.name, k.start, k.end - k.start, *rank, None);
    }
    for (thread, mut calls) in launches.by_thread {
        let mut thread_ops = ops.remove(&thread).unwrap_or_default();
        thread_ops.sort_by_key(|o| (o.0, std::cmp::Reverse(o.1)));
        calls.sort_by_key(|c| c.start);
        let spans: Vec<(i64, i64)> = thread_ops.iter().map(|o| (o.0, o.1)).collect();
        let held = innermost_holding(
            &spans,
            &calls.iter().map(|c| (c.start, c.end)).collect::<Vec<_>>(),
        );
        for (c, at) in calls.iter().zip(held) {
            let op = at.map(|i| (thread_ops[i].2, thread_ops[i].3));
            for k in &c.ops {
                add(&names, k.name, k.start, k.end - k.start, thread.0, op);
            }
        }
    }

    let mut rows: Vec<(Key, Row)> = rows.into_iter().collect();
    rows.sort_by(|(ka, a), (kb, b)| {
        b.time
            .cmp(&a.time)
            .then_with(|| names.get(ka.0).cmp(names.get(kb.0)))
            .then_with(|| ka.1.cmp(&kb.1))
    });
    let top_op = |r: &Row| {
        r.by_op
            .iter()
            .max_by(|a, b| {
                a.1.cmp(b.1)
                    .then_with(|| names.get(*b.0).cmp(names.get(*a.0)))
            })
            .map(|(&op, _)| names.get(op))
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(k, _)| names.get(k.0)),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(k, _)| kernel_class(names.get(k.0))),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(k, _)| k.1.map(Precision::name)),
        )),
        Arc::new(StringArray::from_iter(rows.iter().map(|(k, _)| k.2))),
        Arc::new(StringArray::from_iter(rows.iter().map(|(_, r)| top_op(r)))),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|(_, r)| r.time),
        )),
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|(_, r)| r.kernels),
        )),
        Arc::new(Float64Array::from_iter_values(rows.iter().map(|(_, r)| {
            if total > 0 {
                100.0 * r.time as f64 / total as f64
            } else {
                0.0
            }
        }))),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_byte_transport_is_no_precision() {
        assert_eq!(
            precision_of_kernel("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)"),
            None
        );
        assert_eq!(
            precision_of_kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)"),
            None
        );
        assert_eq!(
            precision_of_kernel(
                "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
            ),
            Some(Precision::Bf16)
        );
        assert_eq!(
            precision_of_kernel(
                "void cutlass::Kernel<cutlass_80_tensorop_i16832gemm_s8_128x128>(Params)"
            ),
            Some(Precision::Int8)
        );
    }
    use Precision::*;

    #[test]
    fn kernel_names_say_their_narrowest_precision() {
        let cases = [
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", Some(Bf16)),
            ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", Some(Tf32)),
            ("ampere_sgemm_128x64_nn", Some(Fp32)),
            ("volta_h884gemm_64x64_ldg8_nn", Some(Fp16)),
            ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", Some(Fp16)),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", Some(Bf16)),
            ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", Some(Fp32)),
            ("batched_transpose_16x32_half", Some(Fp16)),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", Some(Fp32)),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2> >", Some(Bf16)),
            ("void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, int, long)", Some(Fp8)),
            ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<double, at::native::MeanOps<double, double, double, double>, unsigned int, double, 4> >", Some(Fp64)),
            ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", None),
            ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >", None),
            ("Memset (Device)", None),
            ("cutlass_80_tensorop_s16816gemm_bf16_128x64_64x3_tn_align8", Some(Bf16)),
            ("sm89_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n", Some(Fp8)),
            ("void cutlass::Kernel<cutlass_75_wmma_tensorop_i8816gemm_s8_128x128_32x2_nn_align16>", Some(Int8)),
        ];
        for (name, want) in cases {
            assert_eq!(precision_of_kernel(name), want, "{name}");
        }
    }

    #[test]
    fn an_operators_precision_is_its_narrowest_floating_input() {
        let args = |t: &str| format!(r#"{{"Input Dims": [], "Input type": {t}}}"#);
        assert_eq!(
            precision_of_inputs(&args(r#"["c10::BFloat16", "float", "Scalar"]"#)),
            Some(Bf16)
        );
        assert_eq!(precision_of_inputs(&args(r#"["float", ""]"#)), Some(Fp32));
        assert_eq!(precision_of_inputs(&args(r#"["long int", "bool"]"#)), None);
        assert_eq!(precision_of_inputs(r#"{"Input Dims": []}"#), None);
        assert_eq!(precision_of_inputs("not json"), None);
    }

    #[test]
    fn a_span_is_held_by_the_innermost_range_around_it() {
        // [0,100) holds [10,50) holds [20,30); [40,60) overlaps [10,50)'s end.
        let ranges = [(0, 100), (10, 50), (20, 30), (40, 60)];
        let spans = [(21, 22), (45, 46), (45, 55), (90, 91), (200, 201), (5, 15)];
        assert_eq!(
            innermost_holding(&ranges, &spans),
            vec![Some(2), Some(3), Some(3), Some(0), None, Some(0)]
        );
    }
}
