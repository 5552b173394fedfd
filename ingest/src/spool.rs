//! Holding parsed event batches until they can be attributed and written.
//!
//! Attribution needs the whole file's host structure, so events wait for the end of the file.
//! They wait as [`Frame`]s: a batch as Arrow IPC without its all-null columns, compressed
//! with lz4 in 64 KB chunks as the IPC is written (parsed columns are small integers and
//! repetitive JSON text, so a frame is several times smaller than its batch; zstd's better
//! ratio cost three times the CPU), encoded a core's worth at a time in parallel. Up to a
//! memory budget of frame bytes they wait in memory; past it every frame goes to a file in the
//! store's staging area and is read back in order. Peak memory is then the budget plus the
//! parts being written, whatever the size of the trace.
//!
//! An Nsight Systems export skips the wait for its GPU tables: they are read after the host
//! tables, when their launches are known, and go straight to attribution and Parquet parts
//! (`nsys::GpuTables`, `driver::finish_file`); only its host rows are spooled, sorted into
//! windows of one process and a stretch of time ([`Spool::set_windows`]) that are attributed
//! one at a time, so that attribution too needs memory for one window, not the whole file.
//! A Kineto trace too large to attribute at once is read back from its spool twice
//! ([`Spool::into_replay`]): its host rows go to a second spool by window of time (chosen
//! from a [`RowSample`](crate::attribute::windows::RowSample)), then its GPU rows are attributed.

use crate::attribute::windows::{window_of, FIRST_WINDOW};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::kernels::aggregate;
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::StreamDecoder;
use datafusion::arrow::ipc::writer::StreamWriter;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::LazyLock;
use twox_hash::XxHash3_64;

/// Default budget of frame (compressed) bytes held in memory: about 1.2 GB of parsed events,
/// the frames of a ~1.3 GB Kineto trace. Spilling costs little CPU but not nothing: with a
/// 64 MB budget, the copy into the page cache was 3 % of a 1.09 GB trace's ingest; not
/// spilling it costs ~50 MB more peak memory (~130 MB on a 6 GB trace, whose two spools each
/// have this budget). The rest of the memory is kept for the attribution index, which grows
/// with the trace.
pub const DEFAULT_BUDGET: usize = 192 << 20;

