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

use crate::events::{
    profiler_step_number, CounterColumns, Event, EventColumns, HostInterval, HostStructure, Kind,
    Launch, RangeRules, Step,
};
use crate::json::{self, scalar_f64, us_to_ns, Cursor, Scalar};
use crate::spool::RowSample;
use crate::trace::{EventSink, ParsedTrace, TraceError};
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use memchr::memmem;
use rayon::prelude::*;
use regex::Regex;
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::sync::mpsc;
use std::sync::LazyLock;

/// Bytes read from the source at a time. A block of events is one read buffer, handed over to
/// the parser without copying it: at most this plus the one event that straddled the last read.
/// Each of a block's parse tasks makes one batch, and every batch costs the same again
/// downstream (its own name dictionary, spool frame, resolver set-up): blocks of 4 MB
/// (batches of ~3 K events) took 8 % longer to ingest than blocks of 16 MB; larger ones gain
/// nothing more.
const READ_BYTES: usize = 16 << 20;
/// The longest event accepted: a name and an `args` at their limits
/// ([`crate::events::MAX_NAME_BYTES`], [`crate::events::MAX_ARGS_BYTES`]) and room for the
/// rest. The splitter stops reading an event past this, so that a damaged or hostile one (a
/// name of gigabytes in a small compressed file) is an error after reading this much of it,
/// not after the memory and time of the whole.
const MAX_EVENT_BYTES: usize = 32 << 20;
/// The longest value of a top-level key other than `traceEvents` (metadata: device
/// properties, distributed info, a few KB in real traces).
const MAX_TOP_LEVEL_BYTES: usize = 64 << 20;
/// Bytes of the first read.
const FIRST_READ_BYTES: usize = 64 << 10;
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
/// `step_pattern` ([`crate::resolve::step_of`]), or by default the `ProfilerStep#N` ranges.
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
    crate::resolve::number_occurrences(&mut trace.host.steps);
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
    let (kinds, kind_of) = crate::events::kinds_of(batch);
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
fn step_of_range(kind: Kind, name: &str, step_pattern: Option<&Regex>) -> Option<i64> {
    match step_pattern {
        None => profiler_step_number(name),
        Some(re) if matches!(kind, Kind::CpuOp | Kind::Annotation | Kind::Python) => {
            crate::resolve::step_of(re, name)
        }
        Some(_) => None,
    }
}

/// Where an event lies in its block: its start and end, and the span of its one member that
/// is an object (its `args`), if it has exactly one.
type EventSpan = (usize, usize, Option<(usize, usize)>);

/// A run of whole events: `ranges` index into `bytes`; `offset` is the stream offset of
/// `bytes[0]`.
struct Block {
    /// A whole read buffer, of which only the events' `ranges` mean anything. It goes back to
    /// the reader as it is, its every byte initialized room for the next reads.
    bytes: Vec<u8>,
    ranges: Vec<EventSpan>,
    offset: u64,
    first_event: u64,
    /// The text of the event before the block's first (empty for the first block): a legacy
    /// kernel's flow arrow may be there ([`BlockOut::legacy_flow`]).
    previous: Vec<u8>,
}

/// Buffered reader that keeps track of absolute offsets.
struct Stream<R> {
    r: R,
    /// Input in `storage[..end]`; the rest is initialized room for the next read. Reading into
    /// initialized bytes (a spare buffer is reused whole) costs no zeroing, where `read_to_end`
    /// zeroed every spare capacity it read into (2 % of an ingest's CPU).
    storage: Vec<u8>,
    end: usize,
    /// Bytes the next read asks for: from [`FIRST_READ_BYTES`], doubling up to [`READ_BYTES`],
    /// so that a small trace is not read into (nor made to zero) buffers of 16 MB.
    read_size: usize,
    /// Buffers the parser is done with.
    spare: mpsc::Receiver<Vec<u8>>,
    pos: usize,
    base: u64,
    eof: bool,
    read_total: u64,
    /// The text of the last event handed over.
    last_event: Vec<u8>,
}

impl<R: Read> Stream<R> {
    fn err(&self, message: impl Into<String>) -> TraceError {
        TraceError::at_byte(self.base + self.pos as u64, None, message.into())
    }

    /// The input read and not yet handed over.
    fn buf(&self) -> &[u8] {
        &self.storage[..self.end]
    }

    /// Reads more input, keeping `buf[keep_from..]`. Returns false at end of input.
    fn fill(&mut self, keep_from: usize) -> Result<bool, TraceError> {
        if self.eof {
            return Ok(false);
        }
        if keep_from > 0 {
            self.storage.copy_within(keep_from..self.end, 0);
            self.end -= keep_from;
            self.base += keep_from as u64;
            self.pos -= keep_from;
        }
        let size = self.read_size;
        self.read_size = (size * 2).min(READ_BYTES);
        ensure_len(&mut self.storage, self.end + size);
        let n = match crate::source::read_up_to(&mut self.r, &mut self.storage[self.end..][..size])
        {
            Ok(n) => n,
            Err(e) => return Err(self.err(format!("read error: {e}"))),
        };
        self.end += n;
        if n < size {
            self.eof = true;
        }
        self.read_total += n as u64;
        Ok(n > 0)
    }

