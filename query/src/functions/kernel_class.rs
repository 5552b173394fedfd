//! `kernel_class(name)`: a coarse operation class for a GPU kernel name, by an ordered table
//! of built-in rules and, before them, the user's rules from a rules file
//! ([`ClassRules`], installed once per process by [`install_user_rules`]).

use super::demangle::{demangle, short_name, text_udf};
use datafusion::error::Result;
use datafusion::logical_expr::{Documentation, Signature};
use regex::Regex;
use std::sync::{LazyLock, RwLock};

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
/// | 2 | communication | full | `nccl`, `rccl`, `msccl`, `nvshmem`, `deep_?ep::` (DeepEP), `pplx`, `multimem_`, `one_shot_`, `two_shot_`, `symm_mem`, `symmetric_memory`, `all_?reduce`, `all_?gather`, `reduce_?scatter`, `all_?to_?all`, `all2all`, `cross_device_reduce`, `custom_?all_?reduce`, `quick_?reduce`, `lamport` (TensorRT-LLM all-reduce) |
/// | 3 | attention | key | `flash_fwd`, `flash_bwd`, `flash_attn`, `flashattn`, `flash::`, `fmha`, `sdpa`, `attn_fwd`, `attn_bwd`, `mha_(fwd\|bwd)`, `compute_attn` (warp-specialised `compute_attn_ws`), `attention`, `paged_attention`, `sage_fwd`, `flashinfer::` (its attention kernels; not its index builders such as `create_flashinfer_kv_indices_triton`), `batch_?(prefill\|decode)` |
/// | 4 | softmax | key | `softmax` |
/// | 5 | norm | key | `layer_?norm`, `rms_?norm`, `group_?norm`, `batch_?norm`, `instance_?norm`, `bn_(fw\|bw)`, `_norm_kernel`, `norm_fwd`, `norm_bwd`, `RowwiseMoments` |
/// | 6 | elementwise | key | `^triton_poi` (Triton pointwise) |
/// | 7 | reduction | key | `^triton_(red\|per)` (Triton reduction/persistent reduction) |
/// | 8 | conv | key | `conv`, `fprop`, `dgrad`, `wgrad`, `winograd`, `im2col`, `im2d2col`, `implicit_gemm`, `implicit_convolve`, `explicit_convolve`, `scudnn`, `igemm_(fwd\|bwd\|wrw)`, `fft2d`, `cudnn` |
/// | 8b | conv | full | `^cask_cudnn` (cuDNN conv offset helpers) |
/// | 9 | gemm | key | `gemm`, `gemv`, `matmul`, `nvjet`, `cutlass`, `xmma`, `^Cijk_`, `^bmm_`, `_mm_`, `splitKreduce`, `dot_kernel`, `wgmma` (cuBLAS/cuBLASLt/CUTLASS/nvjet, ROCm Tensile/CK/hipBLASLt), `mul_mat` (llama.cpp `mul_mat_q`, `mul_mat_vec_q`), `marlin`, `machete`, `^triton_(tem_\|mm\|bmm)` (Inductor matmul templates), `fused_moe`, `fmoe`, `moe_mm`, `grouped_mm` (MoE grouped GEMMs), `_scaled_mm` |
/// | 10 | gemm | full | `cublas`, `hipblas`, `rocblas`, `marlin`, `machete`, `ck::kernel_gemm`, `ck_tile::…gemm` |
/// | 11 | elementwise | key | `elementwise`, `pointwise`, `^SubTensorOp`, `OpTensor` (MIOpen), `nvfuser_pointwise`, `multi_tensor_apply`, `foreach`, `act_and_mul`, `silu`, `gelu`, `relu`, `fill`, `where_kernel`, `index_put`, `scatter`, `gather`, `rotary`, `quant` |
/// | 12 | reduction | key | `reduce`, `reduction`, `nvfuser_(inner\|outer)_persistent`, `sum_kernel`, `mean_kernel`, `argmax`, `argmin`, `cub::.*reduce`, `splitk_reduce` |
/// | 13 | copy | key | `copy`, `memcpy`, `memset`, `transpose`, `cat_?array`, `nchwToNhwc`, `nhwcToNchw` (layout transforms) |
///
/// Order matters: `llama.cpp`'s `dequantize_mul_mat_vec` is gemm, not an elementwise `quant`
/// (9 before 11); `ncclDevKernel_AllReduce` is communication, not reduction (2 before 12);
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
            r"nccl|rccl|msccl|nvshmem|deep_?ep::|pplx|multimem_|one_shot_|two_shot_|symm_mem|symmetric_memory|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|all2all|cross_device_reduce|custom_?all_?reduce|quick_?reduce|lamport",
        ),
        (
            "attention",
            On::Key,
            r"flash_fwd|flash_bwd|flash_attn|flashattn|flash::|fmha|sdpa|attn_fwd|attn_bwd|mha_(fwd|bwd)|compute_attn|attention|sage_fwd|flashinfer::|batch_?(prefill|decode)",
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
            r"gemm|gemv|matmul|nvjet|cutlass|xmma|^cijk_|^bmm_|_mm_|splitkreduce|dot_kernel|wgmma|mul_mat|marlin|machete|^triton_(tem_|mm|bmm)|fused_moe|fmoe|moe_mm|grouped_mm|_scaled_mm",
        ),
        (
            "gemm",
            On::Full,
            r"cublas|hipblas|rocblas|marlin|machete|ck::kernel_gemm|ck_tile::.*gemm",
        ),
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

