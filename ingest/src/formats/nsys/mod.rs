//! Nsight Systems SQLite export (`nsys export --type sqlite`) adapter.
//!
//! Tables are read by column name (`PRAGMA table_info`), so every export schema from 3.7 to
//! 3.25 works; a table that an export does not have is simply empty. Large tables are read
//! in rowid ranges on all cores, from the file's pages where it allows, else through
//! read-only connections kept for the whole read (one per reading thread), which are opened
//! and closed one at a time: closing two connections to a WAL-mode export at once could hang.
//!
//! | nsys table | kind | name | notes |
//! |---|---|---|---|
//! | `CUPTI_ACTIVITY_KIND_KERNEL` | `kernel` | `StringIds[demangledName]` | `shortName` and context in `args`; `shared_mem` = static + dynamic |
//! | `CUPTI_ACTIVITY_KIND_MEMCPY` | `memcpy` | `[CUDA memcpy <ENUM_CUDA_MEMCPY_OPER.label>]` | `copy_kind` `HtoD`, `DtoH`, ...; src/dst memory kinds (labels of `ENUM_CUDA_MEM_KIND`) in `args` |
//! | `CUPTI_ACTIVITY_KIND_MEMSET` | `memset` | `[CUDA memset]` | memory kind and value in `args` |
//! | `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION` | `sync` | `Stream Sync`, `Event Sync`, `Context Sync`, `Stream Wait Event` | |
//! | `CUPTI_ACTIVITY_KIND_RUNTIME` | `runtime` (eventClass 0) / `driver` | nsys's name rule: a 4-digit `_vNNNN` suffix is dropped (`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`; the raw name is in `args.api`) | every call with a correlation id is a launch for attribution |
//! | `NVTX_EVENTS` ranges (types 59, 60, 70, 71) | `annotation`, or `cpu_op` when the text names an operator (`aten::mm, seq = 3`) | `coalesce(text, StringIds[textId])` | domain in `args.domain`; marks (34) are `instant` |
//! | `PROFILER_OVERHEAD` | `overhead` | `StringIds[nameId]` | |
//!
//! GPU rows get `pid` from `globalPid` (`(globalPid >> 24) & 0xFFFFFF`), host rows `pid`/`tid`
//! from `globalTid`. Correlation ids are unique per process only, so GPU work is matched to the
//! launch with the same correlation id in the same process. `op` is the innermost operator
//! range and `scope` the innermost other NVTX range around the launch call; `step` comes from
//! NVTX ranges whose text matches the step pattern ([`DEFAULT_STEP_PATTERN`]).
//!
//! Times stay on the capture's session timebase (what `nsys stats` prints), so `ts` is *not*
//! epoch-based; the session's UTC start (`TARGET_INFO_SESSION_START_TIME.utcEpochNs`) is kept in
//! the run metadata.
//!
//! Reading is in two steps: [`Export::read_host`] reads the host tables (runtime calls, NVTX,
//! overhead) and returns the [`GpuTables`], which [`GpuTables::read`] reads once the launches
//! are attributed, so that their rows can be attributed and written as they come. The host
//! rows can be attributed a time window at a time ([`Export::windows`], [`RANGES`]), so
//! memory does not grow with the export.

use crate::attribute::host::{HostStructure, RangeRules, Step};
use crate::columns::{Event, EventColumns, Kind};
pub mod sqlite_pages;

use crate::formats::{ParsedTrace, TraceError};
use datafusion::arrow::array::RecordBatch;
use regex::Regex;
use rusqlite::{ffi, Connection, OpenFlags};
use sqlite_pages::{PageFile, TablePlan, Value};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// NVTX range texts that mark training steps: `ProfilerStep#12`, `step 12`, `Step_12`,
/// `iteration_12`, `iter 12`, `train_step[12]`. The capture group is the step number.
pub const DEFAULT_STEP_PATTERN: &str =
    r"(?i)(?:profilerstep#|step|iteration|iter)[\s_#:=\[\(-]*(\d+)\]?\)?$";

/// Distinct kernel `args` texts remembered per reading task (graph node ids can make every
/// kernel's text distinct).
const KERNEL_ARGS_CACHED: usize = 4096;

/// Distinct NVTX range texts remembered per reading task.
const RANGE_TEXTS_CACHED: usize = 4096;

/// Rows per batch handed to the sink, and per rowid range read by one task.
const BATCH_ROWS: i64 = 1 << 16;

/// Options of the nsys adapter.
#[derive(Debug, Clone)]
pub struct NsysOptions {
    /// NVTX range texts matching this pattern are steps; its first capture group is the number.
    pub step_pattern: Regex,
    /// Read the large tables from the file's pages rather than through SQLite queries, where
    /// the file allows (the default; off only to compare the two in tests).
    pub read_pages: bool,
}

impl Default for NsysOptions {
    fn default() -> Self {
        NsysOptions {
            step_pattern: Regex::new(DEFAULT_STEP_PATTERN).expect("valid default step pattern"),
            read_pages: true,
        }
    }
}

/// Checks a user-given step pattern: it must compile and have at most one capture group (the
/// step number; without one, matching ranges are numbered 1, 2, ... in order of start).
pub fn step_pattern(pattern: &str) -> Result<Regex, String> {
    let re = Regex::new(pattern).map_err(|e| format!("invalid --step-pattern: {e}"))?;
    if re.captures_len() > 2 {
        return Err(format!(
            "--step-pattern may have one capture group (the step number), {pattern:?} has {}",
            re.captures_len() - 1
        ));
    }
    Ok(re)
}

fn sql_error(what: &str) -> impl Fn(rusqlite::Error) -> TraceError + '_ {
    move |e| TraceError::whole(format!("{what}: {e}"))
}

/// Opening or closing an SQLite connection, one thread at a time in the whole process. Two
/// threads closing their connections to the same WAL-mode database at once could wait on
/// each other's lock for ever (about one ingest in 40 hung at 0 % CPU), and a close, like an
/// open, then touches the shared `-shm` index and its locks; serialised, they cannot meet.
static OPEN_CLOSE: Mutex<()> = Mutex::new(());

/// A read-only connection to an export, closed while no other thread opens or closes one
/// ([`OPEN_CLOSE`]).
struct Conn(Option<Connection>);

impl std::ops::Deref for Conn {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.0.as_ref().expect("open until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            let _one_at_a_time = OPEN_CLOSE.lock().unwrap_or_else(|e| e.into_inner());
            drop(conn);
        }
    }
}

/// Read-only connections to one export, each used by one reading task at a time and kept
/// for the whole read: opened as tasks first need them (at most one per reading thread) and
/// closed when the read is done.
struct Connections {
    path: PathBuf,
    idle: Mutex<Vec<Conn>>,
}

