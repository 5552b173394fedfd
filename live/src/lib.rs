//! Live sources for gpuq: trace data that arrives while a job runs, appended to a run as it
//! completes, so that the run can be queried as it grows. [`watch`]: a directory into which
//! a job writes trace files over time. [`record`]: a command run with gpuq's CUPTI collector
//! injected, its GPU activity streamed into a run.

pub mod record;
pub mod watch;

pub use record::{record, RecordError, RecordOptions, RecordSummary};
pub use watch::{
    watch, RankFrom, WatchError, WatchEvent, WatchOptions, WatchReporter, WatchStatus, WatchSummary,
};
