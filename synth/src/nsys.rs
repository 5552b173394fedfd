//! Deterministic synthetic Nsight Systems SQLite export (schema 3.25.0 layout) with known
//! ground truth.
//!
//! [`write_nsys`] writes what `nsys export --type sqlite` of a multi-rank PyTorch run with
//! `--trace=cuda,nvtx` and `emit_nvtx` looks like: one process per rank, one GPU each, and
//! returns an [`NsysTruth`] computed from the very integers that were inserted. The output
//! depends only on the [`NsysConfig`] (its own splitmix64 generator), so it is byte-identical
//! for a given config. Used by the nsys adapter's fresh-clone tests and by the ingest benchmark
//! ([`NsysConfig::with_kernels`]).
//!
//! Faithful to real exports (see `nsys-schema.md`): integer ns on a session timebase that starts
//! at 1e9; `globalTid = (1 << 48) | (pid << 24) | tid`, `globalPid = globalTid & !0xFFFFFF`;
//! names through `StringIds`; the 3.25.0 column lists (40 kernel columns,
//! `tensorSizeMinusOneElements = '[]'`); no indexes; tables only for data that exists.
//! Correlation ids are per process and start at 1 in every process, so they collide across
//! processes: GPU work must be matched to its API call by `(process, correlationId)`.
//!
//! Shape of one process (pid `pid_base + rank`, launching thread `tid == pid`, device `rank`,
//! context 1, compute streams 7 and 13, copy stream 14):
//! init: driver calls (`cuGetProcAddress_v2`, `cuLibraryLoadData`, ... eventClass 1),
//! `cudaGetDeviceProperties_v2_v12000`, an NVTX domain `NCCL` (eventType 75), a mark
//! (eventType 34) and, if `warmup`, an H2D copy and one kernel outside every NVTX range.
//! Each `ProfilerStep#N` (push/pop range, `text`) encloses: `aten::copy_` > H2D memcpy (stream
//! 14); `aten::zero_` > memset; `cudaStreamIsCapturing_v10000`; `kernels_per_step` kernels, slot
//! `k % 8` of [`SLOTS`] (`aten::linear` > `aten::addmm` > cutlass gemm, `aten::add_`, `aten::mm`
//! > cuBLAS gemm, `aten::_softmax` (registered string, `textId`), `aten::sum` (stream 13),
//! `aten::mul`, `aten::gelu`, `nccl:all_reduce` > NCCL-domain range `ncclAllReduce` (`textId`,
//! domainId 1) > `cuLaunchKernelEx` (driver, eventClass 1) > NCCL kernel on stream 13);
//! `aten::clone` > `aten::copy_` > D2D memcpy; `aten::item` > `aten::_local_scalar_dense` > D2H
//! memcpy and `cudaStreamSynchronize_v3020` (SYNCHRONIZATION syncType 3 on stream 7) that waits
//! until every stream of the device is idle; then an idle gap. Kernels on one stream never
//! overlap; streams 7 and 13 overlap.

use crate::rng::Rng;
use rusqlite::{params, Connection, Statement};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What to generate. See the module docs for the shape of a process and a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsysConfig {
    /// Ranks: one process with one GPU (`deviceId == rank`) each.
    pub processes: usize,
    /// `ProfilerStep#N` ranges per process, numbered from `first_step`.
    pub steps: usize,
    pub first_step: usize,
    /// Kernels per step per process (slot `k % 8` of the step's kernel pattern).
    pub kernels_per_step: usize,
    pub seed: u64,
    /// Before the first step, per process: an H2D copy and one kernel outside any NVTX range.
    pub warmup: bool,
    /// pid of rank `r` is `pid_base + r` (the launching thread has `tid == pid`).
    pub pid_base: i64,
}

impl NsysConfig {
    /// 2 processes x 3 steps x 400 kernels (+ warm-up): about 2 400 kernels, 10 000 rows.
    pub fn small() -> Self {
        NsysConfig {
            processes: 2,
            steps: 3,
            first_step: 10,
            kernels_per_step: 400,
            seed: 7,
            warmup: true,
            pid_base: 31_400,
        }
    }

    /// About `total_kernels` kernels (exactly, when divisible by `4 * 1250`): 4 processes,
    /// 1 250 kernels per step, no warm-up kernels.
    pub fn with_kernels(total_kernels: usize) -> Self {
        let processes = 4;
        let kernels_per_step = 1250;
        let steps = total_kernels.div_ceil(processes * kernels_per_step).max(1);
        NsysConfig {
            processes,
            steps,
            first_step: 0,
            kernels_per_step,
            seed: 1,
            warmup: false,
            pid_base: 52_000,
        }
    }
}

/// Exact contents of what [`write_nsys`] wrote. Kernel names are `demangledName` values (what
/// `cuda_gpu_kern_sum` prints); durations are `end - start` in ns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsysTruth {
    pub kernels: u64,
    /// demangledName -> (count, sum, min, max of duration).
    pub kernel_sum_by_name: BTreeMap<String, (u64, i64, i64, i64)>,
    /// shortName -> (count, sum of duration). Several demangled names share a short name.
    pub kernel_sum_by_short_name: BTreeMap<String, (u64, i64)>,
    /// `'[CUDA memcpy ' || ENUM_CUDA_MEMCPY_OPER.label || ']'` -> (count, sum of duration).
    pub memcpy_by_op: BTreeMap<String, (u64, i64)>,
    /// Same key -> total bytes.
    pub memcpy_bytes_by_op: BTreeMap<String, i64>,
    /// MEMSET rows: (count, sum of duration, total bytes).
    pub memset: (u64, i64, i64),
    /// SYNCHRONIZATION rows (all syncType 3): (count, sum of duration).
    pub syncs: (u64, i64),
    /// Every RUNTIME row (runtime and driver), by name with a 4-digit `_vNNNN` suffix stripped
    /// (`cudaLaunchKernel_v7000` -> `cudaLaunchKernel`; `cudaLaunchKernelExC_v11060`,
    /// `cudaGetDeviceProperties_v2_v12000`, `cuGetProcAddress_v2` kept) -> (count, sum duration).
    pub runtime_by_name: BTreeMap<String, (u64, i64)>,
    /// RUNTIME rows by eventClass (0 runtime, 1 driver).
    pub runtime_by_class: BTreeMap<i64, u64>,
    /// Kernels by the eventClass of their launch call (0 `cudaLaunchKernel_v7000`, 1 `cuLaunchKernelEx`).
    pub kernels_by_launch_class: BTreeMap<i64, u64>,
    /// NVTX push/pop ranges (eventType 59), all domains, steps included.
    pub nvtx_ranges: u64,
    /// NVTX marks (eventType 34) and domain creations (eventType 75).
    pub nvtx_marks: u64,
    pub nvtx_domains: u64,
    /// Range text (`coalesce(text, StringIds[textId])`) -> count, for non-step ranges.
    pub nvtx_by_text: BTreeMap<String, u64>,
    /// `(pid, step number, start, end)` of each `ProfilerStep#N` range, by pid then step.
    pub steps: Vec<(i64, i64, i64, i64)>,
    /// Innermost NVTX range (any domain) enclosing the launch call (same thread,
    /// `range.start <= call.start && call.end <= range.end`), by its text -> (kernels, sum dur).
    /// Every in-step launch has an operator range, so no `ProfilerStep#N` key appears; NCCL
    /// kernels land in the NCCL-domain `ncclAllReduce`, `aten::linear` > `aten::addmm` in `aten::addmm`.
    pub kernels_by_range: BTreeMap<String, (u64, i64)>,
    /// Same, only ranges of the default domain (domainId 0): NCCL kernels land in `nccl:all_reduce`.
    pub kernels_by_default_range: BTreeMap<String, (u64, i64)>,
    /// Kernels whose launch lies in no NVTX range (the warm-up kernels).
    pub kernels_outside_ranges: u64,
    /// `(pid, step)` of the `ProfilerStep#N` enclosing the launch -> (kernels, sum dur).
    pub kernels_by_step: BTreeMap<(i64, i64), (u64, i64)>,
    /// `(pid, deviceId, streamId)` -> (kernels, sum dur).
    pub kernels_by_stream: BTreeMap<(i64, i64, i64), (u64, i64)>,
    /// `(pid, deviceId)` -> length of the union of its kernel, memcpy and memset intervals.
    pub busy_ns_by_device: BTreeMap<(i64, i64), i64>,
    /// `(pid, deviceId)` -> that union as sorted, disjoint, non-touching intervals: its
    /// idle gaps are the stretches between them.
    pub busy_union_by_device: BTreeMap<(i64, i64), Vec<(i64, i64)>>,
    /// Largest correlationId of each process (they all start at 1).
    pub max_correlation_by_pid: BTreeMap<i64, i64>,
    /// Earliest start and latest end over all events (ns, session timebase).
    pub first_ns: i64,
    pub last_ns: i64,
}

