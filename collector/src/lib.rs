//! gpuq's CUPTI collector: the library the CUDA driver loads into a profiled process
//! (`CUDA_INJECTION64_PATH`, entry point [`InitializeInjection`]) to stream its GPU activity
//! to `gpuq record` while it runs.
//!
//! Inside CUPTI's callbacks it only hands out buffers from a pool and queues the full ones
//! ([`collector`]). Its own thread decodes each queued buffer into fixed-size records
//! ([`layout`]) and, every flush interval, asks CUPTI for what it holds
//! (`cuptiActivityFlushAll(0)`) and writes the interval's records as one segment file of the
//! write-ahead log (`gpuq-cupti-wal`) that the sink reads. On a clean exit every buffer is
//! flushed (`atexit`); after a SIGKILL at most the interval in hand is lost.
//!
//! Configured by the environment `gpuq record` sets: `GPUQ_RECORD_DIR` (required: without it
//! the library does nothing), `GPUQ_FLUSH_MS`, `GPUQ_KINDS`, `GPUQ_RANK` (else `RANK`),
//! `GPUQ_BUFFER_KB`, `GPUQ_MAX_BUFFER_MB`; `GPUQ_CUPTI_LIB` names a libcupti to load when the
//! process has none mapped. Its second export, [`InitializeInjectionNvtx2`], is NVTX's
//! injection entry point, passed on to libcupti's.

pub mod collector;
pub mod cupti;
pub mod layout;

/// The entry point the CUDA driver calls once per process, from `cuInit`. Returns 1 when the
/// collector runs, 0 when it does not (and says why in its status file and on stderr); it
/// never unwinds into the driver.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> std::ffi::c_int {
    std::panic::catch_unwind(collector::start).unwrap_or(0)
}

/// NVTX's injection entry point (`NVTX_INJECTION64_PATH`, set by `gpuq record` when NVTX
/// markers are recorded): passed on to libcupti's, so the application's NVTX ranges become
/// CUPTI marker records. Returns 0 (NVTX then stays a no-op) when there is no libcupti.
#[no_mangle]
pub extern "C" fn InitializeInjectionNvtx2(
    get_export_table: *const std::ffi::c_void,
) -> std::ffi::c_int {
    std::panic::catch_unwind(|| cupti::nvtx_initialize(get_export_table)).unwrap_or(0)
}