    /// Skips whitespace, reading more as needed; returns the next byte without consuming it.
    fn peek(&mut self) -> Result<Option<u8>, TraceError> {
        loop {
            while let Some(&b) = self.buf().get(self.pos) {
                if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            let keep = self.pos;
            if !self.fill(keep)? {
                return Ok(None);
            }
        }
    }

    /// Ensures a complete JSON value starts at `pos` and returns its end.
    fn complete_value(&mut self) -> Result<usize, TraceError> {
        loop {
            let end = match self.buf()[self.pos] {
                b'{' | b'[' => json::find_value_end(self.buf(), self.pos),
                b'"' => {
                    let mut c = Cursor::at(self.buf(), self.pos);
                    c.string().ok().map(|_| c.pos)
                }
                _ => {
                    let mut i = self.pos;
                    while i < self.end
                        && !matches!(
                            self.buf()[i],
                            b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'
                        )
                    {
                        i += 1;
                    }
                    (i < self.end || self.eof).then_some(i)
                }
            };
            if let Some(end) = end {
                return Ok(end);
            }
            if self.end - self.pos > MAX_TOP_LEVEL_BYTES {
                return Err(self.err(format!(
                    "a top-level value longer than {} MiB (the limit; metadata of real \
                     traces is a few KB): a damaged trace?",
                    MAX_TOP_LEVEL_BYTES >> 20
                )));
            }
            let keep = self.pos;
            if !self.fill(keep)? {
                return Err(self.err("unexpected end of input: the trace is truncated"));
            }
        }
    }
}

type TopLevel = Vec<(String, Vec<u8>, u64)>;

/// Walks the top-level object; sends `traceEvents` to the parser in blocks and returns the
/// raw text of every other key.
fn split_stream(
    reader: impl Read,
    tx: mpsc::SyncSender<Block>,
    spare: mpsc::Receiver<Vec<u8>>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<TopLevel, TraceError> {
    let mut s = Stream {
        r: reader,
        storage: Vec::new(),
        end: 0,
        read_size: FIRST_READ_BYTES,
        spare,
        pos: 0,
        base: 0,
        eof: false,
        read_total: 0,
        last_event: Vec::new(),
    };
    let mut top = Vec::new();
    match s.peek()? {
        None => return Err(s.err("the file is empty")),
        Some(b'{') => s.pos += 1,
        // The JSON Array Format: the file is the events array itself.
        Some(b'[') => {
            s.pos += 1;
            let mut events = 0;
            split_events(&mut s, &tx, &mut events, progress, true)?;
            if let Some(b) = s.peek()? {
                return Err(s.err(format!(
                    "unexpected '{}' after the array of events",
                    if b.is_ascii_graphic() { b as char } else { '?' }
                )));
            }
            progress(s.read_total);
            // Read as the `traceEvents` of an object that has nothing else.
            top.push(("traceEvents".to_string(), Vec::new(), 0));
            return Ok(top);
        }
        Some(b) if b.is_ascii_graphic() => {
            return Err(s.err(format!(
                "not a Kineto/Chrome trace: expected a JSON object or array, found '{}'",
                b as char
            )))
        }
        Some(_) => {
            return Err(s.err("not a Kineto/Chrome trace: the file is binary, not JSON text"))
        }
    }
    let mut first = true;
    let mut next_event: u64 = 0;
    loop {
        match s.peek()? {
            Some(b'}') => {
                s.pos += 1;
                break;
            }
            Some(b',') if !first => s.pos += 1,
            Some(b'"') if first => {}
            Some(b) => {
                return Err(s.err(format!(
                    "expected a key or '}}' in the top-level object, found '{}'",
                    b as char
                )))
            }
            None => return Err(s.err("unexpected end of input: the trace is truncated")),
        }
        first = false;
        if s.peek()? != Some(b'"') {
            return Err(s.err("expected a key in the top-level object"));
        }
        let end = s.complete_value()?;
        let key = {
            let mut c = Cursor::at(&s.buf()[..end], s.pos);
            c.string().map_err(|e| s.err(e.message))?.into_owned()
        };
        s.pos = end;
        if s.peek()? != Some(b':') {
            return Err(s.err(format!("expected ':' after key {key:?}")));
        }
        s.pos += 1;
        if s.peek()?.is_none() {
            return Err(s.err("unexpected end of input: the trace is truncated"));
        }
        if key == "traceEvents" {
            if s.buf()[s.pos] != b'[' {
                return Err(s.err("\"traceEvents\" is not an array"));
            }
            s.pos += 1;
            split_events(&mut s, &tx, &mut next_event, progress, false)?;
            top.push((key, Vec::new(), 0));
        } else {
            let offset = s.base + s.pos as u64;
            let end = s.complete_value()?;
            top.push((key, s.buf()[s.pos..end].to_vec(), offset));
            s.pos = end;
        }
    }
    progress(s.read_total);
    Ok(top)
}

/// Splits the events of an array (from just after its `[`) into blocks. `open_end`: the
/// array may stop at the end of the input after a whole event (and maybe a comma), without
/// its `]`: the Trace Event Format allows this in its JSON Array Format, for a trace written
/// as the program runs and never closed (Chrome's importer appends the `]`).
fn split_events(
    s: &mut Stream<impl Read>,
    tx: &mpsc::SyncSender<Block>,
    next_event: &mut u64,
    progress: &(dyn Fn(u64) + Sync),
    open_end: bool,
) -> Result<(), TraceError> {
    let mut ranges: Vec<EventSpan> = Vec::new();
    let mut expect_comma = false;
    loop {
        let b = loop {
            match s.buf().get(s.pos) {
                Some(b' ' | b'\n' | b'\r' | b'\t') => s.pos += 1,
                Some(&b) => break Some(b),
                None => break None,
            }
        };
        match b {
            Some(b']') => {
                s.pos += 1;
                hand_over(s, tx, &mut ranges, next_event);
                return Ok(());
            }
            Some(b',') if expect_comma => {
                s.pos += 1;
                expect_comma = false;
                continue;
            }
            Some(b'{') if !expect_comma => {
                if let Some((end, object)) = json::object_extent(s.buf(), s.pos) {
                    ranges.push((s.pos, end, object));
                    s.pos = end;
                    expect_comma = true;
                    continue;
                }
            }
            Some(b) => {
                let what = if expect_comma {
                    "',' or ']'"
                } else {
                    "an event object"
                };
                return Err(TraceError::at_byte(
                    s.base + s.pos as u64,
                    Some(*next_event + ranges.len() as u64),
                    format!(
                        "expected {what} in traceEvents, found '{}'",
                        if b.is_ascii_graphic() { b as char } else { '?' }
                    ),
                ));
            }
            None => {}
        }
        // The buffer ends inside an event: hand over the complete ones, then read on.
        if s.end - s.pos > MAX_EVENT_BYTES {
            return Err(TraceError::at_byte(
                s.base + s.pos as u64,
                Some(*next_event + ranges.len() as u64),
                format!(
                    "an event longer than {} MiB (names are limited to {} MiB, args to {} \
                     MiB): a damaged trace?",
                    MAX_EVENT_BYTES >> 20,
                    crate::events::MAX_NAME_BYTES >> 20,
                    crate::events::MAX_ARGS_BYTES >> 20
                ),
            ));
        }
        hand_over(s, tx, &mut ranges, next_event);
        progress(s.read_total);
        let keep = s.pos;
        if !s.fill(keep)? {
            if open_end && s.pos == s.end && *next_event > 0 {
                return Ok(());
            }
            return Err(TraceError::at_byte(
                s.base + s.pos as u64,
                Some(*next_event),
                if open_end {
                    "unexpected end of input inside an event: the trace is truncated"
                } else {
                    "unexpected end of input inside traceEvents: the trace is truncated"
                },
            ));
        }
    }
}

/// Makes a read buffer at least `len` long, with a sixteenth more as room for the event that
/// straddles the next read: a spare buffer is then long enough for the next block, and is not
/// grown (Vec growth would double it past malloc's mapping threshold, then map, zero and fault
/// in 32 MB for one block: 2 % of an ingest's CPU).
fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        let len = len + len / 16;
        buf.reserve_exact(len - buf.len());
        buf.resize(len, 0);
    }
}

