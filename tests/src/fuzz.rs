//! Fuzz target bodies: for each parser of untrusted input, one function that takes arbitrary
//! bytes, runs the parser on them and panics where the parser breaks what it promises of bad
//! input (it panics itself, or its error does not say where the input is bad). The cargo-fuzz
//! targets in `fuzz/` and the stable short run (`tests/tests/fuzz_short.rs`) call these same
//! bodies; [`seeds`] makes the seed corpus both start from.

use gpuq_engine::schema::TableKind;
use gpuq_engine::Store;
use gpuq_ingest::fuzzing::sqlite_pages::{ColumnSource, PageFile, TablePlan, Value};
use gpuq_ingest::fuzzing::{Position, TraceError};
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// The fuzzed parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// The JSON bracket scanner Kineto cuts its event stream with (`json::find_value_end`,
    /// `json::object_extent`), checked against serde_json.
    JsonScan,
    /// The whole Kineto/Chrome-trace adapter (`kineto::parse`).
    Kineto,
    /// The SQLite B-tree page reader of the Nsight Systems adapter (`sqlite_pages`).
    SqlitePages,
    /// The rocprofv3 CSV reader (`rocprof::parse`), several files per input.
    Rocprof,
    /// The stage-log grammars (`stagelog::parse`, strict and lenient).
    StageLog,
    /// The duration grammar of `--min-dur`-style arguments and SQL (`parse_dur`) and the
    /// `--steps` range grammar (`StepRange::parse`).
    Duration,
    /// The store's manifest reader (`Store::manifest`).
    Manifest,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::JsonScan,
        Target::Kineto,
        Target::SqlitePages,
        Target::Rocprof,
        Target::StageLog,
        Target::Duration,
        Target::Manifest,
    ];

    /// The cargo-fuzz target's name.
    pub fn name(self) -> &'static str {
        match self {
            Target::JsonScan => "json_scan",
            Target::Kineto => "kineto",
            Target::SqlitePages => "sqlite_pages",
            Target::Rocprof => "rocprof",
            Target::StageLog => "stagelog",
            Target::Duration => "duration",
            Target::Manifest => "manifest",
        }
    }

    pub fn of_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Runs the target's body on `data`: panics on a broken promise.
    pub fn run(self, data: &[u8]) {
        match self {
            Target::JsonScan => json_scan(data),
            Target::Kineto => kineto(data),
            Target::SqlitePages => sqlite_pages(data),
            Target::Rocprof => rocprof(data),
            Target::StageLog => stagelog(data),
            Target::Duration => duration(data),
            Target::Manifest => manifest(data),
        }
    }
}

/// A byte-positioned error must point inside the input (or just past it, for "ends early").
fn assert_byte_position(e: &TraceError, len: usize, what: &str) {
    match e.at {
        Position::Byte { offset, .. } => assert!(
            offset <= len as u64,
            "{what}: error at byte {offset} of a {len}-byte input: {e}"
        ),
        _ => panic!("{what}: error without a byte offset: {e}"),
    }
}

/// Lines of `data` (a last line without `\n` counts).
fn line_count(data: &[u8]) -> u64 {
    let n = data.iter().filter(|&&c| c == b'\n').count() as u64;
    n + u64::from(!data.is_empty() && !data.ends_with(b"\n"))
}

pub fn json_scan(data: &[u8]) {
    use gpuq_ingest::fuzzing::json::{find_value_end, object_extent};
    let start = data
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(data.len());
    let end = find_value_end(data, start);
    if let Some(end) = end {
        assert!(
            end > start && end <= data.len(),
            "value end {end} outside the input"
        );
        let close = data[end - 1];
        assert!(
            matches!((data[start], close), (b'{', b'}') | (b'[', b']')),
            "value from byte {start} ends at {end} on {:?}",
            close as char
        );
    }
    // Where serde_json reads the input as one object or array, the scanner must find the same
    // end: the event stream is cut where it says.
    if matches!(data.get(start), Some(b'{' | b'['))
        && serde_json::from_slice::<serde_json::Value>(data).is_ok()
    {
        let trimmed = data.len()
            - data
                .iter()
                .rev()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
        assert_eq!(
            end,
            Some(trimmed),
            "scanner and serde_json disagree on the value's end"
        );
    }
    if let Some((end, nested)) = object_extent(data, start) {
        assert_eq!(Some(end), find_value_end(data, start));
        if let Some((a, b)) = nested {
            assert!(
                start < a && a < b && b < end,
                "nested span {a}..{b} outside {start}..{end}"
            );
            assert!(
                matches!((data[a], data[b - 1]), (b'{', b'}') | (b'[', b']')),
                "nested span {a}..{b} is not bracketed"
            );
        }
    }
}

