//! Opening trace files: decompression, content hashing, progress, and format detection.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Input formats gpuq can ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// PyTorch profiler / Kineto / Chrome-trace JSON.
    Kineto,
    /// Nsight Systems SQLite export (`nsys export --type sqlite`).
    Nsys,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Kineto => "kineto",
            Format::Nsys => "nsys",
        }
    }
}

/// What `--format auto` tries, for error messages.
pub const TRIED: &str = "Kineto/Chrome-trace JSON, Nsight Systems SQLite; plain, gzip or zstd";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Why a file cannot be read as any supported format.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("the file is empty")]
    Empty,
    #[error("unrecognised format ({0}; tried: {TRIED})")]
    Unknown(String),
    #[error("not {expected}: {why}")]
    NotThatFormat { expected: &'static str, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
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
        .map_err(|e| DetectError::Unknown(format!("cannot decompress: {e}")))?;
    let body = &text[..m];
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => Err(DetectError::Empty),
        Some(b'{') => Ok((compression, Format::Kineto)),
        Some(_)
            if body
                .iter()
                .take(512)
                .any(|&b| b == 0 || (b < 0x20 && !b.is_ascii_whitespace())) =>
        {
            Err(DetectError::Unknown("binary content".into()))
        }
        Some(_) => Err(DetectError::Unknown(
            "text that is not a JSON object".into(),
        )),
    }
}

fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
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

/// Counts raw bytes read (for progress) and hashes them (for deduplication).
struct Tap<R> {
    inner: R,
    read: Arc<AtomicU64>,
    hasher: Arc<Mutex<blake3::Hasher>>,
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.lock().expect("hasher").update(&buf[..n]);
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A trace file being read.
pub struct Source {
    pub path: PathBuf,
    pub size: u64,
    pub compression: Compression,
    pub format: Format,
    read: Arc<AtomicU64>,
    hasher: Arc<Mutex<blake3::Hasher>>,
}

impl Source {
    /// Opens `path`, detecting its format by content, or checking it is `forced`.
    pub fn open(path: &Path, forced: Option<Format>) -> Result<Source, DetectError> {
        let (compression, format) = detect(path)?;
        if let Some(f) = forced.filter(|&f| f != format) {
            return Err(DetectError::NotThatFormat {
                expected: f.name(),
                why: format!("the content looks like {}", format.name()),
            });
        }
        let size = std::fs::metadata(path)?.len();
        Ok(Source {
            path: path.to_path_buf(),
            size,
            compression,
            format,
            read: Arc::new(AtomicU64::new(0)),
            hasher: Arc::new(Mutex::new(blake3::Hasher::new())),
        })
    }

    /// The decompressed content. Reading it feeds [`Self::bytes_read`] and [`Self::hash`].
    pub fn reader(&self) -> std::io::Result<Box<dyn Read + Send>> {
        let file = File::open(&self.path)?;
        let tap = Tap {
            inner: file,
            read: self.read.clone(),
            hasher: self.hasher.clone(),
        };
        let raw: Box<dyn Read + Send> = Box::new(BufReader::with_capacity(1 << 20, tap));
        decompress(raw, self.compression)
    }

    pub fn bytes_read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// BLAKE3 of the raw bytes: of those read through [`Self::reader`] once it is exhausted,
    /// else (an adapter that opened the file itself) of the file.
    pub fn hash(&self) -> std::io::Result<String> {
        if self.bytes_read() < self.size {
            return hash_file(&self.path);
        }
        Ok(self
            .hasher
            .lock()
            .expect("hasher")
            .finalize()
            .to_hex()
            .to_string())
    }
}

/// BLAKE3 of a whole file, hex.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(File::open(path)?)?;
    Ok(h.finalize().to_hex().to_string())
}

/// Files an argument stands for: the file itself, or every trace-looking file in a directory
/// (sorted by name, hidden files skipped).
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
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !name.starts_with('.')
                && (name.ends_with(".json")
                    || name.ends_with(".json.gz")
                    || name.ends_with(".json.zst")
                    || name.ends_with(".sqlite"))
        })
        .collect();
    files.sort();
    Ok(files)
}
