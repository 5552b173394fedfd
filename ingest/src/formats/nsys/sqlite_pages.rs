//! Reading rows of an SQLite table straight from its B-tree pages, for the Nsight Systems
//! adapter's large tables.
//!
//! Stepping a `SELECT` through SQLite's virtual machine and fetching each value through the C
//! API cost about a fifth of an export's ingest (`sqlite3VdbeExec`, `OP_Column`, API entry
//! and exit for every value). A rowid-range scan of a rowid table needs none of that: the
//! table's B-tree is walked in rowid order and each row's record is decoded once
//! ([file format](https://www.sqlite.org/fileformat2.html), sections 1.6 and 2.1).
//!
//! Only what a read-only scan of a finished export needs is supported. [`PageFile::open`]
//! returns `None` for anything else (a database in WAL mode or with a journal next to it,
//! text not in UTF-8, an unknown page size), and [`plan`] for a table without rowids, a
//! view, or a table with generated columns or columns whose absent values are not NULL; the caller then reads through
//! SQLite. Every offset read from the file is checked: a damaged or truncated file is an
//! [`Error`] naming the page, never a panic.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Why a scan stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read page {page}: {message}")]
    Io { page: u32, message: String },
    /// A page or record is not what the format allows (a damaged or truncated file).
    #[error("damaged database page {page}: {what}")]
    Damaged { page: u32, what: &'static str },
}

/// Interior pages deeper than this mean a loop in the tree (a 4 KB-page tree of 2^64 rows is
/// under 10 deep).
const MAX_DEPTH: usize = 40;

/// An SQLite database file opened for page reads.
pub struct PageFile {
    file: File,
    page_size: usize,
    /// Bytes of a page used by the B-tree (the page size less the reserved bytes).
    usable: usize,
    pages: u32,
}

/// Where a selected column's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnSource {
    /// The row's rowid: `rowid` itself, or an `INTEGER PRIMARY KEY` column at this record
    /// position (stored as NULL there; a value found there anyway is taken instead).
    Rowid(Option<usize>),
    /// The record's value at this position (NULL when the record is shorter).
    Record(usize),
    /// As `Record`, for a column of REAL affinity: SQLite stores its whole numbers as
    /// integers, which read back as reals.
    RealRecord(usize),
    /// A column the table does not have.
    Null,
}

/// A table to scan: its root page and where each selected column comes from.
#[derive(Debug, Clone)]
pub struct TablePlan {
    pub root: u32,
    pub columns: Vec<ColumnSource>,
    /// For each record field up to the last selected one, the selected column it is read
    /// into (each field into one column at most).
    pub field_columns: Vec<Option<usize>>,
}

/// A value of the current row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl PageFile {
    /// Opens `path` for page reads; `None` when the file is not a plain rollback-journal
    /// UTF-8 database without a pending journal (reading it needs SQLite itself).
    pub fn open(path: &Path) -> std::io::Result<Option<PageFile>> {
        let file = File::open(path)?;
        let mut header = [0u8; 100];
        if file.read_exact_at(&mut header, 0).is_err() {
            return Ok(None);
        }
        let sidecar = |suffix: &str| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            Path::new(&p).exists()
        };
        let page_size = match u16::from_be_bytes([header[16], header[17]]) {
            1 => 65536,
            n => n as usize,
        };
        let plain = &header[..16] == b"SQLite format 3\0"
            // File format versions 1 (legacy) for both reading and writing: not WAL.
            && header[18] == 1
            && header[19] == 1
            // Text encoding 1: UTF-8 (0 in an empty database).
            && matches!(u32::from_be_bytes([header[56], header[57], header[58], header[59]]), 0 | 1)
            && page_size.is_power_of_two()
            && (512..=65536).contains(&page_size)
            && !sidecar("-journal")
            && !sidecar("-wal");
        if !plain {
            return Ok(None);
        }
        let usable = page_size - header[20] as usize;
        if usable < 480 {
            return Ok(None);
        }
        let pages = (file.metadata()?.len() / page_size as u64).min(u32::MAX as u64) as u32;
        Ok(Some(PageFile {
            file,
            page_size,
            usable,
            pages,
        }))
    }

    /// Reads page `page` (numbered from 1) into `buf`.
    fn read_page(&self, page: u32, buf: &mut Vec<u8>) -> Result<(), Error> {
        if page == 0 || page > self.pages {
            return Err(Error::Damaged {
                page,
                what: "page number beyond the end of the file (truncated?)",
            });
        }
        buf.resize(self.page_size, 0);
        self.file
            .read_exact_at(buf, (page as u64 - 1) * self.page_size as u64)
            .map_err(|e| Error::Io {
                page,
                message: e.to_string(),
            })
    }

    /// Rows with `lo <= rowid < hi` of the table rooted at `plan.root`, in rowid order.
    pub fn scan<'p>(&'p self, plan: &'p TablePlan, lo: i64, hi: i64) -> Scan<'p> {
        Scan {
            file: self,
            plan,
            lo,
            hi,
            stack: Vec::new(),
            started: false,
            done: lo >= hi,
            leaf: Vec::new(),
            leaf_page: 0,
            cells: 0,
            next_cell: 0,
            rowid: 0,
            overflow: Vec::new(),
            in_overflow: false,
            payload_at: 0,
            payload_len: 0,
            values: Vec::new(),
            reads: 0,
            loaded: false,
        }
    }
}

