//! Calibration of the regression gate: false alarms and power of `compare`'s kernel tests over
//! generated pairs of runs (per-instance samples, see `gpuq_query::analyses::history::gate_sim`).
//!
//! `cargo run --release -p gpuq-query --example gate_calibration [PAIRS]` (default 250 pairs a
//! scenario). Each pair is two runs of 64 kernels (1 to 169 instances per step, ±5 % uniform
//! per-instance noise, a 1-in-50 3× outlier, a common per-step factor of sd 0.5 % unless said)
//! that differ only by their noise draws, plus the scenario's change:
//! - independent: per-instance noise only, no per-step factor;
//! - null: nothing else; a kernel called `slower` or `faster` is a false alarm;
//! - one slow step: every kernel of one step of b is 20 % slower (steps correlated);
//! - noisy steps: the per-step factor has sd 3 % instead of 0.5 %;
//! - +10 % / +20 %: kernels 0..8 (one of each instance count) are that much slower in every
//!   instance; power = the share of them called `slower`, per instances per step.
//!
//! - 3 vs 5: the sides have different step counts.
//!
//! Without steps, a run's instances share one factor (its only "step"): "noisy steps" and "one
//! slow step" are then a run-wide shift of b, which `compare` measures and judges each kernel
//! against (`gpuq_query::analyses::history::run_shift`).
//!
//! The exit status is 1 when a requirement fails: false alarms ≤ 1 % of kernels in every null
//! scenario, whatever the steps, power ≥ 95 % for +10 % with 3 steps a side (kernels of 8
//! instances a step or more).

use gpuq_query::analyses::history::compare::{compare, DEFAULT_THRESHOLD_PCT};
use gpuq_query::analyses::history::gate_sim::{sim_run, Change, SimConfig};
use gpuq_query::analyses::history::profile::Level;
use std::time::Instant;

const KERNELS: usize = 64;

/// Share of kernels called slower or faster, over `pairs` null pairs (b may have another
/// shape: `cfg_b`).
fn false_alarms(cfg: &SimConfig, cfg_b: &SimConfig, pairs: usize, change_b: &Change) -> f64 {
    let mut alarms = 0;
    for i in 0..pairs as u64 {
        let a = sim_run(cfg, 2 * i + 1, &Change::default());
        let b = sim_run(cfg_b, 2 * i + 2, change_b);
        alarms += compare(&[a], &[b], DEFAULT_THRESHOLD_PCT, Level::Kernel)
            .iter()
            .filter(|r| r.is_significant())
            .count();
    }
    alarms as f64 / (pairs * cfg.kernels) as f64
}

/// Per shifted kernel (one per instance count): the share of pairs calling it `slower`.
fn power(cfg: &SimConfig, pairs: usize, factor: f64) -> Vec<(usize, f64)> {
    let shifted: Vec<usize> = (0..cfg.instances.len()).collect();
    let change = Change {
        kernels: shifted.iter().map(|k| (*k, factor)).collect(),
        step: None,
    };
    let mut caught = vec![0usize; shifted.len()];
    for i in 0..pairs as u64 {
        let a = sim_run(cfg, 2 * i + 1, &Change::default());
        let b = sim_run(cfg, 2 * i + 2, &change);
        for r in compare(&[a], &[b], DEFAULT_THRESHOLD_PCT, Level::Kernel) {
            if let Some(k) = shifted.iter().position(|k| SimConfig::name(*k) == r.name) {
                caught[k] += usize::from(r.status == "slower");
            }
        }
    }
    shifted
        .iter()
        .map(|k| (cfg.instances_of(*k), caught[*k] as f64 / pairs as f64))
        .collect()
}

fn pct(x: f64) -> String {
    format!("{:.2} %", 100.0 * x)
}

fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(250);
    let started = Instant::now();
    let mut failed = Vec::new();
    println!("gate calibration: {pairs} pairs a scenario, {KERNELS} kernels a run, alpha 0.01, threshold {DEFAULT_THRESHOLD_PCT} %\n");
    println!("false alarms (share of kernels called slower or faster):");
    println!(
        "{:>7} {:>12} {:>10} {:>14} {:>12}",
        "steps", "independent", "null", "one slow step", "noisy steps"
    );
    for (steps, steps_b) in [(0, 0), (1, 1), (2, 2), (3, 3), (5, 5), (3, 5)] {
        let cfg = SimConfig::typical(KERNELS, steps);
        let cfg_b = SimConfig::typical(KERNELS, steps_b);
        let with_sd = |sd: f64, c: &SimConfig| SimConfig {
            step_sd_pct: sd,
            ..c.clone()
        };
        // Only independent per-instance noise (no step factor), the typical 0.5 % step factor,
        // one step of b 20 % slower in every kernel, and 3 % step-to-step noise.
        let independent = false_alarms(
            &with_sd(0.0, &cfg),
            &with_sd(0.0, &cfg_b),
            pairs,
            &Change::default(),
        );
        let null = false_alarms(&cfg, &cfg_b, pairs, &Change::default());
        // Without steps the one "step" is the whole run: b 20 % slower as a whole.
        let slow_step = {
            let change = Change {
                kernels: Vec::new(),
                step: Some((steps_b / 2, 1.2)),
            };
            false_alarms(&cfg, &cfg_b, pairs, &change)
        };
        let noisy = false_alarms(
            &with_sd(3.0, &cfg),
            &with_sd(3.0, &cfg_b),
            pairs,
            &Change::default(),
        );
        let label = match (steps, steps_b) {
            (0, _) => "none".to_string(),
            (a, b) if a == b => a.to_string(),
            (a, b) => format!("{a} vs {b}"),
        };
        println!(
            "{label:>7} {:>12} {:>10} {:>14} {:>12}",
            pct(independent),
            pct(null),
            pct(slow_step),
            pct(noisy)
        );
        let scenarios = [
            ("independent noise", independent),
            ("null", null),
            ("one slow step", slow_step),
            ("noisy steps", noisy),
        ];
        for (what, fa) in scenarios {
            if fa > 0.01 {
                failed.push(format!("{label} steps, {what}: false alarms {}", pct(fa)));
            }
        }
    }
    for factor in [1.10, 1.20] {
        println!(
            "\npower for +{:.0} % in every instance (share of pairs calling the kernel slower), by instances per step:",
            100.0 * (factor - 1.0)
        );
        let counts = &SimConfig::typical(KERNELS, 3).instances;
        print!("{:>6}", "steps");
        for n in counts {
            print!(" {n:>7}");
        }
        println!(" {:>8}", "all");
        for steps in [0, 1, 3, 5] {
            let cfg = SimConfig::typical(KERNELS, steps);
            let by_count = power(&cfg, pairs, factor);
            let label = if steps == 0 {
                "none".to_string()
            } else {
                steps.to_string()
            };
            print!("{label:>6}");
            for (_, p) in &by_count {
                print!(" {:>7}", format!("{:.1}%", 100.0 * p));
            }
            let all = by_count.iter().map(|c| c.1).sum::<f64>() / by_count.len() as f64;
            println!(" {:>8}", format!("{:.1}%", 100.0 * all));
            // The requirement: 3 steps a side, +10 %, kernels with at least 8 instances a step
            // (1 or 2 instances a step give 3 to 6 samples: no test reaches p < 0.01 reliably).
            if steps == 3 && factor < 1.15 {
                for (n, p) in &by_count {
                    if *n >= 8 && *p < 0.95 {
                        failed.push(format!(
                            "3 steps, +10 %, {n} instances a step: power {}",
                            pct(*p)
                        ));
                    }
                }
            }
        }
    }
    println!("\n{:.1} s", started.elapsed().as_secs_f64());
    if failed.is_empty() {
        println!("PASS: false alarms <= 1 % in every scenario, power >= 95 % for +10 % with 3 steps (8+ instances a step)");
    } else {
        println!("FAIL:\n  {}", failed.join("\n  "));
        std::process::exit(1);
    }
}
