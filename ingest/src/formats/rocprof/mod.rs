//! rocprofv3 (AMD ROCprofiler-SDK) CSV adapter.
//!
//! `rocprofv3 --output-format csv` writes one CSV per table and process, named
//! `<prefix>kernel_trace.csv`, `<prefix>hip_api_trace.csv`, ... (the prefix is `<pid>_` by
//! default, or the `-o` name). [`parse`] reads the files of one output (one process or
//! several) into one trace. Tables are recognised by their header line ([`table_of_header`]),
//! not by file name; columns are looked up by header name (case-insensitive), never by
//! position, so the ROCm 6.2/6.3 and 6.4/7.x column sets both read, as do `rocpd convert`
//! CSVs (which add a `Guid` column).
//!
//! # Mapping
//!
//! | table | gpuq `kind` | notes |
//! |---|---|---|
//! | `kernel_trace` | `kernel` | see below |
//! | `memory_copy_trace` | `memcpy` | name `Memcpy HtoD (Host -> Device)` (Kineto's style) |
//! | `hip_api_trace` (Domain `HIP_*`), `rccl_api_trace`, rocDecode/rocJPEG | `runtime` | a launch |
//! | `hsa_api_trace` (Domain `HSA_*`) | `driver` | a launch |
//! | `marker_api_trace` (ROCTx), start < end | `annotation` | a host annotation interval |
//! | `marker_api_trace`, start == end (`roctxMark`) | `instant` | |
//! | `marker_api_trace`, Domain `MARKER_CONTROL_API` / `MARKER_NAME_API` | `other` | |
//! | `memory_allocation_trace`, `scratch_memory_trace` | `other` | name = Operation |
//! | `agent_info` | — | `top_level["deviceProperties"]` and `top_level["rocprofv3"]` |
//! | `counter_collection`, `*_stats` | — | recognised, not ingested (a warning) |
//!
//! Every table: `ts` = `Start_Timestamp`, `dur` = `End_Timestamp - Start_Timestamp`
//! (integers, parsed exactly), `correlation` = `Correlation_Id`, `tid` = `Thread_Id`,
//! `pid` = `Process_Id`. Columns without a canonical place go to `args` as a compact JSON
//! object keyed by the header name as written (`{"Agent_Id":"Agent 4","Dispatch_Id":7,...}`;
//! integers as numbers, other text as strings, empty fields left out).
//!
//! Kernels: `name` = `Kernel_Name`; `stream` = `Stream_Id` when the column exists (rocprofv3
//! writes 0 there unless HIP stream display is on), else `Queue_Id`; `block` =
//! `Workgroup_Size_X/Y/Z`; `grid` = `ceil(Grid_Size_n / Workgroup_Size_n)` (rocprofv3 gives
//! the grid in work-items, gpuq follows CUDA and counts blocks; the raw sizes stay in
//! `args`); scalar `Grid_Size`/`Workgroup_Size` columns are used as x when there are no
//! per-dimension ones; `registers` = `VGPR_Count` (architected VGPRs);
//! `shared_mem` = `LDS_Block_Size`, or `Group_Segment_Size` on ROCm 6.2/6.3.
//!
//! Copies: `copy_kind` from `Direction` (`MEMORY_COPY_HOST_TO_DEVICE` -> `HtoD`,
//! `..._DEVICE_TO_HOST` -> `DtoH`, `..._DEVICE_TO_DEVICE` -> `DtoD`, `..._HOST_TO_HOST` ->
//! `HtoH`, `..._PEER...` -> `PtoP`, anything else kept as written); `bytes` from a `Bytes`,
//! `Size` or `Copy_Bytes` column if there is one (rocprofv3 6.x/7.x CSVs have none);
//! `device` = the destination agent if it is a GPU, else the source agent.
//!
//! # Devices
//!
//! `Agent_Id` is `"Agent N"` (N = logical node id, the default; node id with
//! `--agent-index absolute`), `"GPU N"` (`--agent-index type-relative`: N is the GPU index
//! itself) or a bare number (ROCm 6.2/6.3). With `agent_info.csv` among the files, `N` is
//! looked up by `Logical_Node_Id`, then `Node_Id`; GPU agents are numbered 0, 1, ... in
//! `Node_Id` order, as rocprofv3 numbers them, and CPU agents give a null device. Without
//! it, GPU-side agent ids get 0, 1, ... in the order first seen (files are read in a fixed
//! order: API tables, kernels, copies), and a copy's GPU side follows its direction.
//!
//! # Processes
//!
//! The API and marker tables carry `Process_Id`; the GPU tables do not. GPU rows take the
//! process of the API tables from the same output (same directory and file-name prefix),
//! else a `<pid>_` file-name prefix, else stay null. rocprofv3 correlation ids are unique
//! per process only, so with several processes GPU work is matched to the launch of the same
//! id *and* process ([`crate::attribute::host::HostStructure::correlation_per_process`]).
//!
//! # Attribution
//!
//! Every HIP/HSA/RCCL call with a correlation id becomes a [`Launch`]; every ROCTx range
//! becomes an annotation [`HostInterval`] on its thread. [`crate::attribute`] then gives a
//! kernel the innermost range around its launching call as `scope`; `op` stays null
//! (rocprofv3 has no framework operators).
//!
//! # ROCTx assumptions
//!
//! rocprofv3 writes one row per marker, with the *message* as `Function` for `roctxMarkA`,
//! `roctxRangePushA` and `roctxRangeStartA`: a push/pop (or start/stop) pair is already
//! joined into one row spanning the range, and a mark has start == end. Ranges from
//! `roctxRangeStart` are process-wide and rocprofv3 writes `Thread_Id` 0 for them; they are
//! kept as annotations on thread 0, so they do not scope work launched from other threads.
//!
//! # Times
//!
//! Timestamps are integer ns from the ROCprofiler-SDK clock. That clock is the system's
//! boot-based clock on current releases (values like `2414192765353337`, about 28 days), not
//! the Unix epoch: `time_base_ns` is 0, and `epoch_time` is set only when every timestamp is
//! later than 2000-01-01 in epoch ns.
//!
//! # CSV dialect
//!
//! rocprofv3 quotes every string field but does not double quotes inside it, so a kernel
//! name may hold `"` and `,`. Rows are read per line with standard quoting first (`""`
//! inside quotes is one `"`); a row that does not then have the header's number of fields is
//! re-split around its free-text column (`Kernel_Name`, `Function`), taking the other fields
//! from both ends. A quoted field still open at the end of a line continues on the next
//! (standard CSV). Any other row with the wrong number of fields, a non-integer in an integer
//! column, or `End_Timestamp < Start_Timestamp` is an error naming the file and the 1-based
//! line. Required columns: kernels `Kernel_Name, Start_Timestamp, End_Timestamp`; copies
//! `Direction, Start_Timestamp, End_Timestamp`; API/marker tables `Domain, Function,
//! Start_Timestamp, End_Timestamp`; allocations/scratch `Operation, Start_Timestamp,
//! End_Timestamp`; `agent_info` `Node_Id, Agent_Type`. A missing one is an error at line 1
//! that lists the columns found; other columns are optional (null when absent).

