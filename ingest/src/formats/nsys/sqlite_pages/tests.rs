//! Tables read from the database pages against what SQLite returns, and damaged pages.

use super::*;
use rusqlite::Connection;

/// A deterministic pseudo-random sequence.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A table of `rows` rows with every storage class, integers of every width, long texts
/// that overflow onto other pages, gaps in the rowids and a column added later.
fn database(path: &Path, rows: i64, page_size: u32) {
    let c = Connection::open(path).unwrap();
    c.execute_batch(&format!(
        "PRAGMA page_size = {page_size};
         CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c REAL, d BLOB, e INTEGER);
         CREATE TABLE empty (x INTEGER);"
    ))
    .unwrap();
    let mut rng = Rng(7);
    let tx = c.unchecked_transaction().unwrap();
    {
        let mut insert = tx
            .prepare("INSERT INTO t (id, a, b, c, d, e) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .unwrap();
        let mut id = 0i64;
        for i in 0..rows {
            id += 1 + rng.next(3) as i64;
            let width = rng.next(9);
            let a: Option<i64> = match width {
                0 => None,
                8 => Some(if i % 2 == 0 { i64::MIN } else { i64::MAX }),
                w => Some((rng.next(1 << (7 * w)) as i64) * if i % 2 == 0 { 1 } else { -1 }),
            };
            let long = rng.next(50) == 0;
            let b = (rng.next(4) != 0).then(|| {
                let n = if long {
                    3000 + rng.next(20000)
                } else {
                    rng.next(40)
                };
                (0..n)
                    .map(|k| char::from(b'a' + ((k + i as u64) % 26) as u8))
                    .collect::<String>()
            });
            let c_value = (rng.next(3) == 0).then(|| i as f64 / 7.0);
            let d = (rng.next(5) == 0).then(|| vec![i as u8; rng.next(10) as usize]);
            let e = (rng.next(2) == 0).then_some(i % 2);
            insert
                .execute(rusqlite::params![id, a, b, c_value, d, e])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    c.execute("DELETE FROM t WHERE id % 97 = 0", []).unwrap();
    c.execute("ALTER TABLE t ADD COLUMN f INTEGER", []).unwrap();
    c.execute("UPDATE t SET f = id WHERE id % 5 = 0", [])
        .unwrap();
}

fn owned(v: Value<'_>) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null => V::Null,
        Value::Int(i) => V::Integer(i),
        Value::Real(f) => V::Real(f),
        Value::Text(t) => V::Text(String::from_utf8(t.to_vec()).unwrap()),
        Value::Blob(b) => V::Blob(b.to_vec()),
    }
}

const COLUMNS: [Option<&str>; 9] = [
    Some("rowid"),
    Some("f"),
    Some("a"),
    None,
    Some("id"),
    Some("b"),
    Some("c"),
    Some("d"),
    Some("e"),
];

fn by_sqlite(c: &Connection, lo: i64, hi: i64) -> Vec<Vec<rusqlite::types::Value>> {
    let mut stmt = c
        .prepare("SELECT rowid, f, a, NULL, id, b, c, d, e FROM t WHERE rowid >= ?1 AND rowid < ?2")
        .unwrap();
    let rows = stmt
        .query_map([lo, hi], |r| (0..9).map(|i| r.get(i)).collect())
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

fn by_pages(
    file: &PageFile,
    plan: &TablePlan,
    lo: i64,
    hi: i64,
) -> Vec<Vec<rusqlite::types::Value>> {
    let mut scan = file.scan(plan, lo, hi);
    let mut out = Vec::new();
    while scan.step().unwrap() {
        out.push((0..9).map(|i| owned(scan.value(i))).collect());
    }
    out
}

#[test]
fn rowid_ranges_read_from_pages_equal_those_read_by_sqlite() {
    for page_size in [512u32, 4096, 65536] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        database(&path, 30_000, page_size);
        let c = Connection::open(&path).unwrap();
        let plan = plan(&c, "t", &COLUMNS).unwrap().unwrap();
        assert_eq!(plan.columns[4], ColumnSource::Rowid(Some(0)));
        assert_eq!(plan.columns[3], ColumnSource::Null);
        let file = PageFile::open(&path).unwrap().unwrap();
        let max: i64 = c
            .query_row("SELECT max(rowid) FROM t", [], |r| r.get(0))
            .unwrap();
        let mut rng = Rng(page_size as u64);
        let mut ranges = vec![
            (i64::MIN, i64::MAX),
            (0, 1),
            (1, 2),
            (max, max + 1),
            (5, 5),
            (9, 3),
        ];
        for _ in 0..40 {
            let lo = rng.next(max as u64 + 10) as i64 - 5;
            ranges.push((lo, lo + rng.next(5000) as i64));
        }
        for (lo, hi) in ranges {
            let want = by_sqlite(&c, lo, hi);
            let got = by_pages(&file, &plan, lo, hi);
            let first_difference = want.iter().zip(&got).position(|(a, b)| a != b);
            assert_eq!(
                (got.len(), first_difference.map(|i| &got[i])),
                (want.len(), None),
                "page size {page_size}, [{lo}, {hi}): first difference {:?}",
                first_difference.map(|i| &want[i])
            );
        }
        // The whole table is more than a few pages deep, or the test proves little.
        assert!(by_sqlite(&c, i64::MIN, i64::MAX).len() > 29_000);
        let empty = super::plan(&c, "empty", &[Some("x")]).unwrap().unwrap();
        assert!(!file.scan(&empty, i64::MIN, i64::MAX).step().unwrap());
    }
}

#[test]
fn files_and_tables_that_need_sqlite_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal.sqlite");
    let c = Connection::open(&wal).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE t (x INTEGER);
         CREATE TABLE k (a INTEGER, b INTEGER, PRIMARY KEY (a, b)) WITHOUT ROWID;
         CREATE TABLE k2 (a INTEGER PRIMARY KEY) WITHOUT /* a comment */
            ROWID;
         CREATE TABLE r (x INTEGER, rowid INTEGER);
         CREATE TABLE g (x INTEGER, y INTEGER GENERATED ALWAYS AS (x + 1));
         CREATE TABLE d (x INTEGER);
         INSERT INTO d VALUES (1);
         ALTER TABLE d ADD COLUMN y INTEGER DEFAULT 5;",
    )
    .unwrap();
    assert!(PageFile::open(&wal).unwrap().is_none(), "WAL mode");
    assert!(
        plan(&c, "k", &[Some("a")]).unwrap().is_none(),
        "WITHOUT ROWID"
    );
    assert!(
        plan(&c, "g", &[Some("x")]).unwrap().is_none(),
        "generated column"
    );
    assert!(
        plan(&c, "d", &[Some("x")]).unwrap().is_none(),
        "non-NULL default"
    );
    assert!(
        plan(&c, "t", &[Some("nope")]).unwrap().is_none(),
        "unknown column"
    );
    assert!(
        plan(&c, "missing", &[Some("x")]).unwrap().is_none(),
        "no such table"
    );
    assert!(
        plan(&c, "k2", &[Some("a")]).unwrap().is_none(),
        "WITHOUT ROWID, spaced"
    );
    let r = plan(&c, "r", &[Some("rowid"), Some("x")]).unwrap().unwrap();
    assert_eq!(
        r.columns,
        [ColumnSource::Record(1), ColumnSource::Record(0)],
        "a column named rowid hides the rowid"
    );
    assert!(plan(&c, "t", &[Some("x"), None]).unwrap().is_some());
}

