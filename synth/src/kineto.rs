//! Deterministic synthetic PyTorch-profiler (Kineto / Chrome trace) JSON with known ground truth.
//!
//! [`write_kineto`] streams a trace shaped like a modern Kineto export (one event per line) to
//! any [`Write`], and returns a [`GroundTruth`] computed from the very integer-nanosecond values
//! that were printed. The output depends only on the [`SynthConfig`] (its own splitmix64
//! generator, no clocks, no hashing of addresses), so it is byte-identical for a given config.
//!
//! Used by tests that must run on a fresh clone (no real traces), by `gpuq demo`, and by the
//! benchmarks that need traces of a given size ([`SynthConfig::sized`]). Memory stays bounded:
//! the text goes out in chunks of a few hundred KiB, and only one step's GPU intervals are held.
//!
//! Shape of each `ProfilerStep#N` (all host events on one `pid`/`tid`):
//! a data-loader annotation; if `copies`, an H2D copy (`aten::to` > ... > `cudaMemcpyAsync` ->
//! `gpu_memcpy` on stream 20) and a memset (`aten::zero_` > `cudaMemsetAsync` -> `gpu_memset`);
//! `## forward ##` over the layers (nested `cpu_op`s, each leaf launching 1-3 kernels through
//! `cudaLaunchKernel`), a loss; `## backward ##` over the layers in reverse, with an all-reduce
//! (`record_param_comms` -> `ncclDevKernel_AllReduce...` on stream 30) half-way if `nccl`;
//! `Optimizer.step#AdamW.step` with `_foreach_*` ops; if `copies`, `aten::item` with a D2H copy;
//! and a final `cudaDeviceSynchronize`, so no GPU work crosses into the next step.
//! `python_function` events span the forward, backward and optimizer; `[memory]` instants are
//! emitted on allocation (forward GEMMs) and release (backward GEMMs).

use crate::rng::Rng;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// What to generate. See the module docs for the shape of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthConfig {
    pub seed: u64,
    /// Number of `ProfilerStep#N` ranges, numbered from `first_step`.
    pub steps: u32,
    pub first_step: u32,
    /// Per step: forward then backward over the layers, then an optimizer phase.
    pub layers: u32,
    /// GPU compute streams (ids 7, 8, ..., skipping 20 and 30); stream 20 is the copy stream.
    pub streams: u32,
    /// An H2D memcpy and a memset at the start of each step, and a D2H copy (`aten::item`) at the end.
    pub copies: bool,
    /// If set, `"distributedInfo": {"backend": "nccl", "rank": r, "world_size": w}`.
    pub rank: Option<i32>,
    pub world_size: i32,
    /// One `ncclDevKernel_AllReduce` kernel per step on stream 30, launched by `record_param_comms`.
    pub nccl: bool,
    /// `ts`/`dur` as decimal microseconds with 3 decimals (ns exact); otherwise integer
    /// microseconds, and every generated time is a multiple of 1000 ns.
    pub float_ts: bool,
    /// `Some(b)`: `"baseTimeNanoseconds": b` and `ts` relative to it; `None`: epoch microseconds.
    pub base_time_ns: Option<i64>,
    /// GPU index: the `pid` of GPU events and their `args.device`.
    pub device: i32,
    /// Host process and thread.
    pub pid: i64,
    pub tid: i64,
    /// Injected change: kernels whose name contains the text take this many percent of their
    /// normal duration (120 = 20 % slower); for comparison tests with a known answer.
    pub kernel_scale: Option<(String, u32)>,
    /// Every kernel's duration times a factor uniform in `[1 - j %, 1 + j %]`, drawn from a
    /// generator of its own (seeded by `jitter_seed`), so runs that differ only in
    /// `jitter_seed` have the same events with noisy durations: repeated runs.
    pub jitter_pct: u32,
    pub jitter_seed: u64,
    /// Each kernel takes the middle of its duration range every time (before jitter and the
    /// occasional 3x outlier), as real kernels of a fixed shape nearly do; otherwise durations
    /// are uniform over the range, far noisier than real steps.
    pub steady: bool,
}

impl SynthConfig {
    /// Two steps of three layers, one stream, integer epoch microseconds: a few hundred events.
    pub fn small() -> Self {
        SynthConfig {
            seed: 1,
            steps: 2,
            first_step: 0,
            layers: 3,
            streams: 1,
            copies: true,
            rank: None,
            world_size: 1,
            nccl: false,
            float_ts: false,
            base_time_ns: None,
            device: 0,
            pid: 4242,
            tid: 4242,
            kernel_scale: None,
            jitter_pct: 0,
            jitter_seed: 0,
            steady: false,
        }
    }

    /// Twenty steps (`ProfilerStep#5`..`#24`) of a six-layer model on two compute streams,
    /// copies, an all-reduce per step, rank 0 of 8, decimal epoch microseconds.
    pub fn demo() -> Self {
        SynthConfig {
            seed: 0x6770_7571_6465_6d6f,
            steps: 20,
            first_step: 5,
            layers: 6,
            streams: 2,
            copies: true,
            rank: Some(0),
            world_size: 8,
            nccl: true,
            float_ts: true,
            base_time_ns: None,
            device: 0,
            pid: 3_141_592,
            tid: 3_141_592,
            kernel_scale: None,
            jitter_pct: 0,
            jitter_seed: 0,
            steady: false,
        }
    }

    /// [`demo`](Self::demo) with 12 layers and as many steps as make about `target_bytes` of
    /// JSON (measured by generating one and five steps into a sink; within a few percent).
    pub fn sized(target_bytes: u64) -> Self {
        let mut c = Self::demo();
        c.layers = 12;
        let measure = |steps: u32| {
            let mut m = c.clone();
            m.steps = steps;
            write_kineto(&m, io::sink())
                .map(|g| g.bytes_written)
                .unwrap_or(0)
        };
        let (b1, b5) = (measure(1), measure(5));
        let per_step = (b5.saturating_sub(b1) / 4).max(1);
        let fixed = b1.saturating_sub(per_step);
        let steps = (target_bytes.saturating_sub(fixed) + per_step / 2) / per_step;
        c.steps = steps.clamp(1, u32::MAX as u64) as u32;
        c
    }
}

/// What [`write_kineto`] wrote, computed exactly from the printed integer-nanosecond values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroundTruth {
    /// Trace events with `ph` `X` or `i` (not `M` metadata, not `s`/`f` flows).
    pub events: u64,
    /// By canonical kind: annotation, cpu_op, runtime, kernel, memcpy, memset, instant, python.
    pub kind_counts: BTreeMap<String, u64>,
    pub kernels: u64,
    /// Exact sum of kernel `dur` in ns, by kernel name.
    pub kernel_ns_by_name: BTreeMap<String, i64>,
    pub kernel_count_by_name: BTreeMap<String, u64>,
    /// By the innermost `cpu_op` enclosing the launching `cudaLaunchKernel` call.
    pub kernel_ns_by_op: BTreeMap<String, i64>,
    /// Length of the union of kernel, memcpy and memset intervals, by device.
    pub busy_ns_by_device: BTreeMap<i32, i64>,
    /// `(step number, ts ns, dur ns)` of each `ProfilerStep#N`, absolute.
    pub steps: Vec<(u32, i64, i64)>,
    /// Earliest `ts` and latest `ts + dur` over the counted events, absolute ns (epoch-based:
    /// `us * 1000`, or `base_time_ns + relative`).
    pub first_ts_ns: i64,
    pub last_end_ns: i64,
    pub bytes_written: u64,
}

