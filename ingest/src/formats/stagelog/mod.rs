//! Stage-log adapter: timestamped application logs that mark the begin and end of stages
//! (`load`, `train`, `step`, ...). Every begin/end pair becomes one `annotation` event with
//! `scope = 'stage'`, on the epoch-ns clock, so a stage breakdown can be queried next to the
//! kernels of the same run (see `docs/stage-logs.md`).
//!
//! # Lines
//!
//! The log is read line by line (`\n`, an optional `\r` before it is dropped; a UTF-8 BOM on
//! line 1 is skipped). Each line is classified by how it starts, so a file may mix the three
//! grammars freely:
//!
//! * blank (only whitespace): ignored;
//! * `{`: a **JSON line** (grammar 1);
//! * `YYYY-MM-DD ` (a date and a space): a **Python `logging` line** (grammar 3);
//! * a timestamp token, or `ts=` / `time=` / `timestamp=`: a **`key=value` line** (grammar 2);
//! * anything else, and a line of one of these kinds that breaks its grammar: *unparsable*.
//!   Without `lenient` the first unparsable line is an error (1-based line number); with
//!   `lenient` it is skipped and counted in the warning `unparsable lines skipped`.
//!
//! Well-formed lines that are not stage markers (other log output) are ignored, but their
//! timestamps count as "seen" (see unterminated stages below).
//!
//! ## Timestamps
//!
//! * ISO-8601 / RFC 3339: `YYYY-MM-DDTHH:MM:SS[.fraction][offset]`, fraction of 1 to 9 digits
//!   after `.` or `,`, offset `Z`, `z`, `±HH:MM`, `±HHMM` or `±HH`. Fields are range-checked
//!   (month, day of that month, `HH <= 23`, `MM, SS <= 59`; no leap second). In JSON lines and
//!   `key=value` lines the **offset is required** unless a [`zone::LogZone`] (`--tz`) says
//!   where naive times are local: a naive local time cannot otherwise be put on the GPU's
//!   epoch clock. Inside a JSON string (and a quoted `time="..."` value) the date and time
//!   may also be separated by `t` or a space.
//! * Epoch: `DIGITS[.DIGITS]` (no sign, no exponent). The unit follows from the integer part
//!   *I*: *I* < 10^11 seconds, < 10^14 milliseconds, < 10^17 microseconds, otherwise
//!   nanoseconds (today that is 10, 13, 16 and 19 digits). The fraction may not go below the
//!   nanosecond (at most 9, 6, 3, 0 digits respectively); it is an error, not rounded.
//!
//! All conversions are integer arithmetic, exact to the nanosecond (never through `f64`); a
//! time outside the `i64` nanosecond range (years 1677..2262) is an error.
//!
//! ## Events
//!
//! `begin`, `start`, `enter` begin a stage; `end`, `stop`, `finish`, `done`, `exit` end it
//! (ASCII case-insensitive).
//!
//! ## 1. JSON lines
//!
//! One JSON object per line, e.g. `{"ts": "2026-12-02T10:00:00.5Z", "stage": "load", "event":
//! "begin"}`. An object without a `"stage"` key is other log output. With one, it needs:
//! `"stage"` a non-empty string; `"event"` a string event word; exactly one timestamp key
//! among `"ts"`, `"time"`, `"timestamp"`, whose value is an ISO-8601 string, an epoch number
//! (its digits are read from the JSON text, not as a float) or an epoch string (`"1796205600.5"`).
//! Optional `"pid"` and `"tid"` integers fill those columns. All other keys (`rank`, `step`,
//! `level`, ...) go to `args`.
//!
//! ## 2. `key=value` lines
//!
//! `TIMESTAMP TEXT` where `TIMESTAMP` is an ISO-8601 (with `T`) or epoch token, or the first
//! token is `ts=`, `time=` or `timestamp=` with a timestamp value (which may be quoted), e.g.
//! `2026-12-02T10:00:00.123456Z stage=load begin` or
//! `time=2026-12-02T10:00:00Z level=info stage="data prep" event=start rank=3`.
//! The line is a stage marker when one of its whitespace-separated words starts with `stage=`;
//! otherwise `TEXT` is free text and the line is ignored. A marker's `TEXT` is a sequence of
//! whitespace-separated tokens, each `key=value`, `key="quoted value"` (`\"` and `\\` are
//! escapes, any other backslash is kept) or a bare word. It must hold exactly one `stage=NAME`
//! (non-empty), exactly one event (a bare event word or `event=WORD`) and no other bare word
//! (quote multi-word names). `pid=` and `tid=` must be integers; every other pair goes to
//! `args` (a bare canonical integer as a JSON number, anything else as a string). A key may
//! appear once.
//!
//! ## 3. Python `logging`
//!
//! `ASCTIME - NAME - LEVEL - MESSAGE` (`'%(asctime)s - %(name)s - %(levelname)s -
//! %(message)s'`) or `ASCTIME LEVEL NAME: MESSAGE` (`'%(asctime)s %(levelname)s %(name)s:
//! %(message)s'`), with `ASCTIME` = `YYYY-MM-DD HH:MM:SS[,fraction][offset]` (the default is
//! `2026-12-02 10:00:00,123`). Python writes local time without a zone: **an `asctime` without
//! an offset is read as UTC**, or in the given zone (set `logging.Formatter.converter =
//! time.gmtime`, or add `%z` to `datefmt`). `LEVEL` is `[A-Z0-9_]+`. The line is a stage marker when the first word of the
//! message is `stage`, `stage:` or `[stage]` (followed by the stage name, bare or quoted, then
//! the tokens of grammar 2) or starts with `stage=` (the tokens of grammar 2), e.g.
//! `[stage] load begin`, `stage load end`, `stage="data prep" begin step=3`. Such a message
//! must be a complete marker (as in grammar 2); any other message is ignored. `args` also get
//! `logger` and `level`.
//!
//! # Pairing
//!
//! Begins and ends are paired per (stage name, pid, tid, `rank` arg): stages of different
//! names nest freely (a `step` inside `train`); a stage re-begun before its end is a nested
//! instance (a stack per key: an end closes the latest open begin). Each pair is one event:
//! `kind = 'annotation'`, `scope = 'stage'`, `name` = stage, `ts` = begin, `dur` = end -
//! begin, `pid`/`tid` from the lines, `args` = the begin's other fields plus those only the end
//! has, as compact JSON (null when none). Timestamps may go backwards between stages, but:
//!
//! * an end with no open begin is an error (`lenient`: warning `stage ends without a begin
//!   (skipped)`);
//! * an end before its begin is an error (`lenient`: the pair is dropped, warning `stage ends
//!   before its begin (dropped)`);
//! * a stage still open at the end of the log is closed at the latest timestamp seen in the
//!   log (any well-formed line), warning `stages without an end, closed at the last log
//!   timestamp`.
//!
//! Times are epoch ns (`epoch_time`, `time_base_ns = 0`); the stages are also host annotation
//! intervals (thread `(pid or 0, tid or 0)`) for attribution. Nothing reaches the sink unless
//! the whole log parsed. A log added to a run with traces is first put on the run's clock, or
//! refused when its times do not overlap the run's ([`clock`]).