fn other(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

/// One batch, as compressed Arrow IPC. Columns that are null in every row (most of them in a
/// batch of host events: device, stream, geometry, bytes, ...) are left out and rebuilt as
/// nulls on decoding, instead of being encoded, compressed and decompressed as zeros.
#[derive(Clone)]
pub struct Frame {
    rows: usize,
    ipc_len: usize,
    /// Bit `i` set: column `i` of `schema` is in the IPC bytes.
    present: u64,
    schema: SchemaRef,
    bytes: Vec<u8>,
}

/// Of a spilled frame's header fields (`header`: rows, lengths, columns present) and bytes:
/// lz4 blocks carry no checksum, and a damaged spill file must be an error, not a wrong batch
/// or an allocation of a damaged length. Frames held in memory need none.
fn checksum(header: &[u8], bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot_with_seed(XxHash3_64::oneshot(header), bytes)
}

/// Bytes of IPC compressed as one lz4 block. The IPC writer's output is compressed as it is
/// written, a chunk at a time while the chunk is in cache, instead of being gathered whole
/// (tens of MB per frame, in fresh pages) and compressed afterwards. Under 64 KB, lz4 uses its
/// table of 16-bit positions.
const LZ4_CHUNK: usize = (64 << 10) - 1;

/// An [`io::Write`] that lz4-compresses what it is given in chunks of [`LZ4_CHUNK`] bytes,
/// each stored as its compressed length (u32, little-endian) and its block.
struct Lz4Chunks {
    /// The start of the next chunk, when it came in smaller pieces.
    pending: Vec<u8>,
    compressed: Compressed,
}

/// The chunks compressed so far.
struct Compressed {
    block: Vec<u8>,
    table: lz4_flex::block::CompressTable,
    out: Vec<u8>,
    /// Uncompressed bytes in `out`.
    len: usize,
}

impl Compressed {
    fn push(&mut self, chunk: &[u8]) -> io::Result<()> {
        let n = lz4_flex::block::compress_into_with_table(chunk, &mut self.block, &mut self.table)
            .map_err(other)?;
        self.out.extend_from_slice(&(n as u32).to_le_bytes());
        self.out.extend_from_slice(&self.block[..n]);
        self.len += chunk.len();
        Ok(())
    }
}

impl Lz4Chunks {
    fn new(expected_out: usize) -> Lz4Chunks {
        Lz4Chunks {
            pending: Vec::with_capacity(LZ4_CHUNK),
            compressed: Compressed {
                block: vec![0; lz4_flex::block::get_maximum_output_size(LZ4_CHUNK)],
                table: lz4_flex::block::CompressTable::small(),
                out: Vec::with_capacity(expected_out),
                len: 0,
            },
        }
    }

    /// The uncompressed length and the chunks.
    fn finish(mut self) -> io::Result<(usize, Vec<u8>)> {
        if !self.pending.is_empty() {
            self.compressed.push(&self.pending)?;
        }
        let Compressed { mut out, len, .. } = self.compressed;
        out.shrink_to_fit();
        Ok((len, out))
    }
}

impl Write for Lz4Chunks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        while !rest.is_empty() {
            if self.pending.is_empty() && rest.len() >= LZ4_CHUNK {
                // Whole chunks of a large buffer are compressed where they are.
                let (chunk, tail) = rest.split_at(LZ4_CHUNK);
                self.compressed.push(chunk)?;
                rest = tail;
                continue;
            }
            let take = (LZ4_CHUNK - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() == LZ4_CHUNK {
                self.compressed.push(&self.pending)?;
                self.pending.clear();
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The `len` bytes that [`Lz4Chunks`] compressed into `bytes`.
fn lz4_chunks_decompress(bytes: &[u8], len: usize) -> io::Result<Vec<u8>> {
    let damaged =
        |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("spool frame: {what}"));
    let mut out = vec![0u8; len];
    let (mut at, mut rest) = (0, bytes);
    while at < len {
        let (head, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| damaged("cut short"))?;
        let n = u32::from_le_bytes(*head) as usize;
        let block = tail.get(..n).ok_or_else(|| damaged("cut short"))?;
        let end = (at + LZ4_CHUNK).min(len);
        let got = lz4_flex::block::decompress_into(block, &mut out[at..end])
            .map_err(|e| damaged(&e.to_string()))?;
        if got != end - at {
            return Err(damaged("a chunk of the wrong length"));
        }
        at = end;
        rest = &tail[n..];
    }
    if !rest.is_empty() {
        return Err(damaged("bytes after the last chunk"));
    }
    Ok(out)
}

impl Frame {
    pub fn encode(batch: &RecordBatch) -> io::Result<Frame> {
        let schema = batch.schema();
        if schema.fields().len() > 64 {
            return Err(io::Error::other("a spool frame holds at most 64 columns"));
        }
        let rows = batch.num_rows();
        let mut present = 0u64;
        let mut kept = Vec::new();
        for (i, column) in batch.columns().iter().enumerate() {
            if rows == 0 || column.null_count() < rows {
                present |= 1 << i;
                kept.push(i);
            }
        }
        let projected = batch.project(&kept).map_err(other)?;
        let mut sink = Lz4Chunks::new(projected.get_array_memory_size() / 3);
        let mut w = StreamWriter::try_new(&mut sink, &projected.schema()).map_err(other)?;
        w.write(&projected).map_err(other)?;
        w.finish().map_err(other)?;
        drop(w);
        let (ipc_len, bytes) = sink.finish()?;
        Ok(Frame {
            rows,
            ipc_len,
            present,
            schema,
            bytes,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn decode(&self) -> io::Result<RecordBatch> {
        let ipc = lz4_chunks_decompress(&self.bytes, self.ipc_len)?;
        // The batch's buffers are slices of the decompressed bytes: no further copy.
        let mut buffer = Buffer::from_vec(ipc);
        let mut decoder = StreamDecoder::new();
        while !buffer.is_empty() {
            if let Some(batch) = decoder.decode(&mut buffer).map_err(other)? {
                return self.widen(batch);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "spool frame without a batch",
        ))
    }

    /// The decoded columns, with the all-null ones put back.
    fn widen(&self, decoded: RecordBatch) -> io::Result<RecordBatch> {
        if decoded.num_rows() != self.rows {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "spool frame with a wrong number of rows",
            ));
        }
        let mut stored = decoded.columns().iter();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (i, field) in self.schema.fields().iter().enumerate() {
            if self.present & (1 << i) != 0 {
                let column = stored.next().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "spool frame misses a column")
                })?;
                columns.push(column.clone());
            } else {
                columns.push(crate::columns::null_column(field.data_type(), self.rows));
            }
        }
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Bytes [`Self::write_to`] writes.
    fn stored_len(&self) -> u64 {
        40 + self.bytes.len() as u64
    }

    fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut header = [0u8; 40];
        for (i, n) in [
            self.rows as u64,
            self.ipc_len as u64,
            self.bytes.len() as u64,
            self.present,
        ]
        .into_iter()
        .enumerate()
        {
            header[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
        }
        let sum = checksum(&header[..32], &self.bytes);
        header[32..].copy_from_slice(&sum.to_le_bytes());
        w.write_all(&header)?;
        w.write_all(&self.bytes)
    }

    /// The next frame of a spill file (which holds a known number of them: a short file is an
    /// error, never a silently shorter run) of batches of `schema`.
    fn read_from(r: &mut impl Read, schema: &SchemaRef) -> io::Result<Frame> {
        let mut header = [0u8; 40];
        r.read_exact(&mut header)?;
        let field =
            |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        // `read_to_end` fills the capacity without zeroing it first.
        let len = field(2) as usize;
        // A damaged length must fail as a short read, not as an allocation of that size.
        let mut bytes = Vec::with_capacity(len.min(1 << 28));
        if r.take(len as u64).read_to_end(&mut bytes)? != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if checksum(&header[..32], &bytes) != field(4) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "damaged spill file (a frame's checksum does not match)",
            ));
        }
        Ok(Frame {
            rows: field(0) as usize,
            ipc_len: field(1) as usize,
            present: field(3),
            schema: schema.clone(),
            bytes,
        })
    }
}

