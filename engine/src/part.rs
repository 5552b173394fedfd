//! Writing one sorted Parquet data file, and reading it back.

use crate::error::{Error, Result};
use crate::schema::TableKind;
use datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::compute::{self, SortColumn, SortOptions};
use datafusion::arrow::datatypes::{DataType, Int32Type, Schema};
use datafusion::parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnWriter, ArrowRowGroupWriterFactory,
};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, Encoding, ZstdLevel};
use datafusion::parquet::file::metadata::SortingColumn;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::parquet::file::writer::SerializedFileWriter;
use datafusion::parquet::schema::types::ColumnPath;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

/// Rows per row group: small enough that `ts`/`step` ranges prune inside a file.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Sorts the rows of `batches` together by the table's sort columns (nulls first) into one
/// batch. Columns are gathered into sorted order one at a time, each one's inputs released
/// before the next, so memory peaks near one copy plus a column.
pub fn sort_batches(table: TableKind, batches: Vec<RecordBatch>) -> Result<RecordBatch> {
    let schema = table.file_schema();
    let key_column = |name: &str| -> Result<ArrayRef> {
        let parts = batches
            .iter()
            .map(|b| {
                b.column_by_name(name)
                    .map(|c| c.as_ref())
                    .ok_or_else(|| schema_error(table, format!("missing column {name}")))
            })
            .collect::<Result<Vec<&dyn Array>>>()?;
        Ok(compute::concat(&parts)?)
    };
    let keys = table
        .sort_columns()
        .iter()
        .map(|name| {
            Ok(SortColumn {
                values: key_column(name)?,
                options: Some(SortOptions {
                    descending: false,
                    nulls_first: true,
                }),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let order = sort_order(&keys)?;
    // The sort columns are concatenated already: gathered from there, not concatenated again.
    let concatenated: HashMap<&str, ArrayRef> = table
        .sort_columns()
        .iter()
        .copied()
        .zip(keys.into_iter().map(|k| k.values))
        .collect();
    let columns: Vec<Vec<ArrayRef>> = (0..schema.fields().len())
        .map(|c| batches.iter().map(|b| b.column(c).clone()).collect())
        .collect();
    let all_null = |inputs: &[ArrayRef]| inputs.iter().all(|a| a.null_count() == a.len());
    // (input batch, row) of each output row, for the string columns (if any has a value).
    let positions: Vec<(usize, usize)> =
        if schema.fields().iter().zip(&columns).any(|(f, c)| {
            matches!(f.data_type(), DataType::Utf8 | DataType::Binary) && !all_null(c)
        }) {
            let mut source = Vec::with_capacity(order.len());
            for (b, batch) in batches.iter().enumerate() {
                source.extend((0..batch.num_rows()).map(|r| (b, r)));
            }
            order.values().iter().map(|&i| source[i as usize]).collect()
        } else {
            Vec::new()
        };
    drop(batches);
    // Columns are gathered in parallel (rayon), like they are encoded ([`write_parquet`]).
    let sorted = schema
        .fields()
        .par_iter()
        .zip(columns.into_par_iter())
        .with_max_len(1)
        .map(|(field, inputs)| {
            let refs: Vec<&dyn Array> = inputs.iter().map(|a| a.as_ref()).collect();
            // A column null in every input (most columns of most sources) stays all null.
            // Strings are gathered straight from the inputs (one copy of their bytes); other
            // columns are concatenated and gathered by row number (`interleave` reads a
            // 16-byte (batch, row) pair per row and, for dictionaries, scans every row once
            // per input batch to merge them).
            let data_type = refs[0].data_type();
            Ok(if let Some(all) = concatenated.get(field.name().as_str()) {
                compute::take(all, &order, None)?
            } else if all_null(&inputs) {
                new_null_array(data_type, order.len())
            } else if matches!(data_type, DataType::Utf8 | DataType::Binary) {
                compute::interleave(&refs, &positions)?
            } else {
                compute::take(&compute::concat(&refs)?, &order, None)?
            })
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new(schema, sorted)?)
}

/// Row order by `keys` (ascending, nulls first). Four integer keys, the common case, are
/// sorted much faster than by the generic comparator of `lexsort_to_indices`: the first three
/// keys (rank, device, stream: few distinct values) number each row's group in key order, the
/// rows are bucketed by group, and each bucket is sorted by `has_last | last | row` packed in
/// one `u128`. A bucket holds the rows of one stream in their order in the input, which is a
/// few rising runs (one per input batch), so the run-merging stable sort is near linear.
fn sort_order(keys: &[SortColumn]) -> Result<datafusion::arrow::array::UInt32Array> {
    let ints: Option<Vec<IntKey<'_>>> = keys.iter().map(|k| IntKey::of(&k.values)).collect();
    let Some(ints) = ints.filter(|c| c.len() == 4) else {
        return Ok(compute::lexsort_to_indices(keys, None)?);
    };
    let n = ints[0].len();
    let prefix = |i: usize| [ints[0].get(i), ints[1].get(i), ints[2].get(i)];
    // Provisional group ids in order of appearance (rows come in runs of one stream)...
    let mut ids: HashMap<[Option<i64>; 3], u32> = HashMap::new();
    let mut group = Vec::with_capacity(n);
    let mut last: Option<([Option<i64>; 3], u32)> = None;
    for i in 0..n {
        let key = prefix(i);
        let id = match last {
            Some((k, id)) if k == key => id,
            _ => {
                let next = ids.len() as u32;
                let id = *ids.entry(key).or_insert(next);
                last = Some((key, id));
                id
            }
        };
        group.push(id);
    }
    // ...renumbered in key order (`None < Some`: nulls first, as the Parquet sorting_columns
    // declare).
    let mut distinct: Vec<([Option<i64>; 3], u32)> = ids.into_iter().collect();
    distinct.sort_unstable();
    let mut rank_of = vec![0u32; distinct.len()];
    for (rank, (_, id)) in distinct.iter().enumerate() {
        rank_of[*id as usize] = rank as u32;
    }
    // Bucket starts by group rank.
    let mut starts = vec![0usize; distinct.len() + 1];
    for &g in &group {
        starts[rank_of[g as usize] as usize + 1] += 1;
    }
    for r in 1..starts.len() {
        starts[r] += starts[r - 1];
    }
    let mut fill = starts.clone();
    let mut rows = vec![0u128; n];
    let last_key = &ints[3];
    for (i, &g) in group.iter().enumerate() {
        let (some, value) = match last_key.get(i) {
            Some(v) => (1u128, (v as u64 ^ (1 << 63)) as u128),
            None => (0, 0),
        };
        let slot = &mut fill[rank_of[g as usize] as usize];
        rows[*slot] = some << 96 | value << 32 | i as u128;
        *slot += 1;
    }
    drop(group);
    for bucket in starts.windows(2) {
        rows[bucket[0]..bucket[1]].sort();
    }
    Ok(datafusion::arrow::array::UInt32Array::from_iter_values(
        rows.into_iter().map(|r| r as u32),
    ))
}

/// A sort key column as integers: integer columns read without copying, a text column
/// (a counter's `name`) as the rank of each row's text among the column's texts.
enum IntKey<'a> {
    I32(&'a Int32Array),
    I64(&'a Int64Array),
    TextRank(Vec<Option<i64>>),
}

impl<'a> IntKey<'a> {
    fn of(values: &'a ArrayRef) -> Option<IntKey<'a>> {
        match values.data_type() {
            DataType::Int32 => Some(IntKey::I32(values.as_any().downcast_ref()?)),
            DataType::Int64 => Some(IntKey::I64(values.as_any().downcast_ref()?)),
            DataType::Dictionary(key, value)
                if **key == DataType::Int32 && **value == DataType::Utf8 =>
            {
                let dict = values.as_dictionary::<Int32Type>();
                let texts = dict.values().as_string::<i32>();
                // Rank of each dictionary value by its text (equal texts, equal ranks).
                let mut by_text: Vec<u32> = (0..texts.len() as u32).collect();
                by_text.sort_unstable_by_key(|&v| {
                    texts.is_valid(v as usize).then(|| texts.value(v as usize))
                });
                let mut rank_of = vec![0i64; texts.len()];
                let mut rank = 0;
                for (n, pair) in by_text.iter().enumerate() {
                    if n > 0 && texts.value(by_text[n - 1] as usize) != texts.value(*pair as usize)
                    {
                        rank += 1;
                    }
                    rank_of[*pair as usize] = rank;
                }
                Some(IntKey::TextRank(
                    (0..dict.len())
                        .map(|i| {
                            let key = dict.key(i)?;
                            texts.is_valid(key).then(|| rank_of[key])
                        })
                        .collect(),
                ))
            }
            _ => None,
        }
    }

    fn len(&self) -> usize {
        match self {
            IntKey::I32(a) => a.len(),
            IntKey::I64(a) => a.len(),
            IntKey::TextRank(r) => r.len(),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> Option<i64> {
        match self {
            IntKey::I32(a) => a.is_valid(i).then(|| i64::from(a.value(i))),
            IntKey::I64(a) => a.is_valid(i).then(|| a.value(i)),
            IntKey::TextRank(r) => r[i],
        }
    }
}

fn schema_error(table: TableKind, reason: String) -> Error {
    Error::Schema {
        table: table.name(),
        reason,
    }
}

/// Checks that `batch` has exactly the table's file schema.
pub fn check_schema(table: TableKind, batch: &RecordBatch) -> Result<()> {
    let want = table.file_schema();
    let got = batch.schema();
    if want.fields().len() != got.fields().len() {
        return Err(schema_error(
            table,
            format!(
                "{} columns, expected {}",
                got.fields().len(),
                want.fields().len()
            ),
        ));
    }
    for (w, g) in want.fields().iter().zip(got.fields()) {
        if w.name() != g.name() || w.data_type() != g.data_type() {
            return Err(schema_error(
                table,
                format!(
                    "column {} {:?}, expected {} {:?}",
                    g.name(),
                    g.data_type(),
                    w.name(),
                    w.data_type()
                ),
            ));
        }
    }
    Ok(())
}

/// Integer id columns stored as bit-packed deltas rather than dictionaries.
const DELTA_ID_COLUMNS: [&str; 6] = ["rank", "device", "stream", "step", "pid", "tid"];

fn writer_properties(table: TableKind, schema: &Schema) -> WriterProperties {
    let sorting = table
        .sort_columns()
        .iter()
        .filter_map(|c| schema.index_of(c).ok())
        .map(|i| SortingColumn {
            column_idx: i as i32,
            descending: false,
            nulls_first: true,
        })
        .collect();
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid zstd level"),
        ))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(20_000)
        .set_sorting_columns(Some(sorting));
    // Nearly unique columns: a dictionary would only be hashed into and then abandoned.
    // Timestamps and correlation ids rise within a stream, so their deltas pack into few bits;
    // durations vary, but bit-packed deltas still take about a third of their 8 bytes. zstd
    // gains next to nothing on bit-packed deltas and is the largest cost of reading them, so
    // these columns are stored uncompressed.
    for name in ["ts", "correlation", "dur"] {
        if schema.index_of(name).is_ok() {
            let column = ColumnPath::from(name);
            props = props
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column.clone(), Encoding::DELTA_BINARY_PACKED)
                .set_column_compression(column, Compression::UNCOMPRESSED);
        }
    }
    // Ids that change seldom from row to row in the sort order (rank, device, stream, step) or
    // take few values (pid, tid): their deltas pack into a few bits or none, as small as a
    // dictionary's indices, without hashing every value into a dictionary (that hashing was
    // 3-6 % of an ingest's CPU). Their page statistics stay, for pruning.
    for name in DELTA_ID_COLUMNS {
        if schema.index_of(name).is_ok() {
            let column = ColumnPath::from(name);
            props = props
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column, Encoding::DELTA_BINARY_PACKED);
        }
    }
    if schema.index_of("args").is_ok() {
        // Nearly unique JSON texts: no dictionary, and no min/max (nothing prunes on them, and
        // comparing long strings for every page cost more than encoding them).
        props = props
            .set_column_dictionary_enabled(ColumnPath::from("args"), false)
            .set_column_statistics_enabled(ColumnPath::from("args"), EnabledStatistics::None);
    }
    if table == TableKind::Events {
        // Long texts in no particular order: their min/max never prune a query, and computing
        // them compares the strings of every row.
        for name in ["name", "op", "scope"] {
            props = props
                .set_column_statistics_enabled(ColumnPath::from(name), EnabledStatistics::None);
        }
    }
    props.build()
}

/// Min/max of the table's stat columns.
pub fn column_stats(table: TableKind, batch: &RecordBatch) -> BTreeMap<String, Option<(i64, i64)>> {
    let mut stats = BTreeMap::new();
    for name in table.stat_columns() {
        let Some(col) = batch.column_by_name(name) else {
            continue;
        };
        let minmax = match col.data_type() {
            DataType::Int64 => {
                let a = col
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("Int64 column");
                compute::min(a).zip(compute::max(a))
            }
            DataType::Int32 => {
                let a = col
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .expect("Int32 column");
                compute::min(a)
                    .zip(compute::max(a))
                    .map(|(a, b)| (a as i64, b as i64))
            }
            _ => None,
        };
        stats.insert(name.to_string(), minmax);
    }
    stats
}

/// Rows of one kind closer than this are recorded as one range: a scan reads a little more,
/// and the manifest stays small.
pub const KIND_RANGE_GAP: u64 = 4096;

/// At most this many ranges per kind; beyond, the kind's rows are recorded as one range from
/// its first row to its last.
const MAX_KIND_RANGES: usize = 64;

/// Half-open row ranges of each value of the `kind` column of a sorted batch (empty when the
/// table has no `kind` column), with gaps under [`KIND_RANGE_GAP`] rows merged.
pub fn kind_ranges(batch: &RecordBatch) -> BTreeMap<String, Vec<(u64, u64)>> {
    let mut ranges = KindRanges::default();
    ranges.add(batch);
    ranges.finish()
}

/// [`kind_ranges`] of the batches of one part given one after the other (their rows numbered
/// on from one batch to the next).
#[derive(Default)]
struct KindRanges {
    rows: u64,
    /// Each kind's ranges, by kind.
    per_value: HashMap<String, Vec<(u64, u64)>>,
}

impl KindRanges {
    fn add(&mut self, batch: &RecordBatch) {
        let first_row = self.rows;
        self.rows += batch.num_rows() as u64;
        let Some(kind) = batch.column_by_name("kind") else {
            return;
        };
        let Some(dict) = kind.as_any_dictionary_opt() else {
            return;
        };
        let Some(values) = dict.values().as_string_opt::<i32>() else {
            return;
        };
        // Sorting concatenates the dictionaries of the input batches, so one kind can have
        // several codes: number the distinct values first.
        let mut distinct: Vec<&str> = Vec::new();
        let value_of_code: Vec<usize> = (0..values.len())
            .map(|code| {
                let v = values.value(code);
                distinct.iter().position(|d| *d == v).unwrap_or_else(|| {
                    distinct.push(v);
                    distinct.len() - 1
                })
            })
            .collect();
        let mut per_value: Vec<Vec<(u64, u64)>> = distinct
            .iter()
            .map(|v| self.per_value.remove(*v).unwrap_or_default())
            .collect();
        for (row, code) in dict.normalized_keys().into_iter().enumerate() {
            let row = first_row + row as u64;
            let ranges = &mut per_value[value_of_code[code]];
            match ranges.last_mut() {
                Some(last) if last.1 + KIND_RANGE_GAP >= row => last.1 = row + 1,
                _ => ranges.push((row, row + 1)),
            }
        }
        for (value, ranges) in distinct.into_iter().zip(per_value) {
            self.per_value.insert(value.to_string(), ranges);
        }
    }

    fn finish(self) -> BTreeMap<String, Vec<(u64, u64)>> {
        let mut out = BTreeMap::new();
        for (value, mut ranges) in self.per_value {
            if ranges.is_empty() {
                continue;
            }
            if ranges.len() > MAX_KIND_RANGES {
                ranges = vec![(ranges[0].0, ranges[ranges.len() - 1].1)];
            }
            out.insert(value, ranges);
        }
        out
    }
}

/// Writes a sorted batch to `path` as one Parquet file and syncs it to disk.
pub fn write_parquet(table: TableKind, path: &Path, batch: &RecordBatch) -> Result<WrittenPart> {
    let mut writer = PartWriter::create(table, path)?;
    writer.write(batch)?;
    writer.finish()
}

/// What [`PartWriter::finish`] wrote: the file's size, rows, per-file min/max of the stat
/// columns ([`column_stats`]) and row ranges of each kind ([`kind_ranges`]).
#[derive(Debug)]
pub struct WrittenPart {
    pub size: u64,
    pub rows: u64,
    pub stats: BTreeMap<String, Option<(i64, i64)>>,
    pub kinds: BTreeMap<String, Vec<(u64, u64)>>,
}

/// Writes one Parquet part from sorted batches of any size given one after the other, in row
/// groups of [`ROW_GROUP_ROWS`] rows. Each batch is encoded as it comes (a row group's columns
/// are held encoded, not as Arrow arrays), so a merge that writes small batches holds no more
/// than the encoded row group.
///
/// A batch's columns are encoded in parallel (rayon): when its caller writes several parts at
/// once, a core whose parts are done helps encode the columns of the last one instead of
/// waiting for it.
pub struct PartWriter {
    table: TableKind,
    path: std::path::PathBuf,
    schema: datafusion::arrow::datatypes::SchemaRef,
    file: SerializedFileWriter<BufWriter<File>>,
    columns: ArrowRowGroupWriterFactory,
    /// The column writers of the row group being written, and its rows so far.
    open: Option<(Vec<ArrowColumnWriter>, usize)>,
    row_groups: usize,
    rows: u64,
    stats: BTreeMap<String, Option<(i64, i64)>>,
    kinds: KindRanges,
}

impl PartWriter {
    /// Creates the file at `path` (with the table's file schema).
    pub fn create(table: TableKind, path: &Path) -> Result<PartWriter> {
        let file = File::create(path).map_err(Error::io(path))?;
        let schema = table.file_schema();
        let props = writer_properties(table, &schema);
        // Made by an `ArrowWriter`, so that the file carries the Arrow schema like any other.
        let (file, columns) = ArrowWriter::try_new(
            BufWriter::with_capacity(1 << 20, file),
            schema.clone(),
            Some(props),
        )?
        .into_serialized_writer()?;
        Ok(PartWriter {
            table,
            path: path.to_path_buf(),
            schema,
            file,
            columns,
            open: None,
            row_groups: 0,
            rows: 0,
            stats: BTreeMap::new(),
            kinds: KindRanges::default(),
        })
    }

    /// Appends the rows of `batch` (which follow the rows written before in sort order).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        check_schema(self.table, batch)?;
        merge_stats(&mut self.stats, column_stats(self.table, batch));
        self.kinds.add(batch);
        self.rows += batch.num_rows() as u64;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let (mut writers, rows) = match self.open.take() {
                Some(open) => open,
                None => (self.columns.create_column_writers(self.row_groups)?, 0),
            };
            let len = (ROW_GROUP_ROWS - rows).min(batch.num_rows() - offset);
            let slice = batch.slice(offset, len);
            // One leaf column per field: the schemas are flat.
            writers
                .par_iter_mut()
                .zip(
                    slice
                        .columns()
                        .par_iter()
                        .zip(self.schema.fields().par_iter()),
                )
                .with_max_len(1)
                .try_for_each(|(column, (array, field))| {
                    for leaf in compute_leaves(field, array)? {
                        column.write(&leaf)?;
                    }
                    Ok::<_, datafusion::parquet::errors::ParquetError>(())
                })?;
            offset += len;
            self.open = Some((writers, rows + len));
            if rows + len == ROW_GROUP_ROWS {
                self.close_row_group()?;
            }
        }
        Ok(())
    }

    fn close_row_group(&mut self) -> Result<()> {
        let Some((writers, _)) = self.open.take() else {
            return Ok(());
        };
        let chunks = writers
            .into_par_iter()
            .with_max_len(1)
            .map(|column| column.close())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut group = self.file.next_row_group()?;
        for chunk in chunks {
            chunk.append_to_row_group(&mut group)?;
        }
        group.close()?;
        self.row_groups += 1;
        Ok(())
    }

    /// Closes the last row group and the file, and syncs it to disk.
    pub fn finish(mut self) -> Result<WrittenPart> {
        self.close_row_group()?;
        let path = self.path;
        let buf = self.file.into_inner()?;
        let file = buf.into_inner().map_err(|e| Error::Io {
            path: path.clone(),
            error: e.into_error(),
        })?;
        file.sync_all().map_err(Error::io(&path))?;
        let size = file.metadata().map_err(Error::io(&path))?.len();
        Ok(WrittenPart {
            size,
            rows: self.rows,
            stats: self.stats,
            kinds: self.kinds.finish(),
        })
    }
}

/// Folds the min/max of one batch into those of the batches before it.
fn merge_stats(
    into: &mut BTreeMap<String, Option<(i64, i64)>>,
    from: BTreeMap<String, Option<(i64, i64)>>,
) {
    for (name, minmax) in from {
        let entry = into.entry(name).or_insert(None);
        *entry = match (*entry, minmax) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
    }
}

/// Sorted batches of a part read one at a time, `batch_rows` rows each (the last fewer).
/// Parts written before a text column became a dictionary (`op`, `scope`) read as
/// dictionaries too.
pub fn read_parquet_batches(
    table: TableKind,
    path: &Path,
    batch_rows: usize,
) -> Result<impl Iterator<Item = Result<RecordBatch>>> {
    use datafusion::parquet::arrow::arrow_reader::{
        ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    };
    let file = File::open(path).map_err(Error::io(path))?;
    let options = ArrowReaderOptions::new().with_schema(table.file_schema());
    let reader = ParquetRecordBatchReaderBuilder::try_new_with_options(file, options)?
        .with_batch_size(batch_rows)
        .build()?;
    Ok(reader.map(|b| b.map_err(Error::from)))
}

/// Reads a part of `table` back as batches of the table's file schema, all at once.
pub fn read_parquet(table: TableKind, path: &Path) -> Result<Vec<RecordBatch>> {
    read_parquet_batches(table, path, 64 * 1024)?.collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Float64Array;
    use datafusion::arrow::array::{DictionaryArray, StringArray, StringDictionaryBuilder};
    use std::sync::Arc;

    /// Parts written before `op` and `scope` became dictionaries hold the same Parquet
    /// columns; compaction reads them in the current schema.
    #[test]
    fn a_part_with_plain_text_op_and_scope_reads_in_the_current_schema() {
        use datafusion::arrow::datatypes::{Field, Schema};
        use datafusion::parquet::arrow::ArrowWriter;
        let current = TableKind::Events.file_schema();
        let old = Arc::new(Schema::new(
            current
                .fields()
                .iter()
                .map(|f| match f.name().as_str() {
                    "op" | "scope" => Field::new(f.name(), DataType::Utf8, true),
                    _ => f.as_ref().clone(),
                })
                .collect::<Vec<_>>(),
        ));
        let n = 3;
        let text = |v: &str| -> ArrayRef {
            let keys = Int32Array::from(vec![0; n]);
            Arc::new(
                datafusion::arrow::array::DictionaryArray::<Int32Type>::try_new(
                    keys,
                    Arc::new(StringArray::from(vec![v])),
                )
                .unwrap(),
            )
        };
        let columns: Vec<ArrayRef> = old
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                match f.name().as_str() {
                    "kind" => text("kernel"),
                    "name" => text("gemm"),
                    "ts" | "dur" => Arc::new(Int64Array::from(vec![1, 2, 3])),
                    "op" => Arc::new(StringArray::from(vec![
                        Some("aten::mm"),
                        None,
                        Some("aten::mm"),
                    ])),
                    "scope" => Arc::new(StringArray::from(vec![Some("## forward ##"); n])),
                    _ => new_null_array(f.data_type(), n),
                }
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.parquet");
        let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), old.clone(), None).unwrap();
        w.write(&RecordBatch::try_new(old, columns).unwrap())
            .unwrap();
        w.close().unwrap();
        let back = read_parquet(TableKind::Events, &path).unwrap();
        assert_eq!(back.len(), 1);
        check_schema(TableKind::Events, &back[0]).unwrap();
        let op = compute::cast(back[0].column_by_name("op").unwrap(), &DataType::Utf8).unwrap();
        let op: Vec<Option<&str>> = op
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(op, vec![Some("aten::mm"), None, Some("aten::mm")]);
    }

    /// Id columns are bit-packed deltas with page statistics (no dictionary), text columns
    /// dictionaries; the values come back as written.
    #[test]
    fn id_columns_are_deltas_with_statistics_and_texts_dictionaries() {
        use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
        use datafusion::parquet::file::serialized_reader::ReadOptionsBuilder;
        let n = 5000;
        let ids = |f: fn(i64) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values((0..n).map(f)))
        };
        let schema = TableKind::Events.file_schema();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> ArrayRef {
                match f.name().as_str() {
                    "rank" | "device" => Arc::new(Int32Array::from(vec![Some(1); n as usize])),
                    "stream" => ids(|i| 7 + i / 1000),
                    "step" => ids(|i| i / 700),
                    "pid" => ids(|_| 3_141_592),
                    "tid" => ids(|i| 3_141_592 + i % 3),
                    "ts" => ids(|i| 1_700_000_000_000_000_000 + i * 1000),
                    "dur" => ids(|i| i % 17),
                    "kind" | "name" => {
                        let mut b = StringDictionaryBuilder::<Int32Type>::new();
                        for i in 0..n {
                            b.append_value(if i % 2 == 0 { "kernel" } else { "memcpy" });
                        }
                        Arc::new(b.finish())
                    }
                    _ => new_null_array(f.data_type(), n as usize),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        write_parquet(TableKind::Events, &path, &batch).unwrap();
        let options = ReadOptionsBuilder::new().with_page_index().build();
        let reader =
            SerializedFileReader::new_with_options(File::open(&path).unwrap(), options).unwrap();
        let meta = reader.metadata();
        let group = meta.row_group(0);
        for c in group.columns() {
            let name = c.column_path().string();
            let encodings: Vec<Encoding> = c.encodings().collect();
            if DELTA_ID_COLUMNS.contains(&name.as_str()) {
                assert!(
                    encodings.contains(&Encoding::DELTA_BINARY_PACKED),
                    "{name}: {encodings:?}"
                );
                assert!(
                    c.dictionary_page_offset().is_none(),
                    "{name} has a dictionary"
                );
                assert!(
                    c.statistics().is_some_and(|s| s.min_bytes_opt().is_some()),
                    "{name}"
                );
            }
            if name == "name" || name == "kind" {
                assert!(
                    encodings.contains(&Encoding::RLE_DICTIONARY),
                    "{name}: {encodings:?}"
                );
            }
        }
        assert!(meta.column_index().is_some(), "page statistics for pruning");
        let back = read_parquet(TableKind::Events, &path).unwrap();
        let back = compute::concat_batches(&back[0].schema(), &back).unwrap();
        for name in DELTA_ID_COLUMNS {
            assert_eq!(
                back.column_by_name(name),
                batch.column_by_name(name),
                "{name}"
            );
        }
    }

    fn counters(rows: &[(Option<i32>, &str, i64)]) -> RecordBatch {
        let mut names = StringDictionaryBuilder::<Int32Type>::new();
        for r in rows {
            names.append_value(r.1);
        }
        RecordBatch::try_new(
            TableKind::Counters.file_schema(),
            vec![
                Arc::new(Int32Array::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(Int32Array::from(vec![Some(0); rows.len()])),
                Arc::new(Int64Array::from(vec![None::<i64>; rows.len()])),
                Arc::new(names.finish()),
                Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(Float64Array::from(vec![1.0; rows.len()])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn sorts_by_table_key_with_nulls_first_and_records_stats() {
        // Two batches, sorted together.
        let a = counters(&[(Some(1), "a", 30), (None, "a", 50)]);
        let b = counters(&[(Some(1), "a", 10), (Some(0), "b", 20)]);
        check_schema(TableKind::Counters, &a).unwrap();
        let s = sort_batches(TableKind::Counters, vec![a, b]).unwrap();
        let ts = s
            .column_by_name("ts")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(ts.values().to_vec(), vec![50, 20, 10, 30]);
        let stats = column_stats(TableKind::Counters, &s);
        assert_eq!(stats["ts"], Some((10, 50)));
        assert_eq!(stats["rank"], Some((0, 1)));
    }

    #[test]
    fn kind_ranges_cover_every_row_of_their_kind_and_merge_small_gaps() {
        // Host block: cpu_op with a runtime call every 3 rows; then kernels with one memcpy
        // in the middle, a gap of KIND_RANGE_GAP + 10 memsets, and kernels again.
        let gap = KIND_RANGE_GAP as usize;
        let mut kinds: Vec<&str> = (0..30)
            .map(|i| if i % 3 == 2 { "runtime" } else { "cpu_op" })
            .collect();
        kinds.extend(["kernel"; 5]);
        kinds.push("memcpy");
        kinds.extend(["kernel"; 5]);
        kinds.extend(std::iter::repeat_n("memset", gap + 10));
        kinds.extend(["kernel"; 2]);
        // Two codes for "kernel" (as after sorting batches with dictionaries of their own).
        let dict = {
            let values = StringArray::from(vec![
                "cpu_op", "runtime", "kernel", "memcpy", "memset", "kernel",
            ]);
            let keys: Int32Array = kinds
                .iter()
                .enumerate()
                .map(|(row, k)| {
                    let code = ["cpu_op", "runtime", "kernel", "memcpy", "memset"]
                        .iter()
                        .position(|v| v == k)
                        .unwrap() as i32;
                    Some(if code == 2 && row % 2 == 1 { 5 } else { code })
                })
                .collect();
            datafusion::arrow::array::DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
                .unwrap()
        };
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
            datafusion::arrow::datatypes::Field::new(
                "kind",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                false,
            ),
        ]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(dict)]).unwrap();
        let r = kind_ranges(&batch);
        let n = kinds.len() as u64;
        assert_eq!(r["cpu_op"], vec![(0, 29)]);
        assert_eq!(r["runtime"], vec![(2, 30)]);
        assert_eq!(r["memcpy"], vec![(35, 36)]);
        assert_eq!(r["memset"], vec![(41, 41 + gap as u64 + 10)]);
        // The kernels either side of the memcpy merge; those after the long memset run do not.
        assert_eq!(r["kernel"], vec![(30, 41), (n - 2, n)]);
        // Every row lies in a range of its kind.
        for (row, k) in kinds.iter().enumerate() {
            let row = row as u64;
            assert!(
                r[*k].iter().any(|&(lo, hi)| lo <= row && row < hi),
                "{row} {k}"
            );
        }
    }

    #[test]
    fn integer_key_sort_matches_the_generic_lexsort() {
        integer_key_sort_matches_the_generic_lexsort_with(false);
    }

    #[test]
    fn text_key_sort_matches_the_generic_lexsort() {
        // The counters' third key is a dictionary of names, with repeated and null values.
        integer_key_sort_matches_the_generic_lexsort_with(true);
    }

    fn integer_key_sort_matches_the_generic_lexsort_with(text_key: bool) {
        let mut x: u64 = 7;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let n = 5000;
        let opt32 = |v: u64| if v == 0 { None } else { Some(v as i32 - 2) };
        let a: Int32Array = (0..n).map(|_| opt32(next(4))).collect();
        let b: Int32Array = (0..n).map(|_| opt32(next(3))).collect();
        let c: Int64Array = (0..n)
            .map(|_| {
                if next(5) == 0 {
                    None
                } else {
                    Some(next(4) as i64)
                }
            })
            .collect();
        let c: ArrayRef = if text_key {
            let keys: Int32Array = c.iter().map(|k| k.map(|k| k as i32)).collect();
            let texts = StringArray::from(vec![Some("b"), Some("a"), Some("b"), Some("")]);
            Arc::new(DictionaryArray::<Int32Type>::try_new(keys, Arc::new(texts)).unwrap())
        } else {
            Arc::new(c)
        };
        // The last key with nulls and the extremes of i64 too (packed with a sign flip).
        let d: Int64Array = (0..n)
            .map(|_| match next(60) {
                0 => None,
                1 => Some(i64::MIN),
                2 => Some(i64::MAX),
                v => Some(v as i64 - 30),
            })
            .collect();
        let opts = Some(SortOptions {
            descending: false,
            nulls_first: true,
        });
        let keys: Vec<SortColumn> = [Arc::new(a) as ArrayRef, Arc::new(b), c, Arc::new(d)]
            .into_iter()
            .map(|values| SortColumn {
                values,
                options: opts,
            })
            .collect();
        // The fast path takes every key, the text one too.
        assert!(keys.iter().all(|k| IntKey::of(&k.values).is_some()));
        let fast = sort_order(&keys).unwrap();
        let generic = compute::lexsort_to_indices(&keys, None).unwrap();
        // Same key sequence (ties may be ordered differently by the generic sort).
        let key_at = |i: u32| -> Vec<String> {
            keys.iter()
                .map(|k| match k.values.is_null(i as usize) {
                    true => "<null>".to_string(),
                    false => datafusion::arrow::util::display::array_value_to_string(
                        &k.values, i as usize,
                    )
                    .unwrap(),
                })
                .collect()
        };
        let a: Vec<Vec<String>> = fast.values().iter().map(|&i| key_at(i)).collect();
        let b: Vec<Vec<String>> = generic.values().iter().map(|&i| key_at(i)).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn rejects_wrong_schema() {
        let b = counters(&[(Some(1), "a", 30)]);
        assert!(check_schema(TableKind::Events, &b).is_err());
    }
}
