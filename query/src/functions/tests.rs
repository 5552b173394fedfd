//! Unit and property tests of the functions (the `.slt` files in `query/tests/slt` cover SQL).

use super::busy::IntervalSet;
use super::demangle::{demangle, short_name};
use super::durations::{fmt_dur, parse_dur};
use super::kernel_class::{kernel_class, ClassRules, CLASSES};
use super::*;
use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::PartitionEvaluator;
use datafusion::prelude::SessionConfig;
use std::collections::HashMap;
use std::sync::Arc;

/// Deterministic xorshift64* generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy)]
struct Row {
    id: i64,
    g: i64,
    ts: Option<i64>,
    dur: Option<i64>,
}

fn random_rows(rng: &mut Rng) -> Vec<Row> {
    let groups = 1 + rng.below(4) as i64;
    // Layouts: random order, sorted by ts, or sorted stretches one after another (the store's
    // stream-by-stream order, which exercises the merge of an out-of-order tail).
    let layout = rng.below(3);
    let n = rng.below(if layout == 2 { 400 } else { 80 }) as i64;
    let span = 1 + rng.below(2000) as i64;
    let max_dur = 1 + rng.below(300) as i64;
    let mut rows: Vec<Row> = (0..n)
        .map(|id| Row {
            id,
            g: rng.below(groups as u64) as i64,
            ts: (!rng.chance(3)).then(|| rng.below(span as u64) as i64 - 100),
            dur: if rng.chance(3) {
                None
            } else if rng.chance(3) {
                Some(-(rng.below(5) as i64) - 1)
            } else if rng.chance(10) {
                Some(0)
            } else {
                Some(rng.below(max_dur as u64) as i64)
            },
        })
        .collect();
    match layout {
        1 => rows.sort_by_key(|r| (r.ts, r.id)),
        2 => {
            let stretch = 1 + rng.below(150) as usize;
            for c in rows.chunks_mut(stretch) {
                c.sort_by_key(|r| (r.ts, r.id));
            }
        }
        _ => {}
    }
    for (i, r) in rows.iter_mut().enumerate() {
        r.id = i as i64;
    }
    rows
}

/// Brute force: (busy, span lo, span hi) over valid intervals clipped to `window`.
fn brute(rows: &[Row], window: Option<(i64, i64)>) -> Option<(i64, i64, i64)> {
    let mut iv = Vec::new();
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for r in rows {
        let (Some(t), Some(d)) = (r.ts, r.dur) else {
            continue;
        };
        if d < 0 {
            continue;
        }
        let (s, e, l, h) = match window {
            None => (t, t + d, t, t + d),
            Some((ws, we)) => (t.max(ws), (t + d).min(we).max(t.max(ws)), ws, we),
        };
        lo = lo.min(l);
        hi = hi.max(h);
        iv.push((s, e));
    }
    if lo > hi {
        return None;
    }
    // Unit-by-unit union over the covered range (slow and obviously right).
    let mut busy = 0;
    if !iv.is_empty() {
        let min = iv.iter().map(|x| x.0).min().unwrap();
        let max = iv.iter().map(|x| x.1).max().unwrap();
        for x in min..max {
            if iv.iter().any(|&(s, e)| s <= x && x < e) {
                busy += 1;
            }
        }
    }
    Some((busy, lo, hi))
}

fn ratio(b: Option<(i64, i64, i64)>) -> Option<f64> {
    b.and_then(|(busy, lo, hi)| (hi > lo).then(|| 1.0 - busy as f64 / (hi - lo) as f64))
}

/// A session with tiny batches and 4 partitions, table `t(id, g, ts, dur)` spread over 4
/// partitions of several small batches each.
async fn session_with(rows: &[Row], rng: &mut Rng) -> SessionContext {
    let config = SessionConfig::new()
        .with_batch_size(7)
        .with_target_partitions(4);
    let ctx = SessionContext::new_with_config(config);
    register_all(&ctx);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("g", DataType::Int64, false),
        Field::new("ts", DataType::Int64, true),
        Field::new("dur", DataType::Int64, true),
    ]));
    let mut partitions: Vec<Vec<RecordBatch>> = vec![Vec::new(); 4];
    let mut i = 0;
    while i < rows.len() {
        let len = (1 + rng.below(9) as usize).min(rows.len() - i);
        let chunk = &rows[i..i + len];
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(chunk.iter().map(|r| r.id))),
                Arc::new(Int64Array::from_iter_values(chunk.iter().map(|r| r.g))),
                Arc::new(chunk.iter().map(|r| r.ts).collect::<Int64Array>()),
                Arc::new(chunk.iter().map(|r| r.dur).collect::<Int64Array>()),
            ],
        )
        .unwrap();
        partitions[rng.below(4) as usize].push(batch);
        i += len;
    }
    let table = MemTable::try_new(schema, partitions).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

