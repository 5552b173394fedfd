//! Errors of the storage engine.

use std::path::PathBuf;

/// Everything that can go wrong while reading or writing a store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A run name that is not `[A-Za-z0-9._-]{1,128}` (or is `.`/`..`).
    #[error("invalid run name {name:?}: {reason}")]
    InvalidRunId { name: String, reason: &'static str },
    /// A run of this name exists and the commit asked for a new one.
    #[error("a run named {0:?} already exists")]
    RunExists(String),
    /// The named run is not in the store.
    #[error("no run named {0:?} in the store")]
    UnknownRun(String),
    /// An I/O error on a path of the store. The message includes the I/O error, which is
    /// therefore not also a `source()` (error reporters would print it twice).
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A manifest file that does not parse, or names files it must not (see
    /// [`crate::manifest::Manifest::check`]). Readers refuse the store rather than fall back
    /// to an older version, which would hide the newest runs.
    #[error(
        "the store is damaged: manifest {} {reason} (`gpuq doctor` checks the store, \
         `gpuq doctor --repair` moves a damaged newest manifest aside)",
        path.display()
    )]
    CorruptManifest { path: PathBuf, reason: String },
    /// Another process held the store's writer lock for longer than this writer would wait.
    #[error(
        "gave up waiting for the store lock {} after {:.1} s: it is held by {} (another \
         writer still at work; if it hangs, end that process)",
        path.display(),
        *waited_ms as f64 / 1000.0,
        holder.map_or("another process".to_string(), |p| format!("pid {p}"))
    )]
    LockTimeout {
        path: PathBuf,
        holder: Option<u32>,
        waited_ms: u64,
    },
    /// A data file that does not match what the manifest records of it.
    #[error(
        "the store is damaged: {} {reason} (`gpuq doctor` checks the store)",
        path.display()
    )]
    DamagedFile { path: PathBuf, reason: String },
    /// A symbolic link where the store keeps its own directories or files: gpuq never reads,
    /// writes or deletes through one.
    #[error(
        "{} is a symbolic link inside the store; gpuq never reads, writes or deletes through \
         one (remove the link; `gpuq doctor` lists them)",
        path.display()
    )]
    Symlink { path: PathBuf },
    /// Another writer committed the version this writer wanted to create.
    #[error("manifest version {0} was committed by another writer")]
    Conflict(u64),
    /// A batch that does not have the canonical schema.
    #[error("batch does not match the {table} schema: {reason}")]
    Schema { table: &'static str, reason: String },
    /// Errors from Arrow / Parquet / DataFusion.
    #[error(transparent)]
    DataFusion(#[from] datafusion::error::DataFusionError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |error| Error::Io { path, error }
    }
}

impl From<datafusion::arrow::error::ArrowError> for Error {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        Error::DataFusion(e.into())
    }
}

impl From<datafusion::parquet::errors::ParquetError> for Error {
    fn from(e: datafusion::parquet::errors::ParquetError) -> Self {
        Error::DataFusion(e.into())
    }
}