impl Connections {
    fn new(path: &Path) -> Connections {
        Connections {
            path: path.to_path_buf(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Keeps `conn` for the next task.
    fn put(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
    }

    /// Runs `f` with an idle connection (or a new one), then keeps it for the next task.
    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, TraceError>,
    ) -> Result<T, TraceError> {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => open(&self.path)?,
        };
        let outcome = f(&conn);
        self.put(conn);
        outcome
    }
}

fn open(path: &Path) -> Result<Conn, TraceError> {
    let conn = {
        let _one_at_a_time = OPEN_CLOSE.lock().unwrap_or_else(|e| e.into_inner());
        Conn(Some(
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(sql_error("cannot open the SQLite database"))?,
        ))
    };
    // A corrupt or truncated file is reported by the first read of a damaged page.
    conn.pragma_update(None, "query_only", true)
        .map_err(sql_error("cannot open the SQLite database"))?;
    Ok(conn)
}

/// Columns of `table`, or None when the export has no such table.
fn columns_of(conn: &Connection, table: &str) -> Result<Option<Vec<String>>, TraceError> {
    let mut stmt = conn
        .prepare("SELECT name FROM pragma_table_info(?1)")
        .map_err(sql_error("cannot read the database schema"))?;
    let cols: Vec<String> = stmt
        .query_map([table], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(sql_error("cannot read the database schema"))?;
    Ok((!cols.is_empty()).then_some(cols))
}

/// A SELECT over `table` with `wanted` columns; absent optional ones read as NULL.
struct Select {
    table: &'static str,
    /// The selected columns after `rowid`; `None` where the table lacks an optional one.
    columns: Vec<Option<&'static str>>,
}

impl Select {
    fn new(
        conn: &Connection,
        table: &'static str,
        required: &[&'static str],
        optional: &[&'static str],
    ) -> Result<Option<Select>, TraceError> {
        let Some(have) = columns_of(conn, table)? else {
            return Ok(None);
        };
        let mut columns = Vec::new();
        for c in required {
            if !have.iter().any(|h| h == c) {
                return Err(TraceError::whole(format!(
                    "table {table} has no column {c} (columns: {}); is this an Nsight Systems export?",
                    have.join(", ")
                )));
            }
            columns.push(Some(*c));
        }
        for c in optional {
            columns.push(have.iter().any(|h| h == c).then_some(*c));
        }
        Ok(Some(Select { table, columns }))
    }

    fn rowid_range(&self, conn: &Connection) -> Result<Option<(i64, i64)>, TraceError> {
        conn.query_row(
            // Two subqueries: each is one B-tree descent, where `min(rowid), max(rowid)` in
            // one SELECT makes SQLite scan the whole table (half a second per 5 M rows).
            &format!(
                "SELECT (SELECT min(rowid) FROM \"{t}\"), (SELECT max(rowid) FROM \"{t}\")",
                t = self.table
            ),
            [],
            |r| Ok(r.get::<_, Option<i64>>(0)?.zip(r.get::<_, Option<i64>>(1)?)),
        )
        .map_err(sql_error(self.table))
    }

    /// How to read the rows from the table's pages instead (see [`sqlite_pages`]); `None`
    /// when the table needs SQLite.
    fn page_plan(&self, conn: &Connection) -> Result<Option<TablePlan>, TraceError> {
        let mut columns = vec![Some("rowid")];
        columns.extend(self.columns.iter().copied());
        sqlite_pages::plan(conn, self.table, &columns).map_err(sql_error(self.table))
    }

    fn sql(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| c.map_or("NULL".into(), |c| format!("\"{c}\"")))
            .collect();
        format!(
            "SELECT rowid, {} FROM \"{}\" WHERE rowid >= ?1 AND rowid < ?2",
            columns.join(", "),
            self.table
        )
    }
}

/// NVTX domain names by `(pid, domainId)`; looked up for every NVTX row.
type Domains = HashMap<(i64, i64), String, ahash::RandomState>;

/// `StringIds` as a dense table.
struct Strings {
    values: Vec<Option<String>>,
    sparse: HashMap<i64, String>,
}

impl Strings {
    fn load(conn: &Connection) -> Result<Strings, TraceError> {
        let mut s = Strings {
            values: Vec::new(),
            sparse: HashMap::new(),
        };
        if columns_of(conn, "StringIds")?.is_none() {
            return Ok(s);
        }
        let mut stmt = conn
            .prepare("SELECT id, value FROM StringIds")
            .map_err(sql_error("StringIds"))?;
        let mut rows = stmt.query([]).map_err(sql_error("StringIds"))?;
        while let Some(r) = rows.next().map_err(sql_error("StringIds"))? {
            let id: i64 = r.get(0).map_err(sql_error("StringIds"))?;
            let value: String = r.get(1).map_err(sql_error("StringIds"))?;
            if let Some(why) = crate::columns::oversized(value.len(), 0) {
                return Err(TraceError::at_row("StringIds", id, why));
            }
            match usize::try_from(id) {
                Ok(i) if i < 1 << 24 => {
                    if s.values.len() <= i {
                        s.values.resize(i + 1, None);
                    }
                    s.values[i] = Some(value);
                }
                _ => {
                    s.sparse.insert(id, value);
                }
            }
        }
        Ok(s)
    }

    fn get(&self, id: i64) -> Option<&str> {
        match usize::try_from(id) {
            Ok(i) if i < self.values.len() => self.values[i].as_deref(),
            _ => self.sparse.get(&id).map(|s| s.as_str()),
        }
    }
}

/// `id -> label` of an ENUM table, with the documented values as fallback.
fn enum_labels(
    conn: &Connection,
    table: &str,
    fallback: &[(i64, &str)],
) -> Result<HashMap<i64, String>, TraceError> {
    let mut map: HashMap<i64, String> = fallback
        .iter()
        .map(|&(id, l)| (id, l.to_string()))
        .collect();
    if columns_of(conn, table)?.is_some_and(|c| c.iter().any(|c| c == "label")) {
        let mut stmt = conn
            .prepare(&format!("SELECT id, label FROM \"{table}\""))
            .map_err(sql_error("enum table"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, Option<String>>(1)?))
            })
            .map_err(sql_error("enum table"))?;
        for row in rows {
            if let (id, Some(label)) = row.map_err(sql_error("enum table"))? {
                map.insert(id, label);
            }
        }
    }
    Ok(map)
}

pub(crate) const MEMCPY_OPER: &[(i64, &str)] = &[
    (0, "Unknown"),
    (1, "Host-to-Device"),
    (2, "Device-to-Host"),
    (3, "Host-to-Array"),
    (4, "Array-to-Host"),
    (5, "Array-to-Array"),
    (6, "Array-to-Device"),
    (7, "Device-to-Array"),
    (8, "Device-to-Device"),
    (9, "Host-to-Host"),
    (10, "Peer-to-Peer"),
    (11, "Unified Host-to-Device"),
    (12, "Unified Device-to-Host"),
    (13, "Unified Device-to-Device"),
];

/// `copy_kind` codes, by `ENUM_CUDA_MEMCPY_OPER` id (Kineto's spelling).
pub(crate) fn copy_code(kind: i64) -> &'static str {
    match kind {
        1 => "HtoD",
        2 => "DtoH",
        3 => "HtoA",
        4 => "AtoH",
        5 => "AtoA",
        6 => "AtoD",
        7 => "DtoA",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        11 => "UM HtoD",
        12 => "UM DtoH",
        13 => "UM DtoD",
        _ => "Unknown",
    }
}

