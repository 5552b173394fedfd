//! `overlap(a_ts, a_dur, b_ts, b_dur)`: nanoseconds shared by two intervals.

use datafusion::arrow::array::{Array, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use std::sync::{Arc, LazyLock};

/// `overlap(a_ts, a_dur, b_ts, b_dur) -> Int64`: the length in ns of the intersection of
/// `[a_ts, a_ts + a_dur)` and `[b_ts, b_ts + b_dur)`, i.e.
/// `max(0, min(a_ts + a_dur, b_ts + b_dur) - max(a_ts, b_ts))`.
///
/// 0 when the intervals are disjoint or only touch; NULL when any argument is NULL. A negative
/// duration is an empty interval (overlap 0). Arithmetic saturates instead of overflowing.
///
/// ```sql
/// SELECT overlap(0, 10, 5, 10);   -- 5
/// SELECT sum(overlap(a.ts, a.dur, b.ts, b.dur)) FROM kernels a JOIN kernels b
///   ON a.run = b.run AND a.stream < b.stream AND a.ts < b.ts + b.dur AND b.ts < a.ts + a.dur;
/// ```
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Overlap {
    signature: Signature,
}

impl Overlap {
    pub fn new() -> Self {
        Self {
            signature: Signature::uniform(4, vec![DataType::Int64], Volatility::Immutable),
        }
    }
}

impl Default for Overlap {
    fn default() -> Self {
        Self::new()
    }
}

/// The scalar definition, shared with the tests.
pub fn overlap(a_ts: i64, a_dur: i64, b_ts: i64, b_dur: i64) -> i64 {
    let end = a_ts.saturating_add(a_dur).min(b_ts.saturating_add(b_dur));
    let start = a_ts.max(b_ts);
    end.saturating_sub(start).max(0)
}

static DOC: LazyLock<Documentation> = LazyLock::new(|| {
    Documentation::builder(
        super::DOC_SECTION,
        "Nanoseconds shared by the intervals [a_ts, a_ts + a_dur) and [b_ts, b_ts + b_dur): \
         max(0, min(a_end, b_end) - max(a_ts, b_ts)). 0 when disjoint, NULL if any argument is NULL.",
        "overlap(a_ts, a_dur, b_ts, b_dur)",
    )
    .with_sql_example("SELECT overlap(0, 10, 5, 10); -- 5")
    .with_argument("a_ts", "start of the first interval (ns)")
    .with_argument("a_dur", "length of the first interval (ns)")
    .with_argument("b_ts", "start of the second interval (ns)")
    .with_argument("b_dur", "length of the second interval (ns)")
    .build()
});

impl ScalarUDFImpl for Overlap {
    fn name(&self) -> &str {
        "overlap"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [a, ad, b, bd] = [0, 1, 2, 3].map(|i| arrays[i].as_primitive::<Int64Type>());
        let n = a.len();
        let out: Int64Array =
            if a.null_count() + ad.null_count() + b.null_count() + bd.null_count() == 0 {
                let (a, ad, b, bd) = (a.values(), ad.values(), b.values(), bd.values());
                Int64Array::from_iter_values((0..n).map(|i| overlap(a[i], ad[i], b[i], bd[i])))
            } else {
                (0..n)
                    .map(|i| {
                        if a.is_null(i) || ad.is_null(i) || b.is_null(i) || bd.is_null(i) {
                            None
                        } else {
                            Some(overlap(a.value(i), ad.value(i), b.value(i), bd.value(i)))
                        }
                    })
                    .collect()
            };
        if all_scalar {
            Ok(ColumnarValue::Scalar(
                datafusion::common::ScalarValue::try_from_array(&out, 0)?,
            ))
        } else {
            Ok(ColumnarValue::Array(Arc::new(out)))
        }
    }

    fn documentation(&self) -> Option<&Documentation> {
        Some(&DOC)
    }
}
