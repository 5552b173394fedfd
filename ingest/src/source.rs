//! Opening trace files: decompression, content hashing and progress. Which format a file
//! holds is decided by [`crate::formats::detect`] from the first bytes read here.

use crate::formats::detect::{format_of, DetectError, Format, BINARY, UNDECOMPRESSABLE};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use twox_hash::XxHash3_128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

fn compression_of(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Detects compression and format from the file's content (never its name).
pub fn detect(path: &Path) -> Result<(Compression, Format), DetectError> {
    let mut head = [0u8; 16];
    let n = read_up_to(&mut File::open(path)?, &mut head)?;
    if n == 0 {
        return Err(DetectError::Empty);
    }
    if head[..n].starts_with(b"SQLite format 3\0") {
        return Ok((Compression::None, Format::Nsys));
    }
    let compression = compression_of(&head[..n]);
    let mut text = [0u8; 4096];
    let mut r = decompress(Box::new(BufReader::new(File::open(path)?)), compression)?;
    let m = read_up_to(&mut r, &mut text)
        .map_err(|e| DetectError::Unknown(format!("{UNDECOMPRESSABLE}: {e}")))?;
    format_of(&text[..m], compression == Compression::None).map(|format| (compression, format))
}

/// The format a file holds, as `ingest` detects it; `None` when the file is unreadable or
/// no format is recognised (for callers that choose trace files among others).
pub fn detect_format(path: &Path) -> Option<Format> {
    detect(path).ok().map(|(_, format)| format)
}

pub(crate) fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn decompress(r: Box<dyn Read + Send>, c: Compression) -> std::io::Result<Box<dyn Read + Send>> {
    Ok(match c {
        Compression::None => r,
        Compression::Gzip => Box::new(BufReader::with_capacity(
            1 << 20,
            flate2::read::MultiGzDecoder::new(r),
        )),
        Compression::Zstd => Box::new(zstd::Decoder::new(r)?),
    })
}

/// Decompressed bytes per compressed byte past which a file is refused as a decompression
/// bomb. Real traces compress 5-30 times (the shared Kineto traces at most 30.3 times with
/// gzip); gzip itself cannot pass about 1032, zstd reaches millions (a 132 KB file holding a
/// 4 GiB name). At this ratio a compressed file costs at most 1000 times its size in parsing
/// time, whatever it holds.
pub const MAX_DECOMPRESSION_RATIO: u64 = 1000;

/// Decompressed bytes before the ratio is checked: a small trace may compress better than a
/// large one, and costs little whatever its ratio.
const RATIO_CHECKED_FROM: u64 = 64 << 20;

/// Counts the decompressed bytes read, and stops at a decompression bomb
/// ([`MAX_DECOMPRESSION_RATIO`]).
struct CountRead<R> {
    inner: R,
    read: Arc<AtomicU64>,
    /// Compressed bytes read so far.
    raw: Arc<AtomicU64>,
}

impl<R: Read> Read for CountRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.read.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        let raw = self.raw.load(Ordering::Relaxed).max(1);
        if total > RATIO_CHECKED_FROM && total / raw > MAX_DECOMPRESSION_RATIO {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{raw} compressed bytes decompress to more than {total}, over {} times \
                     their size, which no real trace does: a decompression bomb?",
                    MAX_DECOMPRESSION_RATIO
                ),
            ));
        }
        Ok(n)
    }
}

/// Counts raw bytes read (for progress) and hashes them (for deduplication).
struct Tap<R> {
    inner: R,
    read: Arc<AtomicU64>,
    hasher: Arc<Mutex<XxHash3_128>>,
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.lock().expect("hasher").write(&buf[..n]);
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A trace file being read (for rocprofv3: the CSV files of one output directory).
pub struct Source {
    pub path: PathBuf,
    /// Every file of the source; just `path` except for rocprofv3.
    pub files: Vec<PathBuf>,
    pub size: u64,
    pub compression: Compression,
    pub format: Format,
    read: Arc<AtomicU64>,
    /// Decompressed bytes read through [`Self::reader`].
    decompressed: Arc<AtomicU64>,
    hasher: Arc<Mutex<XxHash3_128>>,
    /// Read only this many bytes of the file ([`Self::complete_lines_only`]).
    limit: Option<u64>,
}

impl Source {
    /// Opens `path`, detecting its format by content, or checking it is `forced`.
    /// `--format kineto` reads any text as Kineto JSON, whatever detection guessed (the
    /// parser then says where the text is not a trace).
    pub fn open(path: &Path, forced: Option<Format>) -> Result<Source, DetectError> {
        let (compression, format) = match (detect(path), forced) {
            (Ok((c, f)), Some(Format::Kineto)) if f != Format::Nsys => (c, Format::Kineto),
            (Err(DetectError::Unknown(why)), Some(Format::Kineto))
                if why != BINARY && !why.starts_with(UNDECOMPRESSABLE) =>
            {
                let mut head = [0u8; 4];
                let n = read_up_to(&mut File::open(path)?, &mut head)?;
                (compression_of(&head[..n]), Format::Kineto)
            }
            (detected, _) => detected?,
        };
        if let Some(f) = forced.filter(|&f| f != format) {
            return Err(DetectError::NotThatFormat {
                expected: f.name(),
                why: format!("the content looks like {}", format.name()),
            });
        }
        let size = std::fs::metadata(path)?.len();
        Ok(Source {
            path: path.to_path_buf(),
            files: vec![path.to_path_buf()],
            size,
            compression,
            format,
            read: Arc::new(AtomicU64::new(0)),
            decompressed: Arc::new(AtomicU64::new(0)),
            hasher: Arc::new(Mutex::new(XxHash3_128::new())),
            limit: None,
        })
    }

