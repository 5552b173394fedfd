//! PyTorch-profiler (Kineto) / Chrome-trace JSON adapter.
//!
//! The file is read as a stream: the top-level object is walked key by key, and the
//! `traceEvents` array is cut into blocks of whole events that are parsed in parallel (rayon)
//! while the next block is read. Memory therefore grows with the number of events kept, not
//! with the size of the JSON text.
//!
//! Shapes handled (see the fixtures in `tests/`): modern and legacy category names
//! (`kernel`/`Kernel`, `cpu_op`/`Operator`, `cuda_runtime`/`Runtime`, ...), integer or decimal
//! microseconds (converted to nanoseconds exactly), epoch or `baseTimeNanoseconds`-relative
//! time, string pids/tids (`"stream 7"`, `"Spans"`), ROCm (device in `pid`, hex streams),
//! `cuda_driver` launches, CUDA-graph fan-out (one correlation, many kernels), GPU work with no
//! launch in the window, memory instants (counters), `C` counter events.

mod event;
mod tokenizer;

use crate::attribute::host::{
    profiler_step_number, HostInterval, HostStructure, Launch, RangeRules, Step,
};
use crate::attribute::windows::RowSample;
use crate::columns::{CounterColumns, Event, EventColumns, Kind};
use crate::formats::json::{self, scalar_f64, us_to_ns, Cursor, Scalar};
use crate::formats::{EventSink, ParsedTrace, TraceError};
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use event::{legacy_flow_head, parse_event, widen};
use memchr::memmem;
use rayon::prelude::*;
use regex::Regex;
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::sync::mpsc;
use std::sync::LazyLock;
use tokenizer::{split_stream, Block};

/// Spare read buffers returned by the parser for reuse (no fresh pages to fault in).
const SPARE_BUFFERS: usize = 3;

/// Host ranges and launch calls kept for attributing a whole file at once, by default: about
/// 100 MB of them (a trace of ~2 GB). A larger trace is attributed a time window at a time
/// ([`ParsedTrace::windowed`]), its ranges and launches found again in the spooled rows
/// ([`RANGES`]).
pub const WHOLE_FILE_LIMIT: usize = 4 << 20;