/// nsys numbering (CUPTI's minus one; CUPTI's 0 is nsys's 7).
pub(crate) const MEM_KIND: &[(i64, &str)] = &[
    (0, "Pageable"),
    (1, "Pinned"),
    (2, "Device"),
    (3, "Array"),
    (4, "Managed"),
    (5, "Device Static"),
    (6, "Managed Static"),
    (7, "Unknown"),
];

/// Where an event name comes from, so that a name id is unique per text within a batch.
#[derive(Clone, Copy)]
enum NameSpace {
    /// `StringIds[id]` itself (kernel names, NVTX `textId`s).
    StringId,
    /// The display name of the API whose `nameId` is the id.
    ApiName,
    CopyKind,
    SyncType,
    Fixed,
}

/// A name's id for [`EventColumns::push_with_name_id`].
fn name_key(space: NameSpace, id: i64) -> u64 {
    (space as u64) << 56 | (id as u64 & ((1 << 56) - 1))
}

pub(crate) fn sync_name(sync_type: Option<i64>) -> &'static str {
    match sync_type {
        Some(1) => "Event Sync",
        Some(2) => "Stream Wait Event",
        Some(3) => "Stream Sync",
        Some(4) => "Context Sync",
        _ => "Unknown Sync",
    }
}

/// nsys's API name rule (`cuda_api_sum`): drop a `_v` + exactly 4 digits suffix, so
/// `cudaLaunchKernel_v7000` -> `cudaLaunchKernel` but `cudaLaunchKernelExC_v11060` stays.
pub fn api_display_name(raw: &str) -> &str {
    let b = raw.as_bytes();
    let n = b.len();
    if n > 6 && b[n - 6] == b'_' && b[n - 5] == b'v' && b[n - 4..].iter().all(u8::is_ascii_digit) {
        return &raw[..n - 6];
    }
    raw
}

fn pid_of(global: i64) -> i64 {
    (global >> 24) & 0xFF_FFFF
}

fn tid_of(global: i64) -> i64 {
    global & 0xFF_FFFF
}

/// An NVTX text that names an operator (PyTorch's `emit_nvtx`: `aten::mm, seq = 3, ...`):
/// the operator part, else None.
pub(crate) fn operator_name(text: &str) -> Option<&str> {
    let head = text.split(',').next().unwrap_or(text).trim();
    let (ns, rest) = head.split_once("::")?;
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.')
    };
    (ident(ns) && ident(rest)).then_some(head)
}

/// What one reading task produced.
#[derive(Default)]
struct Part {
    batches: Vec<RecordBatch>,
    host: HostStructure,
    events: u64,
    kernels: u64,
    warnings: BTreeMap<String, u64>,
}

/// Shared, read-only context of the reading tasks.
struct Context {
    /// The export's connections, for the tables read through SQLite.
    connections: Connections,
    strings: Strings,
    memcpy_oper: HashMap<i64, String>,
    mem_kind: HashMap<i64, String>,
    /// `(pid, domainId) -> domain name`, read by the first NVTX task that needs it: finding
    /// the few domain rows scans all of NVTX_EVENTS, which then overlaps other reading.
    domains: std::sync::OnceLock<Result<Domains, String>>,
    step_pattern: Regex,
    /// The export opened for reading its large tables' pages directly; `None` where that
    /// needs SQLite (see [`sqlite_pages`]).
    pages: Option<PageFile>,
}

impl Context {
    fn domains(&self) -> Result<&Domains, TraceError> {
        self.domains
            .get_or_init(|| self.connections.with(domains).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| TraceError::whole(e.clone()))
    }
}

/// One table to read, and how to turn its rows into events.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NsysTable {
    Kernel,
    Memcpy,
    Memset,
    Sync,
    Runtime,
    Nvtx,
    Overhead,
}

impl NsysTable {
    fn select(self, conn: &Connection) -> Result<Option<Select>, TraceError> {
        const GPU: [&str; 5] = ["start", "end", "deviceId", "streamId", "globalPid"];
        match self {
            NsysTable::Kernel => Select::new(
                conn,
                "CUPTI_ACTIVITY_KIND_KERNEL",
                &GPU,
                &[
                    "correlationId",
                    "demangledName",
                    "shortName",
                    "contextId",
                    "registersPerThread",
                    "gridX",
                    "gridY",
                    "gridZ",
                    "blockX",
                    "blockY",
                    "blockZ",
                    "staticSharedMemory",
                    "dynamicSharedMemory",
                    "graphNodeId",
                    "greenContextId",
                ],
            ),
            NsysTable::Memcpy => Select::new(
                conn,
                "CUPTI_ACTIVITY_KIND_MEMCPY",
                &GPU,
                &[
                    "correlationId",
                    "bytes",
                    "copyKind",
                    "srcKind",
                    "dstKind",
                    "contextId",
                    "srcDeviceId",
                    "dstDeviceId",
                ],
            ),
            NsysTable::Memset => Select::new(
                conn,
                "CUPTI_ACTIVITY_KIND_MEMSET",
                &GPU,
                &["correlationId", "bytes", "memKind", "contextId", "value"],
            ),
            NsysTable::Sync => Select::new(
                conn,
                "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
                &GPU,
                &["correlationId", "syncType", "contextId"],
            ),
            NsysTable::Runtime => Select::new(
                conn,
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                &["start", "end", "nameId"],
                &["eventClass", "globalTid", "correlationId", "returnValue"],
            ),
            NsysTable::Nvtx => Select::new(
                conn,
                "NVTX_EVENTS",
                &["start", "eventType"],
                &["end", "text", "textId", "globalTid", "domainId", "category"],
            ),
            NsysTable::Overhead => Select::new(
                conn,
                "PROFILER_OVERHEAD",
                &["start", "end"],
                &["globalTid", "nameId"],
            ),
        }
    }
}

/// A `SELECT ... WHERE rowid >= ?1 AND rowid < ?2` stepped through SQLite's C API. Reading a
/// value through rusqlite asks SQLite for the column count and the column's type before the
/// value (three calls per value, ~9 % of an export's ingest); here an integer column costs one
/// call, plus the type only when the value reads as 0, which is how SQLite reads NULL and text
/// (an INTEGER column converts numeric text on insert, so text left in one is not a number).
/// Not caught: text that only starts with digits (`12abc` reads as 12) and real numbers other
/// than 0 (truncated); nsys writes neither.
struct RangeRows<'c> {
    stmt: NonNull<ffi::sqlite3_stmt>,
    columns: usize,
    conn: &'c Connection,
}

