//! Segment files: names, the record, the writer and the reader.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The first bytes of every segment.
pub const MAGIC: &[u8; 8] = b"GPUQCUPT";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of one encoded [`RawRecord`].
pub const RECORD_BYTES: usize = 120;

/// The name of segment `seq` of process `pid`: sorted by name is sorted by process and time.
pub fn segment_name(pid: u32, seq: u64) -> String {
    format!("cupti-{pid:010}-{seq:010}.seg")
}

/// The process and sequence number of a segment's file name, or `None` for any other name.
pub fn parse_segment_name(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("cupti-")?.strip_suffix(".seg")?;
    let (pid, seq) = rest.split_once('-')?;
    if pid.len() != 10 || seq.len() != 10 {
        return None;
    }
    Some((pid.parse().ok()?, seq.parse().ok()?))
}

/// The name of the status file a process's collector keeps beside its segments (JSON:
/// `state` is `running`, `disabled` with a `reason`, or `exited`).
pub fn status_name(pid: u32) -> String {
    format!("cupti-{pid:010}.status.json")
}

/// The process of a status file's name.
pub fn parse_status_name(name: &str) -> Option<u32> {
    let pid = name.strip_prefix("cupti-")?.strip_suffix(".status.json")?;
    (pid.len() == 10).then(|| pid.parse().ok()).flatten()
}

/// Writes `bytes` as `dir/name` so that the name never shows a partial file: a hidden
/// temporary file is written and synced, then renamed.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
    }
    fs::rename(&tmp, &path)?;
    Ok(path)
}

/// What a record is. CUPTI's own kind codes are not used: a marker's start, end and instant
/// are one kind here, and host marks could be added without clashing with CUPTI's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(u8)]
pub enum RecordKind {
    #[default]
    Kernel = 1,
    Memcpy = 2,
    Memset = 3,
    Runtime = 4,
    Driver = 5,
    Sync = 6,
    /// An NVTX marker: `code` holds CUPTI's marker flags (1 instant, 2 start, 4 end).
    Marker = 7,
    Overhead = 8,
    /// A GPU: `name` its name, `detail` its UUID text, `bytes` its memory, `value` its SMs,
    /// `grid[0..2]` its compute capability.
    Device = 9,
    /// A CUDA context: `context` and `device`.
    Context = 10,
    /// An external correlation: `value` the external kind, `bytes` the external id.
    ExternalCorrelation = 11,
}

impl RecordKind {
    pub fn from_code(code: u8) -> Option<RecordKind> {
        use RecordKind::*;
        Some(match code {
            1 => Kernel,
            2 => Memcpy,
            3 => Memset,
            4 => Runtime,
            5 => Driver,
            6 => Sync,
            7 => Marker,
            8 => Overhead,
            9 => Device,
            10 => Context,
            11 => ExternalCorrelation,
            _ => return None,
        })
    }
}

/// One activity record as the collector decoded it: the fields gpuq stores, at fixed places,
/// whatever the struct version CUPTI used. Unused fields are zero; string fields are ids into
/// the segment's strings (0: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawRecord {
    pub kind: RecordKind,
    /// Memcpy: CUPTI's copy kind and source and destination memory kinds.
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    /// API calls: the callback id; sync: its type; overhead: its kind; memset: the memory
    /// kind; marker: its flags.
    pub code: u32,
    /// ns, on CUPTI's clock. Markers and instants have `end == start`.
    pub start: i64,
    pub end: i64,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub correlation: u32,
    pub pid: u32,
    pub tid: u32,
    pub name: u32,
    /// A second string: a marker's domain, a device's UUID.
    pub detail: u32,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub registers: u16,
    pub launch_type: u8,
    /// Overhead and marker records: CUPTI's object kind (2: thread).
    pub object_kind: u8,
    pub return_value: u32,
    pub static_smem: u32,
    pub dynamic_smem: u32,
    /// Memcpy/memset bytes; an external correlation's id; a device's memory.
    pub bytes: u64,
    pub graph_node: u64,
    pub graph_id: u32,
    /// Memset value; marker id; external kind; a device's SMs.
    pub value: u32,
}