/// Session timebase origin: `ANALYSIS_DETAILS.startTime` and `systemClockNs`.
const SESSION_START: i64 = 1_000_000_000;
/// `hwId/vmId << 48` part of every serialized global id (= `ANALYSIS_DETAILS.globalVid`).
const VM: i64 = 1 << 48;
const CONTEXT: i64 = 1;
const STREAM_A: i64 = 7;
const STREAM_B: i64 = 13;
const STREAM_COPY: i64 = 14;
const NCCL_DOMAIN: i64 = 1;

/// `globalTid = (1 << 48) | (pid << 24) | tid`.
pub fn global_tid(pid: i64, tid: i64) -> i64 {
    VM | (pid << 24) | tid
}

/// `globalPid = globalTid & 0xFFFFFFFFFF000000`.
pub fn global_pid(pid: i64) -> i64 {
    global_tid(pid, 0)
}

/// The `cuda_api_sum` name: a trailing `_v` + 4 characters is dropped
/// (`CASE substr(name, -6, 2) WHEN '_v' THEN substr(name, 1, length(name) - 6) ELSE name END`).
pub fn api_sum_name(name: &str) -> &str {
    let b = name.as_bytes();
    if b.len() >= 6 && &b[b.len() - 6..b.len() - 4] == b"_v" {
        &name[..name.len() - 6]
    } else {
        name
    }
}

/// CREATE TABLE statements of the tables written, columns as in schema 3.25.0 (nsys 2026.2.1).
const DDL: &str = "
CREATE TABLE StringIds (
    id INTEGER NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE META_DATA_EXPORT (
    name TEXT NOT NULL,
    value TEXT
);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs INTEGER,
    utcTime TEXT,
    localTime TEXT,
    systemClockNs INTEGER
);
CREATE TABLE ANALYSIS_DETAILS (
    globalVid INTEGER NOT NULL,
    duration INTEGER NOT NULL,
    startTime INTEGER NOT NULL,
    stopTime INTEGER NOT NULL
);
CREATE TABLE TARGET_INFO_GPU (
    vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, isDiscrete INTEGER,
    l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER,
    smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, cuDevice INTEGER,
    ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER,
    constantMemory INTEGER, maxIPC INTEGER, maxRegistersPerBlock INTEGER,
    maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER,
    maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER,
    maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, maxThreadsPerBlock INTEGER,
    maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, maxGridDimX INTEGER,
    maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, computeMinor INTEGER,
    smMajor INTEGER, smMinor INTEGER
);
CREATE TABLE TARGET_INFO_CUDA_STREAM (
    streamId INTEGER NOT NULL,
    hwId INTEGER NOT NULL,
    vmId INTEGER NOT NULL,
    processId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    flag INTEGER NOT NULL
);
CREATE TABLE PROCESSES (
    globalPid INTEGER,
    pid INTEGER,
    name TEXT
);
CREATE TABLE ThreadNames (
    nameId INTEGER NOT NULL,
    priority INTEGER,
    globalTid INTEGER
);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    eventClass INTEGER NOT NULL,
    globalTid INTEGER,
    correlationId INTEGER,
    nameId INTEGER NOT NULL,
    returnValue INTEGER NOT NULL,
    callchainId INTEGER
);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    greenContextId INTEGER,
    streamId INTEGER NOT NULL,
    correlationId INTEGER,
    globalPid INTEGER,
    demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL,
    mangledName INTEGER,
    launchType INTEGER,
    cacheConfig INTEGER,
    registersPerThread INTEGER NOT NULL,
    gridX INTEGER NOT NULL,
    gridY INTEGER NOT NULL,
    gridZ INTEGER NOT NULL,
    blockX INTEGER NOT NULL,
    blockY INTEGER NOT NULL,
    blockZ INTEGER NOT NULL,
    staticSharedMemory INTEGER NOT NULL,
    dynamicSharedMemory INTEGER NOT NULL,
    localMemoryPerThread INTEGER NOT NULL,
    localMemoryTotal INTEGER NOT NULL,
    gridId INTEGER NOT NULL,
    sharedMemoryExecuted INTEGER,
    graphNodeId INTEGER,
    sharedMemoryLimitConfig INTEGER,
    qmdBulkReleaseDone INTEGER,
    qmdPreexitDone INTEGER,
    qmdLastCtaDone INTEGER,
    graphId INTEGER,
    clusterX INTEGER,
    clusterY INTEGER,
    clusterZ INTEGER,
    clusterSchedulingPolicy INTEGER,
    maxPotentialClusterSize INTEGER,
    maxActiveClusters INTEGER,
    sharedMemoryRequestedPercentage INTEGER,
    tensorSizeMinusOneElements TEXT NOT NULL
);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    greenContextId INTEGER,
    streamId INTEGER NOT NULL,
    correlationId INTEGER,
    globalPid INTEGER,
    bytes INTEGER NOT NULL,
    copyKind INTEGER NOT NULL,
    deprecatedSrcId INTEGER,
    srcKind INTEGER,
    dstKind INTEGER,
    srcDeviceId INTEGER,
    srcContextId INTEGER,
    dstDeviceId INTEGER,
    dstContextId INTEGER,
    migrationCause INTEGER,
    graphNodeId INTEGER,
    virtualAddress INTEGER,
    copyCount INTEGER
);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    greenContextId INTEGER,
    streamId INTEGER NOT NULL,
    correlationId INTEGER,
    globalPid INTEGER,
    value INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    graphNodeId INTEGER,
    memKind INTEGER
);
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL,
    contextId INTEGER NOT NULL,
    greenContextId INTEGER,
    streamId INTEGER NOT NULL,
    correlationId INTEGER,
    globalPid INTEGER,
    deprecatedSyncType INTEGER,
    syncType INTEGER NOT NULL,
    eventId INTEGER NOT NULL,
    eventSyncId INTEGER
);
CREATE TABLE NVTX_EVENTS (
    start INTEGER NOT NULL,
    end INTEGER,
    eventType INTEGER NOT NULL,
    rangeId INTEGER,
    category INTEGER,
    color INTEGER,
    text TEXT,
    globalTid INTEGER,
    endGlobalTid INTEGER,
    textId INTEGER,
    domainId INTEGER,
    uint64Value INTEGER,
    int64Value INTEGER,
    doubleValue REAL,
    uint32Value INTEGER,
    int32Value INTEGER,
    floatValue REAL,
    jsonTextId INTEGER,
    jsonText TEXT,
    binaryData TEXT
);
CREATE TABLE PROFILER_OVERHEAD (
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    globalTid INTEGER,
    nameId INTEGER NOT NULL,
    overheadType INTEGER NOT NULL
);
";

