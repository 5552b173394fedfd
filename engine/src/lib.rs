//! gpuq's storage engine.
//!
//! The store is a directory of immutable, zstd-compressed Parquet files plus a versioned
//! manifest that says which files make up which run:
//!
//! ```text
//! <store>/
//!   events/run=<id>/part-<seq>.parquet     hard links to the newest version's files only
//!   counters/run=<id>/part-<seq>.parquet   (what another engine's Hive glob should read)
//!   _data/events/run=<id>/part-<seq>.parquet   every file a version kept for readers names:
//!   _data/counters/run=<id>/...                canonical events, sorted by (rank, device,
//!                                              stream, ts); counter samples
//!   _manifest/<inverted version>.json      one immutable file per committed version
//!   _staging/                              files being written; never read
//!   _lock                                  single-writer advisory lock
//! ```
//!
//! A run becomes visible only when a new manifest version naming its files is created with
//! create-if-absent ([`store::StoreWriter::commit`]); a crash at any point leaves the previous
//! version intact, and leftovers are removed by the next writer. Readers never take the lock:
//! they read the newest manifest and see one consistent version, reading its files under
//! `_data/`, where a dropped file stays for 10 minutes. The Hive tree follows each commit
//! right after its manifest (a writer that crashed in between leaves it to the next writer).
//!
//! The engine knows nothing of trace formats: adapters hand it canonical Arrow batches
//! ([`schema::events_schema`]) and the query layer reads it through its table providers
//! (`gpuq_query::tables`); the engine holds no DataFusion execution code.

pub mod error;
pub mod manifest;
pub mod part;
pub mod paths;
pub mod run_id;
pub mod schema;
pub mod store;

pub use error::{Error, Result};
pub use manifest::{FileEntry, Manifest, RunMeta};
pub use run_id::RunId;
pub use store::{Store, StoreWriter};