/// Cores to encode frames on, found once: `available_parallelism` reads the affinity mask and
/// the cgroup's CPU quota files each time (about 20 system calls), and every push asks.
fn cores() -> usize {
    static CORES: LazyLock<usize> =
        LazyLock::new(|| std::thread::available_parallelism().map_or(2, |n| n.get().max(2)));
    *CORES
}

pub struct Spool {
    budget: usize,
    /// Encoder threads, started with the first batch.
    pool: Option<rayon::ThreadPool>,
    /// Batches waiting to be encoded together, with their time window.
    pending: Vec<(u32, RecordBatch)>,
    memory: Vec<(u32, Frame)>,
    memory_bytes: usize,
    path: PathBuf,
    file: Option<BufWriter<File>>,
    /// Frames written to `file`: their time window and byte offset.
    spilled: Vec<(u32, u64)>,
    spilled_bytes: u64,
    rows: usize,
    /// Schema of the batches (of the first one; every batch of a spool has it).
    schema: Option<SchemaRef>,
    /// Where the windows start, as (process, time) ([`Self::set_windows`]); the first is
    /// [`FIRST_WINDOW`].
    windows: Vec<(i64, i64)>,
    /// Whether rows go to windows by their process, or all as process 0.
    windows_by_process: bool,
}

impl Spool {
    pub fn new(path: PathBuf, budget: usize) -> Spool {
        Spool {
            budget,
            pool: None,
            pending: Vec::new(),
            memory: Vec::new(),
            memory_bytes: 0,
            path,
            file: None,
            spilled: Vec::new(),
            spilled_bytes: 0,
            rows: 0,
            schema: None,
            windows: vec![FIRST_WINDOW],
            windows_by_process: true,
        }
    }