/// Parses a Kineto trace from `reader`. `progress` is called with the number of bytes read so far.
pub fn parse(
    reader: impl Read + Send,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<ParsedTrace, TraceError> {
    parse_with_steps(reader, progress, None)
}

/// [`parse`] with steps found by `step_pattern` (see [`parse_into`]).
pub(crate) fn parse_with_steps(
    reader: impl Read + Send,
    progress: &(dyn Fn(u64) + Sync),
    step_pattern: Option<&regex::Regex>,
) -> Result<ParsedTrace, TraceError> {
    let (mut batches, mut counters) = (Vec::new(), Vec::new());
    let mut trace = parse_into(
        reader,
        progress,
        usize::MAX,
        step_pattern,
        &mut |b| {
            batches.push(b);
            Ok(())
        },
        &mut |b| {
            counters.push(b);
            Ok(())
        },
    )?;
    trace.batches = batches;
    trace.counters = counters;
    Ok(trace)
}

/// Like [`parse`], but event batches go to `sink` instead of [`ParsedTrace::batches`], and
/// counter batches to `counter_sink` instead of [`ParsedTrace::counters`]. Past
/// `whole_file_limit` host ranges and launch calls, none is kept ([`ParsedTrace::windowed`]).
/// Steps are the host ranges (operators, annotations, Python functions) whose name matches
/// `step_pattern` ([`crate::attribute::step_of`]), or by default the `ProfilerStep#N` ranges.
pub fn parse_into(
    reader: impl Read + Send,
    progress: &(dyn Fn(u64) + Sync),
    whole_file_limit: usize,
    step_pattern: Option<&regex::Regex>,
    sink: &mut EventSink<'_>,
    counter_sink: &mut EventSink<'_>,
) -> Result<ParsedTrace, TraceError> {
    let (tx, rx) = mpsc::sync_channel::<Block>(2);
    let (spare_tx, spare_rx) = mpsc::sync_channel::<Vec<u8>>(SPARE_BUFFERS);
    let mut trace = ParsedTrace {
        epoch_time: true,
        ..Default::default()
    };
    let mut top_level = Vec::new();
    let mut outcome: Result<(), TraceError> = Ok(());
    std::thread::scope(|scope| {
        let splitter = scope.spawn(move || split_stream(reader, tx, spare_rx, progress));
        // Parse blocks as they arrive (sub-blocks of one block in parallel) while this thread
        // keeps the previous block's events: the sink (spilling) overlaps with parsing. Two
        // blocks are parsed at a time, so that a core done with its share of one block starts
        // on the next instead of waiting for the other cores' shares.
        let (parsed_tx, parsed_rx) = mpsc::sync_channel::<(u64, ParsedBlock)>(1);
        scope.spawn(move || {
            let mut in_flight: VecDeque<(u64, mpsc::Receiver<ParsedBlock>)> = VecDeque::new();
            let mut failed = false;
            let forward = |(offset, done): (u64, mpsc::Receiver<ParsedBlock>)| {
                let parsed = done.recv().unwrap_or_else(|_| {
                    Err(TraceError::at_byte(offset, None, "the parser stopped"))
                });
                let error = parsed.is_err();
                parsed_tx.send((offset, parsed)).is_err() || error
            };
            for block in rx.iter() {
                if failed {
                    continue; // drain so the splitter can finish
                }
                let (done_tx, done_rx) = mpsc::sync_channel(1);
                let spare = spare_tx.clone();
                let offset = block.offset;
                let steps = step_pattern.cloned();
                rayon::spawn(move || {
                    let parsed = std::panic::catch_unwind(|| parse_block(&block, steps.as_ref()))
                        .unwrap_or_else(|_| {
                            Err(TraceError::at_byte(offset, None, "the parser panicked"))
                        });
                    let _ = spare.try_send(block.bytes);
                    let _ = done_tx.send(parsed);
                });
                in_flight.push_back((offset, done_rx));
                if in_flight.len() > 1 {
                    failed = forward(in_flight.pop_front().expect("two in flight"));
                }
            }
            while let Some(next) = in_flight.pop_front() {
                if !failed {
                    failed = forward(next);
                }
            }
        });
        for (offset, parsed) in parsed_rx {
            match parsed {
                Ok(parts) => {
                    for part in parts {
                        if let Err(e) = trace.absorb(part, whole_file_limit, sink, counter_sink) {
                            outcome = Err(TraceError::at_byte(
                                offset,
                                None,
                                format!("cannot keep the parsed events: {e}"),
                            ));
                            break;
                        }
                    }
                }
                Err(e) => outcome = Err(e),
            }
            if outcome.is_err() {
                break; // dropping the receiver stops the parser, which drains the splitter
            }
        }
        match splitter.join() {
            Ok(Ok(top)) => top_level = top,
            Ok(Err(e)) => {
                if outcome.is_ok() {
                    outcome = Err(e)
                }
            }
            Err(_) => outcome = Err(TraceError::at_byte(0, None, "reader thread panicked")),
        }
    });
    outcome?;
    let mut saw_events = false;
    for (key, raw, offset) in top_level {
        if key == "traceEvents" {
            saw_events = true;
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| {
            TraceError::at_byte(offset, None, format!("top-level key {key:?}: {e}"))
        })?;
        if key == "baseTimeNanoseconds" {
            trace.time_base_ns = value
                .as_i64()
                .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| {
                    TraceError::at_byte(offset, None, "baseTimeNanoseconds is not an integer")
                })?;
            if let Some((first, last)) = trace.event_span {
                let base = trace.time_base_ns;
                if first.checked_add(base).is_none() || last.checked_add(base).is_none() {
                    return Err(TraceError::at_byte(
                        offset,
                        None,
                        format!(
                            "baseTimeNanoseconds {base} plus the events' times ({first} to \
                             {last} ns) passes the limit of 64-bit nanoseconds \
                             ({}); a damaged value?",
                            i64::MAX
                        ),
                    ));
                }
            }
        }
        trace.top_level.insert(key, value);
    }
    if !saw_events {
        return Err(TraceError::at_byte(
            0,
            None,
            "not a Kineto/Chrome trace: the top-level object has no \"traceEvents\" array",
        ));
    }
    if trace.complete_events > 0 && trace.missing_dur == trace.complete_events {
        return Err(TraceError::at_byte(
            0,
            None,
            format!(
                "none of the {} complete (\"ph\": \"X\") events has a \"dur\"",
                trace.complete_events
            ),
        ));
    }
    crate::attribute::number_occurrences(&mut trace.host.steps);
    if !trace.windowed {
        // Attributed with the other launches; windows take them from where they are kept.
        let unstored = std::mem::take(&mut trace.host.unstored_launches);
        trace.host.launches.extend(unstored);
    }
    if trace.missing_dur > 0 {
        *trace
            .warnings
            .entry("complete events without dur (stored with dur 0)".into())
            .or_default() += trace.missing_dur;
    }
    Ok(trace)
}