pub fn kineto(data: &[u8]) {
    if let Err(e) = gpuq_ingest::fuzzing::kineto::parse(std::io::Cursor::new(data), &|_| {}) {
        assert_byte_position(&e, data.len(), "kineto");
    }
}

thread_local! {
    /// A scratch directory of this thread's own, for parsers that read files by path.
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// This thread's scratch directory, emptied.
fn scratch() -> PathBuf {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let dir = s.get_or_insert_with(|| {
            // Memory-backed where there is one: the fuzzers write a file per execution.
            let shm = Path::new("/dev/shm");
            let b = tempfile::Builder::new()
                .prefix("gpuq-fuzz-")
                .tempdir_in(if shm.is_dir() {
                    shm.to_path_buf()
                } else {
                    std::env::temp_dir()
                });
            b.or_else(|_| tempfile::tempdir())
                .expect("a scratch directory")
        });
        let path = dir.path().to_path_buf();
        for e in std::fs::read_dir(&path).into_iter().flatten().flatten() {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        path
    })
}

/// Columns read from every table the page reader is pointed at: the rowid, then the first
/// eight record fields, one of them as a REAL column.
fn page_plan(root: u32) -> TablePlan {
    let mut columns = vec![ColumnSource::Rowid(None)];
    for f in 0..8 {
        columns.push(if f == 2 {
            ColumnSource::RealRecord(f)
        } else {
            ColumnSource::Record(f)
        });
    }
    columns.push(ColumnSource::Null);
    TablePlan {
        root,
        field_columns: (1..=8).map(Some).collect(),
        columns,
    }
}

pub fn sqlite_pages(data: &[u8]) {
    let path = scratch().join("export.sqlite");
    std::fs::write(&path, data).expect("write the scratch database");
    let Some(file) = PageFile::open(&path).expect("open the scratch database") else {
        return;
    };
    // Every page may be a table's root; a few are enough to reach any page kind.
    let pages = (data.len() / 512).clamp(1, 16) as u32;
    for root in 1..=pages {
        let plan = page_plan(root);
        for (lo, hi) in [(i64::MIN, i64::MAX), (2, 40)] {
            let mut scan = file.scan(&plan, lo, hi);
            let mut last = None;
            loop {
                match scan.step() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        assert!(e.to_string().contains("page"), "error without a page: {e}");
                        break;
                    }
                }
                let rowid = scan
                    .int(0)
                    .expect("the rowid is an integer")
                    .expect("a rowid");
                assert!(
                    last.is_none_or(|l| rowid > l),
                    "rowids out of order: {last:?} then {rowid}"
                );
                assert!(
                    lo <= rowid && rowid < hi,
                    "rowid {rowid} outside {lo}..{hi}"
                );
                last = Some(rowid);
                for i in 0..plan.columns.len() {
                    match scan.value(i) {
                        Value::Text(t) | Value::Blob(t) => assert!(t.len() <= data.len()),
                        Value::Null | Value::Int(_) | Value::Real(_) => {}
                    }
                    let _ = scan.int(i);
                }
            }
        }
    }
}

/// Splits a rocprof input into files: segments separated by the byte 0xFF (never in UTF-8
/// text), each a file name line then the file's content.
pub fn rocprof_files(data: &[u8]) -> Vec<(String, Vec<u8>)> {
    data.split(|&b| b == 0xff)
        .enumerate()
        .map(|(i, seg)| {
            let (name, content) = match seg.iter().position(|&b| b == b'\n') {
                Some(n) => (&seg[..n], &seg[n + 1..]),
                None => (&b""[..], seg),
            };
            let name: String = name
                .iter()
                .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.'))
                .take(60)
                .map(|&b| b as char)
                .collect();
            // Unique and never hidden: a name is a file of its own.
            (format!("f{i}_{name}"), content.to_vec())
        })
        .collect()
}

