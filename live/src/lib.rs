//! Live sources for gpuq: trace data that arrives while a job runs, appended to a run as it
//! completes, so that the run can be queried as it grows. [`watch`]: a directory into which
//! a job writes trace files over time.

pub mod watch;

pub use watch::{
    watch, RankFrom, WatchError, WatchEvent, WatchOptions, WatchReporter, WatchStatus, WatchSummary,
};