async fn collect(ctx: &SessionContext, sql: &str) -> RecordBatch {
    let df = ctx.sql(sql).await.unwrap();
    let schema = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await.unwrap();
    concat_batches(&schema, &batches).unwrap()
}

fn i64s(b: &RecordBatch, i: usize) -> Vec<Option<i64>> {
    b.column(i).as_primitive::<Int64Type>().iter().collect()
}

fn f64s(b: &RecordBatch, i: usize) -> Vec<Option<f64>> {
    b.column(i)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap()
        .iter()
        .collect()
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() < 1e-12,
        _ => false,
    }
}

#[tokio::test]
async fn aggregates_match_brute_force_across_batches_and_partitions() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..300 {
        let rows = random_rows(&mut rng);
        let ctx = session_with(&rows, &mut rng).await;
        let (ws, we) = (0, 500);
        // GROUP BY: the GroupsAccumulator path.
        let b = collect(
            &ctx,
            &format!(
                "SELECT g, busy_time(ts, dur), idle_ratio(ts, dur), busy_time(ts, dur, {ws}, {we}), \
                 idle_ratio(ts, dur, {ws}, {we}) FROM t GROUP BY g ORDER BY g"
            ),
        )
        .await;
        let gs = i64s(&b, 0);
        for (k, g) in gs.iter().enumerate() {
            let grp: Vec<Row> = rows.iter().copied().filter(|r| Some(r.g) == *g).collect();
            let full = brute(&grp, None);
            let win = brute(&grp, Some((ws, we)));
            assert_eq!(
                i64s(&b, 1)[k],
                full.map(|x| x.0),
                "case {case} g {g:?} busy"
            );
            assert!(
                close(f64s(&b, 2)[k], ratio(full)),
                "case {case} g {g:?} idle"
            );
            assert_eq!(
                i64s(&b, 3)[k],
                win.map(|x| x.0),
                "case {case} g {g:?} busy window"
            );
            assert!(
                close(f64s(&b, 4)[k], ratio(win)),
                "case {case} g {g:?} idle window"
            );
        }
        // No GROUP BY: the Accumulator path.
        let b = collect(
            &ctx,
            &format!(
                "SELECT busy_time(ts, dur), idle_ratio(ts, dur), idle_ratio(ts, dur, {ws}, {we}) FROM t"
            ),
        )
        .await;
        let full = brute(&rows, None);
        assert_eq!(i64s(&b, 0)[0], full.map(|x| x.0), "case {case} total busy");
        assert!(close(f64s(&b, 1)[0], ratio(full)), "case {case} total idle");
        assert!(
            close(f64s(&b, 2)[0], ratio(brute(&rows, Some((ws, we))))),
            "case {case} total idle window"
        );
    }
}

fn brute_gap(rows: &[Row]) -> HashMap<i64, Option<i64>> {
    let mut out = HashMap::new();
    let mut by_group: HashMap<i64, Vec<Row>> = HashMap::new();
    for r in rows {
        by_group.entry(r.g).or_default().push(*r);
    }
    for (_, mut rs) in by_group {
        rs.sort_by_key(|r| (r.ts.is_none(), r.ts, r.id));
        let mut frontier: Option<i64> = None;
        for r in rs {
            let v = match (r.ts, r.dur) {
                (Some(t), Some(d)) if d >= 0 => {
                    let v = frontier.map(|f| (t - f).max(0));
                    frontier = Some(frontier.map_or(t + d, |f| f.max(t + d)));
                    v
                }
                _ => None,
            };
            out.insert(r.id, v);
        }
    }
    out
}

#[tokio::test]
async fn gap_matches_brute_force() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for case in 0..300 {
        let rows = random_rows(&mut rng);
        let ctx = session_with(&rows, &mut rng).await;
        let b = collect(
            &ctx,
            "SELECT id, gap(ts, dur) OVER (PARTITION BY g ORDER BY ts, id) FROM t ORDER BY id",
        )
        .await;
        let want = brute_gap(&rows);
        for (id, got) in i64s(&b, 0).into_iter().zip(i64s(&b, 1)) {
            assert_eq!(got, want[&id.unwrap()], "case {case} id {id:?}");
        }
    }
}