impl RawRecord {
    /// Appends the record's [`RECORD_BYTES`] bytes.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; RECORD_BYTES];
        b[0] = self.kind as u8;
        b[1] = self.copy_kind;
        b[2] = self.src_kind;
        b[3] = self.dst_kind;
        b[4..8].copy_from_slice(&self.code.to_le_bytes());
        b[8..16].copy_from_slice(&self.start.to_le_bytes());
        b[16..24].copy_from_slice(&self.end.to_le_bytes());
        let words = [
            self.device,
            self.context,
            self.stream,
            self.correlation,
            self.pid,
            self.tid,
            self.name,
            self.detail,
            self.grid[0] as u32,
            self.grid[1] as u32,
            self.grid[2] as u32,
            self.block[0] as u32,
            self.block[1] as u32,
            self.block[2] as u32,
        ];
        for (i, w) in words.iter().enumerate() {
            b[24 + 4 * i..28 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[80..82].copy_from_slice(&self.registers.to_le_bytes());
        b[82] = self.launch_type;
        b[83] = self.object_kind;
        b[84..88].copy_from_slice(&self.return_value.to_le_bytes());
        b[88..92].copy_from_slice(&self.static_smem.to_le_bytes());
        b[92..96].copy_from_slice(&self.dynamic_smem.to_le_bytes());
        b[96..104].copy_from_slice(&self.bytes.to_le_bytes());
        b[104..112].copy_from_slice(&self.graph_node.to_le_bytes());
        b[112..116].copy_from_slice(&self.graph_id.to_le_bytes());
        b[116..120].copy_from_slice(&self.value.to_le_bytes());
        out.extend_from_slice(&b);
    }

    /// Reads a record from `b` (at least [`RECORD_BYTES`] long); `None` for an unknown kind.
    pub fn decode(b: &[u8]) -> Option<RawRecord> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let w = |i: usize| u32_at(24 + 4 * i);
        Some(RawRecord {
            kind: RecordKind::from_code(b[0])?,
            copy_kind: b[1],
            src_kind: b[2],
            dst_kind: b[3],
            code: u32_at(4),
            start: u64_at(8) as i64,
            end: u64_at(16) as i64,
            device: w(0),
            context: w(1),
            stream: w(2),
            correlation: w(3),
            pid: w(4),
            tid: w(5),
            name: w(6),
            detail: w(7),
            grid: [w(8) as i32, w(9) as i32, w(10) as i32],
            block: [w(11) as i32, w(12) as i32, w(13) as i32],
            registers: u16::from_le_bytes([b[80], b[81]]),
            launch_type: b[82],
            object_kind: b[83],
            return_value: u32_at(84),
            static_smem: u32_at(88),
            dynamic_smem: u32_at(92),
            bytes: u64_at(96),
            graph_node: u64_at(104),
            graph_id: u32_at(112),
            value: u32_at(116),
        })
    }
}

/// The blocks of a segment, by tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Block {
    /// JSON: the process (pid, rank, host, CUPTI version, clock pair, kinds).
    Meta = 1,
    /// `u32` count, then per string its `u32` id, `u32` length and UTF-8 bytes.
    Strings = 2,
    /// `u32` count, then that many [`RECORD_BYTES`]-byte records.
    Records = 3,
    /// JSON: counters of this interval (records CUPTI dropped, buffers refused, ...).
    Health = 4,
    /// `u64` records in the segment: present only in a whole segment.
    End = 0xFFFF,
}

/// Builds one segment in memory.
pub struct SegmentBuilder {
    strings: Vec<u8>,
    string_count: u32,
    records: Vec<u8>,
    record_count: u32,
}

impl Default for SegmentBuilder {
    fn default() -> Self {
        SegmentBuilder::new()
    }
}

impl SegmentBuilder {
    pub fn new() -> SegmentBuilder {
        SegmentBuilder {
            strings: Vec::new(),
            string_count: 0,
            records: Vec::with_capacity(1 << 16),
            record_count: 0,
        }
    }

    /// Defines string `id` for this segment's records.
    pub fn string(&mut self, id: u32, text: &[u8]) {
        self.strings.extend_from_slice(&id.to_le_bytes());
        self.strings
            .extend_from_slice(&(text.len() as u32).to_le_bytes());
        self.strings.extend_from_slice(text);
        self.string_count += 1;
    }

    #[inline]
    pub fn record(&mut self, r: &RawRecord) {
        r.encode(&mut self.records);
        self.record_count += 1;
    }

    pub fn records(&self) -> u32 {
        self.record_count
    }

    /// The segment's bytes, with `meta_json` and `health_json` as its meta and health blocks.
    pub fn finish(mut self, meta_json: &str, health_json: &str) -> Vec<u8> {
        let mut out = Vec::new();
        self.finish_into(meta_json, health_json, &mut out);
        out
    }