/// Write the trace described by `cfg` to `out` (streamed; no need for a `BufWriter`) and
/// return its ground truth.
pub fn write_kineto<W: Write>(cfg: &SynthConfig, out: W) -> io::Result<GroundTruth> {
    Gen::new(cfg, out).run()
}

// ---------------------------------------------------------------------------------------------
// The model: kernels and operator trees.

struct Kt {
    name: &'static str,
    regs: u32,
    smem: u32,
    grid: [u32; 3],
    block: [u32; 3],
    /// Duration range, ns.
    lo: i64,
    hi: i64,
}

const fn kt(
    name: &'static str,
    regs: u32,
    smem: u32,
    grid: [u32; 3],
    block: [u32; 3],
    lo: i64,
    hi: i64,
) -> Kt {
    Kt {
        name,
        regs,
        smem,
        grid,
        block,
        lo,
        hi,
    }
}

const US: i64 = 1000;
const MS: i64 = 1_000_000;

const GEMM_QKV: Kt = kt(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
    168, 213_248, [132, 1, 1], [384, 1, 1], 60 * US, 180 * US,
);
const GEMM_PROJ: Kt = kt(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    168, 131_072, [132, 1, 1], [256, 1, 1], 25 * US, 80 * US,
);
const GEMM_FC1: Kt = kt(
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
    128, 98_304, [264, 2, 1], [128, 1, 1], 80 * US, 240 * US,
);
const GEMM_FC2: Kt = kt(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
    168, 213_248, [132, 1, 1], [384, 1, 1], 80 * US, 230 * US,
);
const GEMM_BMM: Kt = kt(
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
    238,
    98_304,
    [16, 8, 48],
    [128, 1, 1],
    18 * US,
    60 * US,
);
const GEMM_DGRAD: Kt = kt(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
    168, 213_248, [132, 1, 1], [384, 1, 1], 50 * US, 200 * US,
);
const GEMM_WGRAD: Kt = kt(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_on_kernel__5x_cublas",
    168, 229_632, [132, 1, 1], [384, 1, 1], 60 * US, 220 * US,
);
const FLASH_FWD: Kt = kt(
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(Flash_fwd_params)",
    255, 49_152, [8, 48, 8], [128, 1, 1], 70 * US, 200 * US,
);
const FLASH_BWD_DOT: Kt = kt(
    "void flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(Flash_bwd_params)",
    40, 0, [16, 8, 48], [256, 1, 1], 8 * US, 20 * US,
);
const FLASH_BWD_MAIN: Kt = kt(
    "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, true, false, false>(Flash_bwd_params)",
    255, 147_456, [16, 8, 48], [256, 1, 1], 180 * US, 450 * US,
);
const FLASH_BWD_CONVERT: Kt = kt(
    "void flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >(Flash_bwd_params, int)",
    32, 16_384, [16, 8, 48], [256, 1, 1], 5 * US, 14 * US,
);
const LAYER_NORM: Kt = kt(
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
    32, 0, [4096, 1, 1], [128, 1, 1], 6 * US, 16 * US,
);
const LN_BWD_INPUT: Kt = kt(
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)",
    40, 0, [4096, 1, 1], [128, 1, 1], 8 * US, 22 * US,
);
const LN_BWD_GAMMA: Kt = kt(
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, float>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16*, c10::BFloat16*)",
    64, 8_448, [24, 1, 1], [32, 32, 1], 10 * US, 30 * US,
);
const SOFTMAX_FWD: Kt = kt(
    "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)",
    40, 0, [24576, 1, 1], [128, 1, 1], 20 * US, 60 * US,
);
const SOFTMAX_BWD: Kt = kt(
    "void (anonymous namespace)::softmax_warp_backward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(c10::BFloat16*, c10::BFloat16 const*, c10::BFloat16 const*, int, int, int, bool const*)",
    48, 0, [24576, 1, 1], [128, 1, 1], 25 * US, 70 * US,
);
const GELU: Kt = kt(
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)",
    28, 0, [12288, 1, 1], [128, 1, 1], 12 * US, 35 * US,
);
const GELU_BWD: Kt = kt(
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul>)",
    30, 0, [12288, 1, 1], [128, 1, 1], 16 * US, 45 * US,
);
const ADD_BF16: Kt = kt(
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    24, 0, [6144, 1, 1], [128, 1, 1], 6 * US, 18 * US,
);
const ADD_F32: Kt = kt(
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
    24, 0, [6144, 1, 1], [128, 1, 1], 4 * US, 14 * US,
);
const TRITON_ADD: Kt = kt(
    "triton_poi_fused_add_0",
    26,
    0,
    [6144, 1, 1],
    [256, 1, 1],
    5 * US,
    15 * US,
);
const TRITON_LN: Kt = kt(
    "triton_red_fused_native_layer_norm_1",
    40,
    256,
    [4096, 1, 1],
    [256, 1, 1],
    7 * US,
    18 * US,
);
const TRITON_LN_BWD: Kt = kt(
    "triton_per_fused_native_layer_norm_backward_2",
    46,
    512,
    [4096, 1, 1],
    [256, 1, 1],
    9 * US,
    24 * US,
);
const LOG_SOFTMAX: Kt = kt(
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
    40, 2_048, [4096, 1, 1], [1024, 1, 1], 60 * US, 150 * US,
);
const LOG_SOFTMAX_BWD: Kt = kt(
    "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)",
    40, 2_048, [4096, 1, 1], [1024, 1, 1], 70 * US, 170 * US,
);
const NLL_FWD: Kt = kt(
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)",
    32, 16_384, [1, 1, 1], [1024, 1, 1], 8 * US, 20 * US,
);
const NLL_BWD: Kt = kt(
    "void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, float const*, long const*, float const*, float const*, bool, int, int, long, long)",
    24, 0, [1, 1, 1], [1024, 1, 1], 4 * US, 10 * US,
);
const MTA_ADD: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::plus<float>, float)",
    32, 0, [320, 1, 1], [512, 1, 1], 10 * US, 60 * US,
);
const MTA_LERP: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::TernaryOpScalarFunctor<float, 2, 2, 0>, at::native::LerpFunctor<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::TernaryOpScalarFunctor<float, 2, 2, 0>, at::native::LerpFunctor<float>, float)",
    40, 0, [320, 1, 1], [512, 1, 1], 30 * US, 110 * US,
);
const MTA_MUL: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, float)",
    32, 0, [320, 1, 1], [512, 1, 1], 20 * US, 80 * US,
);
const MTA_ADDCMUL: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 3, 3, 0>, std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 3, 3, 0>, std::multiplies<float>, float)",
    40, 0, [320, 1, 1], [512, 1, 1], 30 * US, 120 * US,
);
const MTA_SQRT: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::UnaryOpFunctor<float, 2, 1, 1>, at::native::Sqrt<float> >(at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::UnaryOpFunctor<float, 2, 1, 1>, at::native::Sqrt<float>)",
    32, 0, [320, 1, 1], [512, 1, 1], 20 * US, 90 * US,
);
const MTA_ADDCDIV: Kt = kt(
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 3, 3, 0>, std::divides<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 3, 3, 0>, std::divides<float>, float)",
    40, 0, [320, 1, 1], [512, 1, 1], 30 * US, 120 * US,
);
const NCCL_ALLREDUCE: Kt = kt(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    96,
    0,
    [24, 1, 1],
    [544, 1, 1],
    800 * US,
    3 * MS,
);

