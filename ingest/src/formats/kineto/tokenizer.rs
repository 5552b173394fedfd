//! Cutting a Kineto trace's text into whole events: the top-level object walked key by key,
//! its `traceEvents` array read in blocks of whole events ([`split_stream`],
//! [`split_events`]) that are handed to the parser without copying them. The tokenizer half of
//! the adapter (as Perfetto's `json_trace_tokenizer`); [`super::event`] is the parser half.

use super::*;

/// Bytes read from the source at a time. A block of events is one read buffer, handed over to
/// the parser without copying it: at most this plus the one event that straddled the last read.
/// Each of a block's parse tasks makes one batch, and every batch costs the same again
/// downstream (its own name dictionary, spool frame, resolver set-up): blocks of 4 MB
/// (batches of ~3 K events) took 8 % longer to ingest than blocks of 16 MB; larger ones gain
/// nothing more.
const READ_BYTES: usize = 16 << 20;
/// The longest event accepted: a name and an `args` at their limits
/// ([`crate::columns::MAX_NAME_BYTES`], [`crate::columns::MAX_ARGS_BYTES`]) and room for the
/// rest. The splitter stops reading an event past this, so that a damaged or hostile one (a
/// name of gigabytes in a small compressed file) is an error after reading this much of it,
/// not after the memory and time of the whole.
const MAX_EVENT_BYTES: usize = 32 << 20;
/// The longest value of a top-level key other than `traceEvents` (metadata: device
/// properties, distributed info, a few KB in real traces).
const MAX_TOP_LEVEL_BYTES: usize = 64 << 20;
/// Bytes of the first read.
const FIRST_READ_BYTES: usize = 64 << 10;
/// Where an event lies in its block: its start and end, and the span of its one member that
/// is an object (its `args`), if it has exactly one.
pub(super) type EventSpan = (usize, usize, Option<(usize, usize)>);

/// A run of whole events: `ranges` index into `bytes`; `offset` is the stream offset of
/// `bytes[0]`.
pub(super) struct Block {
    /// A whole read buffer, of which only the events' `ranges` mean anything. It goes back to
    /// the reader as it is, its every byte initialized room for the next reads.
    pub(super) bytes: Vec<u8>,
    pub(super) ranges: Vec<EventSpan>,
    pub(super) offset: u64,
    pub(super) first_event: u64,
    /// The text of the event before the block's first (empty for the first block): a legacy
    /// kernel's flow arrow may be there ([`BlockOut::legacy_flow`]).
    pub(super) previous: Vec<u8>,
}

/// Buffered reader that keeps track of absolute offsets.
pub(super) struct Stream<R> {
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
            // A compressed file cut short ends inside its stream.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(self.err(format!("read error: {e}")).cut_short())
            }
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
                return Err(self
                    .err("unexpected end of input: the trace is truncated")
                    .cut_short());
            }
        }
    }
}

pub(super) type TopLevel = Vec<(String, Vec<u8>, u64)>;

/// Walks the top-level object; sends `traceEvents` to the parser in blocks and returns the
/// raw text of every other key.
pub(super) fn split_stream(
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
            None => {
                return Err(s
                    .err("unexpected end of input: the trace is truncated")
                    .cut_short())
            }
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
            return Err(s
                .err("unexpected end of input: the trace is truncated")
                .cut_short());
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
pub(super) fn split_events(
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
                    crate::columns::MAX_NAME_BYTES >> 20,
                    crate::columns::MAX_ARGS_BYTES >> 20
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
            )
            .cut_short());
        }
    }
}

/// Makes a read buffer at least `len` long, with a sixteenth more as room for the event that
/// straddles the next read: a spare buffer is then long enough for the next block, and is not
/// grown (Vec growth would double it past malloc's mapping threshold, then map, zero and fault
/// in 32 MB for one block: 2 % of an ingest's CPU).
pub(super) fn ensure_len(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len {
        let len = len + len / 16;
        buf.reserve_exact(len - buf.len());
        buf.resize(len, 0);
    }
}

/// Sends the events of `ranges` with the read buffer itself as the block's text; the rest of
/// the buffer (from `s.pos`) moves to a fresh or spare buffer.
pub(super) fn hand_over(
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
