//! Compaction: merges the small parts of a run into sorted parts of up to
//! [`COMPACTED_PART_ROWS`] rows. The parts are sorted already, so they are merged as streams
//! (a k-way merge reading [`MERGE_BATCH_ROWS`] rows of each part at a time, written through a
//! [`PartWriter`] as it goes): memory stays bounded whatever the size of the parts and of the
//! run.

use super::{StagedFile, StoreWriter};
use super::{AUTO_COMPACT_PARTS, COMPACTED_PART_ROWS, SMALL_PART_ROWS, TINY_PART_ROWS};
use crate::error::{Error, Result};
use crate::manifest::FileEntry;
use crate::part::{self, PartWriter};
use crate::run_id::RunId;
use crate::schema::TableKind;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::compute::{interleave_record_batch, SortOptions};
use datafusion::arrow::row::{OwnedRow, RowConverter, Rows, SortField};
use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Rows read from each part at a time, and rows gathered into each batch written.
pub const MERGE_BATCH_ROWS: usize = 4096;

/// Parts merged at once. A group of more parts is merged in passes (groups of this many into
/// scratch files, then those), so that the batches held and the files open stay bounded.
pub const MERGE_FAN_IN: usize = 16;

impl StoreWriter {
    /// Merges the small parts (under [`SMALL_PART_ROWS`] rows) of each table of `run` into
    /// sorted parts of up to [`COMPACTED_PART_ROWS`] rows, in one commit. The rows are the
    /// same, so every query answers the same; readers of the previous version keep reading
    /// its files, which are deleted after the grace period. Returns the number of files
    /// merged away (0 when there was nothing to merge).
    pub fn compact_run(&mut self, run: &RunId) -> Result<usize> {
        self.merge_small_parts(run, SMALL_PART_ROWS)
    }

    /// Merges the parts of `run` under `below` rows, table by table, into sorted parts of up
    /// to [`COMPACTED_PART_ROWS`] rows in one commit; the number of files merged away.
    fn merge_small_parts(&mut self, run: &RunId, below: u64) -> Result<usize> {
        // The parts are merged without the store's lock: from the newest version now, and
        // committed only if the run still has them all then.
        self.refresh()?;
        let entry = self
            .base
            .runs
            .get(run)
            .ok_or_else(|| Error::UnknownRun(run.to_string()))?
            .clone();
        let mut staged = Vec::new();
        let mut merged: HashSet<String> = HashSet::new();
        for table in TableKind::ALL {
            let small: Vec<&FileEntry> = entry
                .files
                .iter()
                .filter(|f| f.table == table && f.rows < below)
                .collect();
            if small.len() < 2 {
                continue;
            }
            // Groups of consecutive small files up to COMPACTED_PART_ROWS rows each, one part
            // each.
            let mut groups: Vec<Vec<&FileEntry>> = vec![Vec::new()];
            let mut rows = 0;
            for f in small {
                if rows + f.rows > COMPACTED_PART_ROWS
                    && !groups.last().expect("a group").is_empty()
                {
                    groups.push(Vec::new());
                    rows = 0;
                }
                rows += f.rows;
                groups.last_mut().expect("a group").push(f);
            }
            for group in groups.into_iter().filter(|g| g.len() > 1) {
                let paths = group
                    .iter()
                    .map(|f| self.store.file_path(&self.base, &f.path))
                    .collect();
                staged.push(self.merge_parts(table, paths)?);
                merged.extend(group.iter().map(|f| f.path.clone()));
            }
        }
        if merged.is_empty() {
            return Ok(0);
        }
        let n = merged.len();
        Ok(if self.commit_merged(run, &merged, staged)? {
            n
        } else {
            0
        })
    }

    /// Commits `staged` in place of the parts `merged` of `run`, unless another writer
    /// replaced or compacted the run since they were read (the merge is then stale, and its
    /// files are dropped). Whether it committed.
    pub(super) fn commit_merged(
        &mut self,
        run: &RunId,
        merged: &HashSet<String>,
        staged: Vec<StagedFile>,
    ) -> Result<bool> {
        let committed = self.commit(|w, next| {
            let still_there = next.runs.get(run).is_some_and(|e| {
                let paths: HashSet<&str> = e.files.iter().map(|f| f.path.as_str()).collect();
                merged.iter().all(|p| paths.contains(p.as_str()))
            });
            if !still_there {
                return Ok(None);
            }
            let placed = w.place(next, run, staged)?;
            let entry = Arc::make_mut(next.runs.get_mut(run).expect("run checked above"));
            entry.files.retain(|f| !merged.contains(&f.path));
            entry.files.extend(placed);
            Ok(Some(merged.iter().cloned().collect()))
        })?;
        if committed.is_none() {
            self.staging.clear();
        }
        Ok(committed.is_some())
    }

