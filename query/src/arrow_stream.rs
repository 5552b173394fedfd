//! A query's result as an Arrow C stream (`ArrowArrayStream` of the Arrow C data interface):
//! what pyarrow, pandas, polars and DuckDB read without copying (`__arrow_c_stream__` in the
//! Python module). Batches are pulled from DataFusion one at a time as the consumer asks, so a
//! large result never sits whole in memory.

use arrow::ffi_stream::FFI_ArrowArrayStream;
use datafusion::arrow::array::{RecordBatch, RecordBatchReader};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use std::time::Duration;
use tokio::runtime::Handle;

/// Asked while a batch is awaited: `Some(reason)` stops the query.
pub type InterruptCheck = Box<dyn Fn() -> Option<String> + Send>;

/// A DataFusion stream read synchronously, a batch per call, on `runtime`.
pub struct BlockingReader {
    stream: Option<SendableRecordBatchStream>,
    schema: SchemaRef,
    runtime: Handle,
    interrupt: Option<(InterruptCheck, Duration)>,
}

impl BlockingReader {
    pub fn new(stream: SendableRecordBatchStream, runtime: Handle) -> Self {
        BlockingReader {
            schema: stream.schema(),
            stream: Some(stream),
            runtime,
            interrupt: None,
        }
    }

    /// Asks `check` every `every` while a batch is awaited; when it gives a reason the query
    /// is dropped (DataFusion cancels its tasks), the read fails with that reason and the
    /// stream ends. How a caller's Ctrl-C stops a long query.
    pub fn interrupt_when(
        mut self,
        check: impl Fn() -> Option<String> + Send + 'static,
        every: Duration,
    ) -> Self {
        self.interrupt = Some((Box::new(check), every));
        self
    }
}

impl Iterator for BlockingReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let stream = self.stream.as_mut()?;
        let next = match &self.interrupt {
            None => self.runtime.block_on(stream.next()),
            Some((check, every)) => self.runtime.block_on(async {
                loop {
                    tokio::select! {
                        next = stream.next() => break next,
                        _ = tokio::time::sleep(*every) => {
                            if let Some(reason) = check() {
                                break Some(Err(datafusion::error::DataFusionError::Execution(reason)));
                            }
                        }
                    }
                }
            }),
        };
        match next {
            Some(Ok(batch)) => Some(Ok(batch)),
            Some(Err(e)) => {
                self.stream = None;
                Some(Err(ArrowError::ExternalError(Box::new(e))))
            }
            None => {
                self.stream = None;
                None
            }
        }
    }
}

impl RecordBatchReader for BlockingReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// The C stream of a reader: the consumer pulls batches (and owns the stream once taken).
pub fn c_stream(reader: impl RecordBatchReader + Send + 'static) -> FFI_ArrowArrayStream {
    FFI_ArrowArrayStream::new(Box::new(reader))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::ffi_stream::ArrowArrayStreamReader;
    use datafusion::prelude::SessionContext;

    #[test]
    fn a_query_read_through_the_c_stream_gives_its_batches() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let ctx = SessionContext::new();
        let stream = rt.block_on(async {
            ctx.sql("SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) AS t(n, s) ORDER BY n")
                .await
                .unwrap()
                .execute_stream()
                .await
                .unwrap()
        });
        let ffi = c_stream(BlockingReader::new(stream, rt.handle().clone()));
        // The consumer side, as pyarrow would read it.
        let reader = ArrowArrayStreamReader::try_new(ffi).unwrap();
        assert_eq!(reader.schema().fields().len(), 2);
        let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 3);
    }

    #[test]
    fn an_interrupt_stops_a_query_that_would_run_for_hours() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let ctx = SessionContext::new();
        let stream = rt.block_on(async {
            ctx.sql("SELECT sum(value % 7) FROM range(0, 100000000000000)")
                .await
                .unwrap()
                .execute_stream()
                .await
                .unwrap()
        });
        let started = std::time::Instant::now();
        let mut reader = BlockingReader::new(stream, rt.handle().clone()).interrupt_when(
            move || (started.elapsed() > Duration::from_millis(300)).then(|| "interrupted".into()),
            Duration::from_millis(20),
        );
        let err = reader.next().unwrap().unwrap_err();
        assert!(err.to_string().contains("interrupted"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(reader.next().is_none(), "the stream ends once interrupted");
    }
}
