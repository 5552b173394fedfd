//! gpuq's query layer: a DataFusion session over a store.
//!
//! [`open_session`] registers the canonical `events` and `counters` tables (manifest-driven
//! scans, see [`tables`]), the `runs` catalog, and views per event kind:
//!
//! | view | rows of `events` |
//! |---|---|
//! | `kernels`, `memcpy`, `memset`, `sync` | kind = that kind |
//! | `runtime` | kind in (`runtime`, `driver`): every launch/API call |
//! | `cpu_ops` | kind = `cpu_op` |
//! | `annotations` | kind in (`annotation`, `gpu_annotation`) |
//! | `gpu_ops` | kind in (`kernel`, `memcpy`, `memset`) |
//! | `steps` | `ProfilerStep#N` ranges: run, rank, step, ts, dur |

pub mod analyses;
pub mod arrow_stream;
pub mod cancel;
pub mod dict_agg;
pub mod functions;
pub mod pin;
pub mod policy;
pub mod tables;

pub use pin::pin;

use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionConfig;
use gpuq_engine::schema::TableKind;
use gpuq_engine::Store;
use std::sync::Arc;
use tables::{ManifestTable, RunsTable};

/// Views over `events`: (name, SQL).
pub const VIEWS: &[(&str, &str)] = &[
    ("kernels", "SELECT * FROM events WHERE kind = 'kernel'"),
    ("memcpy", "SELECT * FROM events WHERE kind = 'memcpy'"),
    ("memset", "SELECT * FROM events WHERE kind = 'memset'"),
    ("sync", "SELECT * FROM events WHERE kind = 'sync'"),
    (
        "runtime",
        "SELECT * FROM events WHERE kind IN ('runtime', 'driver')",
    ),
    ("cpu_ops", "SELECT * FROM events WHERE kind = 'cpu_op'"),
    (
        "annotations",
        "SELECT * FROM events WHERE kind IN ('annotation', 'gpu_annotation')",
    ),
    (
        "gpu_ops",
        "SELECT * FROM events WHERE kind IN ('kernel', 'memcpy', 'memset')",
    ),
    (
        "steps",
        "SELECT run, rank, step, ts, dur FROM events \
         WHERE kind IN ('annotation', 'cpu_op') AND name LIKE 'ProfilerStep#%'",
    ),
];

/// Base tables of a session.
pub const TABLES: &[&str] = &["events", "counters", "runs"];

/// The session configuration gpuq uses everywhere.
pub fn session_config() -> SessionConfig {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let mut config = SessionConfig::new()
        .with_target_partitions(threads)
        .with_information_schema(true)
        .with_default_catalog_and_schema("gpuq", "public");
    let options = config.options_mut();
    // Keep the files' (rank, device, stream, ts) order instead of re-sorting for windows.
    options.optimizer.prefer_existing_sort = true;
    options.execution.parquet.pushdown_filters = true;
    // The store writes no bloom filters; checking for them costs every file open.
    options.execution.parquet.bloom_filter_on_read = false;
    // DataFusion 55 builds an aggregate's dynamic filter from the aggregates it supports
    // alone: in `SELECT min(ts), max(ts + dur)` the filter `ts < min` then drops rows that
    // `max(ts + dur)` needs, and a partition read after another loses them (a wrong span, at
    // random). apache/datafusion#24816, fixed after 55.
    options.optimizer.enable_aggregate_dynamic_filter_pushdown = false;
    config
}

/// A session over `store` with every table and view registered.
pub async fn open_session(store: &Store) -> Result<SessionContext> {
    open_session_with(store, true).await
}

/// [`open_session`], with or without [`dict_agg::DictionaryAggregateRule`] (tests compare the
/// two).
pub async fn open_session_with(
    store: &Store,
    dictionary_aggregates: bool,
) -> Result<SessionContext> {
    // The store rides in the configuration: statements pin its manifest (see [`pin`]) and
    // the statement policy keeps writes out of it (see [`policy`]).
    let config = session_config().with_extension(Arc::new(pin::SessionStore(store.clone())));
    let mut state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_query_planner(Arc::new(pin::PinningPlanner));
    if dictionary_aggregates {
        state = state.with_physical_optimizer_rule(Arc::new(dict_agg::DictionaryAggregateRule));
    }
    let ctx = SessionContext::new_with_state(state.build());
    functions::register_all(&ctx);
    analyses::register_all(&ctx, store);
    ctx.register_table(
        "events",
        Arc::new(ManifestTable::new(store.clone(), TableKind::Events)),
    )?;
    ctx.register_table(
        "counters",
        Arc::new(ManifestTable::new(store.clone(), TableKind::Counters)),
    )?;
    ctx.register_table("runs", Arc::new(RunsTable::new(store.clone())))?;
    for (name, sql) in VIEWS {
        ctx.sql(&format!("CREATE VIEW {name} AS {sql}")).await?;
    }
    Ok(ctx)
}

#[cfg(test)]
mod tests;
