//! Run comparison, trends and repeatability on generated runs with injected, known changes.

use super::profile::{Measure, Profile};
use super::trend::{change_points, Point};
use crate::open_session;
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::execution::context::SessionContext;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::synth::{write_kineto, SynthConfig};
use gpuq_ingest::{IngestOptions, NoProgress};
use std::collections::BTreeMap;

/// The kernel the tests slow down: a forward GEMM that runs once per layer and step.
const FC1: &str = "cutlass_80_tensorop_bf16_s16816gemm_relu";

fn fc1_name() -> String {
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)".into()
}

/// A demo-shaped run: 12 steps, same events every time, steady kernel durations;
/// `jitter_seed` varies them by ±5 %, `scale_pct` slows FC1 down.
fn run_config(jitter_seed: u64, scale_pct: Option<u32>) -> SynthConfig {
    SynthConfig {
        steps: 12,
        layers: 4,
        jitter_pct: 5,
        jitter_seed,
        steady: true,
        kernel_scale: scale_pct.map(|p| (FC1.to_string(), p)),
        ..SynthConfig::demo()
    }
}

fn ingest(
    store: &Store,
    dir: &std::path::Path,
    run: &str,
    cfg: &SynthConfig,
    tags: &[(&str, &str)],
) {
    let path = dir.join(format!("{run}.json"));
    write_kineto(cfg, std::fs::File::create(&path).unwrap()).unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    gpuq_ingest::ingest(store, &[path], &opts, &NoProgress).unwrap();
}

async fn rows(ctx: &SessionContext, sql: &str) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
        for r in 0..b.num_rows() {
            let mut row = BTreeMap::new();
            for (f, c) in b.schema().fields().iter().zip(b.columns()) {
                row.insert(f.name().clone(), array_value_to_string(c, r).unwrap());
            }
            out.push(row);
        }
    }
    out
}

async fn error_of(ctx: &SessionContext, sql: &str) -> String {
    match ctx.sql(sql).await {
        Err(e) => e.to_string(),
        Ok(df) => df
            .collect()
            .await
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string()),
    }
}

