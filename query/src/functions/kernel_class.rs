//! `kernel_class(name)`: a coarse operation class for a GPU kernel name.

use super::demangle::{demangle, short_name, text_udf};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use regex::Regex;
use std::sync::LazyLock;

/// The classes `kernel_class` returns.
pub const CLASSES: &[&str] = &[
    "gemm",
    "conv",
    "attention",
    "elementwise",
    "reduction",
    "norm",
    "softmax",
    "copy",
    "communication",
    "other",
];

/// What a rule's pattern is matched against.
#[derive(Debug, Clone, Copy)]
enum On {
    /// The whole demangled name (library identities that may sit in template arguments).
    Full,
    /// The *key*: `short_name(name)`, or the whole demangled name when the short name is a
    /// generic wrapper (`Kernel`, `Kernel2`, `kernel`, `kentry`, `device_kernel`,
    /// `trampoline_kernel`, ...) whose template argument says what runs.
    Key,
}

/// The rule table, in priority order: the first matching rule wins; no match is `other`.
/// Patterns are case-insensitive regexes.
///
/// | # | class | on | pattern (summary) |
/// |---|---|---|---|
/// | 1 | copy | full | `^\[CUDA mem(cpy\|set)`, `^Memcpy`, `^Memset` (memcpy/memset activity records) |
/// | 2 | communication | full | `nccl`, `rccl`, `msccl`, `nvshmem`, `multimem_`, `one_shot_`, `two_shot_`, `symm_mem`, `all_?reduce`, `all_?gather`, `reduce_?scatter`, `all_?to_?all`, `cross_device_reduce`, `custom_?all_?reduce` |
/// | 3 | attention | key | `flash_fwd`, `flash_bwd`, `flash_attn`, `flashattn`, `flash::`, `fmha`, `sdpa`, `attn_fwd`, `attn_bwd`, `mha_(fwd\|bwd)`, `attention`, `paged_attention`, `sage_fwd` |
/// | 4 | softmax | key | `softmax` |
/// | 5 | norm | key | `layer_?norm`, `rms_?norm`, `group_?norm`, `batch_?norm`, `instance_?norm`, `bn_(fw\|bw)`, `_norm_kernel`, `norm_fwd`, `norm_bwd`, `RowwiseMoments` |
/// | 6 | elementwise | key | `^triton_poi` (Triton pointwise) |
/// | 7 | reduction | key | `^triton_(red\|per)` (Triton reduction/persistent reduction) |
/// | 8 | conv | key | `conv`, `fprop`, `dgrad`, `wgrad`, `winograd`, `im2col`, `im2d2col`, `implicit_gemm`, `implicit_convolve`, `explicit_convolve`, `scudnn`, `igemm_(fwd\|bwd\|wrw)`, `fft2d`, `cudnn` |
/// | 8b | conv | full | `^cask_cudnn` (cuDNN conv offset helpers) |
/// | 9 | gemm | key | `gemm`, `gemv`, `matmul`, `nvjet`, `cutlass`, `xmma`, `^Cijk_`, `^bmm_`, `_mm_`, `splitKreduce`, `dot_kernel`, `wgmma` (cuBLAS/cuBLASLt/CUTLASS/nvjet, ROCm Tensile/CK/hipBLASLt) |
/// | 10 | gemm | full | `cublas`, `hipblas`, `rocblas` |
/// | 11 | elementwise | key | `elementwise`, `pointwise`, `^SubTensorOp`, `OpTensor` (MIOpen), `nvfuser_pointwise`, `multi_tensor_apply`, `foreach`, `act_and_mul`, `silu`, `gelu`, `relu`, `fill`, `where_kernel`, `index_put`, `scatter`, `gather`, `rotary`, `quant` |
/// | 12 | reduction | key | `reduce`, `reduction`, `nvfuser_(inner\|outer)_persistent`, `sum_kernel`, `mean_kernel`, `argmax`, `argmin`, `cub::.*reduce`, `splitk_reduce` |
/// | 13 | copy | key | `copy`, `memcpy`, `memset`, `transpose`, `cat_?array`, `nchwToNhwc`, `nhwcToNchw` (layout transforms) |
///
/// Order matters: `ncclDevKernel_AllReduce` is communication, not reduction (2 before 12);
/// `flash_fwd_kernel<... cutlass ...>` is attention (3 before 9); `triton_red_fused_..._layer_norm`
/// is norm (5 before 7); `sm80_xmma_fprop_implicit_gemm` and CUTLASS `fprop`/`dgrad` kernels
/// are conv (8 before 9); `reduce_kernel<..., NormTwoOps>` is a reduction because norm rules
/// look at the key (`reduce_kernel`), not the template arguments; ATen's
/// `elementwise_kernel<..., direct_copy_kernel_cuda ...>` is elementwise (11 before 13).
static RULES: LazyLock<Vec<(&'static str, On, Regex)>> = LazyLock::new(|| {
    let rules: &[(&str, On, &str)] = &[
        ("copy", On::Full, r"^\s*(\[CUDA mem(cpy|set)|memcpy|memset)"),
        (
            "communication",
            On::Full,
            r"nccl|rccl|msccl|nvshmem|multimem_|one_shot_|two_shot_|symm_mem|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|custom_?all_?reduce",
        ),
        (
            "attention",
            On::Key,
            r"flash_fwd|flash_bwd|flash_attn|flashattn|flash::|fmha|sdpa|attn_fwd|attn_bwd|mha_(fwd|bwd)|attention|sage_fwd",
        ),
        ("softmax", On::Key, r"softmax"),
        (
            "norm",
            On::Key,
            r"layer_?norm|rms_?norm|group_?norm|batch_?norm|instance_?norm|bn_(fw|bw)|_norm_kernel|norm_fwd|norm_bwd|rowwisemoments",
        ),
        ("elementwise", On::Key, r"^triton_poi"),
        ("reduction", On::Key, r"^triton_(red|per)"),
        (
            "conv",
            On::Key,
            r"conv|fprop|dgrad|wgrad|winograd|im2col|im2d2col|implicit_gemm|implicit_convolve|explicit_convolve|scudnn|igemm_(fwd|bwd|wrw)|fft2d|cudnn",
        ),
        ("conv", On::Full, r"^(void )?cask_cudnn"),
        (
            "gemm",
            On::Key,
            r"gemm|gemv|matmul|nvjet|cutlass|xmma|^cijk_|^bmm_|_mm_|splitkreduce|dot_kernel|wgmma",
        ),
        ("gemm", On::Full, r"cublas|hipblas|rocblas"),
        (
            "elementwise",
            On::Key,
            r"elementwise|pointwise|^subtensorop|optensor|multi_tensor_apply|foreach|act_and_mul|silu|gelu|relu|fill|where_kernel|index_put|scatter|gather|rotary|quant",
        ),
        (
            "reduction",
            On::Key,
            r"reduce|reduction|nvfuser_(inner|outer)_persistent|sum_kernel|mean_kernel|argmax|argmin",
        ),
        (
            "copy",
            On::Key,
            r"copy|memcpy|memset|transpose|cat_?array|nchwtonhwc|nhwctonchw",
        ),
    ];
    rules
        .iter()
        .map(|&(class, on, pat)| {
            (
                class,
                on,
                Regex::new(&format!("(?i){pat}")).expect("valid kernel_class regex"),
            )
        })
        .collect()
});