impl<'c> RangeRows<'c> {
    fn new(conn: &'c Connection, sql: &str, lo: i64, hi: i64) -> rusqlite::Result<Self> {
        let sql = std::ffi::CString::new(sql).map_err(|_| rusqlite::Error::InvalidQuery)?;
        let mut stmt = std::ptr::null_mut();
        // SAFETY: `handle` is the open connection `conn` borrows for `'c`; `sql` is a valid C
        // string; the statement is finalized in `Drop` (or here, when binding fails).
        unsafe {
            let db = conn.handle();
            let rc = ffi::sqlite3_prepare_v2(db, sql.as_ptr(), -1, &mut stmt, std::ptr::null_mut());
            let stmt = NonNull::new(stmt).ok_or_else(|| failure(conn, rc))?;
            let rows = RangeRows {
                columns: ffi::sqlite3_column_count(stmt.as_ptr()).max(0) as usize,
                stmt,
                conn,
            };
            for (i, v) in [(1, lo), (2, hi)] {
                let rc = ffi::sqlite3_bind_int64(stmt.as_ptr(), i, v);
                if rc != ffi::SQLITE_OK {
                    return Err(failure(conn, rc));
                }
            }
            Ok(rows)
        }
    }

    /// Moves to the next row; false at the end.
    fn step(&mut self) -> rusqlite::Result<bool> {
        // SAFETY: the statement is prepared and not finalized.
        match unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(failure(self.conn, rc)),
        }
    }

    /// SQLite's type code of column `i` of the current row.
    fn column_type(&self, i: usize) -> i32 {
        assert!(i < self.columns, "column {i} of {}", self.columns);
        // SAFETY: `i` is a column of the statement, which is on a row.
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), i as i32) }
    }

    /// Integer column `i`: `Ok(None)` for NULL, `Err(type name)` for text or a blob (see the
    /// type's comment for what reads as a number anyway).
    fn int(&self, i: usize) -> Result<Option<i64>, &'static str> {
        assert!(i < self.columns, "column {i} of {}", self.columns);
        // SAFETY: `i` is a column of the statement, which is on a row.
        let v = unsafe { ffi::sqlite3_column_int64(self.stmt.as_ptr(), i as i32) };
        if v != 0 {
            return Ok(Some(v));
        }
        match self.column_type(i) {
            ffi::SQLITE_INTEGER => Ok(Some(0)),
            ffi::SQLITE_NULL => Ok(None),
            ffi::SQLITE_FLOAT => Err("a real number"),
            ffi::SQLITE_TEXT => Err("text"),
            _ => Err("a blob"),
        }
    }

    /// Column `i` as text (numbers as their decimal text); `None` for NULL.
    fn text(&self, i: usize) -> Option<String> {
        if self.column_type(i) == ffi::SQLITE_NULL {
            return None;
        }
        // SAFETY: as in `column_type`; the text (converted by SQLite if need be) stays valid
        // until the next step, and is copied before that.
        unsafe {
            let p = ffi::sqlite3_column_text(self.stmt.as_ptr(), i as i32);
            let n = ffi::sqlite3_column_bytes(self.stmt.as_ptr(), i as i32).max(0) as usize;
            if p.is_null() {
                return Some(String::new());
            }
            let bytes = std::slice::from_raw_parts(p, n);
            Some(String::from_utf8_lossy(bytes).into_owned())
        }
    }
}

impl Drop for RangeRows<'_> {
    fn drop(&mut self) {
        // SAFETY: finalized once, here.
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// The connection's error for result code `rc`, as rusqlite reports it.
fn failure(conn: &Connection, rc: i32) -> rusqlite::Error {
    // SAFETY: `handle` is the open connection; the message is copied at once.
    let message = unsafe {
        let m = ffi::sqlite3_errmsg(conn.handle());
        (!m.is_null()).then(|| std::ffi::CStr::from_ptr(m).to_string_lossy().into_owned())
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message)
}

/// Reads rows `[lo, hi)` of one table.
fn read_range(ctx: &Context, task: &Task) -> Result<Part, TraceError> {
    match (&ctx.pages, &task.plan) {
        (Some(pages), Some(plan)) => {
            let mut rows = PageRows(pages.scan(plan, task.lo, task.hi));
            read_rows(ctx, task, &mut rows)
        }
        _ => ctx.connections.with(|conn| {
            let mut rows =
                RangeRows::new(conn, &task.sql, task.lo, task.hi).map_err(sql_error(task.table))?;
            read_rows(ctx, task, &mut rows)
        }),
    }
}

/// Rows of a rowid range: column 0 is the rowid, then the task's selected columns.
trait Rows {
    /// Moves to the next row; false at the end.
    fn step(&mut self) -> Result<bool, String>;
    /// Integer column `i`: `Ok(None)` for NULL, `Err(type name)` for another type.
    fn int(&self, i: usize) -> Result<Option<i64>, &'static str>;
    /// Column `i` as text (numbers as their decimal text); `None` for NULL.
    fn text(&self, i: usize) -> Option<String>;
}

impl Rows for RangeRows<'_> {
    fn step(&mut self) -> Result<bool, String> {
        RangeRows::step(self).map_err(|e| e.to_string())
    }
    fn int(&self, i: usize) -> Result<Option<i64>, &'static str> {
        RangeRows::int(self, i)
    }
    fn text(&self, i: usize) -> Option<String> {
        RangeRows::text(self, i)
    }
}

/// Rows read from the table's pages. Unlike SQLite, a real number in an integer column is an
/// error rather than truncated (nsys writes none).
struct PageRows<'p>(sqlite_pages::Scan<'p>);

impl Rows for PageRows<'_> {
    fn step(&mut self) -> Result<bool, String> {
        self.0.step().map_err(|e| e.to_string())
    }
    fn int(&self, i: usize) -> Result<Option<i64>, &'static str> {
        self.0.int(i)
    }
    fn text(&self, i: usize) -> Option<String> {
        match self.0.value(i) {
            Value::Null => None,
            Value::Int(v) => Some(v.to_string()),
            Value::Real(v) => Some(v.to_string()),
            Value::Text(b) | Value::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
        }
    }
}