use crate::attribute::host::HostInterval;
use crate::columns::{Event, EventColumns, Kind};
use crate::formats::json::{Cursor, Scalar};
use crate::formats::{EventSink, ParsedTrace, TraceError};
use gpuq_engine::manifest::OpenStage;
use nom::branch::alt;
use nom::bytes::complete::{tag, take_until, take_while1, take_while_m_n};
use nom::character::complete::{char, digit1, one_of, satisfy};
use nom::combinator::{eof, map, opt, value};
use nom::sequence::preceded;
use nom::{IResult, Parser};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use zone::LogZone;

const UNPARSABLE: &str = "unparsable lines skipped";
/// The start of the error for a time without a UTC offset.
const NAIVE_TIMESTAMP: &str = "ISO-8601 timestamp without a UTC offset";
const END_WITHOUT_BEGIN: &str = "stage ends without a begin (skipped)";
const END_BEFORE_BEGIN: &str = "stage ends before its begin (dropped)";
const UNTERMINATED: &str = "stages without an end, closed at the last log timestamp";
/// Rows per batch handed to the sink.
const BATCH_ROWS: usize = 65536;

/// Whether `head` (the first few KB of a decompressed text file) looks like a stage log: its
/// first non-blank line parses under one of the grammars and at least one line of `head` is a
/// stage marker. Later unparsable lines do not matter here ([`parse`] reports them with their
/// line numbers); a last line without `\n` may be cut off and is ignored when it fails.
pub fn looks_like_stage_log(head: &str) -> bool {
    let head = head.strip_prefix('\u{feff}').unwrap_or(head);
    let complete = head.ends_with('\n');
    let lines: Vec<&str> = head.split('\n').collect();
    let last = lines.len().saturating_sub(1);
    let mut first = true;
    let mut marker = false;
    for (i, line) in lines.iter().enumerate() {
        match parse_line(line, None) {
            Ok(Line::Blank) => continue,
            Ok(Line::Other { .. }) => {}
            Ok(Line::Marker(_)) => marker = true,
            // A stage log with naive times: [`parse`] says which line needs an offset, where
            // "unrecognised format" would not say what is wrong.
            Err(e) if e.contains(NAIVE_TIMESTAMP) => marker = true,
            Err(_) if first && (complete || i < last) => return false,
            Err(_) => {}
        }
        first = false;
    }
    marker
}

/// Parses a stage log. With `lenient`, lines that do not parse are skipped and counted in
/// `ParsedTrace.warnings`; otherwise the first such line is an error (TraceError::at_line,
/// 1-based). See the module documentation for the grammars and the pairing rules.
pub fn parse(
    reader: impl BufRead,
    lenient: bool,
    sink: &mut EventSink<'_>,
) -> Result<ParsedTrace, TraceError> {
    parse_onto(reader, lenient, None, None, None, sink)
}