/// `META_DATA_EXPORT` rows (as nsys 2026.2.1 writes them, plus `DERIVED_BY`).
const META: &[(&str, &str)] = &[
    ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
    ("EXPORT_PRODUCT_VERSION", "2026.2.1.210"),
    ("EXPORT_PRODUCT_DATE", "2026.2"),
    ("EXPORT_SCHEMA_VERSION", "3.25.0"),
    ("EXPORT_SCHEMA_VERSION_MAJOR", "3"),
    ("EXPORT_SCHEMA_VERSION_MINOR", "25"),
    ("EXPORT_SCHEMA_VERSION_MICRO", "0"),
    ("EXPORT_SCHEMA_VERSION_CKSUM", "306658267 182758"),
    ("EXPORT_PLATFORM", "linux-desktop"),
    ("EXPORT_ARCH", "x64"),
    ("EXPORT_TIME_UTC", "2026-01-01T00:10:00"),
    ("EXPORT_TIME_LOCAL", "2026-01-01T00:10:00 +0000 UTC"),
    ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"),
    ("EXPORT_PARAM_INPUT_FILE", "synth.nsys-rep"),
    ("EXPORT_PARAM_OUTPUT_FILE", "synth.sqlite"),
    ("EXPORT_PARAM_LAZY", "true"),
    ("EXPORT_PARAM_TIME_NORMALIZE", "false"),
    ("EXPORT_PARAM_TIME_SHIFT", "0"),
    ("EXPORT_CONFIG_TIME_SHIFT", "0"),
    ("DERIVED_BY", "gpuq-ingest synth_nsys"),
];