/// Short names that are generic wrappers; the key is then the whole demangled name.
const WRAPPERS: &[&str] = &[
    "kernel",
    "kernel2",
    "kentry",
    "device_kernel",
    "trampoline_kernel",
    "generic_kernel",
    "globalkernel",
    "launch_kernel",
    "kernel_impl",
];

/// Classifies a kernel name with the [`RULES`] table.
pub fn kernel_class(name: &str) -> &'static str {
    let full = demangle(name);
    let short = short_name(&full);
    let key: &str = if WRAPPERS.contains(&short.to_ascii_lowercase().as_str()) {
        &full
    } else {
        &short
    };
    for (class, on, re) in RULES.iter() {
        let text = match on {
            On::Full => &full,
            On::Key => key,
        };
        if re.is_match(text) {
            return class;
        }
    }
    "other"
}

/// `kernel_class(name) -> Utf8`: one of `gemm, conv, attention, elementwise, reduction, norm,
/// softmax, copy, communication, other`, from the kernel (or memcpy/memset) name, by the
/// ordered rule table documented on [`RULES`]. Mangled names are demangled first.
/// Dictionary-encoded names are classified once per distinct value.
///
/// ```sql
/// SELECT kernel_class(name) AS class, fmt_dur(sum(dur)) FROM gpu_ops GROUP BY 1 ORDER BY sum(dur) DESC;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct KernelClass {
    signature: Signature,
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Operation class of a kernel name: gemm, conv, attention, elementwise, reduction, norm, \
         softmax, copy, communication or other (ordered rules on the demangled name covering \
         cuBLAS/cuBLASLt/CUTLASS/nvjet, cuDNN, flash/SDPA, Triton, ATen, NCCL/RCCL and \
         symmetric-memory collectives, ROCm Tensile/CK/aiter).",
        "kernel_class(name)",
    )
    .with_sql_example(
        "SELECT kernel_class('ncclDevKernel_AllReduce_Sum_f32_RING_LL'); -- 'communication'",
    )
    .with_argument("name", "a kernel, memcpy or memset name")
    .build()
});

text_udf!(KernelClass, "kernel_class", DOC, |s| Ok(
    kernel_class(s).to_string()
));
