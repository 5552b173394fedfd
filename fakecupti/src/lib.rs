//! `gpuq-fakecupti`: a fake `libcupti.so.13` for testing gpuq's CUPTI collector without a GPU.
//!
//! This file owns the C ABI: the CUPTI v1 entry points the collector resolves with `dlsym`
//! (real C signatures, `CUptiResult` = `u32`, 0 = success) and the fake's own control exports.
//! Every export is wrapped in `catch_unwind` so nothing unwinds into C. The library's soname is
//! `libcupti.so.13` (see `build.rs`), so once a harness has loaded it `RTLD_GLOBAL`, the
//! collector's `dlopen("libcupti.so.13", RTLD_NOLOAD)` finds it, as it would find libtorch's.
//!
//! Record bytes follow `tools/cupti_layouts/layouts.golden` (`layout.rs`); buffers and callbacks
//! live in `state.rs`; the scenario language in `script.rs`. Not exported: the `_v2` family, so a
//! collector stays on the legacy v1 path at every scripted version.
//!
//! Control exports:
//! * `int fakecupti_play(const char *script)`: plays a script, returns the exit code to use.
//! * `int fakecupti_prepare(const char *script)`: applies only the leading `version`,
//!   `subscriber_taken` and `callback_name` lines (for a harness, before `InitializeInjection`).
//! * `size_t fakecupti_report(char *out, size_t len)`: JSON counters, NUL-terminated when it
//!   fits; returns the JSON length (call with len 0 to size the buffer).
//! * `void fakecupti_reset(void)`: back to a freshly loaded library (in-process tests).
//!
//! Environment: `GPUQ_FAKE_CUPTI_VERSION` (12080|13000|13050, or 26|130001|130500; default
//! 13000 → API 130001), `GPUQ_FAKE_CUPTI_TAKEN=<name>` (subscriber already held),
//! `GPUQ_FAKE_CUPTI_REPORT=<path>` (report written at the end of `fakecupti_play`, before a
//! scripted `kill`, and again when the library is unloaded at process exit — i.e. after the
//! collector's `atexit` flush — with `"phase"` saying which).
//!
//! Script (one command a line; `#` comments; `key=value` args, decimal numbers, times in ns,
//! unspecified fields 0, `name="with spaces"`):
//! ```text
//! version 12080|13000|13050            subscriber_taken NAME
//! callback_name domain=runtime|driver cbid=N name=STR
//! kernel start= end= completed= device= context= stream= correlation= grid=X,Y,Z block=X,Y,Z
//!        registers= static_smem= dynamic_smem= name=STR graph_id= graph_node= grid_id=
//!        launch_type= queued= submitted=
//! memcpy start= end= device= context= stream= correlation= bytes= copy_kind= src_kind=
//!        dst_kind= flags= graph_node= graph_id=
//! memset start= end= device= context= stream= correlation= bytes= value= memory_kind= flags=
//!        graph_node= graph_id=
//! runtime|driver cbid= start= end= pid= tid= correlation= return=
//! sync type= start= end= correlation= context= stream= event=
//! external_correlation kind= id= correlation=
//! marker flags= timestamp= id= pid= tid= name=STR domain=STR
//! overhead kind= object_kind= pid= tid= start= end= correlation=
//! device id= name=STR sms= memory= cc=MAJOR.MINOR uuid=32HEX
//! context id= device=
//! flush | drop N | refuse_buffers N | sleep MS | shuffle | exit CODE | kill | print_env NAME
//! threads N kernels=K start=T stream_base=S
//! ```
//! A script error prints `fakecupti: script line N: reason` and makes `fakecupti_play` return 99.

// The exports' safety contracts are CUPTI's documented C API, not restated per function.
#![allow(clippy::missing_safety_doc)]

pub mod layout;
pub mod script;
pub mod state;

#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use layout::{consts::*, Rec};
use state::{CompletedFn, RequestedFn};

/// Runs `f`, turning a panic into `default` (never unwind across the C ABI).
fn guard<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

/// The opaque subscriber handle: any stable non-null address.
static SUBSCRIBER: u8 = 0;