    /// Writes the segment's bytes into `out` (cleared first) and empties the builder, keeping
    /// both buffers' memory for the next segment: a collector writing a segment a second
    /// would otherwise fault in fresh pages for every one.
    pub fn finish_into(&mut self, meta_json: &str, health_json: &str, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.records.len() + self.strings.len() + 256);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        let mut block = |tag: Block, parts: &[&[u8]]| {
            let len: usize = parts.iter().map(|p| p.len()).sum();
            out.extend_from_slice(&(tag as u32).to_le_bytes());
            out.extend_from_slice(&(len as u32).to_le_bytes());
            for p in parts {
                out.extend_from_slice(p);
            }
        };
        block(Block::Meta, &[meta_json.as_bytes()]);
        block(
            Block::Strings,
            &[&self.string_count.to_le_bytes(), &self.strings],
        );
        block(
            Block::Records,
            &[&self.record_count.to_le_bytes(), &self.records],
        );
        block(Block::Health, &[health_json.as_bytes()]);
        block(Block::End, &[&(self.record_count as u64).to_le_bytes()]);
        self.strings.clear();
        self.string_count = 0;
        self.records.clear();
        self.record_count = 0;
    }
}

/// A segment as read back.
#[derive(Debug, Default)]
pub struct Segment {
    pub meta: String,
    pub strings: HashMap<u32, String>,
    pub records: Vec<RawRecord>,
    pub health: String,
}

impl Segment {
    /// The text of string `id` (`None` for 0 or an id the segment does not define).
    pub fn text(&self, id: u32) -> Option<&str> {
        if id == 0 {
            return None;
        }
        self.strings.get(&id).map(String::as_str)
    }
}

/// Why a segment could not be read: the byte where it went wrong and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentError {
    pub offset: u64,
    pub message: String,
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for SegmentError {}

/// Reads a whole segment from its bytes.
pub fn read_segment(bytes: &[u8]) -> Result<Segment, SegmentError> {
    let err = |offset: usize, message: String| SegmentError {
        offset: offset as u64,
        message,
    };
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(err(
            0,
            "not a gpuq CUPTI segment (no GPUQCUPT header)".into(),
        ));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
    if version != FORMAT_VERSION {
        return Err(err(
            8,
            format!("segment format {version}; this gpuq reads format {FORMAT_VERSION}"),
        ));
    }
    let mut seg = Segment::default();
    let mut at = 16;
    let mut ended = false;
    while at < bytes.len() {
        if ended {
            return Err(err(at, "bytes after the end block".into()));
        }
        if bytes.len() - at < 8 {
            return Err(err(at, "block header cut short".into()));
        }
        let tag = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let body_at = at + 8;
        let Some(body) = body_at
            .checked_add(len)
            .and_then(|end| bytes.get(body_at..end))
        else {
            return Err(err(
                at,
                format!("block of {len} bytes runs past the end of the file"),
            ));
        };
        let text = |body: &[u8]| {
            String::from_utf8(body.to_vec()).map_err(|e| {
                err(
                    body_at + e.utf8_error().valid_up_to(),
                    "invalid UTF-8".into(),
                )
            })
        };
        match tag {
            t if t == Block::Meta as u32 => seg.meta = text(body)?,
            t if t == Block::Health as u32 => seg.health = text(body)?,
            t if t == Block::Strings as u32 => read_strings(body, body_at, &mut seg.strings)?,
            t if t == Block::Records as u32 => read_records(body, body_at, &mut seg.records)?,
            t if t == Block::End as u32 => {
                if len != 8 {
                    return Err(err(at, format!("end block of {len} bytes, not 8")));
                }
                let n = u64::from_le_bytes(body.try_into().unwrap());
                if n != seg.records.len() as u64 {
                    return Err(err(
                        body_at,
                        format!(
                            "the end block counts {n} records, the segment holds {}",
                            seg.records.len()
                        ),
                    ));
                }
                ended = true;
            }
            other => return Err(err(at, format!("unknown block tag {other}"))),
        }
        at = body_at + len;
    }
    if !ended {
        return Err(err(at, "the segment has no end block (cut short)".into()));
    }
    Ok(seg)
}

