//! `gap(ts, dur) OVER (PARTITION BY .. ORDER BY ts)`: idle time before each interval.

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{
    Documentation, PartitionEvaluator, Signature, Volatility, WindowUDFImpl,
};
use std::ops::Range;
use std::sync::{Arc, LazyLock};

/// `gap(ts, dur) OVER (PARTITION BY .. ORDER BY ts) -> Int64`: nanoseconds of idle time before
/// this interval, `max(0, ts - F)` where `F` is the *busy frontier*, the furthest end
/// `max(ts_j + dur_j)` over the earlier rows of the partition (not just the previous row: with
/// overlapping intervals, e.g. `PARTITION BY run, device` over several streams, a short interval
/// nested in a long one is not followed by idle time).
///
/// NULL for the first interval of a partition, and for rows whose `ts`/`dur` is NULL or whose
/// `dur` is negative (those rows do not move the frontier either). Rows are taken in the window's
/// `ORDER BY` order; with ties on `ts` the per-row values depend on the tie order (add a
/// tiebreaker such as `ORDER BY ts, dur`), but `sum(gap)` per partition does not.
///
/// The evaluator keeps O(1) state and supports bounded execution, so with input already sorted
/// by (partition keys, ts) and `prefer_existing_sort` it runs as a streaming
/// `BoundedWindowAggExec` without a `SortExec`. (`sort_options` is deliberately left `None`:
/// that hook declares the *output* of the function as ordered, which `gap` is not.)
///
/// ```sql
/// SELECT name, ts, gap(ts, dur) OVER (PARTITION BY run, device, stream ORDER BY ts) AS idle
/// FROM kernels;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Gap {
    signature: Signature,
}

impl Gap {
    pub fn new() -> Self {
        Self {
            signature: Signature::uniform(2, vec![DataType::Int64], Volatility::Immutable),
        }
    }
}

impl Default for Gap {
    fn default() -> Self {
        Self::new()
    }
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Idle nanoseconds before this interval: max(0, ts - furthest end of the earlier rows of \
         the partition). NULL for the first row and for rows with NULL ts/dur or negative dur.",
        "gap(ts, dur) OVER (PARTITION BY key ORDER BY ts)",
    )
    .with_sql_example(
        "SELECT ts, gap(ts, dur) OVER (PARTITION BY run, stream ORDER BY ts) FROM kernels;",
    )
    .with_argument("ts", "interval start (ns)")
    .with_argument("dur", "interval length (ns)")
    .build()
});

impl WindowUDFImpl for Gap {
    fn name(&self) -> &str {
        "gap"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn partition_evaluator(
        &self,
        _args: PartitionEvaluatorArgs,
    ) -> Result<Box<dyn PartitionEvaluator>> {
        Ok(Box::new(GapEvaluator::default()))
    }

    fn field(&self, field_args: WindowUDFFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(
            field_args.name(),
            DataType::Int64,
            true,
        )))
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOC)
    }
}

/// Per-partition state: the busy frontier so far (None before the first interval).
#[derive(Debug, Default)]
pub(crate) struct GapEvaluator {
    frontier: Option<i64>,
}

impl GapEvaluator {
    #[inline]
    fn step(&mut self, ts: i64, dur: i64) -> Option<i64> {
        if dur < 0 {
            return None;
        }
        let end = ts.saturating_add(dur);
        match self.frontier {
            None => {
                self.frontier = Some(end);
                None
            }
            Some(f) => {
                self.frontier = Some(f.max(end));
                Some(ts.saturating_sub(f).max(0))
            }
        }
    }
}

impl PartitionEvaluator for GapEvaluator {
    fn is_causal(&self) -> bool {
        true
    }

    fn supports_bounded_execution(&self) -> bool {
        true
    }

    fn uses_window_frame(&self) -> bool {
        false
    }

    /// Bounded (streaming) path: called once per row, in order; `range` is the current row.
    fn evaluate(&mut self, values: &[ArrayRef], range: &Range<usize>) -> Result<ScalarValue> {
        let i = range.end - 1;
        let ts = values[0].as_primitive::<Int64Type>();
        let dur = values[1].as_primitive::<Int64Type>();
        let out = if ts.is_null(i) || dur.is_null(i) {
            None
        } else {
            self.step(ts.value(i), dur.value(i))
        };
        Ok(ScalarValue::Int64(out))
    }

    /// Whole-partition path (`WindowAggExec`).
    fn evaluate_all(&mut self, values: &[ArrayRef], num_rows: usize) -> Result<ArrayRef> {
        let ts = values[0].as_primitive::<Int64Type>();
        let dur = values[1].as_primitive::<Int64Type>();
        let out: Int64Array = if ts.null_count() + dur.null_count() == 0 {
            let (t, d) = (ts.values(), dur.values());
            (0..num_rows).map(|i| self.step(t[i], d[i])).collect()
        } else {
            (0..num_rows)
                .map(|i| {
                    if ts.is_null(i) || dur.is_null(i) {
                        None
                    } else {
                        self.step(ts.value(i), dur.value(i))
                    }
                })
                .collect()
        };
        Ok(Arc::new(out))
    }
}