#[no_mangle]
pub unsafe extern "C" fn cuptiGetVersion(version: *mut u32) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if version.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        *version = state::api_version();
        SUCCESS
    })
}

fn result_name(r: u32) -> Option<&'static CStr> {
    Some(match r {
        SUCCESS => c"CUPTI_SUCCESS",
        ERROR_INVALID_PARAMETER => c"CUPTI_ERROR_INVALID_PARAMETER",
        ERROR_MAX_LIMIT_REACHED => c"CUPTI_ERROR_MAX_LIMIT_REACHED",
        ERROR_NOT_INITIALIZED => c"CUPTI_ERROR_NOT_INITIALIZED",
        ERROR_INVALID_KIND => c"CUPTI_ERROR_INVALID_KIND",
        ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            c"CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        }
        ERROR_UNKNOWN => c"CUPTI_ERROR_UNKNOWN",
        _ => return None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiGetResultString(result: u32, str_: *mut *const c_char) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if str_.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        match result_name(result) {
            Some(s) => {
                *str_ = s.as_ptr();
                SUCCESS
            }
            None => {
                *str_ = c"CUPTI_ERROR_UNKNOWN".as_ptr();
                ERROR_INVALID_PARAMETER
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiSubscribe(
    subscriber: *mut *mut c_void,
    _callback: *mut c_void,
    _userdata: *mut c_void,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if subscriber.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        let mut g = state::lock();
        // Legacy CUPTI: one subscriber per process, whoever came first (scripted or real).
        if g.subscriber_taken.is_some() || g.subscribed {
            return ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
        }
        g.subscribed = true;
        *subscriber = &SUBSCRIBER as *const u8 as *mut c_void;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiUnsubscribe(subscriber: *mut c_void) -> u32 {
    guard(ERROR_UNKNOWN, || {
        let mut g = state::lock();
        if !std::ptr::eq(subscriber as *const u8, &SUBSCRIBER) || !g.subscribed {
            return ERROR_INVALID_PARAMETER;
        }
        g.subscribed = false;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiEnableCallback(
    _enable: u32,
    subscriber: *mut c_void,
    _domain: u32,
    _cbid: u32,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if subscriber.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityRegisterCallbacks(
    requested: Option<RequestedFn>,
    completed: Option<CompletedFn>,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if requested.is_none() || completed.is_none() {
            return ERROR_INVALID_PARAMETER;
        }
        // v1 semantics: process-global, the last registration wins.
        let mut g = state::lock();
        g.requested = requested;
        g.completed = completed;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityEnable(kind: u32) -> u32 {
    guard(ERROR_UNKNOWN, || {
        state::lock().enabled.insert(kind);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityDisable(kind: u32) -> u32 {
    guard(ERROR_UNKNOWN, || {
        state::lock().enabled.remove(&kind);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityFlushAll(_flag: u32) -> u32 {
    guard(ERROR_UNKNOWN, || {
        // All fake records are complete, so FORCED (1) and 0 deliver the same buffers.
        state::flush_all();
        SUCCESS
    })
}

unsafe fn read_u32(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buffer: *mut u8,
    valid_size: usize,
    record: *mut *mut c_void,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if buffer.is_null() || record.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        // Stateless: the position is derived from the cursor alone, so concurrent buffers work.
        let set = layout::LayoutSet::for_api(state::api_version());
        let size_at = |off: usize| -> Option<usize> {
            if off + 4 > valid_size {
                return None;
            }
            Rec::of_kind(read_u32(buffer.add(off))).map(|r| set.size(r))
        };
        let pos = if (*record).is_null() {
            buffer.align_offset(8)
        } else {
            let cur = (*record as usize).wrapping_sub(buffer as usize);
            if cur >= valid_size {
                return ERROR_INVALID_PARAMETER;
            }
            match size_at(cur) {
                Some(s) => cur + s,
                None => return ERROR_INVALID_KIND,
            }
        };
        if pos >= valid_size {
            return ERROR_MAX_LIMIT_REACHED;
        }
        match size_at(pos) {
            Some(s) if pos + s <= valid_size => {
                *record = buffer.add(pos) as *mut c_void;
                SUCCESS
            }
            _ => ERROR_INVALID_KIND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords(
    _context: *mut c_void,
    _stream_id: u32,
    dropped: *mut usize,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if dropped.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        // The fake completes every buffer as (ctx NULL, stream 0), so one counter serves all.
        let mut g = state::lock();
        *dropped = std::mem::take(&mut g.dropped_unread) as usize;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivitySetAttribute(
    _attr: u32,
    _value_size: *mut usize,
    _value: *mut c_void,
) -> u32 {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuptiGetTimestamp(timestamp: *mut u64) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if timestamp.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        // CLOCK_REALTIME; whether the real CUPTI agrees is device check C3.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        *timestamp = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiSetThreadIdType(kind: u32) -> u32 {
    guard(ERROR_UNKNOWN, || {
        state::lock().thread_id_type = kind;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiGetCallbackName(
    domain: u32,
    cbid: u32,
    name: *mut *const c_char,
) -> u32 {
    guard(ERROR_UNKNOWN, || {
        if name.is_null() {
            return ERROR_INVALID_PARAMETER;
        }
        match state::lock().callback_names.get(&(domain, cbid)) {
            Some(c) => {
                *name = c.as_ptr();
                SUCCESS
            }
            None => {
                *name = std::ptr::null();
                ERROR_INVALID_PARAMETER
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiFinalize() -> u32 {
    guard(ERROR_UNKNOWN, || {
        // Detach: hand back what is buffered, then forget kinds, callbacks and the subscriber.
        state::flush_all();
        let mut g = state::lock();
        g.enabled.clear();
        g.requested = None;
        g.completed = None;
        g.subscribed = false;
        SUCCESS
    })
}

fn enable_api(domain: u32, cbid: u32, enable: u8) -> u32 {
    let mut g = state::lock();
    if enable != 0 {
        g.disabled_cbids.remove(&(domain, cbid));
    } else {
        g.disabled_cbids.insert((domain, cbid));
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityEnableRuntimeApi(cbid: u32, enable: u8) -> u32 {
    guard(ERROR_UNKNOWN, || {
        enable_api(CB_DOMAIN_RUNTIME_API, cbid, enable)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuptiActivityEnableDriverApi(cbid: u32, enable: u8) -> u32 {
    guard(ERROR_UNKNOWN, || {
        enable_api(CB_DOMAIN_DRIVER_API, cbid, enable)
    })
}

unsafe fn path_arg(p: *const c_char) -> Option<String> {
    if p.is_null() {
        eprintln!("fakecupti: NULL script path");
        return None;
    }
    Some(CStr::from_ptr(p).to_string_lossy().into_owned())
}

#[no_mangle]
pub unsafe extern "C" fn fakecupti_play(script_path: *const c_char) -> c_int {
    guard(script::SCRIPT_ERROR, || match path_arg(script_path) {
        Some(p) => script::play(&p),
        None => script::SCRIPT_ERROR,
    })
}

#[no_mangle]
pub unsafe extern "C" fn fakecupti_prepare(script_path: *const c_char) -> c_int {
    guard(script::SCRIPT_ERROR, || match path_arg(script_path) {
        Some(p) => script::prepare(&p),
        None => script::SCRIPT_ERROR,
    })
}

#[no_mangle]
pub unsafe extern "C" fn fakecupti_report(out: *mut c_char, len: usize) -> usize {
    guard(0, || {
        let json = state::lock().report_json("query");
        if !out.is_null() && len > 0 {
            let n = json.len().min(len - 1);
            std::ptr::copy_nonoverlapping(json.as_ptr(), out as *mut u8, n);
            *out.add(n) = 0;
        }
        json.len()
    })
}

#[no_mangle]
pub extern "C" fn fakecupti_reset() {
    guard((), state::reset)
}

/// Runs when the library is unloaded at process exit — after `atexit` handlers, so after the
/// collector's forced flush — to leave the final counts in the report.
extern "C" fn at_unload() {
    guard((), || {
        script::write_report_json(|| state::try_report_json("exit"))
    })
}

#[used]
#[link_section = ".fini_array"]
static AT_UNLOAD: extern "C" fn() = at_unload;
