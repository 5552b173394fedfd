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
use tokio::runtime::Handle;

/// A DataFusion stream read synchronously, a batch per call, on `runtime`.
pub struct BlockingReader {
    stream: SendableRecordBatchStream,
    runtime: Handle,
}

impl BlockingReader {
    pub fn new(stream: SendableRecordBatchStream, runtime: Handle) -> Self {
        BlockingReader { stream, runtime }
    }
}

impl Iterator for BlockingReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.runtime.block_on(self.stream.next())?;
        Some(next.map_err(|e| ArrowError::ExternalError(Box::new(e))))
    }
}

impl RecordBatchReader for BlockingReader {
    fn schema(&self) -> SchemaRef {
        self.stream.schema()
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
}
