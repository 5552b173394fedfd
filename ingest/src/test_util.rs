//! Column readers and paths shared by the adapters' tests.

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int32Type, Int64Type};

/// A Utf8 or dictionary column as strings.
pub fn strings(b: &RecordBatch, col: &str) -> Vec<Option<String>> {
    let c = b.column_by_name(col).unwrap();
    match c.data_type() {
        DataType::Dictionary(_, _) => {
            let d = c.as_dictionary::<Int32Type>();
            let v = d.values().as_string::<i32>();
            (0..d.len())
                .map(|i| d.key(i).map(|k| v.value(k).to_string()))
                .collect()
        }
        _ => c
            .as_string::<i32>()
            .iter()
            .map(|s| s.map(String::from))
            .collect(),
    }
}

/// An Int32 or Int64 column as i64s.
pub fn ints(b: &RecordBatch, col: &str) -> Vec<Option<i64>> {
    let c = b.column_by_name(col).unwrap();
    match c.data_type() {
        DataType::Int32 => c
            .as_primitive::<Int32Type>()
            .iter()
            .map(|v| v.map(i64::from))
            .collect(),
        _ => c.as_primitive::<Int64Type>().iter().collect(),
    }
}

/// `../shared/traces/<sub>` next to the workspace (it may not exist). The crate's directory is
/// taken from the environment `cargo test` runs the tests in, before the one compiled in: a
/// test binary built from another checkout sharing the target directory is reused by cargo.
pub fn shared_traces(sub: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .join("../../shared/traces")
        .join(sub)
}