/// [`parse`] with naive times (no UTC offset) read as local time in `zone`, for a log added to
/// a run whose traces are on `run_clock`: the stages are moved onto that clock, or the log is
/// refused when its times do not overlap the run's.
///
/// `growing_from`: the log is still being written and its lines before this byte were read by
/// an earlier call. The whole log is paired again (so that an end finds its begin), but only
/// the stages that end at or after that byte are emitted, and warnings are counted for those
/// lines only; stages still open are not closed but listed in [`ParsedTrace::open_stages`].
/// The reader must stop at the end of a complete line.
pub fn parse_onto(
    mut reader: impl BufRead,
    lenient: bool,
    zone: Option<&LogZone>,
    run_clock: Option<&clock::RunClock>,
    growing_from: Option<u64>,
    sink: &mut EventSink<'_>,
) -> Result<ParsedTrace, TraceError> {
    let mut trace = ParsedTrace {
        epoch_time: true,
        time_base_ns: 0,
        ..Default::default()
    };
    let mut pairing = Pairing::default();
    let mut buf = Vec::new();
    let mut line_no: u64 = 0;
    let from = growing_from.unwrap_or(0);
    // Warnings of lines an earlier read counted already.
    let mut counted_before = BTreeMap::new();
    let mut line_start: u64 = 0;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| TraceError::at_line(line_no + 1, format!("cannot read the log: {e}")))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let at = line_start;
        line_start += n as u64;
        let warnings = if at >= from {
            &mut trace.warnings
        } else {
            &mut counted_before
        };
        let mut bytes = buf.as_slice();
        if line_no == 1 {
            bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
        }
        let parsed = match std::str::from_utf8(bytes) {
            Ok(text) => parse_line(text, zone).map_err(|m| format!("{m}: {}", excerpt(text))),
            Err(_) => Err("the line is not valid UTF-8".to_string()),
        };
        let outcome = match parsed {
            Ok(Line::Blank) => Ok(()),
            Ok(Line::Other { ts }) => {
                if let Some(ts) = ts {
                    pairing.saw(ts);
                }
                Ok(())
            }
            Ok(Line::Marker(m)) => pairing.add(m, line_no, at, lenient, warnings),
            Err(message) => {
                if lenient {
                    *warnings.entry(UNPARSABLE.into()).or_default() += 1;
                    Ok(())
                } else {
                    Err(message)
                }
            }
        };
        outcome.map_err(|m| TraceError::at_line(line_no, m))?;
    }
    // A log read as it grows is placed on the run's clock by the span of all its stages so
    // far, as one read of the whole log would be, not by those of the new lines alone.
    let mut whole_span = None;
    let mut stages = match growing_from {
        None => pairing.finish(&mut trace),
        Some(from) => {
            whole_span = pairing.span();
            let (done, open) = pairing.so_far(from);
            trace.open_stages = Some(open);
            done
        }
    };
    stages.sort_by_key(|s| (s.ts, std::cmp::Reverse(s.dur), s.line));
    let span = whole_span.or_else(|| {
        let first = stages.iter().map(|s| s.ts).min()?;
        let last = stages.iter().map(|s| s.ts.saturating_add(s.dur)).max()?;
        Some((first, last))
    });
    if let (Some(run_clock), Some((first, last))) = (run_clock, span) {
        let shift = run_clock.place(first, last).map_err(TraceError::whole)?;
        for s in &mut stages {
            s.ts += shift;
        }
        for s in trace.open_stages.iter_mut().flatten() {
            s.ts += shift;
        }
        trace.epoch_time = run_clock.epoch;
    }
    let mut columns = EventColumns::with_capacity(stages.len().min(BATCH_ROWS));
    for s in &stages {
        let event = Event {
            pid: s.pid,
            tid: s.tid,
            name: &s.name,
            ts: s.ts,
            dur: s.dur,
            args: s.args.as_deref(),
            scope: Some("stage"),
            ..Default::default()
        };
        columns.push(Kind::Annotation, &event);
        let name = trace.host.names.intern(&s.name);
        let thread = trace
            .host
            .threads
            .intern(s.pid.unwrap_or(0), s.tid.unwrap_or(0));
        let end = s.ts.saturating_add(s.dur);
        trace
            .host
            .intervals
            .push(HostInterval::new(thread, s.ts, end, name, true));
        trace.host.extend_host_span(s.ts, end);
        if columns.len() >= BATCH_ROWS {
            let full = std::mem::replace(&mut columns, EventColumns::with_capacity(BATCH_ROWS));
            sink(full.finish()).map_err(sink_error)?;
        }
    }
    if !columns.is_empty() {
        sink(columns.finish()).map_err(sink_error)?;
    }
    trace.events = stages.len() as u64;
    Ok(trace)
}

fn sink_error(e: std::io::Error) -> TraceError {
    TraceError::whole(format!("cannot keep the parsed stages: {e}"))
}

/// The start of a line for an error message (at most 80 characters).
fn excerpt(line: &str) -> String {
    let line = line.trim_end_matches(['\n', '\r']);
    let mut s: String = line.chars().take(80).collect();
    if s.len() < line.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// One classified line.
#[derive(Debug, PartialEq)]
enum Line {
    Blank,
    /// Well-formed, not a stage marker; its timestamp when it has one.
    Other {
        ts: Option<i64>,
    },
    Marker(Marker),
}

#[derive(Debug, PartialEq)]
struct Marker {
    ts: i64,
    stage: String,
    begin: bool,
    pid: Option<i64>,
    tid: Option<i64>,
    args: Map<String, Value>,
}

fn parse_line(line: &str, zone: Option<&LogZone>) -> Result<Line, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(Line::Blank);
    }
    if line.starts_with('{') {
        return json_line(line, zone);
    }
    if (date, char(' ')).parse(line).is_ok() {
        return python_line(line, zone);
    }
    let starts_kv = line.starts_with(|c: char| c.is_ascii_digit())
        || ["ts=", "time=", "timestamp="]
            .iter()
            .any(|p| line.starts_with(p));
    if starts_kv {
        return kv_line(line, zone);
    }
    Err(
        "not a stage-log line (expected a JSON object, a timestamp followed by key=value \
         pairs, or a Python logging line)"
            .into(),
    )
}