use crate::attribute::host::{HostInterval, Launch};
use crate::columns::{Event, EventColumns, Kind};
use crate::formats::{EventSink, ParsedTrace, TraceError};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// Rows handed to the sink at a time.
const BATCH_ROWS: usize = 64 * 1024;
/// The longest line read: a name at its limit ([`crate::columns::MAX_NAME_BYTES`]) and room
/// for the other fields; past this a line is an error after reading this much of it.
const MAX_LINE_BYTES: usize = 4 << 20;
/// Physical lines one quoted field may span before the row is reported as unterminated.
const MAX_JOINED_LINES: usize = 64;
/// 2000-01-01T00:00:00Z in ns since the epoch.
const EPOCH_2000_NS: i64 = 946_684_800_000_000_000;

/// The rocprofv3 CSV tables gpuq reads. The order is the order [`parse`] reads them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    AgentInfo,
    /// Also any table with the API columns (`Domain, Function, Process_Id, ...`): the HIP,
    /// HSA, marker, RCCL, rocDecode and rocJPEG tables share one header, and [`parse`] tells
    /// their rows apart by `Domain`. See [`table_of_file`].
    HipApiTrace,
    HsaApiTrace,
    MarkerApiTrace,
    RcclApiTrace,
    KernelTrace,
    MemoryCopyTrace,
    MemoryAllocationTrace,
    ScratchMemoryTrace,
    /// `counter_collection.csv`: recognised, not ingested.
    CounterCollection,
    /// `--stats` summaries (`*_stats.csv`): recognised, not ingested.
    Stats,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::AgentInfo => "agent_info",
            Table::HipApiTrace => "hip_api_trace",
            Table::HsaApiTrace => "hsa_api_trace",
            Table::MarkerApiTrace => "marker_api_trace",
            Table::RcclApiTrace => "rccl_api_trace",
            Table::KernelTrace => "kernel_trace",
            Table::MemoryCopyTrace => "memory_copy_trace",
            Table::MemoryAllocationTrace => "memory_allocation_trace",
            Table::ScratchMemoryTrace => "scratch_memory_trace",
            Table::CounterCollection => "counter_collection",
            Table::Stats => "stats",
        }
    }

    const ALL: [Table; 11] = [
        Table::AgentInfo,
        Table::HipApiTrace,
        Table::HsaApiTrace,
        Table::MarkerApiTrace,
        Table::RcclApiTrace,
        Table::KernelTrace,
        Table::MemoryCopyTrace,
        Table::MemoryAllocationTrace,
        Table::ScratchMemoryTrace,
        Table::CounterCollection,
        Table::Stats,
    ];

    /// The table a rocprofv3 file name ends with (`1234_kernel_trace.csv`), if any.
    fn of_file_name(name: &str) -> Option<(Table, usize)> {
        let lower = name.to_ascii_lowercase();
        for t in Table::ALL {
            let suffix = match t {
                Table::Stats => "_stats.csv".to_string(),
                _ => format!("{}.csv", t.name()),
            };
            if lower.ends_with(&suffix) {
                let keep = if t == Table::Stats {
                    // `<prefix>kernel_stats.csv`: the whole name is the table.
                    0
                } else {
                    lower.len() - suffix.len()
                };
                return Some((t, keep));
            }
        }
        for extra in ["rocdecode_api_trace.csv", "rocjpeg_api_trace.csv"] {
            if lower.ends_with(extra) {
                return Some((Table::HipApiTrace, lower.len() - extra.len()));
            }
        }
        None
    }
}

/// Whether `path`'s name is one rocprofv3 gives its CSV tables (`1234_kernel_trace.csv`):
/// such a file in an output directory is read as rocprofv3 output even where its content
/// does not look like it (damage is then an error, not a file passed over).
pub fn named_as_output(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| Table::of_file_name(n).is_some())
}

/// The rocprofv3 output a file belongs to by its name: its directory joined with the prefix
/// its tables share (`out/1234_` for `out/1234_kernel_trace.csv`). `None` for a name that is
/// no rocprofv3 table's. The files of one output must be read together: GPU rows find their
/// launches and process in the API tables.
pub fn output_named(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let (table, _) = Table::of_file_name(name)?;
    if table == Table::Stats {
        // `<pid>_kernel_stats.csv`: the output is the process's, as for its other tables.
        let digits = name.len() - name.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let prefix = match &name[digits..] {
            rest if digits > 0 && rest.starts_with('_') => &name[..=digits],
            _ => "",
        };
        return Some(path.parent().unwrap_or(Path::new("")).join(prefix));
    }
    Some(output_of(path).0)
}

/// Recognises a rocprofv3 CSV by its header line (content, not file name). None = not a
/// rocprofv3 CSV. The API tables (HIP, HSA, marker, RCCL, ...) share one header and all
/// answer [`Table::HipApiTrace`]; [`table_of_file`] tells them apart by their first row.
pub fn table_of_header(header_line: &str) -> Option<Table> {
    let header = header_line
        .strip_prefix('\u{feff}')
        .unwrap_or(header_line)
        .trim_end_matches(['\r', '\n']);
    let mut fields = Vec::new();
    if split_standard(header, &mut fields) != Split::Complete {
        return None;
    }
    classify(&Columns::new(header, &fields))
}

/// Like [`table_of_header`], but names the API table from the `Domain` of the first data
/// row (`HIP_RUNTIME_API` -> [`Table::HipApiTrace`], `MARKER_CORE_API` ->
/// [`Table::MarkerApiTrace`], ...).
pub fn table_of_file(header_line: &str, first_row: Option<&str>) -> Option<Table> {
    let table = table_of_header(header_line)?;
    if table != Table::HipApiTrace {
        return Some(table);
    }
    let header = header_line.strip_prefix('\u{feff}').unwrap_or(header_line);
    let mut fields = Vec::new();
    split_standard(header.trim_end_matches(['\r', '\n']), &mut fields);
    let columns = Columns::new(header.trim_end_matches(['\r', '\n']), &fields);
    let Some(row) = first_row.map(|r| r.trim_end_matches(['\r', '\n'])) else {
        return Some(table);
    };
    let mut row_fields = Vec::new();
    split_standard(row, &mut row_fields);
    let domain = columns
        .get("domain")
        .and_then(|i| row_fields.get(i))
        .map(|f| f.text(row))
        .unwrap_or_default();
    Some(match ApiDomain::of(&domain) {
        ApiDomain::Hsa => Table::HsaApiTrace,
        ApiDomain::Marker | ApiDomain::MarkerControl => Table::MarkerApiTrace,
        ApiDomain::Rccl => Table::RcclApiTrace,
        ApiDomain::Hip | ApiDomain::OtherApi => Table::HipApiTrace,
    })
}