    /// `path` as an uncompressed `format` file, without detection: for a file whose name says
    /// what it is where its content does not (a damaged rocprofv3 CSV in an output
    /// directory), so that its adapter says what is wrong with it instead of the file being
    /// passed over.
    pub fn by_name(path: &Path, format: Format) -> std::io::Result<Source> {
        Ok(Source {
            path: path.to_path_buf(),
            files: vec![path.to_path_buf()],
            size: std::fs::metadata(path)?.len(),
            compression: Compression::None,
            format,
            read: Arc::new(AtomicU64::new(0)),
            decompressed: Arc::new(AtomicU64::new(0)),
            hasher: Arc::new(Mutex::new(XxHash3_128::new())),
            limit: None,
        })
    }

    /// The same source with fresh byte counters and hasher, to read it once more.
    pub fn reopen(&self) -> Source {
        Source {
            path: self.path.clone(),
            files: self.files.clone(),
            size: self.size,
            compression: self.compression,
            format: self.format,
            read: Arc::new(AtomicU64::new(0)),
            decompressed: Arc::new(AtomicU64::new(0)),
            hasher: Arc::new(Mutex::new(XxHash3_128::new())),
            limit: self.limit,
        }
    }

    /// Makes the source end after the last `\n` of the file (an uncompressed text file still
    /// being written, whose last line may be half written); returns its new size, 0 when the
    /// file has no complete line. Its hash is then of those bytes only.
    pub fn complete_lines_only(&mut self) -> std::io::Result<u64> {
        use std::io::{Seek, SeekFrom};
        let mut file = File::open(&self.path)?;
        let mut end = file.seek(SeekFrom::End(0))?;
        let mut buf = vec![0u8; 64 * 1024];
        let size = loop {
            if end == 0 {
                break 0;
            }
            let start = end.saturating_sub(buf.len() as u64);
            let chunk = &mut buf[..(end - start) as usize];
            file.seek(SeekFrom::Start(start))?;
            file.read_exact(chunk)?;
            if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
                break start + i as u64 + 1;
            }
            end = start;
        };
        self.size = size;
        self.limit = Some(size);
        Ok(size)
    }

    /// Bytes of content: the decompressed bytes read of a compressed file (what a parse
    /// costs, and what ingest speed is measured on), else the size.
    pub fn content_bytes(&self) -> u64 {
        match self.compression {
            Compression::None => self.size,
            _ => self.decompressed.load(Ordering::Relaxed).max(self.size),
        }
    }

    /// The decompressed content. Reading it feeds [`Self::bytes_read`] and [`Self::hash`].
    pub fn reader(&self) -> std::io::Result<Box<dyn Read + Send>> {
        let file = File::open(&self.path)?;
        let inner: Box<dyn Read + Send> = match self.limit {
            Some(limit) => Box::new(file.take(limit)),
            None => Box::new(file),
        };
        let tap = Tap {
            inner,
            read: self.read.clone(),
            hasher: self.hasher.clone(),
        };
        let raw: Box<dyn Read + Send> = Box::new(BufReader::with_capacity(1 << 20, tap));
        let content = decompress(raw, self.compression)?;
        if self.compression == Compression::None {
            return Ok(content);
        }
        Ok(Box::new(CountRead {
            inner: content,
            read: self.decompressed.clone(),
            raw: self.read.clone(),
        }))
    }

    /// [`hex`] of the raw bytes, read from the file now (not through [`Self::reader`]).
    pub fn hash_unread(&self) -> std::io::Result<String> {
        let file = File::open(&self.path)?;
        match self.limit {
            Some(limit) => hash_read(file.take(limit)),
            None => hash_read(file),
        }
    }

    /// Whether only the complete lines are read ([`Self::complete_lines_only`]).
    pub fn complete_lines(&self) -> bool {
        self.limit.is_some()
    }

    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// [`hex`] of the raw bytes: of those read through [`Self::reader`] once it is exhausted,
    /// else (an adapter that opened the file itself) of the file.
    pub fn hash(&self) -> std::io::Result<String> {
        if self.files.len() > 1 {
            // A hash of the files' hashes, in name order.
            let mut h = XxHash3_128::new();
            for f in &self.files {
                h.write(hash_file(f)?.as_bytes());
            }
            return Ok(hex(&h));
        }
        if self.bytes_read() < self.size {
            return self.hash_unread();
        }
        Ok(hex(&self.hasher.lock().expect("hasher")))
    }
}

/// A content hash as stored: XXH3-128, 32 hex digits, as `xxhsum -H2` prints it. Not a
/// cryptographic hash (BLAKE3 cost four times the CPU: 5 % of an ingest): it tells apart
/// files of equal size, which is all de-duplication asks of it.
fn hex(h: &XxHash3_128) -> String {
    format!("{:032x}", h.finish_128())
}

/// [`hex`] of a whole file.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    hash_read(File::open(path)?)
}

fn hash_read(mut file: impl Read) -> std::io::Result<String> {
    let mut h = XxHash3_128::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hex(&h)),
            Ok(n) => h.write(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Files an argument stands for: the file itself, or every regular, non-hidden file of a
/// directory (sorted by name; which of them are traces is decided by their content).
pub fn expand(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        // Surface "no such file" here with the path.
        std::fs::metadata(path)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .filter(|p| {
            !p.file_name()
                .map(|n| n.to_string_lossy().starts_with('.'))
                .unwrap_or(true)
        })
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests;
