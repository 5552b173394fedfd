//! gpuq's SQL functions, registered in every session by [`register_all`].
//!
//! | function | kind | result |
//! |---|---|---|
//! | [`overlap(a_ts, a_dur, b_ts, b_dur)`](overlap) | scalar | Int64 ns shared by two intervals |
//! | [`gap(ts, dur) OVER (PARTITION BY .. ORDER BY ts)`](gap) | window | Int64 ns idle before each interval |
//! | [`busy_time(ts, dur [, window_start, window_end])`](busy) | aggregate | Int64 ns length of the union |
//! | [`idle_ratio(ts, dur [, window_start, window_end])`](busy) | aggregate | Float64 idle share of the span/window |
//! | [`fmt_dur(ns)`, `dur(text)`](durations) | scalar | human durations and back |
//! | [`kernel_class(name)`](kernel_class) | scalar | gemm, conv, attention, ... |
//! | [`demangle(name)`, `short_name(name)`](demangle) | scalar | C++ kernel names |
//! | [`json_get(json, key_or_index, ...)`, `json_get_int`, `json_get_float`, `json_get_json`](json) | scalar | a value inside JSON text (`args`, `runs.metadata`) |
//! | [`json -> key_or_index`, `json ->> key_or_index`](json_ops) | operator | JSON text / text of a value inside JSON text |
//!
//! Intervals are half-open `[ts, ts + dur)` in nanoseconds. Everywhere, a row with a NULL `ts`/`dur`
//! or a negative `dur` is not an interval: scalar functions return NULL for it, aggregates skip it.

pub mod busy;
pub mod demangle;
pub mod durations;
pub mod gap;
pub mod json;
pub mod json_ops;
pub mod kernel_class;
pub mod overlap;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::{AggregateUDF, ColumnarValue, DocSection, ScalarUDF, WindowUDF};
use std::collections::HashMap;

/// The documentation section of every gpuq function.
pub(crate) const DOC_SECTION: DocSection = DocSection {
    include: true,
    label: "GPU timeline functions",
    description: Some("gpuq functions over [ts, ts + dur) intervals and kernel names"),
};

/// Registers every gpuq function in `ctx`.
pub fn register_all(ctx: &SessionContext) {
    for f in scalar_functions() {
        ctx.register_udf(f);
    }
    for f in aggregate_functions() {
        ctx.register_udaf(f);
    }
    for f in window_functions() {
        ctx.register_udwf(f);
    }
    ctx.state_ref()
        .write()
        .register_expr_planner(std::sync::Arc::new(json_ops::JsonOperators))
        .expect("a session state accepts expression planners");
}

/// The scalar functions (for registries other than a [`SessionContext`]).
pub fn scalar_functions() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::from(overlap::Overlap::new()),
        ScalarUDF::from(durations::FmtDur::new()),
        ScalarUDF::from(durations::Dur::new()),
        ScalarUDF::from(kernel_class::KernelClass::new()),
        ScalarUDF::from(demangle::Demangle::new()),
        ScalarUDF::from(demangle::ShortName::new()),
        ScalarUDF::from(json::JsonGet::new()),
        ScalarUDF::from(json::JsonGetInt::new()),
        ScalarUDF::from(json::JsonGetFloat::new()),
        ScalarUDF::from(json::JsonGetJson::new()),
    ]
}

/// The aggregate functions.
pub fn aggregate_functions() -> Vec<AggregateUDF> {
    vec![
        AggregateUDF::from(busy::BusyTime::new()),
        AggregateUDF::from(busy::IdleRatio::new()),
    ]
}

/// The window functions.
pub fn window_functions() -> Vec<WindowUDF> {
    vec![WindowUDF::from(gap::Gap::new())]
}

