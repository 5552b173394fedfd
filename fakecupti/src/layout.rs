//! Record layouts of the fake: the byte offsets and sizes of every CUPTI activity record field the
//! fake writes, per scripted CUPTI version, transcribed from `tools/cupti_layouts/layouts.golden`
//! (gcc `offsetof` against the 12.8 / 13.0 / 13.5 wheel headers). Deliberately independent of the
//! collector's decoder so a layout bug cannot cancel out; `tests.rs` checks this file against the
//! golden table row by row.

/// CUPTI activity kinds and result codes the fake uses (golden `enum` rows; equal in all three
/// header sets).
pub mod consts {
    pub const KIND_MEMCPY: u32 = 1;
    pub const KIND_MEMSET: u32 = 2;
    pub const KIND_KERNEL: u32 = 3;
    pub const KIND_DRIVER: u32 = 4;
    pub const KIND_RUNTIME: u32 = 5;
    pub const KIND_DEVICE: u32 = 8;
    pub const KIND_CONTEXT: u32 = 9;
    pub const KIND_CONCURRENT_KERNEL: u32 = 10;
    pub const KIND_MARKER: u32 = 12;
    pub const KIND_OVERHEAD: u32 = 17;
    pub const KIND_SYNCHRONIZATION: u32 = 38;
    pub const KIND_EXTERNAL_CORRELATION: u32 = 39;

    pub const SUCCESS: u32 = 0;
    pub const ERROR_INVALID_PARAMETER: u32 = 1;
    pub const ERROR_MAX_LIMIT_REACHED: u32 = 12;
    pub const ERROR_NOT_INITIALIZED: u32 = 15;
    pub const ERROR_INVALID_KIND: u32 = 21;
    pub const ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: u32 = 39;
    pub const ERROR_UNKNOWN: u32 = 999;

    pub const CB_DOMAIN_DRIVER_API: u32 = 1;
    pub const CB_DOMAIN_RUNTIME_API: u32 = 2;
    pub const OBJECT_THREAD: u32 = 2;
}

/// The record families the fake emits, by the golden table's generic struct names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rec {
    Kernel,
    Memcpy,
    Memset,
    Api,
    Sync,
    ExternalCorrelation,
    Marker,
    Overhead,
    Device,
    Context,
}

impl Rec {
    pub const ALL: [Rec; 10] = [
        Rec::Kernel,
        Rec::Memcpy,
        Rec::Memset,
        Rec::Api,
        Rec::Sync,
        Rec::ExternalCorrelation,
        Rec::Marker,
        Rec::Overhead,
        Rec::Device,
        Rec::Context,
    ];

    /// The generic name used in `layouts.golden`.
    pub fn golden_name(self) -> &'static str {
        match self {
            Rec::Kernel => "kernel",
            Rec::Memcpy => "memcpy",
            Rec::Memset => "memset",
            Rec::Api => "api",
            Rec::Sync => "sync",
            Rec::ExternalCorrelation => "external_correlation",
            Rec::Marker => "marker",
            Rec::Overhead => "overhead",
            Rec::Device => "device",
            Rec::Context => "context",
        }
    }

    /// The record family of an activity kind code found in a buffer (for `GetNextRecord`).
    pub fn of_kind(kind: u32) -> Option<Rec> {
        use consts::*;
        Some(match kind {
            KIND_KERNEL | KIND_CONCURRENT_KERNEL => Rec::Kernel,
            KIND_MEMCPY => Rec::Memcpy,
            KIND_MEMSET => Rec::Memset,
            KIND_DRIVER | KIND_RUNTIME => Rec::Api,
            KIND_SYNCHRONIZATION => Rec::Sync,
            KIND_EXTERNAL_CORRELATION => Rec::ExternalCorrelation,
            KIND_MARKER => Rec::Marker,
            KIND_OVERHEAD => Rec::Overhead,
            KIND_DEVICE => Rec::Device,
            KIND_CONTEXT => Rec::Context,
            _ => return None,
        })
    }
}

/// One header set: the CUPTI API version it reports and the sizes of its newest records.
#[derive(Debug)]
pub struct LayoutSet {
    /// `CUPTI_API_VERSION` of the header set (what `cuptiGetVersion` reports).
    pub api: u32,
    /// The CUDA release it stands for in scripts (`version 13000`).
    pub cuda: u32,
    /// C struct names, for messages only.
    pub structs: &'static str,
    sizes: [usize; 10],
    fields: &'static [Field],
}