/// Sends the events of `ranges` with the read buffer itself as the block's text; the rest of
/// the buffer (from `s.pos`) moves to a fresh or spare buffer.
fn hand_over(
    s: &mut Stream<impl Read>,
    tx: &mpsc::SyncSender<Block>,
    ranges: &mut Vec<EventSpan>,
    next_event: &mut u64,
) {
    if ranges.is_empty() {
        return;
    }
    let previous = match ranges.last() {
        Some(&(a, b, _)) => std::mem::replace(&mut s.last_event, s.storage[a..b].to_vec()),
        None => Vec::new(),
    };
    let rest = s.end - s.pos;
    // A spare buffer keeps its length: its bytes are initialized room for reading.
    let mut next = s.spare.try_recv().unwrap_or_default();
    ensure_len(&mut next, rest + s.read_size);
    next[..rest].copy_from_slice(&s.storage[s.pos..s.end]);
    let bytes = std::mem::replace(&mut s.storage, next);
    s.end = rest;
    // The next block holds about as many events: room for them saves growing the list
    // (and copying it) a dozen times per block.
    let room = ranges.len() + ranges.len() / 4;
    let block = Block {
        bytes,
        ranges: std::mem::replace(ranges, Vec::with_capacity(room)),
        offset: s.base,
        first_event: *next_event,
        previous,
    };
    *next_event += block.ranges.len() as u64;
    s.base += s.pos as u64;
    s.pos = 0;
    // The receiver only goes away after an error, which is reported there.
    let _ = tx.send(block);
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

/// pid / tid as written: an integer or a string.
enum Id<'a> {
    Missing,
    Int(i64),
    Str(Cow<'a, str>),
}

impl<'a> Id<'a> {
    /// The id at `c`.
    fn of(c: &mut Cursor<'a>) -> json::Result<Id<'a>> {
        if let Some(v) = c.plain_int() {
            return Ok(Id::Int(v));
        }
        Ok(Id::from_scalar(c.value()?))
    }

    fn from_scalar(v: Scalar<'a>) -> Id<'a> {
        match v {
            Scalar::Number(n) => n.parse().ok().map_or(Id::Missing, Id::Int),
            Scalar::Str(s) => Id::Str(s),
            _ => Id::Missing,
        }
    }

    /// The integer id: the number itself, the number in a string (`"stream 7"`), or a stable
    /// negative id derived from the text (`"Spans"`).
    fn int(&self) -> Option<i64> {
        match self {
            Id::Missing => None,
            Id::Int(v) => Some(*v),
            Id::Str(s) if s.is_empty() => None,
            Id::Str(s) => Some(json::parse_int_text(s).unwrap_or_else(|| stable_negative_id(s))),
        }
    }

    fn original_text(&self) -> Option<&str> {
        match self {
            Id::Str(s) if !s.is_empty() && json::parse_int_text(s).is_none() => Some(s),
            _ => None,
        }
    }
}

/// FNV-1a of the text, as a negative number (so it never collides with a real OS id).
fn stable_negative_id(s: &str) -> i64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    -((h >> 1) as i64) - 1
}

/// The canonical kind of a complete (`ph: "X"`) event. Meta's MTIA accelerator reports its
/// device work as `mtia_ccp_events` (Kineto aliases them to concurrent kernels): DMA transfers
/// are copies; `event_wait` (a stream waiting on another) and `event_record` are
/// synchronization, as CUPTI files CUDA's stream waits and event records; everything else is a
/// kernel.
fn kind_of(cat: &str, name: &str) -> Kind {
    match cat {
        "kernel" | "Kernel" => Kind::Kernel,
        "mtia_ccp_events" if name.starts_with("dma") => Kind::Memcpy,
        "mtia_ccp_events" if matches!(name, "event_wait" | "event_record") => Kind::Sync,
        "mtia_ccp_events" => Kind::Kernel,
        "mtia_runtime" => Kind::Runtime,
        "gpu_memcpy" | "Memcpy" | "memcpy" => Kind::Memcpy,
        "gpu_memset" | "Memset" | "memset" => Kind::Memset,
        "cuda_sync" => Kind::Sync,
        "cuda_runtime" | "Runtime" | "runtime" => Kind::Runtime,
        "cuda_driver" | "Driver" | "driver" => Kind::Driver,
        "cpu_op" | "Operator" | "operator" => Kind::CpuOp,
        "user_annotation" | "Annotation" => Kind::Annotation,
        "gpu_user_annotation" => Kind::GpuAnnotation,
        "python_function" | "python" => Kind::Python,
        "overhead" | "Overhead" => Kind::Overhead,
        _ => Kind::Other,
    }
}

/// The category of the legacy `export_chrome_trace`'s flow arrows from operator to kernel.
const LEGACY_FLOW: &str = "cpu_to_cuda";

/// The legacy flow arrow head the event at `event` is, if it is one.
fn legacy_flow_head(event: Cursor<'_>) -> Option<(Option<i64>, i64, i64)> {
    if event.buf.is_empty() {
        return None;
    }
    let mut scratch = BlockOut::default();
    parse_event(event, None, None, &mut scratch).ok()?;
    scratch.legacy_flow
}

/// The kind of a complete event without `cat`: PyTorch's legacy `export_chrome_trace` (up to
/// 1.7) files operators under `"pid": "CPU functions"` and kernels under `"CUDA functions"`.
fn legacy_kind(pid: &Id<'_>) -> Kind {
    match pid {
        Id::Str(p) if p == "CPU functions" => Kind::CpuOp,
        Id::Str(p) if p == "CUDA functions" => Kind::Kernel,
        _ => Kind::Other,
    }
}

/// The direction in a copy's name (`Memcpy HtoD (Pageable -> Device)` -> `HtoD`) or in a
/// ROCm `kind` arg (`DtoD`). Unified-memory page migrations (`Memcpy Unified HtoD`,
/// `[CUDA Unified Memory memcpy DtoH]`) are `UM HtoD`, `UM DtoH`, `UM DtoD`, as Nsight Systems'
/// copy kinds 11 to 13: the driver moves pages on a fault or prefetch, no copy call runs.
fn copy_kind_of(name: &str) -> Option<&'static str> {
    if name.contains("Unified") {
        return ["HtoD", "DtoH", "DtoD"]
            .into_iter()
            .zip(["UM HtoD", "UM DtoH", "UM DtoD"])
            .find(|(direction, _)| name.contains(direction))
            .map(|(_, kind)| kind);
    }
    const KINDS: [&str; 7] = ["HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "DtoA", "AtoD"];
    let word = name
        .strip_prefix("Memcpy ")
        .unwrap_or(name)
        .split(' ')
        .next()?;
    KINDS.iter().find(|k| **k == word).copied()
}

/// An MTIA DMA `direction` (`DEVICE_TO_HOST`) as a copy kind (`DtoH`).
fn copy_kind_of_direction(direction: &str) -> Option<&'static str> {
    let (from, to) = direction.split_once("_TO_")?;
    let side = |s: &str| match s {
        "HOST" => Some('H'),
        "DEVICE" => Some('D'),
        _ => None,
    };
    match (side(from)?, side(to)?) {
        ('H', 'D') => Some("HtoD"),
        ('D', 'H') => Some("DtoH"),
        ('D', 'D') => Some("DtoD"),
        _ => Some("HtoH"),
    }
}

/// The value at `c`, microseconds, as nanoseconds.
fn ns_of(c: &mut Cursor<'_>, field: &str) -> json::Result<i64> {
    if let Some(ns) = c.plain_us_ns() {
        return Ok(ns);
    }
    let v = c.value()?;
    let text = match &v {
        Scalar::Number(n) => n,
        Scalar::Str(s) => s.as_ref(),
        other => {
            return c.error(format!(
                "\"{field}\" is {}, expected a number of microseconds",
                other.type_name()
            ))
        }
    };
    match us_to_ns(text) {
        Some(ns) => Ok(ns),
        None => c.error(format!(
            "\"{field}\" is {text:?}, expected a number of microseconds"
        )),
    }
}

const HOUR_NS: i64 = 3_600_000_000_000;

/// Whether the event at `event` (at its `{`) is of a phase skipped whatever else it holds
/// (flows, metadata: a third of a training trace's events), found without parsing it: Kineto
/// writes `"ph"` first. Such an event is then not read further: like the `args` objects the
/// parser does not read, it is checked only as far as every event is (its strings end, its
/// brackets balance, it holds no event boundary unless it is valid JSON: see
/// [`json::element_boundary`]), not token by token. One with a second `"ph"` (which
/// overrides the first) is left to the full parse.
fn of_skipped_phase(event: Cursor<'_>) -> bool {
    static PH: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new(b"\"ph\""));
    let mut c = event;
    if !c.buf[c.pos..].starts_with(b"{\"ph\"") {
        return false;
    }
    c.pos += 5;
    if c.expect(b':').is_err() {
        return false;
    }
    c.skip_ws();
    match &c.buf[c.pos..] {
        [b'"', b's' | b'f' | b't' | b'M', b'"', tail @ ..] => PH.find(tail).is_none(),
        _ => false,
    }
}

