//! Where the fields gpuq keeps sit in CUPTI's activity records, and the decoding of one record
//! into a [`RawRecord`].
//!
//! New struct versions append fields, so the fields gpuq reads sit at the same offsets in
//! every version from CUDA 12.8 to 13.5 (`Kernel9/10/13`, `Memcpy6/7`, `Memset4/5`,
//! `Device5/6`, `Context3/4`; the others did not change). The offsets below are checked
//! against `tools/cupti_layouts/layouts.golden`, compiled from NVIDIA's headers. Records are
//! walked with CUPTI's own `cuptiActivityGetNextRecord`, so their sizes never matter here.

use crate::cupti::kind;
use gpuq_cupti_wal::{RawRecord, RecordKind};

/// Field offsets, by record: (struct in the golden table, field, offset).
pub mod offsets {
    pub mod kernel {
        pub const REGISTERS: usize = 6;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE: usize = 40;
        pub const CONTEXT: usize = 44;
        pub const STREAM: usize = 48;
        pub const GRID: usize = 52;
        pub const BLOCK: usize = 64;
        pub const STATIC_SMEM: usize = 76;
        pub const DYNAMIC_SMEM: usize = 80;
        pub const CORRELATION: usize = 92;
        pub const NAME: usize = 104;
        pub const LAUNCH_TYPE: usize = 136;
        pub const GRAPH_NODE: usize = 144;
        pub const GRAPH_ID: usize = 156;
    }
    pub mod memcpy {
        pub const COPY_KIND: usize = 4;
        pub const SRC_KIND: usize = 5;
        pub const DST_KIND: usize = 6;
        pub const BYTES: usize = 8;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE: usize = 32;
        pub const CONTEXT: usize = 36;
        pub const STREAM: usize = 40;
        pub const CORRELATION: usize = 44;
        pub const GRAPH_NODE: usize = 64;
    }
    pub mod memset {
        pub const VALUE: usize = 4;
        pub const BYTES: usize = 8;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE: usize = 32;
        pub const CONTEXT: usize = 36;
        pub const STREAM: usize = 40;
        pub const CORRELATION: usize = 44;
        pub const MEMORY_KIND: usize = 50;
    }
    pub mod api {
        pub const CBID: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const PROCESS: usize = 24;
        pub const THREAD: usize = 28;
        pub const CORRELATION: usize = 32;
        pub const RETURN_VALUE: usize = 36;
    }
    pub mod sync {
        pub const TYPE: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const CORRELATION: usize = 24;
        pub const CONTEXT: usize = 28;
        pub const STREAM: usize = 32;
        pub const EVENT: usize = 36;
    }
    pub mod external_correlation {
        pub const KIND: usize = 4;
        pub const ID: usize = 8;
        pub const CORRELATION: usize = 16;
    }
    pub mod marker {
        pub const FLAGS: usize = 4;
        pub const TIMESTAMP: usize = 8;
        pub const ID: usize = 16;
        pub const OBJECT_KIND: usize = 20;
        pub const OBJECT_ID: usize = 24;
        pub const NAME: usize = 40;
        pub const DOMAIN: usize = 48;
    }
    pub mod overhead {
        pub const KIND: usize = 4;
        pub const OBJECT_KIND: usize = 8;
        pub const OBJECT_ID: usize = 12;
        pub const START: usize = 24;
        pub const END: usize = 32;
        pub const CORRELATION: usize = 40;
    }
    pub mod device {
        pub const MEMORY: usize = 16;
        pub const SMS: usize = 44;
        pub const CC_MAJOR: usize = 104;
        pub const CC_MINOR: usize = 108;
        pub const ID: usize = 112;
        pub const UUID: usize = 120;
        pub const NAME: usize = 136;
    }
    pub mod context {
        pub const CONTEXT: usize = 4;
        pub const DEVICE: usize = 8;
    }
}

/// CUPTI's object kind of a thread (`CUPTI_ACTIVITY_OBJECT_THREAD`).
const OBJECT_THREAD: u32 = 2;

/// Turns the C strings records point to into string ids of the segment being written.
pub trait Strings {
    /// The id of the NUL-terminated string at `ptr` (0 for NULL).
    fn c_string(&mut self, ptr: *const u8) -> u32;
    /// The id of a string the collector made (a device UUID).
    fn text(&mut self, text: &str) -> u32;
}

/// A record's bytes, read at offsets.
struct Fields(*const u8);

