//! JSON access in SQL: `json_get`, `json_get_int`, `json_get_float` and `json_get_json` read
//! one value inside JSON text (`events.args`, `runs.metadata`, `runs.devices`) by a path of
//! object keys and array indexes (the `->` and `->>` operators plan onto them:
//! [`super::json_ops`]).
//!
//! Written on serde_json rather than taken from the `datafusion-functions-json` crate: its
//! release for DataFusion 55 brings jiter, whose features on `lexical-core`, `ahash` and
//! `smallvec` (shared with arrow) would rebuild arrow and DataFusion.

use datafusion::arrow::array::{
    Array, ArrayBuilder, ArrayRef, AsArray, Float64Builder, Int64Builder, StringBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{plan_err, ScalarValue};
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, Documentation, ScalarFunctionArgs, Signature};
use serde_json::Value;
use std::sync::{Arc, LazyLock};

/// One step of a path: an object key (text argument) or an array index (integer argument;
/// negative counts from the end).
enum PathStep<'a> {
    Key(&'a str),
    Index(i64),
}

/// The value at `path` inside `value`, if there is one.
fn lookup<'v>(mut value: &'v Value, path: &[PathStep<'_>]) -> Option<&'v Value> {
    for step in path {
        value = match (step, value) {
            (PathStep::Key(k), Value::Object(o)) => o.get(*k)?,
            (PathStep::Index(i), Value::Array(a)) => {
                let i = if *i < 0 { a.len() as i64 + i } else { *i };
                a.get(usize::try_from(i).ok()?)?
            }
            _ => return None,
        };
    }
    Some(value)
}

/// Text for the JSON argument, Utf8 or Int64 for each path element.
fn coerce_json_args(name: &str, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    if arg_types.is_empty() {
        return plan_err!("{name} takes the JSON text and then keys or indexes");
    }
    let mut out = vec![DataType::Utf8];
    for t in &arg_types[1..] {
        out.push(match t {
            t if t.is_integer() => DataType::Int64,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => {
                DataType::Utf8
            }
            DataType::Dictionary(_, v)
                if matches!(
                    v.as_ref(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) =>
            {
                DataType::Utf8
            }
            other => return plan_err!("{name}: a path element is a key or an index, not {other}"),
        });
    }
    Ok(out)
}

/// Calls `push` with the value each row's path finds (None: NULL text, invalid JSON, a NULL
/// path element or nothing there), and returns the builder's column (a scalar when every
/// argument is one).
fn map_json<B: ArrayBuilder>(
    args: &ScalarFunctionArgs,
    mut builder: B,
    mut push: impl FnMut(&mut B, Option<&Value>),
) -> Result<ColumnarValue> {
    let scalar = args
        .args
        .iter()
        .all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let arrays = ColumnarValue::values_to_arrays(&args.args)?;
    let texts = cast(&arrays[0], &DataType::Utf8)?;
    let texts = texts.as_string::<i32>();
    let path_args: Vec<ArrayRef> = arrays[1..].to_vec();
    let mut path = Vec::with_capacity(path_args.len());
    for row in 0..texts.len() {
        path.clear();
        let complete = path_args.iter().all(|a| {
            if a.is_null(row) {
                return false;
            }
            match a.data_type() {
                DataType::Int64 => {
                    path.push(PathStep::Index(a.as_primitive::<Int64Type>().value(row)))
                }
                _ => path.push(PathStep::Key(a.as_string::<i32>().value(row))),
            }
            true
        });
        let parsed = (complete && texts.is_valid(row))
            .then(|| serde_json::from_str::<Value>(texts.value(row)).ok())
            .flatten();
        push(&mut builder, parsed.as_ref().and_then(|v| lookup(v, &path)));
    }
    let out: ArrayRef = Arc::new(builder.finish());
    Ok(if scalar {
        ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
    } else {
        ColumnarValue::Array(out)
    })
}

/// The documentation of a JSON function: what it gives, its syntax and an example, with the
/// arguments every JSON function shares.
fn json_doc(description: &str, syntax: &str, example: &str) -> Documentation {
    Documentation::builder(super::DOC_SECTION, description, syntax)
        .with_sql_example(example)
        .with_argument("json", "JSON text, such as events.args or runs.metadata")
        .with_argument(
            "key_or_index",
            "an object key (text) or an array index (integer)",
        )
        .build()
}

/// Implements a JSON function: `$ty` with its name, result type, documentation, builder and
/// the conversion of the value found into the builder's item.
macro_rules! json_udf {
    ($(#[$meta:meta])* $ty:ident, $name:literal, $result:expr, $doc:ident, $builder:expr, $convert:expr) => {
        $(#[$meta])*
        #[derive(Debug, PartialEq, Eq, Hash)]
        pub struct $ty {
            signature: Signature,
        }

        super::scalar_udf!(
            $ty,
            $name,
            $doc,
            coerce_json_args,
            $result,
            |args: ScalarFunctionArgs| {
                map_json(&args, $builder, |b, v| b.append_option(v.and_then($convert)))
            }
        );
    };
}

static JSON_GET_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    json_doc(
        "The value inside JSON text at a path of object keys and array indexes (negative from \
         the end): a string as its text, other values as JSON; NULL where there is none.",
        "json_get(json, key_or_index, ...)",
        "SELECT json_get('{\"a\": [1, {\"b\": \"x\"}]}', 'a', -1, 'b'); -- 'x'",
    )
});

json_udf!(
    /// `json_get(json, key_or_index, ...) -> Utf8`: the value at the path; a string as its text,
    /// any other value (number, boolean, object, array) as JSON; NULL for JSON `null`, a missing
    /// path or text that is not JSON.
    ///
    /// ```sql
    /// SELECT json_get(metadata, 'distributedInfo', 'backend'), json_get(devices, 0, 'name') FROM runs;
    /// ```
    JsonGet,
    "json_get",
    DataType::Utf8,
    JSON_GET_DOC,
    StringBuilder::new(),
    |v: &Value| match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
);

static JSON_GET_INT_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    json_doc(
        "The integer inside JSON text at a path of object keys and array indexes; NULL where \
         there is none or the value is not an integer.",
        "json_get_int(json, key_or_index, ...)",
        "SELECT name, json_get_int(args, 'External id') FROM cpu_ops;",
    )
});