#[tokio::test]
async fn compare_flags_an_injected_slowdown_and_not_noise() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    ingest(
        &store,
        dir.path(),
        "base",
        &run_config(1, None),
        &[("branch", "main")],
    );
    ingest(
        &store,
        dir.path(),
        "base2",
        &run_config(2, None),
        &[("branch", "main")],
    );
    ingest(&store, dir.path(), "noisy", &run_config(3, None), &[]);
    ingest(&store, dir.path(), "slow", &run_config(4, Some(120)), &[]);
    let ctx = open_session(&store).await.unwrap();

    // The slowed kernel: slower, ~1.2x per step, significant on 12 vs 12 steps.
    let slow = rows(
        &ctx,
        "SELECT * FROM compare('base', 'slow') WHERE rank IS NULL",
    )
    .await;
    let fc1 = slow.iter().find(|r| r["name"] == fc1_name()).unwrap();
    assert_eq!(fc1["status"], "slower", "{fc1:?}");
    assert_eq!(fc1["test"], "per-step");
    let ratio: f64 = fc1["ratio"].parse().unwrap();
    assert!((1.15..1.25).contains(&ratio), "{ratio}");
    let p: f64 = fc1["p_value"].parse().unwrap();
    assert!(p < super::compare::ALPHA, "{p}");
    assert_eq!(fc1["count_a"], fc1["count_b"]);
    // Nothing else changed beyond noise.
    for r in &slow {
        if r["name"] != fc1_name() {
            assert!(
                r["status"].starts_with("unchanged"),
                "{} is {} (ratio {})",
                r["name"],
                r["status"],
                r["ratio"]
            );
        }
    }
    // The same kernel with ±5 % noise and no shift: not flagged; nothing is.
    let noisy = rows(
        &ctx,
        "SELECT name, status, ratio FROM compare('base', 'noisy')",
    )
    .await;
    assert!(!noisy.is_empty());
    for r in &noisy {
        assert!(r["status"].starts_with("unchanged"), "{r:?}");
    }
    // Per class and per op the slowdown lands where the kernel belongs: their delta is FC1's
    // (give or take the other kernels' jitter). Diluted in all GEMMs it is only ~2 %, which
    // 12 noisy steps cannot call significant: that is the point of the test.
    let fc1_delta: f64 = fc1["delta"].parse().unwrap();
    for (level, key) in [("class", "gemm"), ("op", "aten::addmm")] {
        let sql = format!("SELECT * FROM compare('base', 'slow', '{level}')");
        let r = rows(&ctx, &sql).await;
        let row = r.iter().find(|r| r["name"] == key).unwrap();
        let delta: f64 = row["delta"].parse().unwrap();
        assert!(
            (delta - fc1_delta).abs() < 0.2 * fc1_delta,
            "{level}: {row:?}"
        );
        assert_ne!(row["status"], "faster");
    }

    // Summary: kernel time per step moves by the sum of the kernels' deltas (means add up;
    // each delta is rounded to 1 ns). At ~1 % of kernel time it is under the threshold.
    let summary = rows(&ctx, "SELECT * FROM compare('base', 'slow', 'summary')").await;
    let names: Vec<&str> = summary.iter().map(|r| r["name"].as_str()).collect();
    assert_eq!(
        &names[..4],
        ["step_time", "gpu_busy", "gpu_idle", "kernel_time"]
    );
    let kernel_time = summary.iter().find(|r| r["name"] == "kernel_time").unwrap();
    assert_eq!(kernel_time["status"], "unchanged", "{kernel_time:?}");
    let sum_deltas: i64 = slow
        .iter()
        .map(|r| r["delta"].parse::<i64>().unwrap())
        .sum();
    let kt_delta: i64 = kernel_time["delta"].parse().unwrap();
    assert!(
        (kt_delta - sum_deltas).abs() <= slow.len() as i64,
        "{kt_delta} vs {sum_deltas}"
    );
    assert_eq!(summary[0]["count_a"], "12");

    // A selector baseline: the median of the two main runs.
    let sel = rows(
        &ctx,
        "SELECT name, status, count_a FROM compare('tags[''branch''] = ''main''', 'slow') \
         WHERE rank IS NULL",
    )
    .await;
    let fc1 = sel.iter().find(|r| r["name"] == fc1_name()).unwrap();
    assert_eq!(fc1["status"], "slower");
    assert_eq!(fc1["count_a"], fc1["count_a"]);

    // Threshold: at 30 % nothing is slower.
    let lax = rows(
        &ctx,
        "SELECT status FROM compare('base', 'slow', 'kernel', 30)",
    )
    .await;
    assert!(lax.iter().all(|r| r["status"].starts_with("unchanged")));

    // Bad arguments.
    assert!(error_of(&ctx, "SELECT * FROM compare('base', 'nope')")
        .await
        .contains("unknown run nope"));
    assert!(
        error_of(&ctx, "SELECT * FROM compare('base', 'slow', 'bogus')")
            .await
            .contains("unknown level")
    );
    assert!(error_of(&ctx, "SELECT * FROM compare('base')")
        .await
        .contains("usage: compare"));
    assert!(
        error_of(&ctx, "SELECT * FROM compare('base', 'tags[''x''] = ''y''')")
            .await
            .contains("matches no run")
    );
    assert!(
        error_of(&ctx, "SELECT * FROM compare('base', 'no such column = 1')")
            .await
            .contains("neither a run name")
    );
    assert!(
        error_of(&ctx, "SELECT * FROM compare('base', 'slow', 'kernel', -1)")
            .await
            .contains("threshold_pct")
    );
}

#[tokio::test]
async fn added_and_removed_kernels_and_runs_without_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let no_nccl = SynthConfig {
        nccl: false,
        ..run_config(1, None)
    };
    ingest(&store, dir.path(), "a", &run_config(1, None), &[]);
    ingest(&store, dir.path(), "b", &no_nccl, &[]);
    let ctx = open_session(&store).await.unwrap();
    let r = rows(&ctx, "SELECT name, status, count_b FROM compare('a', 'b')").await;
    let nccl: Vec<_> = r.iter().filter(|r| r["name"].contains("nccl")).collect();
    assert!(!nccl.is_empty());
    assert!(nccl
        .iter()
        .all(|r| r["status"] == "removed" && r["count_b"] == "0"));
    let r = rows(&ctx, "SELECT name, status FROM compare('b', 'a')").await;
    assert!(r
        .iter()
        .filter(|r| r["name"].contains("nccl"))
        .all(|r| r["status"] == "added"));
}

