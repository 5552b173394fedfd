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
//! from a [`RowSample`]), then its GPU rows are attributed.

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
                columns.push(crate::events::null_column(field.data_type(), self.rows));
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

/// Where the first window starts: before every (process, time), a null pid included.
const FIRST_WINDOW: (i64, i64) = (i64::MIN, i64::MIN);

/// The window of `starts` (rising, the first [`FIRST_WINDOW`]) that a row of `process` at
/// `ts` goes to: the last that starts at or before it.
#[inline]
fn window_of(starts: &[(i64, i64)], process: i64, ts: i64) -> usize {
    starts.partition_point(|&start| start <= (process, ts)) - 1
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

/// Where windows of about `rows` rows start, from a sample of the rows' `(time, weight)` by
/// process (`i64::MIN`: rows without one), for [`Spool::set_windows`]. A process with few rows
/// joins the window before it; every other process starts a window of its own.
pub fn window_starts(samples: BTreeMap<i64, Vec<(i64, f64)>>, rows: usize) -> Vec<(i64, i64)> {
    let rows = rows.max(1) as f64;
    let mut starts: Vec<(i64, i64)> = vec![FIRST_WINDOW];
    // Estimated rows of the last window so far.
    let mut last_window = 0.0;
    for (process, mut times) in samples {
        let weight: f64 = times.iter().map(|&(_, w)| w).sum();
        if last_window + weight <= rows * 1.5 {
            // Few rows: they join the window before (rows without a process: the first).
            last_window += weight;
            continue;
        }
        times.sort_unstable_by_key(|&(t, _)| t);
        let count = (weight / rows).round().max(1.0);
        if process != i64::MIN {
            starts.push((process, i64::MIN));
        }
        let mut seen = 0.0;
        let mut next = 1.0;
        let mut since = 0.0;
        for &(t, w) in &times {
            if next < count && seen >= weight * next / count {
                if starts.last().is_some_and(|&last| last < (process, t)) {
                    starts.push((process, t));
                    since = 0.0;
                }
                next += 1.0;
            }
            seen += w;
            since += w;
        }
        last_window = since;
    }
    starts
}

/// Entries of a [`RowSample`] at most.
const SAMPLE_CAP: usize = 1 << 16;

/// A sample of rows' `(process, time)` as they stream past, of bounded size: one row in
/// `stride` on average, the stride doubling (and every other entry dropped) whenever the
/// sample is full. The gaps between sampled rows are random (1 to `2 * stride - 1`), so that
/// rows repeating in a pattern (every other row GPU work, say) are not sampled in step with it.
/// Windows are chosen from it ([`window_starts`]) when rows come in no useful order.
pub struct RowSample {
    entries: Vec<(i64, i64)>,
    stride: u64,
    /// Rows to pass before the next entry.
    skip: u64,
    /// xorshift64 state.
    random: u64,
}

impl Default for RowSample {
    fn default() -> Self {
        RowSample {
            entries: Vec::new(),
            stride: 1,
            skip: 0,
            random: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl RowSample {
    /// Counts `rows` rows, calling `row(i)` for those sampled (`i` from 0, rising): its
    /// `(process, time)`, or `None` for a row not to count in windows (e.g. GPU work).
    pub fn add(&mut self, rows: usize, mut row: impl FnMut(usize) -> Option<(i64, i64)>) {
        let mut i = self.skip;
        while (i as usize) < rows {
            if let Some(entry) = row(i as usize) {
                self.entries.push(entry);
            }
            if self.entries.len() >= SAMPLE_CAP {
                let mut keep = false;
                self.entries.retain(|_| {
                    keep = !keep;
                    keep
                });
                self.stride *= 2;
            }
            i += 1 + self.next_skip();
        }
        self.skip = i - rows as u64;
    }

    /// Rows to pass: uniform in `0..2 * stride - 1`, so one row in `stride` on average.
    fn next_skip(&mut self) -> u64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        x % (2 * self.stride - 1)
    }

    /// The sample by process, each entry standing for `stride` rows.
    pub fn by_process(&self) -> BTreeMap<i64, Vec<(i64, f64)>> {
        let mut samples: BTreeMap<i64, Vec<(i64, f64)>> = BTreeMap::new();
        for &(process, t) in &self.entries {
            samples
                .entry(process)
                .or_default()
                .push((t, self.stride as f64));
        }
        samples
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

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
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
mod tests {
    use super::*;
    use datafusion::arrow::array::{new_null_array, Int64Array, StringDictionaryBuilder};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use std::sync::Arc;

    /// Spilled frames' checksum: XXH3-64 of the bytes, seeded with XXH3-64 of the header
    /// (past 240 bytes through the vectorised stripe loop). Reference value: Python
    /// `xxhash.xxh3_64_intdigest(data, seed=xxhash.xxh3_64_intdigest(b"hdr"))`.
    #[test]
    fn spill_checksums_are_seeded_xxh3_64() {
        let data: Vec<u8> = (0..3_000_003u64).map(|i| (i * i % 251) as u8).collect();
        assert_eq!(checksum(b"hdr", &data), 9462004174363762045);
    }

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
    fn lz4_chunks_give_back_what_was_written_in_any_pieces() {
        // Bytes that compress (repeated text) and bytes that do not (a xorshift stream).
        let mut x = 88172645463325252u64;
        let mut data: Vec<u8> = b"{\"External id\": 12, \"cbid\": 211}, ".repeat(9000);
        data.extend((0..200_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        let lens = [
            0,
            1,
            7,
            LZ4_CHUNK - 1,
            LZ4_CHUNK,
            LZ4_CHUNK + 1,
            3 * LZ4_CHUNK,
            data.len(),
        ];
        for len in lens {
            for piece in [1usize, 1000, LZ4_CHUNK, 5 * LZ4_CHUNK] {
                let want = &data[..len];
                let mut sink = Lz4Chunks::new(0);
                for part in want.chunks(piece) {
                    sink.write_all(part).unwrap();
                }
                let (n, bytes) = sink.finish().unwrap();
                assert_eq!(n, len);
                assert_eq!(
                    lz4_chunks_decompress(&bytes, n).unwrap(),
                    want,
                    "{len} by {piece}"
                );
                if len > 0 {
                    // Cut short, a wrong length or trailing bytes: errors, not a wrong result.
                    assert!(lz4_chunks_decompress(&bytes[..bytes.len() - 1], n).is_err());
                    assert!(lz4_chunks_decompress(&bytes, n - 1).is_err());
                    let mut longer = bytes.clone();
                    longer.push(0);
                    assert!(lz4_chunks_decompress(&longer, n).is_err());
                }
            }
        }
        // The repeated text compresses (as one block per chunk, not much worse than whole).
        let text = &data[..data.len() - 200_000];
        let mut sink = Lz4Chunks::new(0);
        sink.write_all(text).unwrap();
        let (_, bytes) = sink.finish().unwrap();
        assert!(
            bytes.len() < text.len() / 10,
            "{} of {}",
            bytes.len(),
            text.len()
        );
    }

    #[test]
    fn a_short_spill_file_is_an_error() {
        let frame = Frame::encode(&batch(0, 100, "x")).unwrap();
        let mut bytes = Vec::new();
        frame.write_to(&mut bytes).unwrap();
        let schema = batch(0, 1, "x").schema();
        let back = Frame::read_from(&mut &bytes[..], &schema).unwrap();
        assert_eq!(back.decode().unwrap().num_rows(), 100);
        for cut in [0, 10, 40, bytes.len() - 1] {
            let err = Frame::read_from(&mut &bytes[..cut], &schema)
                .err()
                .expect("short file");
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        let mut corrupt = bytes.clone();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        let err = Frame::read_from(&mut &corrupt[..], &schema)
            .err()
            .expect("a damaged frame is an error");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // A damaged row count, decompressed length or column set is an error, not a wrong
        // batch or an allocation of that length.
        for field in [0, 1, 3] {
            let mut damaged = bytes.clone();
            damaged[field * 8] ^= 0x40;
            let err = Frame::read_from(&mut &damaged[..], &schema)
                .err()
                .expect("a damaged header is an error");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "field {field}");
        }
        // A damaged length (bytes 16..24 of the header) is a short read, not a huge allocation.
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = Frame::read_from(&mut &huge[..], &schema)
            .err()
            .expect("damaged length");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn all_null_columns_are_left_out_and_come_back() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
        ]));
        let full = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![None, None, None])),
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])),
                new_null_array(schema.field(2).data_type(), 3),
            ],
        )
        .unwrap();
        let frame = Frame::encode(&full).unwrap();
        assert_eq!(frame.present, 0b010);
        let mut bytes = Vec::new();
        frame.write_to(&mut bytes).unwrap();
        let back = Frame::read_from(&mut &bytes[..], &schema)
            .unwrap()
            .decode()
            .unwrap();
        assert_eq!(back, full);
    }

    /// A spool of ten batches of 1000 rows (`v` counting from 0), spilling at `path`.
    fn ten_batches(path: &std::path::Path, budget: usize) -> Spool {
        let mut s = Spool::new(path.to_path_buf(), budget);
        for i in 0..10 {
            // Each batch has its own dictionary, as parse tasks produce them.
            s.push(batch(i * 1000, 1000, &format!("name{i}"))).unwrap();
        }
        s
    }

    #[test]
    fn a_replay_reads_every_frame_again_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for budget in [usize::MAX, 0, 4_000] {
            let path = dir.path().join(format!("spool-{budget}"));
            let mut replay = ten_batches(&path, budget).into_replay().unwrap();
            assert!(!path.exists(), "the spill file is unlinked once open");
            let mut values = || -> Vec<i64> {
                replay
                    .frames()
                    .map(|f| f.unwrap().decode().unwrap())
                    .flat_map(|b| {
                        let v = b.column(0).as_any().downcast_ref::<Int64Array>();
                        v.unwrap().values().to_vec()
                    })
                    .collect()
            };
            assert_eq!(values(), (0..10_000).collect::<Vec<_>>(), "budget {budget}");
            assert_eq!(
                values(),
                (0..10_000).collect::<Vec<_>>(),
                "budget {budget}, again"
            );
        }
    }

    #[test]
    fn a_row_sample_stays_small_and_even() {
        let mut sample = RowSample::default();
        // 10 M rows in batches of 3,000: process 1 at times 0.., every tenth row GPU work
        // (not sampled), and process 2 with a tenth of the rows.
        let total = 10_000_000usize;
        let mut seen = 0;
        while seen < total {
            let n = 3_000.min(total - seen);
            sample.add(n, |i| {
                let row = seen + i;
                match row % 10 {
                    0 => None,
                    1 => Some((2, row as i64)),
                    _ => Some((1, row as i64)),
                }
            });
            seen += n;
        }
        let by_process = sample.by_process();
        let entries: usize = by_process.values().map(Vec::len).sum();
        assert!(
            entries <= SAMPLE_CAP && entries > SAMPLE_CAP / 4,
            "{entries} entries"
        );
        let weight = |p: i64| by_process[&p].iter().map(|&(_, w)| w).sum::<f64>();
        // Each entry stands for its share of the rows: 80 % and 10 %.
        assert!(
            (weight(1) / total as f64 - 0.8).abs() < 0.01,
            "{}",
            weight(1)
        );
        assert!(
            (weight(2) / total as f64 - 0.1).abs() < 0.01,
            "{}",
            weight(2)
        );
        // Evenly spread: windows of a tenth of process 1's rows start near each tenth of time.
        let starts = window_starts(by_process, total * 8 / 100);
        let ones: Vec<i64> = starts.iter().filter(|s| s.0 == 1).map(|s| s.1).collect();
        assert_eq!(ones.len(), 10, "{starts:?}");
        for (k, &t) in ones.iter().enumerate().skip(1) {
            let want = (k * total / 10) as i64;
            assert!(
                (t - want).abs() < total as i64 / 100,
                "window {k} starts at {t}"
            );
        }
    }

    #[test]
    fn spills_past_the_budget_and_returns_everything_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for budget in [usize::MAX, 0, 4_000] {
            let path = dir.path().join(format!("spool-{budget}"));
            let s = ten_batches(&path, budget);
            assert_eq!(s.rows(), 10_000);
            assert_eq!(s.spilled(), budget != usize::MAX, "budget {budget}");
            let back: Vec<RecordBatch> = s
                .drain()
                .unwrap()
                .map(|f| f.unwrap().decode().unwrap())
                .collect();
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

    /// Rows go to the last window starting at or before their (pid, ts); a null pid sorts
    /// first; each window gives back its rows in the order pushed, spilled or not.
    #[test]
    fn windows_take_rows_by_process_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("pid", DataType::Int64, true),
            Field::new("ts", DataType::Int64, false),
        ]));
        let rows = |pid: Vec<Option<i64>>, ts: Vec<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(pid)),
                    Arc::new(Int64Array::from(ts)),
                ],
            )
            .unwrap()
        };
        for budget in [usize::MAX, 0] {
            let path = dir.path().join(format!("windows-{budget}"));
            let mut s = Spool::new(path.clone(), budget);
            s.set_windows(vec![(1, 100), (2, i64::MIN), (2, 50)], true);
            // One batch across every window, one within a window, one of rows out of order.
            s.push(rows(
                vec![None, Some(1), Some(1), Some(2), Some(2), Some(3)],
                vec![5, 50, 150, 10, 60, 0],
            ))
            .unwrap();
            s.push(rows(vec![Some(1), Some(1)], vec![200, 300]))
                .unwrap();
            s.push(rows(vec![Some(2), Some(1), Some(2)], vec![70, 20, 20]))
                .unwrap();
            let mut windows = s.into_windows().unwrap();
            assert_eq!(
                windows.starts(),
                &[(i64::MIN, i64::MIN), (1, 100), (2, i64::MIN), (2, 50)]
            );
            let mut got = Vec::new();
            for w in 0..windows.len() {
                let pairs: Vec<(Option<i64>, i64)> = windows
                    .take(w)
                    .unwrap()
                    .iter()
                    .flat_map(|f| {
                        let b = f.decode().unwrap();
                        let pid = b.column(0).as_primitive::<Int64Type>().clone();
                        let ts = b.column(1).as_primitive::<Int64Type>().clone();
                        (0..b.num_rows())
                            .map(|i| (pid.is_valid(i).then(|| pid.value(i)), ts.value(i)))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                got.push(pairs);
            }
            assert_eq!(
                got,
                vec![
                    vec![(None, 5), (Some(1), 50), (Some(1), 20)],
                    vec![(Some(1), 150), (Some(1), 200), (Some(1), 300)],
                    vec![(Some(2), 10), (Some(2), 20)],
                    vec![(Some(2), 60), (Some(3), 0), (Some(2), 70)],
                ],
                "budget {budget}"
            );
            assert!(!path.exists(), "spill file left behind");
            // By time alone: every row as process 0, a null pid too.
            let mut s = Spool::new(path.clone(), budget);
            s.set_windows(vec![(0, i64::MIN), (0, 50), (0, 150)], false);
            s.push(rows(
                vec![None, Some(1), Some(2), Some(3)],
                vec![5, 150, 60, 50],
            ))
            .unwrap();
            let mut windows = s.into_windows().unwrap();
            let ts: Vec<Vec<i64>> = (0..windows.len())
                .map(|w| {
                    windows
                        .take(w)
                        .unwrap()
                        .iter()
                        .flat_map(|f| {
                            let b = f.decode().unwrap();
                            b.column(1).as_primitive::<Int64Type>().values().to_vec()
                        })
                        .collect()
                })
                .collect();
            assert_eq!(ts, vec![vec![], vec![5], vec![60, 50], vec![150]]);
        }
    }
}
