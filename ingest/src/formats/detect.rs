//! Which format a file holds, from its first bytes (never its name): [`Format`], and why no
//! format fits ([`DetectError`]). Opening and decompressing the file is [`crate::source`]'s.

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
pub const BINARY: &str = "binary content";
pub const UNDECOMPRESSABLE: &str = "cannot decompress";

/// The format of a text file whose first (decompressed) bytes are `body`: a stage log, a
/// Kineto/Chrome-trace JSON or (`uncompressed` only) a rocprofv3 CSV.
pub fn format_of(body: &[u8], uncompressed: bool) -> Result<Format, DetectError> {
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
    if crate::formats::stagelog::looks_like_stage_log(head) {
        return Ok(Format::StageLog);
    }
    // A JSON object, or the Trace Event Format's JSON Array Format (a bare array of events,
    // as PyTorch up to 1.7 and the legacy `export_chrome_trace` write).
    if first == b'{' || (first == b'[' && array_of_objects(body)) {
        return Ok(Format::Kineto);
    }
    let mut lines = head.lines();
    let header = lines.next().unwrap_or("");
    if uncompressed && crate::formats::rocprof::table_of_file(header, lines.next()).is_some() {
        return Ok(Format::Rocprof);
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