/// An interior page on the path to the current leaf, and the next of its children to visit.
struct Interior {
    page: u32,
    bytes: Vec<u8>,
    cells: usize,
    /// Index of the next child: `cells` is the right-most child.
    next: usize,
}

/// A rowid-range scan of one table; [`Scan::step`] moves to the next row.
pub struct Scan<'p> {
    file: &'p PageFile,
    plan: &'p TablePlan,
    lo: i64,
    hi: i64,
    stack: Vec<Interior>,
    started: bool,
    done: bool,
    leaf: Vec<u8>,
    leaf_page: u32,
    cells: usize,
    next_cell: usize,
    rowid: i64,
    /// The current row's payload when it spills onto overflow pages.
    overflow: Vec<u8>,
    in_overflow: bool,
    /// The current payload in `leaf` (or all of `overflow`).
    payload_at: usize,
    payload_len: usize,
    /// The current row's selected columns, decoded.
    values: Vec<Cell>,
    /// Pages read: a scan reads each page at most once, so more than the file has means a
    /// loop in a damaged tree.
    reads: u32,
    /// A row was loaded (`rowid` is its rowid).
    loaded: bool,
}

/// An SQLite varint at `at` in `b`: its value and length.
#[inline]
fn varint(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let first = *b.get(at)?;
    if first < 0x80 {
        return Some((u64::from(first), 1));
    }
    long_varint(b, at)
}

fn long_varint(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for i in 0..8 {
        let byte = *b.get(at + i)?;
        v = (v << 7) | u64::from(byte & 0x7f);
        if byte < 0x80 {
            return Some((v, i + 1));
        }
    }
    let byte = *b.get(at + 8)?;
    Some(((v << 8) | u64::from(byte), 9))
}

fn be_u16(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]) as usize)
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Offset of the B-tree page header in page `page` (page 1 starts with the file header).
fn header_at(page: u32) -> usize {
    if page == 1 {
        100
    } else {
        0
    }
}

/// Bytes of the value of serial types 0 to 9.
const SERIAL_LEN: [usize; 10] = [0, 1, 2, 3, 4, 6, 8, 8, 0, 0];

const INTERIOR_TABLE: u8 = 0x05;
const LEAF_TABLE: u8 = 0x0d;

impl<'p> Scan<'p> {
    fn damaged(&self, page: u32, what: &'static str) -> Error {
        Error::Damaged { page, what }
    }

    fn read_page(&mut self, page: u32, buf: &mut Vec<u8>) -> Result<(), Error> {
        self.reads += 1;
        if self.reads > self.file.pages {
            return Err(self.damaged(page, "the tree visits a page twice (a loop?)"));
        }
        self.file.read_page(page, buf)
    }

