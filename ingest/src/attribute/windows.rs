//! Windows of rows attributed one at a time when a trace is too large to attribute at once:
//! where each window starts ([`window_starts`], from a bounded [`RowSample`] of the rows) and
//! which window a row goes to ([`window_of`]). The spool sorts frames into these windows.

use std::collections::BTreeMap;

/// Where the first window starts: before every (process, time), a null pid included.
pub const FIRST_WINDOW: (i64, i64) = (i64::MIN, i64::MIN);

/// The window of `starts` (rising, the first [`FIRST_WINDOW`]) that a row of `process` at
/// `ts` goes to: the last that starts at or before it.
#[inline]
pub fn window_of(starts: &[(i64, i64)], process: i64, ts: i64) -> usize {
    starts.partition_point(|&start| start <= (process, ts)) - 1
}

/// Where windows of about `rows` rows start, from a sample of the rows' `(time, weight)` by
/// process (`i64::MIN`: rows without one), for [`Spool::set_windows`](crate::spool::Spool::set_windows). A process with few rows
/// joins the window before it; every other process starts a window of its own.
pub fn window_starts(samples: BTreeMap<i64, Vec<(i64, f64)>>, rows: usize) -> Vec<(i64, i64)> {
    let rows = rows.max(1) as f64;
    let mut starts: Vec<(i64, i64)> = vec![FIRST_WINDOW];
    // Estimated rows of the last window so far.
    let mut last_window = 0.0;
    for (process, mut times) in samples {
        let weight: f64 = times.iter().map(|&(_, w)| w).sum();
        if last_window + weight <= rows * 1.5 {
            // Few rows: they join the window before (rows without a process: the first).
            last_window += weight;
            continue;
        }
        times.sort_unstable_by_key(|&(t, _)| t);
        let count = (weight / rows).round().max(1.0);
        if process != i64::MIN {
            starts.push((process, i64::MIN));
        }
        let mut seen = 0.0;
        let mut next = 1.0;
        let mut since = 0.0;
        for &(t, w) in &times {
            if next < count && seen >= weight * next / count {
                if starts.last().is_some_and(|&last| last < (process, t)) {
                    starts.push((process, t));
                    since = 0.0;
                }
                next += 1.0;
            }
            seen += w;
            since += w;
        }
        last_window = since;
    }
    starts
}

/// Entries of a [`RowSample`] at most.
pub const SAMPLE_CAP: usize = 1 << 16;

/// A sample of rows' `(process, time)` as they stream past, of bounded size: one row in
/// `stride` on average, the stride doubling (and every other entry dropped) whenever the
/// sample is full. The gaps between sampled rows are random (1 to `2 * stride - 1`), so that
/// rows repeating in a pattern (every other row GPU work, say) are not sampled in step with it.
/// Windows are chosen from it ([`window_starts`]) when rows come in no useful order.
pub struct RowSample {
    entries: Vec<(i64, i64)>,
    stride: u64,
    /// Rows to pass before the next entry.
    skip: u64,
    /// xorshift64 state.
    random: u64,
}

impl Default for RowSample {
    fn default() -> Self {
        RowSample {
            entries: Vec::new(),
            stride: 1,
            skip: 0,
            random: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl RowSample {
    /// Counts `rows` rows, calling `row(i)` for those sampled (`i` from 0, rising): its
    /// `(process, time)`, or `None` for a row not to count in windows (e.g. GPU work).
    pub fn add(&mut self, rows: usize, mut row: impl FnMut(usize) -> Option<(i64, i64)>) {
        let mut i = self.skip;
        while (i as usize) < rows {
            if let Some(entry) = row(i as usize) {
                self.entries.push(entry);
            }
            if self.entries.len() >= SAMPLE_CAP {
                let mut keep = false;
                self.entries.retain(|_| {
                    keep = !keep;
                    keep
                });
                self.stride *= 2;
            }
            i += 1 + self.next_skip();
        }
        self.skip = i - rows as u64;
    }

    /// Rows to pass: uniform in `0..2 * stride - 1`, so one row in `stride` on average.
    fn next_skip(&mut self) -> u64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        x % (2 * self.stride - 1)
    }

    /// The sample by process, each entry standing for `stride` rows.
    pub fn by_process(&self) -> BTreeMap<i64, Vec<(i64, f64)>> {
        let mut samples: BTreeMap<i64, Vec<(i64, f64)>> = BTreeMap::new();
        for &(process, t) in &self.entries {
            samples
                .entry(process)
                .or_default()
                .push((t, self.stride as f64));
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_sample_stays_small_and_even() {
        let mut sample = RowSample::default();
        // 10 M rows in batches of 3,000: process 1 at times 0.., every tenth row GPU work
        // (not sampled), and process 2 with a tenth of the rows.
        let total = 10_000_000usize;
        let mut seen = 0;
        while seen < total {
            let n = 3_000.min(total - seen);
            sample.add(n, |i| {
                let row = seen + i;
                match row % 10 {
                    0 => None,
                    1 => Some((2, row as i64)),
                    _ => Some((1, row as i64)),
                }
            });
            seen += n;
        }
        let by_process = sample.by_process();
        let entries: usize = by_process.values().map(Vec::len).sum();
        assert!(
            entries <= SAMPLE_CAP && entries > SAMPLE_CAP / 4,
            "{entries} entries"
        );
        let weight = |p: i64| by_process[&p].iter().map(|&(_, w)| w).sum::<f64>();
        // Each entry stands for its share of the rows: 80 % and 10 %.
        assert!(
            (weight(1) / total as f64 - 0.8).abs() < 0.01,
            "{}",
            weight(1)
        );
        assert!(
            (weight(2) / total as f64 - 0.1).abs() < 0.01,
            "{}",
            weight(2)
        );
        // Evenly spread: windows of a tenth of process 1's rows start near each tenth of time.
        let starts = window_starts(by_process, total * 8 / 100);
        let ones: Vec<i64> = starts.iter().filter(|s| s.0 == 1).map(|s| s.1).collect();
        assert_eq!(ones.len(), 10, "{starts:?}");
        for (k, &t) in ones.iter().enumerate().skip(1) {
            let want = (k * total / 10) as i64;
            assert!(
                (t - want).abs() < total as i64 / 100,
                "window {k} starts at {t}"
            );
        }
    }
}