fn measure(total: i64, per_step: &[i64]) -> Measure {
    Measure {
        count: per_step.len() as i64,
        total,
        per_step: per_step
            .iter()
            .enumerate()
            .map(|(i, v)| (i as i64, *v))
            .collect(),
        instances: Vec::new(),
    }
}

fn profile(run: &str, per_step: &[i64]) -> Profile {
    let mut p = Profile {
        run: run.into(),
        ..Default::default()
    };
    for i in 0..per_step.len() {
        p.steps.insert((None, i as i64), 1000);
    }
    p.keys.insert(
        "k".into(),
        [(None, measure(per_step.iter().sum(), per_step))].into(),
    );
    p
}

#[test]
fn significance_needs_enough_steps_and_instance_counts_are_exact() {
    // 4 vs 4 steps, completely separated, 50 % slower: exact p = 2/70 > 0.01.
    let a = profile("a", &[100, 101, 102, 103]);
    let b = profile("b", &[150, 151, 152, 153]);
    let r = super::compare::compare(&[a], &[b], 2.0, false);
    assert_eq!(r[0].status, "unchanged (noise)");
    assert!((r[0].p_value.unwrap() - 2.0 / 70.0).abs() < 1e-12);
    // 5 vs 5: 2/252 < 0.01.
    let a = profile("a", &[100, 101, 102, 103, 104]);
    let b = profile("b", &[150, 151, 152, 153, 154]);
    let r = super::compare::compare(&[a.clone()], &[b], 2.0, false);
    assert_eq!(r[0].status, "slower");
    assert_eq!(r[0].delta(), 50);
    // Steps where a key is missing count as 0.
    let mut c = a.clone();
    c.keys
        .get_mut("k")
        .unwrap()
        .get_mut(&None)
        .unwrap()
        .per_step
        .remove(&4);
    let r = super::compare::compare(&[a], &[c], 2.0, false);
    assert!((r[0].value_b - (100.0 + 101.0 + 102.0 + 103.0) / 5.0).abs() < 1e-9);
    // Without steps: a different instance count is a real change.
    let flat = |n: usize| {
        let mut p = Profile::default();
        p.keys.insert(
            "k".into(),
            [(
                None,
                Measure {
                    count: n as i64,
                    total: 10 * n as i64,
                    per_step: Default::default(),
                    instances: vec![10; n],
                },
            )]
            .into(),
        );
        p
    };
    let r = super::compare::compare(&[flat(10)], &[flat(12)], 2.0, false);
    assert_eq!((r[0].status, r[0].test), ("slower", "count"));
    let r = super::compare::compare(&[flat(1)], &[flat(1)], 2.0, false);
    assert_eq!((r[0].status, r[0].test), ("unchanged", "none"));
}

#[test]
fn change_points_are_flagged_once_at_the_shift() {
    let point = |v: f64| Point {
        run: String::new(),
        captured_ns: 0,
        order_key: None,
        samples: (0..10).map(|i| v + (i % 3) as f64).collect(),
        value: Some(v + 1.0),
        change_pct: None,
        p_value: None,
        change_point: false,
    };
    let mut pts: Vec<Point> = [100.0; 6]
        .into_iter()
        .chain([130.0; 6])
        .map(point)
        .collect();
    change_points(&mut pts, 5.0);
    let flagged: Vec<usize> = (0..pts.len()).filter(|i| pts[*i].change_point).collect();
    assert_eq!(flagged, vec![6]);
    let mut flat: Vec<Point> = [100.0; 12].into_iter().map(point).collect();
    change_points(&mut flat, 5.0);
    assert!(flat.iter().all(|p| !p.change_point));
}