/// What a leaf does besides launching kernels.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Special {
    None,
    /// `cudaMemcpyAsync` -> `Memcpy HtoD` on the copy stream.
    H2d,
    /// `cudaMemsetAsync` -> `Memset (Device)` on the main stream.
    Memset,
    /// `cudaMemcpyAsync` -> `Memcpy DtoH` on the main stream, then `cudaStreamSynchronize`.
    D2h,
    /// The all-reduce kernel on the NCCL stream.
    Nccl,
}

/// A `cpu_op`: a leaf launches `kernels` (each 1..=`reps` times), a node runs `children`.
struct Op {
    name: &'static str,
    kernels: &'static [&'static Kt],
    children: &'static [Op],
    reps: u32,
    /// +1: a `[memory]` allocation after the launches, -1: a release.
    mem: i8,
    special: Special,
}

impl Op {
    const LEAF: Op = Op {
        name: "",
        kernels: &[],
        children: &[],
        reps: 1,
        mem: 0,
        special: Special::None,
    };
}

macro_rules! leaf {
    ($name:expr, [$($k:expr),*] $(, $f:ident = $v:expr)*) => {
        Op { name: $name, kernels: &[$(&$k),*], $($f: $v,)* ..Op::LEAF }
    };
}
macro_rules! node {
    ($name:expr, [$($c:expr),* $(,)?]) => {
        Op { name: $name, children: &[$($c),*], ..Op::LEAF }
    };
}

const FWD_LN: Op = node!(
    "aten::layer_norm",
    [leaf!("aten::native_layer_norm", [LAYER_NORM])]
);
const FWD_QKV: Op = node!(
    "aten::linear",
    [
        node!("aten::t", [leaf!("aten::transpose", [])]),
        leaf!("aten::addmm", [GEMM_QKV], mem = 1)
    ]
);
const FWD_FLASH: Op = node!(
    "aten::scaled_dot_product_attention",
    [node!(
        "aten::_scaled_dot_product_flash_attention",
        [leaf!("aten::_flash_attention_forward", [FLASH_FWD])]
    )]
);
const FWD_BMM: Op = node!("aten::matmul", [leaf!("aten::bmm", [GEMM_BMM])]);
const FWD_SOFTMAX: Op = node!("aten::softmax", [leaf!("aten::_softmax", [SOFTMAX_FWD])]);
const FWD_PROJ: Op = node!("aten::linear", [leaf!("aten::addmm", [GEMM_PROJ], mem = 1)]);
const FWD_RESID: Op = leaf!("aten::add", [ADD_BF16]);
const FWD_FC1: Op = node!("aten::linear", [leaf!("aten::addmm", [GEMM_FC1], mem = 1)]);
const FWD_GELU: Op = leaf!("aten::gelu", [GELU]);
const FWD_FC2: Op = node!("aten::linear", [leaf!("aten::addmm", [GEMM_FC2], mem = 1)]);
const FWD_COMPILED: Op = leaf!("CompiledFunction", [TRITON_ADD, TRITON_LN]);

/// Layers alternate between flash attention and eager attention plus a compiled region.
const LAYER_FWD: [&[Op]; 2] = [
    &[
        FWD_LN, FWD_QKV, FWD_FLASH, FWD_PROJ, FWD_RESID, FWD_LN, FWD_FC1, FWD_GELU, FWD_FC2,
        FWD_RESID,
    ],
    &[
        FWD_LN,
        FWD_QKV,
        FWD_BMM,
        FWD_SOFTMAX,
        FWD_BMM,
        FWD_PROJ,
        FWD_RESID,
        FWD_LN,
        FWD_FC1,
        FWD_GELU,
        FWD_FC2,
        FWD_COMPILED,
    ],
];

const LOSS: [Op; 1] = [node!(
    "aten::cross_entropy_loss",
    [
        node!(
            "aten::log_softmax",
            [leaf!("aten::_log_softmax", [LOG_SOFTMAX])]
        ),
        node!(
            "aten::nll_loss_nd",
            [node!(
                "aten::nll_loss",
                [leaf!("aten::nll_loss_forward", [NLL_FWD])]
            )]
        ),
    ]
)];

const BWD_ADDMM: Op = node!(
    "autograd::engine::evaluate_function: AddmmBackward0",
    [node!(
        "AddmmBackward0",
        [
            leaf!("aten::mm", [GEMM_DGRAD], mem = -1),
            node!("aten::t", [leaf!("aten::transpose", [])]),
            leaf!("aten::mm", [GEMM_WGRAD])
        ]
    )]
);
const BWD_GELU: Op = node!(
    "autograd::engine::evaluate_function: GeluBackward0",
    [node!(
        "GeluBackward0",
        [leaf!("aten::gelu_backward", [GELU_BWD])]
    )]
);
const BWD_LN: Op = node!(
    "autograd::engine::evaluate_function: NativeLayerNormBackward0",
    [node!(
        "NativeLayerNormBackward0",
        [leaf!(
            "aten::native_layer_norm_backward",
            [LN_BWD_INPUT, LN_BWD_GAMMA]
        )]
    )]
);
const BWD_FLASH: Op = node!(
    "autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0",
    [node!(
        "ScaledDotProductFlashAttentionBackward0",
        [node!(
            "aten::_scaled_dot_product_flash_attention_backward",
            [leaf!(
                "aten::_flash_attention_backward",
                [FLASH_BWD_DOT, FLASH_BWD_MAIN, FLASH_BWD_CONVERT]
            )]
        )]
    )]
);
const BWD_SOFTMAX: Op = node!(
    "autograd::engine::evaluate_function: SoftmaxBackward0",
    [node!(
        "SoftmaxBackward0",
        [leaf!("aten::_softmax_backward_data", [SOFTMAX_BWD])]
    )]
);
const BWD_BMM: Op = node!(
    "autograd::engine::evaluate_function: BmmBackward0",
    [node!(
        "BmmBackward0",
        [
            leaf!("aten::bmm", [GEMM_BMM]),
            leaf!("aten::bmm", [GEMM_BMM])
        ]
    )]
);
const BWD_ACC: Op = node!(
    "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
    [node!(
        "torch::autograd::AccumulateGrad",
        [leaf!("aten::add_", [ADD_F32])]
    )]
);
const BWD_COMPILED: Op = node!(
    "autograd::engine::evaluate_function: CompiledFunctionBackward",
    [leaf!("CompiledFunctionBackward", [TRITON_LN_BWD])]
);