    /// Descends from `page` to the leaf holding the first rowid at or after `self.lo`, pushing
    /// the interior pages passed.
    fn descend(&mut self, mut page: u32) -> Result<(), Error> {
        loop {
            if self.stack.len() > MAX_DEPTH {
                return Err(self.damaged(page, "the tree is deeper than any real table (a loop?)"));
            }
            let mut bytes = std::mem::take(&mut self.leaf);
            self.read_page(page, &mut bytes)?;
            let h = header_at(page);
            let kind = bytes[h];
            let cells = be_u16(&bytes, h + 3).ok_or_else(|| self.damaged(page, "short page"))?;
            match kind {
                LEAF_TABLE => {
                    if h + 8 + 2 * cells > self.file.usable {
                        return Err(self.damaged(page, "more cells than fit the page"));
                    }
                    self.leaf = bytes;
                    self.leaf_page = page;
                    self.cells = cells;
                    // The first cell with rowid >= lo (cells are in rowid order).
                    let mut a = 0;
                    let mut b = cells;
                    while a < b {
                        let mid = (a + b) / 2;
                        if self.leaf_cell_rowid(mid)? < self.lo {
                            a = mid + 1;
                        } else {
                            b = mid;
                        }
                    }
                    self.next_cell = a;
                    return Ok(());
                }
                INTERIOR_TABLE => {
                    if h + 12 + 2 * cells > self.file.usable {
                        return Err(self.damaged(page, "more cells than fit the page"));
                    }
                    let mut interior = Interior {
                        page,
                        bytes,
                        cells,
                        next: 0,
                    };
                    // Child `i` holds rowids up to key `i`: the first child whose key >= lo.
                    let (mut a, mut b) = (0, cells);
                    while a < b {
                        let mid = (a + b) / 2;
                        if self.interior_key(&interior, mid)? < self.lo {
                            a = mid + 1;
                        } else {
                            b = mid;
                        }
                    }
                    let child = self.interior_child(&interior, a)?;
                    interior.next = a + 1;
                    self.stack.push(interior);
                    self.leaf = Vec::new();
                    page = child;
                }
                _ => return Err(self.damaged(page, "not a table B-tree page")),
            }
        }
    }

    fn cell_offset(
        &self,
        bytes: &[u8],
        page: u32,
        header: usize,
        i: usize,
    ) -> Result<usize, Error> {
        let at = be_u16(bytes, header + i * 2)
            .ok_or_else(|| self.damaged(page, "short cell pointer array"))?;
        if at >= self.file.usable {
            return Err(self.damaged(page, "cell pointer beyond the page"));
        }
        Ok(at)
    }

    /// Key (largest rowid of the child) of interior cell `i`.
    fn interior_key(&self, p: &Interior, i: usize) -> Result<i64, Error> {
        let at = self.cell_offset(&p.bytes, p.page, header_at(p.page) + 12, i)?;
        let (key, _) = varint(&p.bytes[..self.file.usable], at + 4)
            .ok_or_else(|| self.damaged(p.page, "short interior cell"))?;
        Ok(key as i64)
    }

    /// Page number of child `i` of an interior page (`i == cells`: the right-most child).
    fn interior_child(&self, p: &Interior, i: usize) -> Result<u32, Error> {
        let h = header_at(p.page);
        let child = if i == p.cells {
            be_u32(&p.bytes, h + 8)
        } else {
            let at = self.cell_offset(&p.bytes, p.page, h + 12, i)?;
            be_u32(&p.bytes[..self.file.usable], at)
        };
        child.ok_or_else(|| self.damaged(p.page, "short interior cell"))
    }

    fn leaf_cell_rowid(&self, i: usize) -> Result<i64, Error> {
        let page = self.leaf_page;
        let at = self.cell_offset(&self.leaf, page, header_at(page) + 8, i)?;
        let b = &self.leaf[..self.file.usable];
        let (_, n) = varint(b, at).ok_or_else(|| self.damaged(page, "short cell"))?;
        let (rowid, _) = varint(b, at + n).ok_or_else(|| self.damaged(page, "short cell"))?;
        Ok(rowid as i64)
    }