fn classify(c: &Columns) -> Option<Table> {
    let has = |n: &str| c.get(n).is_some();
    Some(if has("counter_name") && has("counter_value") {
        Table::CounterCollection
    } else if has("kernel_name") && (has("dispatch_id") || has("kernel_id") || has("kind")) {
        Table::KernelTrace
    } else if has("direction") && (has("source_agent_id") || has("destination_agent_id")) {
        Table::MemoryCopyTrace
    } else if has("operation") && has("allocation_size") {
        Table::MemoryAllocationTrace
    } else if has("operation") && has("alloc_flags") {
        Table::ScratchMemoryTrace
    } else if has("domain") && has("function") {
        Table::HipApiTrace
    } else if has("node_id") && has("agent_type") {
        Table::AgentInfo
    } else if has("calls") && has("totaldurationns") {
        Table::Stats
    } else {
        return None;
    })
}

/// Parses the CSV files of one rocprofv3 output (one process or several) into one trace.
/// Errors name the file: (path, error with the 1-based line number).
pub fn parse(
    files: &[PathBuf],
    sink: &mut EventSink<'_>,
) -> Result<ParsedTrace, (PathBuf, TraceError)> {
    let mut plan = Vec::with_capacity(files.len());
    for path in files {
        let table = classify_file(path).map_err(|e| (path.clone(), e))?;
        plan.push((table, path));
    }
    plan.sort();
    let mut st = RocprofReader::new(sink);
    for (table, path) in plan {
        if table != Table::AgentInfo {
            st.agents.finish_info(&mut st.trace);
        }
        st.parse_file(table, path).map_err(|e| (path.clone(), e))?;
    }
    st.agents.finish_info(&mut st.trace);
    st.finish().map_err(|e| {
        (
            files.last().cloned().unwrap_or_default(),
            TraceError::whole(e),
        )
    })
}