const LAYER_BWD: [&[Op]; 2] = [
    &[
        BWD_ADDMM, BWD_GELU, BWD_ADDMM, BWD_LN, BWD_ADDMM, BWD_FLASH, BWD_ADDMM, BWD_LN, BWD_ACC,
    ],
    &[
        BWD_COMPILED,
        BWD_ADDMM,
        BWD_GELU,
        BWD_ADDMM,
        BWD_LN,
        BWD_ADDMM,
        BWD_BMM,
        BWD_SOFTMAX,
        BWD_BMM,
        BWD_ADDMM,
        BWD_LN,
        BWD_ACC,
    ],
];

const LOSS_BWD: [Op; 2] = [
    node!(
        "autograd::engine::evaluate_function: NllLossBackward0",
        [node!(
            "NllLossBackward0",
            [leaf!("aten::nll_loss_backward", [NLL_BWD])]
        )]
    ),
    node!(
        "autograd::engine::evaluate_function: LogSoftmaxBackward0",
        [node!(
            "LogSoftmaxBackward0",
            [leaf!("aten::_log_softmax_backward_data", [LOG_SOFTMAX_BWD])]
        )]
    ),
];

const OPTIMIZER: [Op; 8] = [
    leaf!("aten::_foreach_add_", [MTA_ADD], reps = 2),
    leaf!("aten::_foreach_lerp_", [MTA_LERP], reps = 3),
    leaf!("aten::_foreach_mul_", [MTA_MUL], reps = 3),
    leaf!("aten::_foreach_addcmul_", [MTA_ADDCMUL], reps = 3),
    leaf!("aten::_foreach_sqrt", [MTA_SQRT], reps = 3),
    leaf!("aten::_foreach_div_", [MTA_MUL], reps = 3),
    leaf!("aten::_foreach_add_", [MTA_ADD], reps = 3),
    leaf!("aten::_foreach_addcdiv_", [MTA_ADDCDIV], reps = 3),
];

const H2D: Op = node!(
    "aten::to",
    [node!(
        "aten::_to_copy",
        [leaf!("aten::copy_", [], special = Special::H2d)]
    )]
);
const ZEROS: Op = node!(
    "aten::zeros",
    [
        leaf!("aten::empty", []),
        leaf!("aten::zero_", [], special = Special::Memset)
    ]
);
const ITEM: Op = node!(
    "aten::item",
    [leaf!(
        "aten::_local_scalar_dense",
        [],
        special = Special::D2h
    )]
);
const ALLREDUCE: Op = node!(
    "c10d::allreduce_",
    [leaf!("record_param_comms", [], special = Special::Nccl)]
);

// ---------------------------------------------------------------------------------------------
// The generator.