impl ParsedTrace {
    fn absorb(
        &mut self,
        out: ParsedPart,
        whole_file_limit: usize,
        sink: &mut EventSink<'_>,
        counter_sink: &mut EventSink<'_>,
    ) -> std::io::Result<()> {
        if let Some(events) = out.host_events {
            sample_host_rows(&mut self.host_sample, &events);
            sink(events)?;
        }
        if let Some(events) = out.gpu_events {
            sink(events)?;
        }
        if let Some(counters) = out.counters {
            counter_sink(counters)?;
        }
        let mut out = out.tally;
        let kept = self.host.intervals.len() + self.host.launches.len();
        if self.windowed
            || kept + out.host.intervals.len() + out.host.launches.len() > whole_file_limit
        {
            // Too many to hold: they are found again in the rows, window by window.
            self.windowed = true;
            out.host.intervals = Vec::new();
            out.host.launches = Vec::new();
            self.host.intervals = Vec::new();
            self.host.launches = Vec::new();
        }
        self.host.absorb(out.host);
        for (k, v) in out.warnings {
            *self.warnings.entry(k.to_string()).or_default() += v;
        }
        self.events += out.n_events;
        self.kernels += out.n_kernels;
        self.complete_events += out.n_complete;
        self.missing_dur += out.n_missing_dur;
        if let Some((lo, hi)) = out.event_span {
            widen(&mut self.event_span, lo, hi);
        }
        Ok(())
    }
}

/// Adds the host rows of `batch` to `sample` by time (all as process 0: Kineto's windows go by
/// time alone, so that the earliest window holds the earliest launch of a correlation id).
fn sample_host_rows(sample: &mut RowSample, batch: &RecordBatch) {
    let (kinds, kind_of) = crate::columns::kinds_of(batch);
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .expect("events column")
            .as_primitive::<Int64Type>()
    };
    let ts = column("ts");
    sample.add(batch.num_rows(), |i| {
        let kind = kind_of[kinds.keys().value(i) as usize].unwrap_or(Kind::Other);
        (!kind.is_gpu()).then(|| (0, ts.value(i)))
    });
}

/// How the parse reads ranges (`parse_event`), for attribution that finds them again in the
/// spooled rows, a window at a time: operators and annotations of any length with a pid and a
/// tid, named as they are; `ProfilerStep#N` is a scope, never an operator (legacy traces file
/// it as `Operator`).
pub const RANGES: RangeRules = RangeRules {
    min_dur: 0,
    needs_thread: true,
    name: range_name,
    step_pattern: None,
};

fn range_name<'a>(kind: Kind, name: &'a str, step_pattern: Option<&Regex>) -> (&'a str, bool) {
    let annotation = kind == Kind::Annotation || step_of_range(kind, name, step_pattern).is_some();
    (name, annotation)
}

/// The step a host event of `kind` named `name` marks: by `step_pattern` for operators,
/// annotations and Python functions, else by `ProfilerStep#N`.
#[inline]
fn step_of_range(kind: Kind, name: &str, step_pattern: Option<&Regex>) -> Option<i64> {
    match step_pattern {
        None => profiler_step_number(name),
        Some(re) if matches!(kind, Kind::CpuOp | Kind::Annotation | Kind::Python) => {
            crate::attribute::step_of(re, name)
        }
        Some(_) => None,
    }
}