/// Parses the event at `event`; `object`: the span of its only member that is an object, if
/// known (taken as it is when it is the `args`, instead of being scanned for its end again).
fn parse_event(
    event: Cursor<'_>,
    object: Option<(usize, usize)>,
    step_pattern: Option<&regex::Regex>,
    out: &mut BlockOut,
) -> json::Result<()> {
    if of_skipped_phase(event) {
        return Ok(());
    }
    let mut c = event;
    let mut ph: Option<Cow<str>> = None;
    let mut cat: Option<Cow<str>> = None;
    let mut name: Option<Cow<str>> = None;
    let (mut pid, mut tid) = (Id::Missing, Id::Missing);
    let (mut ts, mut dur): (Option<i64>, Option<i64>) = (None, None);
    let mut args: Option<(usize, usize)> = None;
    let mut flow_id: Option<i64> = None;
    c.object(|key, c| {
        match key {
            "ph" => ph = Some(expect_str(c, key)?),
            "cat" => cat = Some(expect_str(c, key)?),
            "name" => {
                name = Some(match c.value()? {
                    Scalar::Str(s) => s,
                    Scalar::Number(n) => Cow::Borrowed(n),
                    _ => Cow::Borrowed(""),
                })
            }
            "pid" => pid = Id::of(c)?,
            "tid" => tid = Id::of(c)?,
            "id" => flow_id = Id::of(c)?.int(),
            "ts" => ts = Some(ns_of(c, "ts")?),
            "dur" => dur = Some(ns_of(c, "dur")?),
            "args" if c.peek() == Some(b'{') && object.map(|o| o.0) == Some(c.pos) => {
                let (start, end) = object.expect("checked");
                c.pos = end;
                args = Some((start, end));
            }
            "args" => match c.value()? {
                Scalar::Compound {
                    start,
                    end,
                    object: true,
                } => args = Some((start, end)),
                Scalar::Null => {}
                other => {
                    return c.error(format!(
                        "\"args\" is {}, expected an object",
                        other.type_name()
                    ))
                }
            },
            _ => {
                c.value()?;
            }
        }
        Ok(())
    })?;
    let ph = ph
        .as_deref()
        .unwrap_or(if dur.is_some() { "X" } else { "" });
    let name = name.unwrap_or(Cow::Borrowed(""));
    if let Some(why) = crate::events::oversized(name.len(), args.map_or(0, |(a, b)| b - a)) {
        return event.error(why);
    }
    let kind = match ph {
        "X" if cat.is_none() => legacy_kind(&pid),
        "X" => kind_of(cat.as_deref().unwrap_or(""), &name),
        "i" | "I" | "n" => Kind::Instant,
        "C" => {
            if let (Some(ts), Some((a, b))) = (ts, args) {
                widen(&mut out.event_span, ts, ts);
                counter_event(event.sub(b, a), &name, pid.int(), ts, out)?;
            }
            return Ok(());
        }
        // Legacy `export_chrome_trace` links a kernel to its operator by a flow arrow alone:
        // its tail, at the operator's start on the operator's thread, is the launch.
        "s" if cat.as_deref() == Some(LEGACY_FLOW) => {
            if let (Some(id), Some(ts), Some(p), Some(t)) = (flow_id, ts, pid.int(), tid.int()) {
                let thread = out.host.threads.intern(p, t);
                out.host.unstored_launches.push(Launch::new(id, ts, thread));
            }
            return Ok(());
        }
        "f" if cat.as_deref() == Some(LEGACY_FLOW) => {
            out.legacy_flow = ts.zip(flow_id).map(|(ts, id)| (tid.int(), ts, id));
            return Ok(());
        }
        // Metadata, flows (launch links are also in args.correlation) and async phases.
        "M" | "s" | "f" | "t" => return Ok(()),
        _ => {
            *out.warnings
                .entry("events of unsupported phase skipped (B/E/b/e/...)")
                .or_default() += 1;
            return Ok(());
        }
    };
    let Some(ts) = ts else {
        *out.warnings.entry("events without ts skipped").or_default() += 1;
        return Ok(());
    };
    let dur = if kind == Kind::Instant {
        0
    } else {
        out.n_complete += 1;
        match dur {
            Some(d) => d,
            None => {
                out.n_missing_dur += 1;
                0
            }
        }
    };
    // Times are 64-bit nanoseconds end to end: an event ending past that range is an error,
    // never a wrapped (negative) time.
    let Some(end) = ts.checked_add(dur.max(0)) else {
        return event.error(format!(
            "ts + dur ({ts} + {dur} ns) passes the limit of 64-bit nanoseconds"
        ));
    };
    widen(&mut out.event_span, ts, end);
    if dur < 0 {
        *out.warnings
            .entry("negative durations (kept as-is)")
            .or_default() += 1;
    } else if dur > 24 * HOUR_NS || (kind.is_gpu() && dur > HOUR_NS) {
        *out.warnings
            .entry("implausibly long durations (kept as-is)")
            .or_default() += 1;
    }
    let mut e = Event {
        name: &name,
        ts,
        dur,
        pid: pid.int(),
        tid: tid.int(),
        ..Default::default()
    };
    let needs_args = kind.is_gpu() || kind.is_launch() || kind == Kind::Instant;
    let mut mem: Option<MemoryInstant> = None;
    let mut args_reduced = false;
    if let (true, Some((a, b))) = (needs_args, args) {
        let mut ac = event.sub(b, a);
        let mut device_type = None;
        let mut device_id = None;
        let (mut allocated, mut reserved) = (None, None);
        let mut rocm_kind: Option<Cow<str>> = None;
        let mut direction: Option<Cow<str>> = None;
        // Members whose value went whole into a column are left out of the `args` text;
        // `seen`: those keys met so far (a repeated one keeps the text as written).
        let mut seen = 0u16;
        let (mut repeated, mut dropped) = (false, false);
        out.args_members.clear();
        ac.object_members(|start, key, c| {
            // An integer member read into a column: whether the column holds it exactly, as
            // it does what `plain_int` reads (plain digits); other forms stay in the text.
            let int64 = |c: &mut Cursor<'_>, column: &mut Option<i64>| -> json::Result<bool> {
                if let Some(v) = c.plain_int() {
                    *column = Some(v);
                    return Ok(true);
                }
                *column = c.int_value()?;
                Ok(false)
            };
            let int32 = |c: &mut Cursor<'_>, column: &mut Option<i32>| -> json::Result<bool> {
                if let Some(v) = c.plain_int() {
                    *column = Some(v as i32);
                    return Ok(i32::try_from(v).is_ok());
                }
                *column = c.int_value()?.map(|v| v as i32);
                Ok(false)
            };
            let (column, in_column) = match key {
                "correlation" => (1, int64(c, &mut e.correlation)?),
                "device" => (2, int32(c, &mut e.device)?),
                "stream" if kind.is_gpu() => (3, int64(c, &mut e.stream)?),
                "bytes" => (4, int64(c, &mut e.bytes)?),
                "registers per thread" => (5, int32(c, &mut e.registers)?),
                "shared memory" if kind.is_gpu() => (6, int64(c, &mut e.shared_mem)?),
                "grid" | "block" if kind.is_gpu() => {
                    let (triple, exact) = match c.plain_int_triple() {
                        Some(t) => (
                            Some(t.map(Some)),
                            t.iter().all(|&v| i32::try_from(v).is_ok()),
                        ),
                        None => {
                            c.skip_ws();
                            let value_start = c.pos;
                            let triple = c.int_triple()?;
                            let exact =
                                triple.is_some_and(|t| {
                                    t.iter()
                                        .all(|&v| v.is_some_and(|v| i32::try_from(v).is_ok()))
                                }) && c.text_of(value_start, c.pos).is_some_and(is_plain_triple);
                            (triple, exact)
                        }
                    };
                    if let Some(g) = triple {
                        let g = g.map(|v| v.map(|v| v as i32));
                        if key == "grid" {
                            e.grid = g;
                        } else {
                            e.block = g;
                        }
                    }
                    (if key == "grid" { 7 } else { 8 }, exact)
                }
                "kind" if kind == Kind::Memcpy => {
                    if let Scalar::Str(s) = c.value()? {
                        rocm_kind = Some(s);
                    }
                    (0, false)
                }
                // MTIA DMA: `"direction": "DEVICE_TO_HOST", "size": 1024`.
                "direction" if kind == Kind::Memcpy => {
                    if let Scalar::Str(s) = c.value()? {
                        direction = Some(s);
                    }
                    (0, false)
                }
                "size" if kind == Kind::Memcpy => {
                    e.bytes = e.bytes.or(c.int_value()?);
                    (0, false)
                }
                "Device Type" => {
                    device_type = c.int_value()?;
                    (0, false)
                }
                "Device Id" => {
                    device_id = c.int_value()?;
                    (0, false)
                }
                "Total Allocated" => {
                    allocated = scalar_f64(&c.value()?);
                    (0, false)
                }
                "Total Reserved" => {
                    reserved = scalar_f64(&c.value()?);
                    (0, false)
                }
                _ => {
                    c.value()?;
                    (0, false)
                }
            };
            if column > 0 {
                repeated |= seen & (1 << column) != 0;
                seen |= 1 << column;
            }
            if in_column {
                dropped = true;
            } else {
                out.args_members.push((start, c.pos));
            }
            Ok(())
        })?;
        args_reduced = dropped && !repeated;
        if kind == Kind::Instant && (allocated.is_some() || reserved.is_some()) {
            // Device Type 0 is host memory.
            let device = match device_type {
                Some(0) | None => None,
                _ => device_id.map(|d| d as i32),
            };
            mem = Some(MemoryInstant {
                device,
                allocated,
                reserved,
            });
        }
        if kind == Kind::Memcpy {
            e.copy_kind = copy_kind_of(&name)
                .or_else(|| rocm_kind.as_deref().and_then(copy_kind_of))
                .or_else(|| direction.as_deref().and_then(copy_kind_of_direction));
        }
    }
    if kind.is_gpu() && cat.is_none() {
        // Legacy `export_chrome_trace`: the kernel's device is its `tid`; no stream is known;
        // the flow arrow just before it gives its launch.
        e.device = e.device.or(e.tid.map(|t| t as i32));
        if let Some((flow_tid, flow_ts, id)) = out.legacy_flow.take() {
            if flow_tid == e.tid && flow_ts == ts {
                e.correlation = e.correlation.or(Some(id));
            }
        }
    } else if kind.is_gpu() {
        e.device = e.device.or(e.pid.map(|p| p as i32));
        e.stream = e.stream.or(e.tid);
    }
    let raw_args = match args {
        Some(_) if args_reduced => {
            let text = &mut out.args_text;
            text.clear();
            text.push('{');
            for (i, &(a, b)) in out.args_members.iter().enumerate() {
                if i > 0 {
                    text.push_str(", ");
                }
                text.push_str(event.text_of(a, b).unwrap_or_default());
            }
            text.push('}');
            Some(text.as_str())
        }
        Some((a, b)) => Some(event.text_of(a, b).unwrap_or("{}")),
        None => None,
    };
    let args_text: Option<Cow<str>> = match (pid.original_text(), tid.original_text(), raw_args) {
        (None, None, raw) => raw.map(Cow::Borrowed),
        (p, t, raw) => Some(Cow::Owned(with_original_ids(p, t, raw))),
    };
    e.args = args_text.as_deref();
    if kind.is_gpu() {
        out.gpu_events.push(kind, &e);
    } else {
        out.host_events.push(kind, &e);
    }
    out.n_events += 1;
    if kind == Kind::Kernel {
        out.n_kernels += 1;
    }
    if let Some(m) = mem {
        for (label, v) in [
            ("[memory] Total Allocated", m.allocated),
            ("[memory] Total Reserved", m.reserved),
        ] {
            if let Some(v) = v {
                out.counters.push(m.device, e.pid, label, ts, v);
            }
        }
    }
    if !kind.is_gpu() {
        out.host.extend_host_span(ts, end);
    }
    let (Some(p), Some(t)) = (e.pid, e.tid) else {
        return Ok(());
    };
    let step = step_of_range(kind, &name, step_pattern);
    if let Some(n) = step {
        out.host.steps.push(Step {
            process: 0,
            start: ts,
            end: ts.saturating_add(dur),
            number: n,
        });
    }
    match kind {
        Kind::CpuOp | Kind::Annotation if dur >= 0 => {
            let id = out.host.names.intern(&name);
            // ProfilerStep#N is a scope, never an operator (legacy traces file it as `Operator`).
            let annotation = kind == Kind::Annotation || step.is_some();
            let thread = out.host.threads.intern(p, t);
            out.host
                .intervals
                .push(HostInterval::new(thread, ts, end, id, annotation));
        }
        Kind::Runtime | Kind::Driver => {
            if let Some(correlation) = e.correlation {
                let thread = out.host.threads.intern(p, t);
                out.host.launches.push(Launch::new(correlation, ts, thread));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Extends `span` to cover `lo..=hi`.
fn widen(span: &mut Option<(i64, i64)>, lo: i64, hi: i64) {
    *span = Some(match *span {
        Some((a, b)) => (a.min(lo), b.max(hi)),
        None => (lo, hi),
    });
}

struct MemoryInstant {
    device: Option<i32>,
    allocated: Option<f64>,
    reserved: Option<f64>,
}

/// Whether `text` is an array of exactly three plain integers (digits, `-`, whitespace).
fn is_plain_triple(text: &str) -> bool {
    text.bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'-' | b',' | b'[' | b']') || b.is_ascii_whitespace())
        && text.bytes().filter(|&b| b == b',').count() == 2
}

/// `args` with the original string pid/tid added (`{"pid": "Spans", ...}`).
fn with_original_ids(pid: Option<&str>, tid: Option<&str>, raw: Option<&str>) -> String {
    let mut s = String::from("{");
    for (k, v) in [("pid", pid), ("tid", tid)] {
        if let Some(v) = v {
            if s.len() > 1 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "\"{k}\": {}",
                serde_json::Value::String(v.to_string())
            ));
        }
    }
    if let Some(raw) = raw {
        let inner = raw
            .trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .trim();
        if !inner.is_empty() {
            s.push_str(", ");
            s.push_str(inner);
        }
    }
    s.push('}');
    s
}

fn expect_str<'a>(c: &mut Cursor<'a>, key: &str) -> json::Result<Cow<'a, str>> {
    match c.value()? {
        Scalar::Str(s) => Ok(s),
        Scalar::Null => Ok(Cow::Borrowed("")),
        other => c.error(format!(
            "\"{key}\" is {}, expected a string",
            other.type_name()
        )),
    }
}

/// `ph: "C"` counter events: one counter row per numeric arg.
fn counter_event(
    mut args: Cursor<'_>,
    name: &str,
    pid: Option<i64>,
    ts: i64,
    out: &mut BlockOut,
) -> json::Result<()> {
    let mut values: Vec<(String, f64)> = Vec::new();
    args.object(|key, c| {
        if let Some(v) = scalar_f64(&c.value()?) {
            values.push((key.to_string(), v));
        }
        Ok(())
    })?;
    let single = values.len() == 1;
    for (k, v) in values {
        let label = if single {
            name.to_string()
        } else {
            format!("{name}.{k}")
        };
        out.counters.push(None, pid, &label, ts, v);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