#[test]
fn gap_evaluate_all_equals_row_by_row() {
    let ts = Arc::new(Int64Array::from(vec![
        Some(0),
        Some(5),
        None,
        Some(20),
        Some(40),
        Some(45),
        Some(46),
    ])) as ArrayRef;
    let dur = Arc::new(Int64Array::from(vec![
        Some(10),
        Some(10),
        Some(3),
        Some(10),
        Some(5),
        Some(-1),
        Some(1),
    ])) as ArrayRef;
    let values = [ts, dur];
    let mut all = gap::GapEvaluator::default();
    let a = all.evaluate_all(&values, 7).unwrap();
    let mut one = gap::GapEvaluator::default();
    let rows: Vec<Option<i64>> = (0..7)
        .map(|i| match one.evaluate(&values, &(i..i + 1)).unwrap() {
            datafusion::common::ScalarValue::Int64(v) => v,
            v => panic!("{v:?}"),
        })
        .collect();
    let a: Vec<Option<i64>> = a.as_primitive::<Int64Type>().iter().collect();
    assert_eq!(a, rows);
    assert_eq!(
        a,
        vec![None, Some(0), None, Some(5), Some(10), None, Some(1)]
    );
}

#[tokio::test]
async fn gap_streams_over_sorted_input_without_a_sort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let mut csv = String::from("g,ts,dur\n");
    for g in 0..3 {
        for i in 0..50 {
            csv.push_str(&format!("{g},{},{}\n", i * 10, 5 + (i % 7)));
        }
    }
    std::fs::write(&path, csv).unwrap();
    let mut config = SessionConfig::new().with_target_partitions(4);
    config.options_mut().optimizer.prefer_existing_sort = true;
    let ctx = SessionContext::new_with_config(config);
    register_all(&ctx);
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE t (g BIGINT NOT NULL, ts BIGINT NOT NULL, dur BIGINT NOT NULL) \
         STORED AS CSV WITH ORDER (g, ts) LOCATION '{}' OPTIONS ('format.has_header' 'true')",
        path.display()
    ))
    .await
    .unwrap();
    let query = "SELECT g, ts, gap(ts, dur) OVER (PARTITION BY g ORDER BY ts) AS idle FROM t";
    let plan = collect(&ctx, &format!("EXPLAIN {query}")).await;
    let text: Vec<String> = plan
        .column(1)
        .as_string::<i32>()
        .iter()
        .map(|s| s.unwrap_or("").to_string())
        .collect();
    let physical = text.join("\n");
    assert!(
        physical.contains("BoundedWindowAggExec"),
        "not streaming:\n{physical}"
    );
    assert!(!physical.contains("SortExec"), "extra sort:\n{physical}");
    let b = collect(
        &ctx,
        &format!("SELECT g, sum(idle), count(idle) FROM ({query}) GROUP BY g ORDER BY g"),
    )
    .await;
    let mut frontier = 5;
    let mut want = 0;
    for i in 1..50 {
        want += (i * 10 - frontier).max(0);
        frontier = frontier.max(i * 10 + 5 + i % 7);
    }
    assert_eq!(i64s(&b, 1), vec![Some(want); 3]);
    assert_eq!(i64s(&b, 2), vec![Some(49); 3]);
}

#[test]
fn interval_set_coalesces_sorted_input_in_place() {
    let mut s = IntervalSet::default();
    for i in 0..1000 {
        s.add(i * 10, i * 10 + 10, i * 10, i * 10 + 10);
    }
    assert_eq!(s.busy(), 10_000);
    let mut s = IntervalSet::default();
    for i in (0..1000).rev() {
        s.add(i * 10, i * 10 + 5, i * 10, i * 10 + 5);
    }
    assert_eq!(s.busy(), 5_000);
    assert_eq!(s.span(), 9_995);
    // Stream after stream, as the store orders a device's rows: four interleaved streams that
    // together tile [0, 400 000) exactly; the out-of-order tail is merged several times.
    let mut s = IntervalSet::default();
    for k in 0..4 {
        for i in 0..10_000 {
            let t = i * 40 + k * 10;
            s.add(t, t + 10, t, t + 10);
        }
    }
    assert_eq!(s.busy(), 400_000);
    assert_eq!(s.span(), 400_000);
}