/// The table of a file: by header, else (so that a missing column is reported as such) by
/// file name.
fn classify_file(path: &Path) -> Result<Table, TraceError> {
    let mut lines = Lines::open(path)?;
    let mut header = String::new();
    if !lines.next_line(&mut header)? {
        return Err(TraceError::at_line(1, "the file is empty: no header line"));
    }
    if let Some(t) = table_of_header(&header) {
        return Ok(t);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if let Some((t, _)) = Table::of_file_name(name) {
        return Ok(t);
    }
    Err(TraceError::at_line(
        1,
        format!(
            "not a rocprofv3 CSV: the header ({}) is not one of rocprofv3's tables",
            shorten(&header, 200)
        ),
    ))
}

fn shorten(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...", &s[..end]))
}

// ---------------------------------------------------------------------------------------
// CSV reading

/// One field of a line: `text[start..end]`, with `""` to be read as `"` when `escaped`.
#[derive(Debug, Clone, Copy)]
struct Field {
    start: usize,
    end: usize,
    escaped: bool,
}

impl Field {
    fn text(self, line: &str) -> Cow<'_, str> {
        let raw = line.get(self.start..self.end).unwrap_or("");
        if self.escaped {
            Cow::Owned(raw.replace("\"\"", "\""))
        } else {
            Cow::Borrowed(raw)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    Complete,
    /// A quoted field is still open at the end of the text.
    Open,
    /// Text after a closing quote that is not a comma.
    Malformed,
}

/// Splits one record with standard CSV quoting (`""` in a quoted field is one `"`; a quote
/// inside an unquoted field is kept as text).
fn split_standard(text: &str, fields: &mut Vec<Field>) -> Split {
    fields.clear();
    let b = text.as_bytes();
    let mut pos = 0;
    loop {
        if b.get(pos) == Some(&b'"') {
            let start = pos + 1;
            let mut i = start;
            let mut escaped = false;
            let close = loop {
                let Some(rel) = b.get(i..).and_then(|r| memchr::memchr(b'"', r)) else {
                    return Split::Open;
                };
                let j = i + rel;
                if b.get(j + 1) == Some(&b'"') {
                    escaped = true;
                    i = j + 2;
                    continue;
                }
                break j;
            };
            fields.push(Field {
                start,
                end: close,
                escaped,
            });
            pos = close + 1;
            match b.get(pos) {
                None => return Split::Complete,
                Some(b',') => pos += 1,
                Some(_) => return Split::Malformed,
            }
        } else {
            let rest = b.get(pos..).unwrap_or(&[]);
            match memchr::memchr(b',', rest) {
                Some(rel) => {
                    fields.push(Field {
                        start: pos,
                        end: pos + rel,
                        escaped: false,
                    });
                    pos += rel + 1;
                }
                None => {
                    fields.push(Field {
                        start: pos,
                        end: b.len(),
                        escaped: false,
                    });
                    return Split::Complete;
                }
            }
        }
    }
}

/// Splits a record of `n` fields whose field `k` may hold unescaped quotes and commas (as
/// rocprofv3 writes names): the other fields must be plain, and are taken from both ends.
fn split_anchored(text: &str, n: usize, k: usize, fields: &mut Vec<Field>) -> bool {
    fields.clear();
    if k >= n {
        return false;
    }
    let b = text.as_bytes();
    let mut pos = 0;
    for _ in 0..k {
        let Some((f, next)) = plain_forward(b, pos) else {
            return false;
        };
        fields.push(f);
        pos = next;
    }
    let mut right = Vec::with_capacity(n - k - 1);
    let mut end = b.len();
    for _ in 0..n - k - 1 {
        let Some((f, comma)) = plain_backward(b, end, pos) else {
            return false;
        };
        right.push(f);
        end = comma;
    }
    if end < pos {
        return false;
    }
    let mid = &b[pos..end];
    let f = if mid.len() >= 2 && mid[0] == b'"' && mid[mid.len() - 1] == b'"' {
        Field {
            start: pos + 1,
            end: end - 1,
            escaped: false,
        }
    } else if !mid.contains(&b'"') {
        Field {
            start: pos,
            end,
            escaped: false,
        }
    } else {
        return false;
    };
    fields.push(f);
    fields.extend(right.into_iter().rev());
    true
}

/// A plain field (no quote inside) starting at `pos` and ended by a comma; returns it and
/// the position after the comma.
fn plain_forward(b: &[u8], pos: usize) -> Option<(Field, usize)> {
    let rest = b.get(pos..)?;
    if rest.first() == Some(&b'"') {
        let close = pos + 1 + memchr::memchr(b'"', rest.get(1..)?)?;
        if b.get(close + 1) != Some(&b',') {
            return None;
        }
        let f = Field {
            start: pos + 1,
            end: close,
            escaped: false,
        };
        Some((f, close + 2))
    } else {
        let comma = pos + memchr::memchr(b',', rest)?;
        if b[pos..comma].contains(&b'"') {
            return None;
        }
        let f = Field {
            start: pos,
            end: comma,
            escaped: false,
        };
        Some((f, comma + 1))
    }
}

/// A plain field ending at `end` and preceded by a comma at or after `floor`; returns it and
/// the position of that comma.
fn plain_backward(b: &[u8], end: usize, floor: usize) -> Option<(Field, usize)> {
    let seg = b.get(floor..end)?;
    if seg.last() == Some(&b'"') {
        let open = floor + memchr::memrchr(b'"', &seg[..seg.len() - 1])?;
        let comma = open.checked_sub(1)?;
        if comma < floor || b[comma] != b',' {
            return None;
        }
        let f = Field {
            start: open + 1,
            end: end - 1,
            escaped: false,
        };
        Some((f, comma))
    } else {
        let comma = floor + memchr::memrchr(b',', seg)?;
        if b[comma + 1..end].contains(&b'"') {
            return None;
        }
        let f = Field {
            start: comma + 1,
            end,
            escaped: false,
        };
        Some((f, comma))
    }
}

/// Physical lines of a file, with their 1-based numbers.
struct Lines {
    r: BufReader<std::fs::File>,
    bytes: Vec<u8>,
    /// Number of the last line read.
    line: u64,
    /// The last line read had no line end (the file may be truncated).
    unterminated: bool,
}

impl Lines {
    fn open(path: &Path) -> Result<Lines, TraceError> {
        let f = std::fs::File::open(path)
            .map_err(|e| TraceError::whole(format!("cannot open the file: {e}")))?;
        Ok(Lines {
            r: BufReader::with_capacity(1 << 20, f),
            bytes: Vec::new(),
            line: 0,
            unterminated: false,
        })
    }

    /// Appends the next line (without its line end) to `out`; false at end of file.
    fn next_line(&mut self, out: &mut String) -> Result<bool, TraceError> {
        self.bytes.clear();
        let n = (&mut self.r)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.bytes)
            .map_err(|e| TraceError::at_line(self.line + 1, format!("read error: {e}")))?;
        if n == 0 {
            return Ok(false);
        }
        self.line += 1;
        if n > MAX_LINE_BYTES {
            return Err(TraceError::at_line(
                self.line,
                format!(
                    "a line longer than {} MiB (names are limited to {} MiB): a damaged file?",
                    MAX_LINE_BYTES >> 20,
                    crate::columns::MAX_NAME_BYTES >> 20
                ),
            ));
        }
        if let Some(at) = memchr::memchr(0, &self.bytes) {
            return Err(TraceError::at_line(
                self.line,
                format!(
                    "a NUL byte (byte {} of the line): the file is damaged",
                    at + 1
                ),
            ));
        }
        self.unterminated = self.bytes.last() != Some(&b'\n');
        let mut s = &self.bytes[..];
        if let Some(rest) = s.strip_suffix(b"\n") {
            s = rest;
        }
        if let Some(rest) = s.strip_suffix(b"\r") {
            s = rest;
        }
        if self.line == 1 {
            s = s.strip_prefix("\u{feff}".as_bytes()).unwrap_or(s);
        }
        match std::str::from_utf8(s) {
            Ok(t) => out.push_str(t),
            Err(e) => {
                return Err(TraceError::at_line(
                    self.line,
                    format!("not UTF-8 text (byte {} of the line)", e.valid_up_to() + 1),
                ))
            }
        }
        Ok(true)
    }
}

/// One data row.
#[derive(Default)]
struct Record {
    text: String,
    fields: Vec<Field>,
    line: u64,
}

impl Record {
    fn get(&self, i: usize) -> Cow<'_, str> {
        self.fields
            .get(i)
            .map(|f| f.text(&self.text))
            .unwrap_or(Cow::Borrowed(""))
    }

    fn text(&self, i: Option<usize>) -> Cow<'_, str> {
        i.map_or(Cow::Borrowed(""), |i| self.get(i))
    }

    fn err(&self, message: impl Into<String>) -> TraceError {
        TraceError::at_line(self.line, message)
    }

    /// An optional integer column: None when the column is absent or the field empty.
    fn int(&self, cols: &Columns, i: Option<usize>) -> Result<Option<i64>, TraceError> {
        let Some(i) = i else { return Ok(None) };
        let v = self.get(i);
        let v = v.trim();
        if v.is_empty() {
            return Ok(None);
        }
        match v.parse::<i64>() {
            Ok(n) => Ok(Some(n)),
            Err(_) => Err(self.err(format!(
                "column {}: {:?} is not an integer",
                cols.name(i),
                shorten(v, 60)
            ))),
        }
    }

    /// A required integer column.
    fn req_int(&self, cols: &Columns, i: usize) -> Result<i64, TraceError> {
        self.int(cols, Some(i))?
            .ok_or_else(|| self.err(format!("column {} is empty", cols.name(i))))
    }
}

/// Reads the next data row of `n` fields (blank lines skipped); false at end of file.
fn read_record(
    lines: &mut Lines,
    rec: &mut Record,
    n: usize,
    text_col: Option<usize>,
) -> Result<bool, TraceError> {
    rec.text.clear();
    loop {
        if !lines.next_line(&mut rec.text)? {
            return Ok(false);
        }
        if !rec.text.trim().is_empty() {
            break;
        }
        rec.text.clear();
    }
    rec.line = lines.line;
    let mut joined = 0;
    loop {
        let split = split_standard(&rec.text, &mut rec.fields);
        if split == Split::Complete && rec.fields.len() == n {
            return Ok(true);
        }
        if let Some(k) = text_col {
            if split_anchored(&rec.text, n, k, &mut rec.fields) {
                return Ok(true);
            }
        }
        if split == Split::Open && joined < MAX_JOINED_LINES {
            rec.text.push('\n');
            if lines.next_line(&mut rec.text)? {
                joined += 1;
                continue;
            }
            return Err(rec
                .err("a quoted field is not closed before the end of the file (truncated file?)")
                .cut_short());
        }
        let message = match split {
            Split::Open => "a quoted field is not closed".to_string(),
            Split::Malformed => "malformed quoting: text after a closing quote".to_string(),
            Split::Complete => {
                let what = if lines.unterminated {
                    " (the last line has no line end: truncated file?)"
                } else {
                    ""
                };
                format!(
                    "expected {n} fields as in the header, found {}{what}",
                    rec.fields.len()
                )
            }
        };
        return Err(rec.err(message));
    }
}