    /// Compacts `run` when it has more than [`AUTO_COMPACT_PARTS`] parts under
    /// [`TINY_PART_ROWS`] rows in a table (e.g. after many appends of one step each), merging
    /// those parts only. A merge that is still tiny is merged again with the next ones; once
    /// a part has [`TINY_PART_ROWS`] rows it is left as it is, so each row is rewritten a
    /// bounded number of times however many appends a run receives (merging every small part
    /// each time rewrote the whole run every few appends).
    pub fn compact_if_fragmented(&mut self, run: &RunId) -> Result<usize> {
        let Some(entry) = self.base.runs.get(run) else {
            return Ok(0);
        };
        let fragmented = TableKind::ALL.iter().any(|t| {
            entry
                .files
                .iter()
                .filter(|f| f.table == *t && f.rows < TINY_PART_ROWS)
                .count()
                > AUTO_COMPACT_PARTS
        });
        if fragmented {
            self.merge_small_parts(run, TINY_PART_ROWS)
        } else {
            Ok(0)
        }
    }

    /// Merges the sorted parts at `paths` (in this order) into one staged part. Rows of equal
    /// sort keys keep the order of their parts and, within a part, their own: the part is
    /// the one a stable sort of all the rows would give. More than [`MERGE_FAN_IN`] parts are
    /// merged in passes through scratch files, consecutive parts together, which keeps that
    /// order.
    fn merge_parts(&self, table: TableKind, paths: Vec<PathBuf>) -> Result<StagedFile> {
        let mut inputs = paths;
        let mut scratch: Vec<PathBuf> = Vec::new();
        let mut pass = 0;
        while inputs.len() > MERGE_FAN_IN {
            pass += 1;
            let mut next = Vec::new();
            for (i, chunk) in inputs.chunks(MERGE_FAN_IN).enumerate() {
                if let [one] = chunk {
                    next.push(one.clone());
                    continue;
                }
                let seq = self.next_staged.load(Ordering::SeqCst);
                let path = self.scratch_path(&format!("merge-{seq:010}-{pass}-{i}.parquet"));
                let mut out = PartWriter::create(table, &path)?;
                scratch.push(path.clone());
                merge_sorted(table, chunk, &mut out)?;
                out.finish()?;
                next.push(path);
            }
            // The scratch files of the pass before are merged into this pass's.
            scratch.retain(|p| {
                let merged = inputs.contains(p);
                if merged {
                    let _ = fs::remove_file(p);
                }
                !merged
            });
            inputs = next;
        }
        let seq = self.next_staged.fetch_add(1, Ordering::SeqCst);
        let staged_path = self.scratch_path(&format!("part-{seq:010}.parquet"));
        let mut out = PartWriter::create(table, &staged_path)?;
        merge_sorted(table, &inputs, &mut out)?;
        let written = out.finish()?;
        for done in scratch {
            let _ = fs::remove_file(done);
        }
        Ok(StagedFile::new(table, seq, staged_path, written))
    }
}

/// One sorted input of a merge: its current batch and that batch's sort keys.
struct Input {
    path: PathBuf,
    batches: Box<dyn Iterator<Item = Result<RecordBatch>>>,
    /// Sort keys of the current batch in Arrow's row format (compared as bytes).
    keys: Rows,
    /// The current batch's index among the batches the merge holds.
    slot: usize,
    /// The next row of the current batch.
    pos: usize,
    /// Rows of this input before the current batch (for errors).
    rows_before: usize,
}

impl Input {
    fn head(&self) -> datafusion::arrow::row::Row<'_> {
        self.keys.row(self.pos)
    }
}

