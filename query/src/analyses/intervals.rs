//! Half-open `[start, end)` interval sets in exact nanoseconds.

/// The union of `iv` as sorted, disjoint, non-touching intervals (`[1,3)` and `[3,5)` merge).
pub fn union(iv: impl IntoIterator<Item = (i64, i64)>) -> Vec<(i64, i64)> {
    let mut v: Vec<(i64, i64)> = iv.into_iter().filter(|&(s, e)| e >= s).collect();
    v.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for next in v {
        push_coalesced(&mut out, next);
    }
    out
}

/// Appends `next` to a union being built from intervals in start order: it extends the last
/// interval when it overlaps or touches it. The one merge step of every union in gpuq (here
/// and in the `busy_time` / `idle_ratio` accumulators).
#[inline]
pub(crate) fn push_coalesced(out: &mut Vec<(i64, i64)>, next: (i64, i64)) {
    match out.last_mut() {
        Some(last) if next.0 <= last.1 => last.1 = last.1.max(next.1),
        _ => out.push(next),
    }
}

/// Total length of a sorted disjoint set.
pub fn length(set: &[(i64, i64)]) -> i64 {
    set.iter().map(|&(s, e)| e - s).sum()
}

/// `a ∩ b` of two sorted disjoint sets.
pub fn intersect(a: &[(i64, i64)], b: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a \ b` of two sorted disjoint sets.
pub fn subtract(a: &[(i64, i64)], b: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(s, e) in a {
        let mut cur = s;
        while j < b.len() && b[j].1 <= cur {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > cur {
                out.push((cur, b[k].0));
            }
            cur = cur.max(b[k].1);
            k += 1;
        }
        if cur < e {
            out.push((cur, e));
        }
    }
    out
}

/// Length of `set ∩ [lo, hi)`, for a sorted disjoint `set`.
pub fn covered(set: &[(i64, i64)], lo: i64, hi: i64) -> i64 {
    let first = set.partition_point(|&(_, e)| e <= lo);
    set[first..]
        .iter()
        .take_while(|&&(s, _)| s < hi)
        .map(|&(s, e)| e.min(hi) - s.max(lo))
        .filter(|&n| n > 0)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force over unit cells.
    fn cells(set: &[(i64, i64)]) -> Vec<i64> {
        set.iter().flat_map(|&(s, e)| s..e).collect()
    }

    #[test]
    fn set_operations_equal_a_cell_by_cell_brute_force() {
        let mut seed = 7u64;
        let mut next = |m: i64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as i64) % m
        };
        for _ in 0..300 {
            let mut gen = |n| {
                (0..n)
                    .map(|_| {
                        let s = next(60);
                        (s, s + next(9))
                    })
                    .collect::<Vec<_>>()
            };
            let (ra, rb) = (gen(6), gen(5));
            let (a, b) = (union(ra.clone()), union(rb.clone()));
            let in_any = |r: &[(i64, i64)], x: i64| r.iter().any(|&(s, e)| s <= x && x < e);
            let all: Vec<i64> = (0..80).collect();
            let want_a: Vec<i64> = all.iter().copied().filter(|&x| in_any(&ra, x)).collect();
            assert_eq!(cells(&a), want_a);
            assert_eq!(length(&a), want_a.len() as i64);
            let want: Vec<i64> = want_a.iter().copied().filter(|&x| in_any(&rb, x)).collect();
            assert_eq!(cells(&intersect(&a, &b)), want);
            let want: Vec<i64> = want_a
                .iter()
                .copied()
                .filter(|&x| !in_any(&rb, x))
                .collect();
            assert_eq!(cells(&subtract(&a, &b)), want, "{a:?} - {b:?}");
            let (lo, hi) = (next(40), 40 + next(40));
            let want = want_a.iter().filter(|&&x| lo <= x && x < hi).count() as i64;
            assert_eq!(covered(&a, lo, hi), want);
            // Disjoint and not touching.
            assert!(a.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}