#[tokio::test]
async fn trend_matches_brute_force_and_finds_the_regression() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    for i in 0..10u64 {
        let scale = (i >= 6).then_some(125);
        let cfg = run_config(10 + i, scale);
        let idx = i.to_string();
        ingest(
            &store,
            dir.path(),
            &format!("n{:02}", 9 - i),
            &cfg,
            &[("model", "llama"), ("i", &idx)],
        );
    }
    let ctx = open_session(&store).await.unwrap();
    let metric = format!("kernel:{}", fc1_name());
    // Ordered by the numeric tag `i` (run names go the other way).
    let sql = format!(
        "SELECT run, order_key, samples, value, change_point FROM trend('tags[''model''] = ''llama''', {}, 'i')",
        super::literal(&metric)
    );
    let got = rows(&ctx, &sql).await;
    assert_eq!(got.len(), 10);
    let order: Vec<&str> = got.iter().map(|r| r["order_key"].as_str()).collect();
    assert_eq!(order, ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    // Brute force: the median over steps of the kernel's per-step total.
    for r in &got {
        let per_step = rows(
            &ctx,
            &format!(
                "SELECT sum(dur) AS t FROM kernels WHERE run = '{}' AND name = {} AND step IS NOT NULL GROUP BY step",
                r["run"],
                super::literal(&fc1_name())
            ),
        )
        .await;
        let mut v: Vec<f64> = per_step.iter().map(|x| x["t"].parse().unwrap()).collect();
        assert_eq!(v.len(), 12);
        v.sort_by(f64::total_cmp);
        let want = (v[5] + v[6]) / 2.0;
        assert_eq!(r["value"].parse::<f64>().unwrap(), want, "{}", r["run"]);
        assert_eq!(r["samples"], "12");
    }
    let flagged: Vec<&str> = got
        .iter()
        .filter(|r| r["change_point"] == "true")
        .map(|r| r["order_key"].as_str())
        .collect();
    assert_eq!(flagged, ["6"]);
    // Step time over the same runs: every run has 12 steps.
    let steps = rows(
        &ctx,
        "SELECT samples FROM trend('tags[''model''] = ''llama''', 'step_time')",
    )
    .await;
    assert!(steps.iter().all(|r| r["samples"] == "12"));
    assert!(error_of(&ctx, "SELECT * FROM trend('n00', 'bogus')")
        .await
        .contains("unknown metric"));
    // One summary metric alone (a narrower query) equals its brute force too.
    let kt = rows(&ctx, "SELECT run, value FROM trend('true', 'kernel_time')").await;
    assert_eq!(kt.len(), 10);
    for r in &kt {
        let sql = format!(
            "SELECT sum(dur) AS t FROM kernels WHERE run = '{}' AND step IS NOT NULL GROUP BY step",
            r["run"]
        );
        let mut v: Vec<f64> = rows(&ctx, &sql)
            .await
            .iter()
            .map(|x| x["t"].parse().unwrap())
            .collect();
        v.sort_by(f64::total_cmp);
        assert_eq!(r["value"].parse::<f64>().unwrap(), (v[5] + v[6]) / 2.0);
    }
    let idle = rows(&ctx, "SELECT value, unit FROM trend('n00', 'idle_pct')").await;
    let pct: f64 = idle[0]["value"].parse().unwrap();
    assert!(
        idle[0]["unit"] == "%" && pct > 0.0 && pct < 100.0,
        "{idle:?}"
    );

    // Repeatability of the six unshifted repeats: GEMMs are stable, the ranking too.
    let rep = rows(
        &ctx,
        "SELECT name, runs, cv_pct, top_rank, ranking_tau FROM repeatability('CAST(tags[''i''] AS INT) < 6', 5)",
    )
    .await;
    let fc1 = rep.iter().find(|r| r["name"] == fc1_name()).unwrap();
    assert_eq!(fc1["runs"], "6");
    let cv: f64 = fc1["cv_pct"].parse().unwrap();
    assert!(cv > 0.0 && cv < 3.0, "{cv}");
    let tau: f64 = rep[0]["ranking_tau"].parse().unwrap();
    assert!(tau > 0.6, "{tau}");
    assert_eq!(rep[0]["top_rank"], "1");
}

