//! The canonical event model.
//!
//! One row per interval or instant; times are integer nanoseconds. The Parquet files hold every
//! column but `run`, which comes from the `run=<id>` directory (Hive style), so other engines
//! (DuckDB's `hive_partitioning`, Spark) read the store unchanged.

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use std::sync::{Arc, LazyLock};

/// The event kinds, as stored in the `kind` column.
pub const KINDS: &[&str] = &[
    "kernel",
    "memcpy",
    "memset",
    "sync",
    "runtime",
    "driver",
    "cpu_op",
    "annotation",
    "gpu_annotation",
    "python",
    "overhead",
    "instant",
    "other",
];

/// Tables of the store, each a directory under the store root.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TableKind {
    Events,
    Counters,
}

impl TableKind {
    pub const ALL: [TableKind; 2] = [TableKind::Events, TableKind::Counters];

    pub fn name(self) -> &'static str {
        match self {
            TableKind::Events => "events",
            TableKind::Counters => "counters",
        }
    }

    /// Schema of the Parquet files (no `run` column).
    pub fn file_schema(self) -> SchemaRef {
        match self {
            TableKind::Events => events_schema(),
            TableKind::Counters => counters_schema(),
        }
    }

    /// Columns the rows of a file are sorted by, in order.
    pub fn sort_columns(self) -> &'static [&'static str] {
        match self {
            TableKind::Events => &["rank", "device", "stream", "ts"],
            TableKind::Counters => &["rank", "device", "name", "ts"],
        }
    }

    /// Integer columns whose per-file min/max go into the manifest, for file pruning.
    pub fn stat_columns(self) -> &'static [&'static str] {
        match self {
            TableKind::Events => &["rank", "step", "device", "stream", "ts"],
            TableKind::Counters => &["rank", "device", "ts"],
        }
    }
}

/// The type of the text columns with few distinct values (kind, name, op, scope).
pub fn dictionary_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

static EVENTS: LazyLock<SchemaRef> = LazyLock::new(|| {
    let f = |name: &str, dt: DataType, nullable: bool| Field::new(name, dt, nullable);
    Arc::new(Schema::new(vec![
        f("rank", DataType::Int32, true),
        f("step", DataType::Int64, true),
        f("device", DataType::Int32, true),
        f("stream", DataType::Int64, true),
        f("pid", DataType::Int64, true),
        f("tid", DataType::Int64, true),
        f("kind", dictionary_type(), false),
        f("name", dictionary_type(), false),
        f("ts", DataType::Int64, false),
        f("dur", DataType::Int64, false),
        f("correlation", DataType::Int64, true),
        // Operators and scopes repeat across millions of rows: dictionaries, like names.
        f("op", dictionary_type(), true),
        f("scope", dictionary_type(), true),
        f("bytes", DataType::Int64, true),
        f("copy_kind", DataType::Utf8, true),
        f("grid_x", DataType::Int32, true),
        f("grid_y", DataType::Int32, true),
        f("grid_z", DataType::Int32, true),
        f("block_x", DataType::Int32, true),
        f("block_y", DataType::Int32, true),
        f("block_z", DataType::Int32, true),
        f("registers", DataType::Int32, true),
        f("shared_mem", DataType::Int64, true),
        f("args", DataType::Utf8, true),
    ]))
});

static COUNTERS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("rank", DataType::Int32, true),
        Field::new("device", DataType::Int32, true),
        Field::new("pid", DataType::Int64, true),
        Field::new("name", dictionary_type(), false),
        Field::new("ts", DataType::Int64, false),
        Field::new("value", DataType::Float64, false),
    ]))
});

/// Schema of the `events` Parquet files (every canonical column except `run`).
pub fn events_schema() -> SchemaRef {
    EVENTS.clone()
}

/// Schema of the `counters` Parquet files (every column except `run`).
pub fn counters_schema() -> SchemaRef {
    COUNTERS.clone()
}

/// The `run` partition column.
pub fn run_field() -> Field {
    Field::new("run", DataType::Utf8, false)
}

/// The schema SQL sees: `run` first, then the file columns.
pub fn table_schema(table: TableKind) -> SchemaRef {
    let mut fields = vec![Arc::new(run_field())];
    fields.extend(table.file_schema().fields().iter().cloned());
    Arc::new(Schema::new(fields))
}