/// Implements a scalar function on `$ty`, a struct holding its `signature`: `new` and
/// `Default` (a user-defined signature), and `ScalarUDFImpl` with the name, the documentation
/// `$doc`, argument coercion by `$coerce(name, arg_types)`, the result type `$result` and the
/// body `$invoke(args: ScalarFunctionArgs)`.
macro_rules! scalar_udf {
    ($ty:ident, $name:literal, $doc:ident, $coerce:expr, $result:expr, $invoke:expr) => {
        impl $ty {
            pub fn new() -> Self {
                Self {
                    signature: datafusion::logical_expr::Signature::user_defined(
                        datafusion::logical_expr::Volatility::Immutable,
                    ),
                }
            }
        }

        impl Default for $ty {
            fn default() -> Self {
                Self::new()
            }
        }

        impl datafusion::logical_expr::ScalarUDFImpl for $ty {
            fn name(&self) -> &str {
                $name
            }

            fn signature(&self) -> &datafusion::logical_expr::Signature {
                &self.signature
            }

            fn coerce_types(
                &self,
                arg_types: &[datafusion::arrow::datatypes::DataType],
            ) -> datafusion::error::Result<Vec<datafusion::arrow::datatypes::DataType>> {
                ($coerce)($name, arg_types)
            }

            fn return_type(
                &self,
                _arg_types: &[datafusion::arrow::datatypes::DataType],
            ) -> datafusion::error::Result<datafusion::arrow::datatypes::DataType> {
                Ok($result)
            }

            fn invoke_with_args(
                &self,
                args: datafusion::logical_expr::ScalarFunctionArgs,
            ) -> datafusion::error::Result<datafusion::logical_expr::ColumnarValue> {
                ($invoke)(args)
            }

            fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
                Some(&$doc)
            }
        }
    };
}
pub(crate) use scalar_udf;

/// Coercion for the text functions: keep string and dictionary-of-string arguments (so a
/// dictionary-encoded `name` column is classified once per distinct value), cast anything else
/// to Utf8.
pub(crate) fn coerce_text_arg(name: &str, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    if arg_types.len() != 1 {
        return datafusion::common::plan_err!("{name} takes one argument, got {}", arg_types.len());
    }
    Ok(vec![match &arg_types[0] {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => arg_types[0].clone(),
        DataType::Dictionary(_, v)
            if matches!(
                v.as_ref(),
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) =>
        {
            arg_types[0].clone()
        }
        _ => DataType::Utf8,
    }])
}

/// Applies `f` to every non-NULL string of a text argument, returning a Utf8 column. Dictionary
/// inputs are mapped once per dictionary value; plain string inputs memoise repeated values.
pub(crate) fn map_text(
    arg: &ColumnarValue,
    num_rows: usize,
    f: impl Fn(&str) -> Result<String>,
) -> Result<ColumnarValue> {
    let scalar = matches!(arg, ColumnarValue::Scalar(_));
    let array = match arg {
        ColumnarValue::Array(a) => a.clone(),
        ColumnarValue::Scalar(s) => s.to_array_of_size(1)?,
    };
    let out: ArrayRef = if let Some(dict) = array.as_any_dictionary_opt() {
        let values = map_plain(dict.values(), &f)?;
        let keys = cast(dict.keys(), &DataType::UInt32)?;
        take(&values, &keys, None)?
    } else {
        map_plain(&array, &f)?
    };
    if scalar {
        let s = datafusion::common::ScalarValue::try_from_array(&out, 0)?;
        Ok(ColumnarValue::Scalar(s))
    } else {
        debug_assert_eq!(out.len(), num_rows.max(out.len()));
        Ok(ColumnarValue::Array(out))
    }
}

fn map_plain(array: &ArrayRef, f: &impl Fn(&str) -> Result<String>) -> Result<ArrayRef> {
    let strings = cast(array, &DataType::Utf8)?;
    let strings = strings.as_string::<i32>();
    let mut memo: HashMap<&str, usize> = HashMap::new();
    let mut results: Vec<String> = Vec::new();
    let mut out: Vec<Option<usize>> = Vec::with_capacity(strings.len());
    for s in strings.iter() {
        out.push(match s {
            None => None,
            Some(s) => Some(match memo.get(s) {
                Some(&i) => i,
                None => {
                    results.push(f(s)?);
                    memo.insert(s, results.len() - 1);
                    results.len() - 1
                }
            }),
        });
    }
    let array: StringArray = out
        .into_iter()
        .map(|i| i.map(|i| results[i].as_str()))
        .collect();
    Ok(std::sync::Arc::new(array))
}

#[cfg(test)]
mod tests;