/// A user's rule: kernels whose demangled name matches `pattern` are of `class`.
#[derive(Debug, Clone)]
struct UserRule {
    class: &'static str,
    pattern: Regex,
}

/// The user's class rules, read from a rules file: one `CLASS = REGEX` a line, tried in order
/// before the built-in [`RULES`], the first match winning. `REGEX` is matched,
/// case-insensitively, anywhere in the demangled kernel name; `CLASS` is a built-in class or a
/// new one (lower-case letters, digits, `_`). Blank lines and lines starting with `#` are
/// comments.
///
/// ```text
/// # DeepGEMM's grouped kernels are matmuls; our fused RoPE+quant kernel is elementwise
/// gemm = deep_gemm::
/// elementwise = ^my_rope_quant
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClassRules {
    rules: Vec<UserRule>,
}

/// A rules file line that is not a rule.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct RulesError {
    pub line: usize,
    pub message: String,
}

impl ClassRules {
    pub fn parse(text: &str) -> Result<ClassRules, RulesError> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let error = |message: String| RulesError {
                line: i + 1,
                message,
            };
            let Some((class, pattern)) = line.split_once('=') else {
                return Err(error(format!(
                    "expected CLASS = REGEX, found {line:?} (no '=')"
                )));
            };
            let (class, pattern) = (class.trim(), pattern.trim());
            if class.is_empty()
                || !class
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(error(format!(
                    "class {class:?} must be lower-case letters, digits or '_'"
                )));
            }
            if pattern.is_empty() {
                return Err(error(format!("class {class:?} has no pattern")));
            }
            let pattern = Regex::new(&format!("(?i){pattern}"))
                .map_err(|e| error(format!("invalid pattern: {e}")))?;
            // Classes are few and live as long as the process: leaked once, they are returned
            // as `&'static str` like the built-in ones.
            let class = CLASSES
                .iter()
                .find(|c| **c == class)
                .copied()
                .unwrap_or_else(|| Box::leak(class.to_string().into_boxed_str()));
            rules.push(UserRule { class, pattern });
        }
        Ok(ClassRules { rules })
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The class of the first rule matching `demangled`, if any.
    fn class_of(&self, demangled: &str) -> Option<&'static str> {
        self.rules
            .iter()
            .find(|r| r.pattern.is_match(demangled))
            .map(|r| r.class)
    }

    /// The class of `name`: the first matching user rule, else the built-in table.
    pub fn classify(&self, name: &str) -> &'static str {
        let full = demangle(name);
        self.class_of(&full).unwrap_or_else(|| builtin_class(&full))
    }
}

/// The rules every `kernel_class` of this process uses before the built-in table.
static USER_RULES: RwLock<Option<ClassRules>> = RwLock::new(None);

/// Makes `rules` the user rules of every later classification in this process: the SQL
/// function and every analysis that classifies kernels.
pub fn install_user_rules(rules: ClassRules) {
    *USER_RULES.write().unwrap_or_else(|e| e.into_inner()) = Some(rules);
}

/// Classifies a kernel name: the installed user rules ([`install_user_rules`]) first, then the
/// [`RULES`] table.
pub fn kernel_class(name: &str) -> &'static str {
    let full = demangle(name);
    let user = USER_RULES.read().unwrap_or_else(|e| e.into_inner());
    if let Some(class) = user.as_ref().and_then(|r| r.class_of(&full)) {
        return class;
    }
    builtin_class(&full)
}

/// The class of a demangled name by the built-in [`RULES`].
fn builtin_class(full: &str) -> &'static str {
    let short = short_name(full);
    let key: &str = if WRAPPERS.contains(&short.to_ascii_lowercase().as_str()) {
        full
    } else {
        &short
    };
    for (class, on, re) in RULES.iter() {
        let text = match on {
            On::Full => full,
            On::Key => key,
        };
        if re.is_match(text) {
            return class;
        }
    }
    "other"
}

/// `kernel_class(name) -> Utf8`: one of `gemm, conv, attention, elementwise, reduction, norm,
/// softmax, copy, communication, other` (or a class of the user's rules), from the kernel (or
/// memcpy/memset) name, by the user's rules ([`ClassRules`]) and then the ordered rule table
/// documented on [`RULES`]. Mangled names are demangled first.
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
         cuBLAS/cuBLASLt/CUTLASS/nvjet, cuDNN, flash/SDPA, Triton, ATen, NCCL/RCCL, DeepEP and \
         symmetric-memory collectives, quantised and MoE matmuls, ROCm Tensile/CK/aiter); the \
         rules of <store>/kernel_classes.txt or --classes FILE come first.",
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
