//! Opening trace files: decompression, content hashing, progress, and format detection.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use twox_hash::XxHash3_128;

/// Input formats gpuq can ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// PyTorch profiler / Kineto / Chrome-trace JSON.
    Kineto,
    /// Nsight Systems SQLite export (`nsys export --type sqlite`).
    Nsys,
    /// rocprofv3 CSV output (the CSV files of one output directory form one source).
    Rocprof,
    /// Timestamped application log marking stages.
    StageLog,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Kineto => "kineto",
            Format::Nsys => "nsys",
            Format::Rocprof => "rocprofv3",
            Format::StageLog => "stagelog",
        }
    }
}

/// What `--format auto` tries, for error messages.
pub const TRIED: &str = "Kineto/Chrome-trace JSON, Nsight Systems SQLite, rocprofv3 CSV, \
                         stage log (JSON lines, key=value, Python logging); plain, gzip or zstd";

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

/// Why detection gave up on content no format can hold.
const BINARY: &str = "binary content";
const UNDECOMPRESSABLE: &str = "cannot decompress";

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
    let body = &text[..m];
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let Some(first) = body.iter().copied().find(|b| !b.is_ascii_whitespace()) else {
        return Err(DetectError::Empty);
    };
    if body
        .iter()
        .take(512)
        .any(|&b| b == 0 || (b < 0x20 && !b.is_ascii_whitespace()))
    {
        return Err(DetectError::Unknown(BINARY.into()));
    }
    // The head may end inside a UTF-8 sequence: keep its valid prefix.
    let head = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&body[..e.valid_up_to()]).unwrap_or(""),
    };
    if crate::stagelog::looks_like_stage_log(head) {
        return Ok((compression, Format::StageLog));
    }
    // A JSON object, or the Trace Event Format's JSON Array Format (a bare array of events,
    // as PyTorch up to 1.7 and the legacy `export_chrome_trace` write).
    if first == b'{' || (first == b'[' && array_of_objects(body)) {
        return Ok((compression, Format::Kineto));
    }
    let mut lines = head.lines();
    let header = lines.next().unwrap_or("");
    if compression == Compression::None
        && crate::rocprof::table_of_file(header, lines.next()).is_some()
    {
        return Ok((compression, Format::Rocprof));
    }
    Err(DetectError::Unknown(if header.contains(',') {
        "a CSV file that is not rocprofv3 output".into()
    } else {
        "text that is neither a JSON trace, a rocprofv3 CSV nor a stage log".into()
    }))
}

