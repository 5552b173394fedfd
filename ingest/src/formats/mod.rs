//! The input formats: which one a file holds ([`detect`]), one adapter per format
//! ([`kineto`], [`nsys`], [`rocprof`], [`stagelog`]) with the parsers of their own
//! ([`json`]; `nsys::sqlite_pages`), and the contract every adapter keeps: what it hands to the
//! [`crate::driver`] is the parsed trace of one source ([`ParsedTrace`]), or an error that
//! says where in the source it went wrong ([`TraceError`]).

pub mod cupti;
pub mod detect;
pub mod json;
pub mod kineto;
pub mod nsys;
pub mod rocprof;
pub mod stagelog;

use crate::attribute::host::HostStructure;
use crate::attribute::windows::RowSample;
use datafusion::arrow::array::RecordBatch;
use std::collections::BTreeMap;

/// Where in a source an error was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// A byte offset of the (decompressed) text, and the index of the event there if known.
    Byte { offset: u64, event: Option<u64> },
    /// A 1-based line of a text file (CSV, log).
    Line(u64),
    /// A row of a database table.
    Row { table: String, row: i64 },
    /// The source as a whole (a missing table or column, an unreadable database).
    Whole,
}

/// Why a trace could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub at: Position,
    pub message: String,
    /// The input ended before the trace did: a file cut short, or still being written.
    pub truncated: bool,
}

impl TraceError {
    pub fn at_byte(offset: u64, event: Option<u64>, message: impl Into<String>) -> TraceError {
        TraceError {
            at: Position::Byte { offset, event },
            message: message.into(),
            truncated: false,
        }
    }

    pub fn at_line(line: u64, message: impl Into<String>) -> TraceError {
        TraceError {
            at: Position::Line(line),
            message: message.into(),
            truncated: false,
        }
    }

    pub fn at_row(table: &str, row: i64, message: impl Into<String>) -> TraceError {
        TraceError {
            at: Position::Row {
                table: table.into(),
                row,
            },
            message: message.into(),
            truncated: false,
        }
    }

    pub fn whole(message: impl Into<String>) -> TraceError {
        TraceError {
            at: Position::Whole,
            message: message.into(),
            truncated: false,
        }
    }

    /// This error, marked as the input ending before the trace did.
    pub fn cut_short(self) -> TraceError {
        TraceError {
            truncated: true,
            ..self
        }
    }

    /// The byte offset, for byte-positioned errors.
    pub fn offset(&self) -> Option<u64> {
        match self.at {
            Position::Byte { offset, .. } => Some(offset),
            _ => None,
        }
    }

    /// The event index, for byte-positioned errors that know it.
    pub fn event(&self) -> Option<u64> {
        match self.at {
            Position::Byte { event, .. } => event,
            _ => None,
        }
    }
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.at {
            Position::Byte {
                offset,
                event: Some(i),
            } => write!(f, "byte {offset} (event #{i}): {}", self.message),
            Position::Byte {
                offset,
                event: None,
            } => write!(f, "byte {offset}: {}", self.message),
            Position::Line(n) => write!(f, "line {n}: {}", self.message),
            Position::Row { table, row } => {
                write!(f, "table {table}, rowid {row}: {}", self.message)
            }
            Position::Whole => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// Where adapters hand event batches as they are parsed (e.g. a spool that spills to disk), so
/// that a parsed trace need not fit in memory.
pub type EventSink<'a> = dyn FnMut(RecordBatch) -> std::io::Result<()> + 'a;

/// Everything read from one source, before attribution ([`crate::attribute`]).
#[derive(Default)]
pub struct ParsedTrace {
    /// Events with `ts` relative to [`Self::time_base_ns`]; `rank/step/op/scope` unset unless
    /// the adapter knows them (attribution keeps values an adapter set).
    /// Empty when the adapter handed them to a sink.
    pub batches: Vec<RecordBatch>,
    pub counters: Vec<RecordBatch>,
    pub host: HostStructure,
    /// Set when the adapter kept no host ranges and launches in `host` (too many): attribution
    /// then finds them in the rows, a time window at a time (chosen from `host_sample`).
    pub windowed: bool,
    /// A sample of the host rows' process and time (Kineto).
    pub host_sample: RowSample,
    /// Added to every `ts`: e.g. Kineto's `baseTimeNanoseconds`, or 0 when times are epoch ns.
    pub time_base_ns: i64,
    /// Whether `ts + time_base_ns` is ns since the Unix epoch (else ns since trace start).
    pub epoch_time: bool,
    /// Source metadata (Kineto's top-level keys, an export's metadata tables), as JSON.
    /// `distributedInfo` and `deviceProperties` are read by the driver.
    pub top_level: serde_json::Map<String, serde_json::Value>,
    pub warnings: BTreeMap<String, u64>,
    pub events: u64,
    pub kernels: u64,
    /// Complete (`X`) events and how many of them had no `dur` (Kineto).
    pub complete_events: u64,
    pub missing_dur: u64,
    /// The earliest `ts` and the latest `ts + dur` of the events, before
    /// [`Self::time_base_ns`] is added (Kineto: checked against it, so that no time wraps).
    pub event_span: Option<(i64, i64)>,
    /// A stage log read while it grows: the stages begun and not ended yet (they are emitted
    /// once their end line is written). `None` for every other read.
    pub open_stages: Option<Vec<gpuq_engine::manifest::OpenStage>>,
}

impl std::fmt::Debug for ParsedTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParsedTrace")
            .field("events", &self.events)
            .field("kernels", &self.kernels)
            .finish_non_exhaustive()
    }
}
