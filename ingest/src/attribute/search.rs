//! Binary search started near a hint, shared by the resolver and the launch index.

/// First index of `slice` where `pred` is false (`pred` true then false, as for
/// `partition_point`), searched outward from `hint`: successive lookups of nearby values cost
/// a few comparisons instead of a full binary search over millions of entries.
pub fn partition_point_near<T>(slice: &[T], hint: usize, pred: impl Fn(&T) -> bool) -> usize {
    let n = slice.len();
    let hint = hint.min(n);
    let (mut lo, mut hi);
    if hint < n && pred(&slice[hint]) {
        // The answer is after `hint`.
        let mut step = 1;
        lo = hint + 1;
        hi = lo;
        while hi < n && pred(&slice[hi]) {
            lo = hi + 1;
            hi = (hi + step).min(n);
            step *= 2;
        }
        hi = hi.min(n);
    } else {
        // The answer is at or before `hint`.
        let mut step = 1;
        hi = hint;
        lo = hint;
        while lo > 0 && !pred(&slice[lo - 1]) {
            hi = lo - 1;
            lo = lo.saturating_sub(step);
            step *= 2;
        }
    }
    lo + slice[lo..hi].partition_point(pred)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_point_near_equals_partition_point_from_any_hint() {
        let v: Vec<i64> = vec![1, 3, 3, 5, 8, 8, 8, 13, 21, 34];
        for t in -1..40 {
            let want = v.partition_point(|&x| x <= t);
            for hint in 0..=v.len() + 2 {
                assert_eq!(
                    partition_point_near(&v, hint, |&x| x <= t),
                    want,
                    "t {t} hint {hint}"
                );
            }
        }
        let empty: Vec<i64> = Vec::new();
        assert_eq!(partition_point_near(&empty, 3, |&x| x <= 1), 0);
    }
}