/// What one parse task produces.
#[derive(Default)]
struct BlockOut {
    /// Host and GPU events apart: the columns of GPU work (device, stream, geometry, ...)
    /// are then null in every row of a host batch, and left out of its spool frame.
    host_events: EventColumns,
    gpu_events: EventColumns,
    counters: CounterColumns,
    host: HostStructure,
    warnings: BTreeMap<&'static str, u64>,
    /// Spans of an event's `args` members kept in its `args` text, and that text when some
    /// members were left out (went whole into columns): reused from event to event.
    args_members: Vec<(usize, usize)>,
    args_text: String,
    n_events: u64,
    n_kernels: u64,
    n_complete: u64,
    n_missing_dur: u64,
    /// The earliest `ts` and latest `ts + dur` of the events kept.
    event_span: Option<(i64, i64)>,
    /// The last legacy flow arrow's head (`"ph": "f"`, `"cat": "cpu_to_cuda"`): `(tid, ts,
    /// id)`. The kernel it points at follows it in the file, at the same `tid` and `ts`.
    legacy_flow: Option<(Option<i64>, i64, i64)>,
}

/// A [`BlockOut`] with its columns finished (in the parse task, in parallel); `tally` keeps
/// the rest, its columns left empty.
struct ParsedPart {
    host_events: Option<RecordBatch>,
    gpu_events: Option<RecordBatch>,
    counters: Option<RecordBatch>,
    tally: BlockOut,
}

impl From<BlockOut> for ParsedPart {
    fn from(mut out: BlockOut) -> ParsedPart {
        let finish = |events: EventColumns| (!events.is_empty()).then(|| events.finish());
        let host_events = finish(std::mem::take(&mut out.host_events));
        let gpu_events = finish(std::mem::take(&mut out.gpu_events));
        let counters = std::mem::take(&mut out.counters);
        ParsedPart {
            host_events,
            gpu_events,
            counters: (!counters.is_empty()).then(|| counters.finish()),
            tally: out,
        }
    }
}

/// A block's parts, in order, or its first error.
type ParsedBlock = Result<Vec<ParsedPart>, TraceError>;

fn parse_block(block: &Block, step_pattern: Option<&regex::Regex>) -> ParsedBlock {
    let parts = rayon::current_num_threads().max(1) * 2;
    let per = block.ranges.len().div_ceil(parts).max(256);
    block
        .ranges
        .par_chunks(per)
        .enumerate()
        .map(|(i, chunk)| {
            // The splitter found each event's `args` object: their bytes are about what the
            // `args` column will hold (of host or GPU events, which the split does not know).
            let args_bytes = chunk
                .iter()
                .filter_map(|&(_, _, args)| args.map(|(a, b)| b - a))
                .sum();
            let mut out = BlockOut {
                host_events: EventColumns::with_room(chunk.len(), args_bytes),
                gpu_events: EventColumns::with_room(chunk.len() / 4, args_bytes),
                ..Default::default()
            };
            // A legacy flow arrow just before the chunk links its first kernel.
            let previous = match i {
                0 => Cursor::new(&block.previous),
                _ => {
                    let (a, b, _) = block.ranges[i * per - 1];
                    Cursor::at(&block.bytes[..b], a)
                }
            };
            out.legacy_flow = legacy_flow_head(previous);
            // The chunk's text, checked to be UTF-8 once here (with SIMD where the CPU has it)
            // rather than string by string. Positions below are relative to its start.
            let start = chunk.first().map_or(0, |e| e.0);
            let bytes = &block.bytes[start..chunk.last().map_or(0, |e| e.1)];
            let text = simdutf8::basic::from_utf8(bytes).ok();
            let offset = block.offset + start as u64;
            let relative = |(a, b): (usize, usize)| (a - start, b - start);
            for (j, &(a, b, object)) in chunk.iter().enumerate() {
                let index = block.first_event + (i * per + j) as u64;
                let (a, b) = relative((a, b));
                if let Some(k) = json::element_boundary(&bytes[a..b]) {
                    if let Err((at, why)) = json::strictly_valid(&bytes[a..b]) {
                        return Err(TraceError::at_byte(
                            offset + (a + at) as u64,
                            Some(index),
                            format!(
                                "damaged event ({why}): a missing or stray quote (\") makes \
                                 it run on past the end of one event and the start of the \
                                 next (byte {}), and the events in between would be lost",
                                offset + (a + k) as u64
                            ),
                        ));
                    }
                }
                let event = match text {
                    Some(text) => Cursor::at_text(&text[..b], a),
                    None => Cursor::at(&bytes[..b], a),
                };
                parse_event(event, object.map(relative), step_pattern, &mut out).map_err(|e| {
                    TraceError::at_byte(offset + e.offset as u64, Some(index), e.message)
                })?;
            }
            Ok(ParsedPart::from(out))
        })
        .collect()
}

#[cfg(test)]
mod tests;
