//! The statistics behind run comparisons: Student's t-test over steps, the Mann–Whitney U test,
//! medians, the coefficient of variation and Kendall's tau.
//!
//! Mann–Whitney (Wilcoxon rank-sum) is used on per-instance durations because they are skewed
//! and heavy-tailed (an occasional 3× instance), so a test on means would be dominated by
//! outliers; it needs no distributional assumption, only independent samples. Student's t-test
//! is used on per-step values: steps are the independent units (a slow step slows every kernel
//! in it), there are only a few of them, and each is the sum of many instances, hence close to
//! normal; a rank test on 3 vs 3 values can never reach p < 0.01.

/// Samples up to this size on both sides without ties get the exact distribution of U.
const EXACT_MAX: usize = 30;

/// Two-sided p-value of the Mann–Whitney U test that `a` and `b` come from the same
/// distribution. Exact (by counting arrangements) for small samples without ties, else the
/// normal approximation with tie and continuity corrections. `None` when a side is empty.
pub fn mann_whitney(a: &[i64], b: &[i64]) -> Option<f64> {
    let (m, n) = (a.len(), b.len());
    if m == 0 || n == 0 {
        return None;
    }
    // Ranks of the pooled sample (ties get their mean rank).
    let mut pooled: Vec<(i64, bool)> = a
        .iter()
        .map(|&v| (v, true))
        .chain(b.iter().map(|&v| (v, false)))
        .collect();
    pooled.sort_unstable_by_key(|p| p.0);
    let total = pooled.len();
    let mut rank_sum_a = 0.0;
    let mut tie_term = 0.0; // Σ (t³ - t) over tie groups
    let mut i = 0;
    while i < total {
        let mut j = i;
        while j + 1 < total && pooled[j + 1].0 == pooled[i].0 {
            j += 1;
        }
        let t = (j - i + 1) as f64;
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum_a += mean_rank * pooled[i..=j].iter().filter(|p| p.1).count() as f64;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let (mf, nf) = (m as f64, n as f64);
    let u = rank_sum_a - mf * (mf + 1.0) / 2.0;
    let mean = mf * nf / 2.0;
    if tie_term == 0.0 && m <= EXACT_MAX && n <= EXACT_MAX {
        return Some(exact_two_sided(m, n, u.round() as usize));
    }
    let nt = mf + nf;
    let var = mf * nf / 12.0 * ((nt + 1.0) - tie_term / (nt * (nt - 1.0)));
    if var <= 0.0 {
        return Some(1.0); // every value equal
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    Some((2.0 * normal_upper_tail(z)).min(1.0))
}

/// The smallest two-sided p-value [`mann_whitney`] can give samples of sizes `m` and `n`: that
/// of two fully separated samples without ties. A kernel whose smallest possible p-value cannot
/// pass a multiple-testing correction cannot be shown to have changed, whatever it did.
pub fn mann_whitney_min_p(m: usize, n: usize) -> f64 {
    if m == 0 || n == 0 {
        return 1.0;
    }
    let (mf, nf) = (m as f64, n as f64);
    if m <= EXACT_MAX && n <= EXACT_MAX {
        // Two arrangements of C(m + n, m) are as extreme: all of a below b, or all above.
        let ln_arrangements = ln_gamma(mf + nf + 1.0) - ln_gamma(mf + 1.0) - ln_gamma(nf + 1.0);
        return (2.0 * (-ln_arrangements).exp()).min(1.0);
    }
    let var = mf * nf * (mf + nf + 1.0) / 12.0;
    let z = (mf * nf / 2.0 - 0.5).max(0.0) / var.sqrt();
    (2.0 * normal_upper_tail(z)).min(1.0)
}

/// P(X <= k) for X ~ Binomial(n, 1/2).
pub fn binomial_half_cdf(k: usize, n: usize) -> f64 {
    let nf = n as f64;
    let ln_half_n = -nf * std::f64::consts::LN_2;
    (0..=k.min(n))
        .map(|i| {
            let i = i as f64;
            (ln_gamma(nf + 1.0) - ln_gamma(i + 1.0) - ln_gamma(nf - i + 1.0) + ln_half_n).exp()
        })
        .sum::<f64>()
        .min(1.0)
}

/// Two-sided p-value of the sign test: `up` of `up + down` values moved up, `down` moved down
/// (ties left out), against even odds.
pub fn sign_test(up: usize, down: usize) -> f64 {
    (2.0 * binomial_half_cdf(up.min(down), up + down)).min(1.0)
}

/// Holm's step-down correction with Tarone's count of testable hypotheses, for discrete tests.
/// `tests` holds each hypothesis' p-value and the smallest p-value its sample sizes allow.
/// A hypothesis whose smallest possible p-value cannot pass the correction can never be
/// rejected, so it is not counted: K is the smallest count such that at most K hypotheses have
/// a smallest p-value under `alpha / K`; those are tested by Holm with K in place of the number
/// of tests (the k-th smallest p-value against `alpha / (K - k + 1)`). This holds the chance of
/// any false rejection at `alpha` and gives back the power that hopeless tests would cost.
/// Returns each hypothesis' adjusted p-value (reject when under `alpha`), `None` when it was
/// not testable, and K.
pub fn holm_tarone(tests: &[(f64, f64)], alpha: f64) -> (Vec<Option<f64>>, usize) {
    let testable_at = |k: usize| tests.iter().filter(|t| t.1 < alpha / k as f64).count();
    let k = (1..=tests.len().max(1))
        .find(|&k| testable_at(k) <= k)
        .unwrap_or(tests.len().max(1));
    let mut order: Vec<usize> = (0..tests.len())
        .filter(|&i| tests[i].1 < alpha / k as f64)
        .collect();
    order.sort_by(|&x, &y| tests[x].0.total_cmp(&tests[y].0));
    let mut adjusted = vec![None; tests.len()];
    let mut running = 0.0f64;
    for (j, &i) in order.iter().enumerate() {
        running = running.max(((k - j) as f64 * tests[i].0).min(1.0));
        adjusted[i] = Some(running);
    }
    (adjusted, k)
}

/// P(|U - mn/2| >= |u - mn/2|) under the null, for samples of sizes m and n without ties.
fn exact_two_sided(m: usize, n: usize, u: usize) -> f64 {
    // counts[i][j][k]: arrangements of i values of a and j of b with U = k.
    let max_u = m * n;
    let mut prev: Vec<Vec<f64>> = vec![vec![0.0; max_u + 1]; n + 1];
    for row in prev.iter_mut() {
        row[0] = 1.0; // i = 0: U is 0 whatever j
    }
    for _i in 1..=m {
        let mut cur: Vec<Vec<f64>> = vec![vec![0.0; max_u + 1]; n + 1];
        cur[0][0] = 1.0;
        for j in 1..=n {
            for k in 0..=max_u {
                // The largest value is from a (it beats all j values of b) or from b.
                let from_a = if k >= j { prev[j][k - j] } else { 0.0 };
                cur[j][k] = from_a + cur[j - 1][k];
            }
        }
        prev = cur;
    }
    let dist = &prev[n];
    let all: f64 = dist.iter().sum();
    let centre = max_u as f64 / 2.0;
    let dev = (u as f64 - centre).abs();
    let tail: f64 = dist
        .iter()
        .enumerate()
        .filter(|(k, _)| (*k as f64 - centre).abs() >= dev - 1e-9)
        .map(|(_, c)| c)
        .sum();
    (tail / all).min(1.0)
}

/// P(Z > z) for a standard normal Z (Abramowitz–Stegun 7.1.26 via erfc; error < 1.5e-7).
fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

/// Two-sided p-value of Student's two-sample t-test (pooled variance, `m + n − 2` degrees of
/// freedom) that `a` and `b` have the same mean. `None` under two values a side. When neither
/// side varies at all, the p-value is 1 for equal means and 0 otherwise (a difference without
/// any noise is certain).
///
/// Pooled rather than Welch: with 3 steps a side, Welch's degrees of freedom are estimated from
/// the same 6 values and fall to 2 at random, which costs most of the power; pooling is robust
/// to unequal variances when the sides have similar sizes, and the false-alarm rate is measured
/// (`benches/gate_calibration.rs`), one deviant step included.
pub fn t_test(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (ma, mb) = (a.iter().sum::<f64>() / na, b.iter().sum::<f64>() / nb);
    let squares = |v: &[f64], m: f64| v.iter().map(|x| (x - m) * (x - m)).sum::<f64>();
    let df = na + nb - 2.0;
    let pooled = (squares(a, ma) + squares(b, mb)) / df;
    let se = (pooled * (1.0 / na + 1.0 / nb)).sqrt();
    if se <= 0.0 || !se.is_finite() {
        return Some(if ma == mb { 1.0 } else { 0.0 });
    }
    Some(student_t_two_sided((mb - ma) / se, df))
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2).
pub fn student_t_two_sided(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return 0.0;
    }
    regularized_beta(df / (df + t * t), df / 2.0, 0.5).clamp(0.0, 1.0)
}

/// The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
/// Lentz; Numerical Recipes §6.4), accurate to ~1e-12 for the small a, b used here.
fn regularized_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    // The fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - ln_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut c = 1.0;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    d = 1.0 / if d.abs() < TINY { TINY } else { d };
    let mut h = d;
    for m in 1..300 {
        let m = m as f64;
        for num in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            d = 1.0 / if d.abs() < TINY { TINY } else { d };
            c = 1.0 + num / c;
            if c.abs() < TINY {
                c = TINY;
            }
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-14 {
            break;
        }
    }
    h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error < 1e-13).