impl Fields {
    #[inline]
    fn u8(&self, o: usize) -> u8 {
        // SAFETY: `o` lies within the record (offsets checked against the headers).
        unsafe { self.0.add(o).read() }
    }
    #[inline]
    fn u16(&self, o: usize) -> u16 {
        // SAFETY: as above; records are not guaranteed aligned for every field.
        unsafe { (self.0.add(o) as *const u16).read_unaligned() }
    }
    #[inline]
    fn u32(&self, o: usize) -> u32 {
        // SAFETY: as above.
        unsafe { (self.0.add(o) as *const u32).read_unaligned() }
    }
    #[inline]
    fn u64(&self, o: usize) -> u64 {
        // SAFETY: as above.
        unsafe { (self.0.add(o) as *const u64).read_unaligned() }
    }
    #[inline]
    fn i64(&self, o: usize) -> i64 {
        self.u64(o) as i64
    }
    #[inline]
    fn ptr(&self, o: usize) -> *const u8 {
        self.u64(o) as usize as *const u8
    }
}

/// What became of a record.
pub enum Decoded {
    Record(RawRecord),
    /// A GPU record without timestamps (CUPTI ran out of device buffer for it).
    ZeroTimestamp,
    /// A kind the collector does not store.
    Unknown,
}

/// Decodes the CUPTI record at `rec`.
///
/// # Safety
/// `rec` points to a whole activity record that CUPTI returned from
/// `cuptiActivityGetNextRecord`, and its string pointers are valid C strings or NULL.
pub unsafe fn decode(rec: *const u8, strings: &mut impl Strings) -> Decoded {
    let f = Fields(rec);
    let mut r = RawRecord::default();
    match f.u32(0) {
        kind::CONCURRENT_KERNEL | kind::KERNEL => {
            use offsets::kernel as o;
            r.kind = RecordKind::Kernel;
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            if r.start == 0 && r.end == 0 {
                return Decoded::ZeroTimestamp;
            }
            r.registers = f.u16(o::REGISTERS);
            r.device = f.u32(o::DEVICE);
            r.context = f.u32(o::CONTEXT);
            r.stream = f.u32(o::STREAM);
            for i in 0..3 {
                r.grid[i] = f.u32(o::GRID + 4 * i) as i32;
                r.block[i] = f.u32(o::BLOCK + 4 * i) as i32;
            }
            r.static_smem = f.u32(o::STATIC_SMEM);
            r.dynamic_smem = f.u32(o::DYNAMIC_SMEM);
            r.correlation = f.u32(o::CORRELATION);
            r.name = strings.c_string(f.ptr(o::NAME));
            r.launch_type = f.u8(o::LAUNCH_TYPE);
            r.graph_node = f.u64(o::GRAPH_NODE);
            r.graph_id = f.u32(o::GRAPH_ID);
        }
        kind::MEMCPY => {
            use offsets::memcpy as o;
            r.kind = RecordKind::Memcpy;
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            if r.start == 0 && r.end == 0 {
                return Decoded::ZeroTimestamp;
            }
            r.copy_kind = f.u8(o::COPY_KIND);
            r.src_kind = f.u8(o::SRC_KIND);
            r.dst_kind = f.u8(o::DST_KIND);
            r.bytes = f.u64(o::BYTES);
            r.device = f.u32(o::DEVICE);
            r.context = f.u32(o::CONTEXT);
            r.stream = f.u32(o::STREAM);
            r.correlation = f.u32(o::CORRELATION);
            r.graph_node = f.u64(o::GRAPH_NODE);
        }
        kind::MEMSET => {
            use offsets::memset as o;
            r.kind = RecordKind::Memset;
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            if r.start == 0 && r.end == 0 {
                return Decoded::ZeroTimestamp;
            }
            r.value = f.u32(o::VALUE);
            r.bytes = f.u64(o::BYTES);
            r.device = f.u32(o::DEVICE);
            r.context = f.u32(o::CONTEXT);
            r.stream = f.u32(o::STREAM);
            r.correlation = f.u32(o::CORRELATION);
            r.code = f.u16(o::MEMORY_KIND) as u32;
        }
        k @ (kind::RUNTIME | kind::DRIVER) => {
            use offsets::api as o;
            r.kind = if k == kind::RUNTIME {
                RecordKind::Runtime
            } else {
                RecordKind::Driver
            };
            r.code = f.u32(o::CBID);
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            r.pid = f.u32(o::PROCESS);
            r.tid = f.u32(o::THREAD);
            r.correlation = f.u32(o::CORRELATION);
            r.return_value = f.u32(o::RETURN_VALUE);
        }
        kind::SYNCHRONIZATION => {
            use offsets::sync as o;
            r.kind = RecordKind::Sync;
            r.code = f.u32(o::TYPE);
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            r.correlation = f.u32(o::CORRELATION);
            r.context = f.u32(o::CONTEXT);
            r.stream = f.u32(o::STREAM);
            r.value = f.u32(o::EVENT);
        }
        kind::EXTERNAL_CORRELATION => {
            use offsets::external_correlation as o;
            r.kind = RecordKind::ExternalCorrelation;
            r.value = f.u32(o::KIND);
            r.bytes = f.u64(o::ID);
            r.correlation = f.u32(o::CORRELATION);
        }
        kind::MARKER => {
            use offsets::marker as o;
            r.kind = RecordKind::Marker;
            r.code = f.u32(o::FLAGS);
            r.start = f.i64(o::TIMESTAMP);
            r.end = r.start;
            r.value = f.u32(o::ID);
            let object_kind = f.u32(o::OBJECT_KIND);
            r.object_kind = object_kind as u8;
            if object_kind == OBJECT_THREAD {
                r.pid = f.u32(o::OBJECT_ID);
                r.tid = f.u32(o::OBJECT_ID + 4);
            }
            r.name = strings.c_string(f.ptr(o::NAME));
            r.detail = strings.c_string(f.ptr(o::DOMAIN));
        }
        kind::OVERHEAD => {
            use offsets::overhead as o;
            r.kind = RecordKind::Overhead;
            r.code = f.u32(o::KIND);
            let object_kind = f.u32(o::OBJECT_KIND);
            r.object_kind = object_kind as u8;
            if object_kind == OBJECT_THREAD {
                r.pid = f.u32(o::OBJECT_ID);
                r.tid = f.u32(o::OBJECT_ID + 4);
            }
            r.start = f.i64(o::START);
            r.end = f.i64(o::END);
            r.correlation = f.u32(o::CORRELATION);
        }
        kind::DEVICE => {
            use offsets::device as o;
            r.kind = RecordKind::Device;
            r.bytes = f.u64(o::MEMORY);
            r.value = f.u32(o::SMS);
            r.grid = [f.u32(o::CC_MAJOR) as i32, f.u32(o::CC_MINOR) as i32, 0];
            r.device = f.u32(o::ID);
            let mut uuid = [0u8; 16];
            for (i, b) in uuid.iter_mut().enumerate() {
                *b = f.u8(o::UUID + i);
            }
            r.detail = strings.text(&uuid_text(&uuid));
            r.name = strings.c_string(f.ptr(o::NAME));
        }
        kind::CONTEXT => {
            use offsets::context as o;
            r.kind = RecordKind::Context;
            r.context = f.u32(o::CONTEXT);
            r.device = f.u32(o::DEVICE);
        }
        _ => return Decoded::Unknown,
    }
    Decoded::Record(r)
}