    /// Sorts the rows pushed from now on into windows by their process and time: a row goes
    /// to the last window whose start `(process, time)` is not after its `(pid, ts)` (a null
    /// pid sorts first). Without `by_process`, every row counts as process 0: windows go by
    /// time alone. `starts` must rise; a first window from the very beginning is added. The
    /// windows come back one at a time ([`Self::into_windows`]).
    pub fn set_windows(&mut self, mut starts: Vec<(i64, i64)>, by_process: bool) {
        debug_assert!(starts.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(self.rows == 0, "windows are set before the first batch");
        if starts.first() != Some(&FIRST_WINDOW) {
            starts.insert(0, FIRST_WINDOW);
        }
        self.windows = starts;
        self.windows_by_process = by_process;
    }

    pub fn push(&mut self, batch: RecordBatch) -> io::Result<()> {
        self.rows += batch.num_rows();
        self.schema.get_or_insert_with(|| batch.schema());
        if self.windows.len() <= 1 {
            self.pending.push((0, batch));
        } else {
            self.split_into_windows(batch)?;
        }
        if self.pending.len() >= cores() {
            self.encode_pending()?;
        }
        Ok(())
    }

    fn split_into_windows(&mut self, batch: RecordBatch) -> io::Result<()> {
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .ok_or_else(|| io::Error::other(format!("windows need an Int64 {name} column")))
        };
        let ts = column("ts")?;
        let window_of = |p: i64, t: i64| window_of(&self.windows, p, t) as u32;
        let (Some(first), Some(last)) = (aggregate::min(ts), aggregate::max(ts)) else {
            return Ok(());
        };
        let by_time;
        let pid = if self.windows_by_process {
            column("pid")?
        } else {
            by_time = Int64Array::from(vec![0; batch.num_rows()]);
            &by_time
        };
        // Rows come in runs of one process and rising time: a batch usually falls in one window.
        if pid.null_count() == 0 {
            if let (Some(p), Some(q)) = (aggregate::min(pid), aggregate::max(pid)) {
                if p == q && window_of(p, first) == window_of(p, last) {
                    self.pending.push((window_of(p, first), batch));
                    return Ok(());
                }
            }
        }
        let window: Vec<u32> = (0..batch.num_rows())
            .map(|i| {
                let p = if pid.is_valid(i) {
                    pid.value(i)
                } else {
                    i64::MIN
                };
                window_of(p, ts.value(i))
            })
            .collect();
        // Windows in rising order along the batch: one slice (no copy) per window.
        if window.windows(2).all(|w| w[0] <= w[1]) {
            let mut start = 0;
            while start < window.len() {
                let len = window[start..].partition_point(|&w| w == window[start]);
                self.pending.push((window[start], batch.slice(start, len)));
                start += len;
            }
            return Ok(());
        }
        let mut rows: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, &w) in window.iter().enumerate() {
            rows.entry(w).or_default().push(i as u32);
        }
        for (w, indices) in rows {
            let part = take_record_batch(&batch, &UInt32Array::from(indices)).map_err(other)?;
            self.pending.push((w, part));
        }
        Ok(())
    }

    /// Encodes the pending batches in parallel on the spool's own threads, not on rayon's
    /// global pool: adapters may push from a thread whose global-pool tasks are blocked on a
    /// full channel. The threads live as long as the spool (short-lived threads would each
    /// get a malloc arena of their own, and the arenas' free memory counts as resident).
    fn encode_pending(&mut self) -> io::Result<()> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(());
        }
        if self.pool.is_none() {
            self.pool = Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(cores())
                    .thread_name(|i| format!("gpuq-spool-{i}"))
                    .build()
                    .map_err(other)?,
            );
        }
        let pool = self.pool.as_ref().expect("built above");
        let frames = pool.install(|| {
            pending
                .par_iter()
                .map(|(w, b)| Ok((*w, Frame::encode(b)?)))
                .collect::<io::Result<Vec<_>>>()
        })?;
        drop(pending);
        for (window, frame) in frames {
            self.keep(window, frame)?;
        }
        Ok(())
    }

    fn keep(&mut self, window: u32, frame: Frame) -> io::Result<()> {
        if self.file.is_none() {
            if self.memory_bytes + frame.bytes.len() <= self.budget {
                self.memory_bytes += frame.bytes.len();
                self.memory.push((window, frame));
                return Ok(());
            }
            self.file = Some(BufWriter::with_capacity(1 << 20, File::create(&self.path)?));
            for (w, f) in std::mem::take(&mut self.memory) {
                self.spill(w, &f)?;
            }
            self.memory_bytes = 0;
        }
        self.spill(window, &frame)
    }

    fn spill(&mut self, window: u32, frame: &Frame) -> io::Result<()> {
        frame.write_to(self.file.as_mut().expect("spilling"))?;
        self.spilled.push((window, self.spilled_bytes));
        self.spilled_bytes += frame.stored_len();
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    #[cfg(test)]
    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    /// Encodes what is pending; the spill file, if any, flushed, opened for reading and
    /// unlinked (it lives as long as the handle).
    fn finish(&mut self) -> io::Result<Option<File>> {
        self.encode_pending()?;
        let Some(w) = self.file.take() else {
            return Ok(None);
        };
        w.into_inner().map_err(|e| e.into_error())?;
        let file = File::open(&self.path)?;
        let _ = std::fs::remove_file(&self.path);
        Ok(Some(file))
    }

    /// Every frame, in the order pushed.
    pub fn drain(self) -> io::Result<Box<dyn Iterator<Item = io::Result<Frame>> + Send>> {
        let replay = self.into_replay()?;
        match replay.file {
            None => Ok(Box::new(replay.memory.into_iter().map(Ok))),
            Some(file) => Ok(Box::new(read_frames(file, replay.count, replay.schema))),
        }
    }

    /// The frames, to be read as often as needed ([`Replay::frames`]).
    pub fn into_replay(mut self) -> io::Result<Replay> {
        let file = self.finish()?;
        Ok(Replay {
            memory: self.memory.drain(..).map(|(_, f)| f).collect(),
            count: self.spilled.len(),
            file,
            schema: self.schema.clone(),
        })
    }

    /// The frames by window ([`Self::set_windows`]).
    pub fn into_windows(mut self) -> io::Result<Windows> {
        let file = self.finish()?;
        let count = self.windows.len();
        let mut memory: Vec<Vec<Frame>> = (0..count).map(|_| Vec::new()).collect();
        for (w, f) in std::mem::take(&mut self.memory) {
            memory[w as usize].push(f);
        }
        let mut spilled: Vec<Vec<u64>> = vec![Vec::new(); count];
        for &(w, offset) in &self.spilled {
            spilled[w as usize].push(offset);
        }
        Ok(Windows {
            starts: std::mem::take(&mut self.windows),
            memory,
            spilled,
            file,
            schema: self.schema.clone(),
        })
    }
}