/// (generic record, golden field name, offset, size in bytes)
pub type Field = (Rec, &'static str, usize, usize);

// Golden sizes in Rec::ALL order: kernel memcpy memset api sync extcorr marker overhead device context.
pub static CUPTI_12_8: LayoutSet = LayoutSet {
    api: 26,
    cuda: 12080,
    structs: "Kernel9 Memcpy6 Memset4 API Synchronization2 ExternalCorrelation Marker2 Overhead3 Device5 Context3",
    sizes: [208, 96, 88, 40, 56, 24, 56, 56, 184, 32],
    fields: COMMON_FIELDS,
};
pub static CUPTI_13_0: LayoutSet = LayoutSet {
    api: 130001,
    cuda: 13000,
    structs: "Kernel10 Memcpy6 Memset4 API Synchronization2 ExternalCorrelation Marker2 Overhead3 Device5 Context3",
    sizes: [216, 96, 88, 40, 56, 24, 56, 56, 184, 32],
    fields: COMMON_FIELDS,
};
pub static CUPTI_13_5: LayoutSet = LayoutSet {
    api: 130500,
    cuda: 13050,
    structs: "Kernel13 Memcpy7 Memset5 API Synchronization2 ExternalCorrelation Marker2 Overhead3 Device6 Context4",
    sizes: [248, 112, 104, 40, 56, 24, 56, 56, 192, 40],
    fields: COMMON_FIELDS,
};

pub static ALL_SETS: [&LayoutSet; 3] = [&CUPTI_12_8, &CUPTI_13_0, &CUPTI_13_5];

/// The golden table shows every field below at the same offset in all three header sets (new
/// versions only append), so one table serves all; a future set that moves a field gets its own.
static COMMON_FIELDS: &[Field] = &[
    (Rec::Kernel, "kind", 0, 4),
    (Rec::Kernel, "registersPerThread", 6, 2),
    (Rec::Kernel, "start", 16, 8),
    (Rec::Kernel, "end", 24, 8),
    (Rec::Kernel, "completed", 32, 8),
    (Rec::Kernel, "deviceId", 40, 4),
    (Rec::Kernel, "contextId", 44, 4),
    (Rec::Kernel, "streamId", 48, 4),
    (Rec::Kernel, "gridX", 52, 4),
    (Rec::Kernel, "gridY", 56, 4),
    (Rec::Kernel, "gridZ", 60, 4),
    (Rec::Kernel, "blockX", 64, 4),
    (Rec::Kernel, "blockY", 68, 4),
    (Rec::Kernel, "blockZ", 72, 4),
    (Rec::Kernel, "staticSharedMemory", 76, 4),
    (Rec::Kernel, "dynamicSharedMemory", 80, 4),
    (Rec::Kernel, "correlationId", 92, 4),
    (Rec::Kernel, "gridId", 96, 8),
    (Rec::Kernel, "name", 104, 8),
    (Rec::Kernel, "queued", 120, 8),
    (Rec::Kernel, "submitted", 128, 8),
    (Rec::Kernel, "launchType", 136, 1),
    (Rec::Kernel, "graphNodeId", 144, 8),
    (Rec::Kernel, "graphId", 156, 4),
    (Rec::Memcpy, "kind", 0, 4),
    (Rec::Memcpy, "copyKind", 4, 1),
    (Rec::Memcpy, "srcKind", 5, 1),
    (Rec::Memcpy, "dstKind", 6, 1),
    (Rec::Memcpy, "flags", 7, 1),
    (Rec::Memcpy, "bytes", 8, 8),
    (Rec::Memcpy, "start", 16, 8),
    (Rec::Memcpy, "end", 24, 8),
    (Rec::Memcpy, "deviceId", 32, 4),
    (Rec::Memcpy, "contextId", 36, 4),
    (Rec::Memcpy, "streamId", 40, 4),
    (Rec::Memcpy, "correlationId", 44, 4),
    (Rec::Memcpy, "graphNodeId", 64, 8),
    (Rec::Memcpy, "graphId", 72, 4),
    (Rec::Memset, "kind", 0, 4),
    (Rec::Memset, "value", 4, 4),
    (Rec::Memset, "bytes", 8, 8),
    (Rec::Memset, "start", 16, 8),
    (Rec::Memset, "end", 24, 8),
    (Rec::Memset, "deviceId", 32, 4),
    (Rec::Memset, "contextId", 36, 4),
    (Rec::Memset, "streamId", 40, 4),
    (Rec::Memset, "correlationId", 44, 4),
    (Rec::Memset, "flags", 48, 2),
    (Rec::Memset, "memoryKind", 50, 2),
    (Rec::Memset, "graphNodeId", 64, 8),
    (Rec::Memset, "graphId", 72, 4),
    (Rec::Api, "kind", 0, 4),
    (Rec::Api, "cbid", 4, 4),
    (Rec::Api, "start", 8, 8),
    (Rec::Api, "end", 16, 8),
    (Rec::Api, "processId", 24, 4),
    (Rec::Api, "threadId", 28, 4),
    (Rec::Api, "correlationId", 32, 4),
    (Rec::Api, "returnValue", 36, 4),
    (Rec::Sync, "kind", 0, 4),
    (Rec::Sync, "type", 4, 4),
    (Rec::Sync, "start", 8, 8),
    (Rec::Sync, "end", 16, 8),
    (Rec::Sync, "correlationId", 24, 4),
    (Rec::Sync, "contextId", 28, 4),
    (Rec::Sync, "streamId", 32, 4),
    (Rec::Sync, "cudaEventId", 36, 4),
    (Rec::ExternalCorrelation, "kind", 0, 4),
    (Rec::ExternalCorrelation, "externalKind", 4, 4),
    (Rec::ExternalCorrelation, "externalId", 8, 8),
    (Rec::ExternalCorrelation, "correlationId", 16, 4),
    (Rec::Marker, "kind", 0, 4),
    (Rec::Marker, "flags", 4, 4),
    (Rec::Marker, "timestamp", 8, 8),
    (Rec::Marker, "id", 16, 4),
    (Rec::Marker, "objectKind", 20, 4),
    // CUpti_ActivityObjectKindId union: {pt: processId u32, threadId u32} / {dcs: device, context, stream}.
    (Rec::Marker, "objectId", 24, 12),
    (Rec::Marker, "name", 40, 8),
    (Rec::Marker, "domain", 48, 8),
    (Rec::Overhead, "kind", 0, 4),
    (Rec::Overhead, "overheadKind", 4, 4),
    (Rec::Overhead, "objectKind", 8, 4),
    (Rec::Overhead, "objectId", 12, 12),
    (Rec::Overhead, "start", 24, 8),
    (Rec::Overhead, "end", 32, 8),
    (Rec::Overhead, "correlationId", 40, 4),
    (Rec::Device, "kind", 0, 4),
    (Rec::Device, "globalMemorySize", 16, 8),
    (Rec::Device, "numMultiprocessors", 44, 4),
    (Rec::Device, "computeCapabilityMajor", 104, 4),
    (Rec::Device, "computeCapabilityMinor", 108, 4),
    (Rec::Device, "id", 112, 4),
    (Rec::Device, "uuid", 120, 16),
    (Rec::Device, "name", 136, 8),
    (Rec::Context, "kind", 0, 4),
    (Rec::Context, "contextId", 4, 4),
    (Rec::Context, "deviceId", 8, 4),
];

impl LayoutSet {
    /// The set for a scripted version: a CUDA release (12080/13000/13050) or an API version
    /// (26/130001/130500).
    pub fn for_version(v: u32) -> Option<&'static LayoutSet> {
        ALL_SETS.iter().copied().find(|s| s.cuda == v || s.api == v)
    }

    pub fn for_api(api: u32) -> &'static LayoutSet {
        ALL_SETS
            .iter()
            .copied()
            .find(|s| s.api == api)
            .unwrap_or(&CUPTI_13_0)
    }

    pub fn size(&self, rec: Rec) -> usize {
        self.sizes[Rec::ALL.iter().position(|r| *r == rec).unwrap_or(0)]
    }

    /// (offset, size) of a field, `None` if this set's struct lacks it.
    pub fn field(&self, rec: Rec, name: &str) -> Option<(usize, usize)> {
        self.fields
            .iter()
            .find(|f| f.0 == rec && f.1 == name)
            .map(|f| (f.2, f.3))
    }

    pub fn fields(&self) -> &'static [Field] {
        self.fields
    }
}