#[test]
fn fmt_dur_uses_three_significant_digits() {
    let cases: &[(i64, &str)] = &[
        (0, "0 ns"),
        (532, "532 ns"),
        (999, "999 ns"),
        (1_000, "1.00 us"),
        (12_000, "12.0 us"),
        (999_499, "999 us"),
        (999_500, "1.00 ms"),
        (1_234_567, "1.23 ms"),
        (1_235_000, "1.24 ms"),
        (123_456_789, "123 ms"),
        (1_500_000_000, "1.50 s"),
        (59_940_000_000, "59.9 s"),
        (59_960_000_000, "1.00 min"),
        (90_000_000_000, "1.50 min"),
        (5_400_000_000_000, "1.50 h"),
        (3_600_000_000_000_000, "1000 h"),
        (-1_500_000, "-1.50 ms"),
        (i64::MIN, "-2562048 h"),
    ];
    for &(ns, want) in cases {
        assert_eq!(fmt_dur(ns), want, "{ns}");
    }
}

#[test]
fn dur_grammar() {
    let ok: &[(&str, i64)] = &[
        ("1.5ms", 1_500_000),
        ("250 us", 250_000),
        ("250µs", 250_000),
        ("3ns", 3),
        ("2s", 2_000_000_000),
        (".5s", 500_000_000),
        ("1h30m", 5_400_000_000_000),
        ("1m 30s", 90_000_000_000),
        ("2min", 120_000_000_000),
        (" 1 h ", 3_600_000_000_000),
        ("-1.5 ms", -1_500_000),
        ("1.0000005ms", 1_000_001),
        ("0.1ns", 0),
        ("1.5MS", 1_500_000),
    ];
    for &(s, want) in ok {
        assert_eq!(parse_dur(s), Some(want), "{s}");
    }
    for bad in [
        "",
        "ms",
        "1",
        "1.5",
        "1.5 parsecs",
        "1..5ms",
        "1ms2",
        "10000000000h",
        "1 m s",
    ] {
        assert_eq!(parse_dur(bad), None, "{bad}");
    }
}

#[test]
fn short_names() {
    let cases: &[(&str, &str)] = &[
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char *, (unsigned long)1>>(int, T2, T3)",
            "vectorized_elementwise_kernel",
        ),
        (
            "void at::native::<unnamed>::CatArrayBatchedCopy_vectorized<at::native::<unnamed>::OpaqueType<(unsigned int)2>, unsigned int, (int)1>(char *)",
            "CatArrayBatchedCopy_vectorized",
        ),
        (
            "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)",
            "fused_add_rms_norm_kernel",
        ),
        (
            "void (anonymous namespace)::groupnorm_kernel_dispatch_down<__hip_bfloat16, 1024u>(unsigned int)",
            "groupnorm_kernel_dispatch_down",
        ),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "ncclDevKernel_SendRecv"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_0"),
        ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
        (
            "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
            "add_rmsnorm_quant_kernel",
        ),
    ];
    for &(name, want) in cases {
        assert_eq!(short_name(name), want, "{name}");
    }
    assert_eq!(demangle("not_mangled"), "not_mangled");
    assert_eq!(demangle("_ZN2at6native4testEv"), "at::native::test()");
}