    /// Moves to the next row in the range; false at its end.
    pub fn step(&mut self) -> Result<bool, Error> {
        if self.done {
            return Ok(false);
        }
        if !self.started {
            self.started = true;
            self.descend(self.plan.root)?;
        }
        while self.next_cell >= self.cells {
            // The leaf is done: on to the next child of the nearest interior page with one.
            loop {
                let Some(top) = self.stack.last_mut() else {
                    self.done = true;
                    return Ok(false);
                };
                if top.next > top.cells {
                    self.stack.pop();
                    continue;
                }
                let i = top.next;
                top.next += 1;
                let top = self.stack.last().expect("just looked at");
                // Children after key `i - 1` hold only rowids above it.
                if i > 0 && self.interior_key(top, i - 1)? >= self.hi - 1 {
                    self.done = true;
                    return Ok(false);
                }
                let child = self.interior_child(top, i)?;
                self.descend(child)?;
                break;
            }
        }
        let i = self.next_cell;
        self.next_cell += 1;
        self.load_cell(i)?;
        if self.rowid >= self.hi {
            self.done = true;
            return Ok(false);
        }
        Ok(true)
    }

    /// Reads cell `i` of the current leaf: its rowid, payload and record header.
    fn load_cell(&mut self, i: usize) -> Result<(), Error> {
        let page = self.leaf_page;
        let usable = self.file.usable;
        let at = self.cell_offset(&self.leaf, page, header_at(page) + 8, i)?;
        let b = &self.leaf[..usable];
        let short = || Error::Damaged {
            page,
            what: "short cell",
        };
        let (payload, n1) = varint(b, at).ok_or_else(short)?;
        let (rowid, n2) = varint(b, at + n1).ok_or_else(short)?;
        let rowid = rowid as i64;
        if self.loaded && rowid <= self.rowid {
            return Err(self.damaged(page, "rowids out of order"));
        }
        self.loaded = true;
        self.rowid = rowid;
        let start = at + n1 + n2;
        // A payload longer than the file is damage; bounding it bounds what an overflow chain
        // can gather.
        let payload = usize::try_from(payload)
            .ok()
            .filter(|&p| p as u64 <= self.file.pages as u64 * self.file.page_size as u64)
            .ok_or_else(|| self.damaged(page, "payload longer than the file"))?;
        // How much of the payload is on this page (file format 1.6, "cell payload overflow").
        let max_local = usable - 35;
        let local = if payload <= max_local {
            payload
        } else {
            let min_local = (usable - 12) * 32 / 255 - 23;
            let k = min_local + (payload - min_local) % (usable - 4);
            if k <= max_local {
                k
            } else {
                min_local
            }
        };
        if start + local > usable {
            return Err(short());
        }
        if local == payload {
            self.in_overflow = false;
            self.payload_at = start;
            self.payload_len = payload;
        } else {
            let mut next = be_u32(b, start + local).ok_or_else(short)?;
            self.overflow.clear();
            self.overflow.extend_from_slice(&b[start..start + local]);
            let mut buf = Vec::new();
            // A looping chain is caught by `read_page`'s count of pages read.
            while self.overflow.len() < payload {
                if next == 0 {
                    return Err(self.damaged(page, "broken overflow chain"));
                }
                self.read_page(next, &mut buf)?;
                let take = (payload - self.overflow.len()).min(usable - 4);
                self.overflow.extend_from_slice(&buf[4..4 + take]);
                next = be_u32(&buf, 0).ok_or_else(short)?;
            }
            self.in_overflow = true;
            self.payload_at = 0;
            self.payload_len = payload;
        }
        self.parse_record_header()
    }

    fn payload(&self) -> &[u8] {
        if self.in_overflow {
            &self.overflow[..self.payload_len]
        } else {
            &self.leaf[self.payload_at..self.payload_at + self.payload_len]
        }
    }