/// Whether `body` (starting, after whitespace, with `[`) goes on with an object or `]`.
fn array_of_objects(body: &[u8]) -> bool {
    let mut rest = body.iter().copied().filter(|b| !b.is_ascii_whitespace());
    rest.next() == Some(b'[') && matches!(rest.next(), Some(b'{' | b']') | None)
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
        }
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
        let tap = Tap {
            inner: file,
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
            return hash_file(&self.path);
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
    let mut file = File::open(path)?;
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

/// Merges the rocprofv3 CSV sources of each directory into one source (one rocprofv3 output);
/// other sources are kept as they are, in order.
pub fn group_rocprof(sources: Vec<Source>) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::with_capacity(sources.len());
    for src in sources {
        if src.format == Format::Rocprof {
            let dir = src.path.parent().map(Path::to_path_buf);
            if let Some(group) = out.iter_mut().find(|o| {
                o.format == Format::Rocprof && o.path.parent().map(Path::to_path_buf) == dir
            }) {
                group.files.extend(src.files);
                group.files.sort();
                group.size += src.size;
                continue;
            }
        }
        out.push(src);
    }
    for o in &mut out {
        if o.format == Format::Rocprof && o.files.len() > 1 {
            if let Some(dir) = o.path.parent() {
                o.path = dir.to_path_buf();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored hash is XXH3-128 as other tools compute it (reference values from the
    /// `xxhash` Python package), whether the bytes streamed past the parser or the file was
    /// hashed on its own.
    #[test]
    fn content_hashes_are_xxh3_128_of_the_raw_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            hash_file(&empty).unwrap(),
            "99aa06d3014798d86001c324468d497f"
        );
        let text = dir.path().join("t.txt");
        std::fs::write(&text, b"gpuq").unwrap();
        assert_eq!(
            hash_file(&text).unwrap(),
            "1277cdd2a79d1b250fb464dd235315b5"
        );

        let trace = dir.path().join("trace.json");
        std::fs::write(
            &trace,
            br#"{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]}"#,
        )
        .unwrap();
        let source = Source::open(&trace, None).unwrap();
        let before_reading = source.hash().unwrap();
        let mut bytes = Vec::new();
        source.reader().unwrap().read_to_end(&mut bytes).unwrap();
        assert_eq!(source.hash().unwrap(), before_reading);
        assert_eq!(source.hash().unwrap(), hash_file(&trace).unwrap());

        // A compressed trace is identified by its file's bytes, not the decompressed ones.
        let gz = dir.path().join("trace.json.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut enc, &bytes).unwrap();
        std::fs::write(&gz, enc.finish().unwrap()).unwrap();
        let source = Source::open(&gz, None).unwrap();
        source
            .reader()
            .unwrap()
            .read_to_end(&mut Vec::new())
            .unwrap();
        assert_eq!(source.hash().unwrap(), hash_file(&gz).unwrap());
        assert_ne!(source.hash().unwrap(), hash_file(&trace).unwrap());

        // Past 240 bytes XXH3 runs its vectorised stripe loop (AVX2 where the CPU has it), here
        // over three 1 MB reads and a partial one, streamed and whole. Reference value:
        // Python `xxhash.xxh3_128_hexdigest(bytes(i * i % 251 for i in range(3000003)))`.
        let big = dir.path().join("big.bin");
        let content: Vec<u8> = (0..3_000_003u64).map(|i| (i * i % 251) as u8).collect();
        std::fs::write(&big, &content).unwrap();
        let want = "1b2c19f7962f917c4e49ce2adbd40174";
        assert_eq!(hash_file(&big).unwrap(), want);
        // Not a trace, so streamed through a `Source` made by hand.
        let source = Source {
            path: big.clone(),
            files: vec![big.clone()],
            size: content.len() as u64,
            compression: Compression::None,
            format: Format::Kineto,
            read: Arc::new(AtomicU64::new(0)),
            decompressed: Arc::new(AtomicU64::new(0)),
            hasher: Arc::new(Mutex::new(XxHash3_128::new())),
        };
        let mut read = Vec::new();
        source.reader().unwrap().read_to_end(&mut read).unwrap();
        assert_eq!(read, content);
        assert_eq!(source.hash().unwrap(), want);
    }

    /// A compressed file that decompresses to more than [`MAX_DECOMPRESSION_RATIO`] times its
    /// size is refused while it is read (a 400 MiB name in a zstd file of a few KB), early
    /// and with bounded memory; a real trace's ratio (5-30) reads through.
    #[test]
    fn decompression_bombs_are_refused_while_read() {
        let dir = tempfile::tempdir().unwrap();
        let bomb = dir.path().join("bomb.json.zst");
        let mut enc = zstd::stream::Encoder::new(std::fs::File::create(&bomb).unwrap(), 3).unwrap();
        std::io::Write::write_all(&mut enc, br#"{"traceEvents": [{"ph": "X", "name": ""#).unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..400 {
            std::io::Write::write_all(&mut enc, &chunk).unwrap();
        }
        enc.finish().unwrap();
        let source = Source::open(&bomb, None).unwrap();
        assert_eq!(source.format, Format::Kineto);
        let mut reader = source.reader().unwrap();
        let e = std::io::copy(&mut reader, &mut std::io::sink()).unwrap_err();
        assert!(e.to_string().contains("decompression bomb"), "{e}");
        let read = source.decompressed.load(Ordering::Relaxed);
        assert!(read < 80 << 20, "decompressed {read} bytes before stopping");

        // 100 MiB at an ordinary ratio reads through.
        let fine = dir.path().join("fine.json.zst");
        let mut enc = zstd::stream::Encoder::new(std::fs::File::create(&fine).unwrap(), 1).unwrap();
        let mut state = 1u64;
        let text: Vec<u8> = (0..100 << 20)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let symbols = b"{}aaaaaaaaaaaaaaaaaa\"0123456789";
                symbols[(state >> 58) as usize % symbols.len()]
            })
            .collect();
        std::io::Write::write_all(&mut enc, b"{\"traceEvents\": [], \"x\": \"").unwrap();
        std::io::Write::write_all(&mut enc, &text).unwrap();
        enc.finish().unwrap();
        let ratio = (100 << 20) / std::fs::metadata(&fine).unwrap().len();
        assert!(ratio < MAX_DECOMPRESSION_RATIO / 10, "{ratio}");
        let source = Source::open(&fine, None).unwrap();
        let n = std::io::copy(&mut source.reader().unwrap(), &mut std::io::sink()).unwrap();
        assert!(n > 100 << 20);
    }

    /// A bare array of events is a Chrome trace (JSON Array Format); `--format kineto` reads
    /// any text as one, even where detection sees something else or nothing it knows.
    #[test]
    fn detects_the_json_array_format_and_kineto_can_be_forced() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let array = write(
            "a.json",
            "\n [ {\"name\": \"k\", \"ph\": \"X\", \"ts\": 1, \"dur\": 2}",
        );
        assert_eq!(detect(&array).unwrap().1, Format::Kineto);
        assert_eq!(detect(&write("e.json", "[]")).unwrap().1, Format::Kineto);
        let numbers = write("n.json", "[1, 2, 3]");
        assert!(matches!(detect(&numbers), Err(DetectError::Unknown(_))));
        let opened = Source::open(&numbers, Some(Format::Kineto)).unwrap();
        assert_eq!(opened.format, Format::Kineto);
        // A CSV forced to Kineto is opened as Kineto (the parser then says it is not JSON);
        // an SQLite file or binary content is never text to read.
        let csv = write("c.csv", "Kind,Agent_Id,Correlation_Id,Start_Timestamp\n");
        assert_eq!(
            Source::open(&csv, Some(Format::Kineto)).unwrap().format,
            Format::Kineto
        );
        let binary = write("b.bin", "\u{1}\u{2}\u{3}");
        assert!(Source::open(&binary, Some(Format::Kineto)).is_err());
        let sqlite = write("s.sqlite", "SQLite format 3\0rest");
        assert!(Source::open(&sqlite, Some(Format::Kineto)).is_err());
    }
}