fn read_strings(
    body: &[u8],
    base: usize,
    out: &mut HashMap<u32, String>,
) -> Result<(), SegmentError> {
    let err = |o: usize, m: &str| SegmentError {
        offset: (base + o) as u64,
        message: m.into(),
    };
    if body.len() < 4 {
        return Err(err(0, "strings block without a count"));
    }
    let count = u32::from_le_bytes(body[..4].try_into().unwrap());
    let mut at = 4;
    for _ in 0..count {
        let Some(head) = body.get(at..at + 8) else {
            return Err(err(at, "string header cut short"));
        };
        let id = u32::from_le_bytes(head[..4].try_into().unwrap());
        let len = u32::from_le_bytes(head[4..].try_into().unwrap()) as usize;
        let Some(text) = (at + 8)
            .checked_add(len)
            .and_then(|end| body.get(at + 8..end))
        else {
            return Err(err(at, "string runs past its block"));
        };
        // CUPTI's texts are C strings from the application: keep what is not UTF-8, visibly.
        out.insert(id, String::from_utf8_lossy(text).into_owned());
        at += 8 + len;
    }
    if at != body.len() {
        return Err(err(at, "bytes after the last string of the block"));
    }
    Ok(())
}

fn read_records(body: &[u8], base: usize, out: &mut Vec<RawRecord>) -> Result<(), SegmentError> {
    let err = |o: usize, m: String| SegmentError {
        offset: (base + o) as u64,
        message: m,
    };
    if body.len() < 4 {
        return Err(err(0, "records block without a count".into()));
    }
    let count = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
    if Some(body.len() - 4) != count.checked_mul(RECORD_BYTES) {
        return Err(err(
            0,
            format!(
                "records block of {} bytes does not hold {count} records of {RECORD_BYTES}",
                body.len() - 4
            ),
        ));
    }
    out.reserve(count);
    for (i, chunk) in body[4..].chunks_exact(RECORD_BYTES).enumerate() {
        let record = RawRecord::decode(chunk).ok_or_else(|| {
            err(
                4 + i * RECORD_BYTES,
                format!("record #{i} has unknown kind {}", chunk[0]),
            )
        })?;
        out.push(record);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RawRecord {
        RawRecord {
            kind: RecordKind::Kernel,
            copy_kind: 1,
            src_kind: 2,
            dst_kind: 3,
            code: 211,
            start: 1_700_000_000_000_000_123,
            end: -5,
            device: 1,
            context: 2,
            stream: 7,
            correlation: 99,
            pid: 4242,
            tid: 4343,
            name: 1,
            detail: 2,
            grid: [1, -2, 3],
            block: [128, 1, 1],
            registers: 255,
            launch_type: 3,
            object_kind: 2,
            return_value: 700,
            static_smem: 48 << 10,
            dynamic_smem: 1,
            bytes: u64::MAX - 1,
            graph_node: 1 << 40,
            graph_id: 17,
            value: 0xDEAD,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut b = Vec::new();
        sample().encode(&mut b);
        assert_eq!(b.len(), RECORD_BYTES);
        assert_eq!(RawRecord::decode(&b), Some(sample()));
        b[0] = 200;
        assert_eq!(RawRecord::decode(&b), None);
    }

    #[test]
    fn a_segment_reads_back_and_any_cut_is_an_error() {
        let mut s = SegmentBuilder::new();
        s.string(1, b"_Z3fooi");
        s.string(2, "Überstep".as_bytes());
        for i in 0..3 {
            let mut r = sample();
            r.correlation = i;
            s.record(&r);
        }
        let bytes = s.finish("{\"pid\":4242}", "{\"dropped\":0}");
        let seg = read_segment(&bytes).unwrap();
        assert_eq!(seg.meta, "{\"pid\":4242}");
        assert_eq!(seg.health, "{\"dropped\":0}");
        assert_eq!(seg.text(1), Some("_Z3fooi"));
        assert_eq!(seg.text(2), Some("Überstep"));
        assert_eq!(seg.text(0), None);
        assert_eq!(seg.records.len(), 3);
        assert_eq!(seg.records[2].correlation, 2);
        // Every prefix is refused with a position inside the file, never a panic.
        for cut in 0..bytes.len() {
            let e = read_segment(&bytes[..cut]).unwrap_err();
            assert!(e.offset <= cut as u64, "cut {cut}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(read_segment(&longer).is_err());
    }

    #[test]
    fn names_parse_back() {
        let n = segment_name(4242, 17);
        assert_eq!(parse_segment_name(&n), Some((4242, 17)));
        assert_eq!(parse_segment_name(&format!(".{n}.tmp")), None);
        assert_eq!(parse_status_name(&status_name(7)), Some(7));
        assert_eq!(parse_segment_name("cupti-1-2.seg"), None);
        let dir = std::env::temp_dir().join(format!("gpuq-wal-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = write_atomically(&dir, &n, b"abc").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