/// Reads a task's rows from `rows` into a part.
fn read_rows<R: Rows>(ctx: &Context, task: &Task, rows: &mut R) -> Result<Part, TraceError> {
    let (source, table, lo, hi) = (task.source, task.table, task.lo, task.hi);
    let mut part = Part::default();
    let mut cols = EventColumns::with_capacity((hi - lo).clamp(0, BATCH_ROWS) as usize);
    let mut args = String::new();
    // The kernels of one name mostly share their short name, context and shared memory: their
    // `args` text (unfinished, as `finish_args` takes it) is built once per combination.
    let mut kernel_args: HashMap<[Option<i64>; 6], String, ahash::RandomState> = HashMap::default();
    // NVTX range texts repeat: whether one names an operator, and its step number, are worked
    // out (a regex match) once per distinct text.
    let mut range_texts: HashMap<String, (bool, Option<i64>), ahash::RandomState> =
        HashMap::default();
    let int = |r: &R, i: usize| -> Result<Option<i64>, TraceError> {
        r.int(i).map_err(|found| {
            let row = r.int(0).ok().flatten().unwrap_or(-1);
            TraceError::at_row(
                table,
                row,
                format!("column {i}: expected an integer, found {found}"),
            )
        })
    };
    while rows
        .step()
        .map_err(|e| TraceError::whole(format!("{table}: {e}")))?
    {
        let r = &*rows;
        let rowid = int(r, 0)?.unwrap_or(-1);
        let bad = |m: &str| TraceError::at_row(table, rowid, m.to_string());
        let start = int(r, 1)?.ok_or_else(|| bad("start is NULL"))?;
        // `end - start` must not wrap: a duration past the 64-bit range is a damaged row.
        let dur_to = |end: i64| {
            end.checked_sub(start)
                .ok_or_else(|| bad("end - start does not fit in 64-bit nanoseconds"))
        };
        match source {
            NsysTable::Kernel | NsysTable::Memcpy | NsysTable::Memset | NsysTable::Sync => {
                let end = int(r, 2)?.ok_or_else(|| bad("end is NULL"))?;
                let device = int(r, 3)?.map(|d| d as i32);
                let stream = int(r, 4)?;
                let pid = int(r, 5)?.map(pid_of);
                let correlation = int(r, 6)?;
                let dur = dur_to(end)?;
                if dur < 0 {
                    *part
                        .warnings
                        .entry("negative durations (end before start; kept as-is)".into())
                        .or_default() += 1;
                }
                let mut e = Event {
                    device,
                    stream,
                    pid,
                    ts: start,
                    dur,
                    correlation,
                    ..Default::default()
                };
                args.clear();
                let kind;
                let name_owned;
                let name_id: u64;
                match source {
                    NsysTable::Kernel => {
                        kind = Kind::Kernel;
                        part.kernels += 1;
                        let demangled = int(r, 7)?;
                        let short = int(r, 8)?;
                        let id = demangled.or(short).ok_or_else(|| bad("no kernel name"))?;
                        e.name = ctx.strings.get(id).unwrap_or("<unknown kernel>");
                        name_id = name_key(NameSpace::StringId, id);
                        e.registers = int(r, 10)?.map(|v| v as i32);
                        for k in 0..3 {
                            e.grid[k] = int(r, 11 + k)?.map(|v| v as i32);
                            e.block[k] = int(r, 14 + k)?.map(|v| v as i32);
                        }
                        let (s, d) = (int(r, 17)?, int(r, 18)?);
                        e.shared_mem = match (s, d) {
                            (None, None) => None,
                            (s, d) => Some(s.unwrap_or(0) + d.unwrap_or(0)),
                        };
                        let key = [short, int(r, 9)?, s, d, int(r, 19)?, int(r, 20)?];
                        if let Some(text) = kernel_args.get(&key) {
                            args.push_str(text);
                        } else {
                            let [_, context, _, _, graph_node, green_context] = key;
                            args.push('{');
                            if let Some(short) = short.and_then(|id| ctx.strings.get(id)) {
                                args.push_str("\"short_name\":");
                                push_json_str(&mut args, short);
                                args.push(',');
                            }
                            push_int_field(&mut args, "context", context);
                            push_int_field(&mut args, "static_shared_mem", s);
                            push_int_field(&mut args, "dynamic_shared_mem", d);
                            push_int_field(&mut args, "graph_node", graph_node);
                            push_int_field(&mut args, "green_context", green_context);
                            if kernel_args.len() < KERNEL_ARGS_CACHED {
                                kernel_args.insert(key, args.clone());
                            }
                        }
                    }
                    NsysTable::Memcpy => {
                        kind = Kind::Memcpy;
                        e.bytes = int(r, 7)?;
                        let copy = int(r, 8)?.unwrap_or(0);
                        e.copy_kind = Some(copy_code(copy));
                        let label = ctx
                            .memcpy_oper
                            .get(&copy)
                            .map(|s| s.as_str())
                            .unwrap_or("Unknown");
                        name_owned = format!("[CUDA memcpy {label}]");
                        e.name = &name_owned;
                        name_id = name_key(NameSpace::CopyKind, copy);
                        args.push('{');
                        for (key, col) in [("src_kind", 9), ("dst_kind", 10)] {
                            if let Some(l) = int(r, col)?.and_then(|k| ctx.mem_kind.get(&k)) {
                                let _ = write!(args, "\"{key}\":");
                                push_json_str(&mut args, l);
                                args.push(',');
                            }
                        }
                        push_int_field(&mut args, "context", int(r, 11)?);
                        push_int_field(&mut args, "src_device", int(r, 12)?);
                        push_int_field(&mut args, "dst_device", int(r, 13)?);
                    }
                    NsysTable::Memset => {
                        kind = Kind::Memset;
                        e.bytes = int(r, 7)?;
                        e.name = "[CUDA memset]";
                        name_id = name_key(NameSpace::Fixed, 0);
                        args.push('{');
                        if let Some(l) = int(r, 8)?.and_then(|k| ctx.mem_kind.get(&k)) {
                            args.push_str("\"mem_kind\":");
                            push_json_str(&mut args, l);
                            args.push(',');
                        }
                        push_int_field(&mut args, "context", int(r, 9)?);
                        push_int_field(&mut args, "value", int(r, 10)?);
                    }
                    _ => {
                        kind = Kind::Sync;
                        let sync_type = int(r, 7)?;
                        e.name = sync_name(sync_type);
                        name_id = name_key(NameSpace::SyncType, sync_type.unwrap_or(-1));
                        args.push('{');
                        push_int_field(&mut args, "context", int(r, 8)?);
                    }
                }
                finish_args(&mut args);
                e.args = (!args.is_empty()).then_some(args.as_str());
                cols.push_with_name_id(kind, &e, name_id);
            }
            NsysTable::Runtime => {
                let end = int(r, 2)?.ok_or_else(|| bad("end is NULL"))?;
                let name_id = int(r, 3)?.ok_or_else(|| bad("nameId is NULL"))?;
                let raw = ctx.strings.get(name_id).unwrap_or("<unknown API>");
                let kind = match int(r, 4)? {
                    Some(1) => Kind::Driver,
                    _ => Kind::Runtime,
                };
                let global = int(r, 5)?;
                let (pid, tid) = (global.map(pid_of), global.map(tid_of));
                let correlation = int(r, 6)?;
                let name = api_display_name(raw);
                args.clear();
                args.push('{');
                if name.len() != raw.len() {
                    args.push_str("\"api\":");
                    push_json_str(&mut args, raw);
                    args.push(',');
                }
                if let Some(v) = int(r, 7)?.filter(|&v| v != 0) {
                    push_int_field(&mut args, "return", Some(v));
                }
                finish_args(&mut args);
                cols.push_with_name_id(
                    kind,
                    &Event {
                        pid,
                        tid,
                        name,
                        ts: start,
                        dur: dur_to(end)?,
                        correlation,
                        args: (!args.is_empty()).then_some(args.as_str()),
                        ..Default::default()
                    },
                    name_key(NameSpace::ApiName, name_id),
                );
                part.host.extend_host_span(start, end);
            }
            NsysTable::Nvtx => {
                let event_type = int(r, 2)?.unwrap_or(-1);
                let is_range = matches!(event_type, 59 | 60 | 70 | 71);
                if !is_range && event_type != 34 {
                    continue; // domain/category/thread naming rows
                }
                let end = int(r, 3)?;
                let (text_value, text_id) = match r.text(4) {
                    Some(t) => (Some(t), None),
                    None => {
                        let id = int(r, 5)?;
                        let t = id.and_then(|id| ctx.strings.get(id)).map(str::to_string);
                        (t, id)
                    }
                };
                let name = text_value.as_deref().unwrap_or("");
                if let Some(why) = crate::columns::oversized(name.len(), 0) {
                    return Err(bad(&why));
                }
                let global = int(r, 6)?;
                let (pid, tid) = (global.map(pid_of), global.map(tid_of));
                args.clear();
                args.push('{');
                if let (Some(p), Some(d)) = (pid, int(r, 7)?) {
                    if let Some(domain) = ctx.domains()?.get(&(p, d)) {
                        args.push_str("\"domain\":");
                        push_json_str(&mut args, domain);
                        args.push(',');
                    }
                }
                push_int_field(&mut args, "category", int(r, 8)?);
                finish_args(&mut args);
                let (kind, dur) = match (is_range, end) {
                    (false, _) => (Kind::Instant, 0),
                    (true, Some(end)) => {
                        let known = range_texts.get(name).copied();
                        let (operator, step) = known.unwrap_or_else(|| {
                            // Most ranges are not steps: the match test alone allocates nothing.
                            let step = crate::attribute::step_of(&ctx.step_pattern, name);
                            (operator_name(name).is_some(), step)
                        });
                        if known.is_none() && range_texts.len() < RANGE_TEXTS_CACHED {
                            range_texts.insert(name.to_string(), (operator, step));
                        }
                        if let Some(step) = step {
                            part.host.steps.push(Step {
                                process: pid.unwrap_or(0),
                                start,
                                end,
                                number: step,
                            });
                        }
                        part.host.extend_host_span(start, end);
                        let kind = if operator {
                            Kind::CpuOp
                        } else {
                            Kind::Annotation
                        };
                        (kind, dur_to(end)?)
                    }
                    (true, None) => {
                        *part
                            .warnings
                            .entry("NVTX ranges without an end (stored with dur 0)".into())
                            .or_default() += 1;
                        (Kind::Annotation, 0)
                    }
                };
                let event = Event {
                    pid,
                    tid,
                    name,
                    ts: start,
                    dur,
                    args: (!args.is_empty()).then_some(args.as_str()),
                    ..Default::default()
                };
                match text_id.filter(|_| text_value.is_some()) {
                    Some(id) => {
                        cols.push_with_name_id(kind, &event, name_key(NameSpace::StringId, id))
                    }
                    None => cols.push(kind, &event),
                }
            }
            NsysTable::Overhead => {
                let end = int(r, 2)?.ok_or_else(|| bad("end is NULL"))?;
                let global = int(r, 3)?;
                let name = int(r, 4)?
                    .and_then(|id| ctx.strings.get(id))
                    .unwrap_or("profiler overhead");
                cols.push(
                    Kind::Overhead,
                    &Event {
                        pid: global.map(pid_of),
                        tid: global.map(tid_of),
                        name,
                        ts: start,
                        dur: dur_to(end)?,
                        ..Default::default()
                    },
                );
            }
        }
        part.events += 1;
    }
    if !cols.is_empty() {
        part.batches.push(cols.finish());
    }
    Ok(part)
}