// ---------------------------------------------------------------------------------------
// Timestamps

type Res<'a, T> = IResult<&'a str, T>;

/// Exactly `n` (at most 9) ASCII digits.
fn digits(n: usize) -> impl FnMut(&str) -> Res<'_, u32> {
    move |i| {
        map(
            take_while_m_n(n, n, |c: char| c.is_ascii_digit()),
            |s: &str| {
                s.bytes()
                    .fold(0u32, |acc, b| acc * 10 + u32::from(b - b'0'))
            },
        )
        .parse(i)
    }
}

fn date(i: &str) -> Res<'_, (u32, u32, u32)> {
    map(
        (digits(4), char('-'), digits(2), char('-'), digits(2)),
        |(y, _, m, _, d)| (y, m, d),
    )
    .parse(i)
}

/// `HH:MM:SS[(.|,)digits]`.
fn clock(i: &str) -> Res<'_, (u32, u32, u32, Option<&str>)> {
    map(
        (
            digits(2),
            char(':'),
            digits(2),
            char(':'),
            digits(2),
            opt(preceded(one_of(".,"), digit1)),
        ),
        |(h, _, m, _, s, f)| (h, m, s, f),
    )
    .parse(i)
}

/// A UTC offset: `(sign, hours, minutes)`.
fn offset(i: &str) -> Res<'_, (i64, u32, u32)> {
    alt((
        value((1, 0, 0), one_of("Zz")),
        map(
            (
                one_of("+-"),
                digits(2),
                opt(preceded(opt(char(':')), digits(2))),
            ),
            |(sign, h, m)| (if sign == '-' { -1 } else { 1 }, h, m.unwrap_or(0)),
        ),
    ))
    .parse(i)
}

/// The fields of an ISO-8601 date-time, not yet range-checked.
struct Civil<'a> {
    date: (u32, u32, u32),
    clock: (u32, u32, u32, Option<&'a str>),
    offset: Option<(i64, u32, u32)>,
}

/// `date SEP clock [offset]`, with `sep` deciding which separators are accepted.
fn civil(sep: fn(char) -> bool) -> impl FnMut(&str) -> Res<'_, Civil<'_>> {
    move |i| {
        map(
            (date, satisfy(sep), clock, opt(offset)),
            |(date, _, clock, offset)| Civil {
                date,
                clock,
                offset,
            },
        )
        .parse(i)
    }
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Epoch ns of a parsed date-time; a time without an offset is local time in `zone`, and
/// without one a missing offset is an error.
fn civil_to_ns(c: &Civil<'_>, zone: Option<&LogZone>) -> Result<i64, String> {
    let (year, month, day) = c.date;
    let (hour, minute, second, frac) = c.clock;
    let year = i64::from(year);
    if !(1..=12).contains(&month) {
        return Err(format!("month {month} out of range"));
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err(format!("day {day} out of range for {year:04}-{month:02}"));
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(format!(
            "time {hour:02}:{minute:02}:{second:02} out of range"
        ));
    }
    let offset_s = match c.offset {
        Some((sign, h, m)) => {
            if h > 23 || m > 59 {
                return Err(format!("UTC offset {h:02}:{m:02} out of range"));
            }
            sign * (i64::from(h) * 3600 + i64::from(m) * 60)
        }
        None => match zone {
            Some(zone) => zone.offset_at((year, month, day), (hour, minute, second))?,
            None => {
                return Err(format!(
                    "{NAIVE_TIMESTAMP}: a UTC offset is needed to align it with the GPU clock: \
                     write the time with `Z` or `+HH:MM` (e.g. 2026-12-02T10:00:00Z), or pass \
                     --tz with the zone the log was written in (e.g. --tz Europe/Berlin or \
                     --tz +01:00)"
                ))
            }
        },
    };
    let frac_ns = match frac {
        None => 0,
        Some(f) if f.len() > 9 => {
            return Err(format!(
                "{} fractional digits: at most 9 (nanoseconds)",
                f.len()
            ))
        }
        Some(f) => {
            let v = f
                .bytes()
                .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
            v * 10i64.pow(9 - f.len() as u32)
        }
    };
    let days = days_from_civil(year, i64::from(month), i64::from(day));
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second)
        - offset_s;
    // Years 0000..9999 keep `secs` far from overflow; the nanoseconds may not fit an i64.
    let ns = i128::from(secs) * 1_000_000_000 + i128::from(frac_ns);
    i64::try_from(ns)
        .map_err(|_| "timestamp outside the representable range (years 1677..2262)".to_string())
}