/// The inverse of [`rocprof_files`], for seeds.
pub fn rocprof_input(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, (name, content)) in files.iter().enumerate() {
        if i > 0 {
            out.push(0xff);
        }
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(content);
    }
    out
}

pub fn rocprof(data: &[u8]) {
    let dir = scratch();
    let files = rocprof_files(data);
    let mut paths = Vec::new();
    for (name, content) in &files {
        let p = dir.join(name);
        std::fs::write(&p, content).expect("write a scratch CSV");
        paths.push(p);
    }
    match gpuq_ingest::fuzzing::rocprof::parse(&paths, &mut |_| Ok(())) {
        Ok(_) => {}
        Err((path, e)) => {
            let Some(i) = paths.iter().position(|p| *p == path) else {
                panic!("rocprof: error names {path:?}, not one of the input files: {e}")
            };
            match e.at {
                Position::Line(n) => {
                    let lines = line_count(&files[i].1);
                    assert!(
                        n >= 1 && n <= lines + 1,
                        "rocprof: error at line {n} of a {lines}-line file: {e}"
                    );
                }
                Position::Whole => {}
                _ => panic!("rocprof: error without a line: {e}"),
            }
        }
    }
}

pub fn stagelog(data: &[u8]) {
    let lines = line_count(data);
    for lenient in [false, true] {
        match gpuq_ingest::fuzzing::stagelog::parse(data, lenient, &mut |_| Ok(())) {
            Ok(_) => {}
            Err(e) => match e.at {
                Position::Line(n) => assert!(
                    n >= 1 && n <= lines + 1,
                    "stage log: error at line {n} of {lines}: {e}"
                ),
                // Pairing errors at the end ("cannot keep the parsed stages") are the log's.
                Position::Whole => {}
                _ => panic!("stage log: error without a line: {e}"),
            },
        }
    }
    if let Ok(head) = std::str::from_utf8(data) {
        let _ = gpuq_ingest::fuzzing::stagelog::looks_like_stage_log(head);
    }
}

pub fn duration(data: &[u8]) {
    use gpuq_query::analyses::StepRange;
    use gpuq_query::functions::durations::{fmt_dur, parse_dur};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(ns) = parse_dur(text) {
        // Exact integers: the value read back as nanoseconds is the same value.
        assert_eq!(parse_dur(&format!("{ns}ns")), Some(ns), "{text:?}");
        let _ = fmt_dur(ns);
    }
    if let Ok(r) = StepRange::parse(text) {
        if let (Some(a), Some(b)) = (r.first, r.last) {
            assert!(a <= b, "{text:?} parsed as the empty range {a}..{b}");
        }
        assert!(r.first.is_none_or(|a| a >= 0) && r.last.is_none_or(|b| b >= 0));
    }
}

pub fn manifest(data: &[u8]) {
    let root = scratch();
    let dir = root.join("_manifest");
    std::fs::create_dir_all(&dir).expect("scratch manifest directory");
    let name = gpuq_engine::paths::manifest_file_name(7);
    std::fs::write(dir.join(&name), data).expect("write the scratch manifest");
    let store = Store::open(&root).expect("open the scratch store");
    match store.manifest() {
        Ok(m) => {
            for table in TableKind::ALL {
                for (_run, file) in m.files(table) {
                    let _ = store.file_path(&m, &file.path);
                }
            }
        }
        Err(e) => assert!(
            e.to_string().contains(&name),
            "a manifest error that does not name the file: {e}"
        ),
    }
}

/// The seed corpus of `target`: inputs written by gpuq's generators and fixtures, and small
/// slices of the shared traces when `../shared` is present (never stored in the repository).
pub fn seeds(target: Target) -> Vec<Vec<u8>> {
    crate::fuzz_seeds::seeds(target)
}