/// `s` as a JSON string. Names rarely need escaping: those are copied as they are, the others
/// go through serde_json's escaping.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
    }
}

fn push_int_field(out: &mut String, key: &str, v: Option<i64>) {
    if let Some(v) = v {
        out.push('"');
        out.push_str(key);
        out.push_str("\":");
        out.push_str(itoa::Buffer::new().format(v));
        out.push(',');
    }
}

/// Closes an args object started with `{`; an empty object becomes the empty string.
fn finish_args(args: &mut String) {
    if args == "{" {
        args.clear();
    } else if args.ends_with(',') {
        args.pop();
        args.push('}');
    } else {
        args.push('}');
    }
}

/// One rowid range of one table: a reading task.
struct Task {
    source: NsysTable,
    sql: String,
    /// How to read the range from the table's pages, when [`Context::pages`] is open.
    plan: Option<Arc<TablePlan>>,
    table: &'static str,
    lo: i64,
    hi: i64,
}

impl Task {
    fn rows(&self) -> i64 {
        self.hi - self.lo
    }
}

/// What reading some of an export's tables found besides its batches.
#[derive(Debug, Default)]
pub struct Counts {
    pub events: u64,
    pub kernels: u64,
    pub warnings: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, part: &Part) {
        self.events += part.events;
        self.kernels += part.kernels;
        for (k, v) in &part.warnings {
            *self.warnings.entry(k.clone()).or_default() += v;
        }
    }

    /// Adds these counts to `trace`'s.
    pub fn add_to(self, trace: &mut ParsedTrace) {
        trace.events += self.events;
        trace.kernels += self.kernels;
        for (k, v) in self.warnings {
            *trace.warnings.entry(k).or_default() += v;
        }
    }
}

/// The GPU activity tables of an export (kernels, copies, memsets, syncs), left for after
/// [`Export::read_host`]: once the launches and NVTX ranges are known, their rows can be attributed
/// and written as they are read instead of waiting in the spool.
pub struct GpuTables {
    ctx: Context,
    tasks: Vec<Task>,
    /// Rows of all tables, and rows read so far (for progress).
    total: i64,
    done: AtomicU64,
}

impl GpuTables {
    /// Reads the GPU tables on all cores, handing every batch to `each` on the reading thread.
    /// `each` returning `Err(())` stops the reading: `Err(None)` then (the caller knows why);
    /// a read error is `Err(Some(..))`.
    pub fn read(
        self,
        progress: &(dyn Fn(f64) + Sync),
        each: &(dyn Fn(RecordBatch) -> Result<(), ()> + Sync),
    ) -> Result<Counts, Option<TraceError>> {
        use rayon::prelude::*;
        let counts = Mutex::new(Counts::default());
        self.tasks.par_iter().try_for_each(|t| {
            let part = read_range(&self.ctx, t).map_err(Some)?;
            let done = self.done.fetch_add(t.rows() as u64, Ordering::Relaxed) + t.rows() as u64;
            progress(done as f64 / self.total.max(1) as f64);
            counts.lock().unwrap_or_else(|e| e.into_inner()).add(&part);
            part.batches
                .into_iter()
                .try_for_each(each)
                .map_err(|()| None)
        })?;
        Ok(counts.into_inner().unwrap_or_else(|e| e.into_inner()))
    }
}