/// A UUID as `nvidia-smi -L` writes it: `GPU-8-4-4-4-12` hex digits.
fn uuid_text(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The golden table: (api version, struct, field) -> offset.
    fn golden() -> HashMap<(String, String, String), usize> {
        include_str!("../../tools/cupti_layouts/layouts.golden")
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let c: Vec<&str> = l.split('\t').collect();
                (
                    (c[0].to_string(), c[1].to_string(), c[2].to_string()),
                    c[3].parse().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn offsets_equal_nvidias_headers_in_every_version() {
        use offsets::*;
        let table = golden();
        let versions: std::collections::BTreeSet<String> =
            table.keys().map(|k| k.0.clone()).collect();
        assert!(versions.len() >= 3, "golden table has {versions:?}");
        let ours: &[(&str, &str, usize)] = &[
            ("kernel", "registersPerThread", kernel::REGISTERS),
            ("kernel", "start", kernel::START),
            ("kernel", "end", kernel::END),
            ("kernel", "deviceId", kernel::DEVICE),
            ("kernel", "contextId", kernel::CONTEXT),
            ("kernel", "streamId", kernel::STREAM),
            ("kernel", "gridX", kernel::GRID),
            ("kernel", "gridY", kernel::GRID + 4),
            ("kernel", "gridZ", kernel::GRID + 8),
            ("kernel", "blockX", kernel::BLOCK),
            ("kernel", "blockY", kernel::BLOCK + 4),
            ("kernel", "blockZ", kernel::BLOCK + 8),
            ("kernel", "staticSharedMemory", kernel::STATIC_SMEM),
            ("kernel", "dynamicSharedMemory", kernel::DYNAMIC_SMEM),
            ("kernel", "correlationId", kernel::CORRELATION),
            ("kernel", "name", kernel::NAME),
            ("kernel", "launchType", kernel::LAUNCH_TYPE),
            ("kernel", "graphNodeId", kernel::GRAPH_NODE),
            ("kernel", "graphId", kernel::GRAPH_ID),
            ("memcpy", "copyKind", memcpy::COPY_KIND),
            ("memcpy", "srcKind", memcpy::SRC_KIND),
            ("memcpy", "dstKind", memcpy::DST_KIND),
            ("memcpy", "bytes", memcpy::BYTES),
            ("memcpy", "start", memcpy::START),
            ("memcpy", "end", memcpy::END),
            ("memcpy", "deviceId", memcpy::DEVICE),
            ("memcpy", "contextId", memcpy::CONTEXT),
            ("memcpy", "streamId", memcpy::STREAM),
            ("memcpy", "correlationId", memcpy::CORRELATION),
            ("memcpy", "graphNodeId", memcpy::GRAPH_NODE),
            ("memset", "value", memset::VALUE),
            ("memset", "bytes", memset::BYTES),
            ("memset", "start", memset::START),
            ("memset", "end", memset::END),
            ("memset", "deviceId", memset::DEVICE),
            ("memset", "contextId", memset::CONTEXT),
            ("memset", "streamId", memset::STREAM),
            ("memset", "correlationId", memset::CORRELATION),
            ("memset", "memoryKind", memset::MEMORY_KIND),
            ("api", "cbid", api::CBID),
            ("api", "start", api::START),
            ("api", "end", api::END),
            ("api", "processId", api::PROCESS),
            ("api", "threadId", api::THREAD),
            ("api", "correlationId", api::CORRELATION),
            ("api", "returnValue", api::RETURN_VALUE),
            ("sync", "type", sync::TYPE),
            ("sync", "start", sync::START),
            ("sync", "end", sync::END),
            ("sync", "correlationId", sync::CORRELATION),
            ("sync", "contextId", sync::CONTEXT),
            ("sync", "streamId", sync::STREAM),
            ("sync", "cudaEventId", sync::EVENT),
            (
                "external_correlation",
                "externalKind",
                external_correlation::KIND,
            ),
            (
                "external_correlation",
                "externalId",
                external_correlation::ID,
            ),
            (
                "external_correlation",
                "correlationId",
                external_correlation::CORRELATION,
            ),
            ("marker", "flags", marker::FLAGS),
            ("marker", "timestamp", marker::TIMESTAMP),
            ("marker", "id", marker::ID),
            ("marker", "objectKind", marker::OBJECT_KIND),
            ("marker", "objectId", marker::OBJECT_ID),
            ("marker", "name", marker::NAME),
            ("marker", "domain", marker::DOMAIN),
            ("overhead", "overheadKind", overhead::KIND),
            ("overhead", "objectKind", overhead::OBJECT_KIND),
            ("overhead", "objectId", overhead::OBJECT_ID),
            ("overhead", "start", overhead::START),
            ("overhead", "end", overhead::END),
            ("overhead", "correlationId", overhead::CORRELATION),
            ("device", "globalMemorySize", device::MEMORY),
            ("device", "numMultiprocessors", device::SMS),
            ("device", "computeCapabilityMajor", device::CC_MAJOR),
            ("device", "computeCapabilityMinor", device::CC_MINOR),
            ("device", "id", device::ID),
            ("device", "uuid", device::UUID),
            ("device", "name", device::NAME),
            ("context", "contextId", context::CONTEXT),
            ("context", "deviceId", context::DEVICE),
        ];
        for v in &versions {
            for (record, field, offset) in ours {
                let key = (v.clone(), record.to_string(), field.to_string());
                let golden = table
                    .get(&key)
                    .unwrap_or_else(|| panic!("golden table lacks {key:?}"));
                assert_eq!(offset, golden, "{record}.{field} in CUPTI API {v}");
            }
            // The kinds the collector switches on.
            for (name, value) in [
                ("CUPTI_ACTIVITY_KIND_MEMCPY", kind::MEMCPY),
                ("CUPTI_ACTIVITY_KIND_MEMSET", kind::MEMSET),
                ("CUPTI_ACTIVITY_KIND_KERNEL", kind::KERNEL),
                ("CUPTI_ACTIVITY_KIND_DRIVER", kind::DRIVER),
                ("CUPTI_ACTIVITY_KIND_RUNTIME", kind::RUNTIME),
                ("CUPTI_ACTIVITY_KIND_DEVICE", kind::DEVICE),
                ("CUPTI_ACTIVITY_KIND_CONTEXT", kind::CONTEXT),
                (
                    "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
                    kind::CONCURRENT_KERNEL,
                ),
                ("CUPTI_ACTIVITY_KIND_MARKER", kind::MARKER),
                ("CUPTI_ACTIVITY_KIND_OVERHEAD", kind::OVERHEAD),
                ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", kind::SYNCHRONIZATION),
                (
                    "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION",
                    kind::EXTERNAL_CORRELATION,
                ),
            ] {
                let key = (v.clone(), "enum".to_string(), name.to_string());
                assert_eq!(table.get(&key), Some(&(value as usize)), "{name} in {v}");
            }
        }
    }

    #[test]
    fn uuid_text_is_nvidia_smis() {
        let b: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(uuid_text(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