/// Epoch ns of `DIGITS[.DIGITS]`, the unit chosen by the magnitude of the integer part.
fn epoch_to_ns(text: &str) -> Result<i64, String> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || !frac.is_none_or(all_digits) {
        return Err(format!("{text:?} is not a timestamp"));
    }
    let significant = int.trim_start_matches('0');
    if significant.len() > 19 {
        return Err(format!("epoch timestamp {text} out of range"));
    }
    let int_v: u128 = significant
        .bytes()
        .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
    let (scale, unit) = if int_v < 100_000_000_000 {
        (9u32, "seconds")
    } else if int_v < 100_000_000_000_000 {
        (6, "milliseconds")
    } else if int_v < 100_000_000_000_000_000 {
        (3, "microseconds")
    } else {
        (0, "nanoseconds")
    };
    let frac = frac.unwrap_or("");
    if frac.len() > scale as usize {
        return Err(format!(
            "epoch timestamp {text} (read as {unit}) has digits below the nanosecond"
        ));
    }
    let frac_v: u128 = frac
        .bytes()
        .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
    let ns = int_v * 10u128.pow(scale) + frac_v * 10u128.pow(scale - frac.len() as u32);
    i64::try_from(ns).map_err(|_| format!("epoch timestamp {text} out of range"))
}

fn iso_sep_t(c: char) -> bool {
    c == 'T'
}

fn iso_sep_any(c: char) -> bool {
    matches!(c, 'T' | 't' | ' ')
}

/// A whole token as a timestamp: ISO-8601 (without an offset: local time in `zone`, an error
/// without one) or epoch. `loose` accepts the separators of [`iso_sep_any`] (JSON strings,
/// quoted values).
fn timestamp_ns(text: &str, loose: bool, zone: Option<&LogZone>) -> Result<i64, String> {
    let sep = if loose { iso_sep_any } else { iso_sep_t };
    match (civil(sep), eof).parse(text) {
        Ok((_, (c, _))) => civil_to_ns(&c, zone).map_err(|m| format!("timestamp {text:?}: {m}")),
        Err(_) if date(text).is_ok() => Err(format!(
            "{text:?} is not an ISO-8601 timestamp (YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM))"
        )),
        Err(_) => epoch_to_ns(text),
    }
}

// ---------------------------------------------------------------------------------------
// Events and key=value tokens

/// `Some(true)` for a begin word, `Some(false)` for an end word.
fn event_word(w: &str) -> Option<bool> {
    const BEGIN: [&str; 3] = ["begin", "start", "enter"];
    const END: [&str; 5] = ["end", "stop", "finish", "done", "exit"];
    if BEGIN.iter().any(|b| b.eq_ignore_ascii_case(w)) {
        Some(true)
    } else if END.iter().any(|e| e.eq_ignore_ascii_case(w)) {
        Some(false)
    } else {
        None
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok<'a> {
    /// `key=value`; the flag tells whether the value was quoted.
    Pair(&'a str, Cow<'a, str>, bool),
    /// A bare word or a quoted string.
    Word(Cow<'a, str>),
}

fn nom_fail<T>(i: &str) -> Res<'_, T> {
    Err(nom::Err::Error(nom::error::Error::new(
        i,
        nom::error::ErrorKind::Char,
    )))
}

/// `"..."` with `\"` and `\\` escapes (another backslash is kept as is).
fn quoted(i: &str) -> Res<'_, Cow<'_, str>> {
    let (body, _) = char('"').parse(i)?;
    let mut out: Option<String> = None;
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => {
                let rest = &body[at + 1..];
                let text = match out {
                    Some(s) => Cow::Owned(s),
                    None => Cow::Borrowed(&body[..at]),
                };
                return Ok((rest, text));
            }
            '\\' => {
                let s = out.get_or_insert_with(|| body[..at].to_string());
                match chars.next() {
                    Some((_, e @ ('"' | '\\'))) => s.push(e),
                    Some((_, other)) => {
                        s.push('\\');
                        s.push(other);
                    }
                    None => return nom_fail(i),
                }
            }
            c => {
                if let Some(s) = out.as_mut() {
                    s.push(c);
                }
            }
        }
    }
    nom_fail(i)
}

fn key(i: &str) -> Res<'_, &str> {
    take_while1(|c: char| !c.is_whitespace() && c != '=' && c != '"')(i)
}

/// A bare value: non-whitespace, not starting with `"` (may be empty: `key=`).
fn bare_value(i: &str) -> Res<'_, &str> {
    if i.starts_with('"') {
        return nom_fail(i);
    }
    let end = i.find(char::is_whitespace).unwrap_or(i.len());
    Ok((&i[end..], &i[..end]))
}

fn bare_word(i: &str) -> Res<'_, &str> {
    take_while1(|c: char| !c.is_whitespace() && c != '=' && c != '"')(i)
}

/// One token, which must end at whitespace or at the end of the text.
fn token(i: &str) -> Res<'_, Tok<'_>> {
    let (rest, tok) = alt((
        map((key, char('='), quoted), |(k, _, v)| Tok::Pair(k, v, true)),
        map((key, char('='), bare_value), |(k, _, v)| {
            Tok::Pair(k, Cow::Borrowed(v), false)
        }),
        map(quoted, Tok::Word),
        map(bare_word, |w| Tok::Word(Cow::Borrowed(w))),
    ))
    .parse(i)?;
    if rest.is_empty() || rest.starts_with(char::is_whitespace) {
        Ok((rest, tok))
    } else {
        nom_fail(rest)
    }
}

