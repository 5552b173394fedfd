//! Trace adapters for gpuq.
//!
//! Each adapter ([`formats`]) turns a trace file into canonical Arrow batches
//! ([`gpuq_engine::schema::events_schema`], built with [`columns`]); the [`driver`] groups
//! files into runs, attributes GPU work to operators and steps ([`attribute`]), holds rows
//! until they can be attributed ([`spool`]), redacts secrets ([`redact`]) and commits through
//! the engine. Adapters know nothing of SQL.
//!
//! The crate's surface is what the root re-exports; the modules are the crate's own.

pub(crate) mod attribute;
pub(crate) mod columns;
pub(crate) mod driver;
pub(crate) mod formats;
pub(crate) mod redact;
pub(crate) mod source;
pub(crate) mod spool;

/// CUPTI activity recorded live (`gpuq record`): the collector's segments into rows.
pub mod cupti {
    pub use crate::formats::cupti::{Recording, SegmentHealth, SegmentMeta, Taken};
}
pub use driver::{ingest, IngestError, IngestOptions, NoProgress, Progress, RunReport};
pub use formats::detect::Format;
pub use formats::nsys::step_pattern;
pub use formats::rocprof::output_named;
pub use formats::stagelog::zone::LogZone;
pub use redact::{redact_text, tag as redact_tag};
pub use source::detect_format;

/// The parsers below the driver, for the fuzz targets and property tests
/// (`tests/src/fuzz.rs`): not a stable interface.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::formats::{Position, TraceError};
    pub mod json {
        pub use crate::formats::json::{find_value_end, object_extent};
    }
    pub mod kineto {
        pub use crate::formats::kineto::parse;
    }
    pub mod rocprof {
        pub use crate::formats::rocprof::parse;
    }
    pub mod stagelog {
        pub use crate::formats::stagelog::{looks_like_stage_log, parse};
    }
    pub mod sqlite_pages {
        pub use crate::formats::nsys::sqlite_pages::{ColumnSource, PageFile, TablePlan, Value};
    }
}