/// Header columns, looked up case-insensitively.
struct Columns {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl Columns {
    fn new(line: &str, fields: &[Field]) -> Columns {
        let names: Vec<String> = fields
            .iter()
            .map(|f| f.text(line).trim().to_string())
            .collect();
        let mut index = HashMap::new();
        for (i, n) in names.iter().enumerate() {
            index.entry(n.to_ascii_lowercase()).or_insert(i);
        }
        Columns { names, index }
    }

    fn get(&self, lower_name: &str) -> Option<usize> {
        self.index.get(lower_name).copied()
    }

    fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or("?", |s| s.as_str())
    }

    fn require(&self, table: Table, name: &str) -> Result<usize, TraceError> {
        self.get(&name.to_ascii_lowercase()).ok_or_else(|| {
            TraceError::at_line(
                1,
                format!(
                    "{} table: missing required column {name}; columns found: {}",
                    table.name(),
                    self.names.join(", ")
                ),
            )
        })
    }

    /// `(index, JSON key)` of every column not in `mapped` (lower-case names), for `args`.
    fn rest(&self, mapped: &[&str]) -> Vec<(usize, String)> {
        let mut seen = BTreeSet::new();
        self.names
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                let l = n.to_ascii_lowercase();
                !n.is_empty() && !mapped.contains(&l.as_str()) && seen.insert(l)
            })
            .map(|(i, n)| (i, serde_json::Value::String(n.clone()).to_string()))
            .collect()
    }
}

/// `args`: the `rest` columns of a row as a compact JSON object; None when all are empty.
fn rest_args(rec: &Record, rest: &[(usize, String)], out: &mut String) -> bool {
    out.clear();
    out.push('{');
    for (i, key) in rest {
        let v = rec.get(*i);
        if v.is_empty() {
            continue;
        }
        if out.len() > 1 {
            out.push(',');
        }
        out.push_str(key);
        out.push(':');
        let number = v.trim().parse::<i64>();
        match number {
            Ok(n) => out.push_str(&n.to_string()),
            Err(_) => out.push_str(&serde_json::Value::String(v.into_owned()).to_string()),
        }
    }
    out.push('}');
    out.len() > 2
}

// ---------------------------------------------------------------------------------------
// Agents

/// An `Agent_Id` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AgentRef {
    None,
    /// `"Agent N"` or a bare `N`.
    Id(i64),
    /// `"GPU N"`: N is the GPU index.
    Gpu(i64),
    Cpu,
}

impl AgentRef {
    fn parse(s: &str) -> AgentRef {
        let s = s.trim();
        let number = |t: &str| t.trim().parse::<i64>().ok();
        if s.is_empty() {
            AgentRef::None
        } else if let Some(n) = number(s) {
            AgentRef::Id(n)
        } else if let Some(n) = s.strip_prefix("Agent").and_then(number) {
            AgentRef::Id(n)
        } else if let Some(n) = s.strip_prefix("GPU").and_then(number) {
            AgentRef::Gpu(n)
        } else if s.starts_with("CPU") {
            AgentRef::Cpu
        } else {
            AgentRef::None
        }
    }
}

#[derive(Default)]
struct Agents {
    /// Rows of agent_info.csv, by node id (one per node even with several processes).
    info: BTreeMap<i64, AgentInfo>,
    /// Set once the agent_info rows are numbered.
    finished: bool,
    /// Agent id -> GPU index (None for a CPU), from agent_info: by logical node id, by node id.
    by_logical: HashMap<i64, Option<i32>>,
    by_node: HashMap<i64, Option<i32>>,
    /// Without agent_info: GPU-side agent ids in the order first seen.
    seen: HashMap<i64, i32>,
}

struct AgentInfo {
    logical: Option<i64>,
    gpu: bool,
    row: serde_json::Map<String, serde_json::Value>,
    name: String,
}

impl Agents {
    /// Numbers the GPU agents (in node-id order) and records the device list.
    fn finish_info(&mut self, trace: &mut ParsedTrace) {
        if self.finished {
            return;
        }
        self.finished = true;
        if self.info.is_empty() {
            return;
        }
        let mut devices = Vec::new();
        let mut rows = Vec::new();
        let mut next = 0i32;
        for (&node, a) in &self.info {
            let index = a.gpu.then(|| {
                next += 1;
                next - 1
            });
            self.by_node.insert(node, index);
            if let Some(l) = a.logical {
                self.by_logical.insert(l, index);
            }
            if let Some(i) = index {
                let mut d = serde_json::Map::new();
                d.insert("id".into(), i.into());
                d.insert("name".into(), a.name.clone().into());
                if let Some(g) = a.row.get("Name") {
                    d.insert("gfx_target".into(), g.clone());
                }
                d.insert("node_id".into(), node.into());
                devices.push(serde_json::Value::Object(d));
            }
            rows.push(serde_json::Value::Object(a.row.clone()));
        }
        trace
            .top_level
            .insert("deviceProperties".into(), devices.into());
        let mut meta = serde_json::Map::new();
        meta.insert("agent_info".into(), rows.into());
        trace.top_level.insert("rocprofv3".into(), meta.into());
    }

    /// Whether the agent is a GPU, when known.
    fn is_gpu(&self, r: AgentRef) -> Option<bool> {
        match r {
            AgentRef::Gpu(_) => Some(true),
            AgentRef::Cpu => Some(false),
            AgentRef::None => None,
            AgentRef::Id(n) => self
                .by_logical
                .get(&n)
                .or_else(|| self.by_node.get(&n))
                .map(|i| i.is_some()),
        }
    }