fn ln_gamma(x: f64) -> f64 {
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |s, (i, c)| s + c / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// Median of `v` (mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Median of integer values (mean of the two middle values for an even count).
pub fn median_ints(mut v: Vec<i64>) -> Option<f64> {
    v.sort_unstable();
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2] as f64),
        _ => Some((v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0),
    }
}

pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Coefficient of variation: sample standard deviation / mean (`None` under two values or a
/// zero mean).
pub fn cv(v: &[f64]) -> Option<f64> {
    let m = mean(v)?;
    if v.len() < 2 || m == 0.0 {
        return None;
    }
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64;
    Some(var.sqrt() / m)
}

/// Kendall's tau-b between two scorings of the same items (ties handled; `None` when either
/// side is constant or there are fewer than two items).
pub fn kendall_tau(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len().min(y.len());
    let (mut concordant, mut discordant, mut ties_x, mut ties_y) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let dx = (x[i] - x[j]).partial_cmp(&0.0)?;
            let dy = (y[i] - y[j]).partial_cmp(&0.0)?;
            use std::cmp::Ordering::Equal;
            match (dx, dy) {
                (Equal, Equal) => {}
                (Equal, _) => ties_x += 1,
                (_, Equal) => ties_y += 1,
                _ if dx == dy => concordant += 1,
                _ => discordant += 1,
            }
        }
    }
    let n1 = (concordant + discordant + ties_x) as f64;
    let n2 = (concordant + discordant + ties_y) as f64;
    (n1 > 0.0 && n2 > 0.0).then(|| (concordant - discordant) as f64 / (n1 * n2).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_mann_whitney_matches_the_tables() {
        // Completely separated 5 vs 5: two-sided p = 2 / C(10,5) = 2/252.
        let p = mann_whitney(&[1, 2, 3, 4, 5], &[6, 7, 8, 9, 10]).unwrap();
        assert!((p - 2.0 / 252.0).abs() < 1e-12, "{p}");
        // 3 vs 3 can never reach p < 0.1.
        let p = mann_whitney(&[1, 2, 3], &[4, 5, 6]).unwrap();
        assert!((p - 0.1).abs() < 1e-12, "{p}");
        // Interleaved samples: no evidence at all.
        let p = mann_whitney(&[1, 4, 5, 8], &[2, 3, 6, 7]).unwrap();
        assert!(p > 0.8, "{p}");
        // scipy.stats.mannwhitneyu([1,3,5,7,9], [2,4,6,8,10,12], method='exact') -> 0.4286
        let p = mann_whitney(&[1, 3, 5, 7, 9], &[2, 4, 6, 8, 10, 12]).unwrap();
        assert!((p - 0.428_571).abs() < 1e-4, "{p}");
    }

    #[test]
    fn normal_approximation_handles_ties_and_large_samples() {
        let a: Vec<i64> = (0..200).map(|i| i % 10).collect();
        let p = mann_whitney(&a, &a).unwrap();
        assert!(p > 0.99, "{p}");
        let b: Vec<i64> = a.iter().map(|v| v + 3).collect();
        let p = mann_whitney(&a, &b).unwrap();
        assert!(p < 1e-6, "{p}");
        assert_eq!(mann_whitney(&[5, 5, 5], &[5, 5]), Some(1.0));
        assert_eq!(mann_whitney(&[], &[1]), None);
        // z = 1.96 -> two-sided 0.05
        assert!((2.0 * normal_upper_tail(1.959_964) - 0.05).abs() < 1e-6);
    }

    #[test]
    fn student_t_matches_closed_forms_and_tables() {
        // df = 1 (Cauchy): p = 1 - 2 atan(t) / π; df = 2: p = 1 - t / sqrt(2 + t²).
        for t in [0.3, 1.0, 2.5, 12.706] {
            let cauchy = 1.0 - 2.0 * f64::atan(t) / std::f64::consts::PI;
            assert!((student_t_two_sided(t, 1.0) - cauchy).abs() < 1e-10, "{t}");
            let df2 = 1.0 - t / (2.0 + t * t).sqrt();
            assert!((student_t_two_sided(t, 2.0) - df2).abs() < 1e-10, "{t}");
        }
        // Table values: t(0.995; 4) = 4.604, t(0.975; 10) = 2.228, t(0.995; 30) = 2.750.
        assert!((student_t_two_sided(4.604_094, 4.0) - 0.01).abs() < 1e-6);
        assert!((student_t_two_sided(-2.228_139, 10.0) - 0.05).abs() < 1e-6);
        assert!((student_t_two_sided(2.749_996, 30.0) - 0.01).abs() < 1e-6);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        // [1, 2, 3] vs [4, 5, 6]: pooled variance 1, t = 3 / sqrt(2/3), 4 degrees of freedom.
        let p = t_test(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
        let t: f64 = 3.0 / (2.0f64 / 3.0).sqrt();
        assert!((p - student_t_two_sided(t, 4.0)).abs() < 1e-12, "{p}");
        // One value far off on one side of n gives |t| = 1 whatever its size: one slow step
        // alone is never significant.
        for off in [500.0, 5e6] {
            let p = t_test(&[100.0, 100.0, 100.0], &[100.0, 100.0, off]).unwrap();
            assert!((p - student_t_two_sided(1.0, 4.0)).abs() < 1e-12, "{p}");
        }
        assert_eq!(t_test(&[1.0], &[2.0, 3.0]), None);
        assert_eq!(t_test(&[7.0, 7.0], &[7.0, 7.0]), Some(1.0));
        assert_eq!(t_test(&[7.0, 7.0], &[8.0, 8.0]), Some(0.0));
    }

    #[test]
    fn smallest_mann_whitney_p_values_are_those_of_separated_samples() {
        for (m, n) in [
            (1, 1),
            (2, 2),
            (4, 4),
            (6, 6),
            (8, 8),
            (5, 9),
            (40, 40),
            (12, 31),
        ] {
            let a: Vec<i64> = (0..m as i64).collect();
            let b: Vec<i64> = (m as i64..(m + n) as i64).collect();
            let p = mann_whitney(&a, &b).unwrap();
            let min = mann_whitney_min_p(m, n);
            assert!(
                (p - min).abs() <= 1e-9 * p.max(1e-300),
                "{m} vs {n}: {p} vs {min}"
            );
        }
        // 6 vs 6: 2 / C(12, 6) = 2 / 924.
        assert!((mann_whitney_min_p(6, 6) - 2.0 / 924.0).abs() < 1e-12);
        assert_eq!(mann_whitney_min_p(0, 5), 1.0);
    }

    #[test]
    fn sign_test_and_binomial() {
        // 8 of 8 the same way: 2 / 256.
        assert!((sign_test(8, 0) - 2.0 / 256.0).abs() < 1e-12);
        assert!((sign_test(0, 8) - 2.0 / 256.0).abs() < 1e-12);
        // scipy.stats.binomtest(3, 10).pvalue = 0.34375
        assert!((sign_test(3, 7) - 0.343_75).abs() < 1e-9);
        assert_eq!(sign_test(5, 5), 1.0);
        assert!((binomial_half_cdf(2, 4) - 11.0 / 16.0).abs() < 1e-12);
        assert!((binomial_half_cdf(600, 1000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn holm_tarone_counts_only_testable_hypotheses() {
        // Plain Holm when every test can reach significance: 3 tests.
        let (adj, k) = holm_tarone(&[(0.001, 0.0), (0.004, 0.0), (0.03, 0.0)], 0.01);
        assert_eq!(k, 3);
        let adj: Vec<f64> = adj.into_iter().map(Option::unwrap).collect();
        assert!((adj[0] - 0.003).abs() < 1e-12 && (adj[1] - 0.008).abs() < 1e-12);
        assert!((adj[2] - 0.03).abs() < 1e-12);
        // Ten hopeless tests (smallest p 0.1) beside two good ones: K = 2, not 12.
        let mut tests = vec![(0.004, 1e-6), (0.2, 1e-6)];
        tests.extend([(0.5, 0.1); 10]);
        let (adj, k) = holm_tarone(&tests, 0.01);
        assert_eq!(k, 2);
        assert!((adj[0].unwrap() - 0.008).abs() < 1e-12);
        assert!(adj[2..].iter().all(Option::is_none));
        // Adjusted p-values never decrease with the raw ones.
        let (adj, _) = holm_tarone(&[(0.002, 0.0), (0.0021, 0.0), (0.0022, 0.0)], 0.01);
        assert!(adj.windows(2).all(|w| w[0] <= w[1]), "{adj:?}");
        assert_eq!(holm_tarone(&[], 0.01).0, Vec::<Option<f64>>::new());
    }

    #[test]
    fn kendall_and_cv() {
        assert_eq!(
            kendall_tau(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]),
            Some(1.0)
        );
        assert_eq!(kendall_tau(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), Some(-1.0));
        let t = kendall_tau(&[1.0, 2.0, 3.0, 4.0], &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((t - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(kendall_tau(&[1.0, 1.0], &[1.0, 2.0]), None);
        let c = cv(&[9.0, 10.0, 11.0]).unwrap();
        assert!((c - 0.1).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
    }
}
