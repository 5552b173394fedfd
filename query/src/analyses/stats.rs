//! The statistics behind run comparisons: the Mann–Whitney U test, medians, the coefficient of
//! variation and Kendall's tau.
//!
//! Mann–Whitney (Wilcoxon rank-sum) is used because per-step and per-instance durations are
//! skewed and heavy-tailed (an occasional slow step), so a test on means would be dominated by
//! outliers; it needs no distributional assumption, only independent samples.

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