/// The `count` frames of a spill file from its start.
fn read_frames<R: Read + Seek + Send>(
    file: R,
    count: usize,
    schema: Option<SchemaRef>,
) -> impl Iterator<Item = io::Result<Frame>> + Send {
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut started = false;
    (0..count).map(move |_| {
        if !std::mem::replace(&mut started, true) {
            reader.seek(SeekFrom::Start(0))?;
        }
        let schema = schema
            .as_ref()
            .ok_or_else(|| io::Error::other("spilled frames without a schema"))?;
        Frame::read_from(&mut reader, schema)
    })
}

/// A spool's frames in the order pushed, readable more than once (an input read in passes).
pub struct Replay {
    /// The frames, when none was spilled.
    memory: Vec<Frame>,
    /// The spill file (already unlinked) and its number of frames.
    file: Option<File>,
    count: usize,
    schema: Option<SchemaRef>,
}

impl Replay {
    /// Bytes of the frames held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.memory.iter().map(|f| f.bytes.len()).sum()
    }

    /// Every frame, in the order pushed (`&mut`: one reader of the spill file at a time).
    pub fn frames(&mut self) -> Box<dyn Iterator<Item = io::Result<Frame>> + Send + '_> {
        match &self.file {
            None => Box::new(self.memory.iter().map(|f| Ok(f.clone()))),
            Some(file) => Box::new(read_frames(file, self.count, self.schema.clone())),
        }
    }
}

/// A spool's frames by window, taken one window at a time.
pub struct Windows {
    /// Where each window starts: (process, time).
    starts: Vec<(i64, i64)>,
    memory: Vec<Vec<Frame>>,
    /// Offsets in `file` of each window's spilled frames.
    spilled: Vec<Vec<u64>>,
    file: Option<File>,
    schema: Option<SchemaRef>,
}

impl Windows {
    /// Where each window starts: (process, time).
    pub fn starts(&self) -> &[(i64, i64)] {
        &self.starts
    }

    /// The window a row of `process` at `ts` went to (`process` 0 when windows go by time).
    pub fn window_of(&self, process: i64, ts: i64) -> usize {
        window_of(&self.starts, process, ts)
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// The frames of window `i`, in the order pushed (each window can be taken once).
    pub fn take(&mut self, i: usize) -> io::Result<Vec<Frame>> {
        let mut frames = std::mem::take(&mut self.memory[i]);
        for &offset in &std::mem::take(&mut self.spilled[i]) {
            let (Some(file), Some(schema)) = (&self.file, &self.schema) else {
                return Err(io::Error::other("spilled frames without a spill file"));
            };
            let mut reader = BufReader::with_capacity(1 << 16, file);
            reader.seek(SeekFrom::Start(offset))?;
            frames.push(Frame::read_from(&mut reader, schema)?);
        }
        Ok(frames)
    }
}

#[cfg(test)]
mod tests;
