use super::*;
use crate::manifest::Manifest;
use crate::store::tests::meta;
use crate::store::{PutMode, Store};
use datafusion::arrow::array::{
    Array, Float64Array, Int32Array, Int64Array, StringArray, StringDictionaryBuilder,
};
use datafusion::arrow::datatypes::Int32Type;
use datafusion::arrow::util::display::array_value_to_string;
use std::sync::Arc;

/// A counters batch of `n` rows drawn from `seed`: few ranks, devices and names (some null
/// ranks), times in a narrow range so that parts overlap and keys repeat, and a `value`
/// numbering each row of the whole test so that rows of equal keys can be told apart.
fn counters(n: usize, seed: u64, first_value: f64) -> RecordBatch {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let mut rank = Vec::with_capacity(n);
    let mut device = Vec::with_capacity(n);
    let mut names = StringDictionaryBuilder::<Int32Type>::new();
    let mut ts = Vec::with_capacity(n);
    // Each part's dictionary holds its names in an order of its own.
    let texts = ["mem", "util", "power", "clock"];
    for _ in 0..n {
        rank.push(match next(5) {
            0 => None,
            r => Some(r as i32),
        });
        device.push(Some(next(2) as i32));
        names.append_value(texts[(next(4) + seed) as usize % 4]);
        ts.push(next(1000) as i64 - 500);
    }
    RecordBatch::try_new(
        TableKind::Counters.file_schema(),
        vec![
            Arc::new(Int32Array::from(rank)),
            Arc::new(Int32Array::from(device)),
            Arc::new(Int64Array::from(vec![Some(seed as i64); n])),
            Arc::new(names.finish()),
            Arc::new(Int64Array::from(ts)),
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| first_value + i as f64),
            )),
        ],
    )
    .unwrap()
}

/// An events batch of `n` rows: kinds, names and `args` texts from `seed`, overlapping times.
fn events(n: usize, seed: u64) -> RecordBatch {
    let schema = TableKind::Events.file_schema();
    let kinds = ["kernel", "memcpy", "cpu_op", "runtime"];
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| -> ArrayRef {
            let at = |i: usize| (i as u64 * 7 + seed * 13) % 97;
            match f.name().as_str() {
                "rank" => Arc::new(Int32Array::from(vec![Some(0); n])),
                "device" => Arc::new(Int32Array::from_iter(
                    (0..n).map(|i| (at(i) % 3 != 0).then_some((at(i) % 2) as i32)),
                )),
                "stream" => Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| 7 + (at(i) % 2) as i64),
                )),
                "step" => Arc::new(Int64Array::from_iter_values((0..n).map(|i| i as i64 / 50))),
                "ts" => Arc::new(Int64Array::from_iter_values((0..n).map(|i| at(i) as i64))),
                "dur" => Arc::new(Int64Array::from_iter_values(
                    (0..n).map(|i| (seed * 1000 + i as u64) as i64),
                )),
                "kind" | "name" => {
                    let mut b = StringDictionaryBuilder::<Int32Type>::new();
                    for i in 0..n {
                        let k = kinds[(at(i) % 4) as usize];
                        match f.name().as_str() {
                            "kind" => b.append_value(k),
                            _ => b.append_value(format!("{k}_{}", seed % 3)),
                        }
                    }
                    Arc::new(b.finish())
                }
                "args" => {
                    Arc::new(StringArray::from_iter((0..n).map(|i| {
                        (i % 5 != 0).then(|| format!("{{\"part\":{seed},\"i\":{i}}}"))
                    })))
                }
                _ => datafusion::arrow::array::new_null_array(f.data_type(), n),
            }
        })
        .collect();
    RecordBatch::try_new(schema, columns).unwrap()
}

/// A store with run `r` made of one commit per batch (the first creates the run), without the
/// automatic compaction of appends (each part is committed by `put_runs`).
fn fragmented(dir: &std::path::Path, table: TableKind, parts: Vec<RecordBatch>) -> Store {
    let store = Store::open(dir).unwrap();
    let r = RunId::new("r").unwrap();
    for (i, batch) in parts.into_iter().enumerate() {
        let mut w = store.writer().unwrap();
        let staged = w.write_part(table, vec![batch]).unwrap();
        w.put_runs(
            vec![(r.clone(), meta(&format!("h{i}")), vec![staged])],
            PutMode::Append,
        )
        .unwrap();
    }
    store
}