/// Ingests one file per rank as one run.
fn ingest_ranks(store: &Store, dir: &std::path::Path, run: &str, cfgs: &[SynthConfig]) {
    let paths: Vec<_> = cfgs
        .iter()
        .enumerate()
        .map(|(i, cfg)| {
            let path = dir.join(format!("{run}-rank{i}.json"));
            write_kineto(cfg, std::fs::File::create(&path).unwrap()).unwrap();
            path
        })
        .collect();
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        ..Default::default()
    };
    gpuq_ingest::ingest(store, &paths, &opts, &NoProgress).unwrap();
}

#[tokio::test]
async fn multi_rank_runs_compare_per_rank_and_collectives_show_their_straggler() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let rank = |r: i32, jitter: u64, scale: Option<u32>| SynthConfig {
        rank: Some(r),
        world_size: 2,
        seed: 7,
        ..run_config(jitter, scale)
    };
    ingest_ranks(
        &store,
        dir.path(),
        "a",
        &[rank(0, 1, None), rank(1, 2, None)],
    );
    // Only rank 1 gets the slow kernel.
    ingest_ranks(
        &store,
        dir.path(),
        "b",
        &[rank(0, 3, None), rank(1, 4, Some(150))],
    );
    let ctx = open_session(&store).await.unwrap();
    let r = rows(
        &ctx,
        &format!(
            "SELECT rank, status, count_a FROM compare('a', 'b') WHERE name = {} ORDER BY rank NULLS FIRST",
            super::literal(&fc1_name())
        ),
    )
    .await;
    let got: Vec<(&str, &str)> = r
        .iter()
        .map(|r| (r["rank"].as_str(), r["status"].as_str()))
        .collect();
    assert_eq!(got, [("", "slower"), ("0", "unchanged"), ("1", "slower")]);
    assert_eq!(
        r[1]["count_a"].parse::<i64>().unwrap() * 2,
        r[0]["count_a"].parse::<i64>().unwrap()
    );

    // Collective skew against a brute force over the kernels.
    let skew = rows(&ctx, "SELECT * FROM collective_skew('b')").await;
    assert!(!skew.is_empty());
    for s in &skew {
        let sql = format!(
            "SELECT rank, ts, ts + dur AS e FROM kernels WHERE run = 'b' AND name = {} ORDER BY rank, ts",
            super::literal(&s["name"])
        );
        let k = rows(&ctx, &sql).await;
        let per_rank = |r: &str| -> Vec<(i64, i64)> {
            k.iter()
                .filter(|x| x["rank"] == r)
                .map(|x| (x["ts"].parse().unwrap(), x["e"].parse().unwrap()))
                .collect()
        };
        let (r0, r1) = (per_rank("0"), per_rank("1"));
        let n = r0.len().min(r1.len());
        assert_eq!(s["calls"], n.to_string());
        let start_skews: Vec<i64> = (0..n).map(|i| (r0[i].0 - r1[i].0).abs()).collect();
        let max = *start_skews.iter().max().unwrap();
        assert_eq!(s["start_skew_max"], max.to_string());
        let avg = start_skews.iter().sum::<i64>() as f64 / n as f64;
        assert!((s["start_skew_avg"].parse::<f64>().unwrap() - avg).abs() < 1e-6);
        let late1 = (0..n).filter(|&i| r1[i].0 > r0[i].0).count();
        let late0 = (0..n).filter(|&i| r0[i].0 > r1[i].0).count();
        // Ties go to the lower rank; no skew at all, no straggler.
        let want = match (late0, late1) {
            (0, 0) => "",
            (l0, l1) if l1 > l0 => "1",
            _ => "0",
        };
        assert_eq!(s["straggler_rank"], want, "{s:?}");
    }
    // A single-rank run has no collective skew.
    let one = rows(
        &ctx,
        "SELECT count(*) AS n FROM collective_skew('a') WHERE ranks < 2",
    )
    .await;
    assert_eq!(one[0]["n"], "0");
}