/// An opened Nsight Systems export, its tables cut into reading tasks.
pub struct Export {
    ctx: Context,
    trace: ParsedTrace,
    host_tasks: Vec<Task>,
    gpu_tasks: Vec<Task>,
    /// The host tables and their rowids (from, to exclusive).
    host_tables: Vec<(&'static str, i64, i64)>,
}

impl Export {
    /// Opens an export and reads its metadata; fails on anything that is not one.
    pub fn open(path: &Path, opts: &NsysOptions) -> Result<Export, TraceError> {
        let conn = open(path)?;
        let is_nsys = columns_of(&conn, "StringIds")?.is_some()
            && (columns_of(&conn, "META_DATA_EXPORT")?.is_some()
                || columns_of(&conn, "CUPTI_ACTIVITY_KIND_RUNTIME")?.is_some()
                || columns_of(&conn, "NVTX_EVENTS")?.is_some());
        if !is_nsys {
            return Err(TraceError::whole(
                "a SQLite database, but not an Nsight Systems export (no StringIds / META_DATA_EXPORT / CUPTI tables)",
            ));
        }
        let ctx = Context {
            connections: Connections::new(path),
            strings: Strings::load(&conn)?,
            memcpy_oper: enum_labels(&conn, "ENUM_CUDA_MEMCPY_OPER", MEMCPY_OPER)?,
            mem_kind: enum_labels(&conn, "ENUM_CUDA_MEM_KIND", MEM_KIND)?,
            domains: std::sync::OnceLock::new(),
            step_pattern: opts.step_pattern.clone(),
            // Unreadable here means unreadable for SQLite too, which then says why.
            pages: match opts.read_pages {
                true => PageFile::open(path).ok().flatten(),
                false => None,
            },
        };
        let trace = ParsedTrace {
            epoch_time: false,
            top_level: metadata(&conn)?,
            ..Default::default()
        };
        // Cut every table into rowid ranges, to be read on all cores.
        let mut host_tasks: Vec<Task> = Vec::new();
        let mut gpu_tasks: Vec<Task> = Vec::new();
        let mut host_tables = Vec::new();
        for source in [
            NsysTable::Runtime,
            NsysTable::Nvtx,
            NsysTable::Overhead,
            NsysTable::Kernel,
            NsysTable::Memcpy,
            NsysTable::Memset,
            NsysTable::Sync,
        ] {
            let Some(select) = source.select(&conn)? else {
                continue;
            };
            let Some((lo, hi)) = select.rowid_range(&conn)? else {
                continue;
            };
            let sql = select.sql();
            let plan = match ctx.pages {
                Some(_) => select.page_plan(&conn)?.map(Arc::new),
                None => None,
            };
            let tasks = match source {
                NsysTable::Runtime | NsysTable::Nvtx | NsysTable::Overhead => {
                    host_tables.push((select.table, lo, hi.saturating_add(1)));
                    &mut host_tasks
                }
                NsysTable::Kernel | NsysTable::Memcpy | NsysTable::Memset | NsysTable::Sync => {
                    &mut gpu_tasks
                }
            };
            let mut a = lo;
            while a <= hi {
                let b = a.saturating_add(BATCH_ROWS).min(hi.saturating_add(1));
                tasks.push(Task {
                    source,
                    sql: sql.clone(),
                    plan: plan.clone(),
                    table: select.table,
                    lo: a,
                    hi: b,
                });
                a = b;
            }
        }
        ctx.connections.put(conn);
        Ok(Export {
            ctx,
            trace,
            host_tasks,
            gpu_tasks,
            host_tables,
        })
    }

    /// Windows that split the host rows (runtime calls, NVTX, overhead) into parts of about
    /// `rows` rows, for [`crate::spool::Spool::set_windows`]: each process's rows in time
    /// windows of their own, so that a window holds one process; processes with few rows
    /// join the window before them. None when the rows are fewer than `rows`. Where rows
    /// are is estimated from their process and start at evenly spaced rowids of each table
    /// (a few thousand row lookups).
    pub fn windows(&self, rows: usize) -> Result<Vec<(i64, i64)>, TraceError> {
        let total: i64 = self.host_tasks.iter().map(Task::rows).sum();
        if total as f64 <= rows.max(1) as f64 {
            return Ok(Vec::new());
        }
        self.ctx
            .connections
            .with(|conn| self.sample_windows(conn, rows))
    }

    /// [`Self::windows`] through `conn`.
    fn sample_windows(
        &self,
        conn: &Connection,
        rows: usize,
    ) -> Result<Vec<(i64, i64)>, TraceError> {
        const SAMPLES: i64 = 4096;
        // By process (`i64::MIN`: none): sampled starts, each standing for the rows of its
        // table up to the next sample.
        let mut samples: BTreeMap<i64, Vec<(i64, f64)>> = BTreeMap::new();
        for &(table, lo, hi) in &self.host_tables {
            let has_thread =
                columns_of(conn, table)?.is_some_and(|cols| cols.iter().any(|c| c == "globalTid"));
            let thread = if has_thread { "globalTid" } else { "NULL" };
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT start, {thread} FROM {table} WHERE rowid = ?1"
                ))
                .map_err(sql_error(table))?;
            let stride = ((hi - lo) / SAMPLES).max(1);
            let mut rowid = lo;
            while rowid < hi {
                let sample = stmt
                    .query_row([rowid], |r| {
                        Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<i64>>(1)?))
                    })
                    .map(Some)
                    .or_else(|e| match e {
                        rusqlite::Error::QueryReturnedNoRows => Ok(None),
                        e => Err(e),
                    })
                    .map_err(sql_error(table))?;
                if let Some((Some(start), thread)) = sample {
                    let process = thread.map_or(i64::MIN, pid_of);
                    let weight = stride.min(hi - rowid) as f64;
                    samples.entry(process).or_default().push((start, weight));
                }
                rowid += stride;
            }
        }
        Ok(crate::attribute::windows::window_starts(samples, rows))
    }

    /// Reads the host tables (runtime API calls, NVTX ranges, profiler overhead), handing
    /// their batches to `sink`; returns the trace with its steps, and the GPU tables still to
    /// read ([`GpuTables::read`]). `progress` gets the fraction of all rows read (0..=1).
    /// The launches and ranges that attribution needs come from the host rows themselves
    /// ([`RANGES`]).
    pub fn read_host(
        self,
        progress: &(dyn Fn(f64) + Sync),
        sink: &mut crate::formats::EventSink<'_>,
    ) -> Result<(ParsedTrace, GpuTables), TraceError> {
        let Export {
            ctx,
            mut trace,
            host_tasks,
            gpu_tasks,
            ..
        } = self;
        let total: i64 = host_tasks.iter().chain(&gpu_tasks).map(Task::rows).sum();
        let done = AtomicU64::new(0);
        let (tx, rx) =
            mpsc::sync_channel::<Result<Part, TraceError>>(2 * rayon::current_num_threads());
        let mut outcome: Result<(), TraceError> = Ok(());
        let mut counts = Counts::default();
        std::thread::scope(|scope| {
            let ctx = &ctx;
            let done = &done;
            let tasks = &host_tasks;
            scope.spawn(move || {
                use rayon::prelude::*;
                // Keep task order so batches arrive roughly sorted; the channel bounds memory.
                let _ = tasks.par_iter().try_for_each_with(tx, |tx, t| {
                    let part = read_range(ctx, t);
                    let failed = part.is_err();
                    let n = done.fetch_add(t.rows() as u64, Ordering::Relaxed) + t.rows() as u64;
                    progress(n as f64 / total.max(1) as f64);
                    if tx.send(part).is_err() || failed {
                        return Err(());
                    }
                    Ok(())
                });
            });
            for part in rx.iter() {
                if outcome.is_err() {
                    continue;
                }
                match part {
                    Ok(p) => {
                        counts.add(&p);
                        trace.host.absorb(p.host);
                        for b in p.batches {
                            if let Err(e) = sink(b) {
                                outcome = Err(TraceError::whole(format!(
                                    "cannot keep the parsed events: {e}"
                                )));
                                break;
                            }
                        }
                    }
                    Err(e) => outcome = Err(e),
                }
            }
        });
        outcome?;
        counts.add_to(&mut trace);
        trace.host.correlation_per_process = true;
        crate::attribute::number_occurrences(&mut trace.host.steps);
        let gpu = GpuTables {
            ctx,
            tasks: gpu_tasks,
            total,
            done,
        };
        Ok((trace, gpu))
    }
}