    /// Decodes the selected fields of the current record, in one pass over its header.
    fn parse_record_header(&mut self) -> Result<(), Error> {
        let page = self.leaf_page;
        let bad = |what| Error::Damaged { page, what };
        let mut values = std::mem::take(&mut self.values);
        let p = self.payload();
        let plan = self.plan;
        values.clear();
        values.resize(plan.columns.len(), Cell::Null);
        let (header_len, mut at) = varint(p, 0).ok_or_else(|| bad("short record header"))?;
        let header_len = usize::try_from(header_len).map_err(|_| bad("bad record header"))?;
        if header_len > p.len() {
            return Err(bad("record header longer than the record"));
        }
        let header = &p[..header_len];
        let mut offset = header_len;
        // Fields past the last selected one are not looked at.
        for &wanted in &plan.field_columns {
            if at >= header_len {
                break; // a record older than columns added since: the rest are NULL
            }
            let (serial, n) = varint(header, at).ok_or_else(|| bad("bad record header"))?;
            at += n;
            let len = match serial {
                0..=9 => SERIAL_LEN[serial as usize],
                10 | 11 => return Err(bad("reserved serial type")),
                n => ((n - 12) / 2) as usize,
            };
            let end = offset.checked_add(len).ok_or_else(|| bad("bad record"))?;
            if end > p.len() {
                return Err(bad("record values longer than the record"));
            }
            if let Some(column) = wanted {
                values[column] = match (decode(p, serial, offset), plan.columns[column]) {
                    (Cell::Int(v), ColumnSource::RealRecord(_)) => Cell::Real(v as f64),
                    (cell, _) => cell,
                };
            }
            offset = end;
        }
        for (value, source) in values.iter_mut().zip(&plan.columns) {
            if matches!(source, ColumnSource::Rowid(_)) && matches!(value, Cell::Null) {
                *value = Cell::Int(self.rowid);
            }
        }
        self.values = values;
        Ok(())
    }

    /// Selected column `i` of the current row as an integer: `Ok(None)` for NULL, else the
    /// name of its storage class when that is not INTEGER.
    #[inline]
    pub fn int(&self, i: usize) -> Result<Option<i64>, &'static str> {
        match self.values[i] {
            Cell::Int(v) => Ok(Some(v)),
            Cell::Null => Ok(None),
            Cell::Real(_) => Err("a real number"),
            Cell::Text(..) => Err("text"),
            Cell::Blob(..) => Err("a blob"),
        }
    }

    /// Selected column `i` of the current row.
    #[inline]
    pub fn value(&self, i: usize) -> Value<'_> {
        match self.values[i] {
            Cell::Null => Value::Null,
            Cell::Int(v) => Value::Int(v),
            Cell::Real(v) => Value::Real(v),
            Cell::Text(at, len) => Value::Text(&self.payload()[at..at + len]),
            Cell::Blob(at, len) => Value::Blob(&self.payload()[at..at + len]),
        }
    }
}

/// A decoded value; text and blobs as (offset, length) in the payload.
#[derive(Debug, Clone, Copy)]
enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(usize, usize),
    Blob(usize, usize),
}

/// The value of serial type `serial` at `at` in the payload `p` (its bytes checked to lie
/// in `p`).
#[inline]
fn decode(p: &[u8], serial: u64, at: usize) -> Cell {
    // A big-endian two's complement integer of `N` bytes.
    fn int<const N: usize>(p: &[u8], at: usize) -> i64 {
        let mut b = [0u8; 8];
        b[8 - N..].copy_from_slice(&p[at..at + N]);
        (i64::from_be_bytes(b) << (64 - 8 * N)) >> (64 - 8 * N)
    }
    match serial {
        0 => Cell::Null,
        1 => Cell::Int(int::<1>(p, at)),
        2 => Cell::Int(int::<2>(p, at)),
        3 => Cell::Int(int::<3>(p, at)),
        4 => Cell::Int(int::<4>(p, at)),
        5 => Cell::Int(int::<6>(p, at)),
        6 => Cell::Int(int::<8>(p, at)),
        7 => Cell::Real(f64::from_bits(int::<8>(p, at) as u64)),
        8 => Cell::Int(0),
        9 => Cell::Int(1),
        n if n % 2 == 0 => Cell::Blob(at, ((n - 12) / 2) as usize),
        n => Cell::Text(at, ((n - 13) / 2) as usize),
    }
}