json_udf!(
    /// `json_get_int(json, key_or_index, ...) -> Int64`: the integer at the path, else NULL.
    ///
    /// ```sql
    /// SELECT name, json_get_int(args, 'External id') FROM cpu_ops;
    /// ```
    JsonGetInt,
    "json_get_int",
    DataType::Int64,
    JSON_GET_INT_DOC,
    Int64Builder::new(),
    |v: &Value| v.as_i64()
);

static JSON_GET_FLOAT_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    json_doc(
        "The number inside JSON text at a path of object keys and array indexes, as a float; \
         NULL where there is none or the value is not a number.",
        "json_get_float(json, key_or_index, ...)",
        "SELECT json_get_float('{\"x\": [0.5]}', 'x', 0); -- 0.5",
    )
});

json_udf!(
    /// `json_get_float(json, key_or_index, ...) -> Float64`: the number at the path, else NULL.
    ///
    /// ```sql
    /// SELECT json_get_float(metadata, 'deviceProperties', 0, 'totalGlobalMem') FROM runs;
    /// ```
    JsonGetFloat,
    "json_get_float",
    DataType::Float64,
    JSON_GET_FLOAT_DOC,
    Float64Builder::new(),
    |v: &Value| v.as_f64()
);

static JSON_GET_JSON_DOC: LazyLock<Documentation> = LazyLock::new(|| {
    json_doc(
        "The value inside JSON text at a path of object keys and array indexes, as JSON text (a \
         string keeps its quotes); NULL where there is none. `json -> key` is this function.",
        "json_get_json(json, key_or_index, ...)",
        "SELECT json_get_json('{\"a\": {\"b\": \"x\"}}', 'a'); -- '{\"b\":\"x\"}'",
    )
});

json_udf!(
    /// `json_get_json(json, key_or_index, ...) -> Utf8`: the value at the path as compact JSON
    /// text (`"x"` for a string, `null` for JSON null), NULL where there is none: what
    /// Postgres' `json -> key` gives, and what `->` plans to ([`super::json_ops`]).
    ///
    /// ```sql
    /// SELECT args -> 'Input Dims' FROM cpu_ops;
    /// ```
    JsonGetJson,
    "json_get_json",
    DataType::Utf8,
    JSON_GET_JSON_DOC,
    StringBuilder::new(),
    |v: &Value| Some(v.to_string())
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_keys_and_indexes() {
        let v: Value =
            serde_json::from_str(r#"{"a": [1, {"b": "x"}], "n": null, "e id": 7}"#).unwrap();
        let get = |path: &[PathStep<'_>]| lookup(&v, path).cloned();
        use PathStep::{Index, Key};
        assert_eq!(get(&[Key("a"), Index(1), Key("b")]), Some(Value::from("x")));
        assert_eq!(get(&[Key("a"), Index(-2)]), Some(Value::from(1)));
        assert_eq!(get(&[Key("e id")]), Some(Value::from(7)));
        assert_eq!(get(&[Key("n")]), Some(Value::Null));
        assert_eq!(get(&[Key("a"), Index(2)]), None);
        assert_eq!(get(&[Key("a"), Index(-3)]), None);
        assert_eq!(get(&[Key("a"), Key("b")]), None);
        assert_eq!(get(&[Key("missing")]), None);
        assert_eq!(get(&[]), Some(v.clone()));
    }
}