/// A record under construction: zeroed bytes of the set's record size (unspecified fields are 0,
/// as in the script format), filled field by field.
pub struct RecordBytes {
    pub rec: Rec,
    set: &'static LayoutSet,
    pub bytes: Vec<u8>,
}

impl RecordBytes {
    pub fn new(set: &'static LayoutSet, rec: Rec, kind: u32) -> RecordBytes {
        let mut r = RecordBytes {
            rec,
            set,
            bytes: vec![0; set.size(rec)],
        };
        r.put("kind", kind as u64).expect("every record has a kind");
        r
    }

    /// Writes `v` little-endian into the field; errors if the value does not fit its width
    /// (a script typo such as `copy_kind=300` must not be silently truncated).
    pub fn put(&mut self, field: &str, v: u64) -> Result<(), String> {
        let (off, size) = self
            .set
            .field(self.rec, field)
            .ok_or_else(|| format!("{}: no field {field}", self.rec.golden_name()))?;
        if size < 8 && v >> (size * 8) != 0 {
            return Err(format!("{field}={v} does not fit in {size} byte(s)"));
        }
        self.bytes[off..off + size.min(8)].copy_from_slice(&v.to_le_bytes()[..size.min(8)]);
        Ok(())
    }

    /// Writes raw bytes (uuid, objectId) at the field's offset; at most the field's size.
    pub fn put_bytes(&mut self, field: &str, b: &[u8]) -> Result<(), String> {
        let (off, size) = self
            .set
            .field(self.rec, field)
            .ok_or_else(|| format!("{}: no field {field}", self.rec.golden_name()))?;
        if b.len() > size {
            return Err(format!("{field}: {} bytes > {size}", b.len()));
        }
        self.bytes[off..off + b.len()].copy_from_slice(b);
        Ok(())
    }

    /// Object id {processId, threadId} (CUpti_ActivityObjectKindId.pt).
    pub fn put_thread_object(&mut self, field: &str, pid: u32, tid: u32) -> Result<(), String> {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&pid.to_le_bytes());
        b[4..].copy_from_slice(&tid.to_le_bytes());
        self.put_bytes(field, &b)
    }
}
