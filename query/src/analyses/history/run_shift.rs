//! The run-wide shift between two sides of a comparison without steps (or with one step): how
//! much the run as a whole moved, so that each kernel is judged by how much more it moved.
//!
//! Without steps to serve as units, a run slowed as a whole (clocks, a noisy neighbour, a
//! slow stretch) moves every instance of every kernel, and a test on the instances calls every
//! kernel `slower`. Two runs differ by such a factor as a matter of course (3 % is common), so
//! a kernel is compared with the run: the shift is the **median over the keys of their
//! typical ratios** (median instance b / median instance a, on a log scale), which the keys
//! that really changed cannot move while they are fewer than half. Its **99 % confidence
//! interval** is the median ± 2.576 standard errors, the standard error of a median being
//! 1.2533 σ / √k with σ estimated robustly from the keys' spread (1.4826 × their median
//! absolute deviation), so a few changed keys widen it no more than they move it. Whether
//! the run moved at all is the **sign test** over the keys (did more of them move one way
//! than chance allows).

use super::stats::{median, sign_test};

/// Level of the interval and of the sign test: that of the tests (`compare::ALPHA`).
const LEVEL_ALPHA: f64 = 0.01;
/// The two-sided 99 % point of the standard normal.
const Z_99: f64 = 2.575_829;
/// Standard error of a median: √(π / 2) σ / √k.
const MEDIAN_SE: f64 = 1.253_314;
/// σ from the median absolute deviation of normal values.
const MAD_SIGMA: f64 = 1.482_602;

/// Under this many keys the sign test cannot reach p < 0.01 (2 × 2⁻⁷ > 0.01), so a shift of
/// the run cannot be told from a few keys' own changes: the run-wide shift is not estimated,
/// each key is judged on its own.
pub const MIN_KEYS: usize = 8;

/// How much a run moved as a whole, as a ratio b / a.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunShift {
    /// The median of the keys' typical ratios.
    pub ratio: f64,
    /// The 99 % confidence interval of `ratio`.
    pub low: f64,
    pub high: f64,
    /// The sign test's p-value that the run did not move (as many keys up as down).
    pub p_value: f64,
    /// How many keys it was estimated from.
    pub keys: usize,
}

impl RunShift {
    /// Estimates the shift from the keys' typical ratios (b / a, > 0); `None` under
    /// [`MIN_KEYS`] usable ratios.
    pub fn estimate(ratios: &[f64]) -> Option<RunShift> {
        let logs: Vec<f64> = ratios
            .iter()
            .filter(|r| r.is_finite() && **r > 0.0)
            .map(|r| r.ln())
            .collect();
        let k = logs.len();
        if k < MIN_KEYS {
            return None;
        }
        let centre = median(&logs)?;
        let deviations: Vec<f64> = logs.iter().map(|x| (x - centre).abs()).collect();
        let sigma = MAD_SIGMA * median(&deviations)?;
        let half_width = Z_99 * MEDIAN_SE * sigma / (k as f64).sqrt();
        let up = logs.iter().filter(|x| **x > 0.0).count();
        let down = logs.iter().filter(|x| **x < 0.0).count();
        Some(RunShift {
            ratio: centre.exp(),
            low: (centre - half_width).exp(),
            high: (centre + half_width).exp(),
            p_value: sign_test(up, down),
            keys: k,
        })
    }

    /// Whether the run moved as a whole (the sign test at the tests' level).
    pub fn is_significant(&self) -> bool {
        self.p_value < LEVEL_ALPHA
    }

    /// The shift for notes: `run-wide shift +3.1 % (99 % interval +2.8 % to +3.4 %, ...)`.
    pub fn describe(&self) -> String {
        let pct = |r: f64| format!("{:+.1} %", 100.0 * (r - 1.0));
        format!(
            "run-wide shift {} (99 % interval {} to {}, median of {} keys; sign test p = {})",
            pct(self.ratio),
            pct(self.low),
            pct(self.high),
            self.keys,
            short_p(self.p_value)
        )
    }
}

/// A p-value for notes: 4 significant places, `<0.0001` below.
pub fn short_p(p: f64) -> String {
    if p < 1e-4 {
        "<0.0001".into()
    } else {
        format!("{p:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_common_factor_is_found_and_a_few_changed_keys_do_not_move_it() {
        // 20 keys 3 % slower with a little spread, 3 of them 40 % slower on top.
        let mut ratios: Vec<f64> = (0..20).map(|i| 1.03 + 0.001 * (i % 5) as f64).collect();
        for r in ratios.iter_mut().take(3) {
            *r *= 1.4;
        }
        let s = RunShift::estimate(&ratios).unwrap();
        assert!((s.ratio - 1.033).abs() < 0.002, "{s:?}");
        assert!(
            s.low <= s.ratio && s.ratio <= s.high && s.high < 1.1,
            "{s:?}"
        );
        assert!(s.is_significant() && s.keys == 20, "{s:?}");
        // No common factor: half up, half down.
        let even: Vec<f64> = (0..20)
            .map(|i| if i % 2 == 0 { 1.01 } else { 0.99 })
            .collect();
        let s = RunShift::estimate(&even).unwrap();
        assert!(
            !s.is_significant() && (s.ratio - 1.0).abs() < 0.011,
            "{s:?}"
        );
        assert!(s.low < 1.0 && s.high > 1.0, "{s:?}");
        // The interval: ± 2.576 × 1.2533 × 1.4826 × MAD / √k around the median; here the
        // logs are ±0.01 around 0, so MAD ≈ 0.01.
        let want = 2.575_829 * 1.253_314 * 1.482_602 * 0.01 / 20f64.sqrt();
        assert!(
            (s.high.ln() - s.ratio.ln() - want).abs() < 2e-4,
            "{s:?} vs {want}"
        );
        // One key of eight far off neither moves the shift nor widens the interval past it.
        let mut seven_and_one = vec![1.0, 1.001, 0.999, 1.002, 0.998, 1.0005, 0.9995];
        seven_and_one.push(1.1);
        let s = RunShift::estimate(&seven_and_one).unwrap();
        assert!(s.high < 1.01 && s.low > 0.99, "{s:?}");
        // Seven keys are too few for the sign test; eight the same way are significant.
        assert_eq!(RunShift::estimate(&[1.05; 7]), None);
        let eight = RunShift::estimate(&[1.05; 8]).unwrap();
        assert!((eight.p_value - 2.0 / 256.0).abs() < 1e-12);
        assert!(RunShift::estimate(&[f64::NAN, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]).is_none());
        assert!(eight.describe().contains("+5.0 %"), "{}", eight.describe());
    }
}