/// Merges the sorted parts at `paths` into `out`, a batch of each at a time. Ties go to the
/// earlier part. A part whose rows are out of order is an error naming it (the merge would
/// silently write unsorted rows).
fn merge_sorted(table: TableKind, paths: &[PathBuf], out: &mut PartWriter) -> Result<()> {
    let schema = table.file_schema();
    let sort_columns = table.sort_columns();
    let converter = RowConverter::new(
        sort_columns
            .iter()
            .map(|name| {
                let field = schema.field_with_name(name)?;
                Ok(SortField::new_with_options(
                    field.data_type().clone(),
                    SortOptions {
                        descending: false,
                        nulls_first: true,
                    },
                ))
            })
            .collect::<Result<Vec<_>>>()?,
    )?;
    let keys_of = |batch: &RecordBatch| -> Result<Rows> {
        let columns: Vec<ArrayRef> = sort_columns
            .iter()
            .map(|name| {
                batch
                    .column_by_name(name)
                    .cloned()
                    .ok_or_else(|| Error::Schema {
                        table: table.name(),
                        reason: format!("missing column {name}"),
                    })
            })
            .collect::<Result<_>>()?;
        Ok(converter.convert_columns(&columns)?)
    };
    // The batches that rows to be gathered may come from: each input's current one, and
    // those finished since the last gather.
    let mut held: Vec<RecordBatch> = Vec::new();
    let mut inputs: Vec<Input> = Vec::new();
    for path in paths {
        let mut batches: Box<dyn Iterator<Item = Result<RecordBatch>>> =
            Box::new(part::read_parquet_batches(table, path, MERGE_BATCH_ROWS)?);
        if let Some(batch) = next_non_empty(&mut batches)? {
            inputs.push(Input {
                path: path.clone(),
                batches,
                keys: keys_of(&batch)?,
                slot: held.len(),
                pos: 0,
                rows_before: 0,
            });
            held.push(batch);
        }
    }
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(MERGE_BATCH_ROWS);
    while !inputs.is_empty() {
        // Few inputs (at most MERGE_FAN_IN): a scan finds the smallest head as fast as a heap.
        let mut best = 0;
        for i in 1..inputs.len() {
            if inputs[i].head() < inputs[best].head() {
                best = i;
            }
        }
        let input = &mut inputs[best];
        order.push((input.slot, input.pos));
        input.pos += 1;
        if input.pos < input.keys.num_rows() {
            if input.keys.row(input.pos) < input.keys.row(input.pos - 1) {
                return Err(unsorted(input, input.rows_before + input.pos));
            }
        } else {
            let last: OwnedRow = input.keys.row(input.pos - 1).owned();
            input.rows_before += input.pos;
            match next_non_empty(&mut input.batches)? {
                Some(batch) => {
                    input.keys = keys_of(&batch)?;
                    input.pos = 0;
                    if input.keys.row(0) < last.row() {
                        return Err(unsorted(input, input.rows_before));
                    }
                    input.slot = held.len();
                    held.push(batch);
                }
                // `remove`, not `swap_remove`: ties go by input order.
                None => drop(inputs.remove(best)),
            }
        }
        if order.len() == MERGE_BATCH_ROWS || inputs.is_empty() {
            note_rows_held(&held, order.len());
            let refs: Vec<&RecordBatch> = held.iter().collect();
            out.write(&interleave_record_batch(&refs, &order)?)?;
            order.clear();
            // Keep only the inputs' current batches.
            let current: Vec<RecordBatch> = inputs
                .iter_mut()
                .enumerate()
                .map(|(slot, input)| {
                    let batch = held[input.slot].clone();
                    input.slot = slot;
                    batch
                })
                .collect();
            held = current;
        }
    }
    Ok(())
}

fn next_non_empty(
    batches: &mut dyn Iterator<Item = Result<RecordBatch>>,
) -> Result<Option<RecordBatch>> {
    for batch in batches {
        let batch = batch?;
        if batch.num_rows() > 0 {
            return Ok(Some(batch));
        }
    }
    Ok(None)
}

fn unsorted(input: &Input, row: usize) -> Error {
    Error::DamagedFile {
        path: input.path.clone(),
        reason: format!(
            "is not sorted by its table's key: row {row} sorts before the row before it"
        ),
    }
}

#[cfg(test)]
thread_local! {
    /// The most rows the merges of this thread held at once (the batches read and the rows
    /// gathered from them), for tests of the memory bound.
    pub(super) static PEAK_ROWS_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn note_rows_held(held: &[RecordBatch], gathered: usize) {
    #[cfg(test)]
    {
        let rows = held.iter().map(|b| b.num_rows()).sum::<usize>() + gathered;
        PEAK_ROWS_HELD.with(|peak| peak.set(peak.get().max(rows)));
    }
    let _ = (held, gathered);
}

#[cfg(test)]
mod tests;