#[test]
fn a_damaged_or_truncated_file_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.sqlite");
    database(&path, 5_000, 1024);
    let plan = {
        let c = Connection::open(&path).unwrap();
        plan(&c, "t", &COLUMNS).unwrap().unwrap()
    };
    let good = std::fs::read(&path).unwrap();
    let scan_all = |bytes: &[u8]| -> Result<usize, Error> {
        let damaged = dir.path().join("damaged.sqlite");
        std::fs::write(&damaged, bytes).unwrap();
        let file = PageFile::open(&damaged).unwrap().unwrap();
        let mut scan = file.scan(&plan, i64::MIN, i64::MAX);
        let mut n = 0;
        while scan.step()? {
            for i in 0..COLUMNS.len() {
                let _ = scan.value(i);
            }
            n += 1;
        }
        Ok(n)
    };
    let rows = scan_all(&good).unwrap();
    assert!(rows > 4_000);
    // Truncated: the missing pages are named.
    let err = scan_all(&good[..good.len() / 2]).unwrap_err();
    assert!(matches!(err, Error::Damaged { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    // Bytes overwritten at random places: an error or some rows, never a panic or a hang.
    let mut rng = Rng(11);
    let mut errors = 0;
    for _ in 0..300 {
        let mut bytes = good.clone();
        for _ in 0..1 + rng.next(8) {
            let at = 1024 + rng.next(bytes.len() as u64 - 1024) as usize;
            bytes[at] = rng.next(256) as u8;
        }
        errors += scan_all(&bytes).is_err() as usize;
    }
    assert!(errors > 0, "some damage is detected");
}
