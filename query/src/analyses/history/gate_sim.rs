//! Generated pairs of runs at the level of per-instance samples: the profiles that
//! [`compare`](super::compare) judges, built without ingesting a trace, so that the regression
//! gate can be calibrated over hundreds of pairs (`benches/gate_calibration.rs`) and its tests
//! can state known answers.
//!
//! A run has `kernels` kernels; kernel k runs `instances[k % len]` times per step at a base
//! duration of its own, each instance times `1 + U(−noise, +noise)`, one instance in
//! `outlier_one_in` three times as long (as real traces have), and every kernel in a step times
//! that step's common factor (`1 + N(0, step_sd)`): instances within a step are correlated, as
//! when clocks or a noisy neighbour slow a whole step. `steps = 0` makes a run without steps
//! whose window is the sum of its instances' durations (a saturated GPU).

use super::profile::{Measure, Profile};
use std::collections::BTreeMap;

/// splitmix64: small, fast and good enough for simulation; no dependency.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// The shape of a generated run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub kernels: usize,
    /// Steps of the run; 0: a run without steps.
    pub steps: usize,
    /// Instances per step of kernel k: `instances[k % instances.len()]` (per run without steps:
    /// times 4).
    pub instances: Vec<usize>,
    /// Independent per-instance noise: ± this many percent, uniform.
    pub noise_pct: f64,
    /// Common factor of each step: standard deviation in percent.
    pub step_sd_pct: f64,
    /// One instance in this many takes 3× (0: never).
    pub outlier_one_in: u32,
}

impl SimConfig {
    /// `kernels` kernels of 1 to 169 instances per step, ±5 % noise, a 1-in-50 3× outlier,
    /// steps correlated by 0.5 % (a quiet machine).
    pub fn typical(kernels: usize, steps: usize) -> Self {
        SimConfig {
            kernels,
            steps,
            instances: vec![1, 2, 4, 8, 16, 32, 64, 169],
            noise_pct: 5.0,
            step_sd_pct: 0.5,
            outlier_one_in: 50,
        }
    }

    /// The name of kernel k.
    pub fn name(k: usize) -> String {
        format!("kernel_{k:03}")
    }

    pub fn instances_of(&self, k: usize) -> usize {
        let n = self.instances[k % self.instances.len()];
        if self.steps == 0 {
            4 * n
        } else {
            n
        }
    }
}

/// What a generated run changes on top of its noise.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// (kernel, factor): every instance of the kernel times the factor (1.10 = 10 % slower).
    pub kernels: Vec<(usize, f64)>,
    /// (step, factor): every kernel of that step times the factor (one slow step).
    pub step: Option<(usize, f64)>,
}

/// One generated run.
pub fn sim_run(cfg: &SimConfig, seed: u64, change: &Change) -> Profile {
    let mut rng = Rng(seed);
    let mut p = Profile {
        run: format!("sim-{seed}"),
        ..Default::default()
    };
    let steps = cfg.steps.max(1);
    let step_factor: Vec<f64> = (0..steps)
        .map(|s| {
            let slow = change.step.filter(|c| c.0 == s).map_or(1.0, |c| c.1);
            (1.0 + cfg.step_sd_pct / 100.0 * rng.normal()) * slow
        })
        .collect();
    let mut window = 0;
    for k in 0..cfg.kernels {
        let base = 5_000.0 + (k as f64 * 7_919.0) % 95_000.0;
        let shift = change
            .kernels
            .iter()
            .filter(|c| c.0 == k)
            .map(|c| c.1)
            .product::<f64>();
        let mut m = Measure::default();
        for (s, factor) in step_factor.iter().enumerate() {
            for _ in 0..cfg.instances_of(k) {
                let noise = 1.0 + cfg.noise_pct / 100.0 * (2.0 * rng.unit() - 1.0);
                let outlier =
                    cfg.outlier_one_in > 0 && rng.next_u64() % cfg.outlier_one_in as u64 == 0;
                let three = if outlier { 3.0 } else { 1.0 };
                let d = (base * shift * factor * noise * three).round() as i64;
                m.count += 1;
                m.total += d;
                window += d;
                if cfg.steps == 0 {
                    m.instances.push(d);
                } else {
                    *m.per_step.entry(s as i64).or_default() += d;
                    m.step_instances.entry(s as i64).or_default().push(d);
                }
            }
        }
        p.keys
            .insert(SimConfig::name(k), BTreeMap::from([(None, m)]));
    }
    if cfg.steps == 0 {
        p.windows.insert(None, window);
    } else {
        for s in 0..cfg.steps {
            // Only which steps exist matters at the kernel level, not their walls.
            p.steps.insert((None, s as i64), 1);
        }
    }
    p
}
