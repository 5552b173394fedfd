//! Holding parsed event batches until they can be attributed and written.
//!
//! Attribution needs the whole file's host structure, so events wait for the end of the file.
//! Up to a memory budget they wait in memory; past it, every batch goes to an Arrow IPC stream
//! file in the store's staging area and is read back in order. Peak memory is then the budget
//! plus the parts being written, whatever the size of the trace.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;

/// In-memory bytes of parsed events kept before spilling to disk.
pub const DEFAULT_BUDGET: usize = 256 << 20;

pub struct Spool {
    budget: usize,
    memory: Vec<RecordBatch>,
    memory_bytes: usize,
    path: PathBuf,
    file: Option<StreamWriter<BufWriter<File>>>,
    rows: usize,
}

impl Spool {
    /// A spool that spills to `path` once more than `budget` bytes are held.
    pub fn new(path: PathBuf, budget: usize) -> Spool {
        Spool {
            budget,
            memory: Vec::new(),
            memory_bytes: 0,
            path,
            file: None,
            rows: 0,
        }
    }

    pub fn push(&mut self, batch: RecordBatch) -> std::io::Result<()> {
        self.rows += batch.num_rows();
        if self.file.is_none() {
            let size = batch.get_array_memory_size();
            if self.memory_bytes + size <= self.budget {
                self.memory_bytes += size;
                self.memory.push(batch);
                return Ok(());
            }
            let mut w = StreamWriter::try_new(
                BufWriter::with_capacity(1 << 20, File::create(&self.path)?),
                &batch.schema(),
            )
            .map_err(std::io::Error::other)?;
            for b in self.memory.drain(..) {
                w.write(&b).map_err(std::io::Error::other)?;
            }
            self.memory_bytes = 0;
            self.file = Some(w);
        }
        let w = self.file.as_mut().expect("spilling");
        w.write(&batch).map_err(std::io::Error::other)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    /// Every batch pushed, in order.
    pub fn drain(self) -> std::io::Result<Box<dyn Iterator<Item = std::io::Result<RecordBatch>>>> {
        match self.file {
            None => Ok(Box::new(self.memory.into_iter().map(Ok))),
            Some(mut w) => {
                w.finish().map_err(std::io::Error::other)?;
                drop(w);
                let reader = StreamReader::try_new(
                    BufReader::with_capacity(1 << 20, File::open(&self.path)?),
                    None,
                )
                .map_err(std::io::Error::other)?;
                // The file is unlinked now and freed once the reader is done with it.
                let _ = std::fs::remove_file(&self.path);
                Ok(Box::new(reader.map(|r| r.map_err(std::io::Error::other))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringDictionaryBuilder};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use std::sync::Arc;

    fn batch(start: i64, n: usize, label: &str) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                false,
            ),
        ]));
        let mut d = StringDictionaryBuilder::<Int32Type>::new();
        for _ in 0..n {
            d.append_value(label);
        }
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(start..start + n as i64)),
                Arc::new(d.finish()),
            ],
        )
        .unwrap()
    }

    #[test]
    fn spills_past_the_budget_and_returns_everything_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for budget in [usize::MAX, 0, 20_000] {
            let path = dir.path().join(format!("spool-{budget}"));
            let mut s = Spool::new(path.clone(), budget);
            for i in 0..10 {
                // Each batch has its own dictionary, as parse tasks produce them.
                s.push(batch(i * 1000, 1000, &format!("name{i}"))).unwrap();
            }
            assert_eq!(s.rows(), 10_000);
            assert_eq!(s.spilled(), budget != usize::MAX, "budget {budget}");
            let back: Vec<RecordBatch> = s.drain().unwrap().map(|b| b.unwrap()).collect();
            let values: Vec<i64> = back
                .iter()
                .flat_map(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap()
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(values, (0..10_000).collect::<Vec<_>>());
            assert_eq!(back.len(), 10);
            assert!(!path.exists(), "spill file left behind");
        }
    }
}
