//! Trace adapters for gpuq.
//!
//! Each adapter turns a trace file into canonical Arrow batches
//! ([`gpuq_engine::schema::events_schema`]); [`driver`] groups files into runs, attributes
//! GPU work to operators and steps ([`resolve`]), redacts secrets ([`redact`]) and commits
//! through the engine. Adapters know nothing of SQL.

pub mod devices;
pub mod driver;
pub mod events;
pub mod json;
pub mod kineto;
pub mod launches;
pub mod nsys;
mod part_bytes;
pub mod redact;
pub mod resolve;
pub mod rocprof;
pub mod source;
pub mod spool;
pub mod sqlite_pages;
pub mod stagelog;
pub mod synth;
pub mod synth_nsys;
pub mod trace;

#[cfg(test)]
mod test_util;

pub use driver::{ingest, IngestError, IngestOptions, NoProgress, Progress, RunReport};