#[test]
fn kernel_classes() {
    let cases: &[(&str, &str)] = &[
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "gemm"),
        ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", "gemm"),
        ("[CUDA memcpy HtoD]", "copy"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        ("triton_poi_fused_add_0", "elementwise"),
        ("triton_red_fused_sum_1", "reduction"),
        ("triton_per_fused__softmax_3", "softmax"),
        ("triton_red_fused_add_native_layer_norm_2", "norm"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::NormTwoOps<c10::BFloat16, float, c10::BFloat16>>>(T3)", "reduction"),
        ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)", "attention"),
        ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32", "conv"),
        ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0", "gemm"),
        ("one_shot_all_reduce_kernel", "communication"),
        ("cub::DeviceRadixSortOnesweepKernel", "other"),
        // Communication outside NCCL: DeepEP, NVSHMEM, symmetric memory, custom all-reduce.
        ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, int, int, int, int, void**, int, int)", "communication"),
        ("void deep_ep::internode_ll::combine<false, 7168>(void*, int*, int*, void const*, long const*, int*, long const*, int*, int*, void*, int, int, int, int, int, int, int)", "communication"),
        ("void nvshmemi_transfer_rma_nbi_translate_kernel(void*)", "communication"),
        ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 8, 8>(c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)", "communication"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication"),
        ("void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8, false>(...)", "communication"),
        // Warp-specialised FlashAttention and FlashInfer.
        ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<128, 128, 128, 12, 2, false, 1, cutlass::bfloat16_t>, true, false, false>(flash::Flash_fwd_params)", "attention"),
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<...>(...)", "attention"),
        ("kernel_unified_attention_2d", "attention"),
        // Quantised matmuls: llama.cpp, Marlin, Machete.
        ("void mul_mat_q<(ggml_type)12, 64, false>(char const*, int const*, int const*, int const*, float*, float*, int, int, int, int, int, int, int, int, int)", "gemm"),
        ("void mul_mat_vec_q<(ggml_type)8, 1>(void const*, void const*, int const*, float*, int, int, int, int, int, int, int)", "gemm"),
        ("void dequantize_mul_mat_vec<1, 1, &(convert_f16(void const*, long, int, float2&))>(void const*, float const*, float*, int, int)", "gemm"),
        ("void marlin::Marlin<256, 1, 8, 8, 4, 8, false, -1>(int4 const*, int4 const*, int4*, int4*, int4 const*, int4 const*, int*, int, int, int, int, int*, bool)", "gemm"),
        ("void marlin_moe_wna16::Marlin<(vllm::ScalarTypeId)5, 256, 1, 8, 8, 4, 8, false, 4>(...)", "gemm"),
        ("void cutlass::device_kernel<machete::MacheteKernelTemplate<...>::KernelType>(...)", "gemm"),
        // MoE grouped GEMMs.
        ("fused_moe_kernel", "gemm"),
        ("_ZN5aiter39fmoe_bf16_blockscaleFp8_g1u1_vs_silu_1tg_32x256E", "gemm"),
        ("void at::cuda::detail::grouped_mm_kernel<...>(...)", "gemm"),
        // Triton / Inductor matmul templates.
        ("triton_tem_fused_addmm_1", "gemm"),
        ("triton_mm_0", "gemm"),
        ("triton_tem_fused_convolution_0", "conv"),
        // nvjet, CK, aiter, Tensile, hipBLASLt.
        ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
        ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<...>, true, (ck::InMemoryDataOperationEnum)0, 2, (ck::TailNumber)2>(...)", "gemm"),
        ("_ZN5aiter37fmha_fwd_hd128_bf16_causal_a32_pssk_rtneE", "attention"),
        ("Cijk_Alik_Bljk_HHS_BH_MT256x256x64_MI32x32x8x1_SN_1LDSB1_AG0_AMAS3_ASE_ASGT_ASLT_ASAE01", "gemm"),
        ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB0", "gemm"),
    ];
    for &(name, want) in cases {
        assert_eq!(kernel_class(name), want, "{name}");
        assert_eq!(ClassRules::default().classify(name), want, "{name}");
        assert!(CLASSES.contains(&want));
    }
}

/// User rules come before the built-in table, may name new classes, and a bad line is an
/// error naming its line.
#[test]
fn user_class_rules_come_first() {
    let rules = ClassRules::parse(
        "# site rules\n\ncommunication = ^my_ring_\nmoe_routing = moe_align_block_size\ngemm = deep_gemm::\n",
    )
    .unwrap();
    assert_eq!(rules.len(), 3);
    assert_eq!(rules.classify("my_ring_allgather_v2"), "communication");
    assert_eq!(
        rules.classify("void vllm::moe::moe_align_block_size_kernel<int>(int*)"),
        "moe_routing"
    );
    assert_eq!(
        rules.classify("void deep_gemm::fp8_gemm_kernel<128>(float*)"),
        "gemm"
    );
    // Before the table: `softmax` would win otherwise.
    let over = ClassRules::parse("attention = MY_SOFTMAX_ATTN").unwrap();
    assert_eq!(over.classify("my_softmax_attn_kernel"), "attention");
    assert_eq!(
        ClassRules::default().classify("my_softmax_attn_kernel"),
        "softmax"
    );
    // Unmatched names fall through to the table.
    assert_eq!(rules.classify("triton_poi_fused_add_0"), "elementwise");

    for (text, line, what) in [
        ("gemm = ok\nno equals sign", 2, "no '='"),
        ("\n\nGEMM = x", 3, "lower-case"),
        ("gemm = (", 1, "invalid pattern"),
        ("gemm =   ", 1, "no pattern"),
    ] {
        let e = ClassRules::parse(text).unwrap_err();
        assert_eq!(e.line, line, "{text:?}: {e}");
        assert!(e.to_string().contains(what), "{text:?}: {e}");
        assert!(e.to_string().starts_with(&format!("line {line}:")), "{e}");
    }
}