/// Every row of a batch as text, column by column (dictionaries by their values).
fn rows_as_text(batch: &RecordBatch) -> Vec<String> {
    (0..batch.num_rows())
        .map(|row| {
            batch
                .columns()
                .iter()
                .map(|c| match c.is_null(row) {
                    true => "<null>".to_string(),
                    false => array_value_to_string(c, row).unwrap(),
                })
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect()
}

/// The batches of each file of `table` in `m`'s run `r`, in file order.
fn files_of(store: &Store, m: &Manifest, table: TableKind) -> Vec<(FileEntry, Vec<RecordBatch>)> {
    m.runs[&RunId::new("r").unwrap()]
        .files
        .iter()
        .filter(|f| f.table == table)
        .map(|f| {
            let path = store.file_path(m, &f.path);
            (f.clone(), part::read_parquet(table, &path).unwrap())
        })
        .collect()
}

/// Compacts a run of `parts` and checks that the one merged part holds what compaction by a
/// full sort gave: the rows of every part sorted together by a stable sort (rows of equal
/// keys in part order), with the same row count, statistics and kind ranges.
fn compacts_as_a_full_sort(table: TableKind, parts: Vec<RecordBatch>) {
    let dir = tempfile::tempdir().unwrap();
    let n_parts = parts.len();
    let store = fragmented(dir.path(), table, parts);
    let before = store.manifest().unwrap();
    let inputs = files_of(&store, &before, table);
    assert_eq!(inputs.len(), n_parts);
    let all: Vec<RecordBatch> = inputs.iter().flat_map(|(_, b)| b.clone()).collect();
    let want = part::sort_batches(table, all).unwrap();
    let mut w = store.writer().unwrap();
    assert_eq!(w.compact_run(&RunId::new("r").unwrap()).unwrap(), n_parts);
    drop(w);
    let after = store.manifest().unwrap();
    let merged = files_of(&store, &after, table);
    assert_eq!(merged.len(), 1);
    let (file, batches) = &merged[0];
    let got = datafusion::arrow::compute::concat_batches(&table.file_schema(), batches).unwrap();
    assert_eq!(file.rows, want.num_rows() as u64);
    assert_eq!(rows_as_text(&got), rows_as_text(&want));
    assert_eq!(file.stats, part::column_stats(table, &want));
    assert_eq!(file.kinds, part::kind_ranges(&want));
    // Row groups of ROW_GROUP_ROWS rows, as every part has.
    let reader = datafusion::parquet::file::reader::SerializedFileReader::new(
        std::fs::File::open(store.file_path(&after, &file.path)).unwrap(),
    )
    .unwrap();
    use datafusion::parquet::file::reader::FileReader;
    let groups: Vec<i64> = reader
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .collect();
    let full = want.num_rows() / part::ROW_GROUP_ROWS;
    let mut expected = vec![part::ROW_GROUP_ROWS as i64; full];
    if want.num_rows() % part::ROW_GROUP_ROWS > 0 {
        expected.push((want.num_rows() % part::ROW_GROUP_ROWS) as i64);
    }
    assert_eq!(groups, expected);
    // No scratch file is left behind.
    let staging = store.paths().staging_dir();
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn merged_counters_are_the_rows_of_a_full_sort_in_its_order() {
    // More parts than MERGE_FAN_IN (merged in two passes), of sizes that end batches at
    // different rows; equal keys across parts and within them, null ranks, names whose
    // dictionaries differ from part to part.
    let mut value = 0.0;
    let parts = (0..MERGE_FAN_IN as u64 * 2 + 5)
        .map(|i| {
            let n = 1 + (i as usize * 997) % (3 * MERGE_BATCH_ROWS);
            let b = counters(n, i, value);
            value += n as f64;
            b
        })
        .collect();
    compacts_as_a_full_sort(TableKind::Counters, parts);
}

#[test]
fn merged_events_are_the_rows_of_a_full_sort_with_their_kind_ranges() {
    // Text columns (`args`, dictionaries of kinds and names), more than a row group in all.
    let parts = (0..20)
        .map(|i| events(9_000 + i as usize * 311, i))
        .collect();
    compacts_as_a_full_sort(TableKind::Events, parts);
}

#[test]
fn a_merge_holds_a_bounded_number_of_rows_whatever_the_run() {
    // 600 Ki rows in 60 parts: a merge of all of them at once held every row.
    let parts: Vec<RecordBatch> = (0..60u64)
        .map(|i| counters(10 * 1024, i, i as f64 * 1e5))
        .collect();
    let total: usize = parts.iter().map(|b| b.num_rows()).sum();
    let dir = tempfile::tempdir().unwrap();
    let store = fragmented(dir.path(), TableKind::Counters, parts);
    PEAK_ROWS_HELD.with(|p| p.set(0));
    let mut w = store.writer().unwrap();
    assert_eq!(w.compact_run(&RunId::new("r").unwrap()).unwrap(), 60);
    let peak = PEAK_ROWS_HELD.with(|p| p.get());
    // Each input's current batch and one more finished since the last gather, plus the rows
    // being gathered.
    let bound = 2 * MERGE_FAN_IN * MERGE_BATCH_ROWS + MERGE_BATCH_ROWS;
    assert!(peak > 0 && peak <= bound, "held {peak} rows, bound {bound}");
    assert!(total > 4 * bound, "the test's run is larger than the bound");
}

#[test]
fn a_part_out_of_order_is_an_error_naming_it_and_the_store_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let parts = (0..3).map(|i| counters(5000, i, 0.0)).collect();
    let store = fragmented(dir.path(), TableKind::Counters, parts);
    let before = store.manifest().unwrap();
    // The second part rewritten with the same rows unsorted (a part from outside the store).
    let (file, batches) = files_of(&store, &before, TableKind::Counters).remove(1);
    let batch =
        datafusion::arrow::compute::concat_batches(&TableKind::Counters.file_schema(), &batches)
            .unwrap();
    let reversed: Vec<usize> = (0..batch.num_rows()).rev().collect();
    let indices =
        datafusion::arrow::array::UInt32Array::from_iter_values(reversed.iter().map(|&i| i as u32));
    let columns = batch
        .columns()
        .iter()
        .map(|c| datafusion::arrow::compute::take(c, &indices, None).unwrap())
        .collect();
    let unsorted = RecordBatch::try_new(batch.schema(), columns).unwrap();
    let path = store.file_path(&before, &file.path);
    let size = part::write_parquet(TableKind::Counters, &path, &unsorted)
        .unwrap()
        .size;
    assert!(size > 0);
    let mut w = store.writer().unwrap();
    let err = w.compact_run(&RunId::new("r").unwrap()).unwrap_err();
    assert!(matches!(err, Error::DamagedFile { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains(&file.path), "{message}");
    assert!(message.contains("not sorted"), "{message}");
    drop(w);
    assert_eq!(store.manifest().unwrap().version, before.version);
    let staging = store.paths().staging_dir();
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
}
