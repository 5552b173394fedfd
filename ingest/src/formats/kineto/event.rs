//! One Kineto event into canonical columns ([`parse_event`]): its kind, ids, time in integer
//! ns, launch geometry and copy kind, memory instants and `C` counters. The parser half of the
//! adapter (as Perfetto's `json_trace_parser`); [`super::tokenizer`] cuts the events.

use super::*;

/// pid / tid as written: an integer or a string.
pub(super) enum Id<'a> {
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
pub(super) fn stable_negative_id(s: &str) -> i64 {
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
pub(super) fn kind_of(cat: &str, name: &str) -> Kind {
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
pub(super) const LEGACY_FLOW: &str = "cpu_to_cuda";

/// The legacy flow arrow head the event at `event` is, if it is one.
#[inline]
pub(super) fn legacy_flow_head(event: Cursor<'_>) -> Option<(Option<i64>, i64, i64)> {
    if event.buf.is_empty() {
        return None;
    }
    let mut scratch = BlockOut::default();
    parse_event(event, None, None, &mut scratch).ok()?;
    scratch.legacy_flow
}

/// The kind of a complete event without `cat`: PyTorch's legacy `export_chrome_trace` (up to
/// 1.7) files operators under `"pid": "CPU functions"` and kernels under `"CUDA functions"`.
pub(super) fn legacy_kind(pid: &Id<'_>) -> Kind {
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
pub(super) fn copy_kind_of(name: &str) -> Option<&'static str> {
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
pub(super) fn copy_kind_of_direction(direction: &str) -> Option<&'static str> {
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
pub(super) fn ns_of(c: &mut Cursor<'_>, field: &str) -> json::Result<i64> {
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

pub(super) const HOUR_NS: i64 = 3_600_000_000_000;

/// Whether the event at `event` (at its `{`) is of a phase skipped whatever else it holds
/// (flows, metadata: a third of a training trace's events), found without parsing it: Kineto
/// writes `"ph"` first. Such an event is then not read further: like the `args` objects the
/// parser does not read, it is checked only as far as every event is (its strings end, its
/// brackets balance, it holds no event boundary unless it is valid JSON: see
/// [`json::element_boundary`]), not token by token. One with a second `"ph"` (which
/// overrides the first) is left to the full parse.
pub(super) fn of_skipped_phase(event: Cursor<'_>) -> bool {
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
pub(super) fn parse_event(
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
    if let Some(why) = crate::columns::oversized(name.len(), args.map_or(0, |(a, b)| b - a)) {
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
#[inline]
pub(super) fn widen(span: &mut Option<(i64, i64)>, lo: i64, hi: i64) {
    *span = Some(match *span {
        Some((a, b)) => (a.min(lo), b.max(hi)),
        None => (lo, hi),
    });
}

pub(super) struct MemoryInstant {
    device: Option<i32>,
    allocated: Option<f64>,
    reserved: Option<f64>,
}

/// Whether `text` is an array of exactly three plain integers (digits, `-`, whitespace).
pub(super) fn is_plain_triple(text: &str) -> bool {
    text.bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'-' | b',' | b'[' | b']') || b.is_ascii_whitespace())
        && text.bytes().filter(|&b| b == b',').count() == 2
}

/// `args` with the original string pid/tid added (`{"pid": "Spans", ...}`).
pub(super) fn with_original_ids(pid: Option<&str>, tid: Option<&str>, raw: Option<&str>) -> String {
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

pub(super) fn expect_str<'a>(c: &mut Cursor<'a>, key: &str) -> json::Result<Cow<'a, str>> {
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
pub(super) fn counter_event(
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