/// Whitespace-separated tokens.
fn tokens(text: &str) -> Result<Vec<Tok<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        match token(rest) {
            Ok((r, t)) => {
                out.push(t);
                rest = r.trim_start();
            }
            Err(_) => {
                return Err(format!(
                    "malformed token at {} (expected key=value, key=\"quoted value\" or a word)",
                    excerpt(rest)
                ))
            }
        }
    }
    Ok(out)
}

/// A bare canonical integer becomes a JSON number; anything else a string.
fn kv_value(v: &str, quoted: bool) -> Value {
    if !quoted {
        if let Ok(n) = v.parse::<i64>() {
            if n.to_string() == v {
                return Value::from(n);
            }
        }
    }
    Value::String(v.to_string())
}

fn int_field(key: &str, v: &str) -> Result<i64, String> {
    v.parse::<i64>()
        .map_err(|_| format!("{key}={v:?} is not an integer"))
}

/// A marker from `key=value` tokens: `stage` is set when the name came before the tokens.
fn marker_from_tokens(
    ts: i64,
    mut stage: Option<String>,
    toks: Vec<Tok<'_>>,
    mut args: Map<String, Value>,
) -> Result<Marker, String> {
    let mut event: Option<bool> = None;
    let mut pid = None;
    let mut tid = None;
    fn set_event(e: bool, event: &mut Option<bool>) -> Result<(), String> {
        if event.replace(e).is_some() {
            Err("a stage marker with two begin/end events".to_string())
        } else {
            Ok(())
        }
    }
    for tok in toks {
        match tok {
            Tok::Pair("stage", v, _) => {
                if stage.replace(v.into_owned()).is_some() {
                    return Err("the stage is given twice".into());
                }
            }
            Tok::Pair("event", v, _) => match event_word(&v) {
                Some(e) => set_event(e, &mut event)?,
                None => {
                    return Err(format!(
                        "event={v:?} is not begin/start/enter or end/stop/finish/done/exit"
                    ))
                }
            },
            Tok::Pair("pid", v, _) => pid = Some(int_field("pid", &v)?),
            Tok::Pair("tid", v, _) => tid = Some(int_field("tid", &v)?),
            Tok::Pair(k, v, quoted) => {
                if args.insert(k.to_string(), kv_value(&v, quoted)).is_some() {
                    return Err(format!("key {k:?} given twice"));
                }
            }
            Tok::Word(w) => match event_word(&w) {
                Some(e) => set_event(e, &mut event)?,
                None => {
                    return Err(format!(
                        "unexpected word {w:?} in a stage marker (quote multi-word stage names)"
                    ))
                }
            },
        }
    }
    let stage = stage.unwrap_or_default();
    if stage.is_empty() {
        return Err("empty stage name".into());
    }
    let Some(begin) = event else {
        return Err(format!(
            "stage marker for {stage:?} without begin or end (a bare word or event=...)"
        ));
    };
    Ok(Marker {
        ts,
        stage,
        begin,
        pid,
        tid,
        args,
    })
}

// ---------------------------------------------------------------------------------------
// The three grammars

/// Grammar 2: `TIMESTAMP TEXT` or `ts=TIMESTAMP TEXT`.
fn kv_line(line: &str, zone: Option<&LogZone>) -> Result<Line, String> {
    let (rest, ts) = match token(line) {
        Ok((rest, Tok::Pair(k @ ("ts" | "time" | "timestamp"), v, quoted))) => {
            let ts = timestamp_ns(&v, quoted, zone).map_err(|m| format!("{k}=: {m}"))?;
            (rest, ts)
        }
        Ok((rest, Tok::Word(w))) => (rest, timestamp_ns(&w, false, zone)?),
        _ => {
            let end = line.find(char::is_whitespace).unwrap_or(line.len());
            return Err(timestamp_ns(&line[..end], false, zone)
                .err()
                .unwrap_or_else(|| "malformed timestamp token".into()));
        }
    };
    match tokens(rest) {
        Ok(toks) if toks.iter().any(|t| matches!(t, Tok::Pair("stage", ..))) => {
            marker_from_tokens(ts, None, toks, Map::new()).map(Line::Marker)
        }
        Ok(_) => Ok(Line::Other { ts: Some(ts) }),
        Err(m) if rest.split_whitespace().any(|w| w.starts_with("stage=")) => Err(m),
        Err(_) => Ok(Line::Other { ts: Some(ts) }),
    }
}

fn level(i: &str) -> Res<'_, &str> {
    take_while1(|c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')(i)
}

/// `" - NAME - LEVEL - MESSAGE"` (the message may be empty).
fn dash_header(i: &str) -> Res<'_, (&str, &str)> {
    map(
        (
            tag(" - "),
            take_until(" - "),
            tag(" - "),
            level,
            alt((tag(" - "), tag(" -"))),
        ),
        |(_, name, _, level, _)| (name, level),
    )
    .parse(i)
}