/// `(table, comment, rows)` of the ENUM tables written (ids, names and labels as in nsys 2026.2.1).
const ENUMS: &[(&str, &str, &[(i64, &str, &str)])] = &[
    (
        "ENUM_NSYS_EVENT_TYPE",
        "Nsys event type labels",
        &[
            (0, "Unknown", "Unknown"),
            (32, "NvtxEvents", "NvtxEvents"),
            (33, "NvtxCategory", "NvtxCategory"),
            (34, "NvtxMark", "NvtxMark"),
            (35, "NvtxPushRange", "NvtxPushRange"),
            (36, "NvtxPopRange", "NvtxPopRange"),
            (37, "NvtxStartRange", "NvtxStartRange"),
            (38, "NvtxEndRange", "NvtxEndRange"),
            (39, "NvtxThread", "NvtxThread"),
            (59, "NvtxPushPopRange", "NvtxPushPopRange"),
            (60, "NvtxStartEndRange", "NvtxStartEndRange"),
            (64, "NvtxtCategory", "NvtxtCategory"),
            (65, "NvtxtMark", "NvtxtMark"),
            (66, "NvtxtPushRange", "NvtxtPushRange"),
            (67, "NvtxtPopRange", "NvtxtPopRange"),
            (68, "NvtxtStartRange", "NvtxtStartRange"),
            (69, "NvtxtEndRange", "NvtxtEndRange"),
            (70, "NvtxtPushPopRange", "NvtxtPushPopRange"),
            (71, "NvtxtStartEndRange", "NvtxtStartEndRange"),
            (72, "NvtxtMetaThread", "NvtxtMetaThread"),
            (73, "NvtxtMetaProcess", "NvtxtMetaProcess"),
            (74, "NvtxtMetaFileDisplay", "NvtxtMetaFileDisplay"),
            (75, "NvtxDomainCreate", "NvtxDomainCreate"),
            (76, "NvtxDomainDestroy", "NvtxDomainDestroy"),
        ],
    ),
    (
        "ENUM_NSYS_EVENT_CLASS",
        "Nsys event class labels",
        &[
            (0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
            (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver"),
            (2, "TRACE_PROCESS_EVENT_GL", "GL"),
            (3, "TRACE_PROCESS_EVENT_TSP_OVERHEAD", "TSP overhead"),
            (4, "TRACE_PROCESS_EVENT_GL_DEBUG", "GL debug"),
            (5, "TRACE_PROCESS_EVENT_GL_WORKLOAD", "GL workload"),
            (6, "TRACE_PROCESS_EVENT_NVTX_START", "NVTX start"),
            (7, "TRACE_PROCESS_EVENT_NVTX_FINISH", "NVTX finish"),
            (8, "TRACE_PROCESS_EVENT_GL_START", "GL start"),
            (9, "TRACE_PROCESS_EVENT_GL_FINISH", "GL finish"),
            (10, "TRACE_PROCESS_EVENT_CUDA_START", "CUDA start"),
            (11, "TRACE_PROCESS_EVENT_CUDA_FINISH", "CUDA finish"),
            (12, "TRACE_PROCESS_EVENT_CUDA_INIT_ERROR", "CUDA init error"),
            (13, "TRACE_PROCESS_EVENT_CUDA_EGL_DRIVER", "CUDA EGL driver"),
        ],
    ),
    (
        "ENUM_CUDA_MEMCPY_OPER",
        "CUDA memcpy operation labels",
        &[
            (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"),
            (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
            (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"),
            (3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
            (4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"),
            (5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
            (6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"),
            (7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
            (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
            (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
            (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"),
            (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
            (12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host"),
            (13, "CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device"),
        ],
    ),
    (
        "ENUM_CUDA_MEM_KIND",
        "CUDA memory kind labels",
        &[
            (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
            (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
            (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
            (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
            (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
            (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
            (
                6,
                "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC",
                "Managed Static",
            ),
            (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
        ],
    ),
    (
        "ENUM_CUPTI_SYNC_TYPE",
        "CUPTI synchronization type labels",
        &[
            (0, "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_UNKNOWN", "Unknown"),
            (
                1,
                "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE",
                "Event sync",
            ),
            (
                2,
                "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT",
                "Stream wait sync",
            ),
            (
                3,
                "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE",
                "Stream sync",
            ),
            (
                4,
                "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE",
                "Context sync",
            ),
        ],
    ),
    (
        "ENUM_CUPTI_STREAM_TYPE",
        "CUPTI stream type labels",
        &[
            (
                0,
                "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_UNKNOWN",
                "Unknown stream type",
            ),
            (
                1,
                "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_DEFAULT",
                "Default stream",
            ),
            (
                2,
                "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NON_BLOCKING",
                "Non-blocking stream",
            ),
            (3, "CUPTI_ACTIVITY_STREAM_CREATE_FLAG_NULL", "Null stream"),
        ],
    ),
    (
        "ENUM_CUDA_KERNEL_LAUNCH_TYPE",
        "CUDA kernel launch type labels",
        &[
            (0, "CUDA_KERNEL_LAUNCH_TYPE_UNKNOWN", "Unknown"),
            (1, "CUDA_KERNEL_LAUNCH_TYPE_REGULAR", "Regular"),
            (
                2,
                "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_SINGLE_DEVICE",
                "Coop Single Device",
            ),
            (
                3,
                "CUDA_KERNEL_LAUNCH_TYPE_COOPERATIVE_MULTI_DEVICE",
                "Coop Multi Device",
            ),
        ],
    ),
    (
        "ENUM_CUPTI_OVERHEAD_TYPE",
        "CUPTI overhead type labels",
        &[
            (0, "OVERHEAD_UNDEFINED", "Undefined"),
            (1, "OVERHEAD_UNKNOWN", "Unknown"),
            (2, "OVERHEAD_DRIVER_COMPILER", "Driver JIT compiler (CUDA)"),
            (3, "OVERHEAD_CUPTI_BUFFER_FLUSH", "Buffer flush (Profiler)"),
            (
                4,
                "OVERHEAD_CUPTI_INSTRUMENTATION",
                "Instrumentation (Profiler)",
            ),
            (
                5,
                "OVERHEAD_CUPTI_RESOURCE",
                "Resource creation/destruction (Profiler)",
            ),
            (
                6,
                "OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING",
                "Runtime module loading (CUDA)",
            ),
            (
                7,
                "OVERHEAD_LAZY_FUNCTION_LOADING",
                "Lazy function loading (CUDA)",
            ),
            (
                8,
                "OVERHEAD_COMMAND_BUFFER_FULL",
                "Command buffer full (CUDA)",
            ),
        ],
    ),
];

/// An NVTX push/pop range of an operator: `registered` ranges use `textId` (a registered
/// string), others `text`.
#[derive(Debug, Clone, Copy)]
struct Op {
    text: &'static str,
    registered: bool,
    domain: i64,
}

const fn op(text: &'static str) -> Op {
    Op {
        text,
        registered: false,
        domain: 0,
    }
}

/// One slot of a step's kernel pattern.
struct Slot {
    ops: &'static [Op],
    demangled: &'static str,
    short: &'static str,
    mangled: &'static str,
    /// Launched by `cuLaunchKernelEx` (driver, eventClass 1) instead of `cudaLaunchKernel_v7000`.
    driver: bool,
    stream: i64,
    dur: (i64, i64),
    regs: i64,
    grid: (i64, i64, i64),
    block: i64,
    static_smem: i64,
    dyn_smem: i64,
}

const ADD: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)";
const MUL: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul>)";
const GELU: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)";
const VEC: &str = "vectorized_elementwise_kernel";
const CUBLAS: &str = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas";

/// The kernel pattern of a step: kernel `k` of a step uses `SLOTS[k % 8]`.
const SLOTS: &[Slot] = &[
    Slot {
        ops: &[op("aten::linear"), op("aten::addmm")],
        demangled: "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
        short: "Kernel2",
        mangled: "_ZN7cutlass7Kernel2I55cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8EEvNT_6ParamsE",
        driver: false,
        stream: STREAM_A,
        dur: (18_000, 60_000),
        regs: 168,
        grid: (16, 32, 1),
        block: 128,
        static_smem: 0,
        dyn_smem: 81_920,
    },
    Slot {
        ops: &[op("aten::add_")],
        demangled: ADD,
        short: VEC,
        mangled: "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEESt5arrayIPcLm3EEEEviT0_T1_",
        driver: false,
        stream: STREAM_A,
        dur: (2_500, 9_000),
        regs: 26,
        grid: (2048, 1, 1),
        block: 128,
        static_smem: 0,
        dyn_smem: 0,
    },
    Slot {
        ops: &[op("aten::mm")],
        demangled: CUBLAS,
        short: CUBLAS,
        mangled: CUBLAS,
        driver: false,
        stream: STREAM_A,
        dur: (12_000, 45_000),
        regs: 168,
        grid: (132, 1, 1),
        block: 384,
        static_smem: 0,
        dyn_smem: 213_248,
    },
    Slot {
        ops: &[Op { text: "aten::_softmax", registered: true, domain: 0 }],
        demangled: "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        short: "cunn_SoftMaxForward",
        mangled: "_ZN2at6native12_GLOBAL__N_119cunn_SoftMaxForwardILi4EfffNS1_22SoftMaxForwardEpilogueEEEvPT2_PKT0_i",
        driver: false,
        stream: STREAM_A,
        dur: (4_000, 16_000),
        regs: 40,
        grid: (4096, 1, 1),
        block: 512,
        static_smem: 0,
        dyn_smem: 2048,
    },
    Slot {
        ops: &[op("aten::sum")],
        demangled: "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)",
        short: "reduce_kernel",
        mangled: "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_14func_wrapper_tIfZNS0_11sum_functorIfffEclERNS_14TensorIteratorEEUlffE_EEjfLi4ELi4EEEEEvT1_",
        driver: false,
        stream: STREAM_B,
        dur: (4_000, 14_000),
        regs: 32,
        grid: (264, 1, 1),
        block: 512,
        static_smem: 16,
        dyn_smem: 0,
    },
    Slot {
        ops: &[op("aten::mul")],
        demangled: MUL,
        short: VEC,
        mangled: "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm3EEEEviT0_T1_",
        driver: false,
        stream: STREAM_A,
        dur: (2_500, 9_000),
        regs: 28,
        grid: (2048, 1, 1),
        block: 128,
        static_smem: 0,
        dyn_smem: 0,
    },
    Slot {
        ops: &[op("aten::gelu")],
        demangled: GELU,
        short: VEC,
        mangled: "_ZN2at6native29vectorized_elementwise_kernelILi4EZZZNS0_18GeluCUDAKernelImplERNS_18TensorIteratorBaseENS0_8GeluTypeEENKUlvE0_clEvENKUlvE2_clEvEUlN3c108BFloat16EE_St5arrayIPcLm2EEEEviT0_T1_",
        driver: false,
        stream: STREAM_A,
        dur: (3_000, 10_000),
        regs: 30,
        grid: (1024, 1, 1),
        block: 128,
        static_smem: 0,
        dyn_smem: 0,
    },
    Slot {
        ops: &[
            op("nccl:all_reduce"),
            Op { text: "ncclAllReduce", registered: true, domain: NCCL_DOMAIN },
        ],
        demangled: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        short: "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        mangled: "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE",
        driver: true,
        stream: STREAM_B,
        dur: (25_000, 120_000),
        regs: 96,
        grid: (24, 1, 1),
        block: 640,
        static_smem: 0,
        dyn_smem: 0,
    },
];

/// The warm-up kernel, launched before the first step outside every NVTX range.
const WARMUP: Slot = Slot {
    ops: &[],
    demangled: "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::cuda::normal_and_transform<float, float>(at::TensorIteratorBase&, at::CUDAGeneratorImpl*)::{lambda(curandStatePhilox4_32_10*)#2}>(long, at::PhiloxCudaState, at::native::templates::cuda::normal_and_transform<float, float>(at::TensorIteratorBase&, at::CUDAGeneratorImpl*)::{lambda(curandStatePhilox4_32_10*)#2})",
    short: "distribution_elementwise_grid_stride_kernel",
    mangled: "_ZN2at6native12_GLOBAL__N_143distribution_elementwise_grid_stride_kernelIfLi4EZNS0_9templates4cuda20normal_and_transformIffEEvRNS_18TensorIteratorBaseEPNS_17CUDAGeneratorImplEEUlP24curandStatePhilox4_32_10E0_EEvlNS_15PhiloxCudaStateET1_",
    driver: false,
    stream: STREAM_A,
    dur: (40_000, 80_000),
    regs: 30,
    grid: (528, 1, 1),
    block: 256,
    static_smem: 0,
    dyn_smem: 0,
};

const LAUNCH: &str = "cudaLaunchKernel_v7000";
const LAUNCH_DRV: &str = "cuLaunchKernelEx";
const MEMCPY: &str = "cudaMemcpyAsync_v3020";
const MEMSET: &str = "cudaMemsetAsync_v3020";
const SYNC: &str = "cudaStreamSynchronize_v3020";
const CAPTURING: &str = "cudaStreamIsCapturing_v10000";
/// Init calls: (name, eventClass, min dur, max dur).
const INIT_CALLS: &[(&str, i64, i64, i64)] = &[
    ("cuGetProcAddress_v2", 1, 80, 900),
    ("cuGetProcAddress_v2", 1, 80, 900),
    ("cuGetProcAddress_v2", 1, 80, 900),
    ("cuLibraryLoadData", 1, 300_000, 2_000_000),
    ("cuLibraryGetKernel", 1, 300, 4_000),
    ("cuLibraryGetKernel", 1, 300, 4_000),
    ("cudaGetDeviceProperties_v2_v12000", 0, 900_000, 1_800_000),
    ("cudaMalloc_v3020", 0, 3_000, 800_000),
    ("cudaEventCreateWithFlags_v3020", 0, 240, 2_200),
];

/// `StringIds`: interned at generation time, written at the end.
#[derive(Default)]
struct Strings {
    ids: HashMap<String, i64>,
    order: Vec<String>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        self.order.push(s.to_string());
        let id = self.order.len() as i64;
        self.ids.insert(s.to_string(), id);
        id
    }
}

/// Interned ids of a slot.
#[derive(Clone, Copy)]
struct SlotIds {
    demangled: i64,
    short: i64,
    mangled: i64,
}

struct Stmts<'c> {
    runtime: Statement<'c>,
    kernel: Statement<'c>,
    memcpy: Statement<'c>,
    memset: Statement<'c>,
    sync: Statement<'c>,
    nvtx: Statement<'c>,
}

impl<'c> Stmts<'c> {
    fn new(c: &'c Connection) -> rusqlite::Result<Self> {
        Ok(Stmts {
            runtime: c.prepare(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, NULL)",
            )?,
            kernel: c.prepare(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?1, ?2, ?3, 1, 0, ?4, ?5, ?6, ?7, ?8, \
                 ?9, 1, 1, ?10, ?11, ?12, ?13, ?14, 1, 1, ?15, ?16, 0, 250871808, ?17, ?18, NULL, 0, \
                 NULL, NULL, NULL, NULL, 0, 0, 0, 1, 0, 0, NULL, '[]')",
            )?,
            memcpy: c.prepare(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?1, ?2, ?3, 1, 0, ?4, ?5, ?6, ?7, ?8, \
                 NULL, ?9, ?10, ?11, ?12, ?13, ?14, NULL, NULL, NULL, 1)",
            )?,
            memset: c.prepare(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?1, ?2, ?3, 1, 0, ?4, ?5, ?6, 0, ?7, \
                 NULL, 2)",
            )?,
            sync: c.prepare(
                "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?1, ?2, ?3, 1, NULL, ?4, ?5, \
                 ?6, NULL, 3, 4294967295, 0)",
            )?,
            nvtx: c.prepare(
                "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?,
        })
    }
}

/// An open NVTX range on the launching thread.
#[derive(Clone, Copy)]
enum Frame {
    Op(Op, i64),
    Step(i64, i64),
}

/// Per-kernel accumulators, merged into [`NsysTruth`] maps at the end.
#[derive(Default)]
struct Acc {
    by_name: HashMap<&'static str, (u64, i64, i64, i64)>,
    by_short: HashMap<&'static str, (u64, i64)>,
    by_range: HashMap<&'static str, (u64, i64)>,
    by_default_range: HashMap<&'static str, (u64, i64)>,
    by_api: HashMap<&'static str, (u64, i64)>,
    nvtx_by_text: HashMap<&'static str, u64>,
}

fn add2(m: &mut HashMap<&'static str, (u64, i64)>, k: &'static str, d: i64) {
    let e = m.entry(k).or_default();
    e.0 += 1;
    e.1 += d;
}

/// One process (rank) being generated.
struct Proc {
    pid: i64,
    gtid: i64,
    gpid: i64,
    dev: i64,
    rng: Rng,
    /// Host clock of the launching thread.
    t: i64,
    corr: i64,
    grid_id: i64,
    /// When each of streams A, B and copy is free.
    free: [i64; 3],
    stack: Vec<Frame>,
    step: Option<i64>,
    /// GPU intervals since the last full sync (for the busy union).
    pending: Vec<(i64, i64)>,
    busy: i64,
    union: Vec<(i64, i64)>,
}

fn stream_idx(stream: i64) -> usize {
    match stream {
        STREAM_A => 0,
        STREAM_B => 1,
        _ => 2,
    }
}

struct Gen<'c> {
    st: Stmts<'c>,
    strings: Strings,
    truth: NsysTruth,
    acc: Acc,
    slot_ids: Vec<SlotIds>,
    warmup_ids: SlotIds,
}

impl Gen<'_> {
    fn see(&mut self, start: i64, end: i64) {
        self.truth.first_ns = self.truth.first_ns.min(start);
        self.truth.last_ns = self.truth.last_ns.max(end);
    }

    /// An API call on the launching thread at the host clock; returns (start, end, correlationId).
    fn api(
        &mut self,
        p: &mut Proc,
        name: &'static str,
        class: i64,
        dur: i64,
    ) -> rusqlite::Result<(i64, i64, i64)> {
        let id = self.strings.id(name);
        p.corr += 1;
        let (start, end) = (p.t, p.t + dur);
        p.t = end;
        self.st
            .runtime
            .execute(params![start, end, class, p.gtid, p.corr, id])?;
        add2(&mut self.acc.by_api, name, dur);
        *self.truth.runtime_by_class.entry(class).or_default() += 1;
        self.see(start, end);
        Ok((start, end, p.corr))
    }

    fn push(&mut self, p: &mut Proc, op: Op) {
        p.t += p.rng.range(300, 1_500);
        p.stack.push(Frame::Op(op, p.t));
    }

    fn pop(&mut self, p: &mut Proc) -> rusqlite::Result<()> {
        p.t += p.rng.range(300, 1_500);
        let Some(Frame::Op(op, start)) = p.stack.pop() else {
            unreachable!("pop without an operator range")
        };
        let (text, text_id) = if op.registered {
            (None, Some(self.strings.id(op.text)))
        } else {
            (Some(op.text), None)
        };
        self.st
            .nvtx
            .execute(params![start, p.t, 59, text, p.gtid, text_id, op.domain])?;
        self.truth.nvtx_ranges += 1;
        *self.acc.nvtx_by_text.entry(op.text).or_default() += 1;
        Ok(())
    }

    /// GPU interval on `stream`, `latency` after the call started, after the stream's previous work.
    fn gpu(&mut self, p: &mut Proc, call_start: i64, stream: i64, dur: i64) -> (i64, i64) {
        let i = stream_idx(stream);
        let start =
            (call_start + p.rng.range(1_500, 5_000)).max(p.free[i] + p.rng.range(300, 1_500));
        let end = start + dur;
        p.free[i] = end;
        p.pending.push((start, end));
        self.see(start, end);
        (start, end)
    }

    fn kernel(&mut self, p: &mut Proc, slot: &'static Slot, ids: SlotIds) -> rusqlite::Result<()> {
        let (name, class, call_dur) = if slot.driver {
            (LAUNCH_DRV, 1, p.rng.range(3_000, 9_000))
        } else if p.rng.next() % 200 == 0 {
            // Drawn by remainder (not `one_in`), as exports have always been drawn: same bytes.
            (LAUNCH, 0, p.rng.range(40_000, 200_000))
        } else {
            (LAUNCH, 0, p.rng.range(2_500, 7_000))
        };
        let (cs, _ce, corr) = self.api(p, name, class, call_dur)?;
        let dur = p.rng.range(slot.dur.0, slot.dur.1);
        let (start, end) = self.gpu(p, cs, slot.stream, dur);
        p.grid_id += 1;
        let smem_exec = if slot.static_smem + slot.dyn_smem <= 32_768 {
            32_768
        } else {
            233_472
        };
        self.st.kernel.execute(params![
            start,
            end,
            p.dev,
            slot.stream,
            corr,
            p.gpid,
            ids.demangled,
            ids.short,
            ids.mangled,
            slot.regs,
            slot.grid.0,
            slot.grid.1,
            slot.grid.2,
            slot.block,
            slot.static_smem,
            slot.dyn_smem,
            p.grid_id,
            smem_exec
        ])?;
        // Truth.
        let t = &mut self.truth;
        t.kernels += 1;
        *t.kernels_by_launch_class.entry(class).or_default() += 1;
        let e = t
            .kernels_by_stream
            .entry((p.pid, p.dev, slot.stream))
            .or_default();
        e.0 += 1;
        e.1 += dur;
        let e = self
            .acc
            .by_name
            .entry(slot.demangled)
            .or_insert((0, 0, i64::MAX, i64::MIN));
        e.0 += 1;
        e.1 += dur;
        e.2 = e.2.min(dur);
        e.3 = e.3.max(dur);
        add2(&mut self.acc.by_short, slot.short, dur);
        match p.stack.last() {
            None => t.kernels_outside_ranges += 1,
            Some(Frame::Op(op, _)) => add2(&mut self.acc.by_range, op.text, dur),
            Some(Frame::Step(n, _)) => {
                let e = t
                    .kernels_by_range
                    .entry(format!("ProfilerStep#{n}"))
                    .or_default();
                e.0 += 1;
                e.1 += dur;
            }
        }
        let default = p.stack.iter().rev().find(|f| match f {
            Frame::Op(op, _) => op.domain == 0,
            Frame::Step(..) => true,
        });
        match default {
            None => {}
            Some(Frame::Op(op, _)) => add2(&mut self.acc.by_default_range, op.text, dur),
            Some(Frame::Step(n, _)) => {
                let e = t
                    .kernels_by_default_range
                    .entry(format!("ProfilerStep#{n}"))
                    .or_default();
                e.0 += 1;
                e.1 += dur;
            }
        }
        if let Some(n) = p.step {
            let e = t.kernels_by_step.entry((p.pid, n)).or_default();
            e.0 += 1;
            e.1 += dur;
        }
        Ok(())
    }

    /// `cudaMemcpyAsync_v3020` and its copy. `copy_kind` per ENUM_CUDA_MEMCPY_OPER, kinds per
    /// ENUM_CUDA_MEM_KIND.
    fn memcpy(
        &mut self,
        p: &mut Proc,
        copy_kind: i64,
        bytes: i64,
        stream: i64,
    ) -> rusqlite::Result<()> {
        let (label, src_kind, dst_kind, gbps) = match copy_kind {
            1 => ("Host-to-Device", 1, 2, 24),
            2 => ("Device-to-Host", 2, 0, 6),
            _ => ("Device-to-Device", 2, 2, 1_200),
        };
        let call = p.rng.range(3_000, 12_000);
        let (cs, _, corr) = self.api(p, MEMCPY, 0, call)?;
        let dur = (bytes / gbps).max(1_000) + p.rng.range(0, 400);
        let (start, end) = self.gpu(p, cs, stream, dur);
        let dd = (copy_kind == 8).then_some(p.dev);
        let dc = (copy_kind == 8).then_some(CONTEXT);
        self.st.memcpy.execute(params![
            start, end, p.dev, stream, corr, p.gpid, bytes, copy_kind, src_kind, dst_kind, dd, dc,
            dd, dc
        ])?;
        let key = format!("[CUDA memcpy {label}]");
        *self
            .truth
            .memcpy_bytes_by_op
            .entry(key.clone())
            .or_default() += bytes;
        let e = self.truth.memcpy_by_op.entry(key).or_default();
        e.0 += 1;
        e.1 += dur;
        Ok(())
    }

    fn memset(&mut self, p: &mut Proc, bytes: i64, stream: i64) -> rusqlite::Result<()> {
        let call = p.rng.range(3_000, 9_000);
        let (cs, _, corr) = self.api(p, MEMSET, 0, call)?;
        let dur = (bytes / 1_500).max(1_000) + p.rng.range(0, 300);
        let (start, end) = self.gpu(p, cs, stream, dur);
        self.st
            .memset
            .execute(params![start, end, p.dev, stream, corr, p.gpid, bytes])?;
        self.truth.memset.0 += 1;
        self.truth.memset.1 += dur;
        self.truth.memset.2 += bytes;
        Ok(())
    }

    /// `cudaStreamSynchronize_v3020` on stream A that returns once every stream is idle.
    fn sync(&mut self, p: &mut Proc) -> rusqlite::Result<()> {
        let id = self.strings.id(SYNC);
        p.corr += 1;
        let start = p.t;
        let idle = p.free.iter().copied().max().unwrap_or(start);
        let gpu_end = idle.max(start + 500) + p.rng.range(200, 800);
        let end = gpu_end + p.rng.range(500, 2_000);
        p.t = end;
        self.st
            .runtime
            .execute(params![start, end, 0, p.gtid, p.corr, id])?;
        self.see(start, end);
        add2(&mut self.acc.by_api, SYNC, end - start);
        *self.truth.runtime_by_class.entry(0).or_default() += 1;
        let (ss, se) = (start + p.rng.range(200, 600), gpu_end);
        self.st
            .sync
            .execute(params![ss, se, p.dev, STREAM_A, p.corr, p.gpid])?;
        self.truth.syncs.0 += 1;
        self.truth.syncs.1 += se - ss;
        // Every stream is idle: close the busy union of this segment.
        p.pending.sort_unstable();
        let mut cur: Option<(i64, i64)> = None;
        let close = |p: &mut Proc, (cs, ce): (i64, i64)| {
            p.busy += ce - cs;
            match p.union.last_mut() {
                // Work of the next segment can start exactly where this one ended.
                Some(last) if cs <= last.1 => last.1 = last.1.max(ce),
                _ => p.union.push((cs, ce)),
            }
        };
        let pending = std::mem::take(&mut p.pending);
        for &(s, e) in &pending {
            match cur {
                Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
                Some(c) => {
                    close(p, c);
                    cur = Some((s, e));
                }
                None => cur = Some((s, e)),
            }
        }
        if let Some(c) = cur {
            close(p, c);
        }
        p.pending = pending;
        p.pending.clear();
        Ok(())
    }

    fn process(&mut self, cfg: &NsysConfig, rank: usize) -> rusqlite::Result<Proc> {
        let pid = cfg.pid_base + rank as i64;
        let mut p = Proc {
            pid,
            gtid: global_tid(pid, pid),
            gpid: global_pid(pid),
            dev: rank as i64,
            rng: Rng(cfg.seed ^ (rank as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f)),
            t: SESSION_START + 40_000_000 + rank as i64 * 1_337_000,
            corr: 0,
            grid_id: 0,
            free: [0; 3],
            stack: Vec::new(),
            step: None,
            pending: Vec::new(),
            busy: 0,
            union: Vec::new(),
        };
        p.t += p.rng.range(0, 100_000);
        // Init: driver and runtime calls without GPU work, the NCCL domain and a mark.
        for &(name, class, lo, hi) in INIT_CALLS {
            let d = p.rng.range(lo, hi);
            self.api(&mut p, name, class, d)?;
            p.t += p.rng.range(1_000, 20_000);
        }
        self.st.nvtx.execute(params![
            p.t,
            None::<i64>,
            75,
            "NCCL",
            p.gtid,
            None::<i64>,
            NCCL_DOMAIN
        ])?;
        self.truth.nvtx_domains += 1;
        p.t += p.rng.range(1_000, 5_000);
        self.st.nvtx.execute(params![
            p.t,
            None::<i64>,
            34,
            "training loop start",
            p.gtid,
            None::<i64>,
            0
        ])?;
        self.truth.nvtx_marks += 1;
        if cfg.warmup {
            p.t += p.rng.range(1_000, 5_000);
            self.memcpy(&mut p, 1, 64 << 20, STREAM_COPY)?;
            p.t += p.rng.range(1_000, 5_000);
            let ids = self.warmup_ids;
            self.kernel(&mut p, &WARMUP, ids)?;
            p.t += p.rng.range(1_000, 5_000);
            self.sync(&mut p)?;
        }
        for s in 0..cfg.steps {
            let n = (cfg.first_step + s) as i64;
            p.t += p.rng.range(50_000, 300_000); // idle gap between steps
            let step_start = p.t;
            p.stack.push(Frame::Step(n, step_start));
            p.step = Some(n);
            self.push(&mut p, op("aten::copy_"));
            let bytes = p.rng.range(1, 8) << 20;
            self.memcpy(&mut p, 1, bytes, STREAM_COPY)?;
            self.pop(&mut p)?;
            self.push(&mut p, op("aten::zero_"));
            self.memset(&mut p, 4 << 20, STREAM_A)?;
            self.pop(&mut p)?;
            p.t += p.rng.range(300, 1_000);
            let d = p.rng.range(300, 2_000);
            self.api(&mut p, CAPTURING, 0, d)?;
            for k in 0..cfg.kernels_per_step {
                let i = k % SLOTS.len();
                let slot = &SLOTS[i];
                for &o in slot.ops {
                    self.push(&mut p, o);
                }
                let ids = self.slot_ids[i];
                self.kernel(&mut p, slot, ids)?;
                for _ in slot.ops {
                    self.pop(&mut p)?;
                }
                p.t += p.rng.range(500, 3_000);
            }
            self.push(&mut p, op("aten::clone"));
            self.push(&mut p, op("aten::copy_"));
            self.memcpy(&mut p, 8, 16 << 20, STREAM_A)?;
            self.pop(&mut p)?;
            self.pop(&mut p)?;
            self.push(&mut p, op("aten::item"));
            self.push(&mut p, op("aten::_local_scalar_dense"));
            self.memcpy(&mut p, 2, 4, STREAM_A)?;
            self.sync(&mut p)?;
            self.pop(&mut p)?;
            self.pop(&mut p)?;
            p.t += p.rng.range(500, 2_000);
            let Some(Frame::Step(_, start)) = p.stack.pop() else {
                unreachable!("step range not on top")
            };
            self.st.nvtx.execute(params![
                start,
                p.t,
                59,
                format!("ProfilerStep#{n}"),
                p.gtid,
                None::<i64>,
                0
            ])?;
            self.truth.nvtx_ranges += 1;
            self.truth.steps.push((pid, n, start, p.t));
            p.step = None;
        }
        Ok(p)
    }
}

/// Writes a faithful Nsight Systems export (schema 3.25.0 layout) of `cfg` to `path`, which
/// must not exist, and returns its exact contents.
pub fn write_nsys(cfg: &NsysConfig, path: &Path) -> rusqlite::Result<NsysTruth> {
    if path.exists() {
        return Err(rusqlite::Error::InvalidPath(path.to_path_buf()));
    }
    let mut conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "OFF")?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    conn.pragma_update(None, "cache_size", -131_072)?;
    let tx = conn.transaction()?;
    tx.execute_batch(DDL)?;
    for (table, comment, rows) in ENUMS {
        tx.execute_batch(&format!(
            "CREATE TABLE {table} (\n    -- {comment}\n\n    id INTEGER NOT NULL PRIMARY KEY,\n    \
             name TEXT,\n    label TEXT\n);"
        ))?;
        let mut st = tx.prepare(&format!("INSERT INTO {table} VALUES (?1, ?2, ?3)"))?;
        for (id, name, label) in rows.iter() {
            st.execute(params![id, name, label])?;
        }
    }
    let mut strings = Strings::default();
    let id3 = |s: &mut Strings, k: &Slot| SlotIds {
        demangled: s.id(k.demangled),
        short: s.id(k.short),
        mangled: s.id(k.mangled),
    };
    let slot_ids = SLOTS.iter().map(|k| id3(&mut strings, k)).collect();
    let warmup_ids = id3(&mut strings, &WARMUP);
    let (mut strings, mut truth, acc, procs) = {
        let mut g = Gen {
            st: Stmts::new(&tx)?,
            strings,
            truth: NsysTruth {
                first_ns: i64::MAX,
                last_ns: i64::MIN,
                ..NsysTruth::default()
            },
            acc: Acc::default(),
            slot_ids,
            warmup_ids,
        };
        let mut procs = Vec::new();
        for rank in 0..cfg.processes {
            let p = g.process(cfg, rank)?;
            g.truth.busy_ns_by_device.insert((p.pid, p.dev), p.busy);
            g.truth
                .busy_union_by_device
                .insert((p.pid, p.dev), p.union.clone());
            g.truth.max_correlation_by_pid.insert(p.pid, p.corr);
            procs.push((p.pid, p.dev));
        }
        (g.strings, g.truth, g.acc, procs)
    };
    if truth.first_ns > truth.last_ns {
        (truth.first_ns, truth.last_ns) = (SESSION_START, SESSION_START);
    }

    // Per-process tables.
    let mut rng = Rng(cfg.seed ^ 0x5eed);
    {
        let mut gpu = tx.prepare(
            "INSERT INTO TARGET_INFO_GPU VALUES (?1, ?2, 'NVIDIA H100 80GB HBM3', ?3, 1, 52428800, \
             84942979072, 3352320000000, 1980000000, 132, ?2, ?4, 0, 'GH100', ?2, '', '', 161, 0, \
             65536, 0, 65536, 49152, 232448, 233472, 65536, 32, 3, 64, 32, 1024, 1024, 1024, 64, \
             2147483647, 65535, 65535, 9, 0, 9, 0)",
        )?;
        let mut stream =
            tx.prepare("INSERT INTO TARGET_INFO_CUDA_STREAM VALUES (?1, 0, 1, ?2, ?3, 0, 2)")?;
        let mut proc_ = tx.prepare("INSERT INTO PROCESSES VALUES (?1, ?2, ?3)")?;
        let mut thread = tx.prepare("INSERT INTO ThreadNames VALUES (?1, 20, ?2)")?;
        let mut overhead =
            tx.prepare("INSERT INTO PROFILER_OVERHEAD VALUES (?1, ?2, ?3, ?4, ?5)")?;
        const BUS: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
        for &(launcher, name) in &[(cfg.pid_base - 2, "nsys"), (cfg.pid_base - 1, "torchrun")] {
            proc_.execute(params![global_pid(launcher), launcher, name])?;
        }
        for &(pid, dev) in &procs {
            let (a, b) = (rng.next(), rng.next());
            let uuid = format!(
                "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xffff,
                b >> 48,
                b & 0xffff_ffff_ffff
            );
            let bus = format!("0000:{:02x}:00.0", BUS[dev as usize % BUS.len()]);
            gpu.execute(params![VM, dev, bus, uuid])?;
            for s in [STREAM_A, STREAM_B, STREAM_COPY] {
                stream.execute(params![s, pid, CONTEXT])?;
            }
            proc_.execute(params![global_pid(pid), pid, "python3"])?;
            for (off, name) in [
                (0, "python3"),
                (1, "[NSys]"),
                (2, "[NSys Comms]"),
                (3, "CUPTI worker th"),
                (4, "cuda-EvtHandlr"),
            ] {
                thread.execute(params![strings.id(name), global_tid(pid, pid + off)])?;
            }
            // Buffer flushes on the CUPTI thread at the start of every 4th step.
            let cupti = global_tid(pid, pid + 3);
            let flush = strings.id("CUPTI Buffer flush");
            for (i, &(_, _, start, _)) in truth.steps.iter().filter(|s| s.0 == pid).enumerate() {
                if i % 4 == 0 {
                    let s = start + rng.range(5_000, 50_000);
                    overhead.execute(params![
                        s,
                        s + rng.range(100_000, 800_000),
                        cupti,
                        flush,
                        3
                    ])?;
                }
            }
            let unknown = strings.id("Unknown");
            let s = SESSION_START + 30_000_000 + rng.range(0, 1_000_000);
            overhead.execute(params![
                s,
                s + rng.range(1_000, 5_000),
                global_tid(pid, pid),
                unknown,
                1
            ])?;
        }
        let mut meta = tx.prepare("INSERT INTO META_DATA_EXPORT VALUES (?1, ?2)")?;
        for (k, v) in META {
            meta.execute(params![k, v])?;
        }
        let stop = truth.last_ns + 1_000_000;
        tx.execute(
            "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1767225600000000000, \
             '2026-01-01T00:00:00', '2026-01-01T00:00:00', ?1)",
            params![SESSION_START],
        )?;
        tx.execute(
            "INSERT INTO ANALYSIS_DETAILS VALUES (?1, ?2, ?3, ?4)",
            params![VM, stop - SESSION_START, SESSION_START, stop],
        )?;
        let mut sid = tx.prepare("INSERT INTO StringIds VALUES (?1, ?2)")?;
        for (i, s) in strings.order.iter().enumerate() {
            sid.execute(params![i as i64 + 1, s])?;
        }
    }
    tx.commit()?;

    // Truth maps with owned keys.
    let own2 = |m: HashMap<&'static str, (u64, i64)>, into: &mut BTreeMap<String, (u64, i64)>| {
        for (k, (c, d)) in m {
            let e = into.entry(k.to_string()).or_default();
            e.0 += c;
            e.1 += d;
        }
    };
    truth.kernel_sum_by_name = acc
        .by_name
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    own2(acc.by_short, &mut truth.kernel_sum_by_short_name);
    own2(acc.by_range, &mut truth.kernels_by_range);
    own2(acc.by_default_range, &mut truth.kernels_by_default_range);
    for (k, (c, d)) in acc.by_api {
        let e = truth
            .runtime_by_name
            .entry(api_sum_name(k).to_string())
            .or_default();
        e.0 += c;
        e.1 += d;
    }
    truth.nvtx_by_text = acc
        .nvtx_by_text
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Ok(truth)
}

#[cfg(test)]
mod tests;