const K_ANNOTATION: usize = 0;
const K_CPU_OP: usize = 1;
const K_RUNTIME: usize = 2;
const K_KERNEL: usize = 3;
const K_MEMCPY: usize = 4;
const K_MEMSET: usize = 5;
const K_INSTANT: usize = 6;
const K_PYTHON: usize = 7;
const KIND_NAMES: [&str; 8] = [
    "annotation",
    "cpu_op",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "instant",
    "python",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cat {
    Annotation,
    CpuOp,
    Python,
}

struct Scope {
    cat: Cat,
    name: &'static str,
    /// `ProfilerStep#N`.
    step: Option<u32>,
    ts: i64,
    ext: u64,
    seq: Option<u64>,
    backward: bool,
    comms: bool,
    py_parent: u64,
}

enum Gpu {
    Kernel(&'static Kt),
    Memcpy { name: &'static str, bytes: u64 },
    Memset { bytes: u64 },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Other,
    Forward,
    Backward,
}

const FLUSH_BYTES: usize = 256 << 10;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

struct Gen<'c, W: Write> {
    cfg: &'c SynthConfig,
    rng: Rng,
    /// Only for `jitter_pct`, so that jitter leaves every other draw unchanged.
    jitter: Rng,
    out: W,
    buf: Vec<u8>,
    written: u64,
    err: Option<io::Error>,
    first_event: bool,
    float: bool,
    /// Subtracted from absolute ns before printing: `base_time_ns`, or 0 for epoch time.
    base: i64,
    /// Host clock, absolute ns.
    t: i64,
    stack: Vec<Scope>,
    phase: Phase,
    ext_id: u64,
    seq: u64,
    corr: u64,
    py_id: u64,
    /// Stream ids: compute streams, then the copy stream, then the NCCL stream.
    stream_ids: Vec<i64>,
    stream_free: Vec<i64>,
    n_compute: usize,
    nccl_end: i64,
    /// GPU intervals of the current step (all end before the step's final synchronize).
    intervals: Vec<(i64, i64)>,
    busy: i64,
    // Memory model.
    allocated: u64,
    reserved: u64,
    live: Vec<(u64, u64)>,
    next_addr: u64,
    // Ground truth.
    events: u64,
    kinds: [u64; 8],
    kernels: u64,
    by_name: BTreeMap<&'static str, (i64, u64)>,
    by_op: BTreeMap<&'static str, i64>,
    steps: Vec<(u32, i64, i64)>,
    first_ts: i64,
    last_end: i64,
}

impl<'c, W: Write> Gen<'c, W> {
    fn new(cfg: &'c SynthConfig, out: W) -> Self {
        let mut rng = Rng(cfg.seed ^ 0x5eed_6770_7571_0001);
        let float = cfg.float_ts;
        let (base, origin) = match cfg.base_time_ns {
            Some(b) => {
                let rel = rng.range(1_000, 5_000) * US + if float { rng.range(0, 999) } else { 0 };
                (b, b + rel)
            }
            None => {
                let us = 1_700_000_000_000_000 + rng.below(1_000_000_000_000) as i64;
                (0, us * 1000 + if float { rng.range(0, 999) } else { 0 })
            }
        };
        let n_compute = cfg.streams.max(1) as usize;
        let mut stream_ids: Vec<i64> = (7i64..)
            .filter(|s| *s != 20 && *s != 30)
            .take(n_compute)
            .collect();
        stream_ids.push(20);
        stream_ids.push(30);
        let n_streams = stream_ids.len();
        Gen {
            cfg,
            rng,
            jitter: Rng(cfg.jitter_seed ^ 0x6a17_7e40_0000_0001),
            out,
            buf: Vec::with_capacity(FLUSH_BYTES + (64 << 10)),
            written: 0,
            err: None,
            first_event: true,
            float,
            base,
            t: origin,
            stack: Vec::with_capacity(16),
            phase: Phase::Other,
            ext_id: 0,
            seq: 0,
            corr: 1000,
            py_id: 0,
            stream_ids,
            stream_free: vec![0; n_streams],
            n_compute,
            nccl_end: 0,
            intervals: Vec::new(),
            busy: 0,
            allocated: 3 * GIB + 123 * MIB,
            reserved: 4 * GIB,
            live: Vec::new(),
            next_addr: 0x7f3a_0000_0000,
            events: 0,
            kinds: [0; 8],
            kernels: 0,
            by_name: BTreeMap::new(),
            by_op: BTreeMap::new(),
            steps: Vec::new(),
            first_ts: i64::MAX,
            last_end: i64::MIN,
        }
    }

    fn run(mut self) -> io::Result<GroundTruth> {
        self.header();
        let start = self.t;
        self.global_instant("Iteration Start: PyTorch Profiler", start);
        for i in 0..self.cfg.steps {
            self.step(self.cfg.first_step.wrapping_add(i), i == 0);
            if let Some(e) = self.err.take() {
                return Err(e);
            }
        }
        let end = self.t;
        self.global_instant("Record Window End", end);
        self.footer();
        self.flush_buf();
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        self.out.flush()?;
        self.flush_union();
        Ok(self.truth())
    }

    fn truth(&self) -> GroundTruth {
        let mut kind_counts = BTreeMap::new();
        for (k, &n) in self.kinds.iter().enumerate() {
            if n > 0 {
                kind_counts.insert(KIND_NAMES[k].to_string(), n);
            }
        }
        let mut busy = BTreeMap::new();
        busy.insert(self.cfg.device, self.busy);
        GroundTruth {
            events: self.events,
            kind_counts,
            kernels: self.kernels,
            kernel_ns_by_name: self
                .by_name
                .iter()
                .map(|(k, v)| (k.to_string(), v.0))
                .collect(),
            kernel_count_by_name: self
                .by_name
                .iter()
                .map(|(k, v)| (k.to_string(), v.1))
                .collect(),
            kernel_ns_by_op: self
                .by_op
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            busy_ns_by_device: busy,
            steps: self.steps.clone(),
            first_ts_ns: if self.events > 0 { self.first_ts } else { 0 },
            last_end_ns: if self.events > 0 { self.last_end } else { 0 },
            bytes_written: self.written,
        }
    }

    // --- time -------------------------------------------------------------------------------

    /// A generated duration: at least 1 ns, or a multiple of 1000 ns (at least 1000) when
    /// times are printed as integer microseconds.
    fn q(&self, ns: i64) -> i64 {
        if self.float {
            ns.max(1)
        } else {
            ((ns + 500) / 1000 * 1000).max(1000)
        }
    }

    /// A random generated duration in `lo..=hi` ns.
    fn rq(&mut self, lo: i64, hi: i64) -> i64 {
        let d = self.rng.range(lo, hi);
        self.q(d)
    }

    /// Advance the host clock by a random amount in `lo..=hi` ns.
    fn adv(&mut self, lo: i64, hi: i64) {
        let d = self.rng.range(lo, hi);
        self.t += self.q(d);
    }

    fn count(&mut self, kind: usize, ts: i64, end: i64) {
        self.events += 1;
        self.kinds[kind] += 1;
        self.first_ts = self.first_ts.min(ts);
        self.last_end = self.last_end.max(end);
    }

    // --- low-level text ---------------------------------------------------------------------

    fn s(&mut self, x: &str) {
        self.buf.extend_from_slice(x.as_bytes());
    }

    fn u(&mut self, mut v: u64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            i -= 1;
            tmp[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.buf.extend_from_slice(&tmp[i..]);
    }

    fn i(&mut self, v: i64) {
        if v < 0 {
            self.buf.push(b'-');
        }
        self.u(v.unsigned_abs());
    }

    /// Nanoseconds as microseconds: `"1234.567"` or, in integer mode, `"1234"`.
    fn us(&mut self, ns: i64) {
        debug_assert!(ns >= 0, "negative time {ns}");
        let ns = ns.max(0) as u64;
        self.u(ns / 1000);
        if self.float {
            let f = ns % 1000;
            self.buf.extend_from_slice(&[
                b'.',
                b'0' + (f / 100) as u8,
                b'0' + (f / 10 % 10) as u8,
                b'0' + (f % 10) as u8,
            ]);
        } else {
            debug_assert!(ns.is_multiple_of(1000), "{ns} ns is not whole microseconds");
        }
    }

    fn ts(&mut self, abs_ns: i64) {
        self.us(abs_ns - self.base);
    }

    fn sep(&mut self) {
        if self.first_event {
            self.first_event = false;
            self.s("\n  ");
        } else {
            self.s(",\n  ");
        }
    }

    fn flush_buf(&mut self) {
        if self.err.is_none() && !self.buf.is_empty() {
            match self.out.write_all(&self.buf) {
                Ok(()) => self.written += self.buf.len() as u64,
                Err(e) => self.err = Some(e),
            }
        }
        self.buf.clear();
    }

    fn maybe_flush(&mut self) {
        if self.buf.len() >= FLUSH_BYTES {
            self.flush_buf();
        }
    }

    /// `{"ph": "X", "cat": .., "name": .., "pid": .., "tid": .., "ts": .., "dur": .., "args": {`
    #[allow(clippy::too_many_arguments)]
    fn x_head(
        &mut self,
        kind: usize,
        cat: &str,
        name: &str,
        step: Option<u32>,
        pid: i64,
        tid: i64,
        ts: i64,
        dur: i64,
    ) {
        self.count(kind, ts, ts + dur);
        self.sep();
        self.s("{\"ph\": \"X\", \"cat\": \"");
        self.s(cat);
        self.s("\", \"name\": \"");
        self.s(name);
        if let Some(n) = step {
            self.u(n as u64);
        }
        self.s("\", \"pid\": ");
        self.i(pid);
        self.s(", \"tid\": ");
        self.i(tid);
        self.s(", \"ts\": ");
        self.ts(ts);
        self.s(", \"dur\": ");
        self.us(dur);
        self.s(", \"args\": {");
    }

    // --- file frame -------------------------------------------------------------------------

    fn header(&mut self) {
        let c = self.cfg;
        let mut h = String::with_capacity(1024);
        h.push_str("{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [\n    ");
        h.push_str(&format!(
            "{{\"id\": {}, \"name\": \"NVIDIA H100 80GB HBM3\", \"totalGlobalMem\": 85045395456, \"computeMajor\": 9, \
             \"computeMinor\": 0, \"maxThreadsPerBlock\": 1024, \"maxThreadsPerMultiprocessor\": 2048, \
             \"regsPerBlock\": 65536, \"regsPerMultiprocessor\": 65536, \"warpSize\": 32, \"sharedMemPerBlock\": 49152, \
             \"sharedMemPerMultiprocessor\": 233472, \"numSms\": 132, \"sharedMemPerBlockOptin\": 232448}}",
            c.device
        ));
        h.push_str("\n  ],\n");
        if let Some(r) = c.rank {
            h.push_str(&format!(
                "  \"distributedInfo\": {{\"backend\": \"nccl\", \"rank\": {r}, \"world_size\": {}}},\n",
                c.world_size
            ));
        }
        if let Some(b) = c.base_time_ns {
            h.push_str(&format!("  \"baseTimeNanoseconds\": {b},\n"));
        }
        h.push_str(
            "  \"metadata\": {\"env\": {\"HF_TOKEN\": \"hf_synthetic_secret_do_not_store\", \"PATH\": \"/usr/bin\"}},\n",
        );
        h.push_str("  \"traceEvents\": [");
        self.s(&h);
    }

    fn footer(&mut self) {
        let c = self.cfg;
        let (p, t, d) = (c.pid, c.tid, c.device);
        let mut m: Vec<String> = vec![
            format!("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {p}, \"tid\": 0, \"args\": {{\"name\": \"python3\"}}}}"),
            format!("{{\"ph\": \"M\", \"name\": \"process_labels\", \"pid\": {p}, \"tid\": 0, \"args\": {{\"labels\": \"CPU\"}}}}"),
            format!("{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {p}, \"tid\": {t}, \"args\": {{\"name\": \"thread {t} (python3)\"}}}}"),
            format!("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {d}, \"tid\": 0, \"args\": {{\"name\": \"GPU {d}\"}}}}"),
            format!("{{\"ph\": \"M\", \"name\": \"process_labels\", \"pid\": {d}, \"tid\": 0, \"args\": {{\"labels\": \"GPU {d}\"}}}}"),
        ];
        let mut used: Vec<i64> = self.stream_ids[..self.n_compute].to_vec();
        if c.copies {
            used.push(20);
        }
        if c.nccl {
            used.push(30);
        }
        for s in used {
            m.push(format!(
                "{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {d}, \"tid\": {s}, \"args\": {{\"name\": \"stream {s}\"}}}}"
            ));
        }
        for line in m {
            self.sep();
            self.s(&line);
        }
        let name = match c.rank {
            Some(r) => format!("synthetic-rank{r}.pt.trace.json"),
            None => "synthetic.pt.trace.json".to_string(),
        };
        self.s(&format!(
            "\n  ],\n  \"traceName\": \"{name}\",\n  \"displayTimeUnit\": \"ms\"\n}}\n"
        ));
    }

    /// A global instant (`"s": "g"`) on the profiler's own track, as Kineto writes them.
    fn global_instant(&mut self, name: &str, ts: i64) {
        self.count(K_INSTANT, ts, ts);
        self.sep();
        self.s("{\"ph\": \"i\", \"s\": \"g\", \"name\": \"");
        self.s(name);
        self.s("\", \"pid\": \"Traces\", \"tid\": \"PyTorch Profiler\", \"ts\": ");
        self.ts(ts);
        self.s("}");
    }

    // --- host scopes ------------------------------------------------------------------------

    fn open(&mut self, cat: Cat, name: &'static str) {
        // External id, or for python_function events the Python id.
        let ext = match cat {
            Cat::Python => {
                self.py_id += 1;
                self.py_id
            }
            _ => {
                self.ext_id += 1;
                self.ext_id
            }
        };
        let top_level_op = cat == Cat::CpuOp && !self.stack.iter().any(|s| s.cat == Cat::CpuOp);
        let seq = if top_level_op && self.phase != Phase::Other {
            self.seq += 1;
            Some(self.seq)
        } else {
            None
        };
        let py_parent = self
            .stack
            .iter()
            .rev()
            .find(|s| s.cat == Cat::Python)
            .map_or(0, |s| s.ext);
        self.stack.push(Scope {
            cat,
            name,
            step: None,
            ts: self.t,
            ext,
            seq,
            backward: self.phase == Phase::Backward,
            comms: false,
            py_parent,
        });
    }

    fn close(&mut self) {
        let sc = self.stack.pop().expect("scope stack underflow");
        let dur = self.t - sc.ts;
        let (p, t) = (self.cfg.pid, self.cfg.tid);
        match sc.cat {
            Cat::Annotation => {
                self.x_head(
                    K_ANNOTATION,
                    "user_annotation",
                    sc.name,
                    sc.step,
                    p,
                    t,
                    sc.ts,
                    dur,
                );
                self.s("\"External id\": ");
                self.u(sc.ext);
                if let Some(n) = sc.step {
                    self.steps.push((n, sc.ts, dur));
                }
            }
            Cat::CpuOp => {
                self.x_head(K_CPU_OP, "cpu_op", sc.name, None, p, t, sc.ts, dur);
                self.s("\"External id\": ");
                self.u(sc.ext);
                self.s(", \"Record function id\": 0");
                if let Some(s) = sc.seq {
                    self.s(", \"Sequence number\": ");
                    self.u(s);
                }
                if sc.backward {
                    self.s(", \"Fwd thread id\": 0");
                }
                if sc.comms {
                    self.s(", \"Collective name\": \"allreduce\", \"dtype\": \"Float\", \"In msg nelems\": 25165824, \"Out msg nelems\": 25165824, \"Group size\": ");
                    self.i(self.cfg.world_size as i64);
                    self.s(", \"Process Group Name\": \"0\", \"Process Group Description\": \"default_pg\"");
                }
            }
            Cat::Python => {
                self.x_head(K_PYTHON, "python_function", sc.name, None, p, t, sc.ts, dur);
                self.s("\"Python parent id\": ");
                self.u(sc.py_parent);
                self.s(", \"Python id\": ");
                self.u(sc.ext);
                self.s(", \"Python thread\": 0");
            }
        }
        self.s("}}");
        self.maybe_flush();
    }

    fn annotation(&mut self, name: &'static str) {
        self.open(Cat::Annotation, name);
    }

    /// The innermost enclosing scope with an External id, and the innermost cpu_op.
    fn context(&self) -> (u64, Option<&'static str>) {
        let ext = self
            .stack
            .iter()
            .rev()
            .find(|s| s.cat != Cat::Python)
            .map_or(0, |s| s.ext);
        let op = self
            .stack
            .iter()
            .rev()
            .find(|s| s.cat == Cat::CpuOp)
            .map(|s| s.name);
        (ext, op)
    }

    // --- launches and GPU work --------------------------------------------------------------

    fn runtime_head(&mut self, api: &str, cbid: u32, ts: i64, dur: i64) -> u64 {
        self.corr += 1;
        let corr = self.corr;
        let (ext, _) = self.context();
        self.x_head(
            K_RUNTIME,
            "cuda_runtime",
            api,
            None,
            self.cfg.pid,
            self.cfg.tid,
            ts,
            dur,
        );
        self.s("\"External id\": ");
        self.u(ext);
        self.s(", \"cbid\": ");
        self.u(cbid as u64);
        self.s(", \"correlation\": ");
        self.u(corr);
        self.s("}}");
        corr
    }

    /// A runtime call with no GPU activity, lasting at least until `until` (absolute ns).
    fn runtime_only(&mut self, api: &str, cbid: u32, until: i64) {
        let ts = self.t;
        let min = self.rq(2 * US, 6 * US);
        let tail = self.rq(US, 3 * US);
        let end = (ts + min).max(until + tail);
        self.runtime_head(api, cbid, ts, end - ts);
        self.t = end;
    }

    /// Launch `g` on stream index `si`; it starts no earlier than `not_before`. Returns its end.
    fn launch(&mut self, api: &str, cbid: u32, g: Gpu, si: usize, not_before: i64) -> i64 {
        let ts = self.t;
        let d = if self.rng.one_in(40) {
            self.rng.range(15 * US, 45 * US)
        } else {
            self.rng.range(3 * US, 9 * US)
        };
        let dur = self.q(d);
        let corr = self.runtime_head(api, cbid, ts, dur);
        let (ext, op) = self.context();
        let delay = self.rq(US, 4 * US);
        let start = (ts + dur + delay).max(self.stream_free[si]).max(not_before);
        let gdur = match &g {
            Gpu::Kernel(k) => {
                let mut d = self.rng.range(k.lo, k.hi);
                if self.cfg.steady {
                    d = (k.lo + k.hi) / 2;
                }
                if self.rng.one_in(50) {
                    d *= 3;
                }
                if let Some((text, pct)) = &self.cfg.kernel_scale {
                    if k.name.contains(text.as_str()) {
                        d = d * *pct as i64 / 100;
                    }
                }
                if self.cfg.jitter_pct > 0 {
                    // Parts per 100 000 of the duration, within ±jitter_pct %.
                    let j = self.cfg.jitter_pct as i64 * 1000;
                    d += d * self.jitter.range(-j, j) / 100_000;
                }
                self.q(d)
            }
            Gpu::Memcpy { bytes, .. } => {
                // 20-25 GB/s over PCIe, i.e. bytes per ns.
                let bw_milli = self.rng.range(20_000, 25_000) as u64;
                self.q((bytes * 1000 / bw_milli) as i64 + 1200)
            }
            Gpu::Memset { .. } => self.rq(2 * US, 6 * US),
        };
        let end = start + gdur;
        self.stream_free[si] = end;
        self.intervals.push((start, end));
        let dev = self.cfg.device as i64;
        let stream = self.stream_ids[si];
        match &g {
            Gpu::Kernel(k) => {
                self.x_head(K_KERNEL, "kernel", k.name, None, dev, stream, start, gdur);
                self.kernels += 1;
                let e = self.by_name.entry(k.name).or_insert((0, 0));
                e.0 += gdur;
                e.1 += 1;
                if let Some(op) = op {
                    *self.by_op.entry(op).or_insert(0) += gdur;
                }
            }
            Gpu::Memcpy { name, .. } => {
                self.x_head(K_MEMCPY, "gpu_memcpy", name, None, dev, stream, start, gdur)
            }
            Gpu::Memset { .. } => self.x_head(
                K_MEMSET,
                "gpu_memset",
                "Memset (Device)",
                None,
                dev,
                stream,
                start,
                gdur,
            ),
        }
        self.s("\"External id\": ");
        self.u(ext);
        self.s(", \"queued\": 0, \"device\": ");
        self.i(dev);
        self.s(", \"context\": 1, \"stream\": ");
        self.i(stream);
        self.s(", \"correlation\": ");
        self.u(corr);
        match &g {
            Gpu::Kernel(k) => {
                self.s(", \"registers per thread\": ");
                self.u(k.regs as u64);
                self.s(", \"shared memory\": ");
                self.u(k.smem as u64);
                self.s(", \"grid\": [");
                self.u(k.grid[0] as u64);
                self.s(", ");
                self.u(k.grid[1] as u64);
                self.s(", ");
                self.u(k.grid[2] as u64);
                self.s("], \"block\": [");
                self.u(k.block[0] as u64);
                self.s(", ");
                self.u(k.block[1] as u64);
                self.s(", ");
                self.u(k.block[2] as u64);
                self.s("], \"est. achieved occupancy %\": ");
                let occ = self.rng.range(10, 100) as u64;
                self.u(occ);
            }
            Gpu::Memcpy { bytes, .. } | Gpu::Memset { bytes } => {
                let bytes = *bytes;
                self.s(", \"bytes\": ");
                self.u(bytes);
                self.s(", \"memory bandwidth (GB/s)\": ");
                let milli = bytes * 1000 / gdur as u64;
                self.u(milli / 1000);
                let f = milli % 1000;
                self.buf.extend_from_slice(&[
                    b'.',
                    b'0' + (f / 100) as u8,
                    b'0' + (f / 10 % 10) as u8,
                    b'0' + (f % 10) as u8,
                ]);
            }
        }
        self.s("}}");
        // Flow: launch -> GPU activity.
        self.sep();
        self.s("{\"ph\": \"s\", \"id\": ");
        self.u(corr);
        self.s(", \"pid\": ");
        self.i(self.cfg.pid);
        self.s(", \"tid\": ");
        self.i(self.cfg.tid);
        self.s(", \"ts\": ");
        self.ts(ts);
        self.s(", \"cat\": \"ac2g\", \"name\": \"ac2g\"}");
        self.sep();
        self.s("{\"ph\": \"f\", \"id\": ");
        self.u(corr);
        self.s(", \"pid\": ");
        self.i(dev);
        self.s(", \"tid\": ");
        self.i(stream);
        self.s(", \"ts\": ");
        self.ts(start);
        self.s(", \"cat\": \"ac2g\", \"name\": \"ac2g\", \"bp\": \"e\"}");
        self.t = ts + dur;
        end
    }

    fn memory_event(&mut self, sign: i8) {
        let (addr, bytes) = if sign > 0 {
            let b = self.rng.range(2, 48) as u64 * MIB + self.rng.range(0, 2047) as u64 * 512;
            let addr = self.next_addr;
            self.next_addr += b.div_ceil(2 * MIB) * 2 * MIB;
            self.live.push((addr, b));
            self.allocated += b;
            let need = self.allocated.div_ceil(20 * MIB) * 20 * MIB;
            self.reserved = self.reserved.max(need);
            (addr, b as i64)
        } else {
            match self.live.pop() {
                Some((addr, b)) => {
                    self.allocated -= b;
                    (addr, -(b as i64))
                }
                None => return,
            }
        };
        let ts = self.t;
        self.count(K_INSTANT, ts, ts);
        self.sep();
        self.s("{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"name\": \"[memory]\", \"pid\": ");
        self.i(self.cfg.pid);
        self.s(", \"tid\": ");
        self.i(self.cfg.tid);
        self.s(", \"ts\": ");
        self.ts(ts);
        self.s(", \"s\": \"t\", \"args\": {\"Device Type\": 1, \"Device Id\": ");
        self.i(self.cfg.device as i64);
        self.s(", \"Addr\": ");
        self.u(addr);
        self.s(", \"Bytes\": ");
        self.i(bytes);
        self.s(", \"Total Allocated\": ");
        self.u(self.allocated);
        self.s(", \"Total Reserved\": ");
        self.u(self.reserved);
        self.s("}}");
    }

    fn run_op(&mut self, op: &'static Op, si: usize) {
        self.adv(US, 3 * US);
        self.open(Cat::CpuOp, op.name);
        self.adv(US, 4 * US);
        if op.children.is_empty() {
            let reps = if op.reps > 1 {
                1 + self.rng.below(op.reps as u64)
            } else {
                1
            };
            for _ in 0..reps {
                for k in op.kernels {
                    self.launch("cudaLaunchKernel", 211, Gpu::Kernel(k), si, 0);
                    self.adv(500, 2 * US);
                }
            }
            match op.special {
                Special::None => {}
                Special::H2d => {
                    let bytes = self.rng.range(1, 4) as u64 * 4 * MIB;
                    let copy = self.n_compute;
                    let end = self.launch(
                        "cudaMemcpyAsync",
                        41,
                        Gpu::Memcpy {
                            name: "Memcpy HtoD (Pinned -> Device)",
                            bytes,
                        },
                        copy,
                        0,
                    );
                    // The compute stream waits for the batch.
                    self.stream_free[0] = self.stream_free[0].max(end);
                }
                Special::Memset => {
                    let bytes = self.rng.range(1, 16) as u64 * 256 * 1024;
                    self.launch("cudaMemsetAsync", 51, Gpu::Memset { bytes }, 0, 0);
                }
                Special::D2h => {
                    let end = self.launch(
                        "cudaMemcpyAsync",
                        41,
                        Gpu::Memcpy {
                            name: "Memcpy DtoH (Device -> Pageable)",
                            bytes: 4,
                        },
                        0,
                        0,
                    );
                    self.adv(500, 2 * US);
                    self.runtime_only("cudaStreamSynchronize", 131, end);
                }
                Special::Nccl => {
                    self.stack.last_mut().unwrap().comms = true;
                    // Gradients must be ready: wait for the compute streams.
                    let ready = self.stream_free[..self.n_compute]
                        .iter()
                        .copied()
                        .max()
                        .unwrap_or(0);
                    let nccl = self.n_compute + 1;
                    self.nccl_end = self.launch(
                        "cudaLaunchKernel",
                        211,
                        Gpu::Kernel(&NCCL_ALLREDUCE),
                        nccl,
                        ready,
                    );
                }
            }
            if op.mem != 0 {
                self.memory_event(op.mem);
            }
            self.adv(US, 5 * US);
        } else {
            for c in op.children {
                self.run_op(c, si);
            }
            self.adv(US, 3 * US);
        }
        self.close();
    }

    /// A top-level op of the forward or backward pass, sometimes on a side stream.
    fn model_op(&mut self, op: &'static Op) {
        let si = if self.n_compute > 1 && self.rng.one_in(4) {
            1 + self.rng.below(self.n_compute as u64 - 1) as usize
        } else {
            0
        };
        self.run_op(op, si);
    }

    fn step(&mut self, n: u32, first: bool) {
        if !first {
            self.adv(2 * US, 12 * US);
        }
        self.open(Cat::Annotation, "ProfilerStep#");
        self.stack.last_mut().unwrap().step = Some(n);

        self.adv(US, 3 * US);
        self.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__");
        if self.rng.one_in(10) {
            self.adv(2 * MS, 8 * MS);
        } else {
            self.adv(80 * US, 1200 * US);
        }
        self.close();

        if self.cfg.copies {
            self.run_op(&H2D, 0);
            self.adv(US, 2 * US);
            let until = self.t;
            self.runtime_only("cudaStreamWaitEvent", 146, until);
            self.run_op(&ZEROS, 0);
        }

        // Forward.
        self.adv(2 * US, 6 * US);
        self.phase = Phase::Forward;
        self.annotation("## forward ##");
        self.adv(US, 3 * US);
        self.open(Cat::Python, "nn.Module: GPT_0");
        for l in 0..self.cfg.layers {
            if self.rng.one_in(8) {
                self.adv(30 * US, 400 * US);
            }
            for op in LAYER_FWD[(l % 2) as usize] {
                self.model_op(op);
            }
        }
        self.adv(US, 3 * US);
        self.close();
        for op in &LOSS {
            self.run_op(op, 0);
        }
        self.adv(US, 3 * US);
        self.close();

        // Backward.
        self.adv(5 * US, 20 * US);
        self.phase = Phase::Backward;
        self.annotation("## backward ##");
        self.adv(US, 3 * US);
        self.open(
            Cat::Python,
            "<built-in method run_backward of torch._C._EngineBase object at 0x7f3a2c1b5e40>",
        );
        for op in &LOSS_BWD {
            self.run_op(op, 0);
        }
        for l in (0..self.cfg.layers).rev() {
            if self.rng.one_in(8) {
                self.adv(30 * US, 300 * US);
            }
            for op in LAYER_BWD[(l % 2) as usize] {
                self.model_op(op);
            }
            if self.cfg.nccl && l == self.cfg.layers / 2 {
                self.run_op(&ALLREDUCE, 0);
            }
        }
        if self.cfg.nccl && self.cfg.layers == 0 {
            self.run_op(&ALLREDUCE, 0);
        }
        self.adv(US, 3 * US);
        self.close();
        self.adv(US, 3 * US);
        self.close();
        self.phase = Phase::Other;

        // Optimizer.
        self.adv(10 * US, 40 * US);
        self.annotation("Optimizer.step#AdamW.step");
        self.adv(US, 3 * US);
        self.open(Cat::Python, "torch/optim/optimizer.py(485): wrapper");
        if self.cfg.nccl {
            self.adv(US, 3 * US);
            let until = self.t;
            self.runtime_only("cudaStreamWaitEvent", 146, until);
            self.stream_free[0] = self.stream_free[0].max(self.nccl_end);
        }
        for op in &OPTIMIZER {
            self.run_op(op, 0);
        }
        self.adv(US, 3 * US);
        self.close();
        self.adv(US, 3 * US);
        self.close();
        self.adv(5 * US, 15 * US);
        self.annotation("Optimizer.zero_grad#AdamW.zero_grad");
        self.adv(10 * US, 30 * US);
        self.close();

        if self.cfg.copies {
            self.run_op(&ITEM, 0);
        }
        self.adv(2 * US, 6 * US);
        let all_done = self.stream_free.iter().copied().max().unwrap_or(0);
        self.runtime_only("cudaDeviceSynchronize", 165, all_done);
        self.adv(2 * US, 8 * US);
        self.close();
        self.flush_union();
        self.flush_buf();
    }

    /// Fold this step's GPU intervals into the busy total. Every interval of later steps
    /// starts after all of these ended (each step ends with a device synchronize).
    fn flush_union(&mut self) {
        let mut iv = std::mem::take(&mut self.intervals);
        iv.sort_unstable();
        let mut open: Option<(i64, i64)> = None;
        for &(s, e) in &iv {
            open = match open {
                Some((os, oe)) if s <= oe => Some((os, oe.max(e))),
                Some((os, oe)) => {
                    self.busy += oe - os;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((os, oe)) = open {
            self.busy += oe - os;
        }
        iv.clear();
        self.intervals = iv;
    }
}

#[cfg(test)]
mod tests;