/// `" LEVEL NAME: MESSAGE"`.
fn colon_header(i: &str) -> Res<'_, (&str, &str)> {
    let (rest, (_, level, _, name)) = (
        char(' '),
        level,
        char(' '),
        take_while1(|c: char| !c.is_whitespace()),
    )
        .parse(i)?;
    match name.strip_suffix(':') {
        Some(n) if !n.is_empty() && (rest.is_empty() || rest.starts_with(' ')) => {
            Ok((rest, (n, level)))
        }
        _ => nom_fail(i),
    }
}

/// Grammar 3: a Python `logging` line; an `asctime` without an offset is in `zone`, else UTC.
fn python_line(line: &str, zone: Option<&LogZone>) -> Result<Line, String> {
    let Ok((rest, c)) = civil(|c| c == ' ').parse(line) else {
        return Err("a date without a valid time (expected YYYY-MM-DD HH:MM:SS,mmm)".into());
    };
    let ts = civil_to_ns(&c, Some(zone.unwrap_or(&LogZone::UTC)))
        .map_err(|m| format!("timestamp: {m}"))?;
    let (message, (logger, level)) = match alt((dash_header, colon_header)).parse(rest) {
        Ok(r) => r,
        Err(_) => {
            return Err("a Python logging line, but not in the format \
                    `%(asctime)s - %(name)s - %(levelname)s - %(message)s` or \
                    `%(asctime)s %(levelname)s %(name)s: %(message)s`"
                .into())
        }
    };
    let message = message.trim();
    let first = message.split(char::is_whitespace).next().unwrap_or("");
    let mut args = Map::new();
    args.insert("logger".into(), Value::String(logger.to_string()));
    args.insert("level".into(), Value::String(level.to_string()));
    let marker = if first.starts_with("stage=") {
        marker_from_tokens(ts, None, tokens(message)?, args)?
    } else if matches!(first, "stage" | "stage:" | "[stage]") {
        let after = message[first.len()..].trim_start();
        let (rest, name) = match token(after) {
            Ok((rest, Tok::Word(w))) => (rest, w.into_owned()),
            _ => {
                return Err(format!(
                    "{first} must be followed by a stage name (a word or a quoted string)"
                ))
            }
        };
        marker_from_tokens(ts, Some(name), tokens(rest)?, args)?
    } else {
        return Ok(Line::Other { ts: Some(ts) });
    };
    Ok(Line::Marker(marker))
}

/// The raw text of a top-level number in the JSON object `line` (the last `key` wins).
fn raw_number<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut raw = None;
    let mut cursor = Cursor::new(line.as_bytes());
    cursor
        .object(|k, c| {
            let v = c.value()?;
            if k == key {
                raw = match v {
                    Scalar::Number(n) => Some(n),
                    _ => None,
                };
            }
            Ok(())
        })
        .ok()?;
    raw
}

/// The timestamp of a JSON line from `key` (one of the timestamp keys).
fn json_timestamp(line: &str, key: &str, v: &Value, zone: Option<&LogZone>) -> Result<i64, String> {
    match v {
        Value::String(s) => timestamp_ns(s, true, zone),
        Value::Number(_) => match raw_number(line, key) {
            Some(raw) => epoch_to_ns(raw),
            None => Err(format!("cannot read the number of {key:?}")),
        },
        other => Err(format!(
            "{key:?} must be an ISO-8601 string or an epoch number, not {other}"
        )),
    }
}

const TS_KEYS: [&str; 3] = ["ts", "time", "timestamp"];

/// Grammar 1: a JSON object.
fn json_line(line: &str, zone: Option<&LogZone>) -> Result<Line, String> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("not a valid JSON object ({e})"))?;
    let Value::Object(mut map) = value else {
        return Err("not a JSON object".into());
    };
    let ts_keys: Vec<&str> = TS_KEYS
        .iter()
        .copied()
        .filter(|k| map.contains_key(*k))
        .collect();
    let Some(stage) = map.remove("stage") else {
        let ts = ts_keys.first().and_then(|k| {
            map.get(*k)
                .and_then(|v| json_timestamp(line, k, v, zone).ok())
        });
        return Ok(Line::Other { ts });
    };
    let stage = match stage {
        Value::String(s) if !s.is_empty() => s,
        Value::String(_) => return Err("empty \"stage\"".into()),
        other => return Err(format!("\"stage\" must be a string, not {other}")),
    };
    let begin = match map.remove("event") {
        Some(Value::String(e)) => event_word(&e).ok_or_else(|| {
            format!("\"event\": {e:?} is not begin/start/enter or end/stop/finish/done/exit")
        })?,
        Some(other) => return Err(format!("\"event\" must be a string, not {other}")),
        None => return Err(format!("stage {stage:?} without an \"event\" (begin/end)")),
    };
    let ts = match ts_keys.as_slice() {
        [] => return Err("a stage marker without \"ts\", \"time\" or \"timestamp\"".into()),
        [k] => {
            let v = map.remove(*k).unwrap_or(Value::Null);
            json_timestamp(line, k, &v, zone)?
        }
        several => {
            return Err(format!(
                "several timestamp keys ({}): use one",
                several.join(", ")
            ))
        }
    };
    let mut int_key = |k: &str| -> Result<Option<i64>, String> {
        match map.remove(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("\"{k}\" must be an integer, not {v}")),
        }
    };
    let pid = int_key("pid")?;
    let tid = int_key("tid")?;
    Ok(Line::Marker(Marker {
        ts,
        stage,
        begin,
        pid,
        tid,
        args: map,
    }))
}