    /// The GPU index of an agent; `gpu_side` says the agent is known to be a GPU (a kernel's
    /// agent), so that without agent_info it is numbered on first sight.
    fn gpu_index(&mut self, r: AgentRef, gpu_side: bool) -> Option<i32> {
        match r {
            AgentRef::Gpu(n) => i32::try_from(n).ok(),
            AgentRef::Cpu | AgentRef::None => None,
            AgentRef::Id(n) => {
                if let Some(i) = self.by_logical.get(&n).or_else(|| self.by_node.get(&n)) {
                    return *i;
                }
                if let Some(&i) = self.seen.get(&n) {
                    return Some(i);
                }
                if !gpu_side {
                    return None;
                }
                let i = self.seen.len() as i32;
                self.seen.insert(n, i);
                Some(i)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Rows

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApiDomain {
    Hip,
    Hsa,
    Marker,
    /// `MARKER_CONTROL_API` / `MARKER_NAME_API`: roctx calls that are not markers.
    MarkerControl,
    Rccl,
    OtherApi,
}

impl ApiDomain {
    fn of(domain: &str) -> ApiDomain {
        let d = domain.trim().to_ascii_uppercase();
        if d.starts_with("HIP") {
            ApiDomain::Hip
        } else if d.starts_with("HSA") {
            ApiDomain::Hsa
        } else if d.starts_with("MARKER") || d.starts_with("ROCTX") {
            if d.contains("CONTROL") || d.contains("NAME") {
                ApiDomain::MarkerControl
            } else {
                ApiDomain::Marker
            }
        } else if d.starts_with("RCCL") {
            ApiDomain::Rccl
        } else {
            ApiDomain::OtherApi
        }
    }
}

/// `(copy_kind, name)` of a `Direction`.
fn copy_of(direction: &str) -> (Cow<'_, str>, Cow<'static, str>) {
    let d = direction.trim();
    let core = d.strip_prefix("MEMORY_COPY_").unwrap_or(d);
    let known = match core {
        "HOST_TO_DEVICE" => Some(("HtoD", "Memcpy HtoD (Host -> Device)")),
        "DEVICE_TO_HOST" => Some(("DtoH", "Memcpy DtoH (Device -> Host)")),
        "DEVICE_TO_DEVICE" => Some(("DtoD", "Memcpy DtoD (Device -> Device)")),
        "HOST_TO_HOST" => Some(("HtoH", "Memcpy HtoH (Host -> Host)")),
        c if c.starts_with("PEER") => Some(("PtoP", "Memcpy PtoP (Device -> Device)")),
        _ => None,
    };
    match known {
        Some((k, n)) => (Cow::Borrowed(k), Cow::Borrowed(n)),
        None => (Cow::Borrowed(d), Cow::Owned(format!("Memcpy {d}"))),
    }
}

/// Per output (directory + file-name prefix): the processes seen in its host tables.
#[derive(Default)]
struct Output {
    pids: BTreeSet<i64>,
}

/// The output a file belongs to and the pid in its name (`1234_kernel_trace.csv`).
fn output_of(path: &Path) -> (PathBuf, Option<i64>) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let Some((_, keep)) = Table::of_file_name(name) else {
        return (dir, None);
    };
    let prefix = name.get(..keep).unwrap_or("");
    let pid = prefix
        .strip_suffix('_')
        .filter(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|p| p.parse().ok());
    (dir.join(prefix), pid)
}

/// Reads the CSV files of rocprofv3 outputs into events: the rows go to `sink` in batches, the
/// agents and host structure into the parsed trace.
struct RocprofReader<'s, 'a> {
    sink: &'s mut EventSink<'a>,
    events: EventColumns,
    trace: ParsedTrace,
    agents: Agents,
    outputs: HashMap<PathBuf, Output>,
    host_pids: BTreeSet<i64>,
    gpu_rows_without_pid: u64,
    min_ts: Option<i64>,
    args: String,
}

impl<'s, 'a> RocprofReader<'s, 'a> {
    fn new(sink: &'s mut EventSink<'a>) -> Self {
        RocprofReader {
            sink,
            events: EventColumns::with_capacity(BATCH_ROWS),
            trace: ParsedTrace::default(),
            agents: Agents::default(),
            outputs: HashMap::new(),
            host_pids: BTreeSet::new(),
            gpu_rows_without_pid: 0,
            min_ts: None,
            args: String::new(),
        }
    }

    fn warn(&mut self, what: &str) {
        *self.trace.warnings.entry(what.to_string()).or_default() += 1;
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.events.is_empty() {
            return Ok(());
        }
        let full = std::mem::replace(&mut self.events, EventColumns::with_capacity(BATCH_ROWS));
        (self.sink)(full.finish())
    }

    fn push(&mut self, kind: Kind, e: &Event<'_>, line: u64) -> Result<(), TraceError> {
        if let Some(why) = crate::columns::oversized(e.name.len(), e.args.map_or(0, str::len)) {
            return Err(TraceError::at_line(line, why));
        }
        self.events.push(kind, e);
        self.trace.events += 1;
        if kind == Kind::Kernel {
            self.trace.kernels += 1;
        }
        self.min_ts = Some(self.min_ts.map_or(e.ts, |m| m.min(e.ts)));
        if !kind.is_gpu() {
            self.trace.host.extend_host_span(e.ts, e.ts + e.dur.max(0));
        }
        if self.events.len() >= BATCH_ROWS {
            self.flush().map_err(|err| {
                TraceError::at_line(line, format!("cannot keep the parsed events: {err}"))
            })?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<ParsedTrace, String> {
        self.flush()
            .map_err(|e| format!("cannot keep the parsed events: {e}"))?;
        let mut trace = self.trace;
        trace.time_base_ns = 0;
        trace.epoch_time = self.min_ts.is_none_or(|m| m >= EPOCH_2000_NS);
        trace.host.correlation_per_process = self.host_pids.len() > 1;
        if trace.host.correlation_per_process && self.gpu_rows_without_pid > 0 {
            *trace
                .warnings
                .entry(
                    "GPU rows of several processes without a known process (not attributed)".into(),
                )
                .or_default() += self.gpu_rows_without_pid;
        }
        Ok(trace)
    }

    fn parse_file(&mut self, table: Table, path: &Path) -> Result<(), TraceError> {
        let mut lines = Lines::open(path)?;
        let mut header = String::new();
        if !lines.next_line(&mut header)? {
            return Err(TraceError::at_line(1, "the file is empty: no header line"));
        }
        let mut fields = Vec::new();
        if split_standard(&header, &mut fields) != Split::Complete {
            return Err(TraceError::at_line(
                1,
                "cannot read the header line: a quoted field is not closed",
            ));
        }
        let cols = Columns::new(&header, &fields);
        let (output, name_pid) = output_of(path);
        match table {
            Table::AgentInfo => self.agent_info(&mut lines, &cols),
            Table::HipApiTrace
            | Table::HsaApiTrace
            | Table::MarkerApiTrace
            | Table::RcclApiTrace => self.api(&mut lines, &cols, table, output),
            Table::KernelTrace => {
                let pid = self.gpu_pid(&output, name_pid);
                self.kernels(&mut lines, &cols, pid)
            }
            Table::MemoryCopyTrace => {
                let pid = self.gpu_pid(&output, name_pid);
                self.copies(&mut lines, &cols, pid)
            }
            Table::MemoryAllocationTrace | Table::ScratchMemoryTrace => {
                let pid = self.gpu_pid(&output, name_pid);
                self.memory_ops(&mut lines, &cols, table, pid)
            }
            Table::CounterCollection | Table::Stats => {
                self.warn(&format!("rocprofv3 {} files not ingested", table.name()));
                Ok(())
            }
        }?;
        if lines.unterminated && lines.line > 1 {
            self.warn("rocprofv3 CSV files whose last line has no line end (truncated?)");
        }
        Ok(())
    }

    /// The process of the GPU rows of an output: the one its host tables name, else the
    /// file-name prefix.
    fn gpu_pid(&self, output: &Path, name_pid: Option<i64>) -> Option<i64> {
        match self.outputs.get(output) {
            Some(o) if o.pids.len() == 1 => o.pids.first().copied(),
            _ => name_pid,
        }
    }

    fn times(
        rec: &Record,
        cols: &Columns,
        start: usize,
        end: usize,
    ) -> Result<(i64, i64), TraceError> {
        let s = rec.req_int(cols, start)?;
        let e = rec.req_int(cols, end)?;
        if e < s {
            return Err(rec.err(format!(
                "{} {e} is before {} {s}",
                cols.name(end),
                cols.name(start)
            )));
        }
        let dur = e
            .checked_sub(s)
            .ok_or_else(|| rec.err("the duration does not fit in 64 bits"))?;
        Ok((s, dur))
    }

    fn agent_info(&mut self, lines: &mut Lines, cols: &Columns) -> Result<(), TraceError> {
        let node = cols.require(Table::AgentInfo, "Node_Id")?;
        let kind = cols.require(Table::AgentInfo, "Agent_Type")?;
        let logical = cols.get("logical_node_id");
        let product = cols.get("product_name");
        let model = cols.get("model_name");
        let gfx = cols.get("name");
        let n = cols.names.len();
        let mut rec = Record::default();
        while read_record(lines, &mut rec, n, None)? {
            let node_id = rec.req_int(cols, node)?;
            let gpu = rec.get(kind).trim().eq_ignore_ascii_case("GPU");
            let mut row = serde_json::Map::new();
            for (i, name) in cols.names.iter().enumerate() {
                let v = rec.get(i);
                let v = v.trim();
                let value = match v.parse::<i64>() {
                    Ok(x) => serde_json::Value::from(x),
                    Err(_) => serde_json::Value::from(v),
                };
                row.insert(name.clone(), value);
            }
            let name = [product, model, gfx]
                .into_iter()
                .map(|c| rec.text(c).trim().to_string())
                .find(|s| !s.is_empty())
                .unwrap_or_default();
            let info = AgentInfo {
                logical: rec.int(cols, logical)?,
                gpu,
                row,
                name,
            };
            self.agents.info.entry(node_id).or_insert(info);
        }
        Ok(())
    }

    fn api(
        &mut self,
        lines: &mut Lines,
        cols: &Columns,
        table: Table,
        output: PathBuf,
    ) -> Result<(), TraceError> {
        cols.require(table, "Domain")?;
        let function = cols.require(table, "Function")?;
        let start = cols.require(table, "Start_Timestamp")?;
        let end = cols.require(table, "End_Timestamp")?;
        let domain = cols.get("domain");
        let pid_col = cols.get("process_id");
        let tid_col = cols.get("thread_id");
        let corr_col = cols.get("correlation_id");
        let rest = cols.rest(&[
            "function",
            "process_id",
            "thread_id",
            "correlation_id",
            "start_timestamp",
            "end_timestamp",
        ]);
        let n = cols.names.len();
        let mut rec = Record::default();
        let mut args = std::mem::take(&mut self.args);
        while read_record(lines, &mut rec, n, Some(function))? {
            let (ts, dur) = Self::times(&rec, cols, start, end)?;
            let pid = rec.int(cols, pid_col)?;
            let tid = rec.int(cols, tid_col)?;
            let correlation = rec.int(cols, corr_col)?;
            let name = rec.get(function);
            let has_args = rest_args(&rec, &rest, &mut args);
            let dom = ApiDomain::of(&rec.text(domain));
            let kind = match dom {
                ApiDomain::Hip | ApiDomain::Rccl | ApiDomain::OtherApi => Kind::Runtime,
                ApiDomain::Hsa => Kind::Driver,
                ApiDomain::Marker if dur == 0 => Kind::Instant,
                ApiDomain::Marker => Kind::Annotation,
                ApiDomain::MarkerControl => Kind::Other,
            };
            let e = Event {
                pid,
                tid,
                name: &name,
                ts,
                dur,
                correlation,
                args: has_args.then_some(args.as_str()),
                ..Default::default()
            };
            self.push(kind, &e, rec.line)?;
            if let Some(p) = pid {
                self.host_pids.insert(p);
                self.outputs
                    .entry(output.clone())
                    .or_default()
                    .pids
                    .insert(p);
            }
            let (Some(p), Some(t)) = (pid, tid) else {
                continue;
            };
            let host = &mut self.trace.host;
            match kind {
                Kind::Runtime | Kind::Driver => {
                    if let Some(correlation) = correlation {
                        let thread = host.threads.intern(p, t);
                        host.launches.push(Launch::new(correlation, ts, thread));
                    }
                }
                Kind::Annotation => {
                    let thread = host.threads.intern(p, t);
                    let id = host.names.intern(&name);
                    host.intervals
                        .push(HostInterval::new(thread, ts, ts + dur, id, true));
                }
                _ => {}
            }
        }
        self.args = args;
        Ok(())
    }

    fn kernels(
        &mut self,
        lines: &mut Lines,
        cols: &Columns,
        file_pid: Option<i64>,
    ) -> Result<(), TraceError> {
        let t = Table::KernelTrace;
        let name_col = cols.require(t, "Kernel_Name")?;
        let start = cols.require(t, "Start_Timestamp")?;
        let end = cols.require(t, "End_Timestamp")?;
        let g = |n: &str| cols.get(n);
        let agent = g("agent_id");
        let stream_col = g("stream_id");
        let queue = g("queue_id");
        let (stream_col, stream_name) = match stream_col {
            Some(s) => (Some(s), "stream_id"),
            None => (queue, "queue_id"),
        };
        let pid_col = g("process_id");
        let tid_col = g("thread_id");
        let corr_col = g("correlation_id");
        let wg = [
            g("workgroup_size_x").or(g("workgroup_size")),
            g("workgroup_size_y"),
            g("workgroup_size_z"),
        ];
        let grid = [
            g("grid_size_x").or(g("grid_size")),
            g("grid_size_y"),
            g("grid_size_z"),
        ];
        let vgpr = g("vgpr_count").or(g("arch_vgpr_count"));
        let (lds, lds_name) = match g("lds_block_size") {
            Some(i) => (Some(i), "lds_block_size"),
            None => (g("group_segment_size"), "group_segment_size"),
        };
        let mut mapped = vec![
            "kind",
            "kernel_name",
            "start_timestamp",
            "end_timestamp",
            "process_id",
            "thread_id",
            "correlation_id",
            "vgpr_count",
            "arch_vgpr_count",
            stream_name,
            lds_name,
        ];
        mapped.retain(|m| !m.is_empty());
        let rest = cols.rest(&mapped);
        let n = cols.names.len();
        let mut rec = Record::default();
        let mut args = std::mem::take(&mut self.args);
        while read_record(lines, &mut rec, n, Some(name_col))? {
            let (ts, dur) = Self::times(&rec, cols, start, end)?;
            let pid = rec.int(cols, pid_col)?.or(file_pid);
            if pid.is_none() {
                self.gpu_rows_without_pid += 1;
            }
            let device = self
                .agents
                .gpu_index(AgentRef::parse(&rec.text(agent)), true);
            let mut block = [None; 3];
            let mut blocks = [None; 3];
            for d in 0..3 {
                let w = rec.int(cols, wg[d])?;
                let items = rec.int(cols, grid[d])?;
                block[d] = w.and_then(|w| i32::try_from(w).ok());
                blocks[d] = match (items, w) {
                    (Some(items), Some(w)) if w > 0 && items >= 0 => items
                        .checked_add(w - 1)
                        .and_then(|x| i32::try_from(x / w).ok()),
                    _ => None,
                };
            }
            let name = rec.get(name_col);
            let has_args = rest_args(&rec, &rest, &mut args);
            let e = Event {
                device,
                stream: rec.int(cols, stream_col)?,
                pid,
                tid: rec.int(cols, tid_col)?,
                name: &name,
                ts,
                dur,
                correlation: rec.int(cols, corr_col)?,
                grid: blocks,
                block,
                registers: rec.int(cols, vgpr)?.and_then(|v| i32::try_from(v).ok()),
                shared_mem: rec.int(cols, lds)?,
                args: has_args.then_some(args.as_str()),
                ..Default::default()
            };
            self.push(Kind::Kernel, &e, rec.line)?;
        }
        self.args = args;
        Ok(())
    }

    fn copies(
        &mut self,
        lines: &mut Lines,
        cols: &Columns,
        file_pid: Option<i64>,
    ) -> Result<(), TraceError> {
        let t = Table::MemoryCopyTrace;
        let direction = cols.require(t, "Direction")?;
        let start = cols.require(t, "Start_Timestamp")?;
        let end = cols.require(t, "End_Timestamp")?;
        let g = |n: &str| cols.get(n);
        let src = g("source_agent_id");
        let dst = g("destination_agent_id");
        let stream_col = g("stream_id");
        let pid_col = g("process_id");
        let tid_col = g("thread_id");
        let corr_col = g("correlation_id");
        let (bytes_col, bytes_name) = ["bytes", "size", "copy_bytes"]
            .into_iter()
            .find_map(|n| g(n).map(|i| (Some(i), n)))
            .unwrap_or((None, ""));
        let mut mapped = vec![
            "kind",
            "direction",
            "start_timestamp",
            "end_timestamp",
            "stream_id",
            "process_id",
            "thread_id",
            "correlation_id",
            bytes_name,
        ];
        mapped.retain(|m| !m.is_empty());
        let rest = cols.rest(&mapped);
        let n = cols.names.len();
        let mut rec = Record::default();
        let mut args = std::mem::take(&mut self.args);
        while read_record(lines, &mut rec, n, None)? {
            let (ts, dur) = Self::times(&rec, cols, start, end)?;
            let pid = rec.int(cols, pid_col)?.or(file_pid);
            if pid.is_none() {
                self.gpu_rows_without_pid += 1;
            }
            let dir_text = rec.get(direction);
            let (copy_kind, name) = copy_of(&dir_text);
            let src_ref = AgentRef::parse(&rec.text(src));
            let dst_ref = AgentRef::parse(&rec.text(dst));
            let by_direction = match &*copy_kind {
                "DtoH" => Some(src_ref),
                "HtoH" => None,
                _ => Some(dst_ref),
            };
            let side = match (self.agents.is_gpu(dst_ref), self.agents.is_gpu(src_ref)) {
                (Some(true), _) => Some(dst_ref),
                (Some(false), Some(true)) => Some(src_ref),
                (Some(false), Some(false)) => None,
                _ => by_direction,
            };
            let device = side.and_then(|s| self.agents.gpu_index(s, true));
            let unknown = !matches!(&*copy_kind, "HtoD" | "DtoH" | "DtoD" | "HtoH" | "PtoP");
            let has_args = rest_args(&rec, &rest, &mut args);
            let e = Event {
                device,
                stream: rec.int(cols, stream_col)?,
                pid,
                tid: rec.int(cols, tid_col)?,
                name: &name,
                ts,
                dur,
                correlation: rec.int(cols, corr_col)?,
                bytes: rec.int(cols, bytes_col)?,
                copy_kind: (!copy_kind.is_empty()).then_some(&*copy_kind),
                args: has_args.then_some(args.as_str()),
                ..Default::default()
            };
            self.push(Kind::Memcpy, &e, rec.line)?;
            if unknown {
                self.warn("rocprofv3 copies of unknown direction (copy_kind kept as written)");
            }
        }
        self.args = args;
        Ok(())
    }

    fn memory_ops(
        &mut self,
        lines: &mut Lines,
        cols: &Columns,
        table: Table,
        file_pid: Option<i64>,
    ) -> Result<(), TraceError> {
        let op = cols.require(table, "Operation")?;
        let start = cols.require(table, "Start_Timestamp")?;
        let end = cols.require(table, "End_Timestamp")?;
        let g = |n: &str| cols.get(n);
        let agent = g("agent_id");
        let size = g("allocation_size");
        let pid_col = g("process_id");
        let tid_col = g("thread_id");
        let corr_col = g("correlation_id");
        let rest = cols.rest(&[
            "kind",
            "operation",
            "start_timestamp",
            "end_timestamp",
            "allocation_size",
            "process_id",
            "thread_id",
            "correlation_id",
        ]);
        let n = cols.names.len();
        let mut rec = Record::default();
        let mut args = std::mem::take(&mut self.args);
        while read_record(lines, &mut rec, n, None)? {
            let (ts, dur) = Self::times(&rec, cols, start, end)?;
            let device = self
                .agents
                .gpu_index(AgentRef::parse(&rec.text(agent)), false);
            let name = rec.get(op);
            let has_args = rest_args(&rec, &rest, &mut args);
            let e = Event {
                device,
                pid: rec.int(cols, pid_col)?.or(file_pid),
                tid: rec.int(cols, tid_col)?,
                name: &name,
                ts,
                dur,
                correlation: rec.int(cols, corr_col)?,
                bytes: rec.int(cols, size)?,
                args: has_args.then_some(args.as_str()),
                ..Default::default()
            };
            self.push(Kind::Other, &e, rec.line)?;
        }
        self.args = args;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