/// How to read `columns` of `table` from its pages (`Some("rowid")`: the rowid; `None`: a
/// column read as NULL), from the schema in `conn`. `None` when the table is not a plain
/// rowid table whose absent values are NULL.
pub fn plan(
    conn: &rusqlite::Connection,
    table: &str,
    columns: &[Option<&str>],
) -> rusqlite::Result<Option<TablePlan>> {
    use rusqlite::OptionalExtension;
    // SQLite says itself whether the table has rowids (`wr`: WITHOUT ROWID) and is a plain
    // table (not a view or virtual table).
    let Some((root, plain)) = conn
        .query_row(
            "SELECT s.rootpage, l.type = 'table' AND l.wr = 0
             FROM sqlite_schema s JOIN pragma_table_list l ON l.name = s.name AND l.schema = 'main'
             WHERE s.type = 'table' AND s.name = ?1",
            [table],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, bool>(1)?)),
        )
        .optional()?
    else {
        return Ok(None);
    };
    let Ok(root) = u32::try_from(root) else {
        return Ok(None);
    };
    if root == 0 || !plain {
        return Ok(None);
    }
    struct Col {
        name: String,
        declared: String,
        default: Option<String>,
        pk: i64,
        hidden: i64,
    }
    let mut stmt = conn.prepare(
        "SELECT name, type, dflt_value, pk, hidden FROM pragma_table_xinfo(?1) ORDER BY cid",
    )?;
    let cols = stmt
        .query_map([table], |r| {
            Ok(Col {
                name: r.get(0)?,
                declared: r.get(1)?,
                default: r.get(2)?,
                pk: r.get(3)?,
                hidden: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<Col>>>()?;
    // Generated columns are not stored as such; a default other than NULL is what records
    // older than an added column read as.
    if cols.iter().any(|c| {
        c.hidden != 0
            || c.default
                .as_deref()
                .is_some_and(|d| !d.eq_ignore_ascii_case("NULL"))
    }) {
        return Ok(None);
    }
    let primary: Vec<&Col> = cols.iter().filter(|c| c.pk > 0).collect();
    let alias = match primary.as_slice() {
        [only] if only.declared.eq_ignore_ascii_case("INTEGER") => Some(only.name.as_str()),
        _ => None,
    };
    let mut sources = Vec::with_capacity(columns.len());
    for column in columns {
        let source = match column {
            None => ColumnSource::Null,
            // A column of the table named `rowid` hides the rowid, as in SQL.
            Some(name) => match cols.iter().position(|c| c.name.eq_ignore_ascii_case(name)) {
                None if name.eq_ignore_ascii_case("rowid") => ColumnSource::Rowid(None),
                None => return Ok(None),
                Some(i) if Some(cols[i].name.as_str()) == alias => ColumnSource::Rowid(Some(i)),
                Some(i) if real_affinity(&cols[i].declared) => ColumnSource::RealRecord(i),
                Some(i) => ColumnSource::Record(i),
            },
        };
        sources.push(source);
    }
    let mut field_columns: Vec<Option<usize>> = Vec::new();
    for (column, source) in sources.iter().enumerate() {
        if let ColumnSource::Record(f)
        | ColumnSource::RealRecord(f)
        | ColumnSource::Rowid(Some(f)) = *source
        {
            if field_columns.len() <= f {
                field_columns.resize(f + 1, None);
            }
            if field_columns[f].replace(column).is_some() {
                return Ok(None); // one field selected twice: not worth a case of its own
            }
        }
    }
    Ok(Some(TablePlan {
        root,
        columns: sources,
        field_columns,
    }))
}

/// SQLite's affinity rules (datatype3, 3.1): REAL when the declared type names no INT, CHAR,
/// CLOB, TEXT or BLOB but REAL, FLOA or DOUB.
fn real_affinity(declared: &str) -> bool {
    let t = declared.to_ascii_uppercase();
    let has = |s: &str| t.contains(s);
    !has("INT")
        && !has("CHAR")
        && !has("CLOB")
        && !has("TEXT")
        && !has("BLOB")
        && !t.is_empty()
        && (has("REAL") || has("FLOA") || has("DOUB"))
}

#[cfg(test)]
mod tests;