/// How ranges are read from the host rows of [`Export::read_host`]: NVTX ranges that last are
/// operators (`cpu_op`, named by their operator, `aten::mm` of `aten::mm, seq = 3`) or
/// annotations; ranges of no length contain no time and are left out.
pub const RANGES: RangeRules = RangeRules {
    min_dur: 1,
    needs_thread: false,
    name: range_name,
    step_pattern: None,
};

/// NVTX ranges are annotations whatever the step pattern.
fn range_name<'a>(kind: Kind, text: &'a str, _: Option<&Regex>) -> (&'a str, bool) {
    match kind {
        Kind::CpuOp => (operator_name(text).unwrap_or(text), false),
        _ => (text, kind == Kind::Annotation),
    }
}

/// `(pid, domainId) -> name` from the NvtxDomainCreate (type 75) rows.
fn domains(conn: &Connection) -> Result<Domains, TraceError> {
    let mut map = Domains::default();
    let Some(cols) = columns_of(conn, "NVTX_EVENTS")? else {
        return Ok(map);
    };
    if !["domainId", "text", "globalTid"]
        .iter()
        .all(|c| cols.iter().any(|h| h == c))
    {
        return Ok(map);
    }
    let mut stmt = conn
        .prepare("SELECT globalTid, domainId, text FROM NVTX_EVENTS WHERE eventType = 75")
        .map_err(sql_error("NVTX_EVENTS"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Option<i64>>(0)?,
                r.get::<_, Option<i64>>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .map_err(sql_error("NVTX_EVENTS"))?;
    for row in rows {
        if let (Some(g), Some(d), Some(t)) = row.map_err(sql_error("NVTX_EVENTS"))? {
            map.insert((pid_of(g), d), t);
        }
    }
    Ok(map)
}

/// Run metadata: export and capture metadata, session start, processes, GPUs (as
/// `deviceProperties`, which the driver reads for device names).
fn metadata(conn: &Connection) -> Result<serde_json::Map<String, serde_json::Value>, TraceError> {
    use serde_json::{json, Map, Value};
    let mut top = Map::new();
    let name_value = |table: &str| -> Result<Option<Value>, TraceError> {
        if columns_of(conn, table)?.is_none() {
            return Ok(None);
        }
        let mut stmt = conn
            .prepare(&format!("SELECT name, value FROM \"{table}\""))
            .map_err(sql_error(table))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
            })
            .map_err(sql_error(table))?;
        let mut m = Map::new();
        for row in rows {
            let (k, v) = row.map_err(sql_error(table))?;
            m.insert(k, v.map(Value::String).unwrap_or(Value::Null));
        }
        Ok(Some(Value::Object(m)))
    };
    let mut nsys = Map::new();
    if let Some(v) = name_value("META_DATA_EXPORT")? {
        nsys.insert("export".into(), v);
    }
    if let Some(v) = name_value("META_DATA_CAPTURE")? {
        nsys.insert("capture".into(), v);
    }
    if columns_of(conn, "TARGET_INFO_SESSION_START_TIME")?.is_some() {
        let start = conn
            .query_row(
                "SELECT utcEpochNs, utcTime FROM TARGET_INFO_SESSION_START_TIME",
                [],
                |r| Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<String>>(1)?)),
            )
            .ok();
        if let Some((ns, text)) = start {
            nsys.insert("session_start_utc_ns".into(), json!(ns));
            nsys.insert("session_start_utc".into(), json!(text));
        }
    }
    if columns_of(conn, "PROCESSES")?.is_some() {
        let mut stmt = conn
            .prepare("SELECT pid, name FROM PROCESSES ORDER BY pid")
            .map_err(sql_error("PROCESSES"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<String>>(1)?))
            })
            .map_err(sql_error("PROCESSES"))?;
        let mut list = Vec::new();
        for row in rows {
            let (pid, name) = row.map_err(sql_error("PROCESSES"))?;
            list.push(json!({"pid": pid, "name": name}));
        }
        nsys.insert("processes".into(), Value::Array(list));
    }
    if let Some(cols) = columns_of(conn, "TARGET_INFO_GPU")? {
        let want = [
            "id",
            "name",
            "totalMemory",
            "smCount",
            "computeMajor",
            "computeMinor",
            "busLocation",
            "uuid",
        ];
        let present: Vec<&str> = want
            .iter()
            .copied()
            .filter(|c| cols.iter().any(|h| h == c))
            .collect();
        if present.contains(&"id") {
            let sql = format!(
                "SELECT {} FROM TARGET_INFO_GPU",
                present
                    .iter()
                    .map(|c| format!("\"{c}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let mut stmt = conn.prepare(&sql).map_err(sql_error("TARGET_INFO_GPU"))?;
            let mut rows = stmt.query([]).map_err(sql_error("TARGET_INFO_GPU"))?;
            let mut gpus = Vec::new();
            while let Some(r) = rows.next().map_err(sql_error("TARGET_INFO_GPU"))? {
                let mut g = Map::new();
                for (i, c) in present.iter().enumerate() {
                    let v: Value = match r.get_ref(i).map_err(sql_error("TARGET_INFO_GPU"))? {
                        rusqlite::types::ValueRef::Integer(n) => json!(n),
                        rusqlite::types::ValueRef::Text(t) => json!(String::from_utf8_lossy(t)),
                        rusqlite::types::ValueRef::Real(f) => json!(f),
                        _ => Value::Null,
                    };
                    g.insert((*c).to_string(), v);
                }
                gpus.push(Value::Object(g));
            }
            top.insert("deviceProperties".into(), Value::Array(gpus));
        }
    }
    top.insert("nsys".into(), Value::Object(nsys));
    Ok(top)
}

#[cfg(test)]
mod tests;