// ---------------------------------------------------------------------------------------
// Pairing

/// A finished stage.
#[derive(Debug)]
struct Stage {
    name: String,
    ts: i64,
    dur: i64,
    pid: Option<i64>,
    tid: Option<i64>,
    args: Option<String>,
    /// Line of the begin (a tie-breaker for the output order).
    line: u64,
    /// Byte offset of the end line (`u64::MAX`: closed at the end of the log).
    ended_at: u64,
}

struct Open {
    ts: i64,
    line: u64,
    args: Map<String, Value>,
}

type Key = (String, Option<i64>, Option<i64>, Option<String>);

#[derive(Default)]
struct Pairing {
    open: HashMap<Key, Vec<Open>>,
    done: Vec<Stage>,
    latest: Option<i64>,
}

fn rank_of(args: &Map<String, Value>) -> Option<String> {
    args.get("rank").map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

fn args_json(args: Map<String, Value>) -> Option<String> {
    (!args.is_empty()).then(|| Value::Object(args).to_string())
}

impl Pairing {
    fn saw(&mut self, ts: i64) {
        self.latest = Some(self.latest.map_or(ts, |l| l.max(ts)));
    }

    fn add(
        &mut self,
        m: Marker,
        line: u64,
        at: u64,
        lenient: bool,
        warnings: &mut BTreeMap<String, u64>,
    ) -> Result<(), String> {
        self.saw(m.ts);
        let key: Key = (m.stage, m.pid, m.tid, rank_of(&m.args));
        if m.begin {
            self.open.entry(key).or_default().push(Open {
                ts: m.ts,
                line,
                args: m.args,
            });
            return Ok(());
        }
        let Some(open) = self.open.get_mut(&key).and_then(Vec::pop) else {
            if lenient {
                *warnings.entry(END_WITHOUT_BEGIN.into()).or_default() += 1;
                return Ok(());
            }
            return Err(format!("stage {:?} ends without a begin", key.0));
        };
        if m.ts < open.ts {
            if lenient {
                *warnings.entry(END_BEFORE_BEGIN.into()).or_default() += 1;
                return Ok(());
            }
            return Err(format!(
                "stage {:?} ends before its begin on line {} ({} ns earlier)",
                key.0,
                open.line,
                i128::from(open.ts) - i128::from(m.ts)
            ));
        }
        let Some(dur) = m.ts.checked_sub(open.ts) else {
            return Err(format!("stage {:?} is too long", key.0));
        };
        let mut args = open.args;
        for (k, v) in m.args {
            args.entry(k).or_insert(v);
        }
        let (name, pid, tid, _) = key;
        self.done.push(Stage {
            name,
            ts: open.ts,
            dur,
            pid,
            tid,
            args: args_json(args),
            line: open.line,
            ended_at: at,
        });
        Ok(())
    }

    /// The earliest begin and the latest end of the stages paired so far, counting those
    /// still open as ending where they begin.
    fn span(&self) -> Option<(i64, i64)> {
        let done = self.done.iter().map(|s| (s.ts, s.ts.saturating_add(s.dur)));
        let open = self.open.values().flatten().map(|o| (o.ts, o.ts));
        done.chain(open)
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    }

    /// Of a log still being written: the stages that ended at or after byte `from`, and
    /// those still open.
    fn so_far(self, from: u64) -> (Vec<Stage>, Vec<OpenStage>) {
        let done = self
            .done
            .into_iter()
            .filter(|s| s.ended_at >= from)
            .collect();
        let mut open: Vec<(u64, OpenStage)> = self
            .open
            .into_iter()
            .flat_map(|((name, pid, tid, _), stack)| {
                stack.into_iter().map(move |o| {
                    (
                        o.line,
                        OpenStage {
                            name: name.clone(),
                            ts: o.ts,
                            pid,
                            tid,
                            args: args_json(o.args),
                        },
                    )
                })
            })
            .collect();
        open.sort_by_key(|(line, _)| *line);
        (done, open.into_iter().map(|(_, o)| o).collect())
    }

    /// All stages; those still open end at the latest timestamp seen.
    fn finish(mut self, trace: &mut ParsedTrace) -> Vec<Stage> {
        let latest = self.latest.unwrap_or(0);
        let mut unterminated = 0u64;
        for ((name, pid, tid, _), stack) in self.open {
            for open in stack {
                unterminated += 1;
                self.done.push(Stage {
                    name: name.clone(),
                    ts: open.ts,
                    // `latest` is the maximum of all timestamps, this begin's included.
                    dur: latest.saturating_sub(open.ts).max(0),
                    pid,
                    tid,
                    args: args_json(open.args),
                    line: open.line,
                    ended_at: u64::MAX,
                });
            }
        }
        if unterminated > 0 {
            *trace.warnings.entry(UNTERMINATED.into()).or_default() += unterminated;
        }
        self.done
    }
}

pub mod clock;
#[cfg(test)]
mod tests;
pub mod zone;
