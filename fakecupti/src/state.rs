//! The fake CUPTI's process-global state and its buffer machinery: registered callbacks, enabled
//! kinds, subscriber, per-thread current buffers, dropped/refused accounting, and the counters the
//! report is made of. Emission and `FlushAll` both go through here.
//!
//! Locking rule (why): the collector's `requested`/`completed` callbacks may take its own locks or
//! call back into CUPTI (`GetNextRecord`, `GetNumDroppedRecords`), so they are always called with
//! the fake's mutex released — buffers are taken out of the state under the lock and handed over
//! after it is dropped, as the real CUPTI must do to avoid ABBA deadlocks.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::layout::{consts::*, LayoutSet, Rec, RecordBytes};

/// `void (*)(uint8_t **buffer, size_t *size, size_t *maxNumRecords)`
pub type RequestedFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
/// `void (*)(CUcontext ctx, uint32_t streamId, uint8_t *buffer, size_t size, size_t validSize)`
pub type CompletedFn = unsafe extern "C" fn(*mut libc::c_void, u32, *mut u8, usize, usize);

/// The scripted API version, readable without the mutex (`GetNextRecord` is lock-free).
static API_VERSION: AtomicU32 = AtomicU32::new(130001);

static STATE: OnceLock<Mutex<Fake>> = OnceLock::new();

/// Index of a record family in the per-kind counters; API records split into runtime/driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    Kernel,
    Memcpy,
    Memset,
    Runtime,
    Driver,
    Sync,
    ExternalCorrelation,
    Marker,
    Overhead,
    Device,
    Context,
}

pub const COUNTED: [(Counted, &str); 11] = [
    (Counted::Kernel, "kernel"),
    (Counted::Memcpy, "memcpy"),
    (Counted::Memset, "memset"),
    (Counted::Runtime, "runtime"),
    (Counted::Driver, "driver"),
    (Counted::Sync, "sync"),
    (Counted::ExternalCorrelation, "external_correlation"),
    (Counted::Marker, "marker"),
    (Counted::Overhead, "overhead"),
    (Counted::Device, "device"),
    (Counted::Context, "context"),
];

impl Counted {
    fn idx(self) -> usize {
        self as usize
    }

    /// The activity kinds that deliver this family, in order of preference (CONCURRENT_KERNEL is
    /// what collectors enable; KERNEL serialises kernels but is honoured too).
    fn kinds(self) -> &'static [u32] {
        match self {
            Counted::Kernel => &[KIND_CONCURRENT_KERNEL, KIND_KERNEL],
            Counted::Memcpy => &[KIND_MEMCPY],
            Counted::Memset => &[KIND_MEMSET],
            Counted::Runtime => &[KIND_RUNTIME],
            Counted::Driver => &[KIND_DRIVER],
            Counted::Sync => &[KIND_SYNCHRONIZATION],
            Counted::ExternalCorrelation => &[KIND_EXTERNAL_CORRELATION],
            Counted::Marker => &[KIND_MARKER],
            Counted::Overhead => &[KIND_OVERHEAD],
            Counted::Device => &[KIND_DEVICE],
            Counted::Context => &[KIND_CONTEXT],
        }
    }

    pub fn rec(self) -> Rec {
        match self {
            Counted::Kernel => Rec::Kernel,
            Counted::Memcpy => Rec::Memcpy,
            Counted::Memset => Rec::Memset,
            Counted::Runtime | Counted::Driver => Rec::Api,
            Counted::Sync => Rec::Sync,
            Counted::ExternalCorrelation => Rec::ExternalCorrelation,
            Counted::Marker => Rec::Marker,
            Counted::Overhead => Rec::Overhead,
            Counted::Device => Rec::Device,
            Counted::Context => Rec::Context,
        }
    }
}

type PerKind = [u64; 11];

/// A client buffer the fake is filling. The pointer belongs to the collector; the fake only
/// writes into it until it hands it back through `completed`.
struct Buf {
    ptr: *mut u8,
    size: usize,
    /// First byte a record may start at (the buffer start rounded up to 8, CUPTI's alignment).
    valid: usize,
    max_records: usize,
    records: PerKind,
}

// The raw pointer is only ever used under the state mutex or after being taken out of it.
unsafe impl Send for Buf {}

impl Buf {
    fn n_records(&self) -> u64 {
        self.records.iter().sum()
    }
}

/// A buffer on its way back to the client, to be completed outside the mutex.
pub struct Delivery {
    ptr: *mut u8,
    size: usize,
    valid: usize,
    completed: Option<CompletedFn>,
}

unsafe impl Send for Delivery {}

impl Delivery {
    /// Calls the client's `completed(ctx=NULL, streamId=0, ...)`. Never call with the mutex held.
    pub fn deliver(self) {
        if let Some(f) = self.completed {
            unsafe { f(std::ptr::null_mut(), 0, self.ptr, self.size, self.valid) };
        }
    }
}

pub struct Fake {
    pub api: u32,
    pub subscriber_taken: Option<String>,
    pub subscribed: bool,
    pub requested: Option<RequestedFn>,
    pub completed: Option<CompletedFn>,
    pub enabled: HashSet<u32>,
    /// cbids switched off by `cuptiActivityEnableRuntimeApi/DriverApi(cbid, 0)`: (domain, cbid).
    pub disabled_cbids: HashSet<(u32, u32)>,
    pub thread_id_type: u32,
    /// Current buffer per emitting OS thread (CUPTI requests buffers per thread by default).
    current: HashMap<u64, Buf>,
    /// Full buffers held back while `shuffle` is armed, so the next flush can reorder them.
    parked: Vec<Buf>,
    pub shuffle: bool,
    /// Refusals left (`refuse_buffers N`).
    pub refuse: u64,
    /// Dropped count not yet read by `GetNumDroppedRecords` (which resets it).
    pub dropped_unread: u64,
    pub callback_names: HashMap<(u32, u32), &'static CStr>,
    // Report counters (never reset except by `reset()`).
    pub emitted: PerKind,
    pub delivered: PerKind,
    pub suppressed: PerKind,
    pub undelivered: u64,
    pub dropped_scripted: u64,
    pub dropped_refused: u64,
    pub buffers_requested: u64,
    pub buffers_refused: u64,
    pub buffers_completed: u64,
    pub played: bool,
}

impl Fake {
    fn new() -> Fake {
        let mut f = Fake {
            api: 130001,
            subscriber_taken: None,
            subscribed: false,
            requested: None,
            completed: None,
            enabled: HashSet::new(),
            disabled_cbids: HashSet::new(),
            thread_id_type: 0,
            current: HashMap::new(),
            parked: Vec::new(),
            shuffle: false,
            refuse: 0,
            dropped_unread: 0,
            callback_names: HashMap::new(),
            emitted: [0; 11],
            delivered: [0; 11],
            suppressed: [0; 11],
            undelivered: 0,
            dropped_scripted: 0,
            dropped_refused: 0,
            buffers_requested: 0,
            buffers_refused: 0,
            buffers_completed: 0,
            played: false,
        };
        for (domain, cbid, name) in [
            (CB_DOMAIN_RUNTIME_API, 211, "cudaLaunchKernel_v7000"),
            (CB_DOMAIN_RUNTIME_API, 31, "cudaMemcpy_v3020"),
            (CB_DOMAIN_RUNTIME_API, 41, "cudaMemcpyAsync_v3020"),
            (CB_DOMAIN_RUNTIME_API, 51, "cudaMemsetAsync_v3020"),
            (CB_DOMAIN_RUNTIME_API, 131, "cudaStreamSynchronize_v3020"),
            (CB_DOMAIN_RUNTIME_API, 165, "cudaDeviceSynchronize_v3020"),
            (CB_DOMAIN_DRIVER_API, 307, "cuLaunchKernel"),
        ] {
            f.callback_names.insert((domain, cbid), intern(name));
        }
        // The harness calls InitializeInjection before the script runs, so what the collector
        // sees at init (version, subscriber) must come from the environment.
        if let Ok(v) = std::env::var("GPUQ_FAKE_CUPTI_VERSION") {
            match v.trim().parse().ok().and_then(LayoutSet::for_version) {
                Some(set) => f.api = set.api,
                None => eprintln!("fakecupti: ignoring GPUQ_FAKE_CUPTI_VERSION={v:?} (want 12080, 13000 or 13050)"),
            }
        }
        if let Ok(name) = std::env::var("GPUQ_FAKE_CUPTI_TAKEN") {
            if !name.is_empty() {
                f.subscriber_taken = Some(name);
            }
        }
        API_VERSION.store(f.api, Ordering::Relaxed);
        f
    }

    pub fn set_api(&mut self, api: u32) {
        self.api = api;
        API_VERSION.store(api, Ordering::Relaxed);
    }

    pub fn layout(&self) -> &'static LayoutSet {
        LayoutSet::for_api(self.api)
    }

    /// Takes out every buffer that holds records (current and parked), in delivery order.
    pub fn take_for_flush(&mut self) -> Vec<Delivery> {
        let mut bufs: Vec<Buf> = std::mem::take(&mut self.parked);
        let mut keys: Vec<u64> = self
            .current
            .iter()
            .filter(|(_, b)| b.n_records() > 0)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for k in keys {
            bufs.extend(self.current.remove(&k));
        }
        if self.shuffle {
            bufs.reverse();
            self.shuffle = false;
        }
        bufs.into_iter().map(|b| self.hand_back(b)).collect()
    }

    fn hand_back(&mut self, b: Buf) -> Delivery {
        for (d, n) in self.delivered.iter_mut().zip(b.records) {
            *d += n;
        }
        self.buffers_completed += 1;
        Delivery {
            ptr: b.ptr,
            size: b.size,
            valid: b.valid,
            completed: self.completed,
        }
    }

    /// Records written into buffers that have not been handed back yet.
    pub fn pending(&self) -> u64 {
        self.current
            .values()
            .chain(&self.parked)
            .map(Buf::n_records)
            .sum()
    }

    pub fn report_json(&self, phase: &str) -> String {
        fn obj(counts: &PerKind) -> String {
            let mut s = String::from("{");
            for (i, (_, name)) in COUNTED.iter().enumerate() {
                s += &format!("\"{name}\":{},", counts[i]);
            }
            s + &format!("\"total\":{}}}", counts.iter().sum::<u64>())
        }
        format!(
            concat!(
                "{{\"phase\":\"{}\",\"api_version\":{},\"emitted\":{},\"delivered\":{},",
                "\"suppressed\":{},\"pending\":{},\"undelivered\":{},\"dropped\":{},",
                "\"dropped_scripted\":{},\"dropped_refused\":{},\"dropped_unread\":{},",
                "\"buffers_requested\":{},\"buffers_refused\":{},\"buffers_completed\":{}}}"
            ),
            phase,
            self.api,
            obj(&self.emitted),
            obj(&self.delivered),
            obj(&self.suppressed),
            self.pending(),
            self.undelivered,
            self.dropped_scripted + self.dropped_refused,
            self.dropped_scripted,
            self.dropped_refused,
            self.dropped_unread,
            self.buffers_requested,
            self.buffers_refused,
            self.buffers_completed,
        )
    }
}

/// The state, created on first use (which also reads the environment overrides).
pub fn lock() -> MutexGuard<'static, Fake> {
    STATE
        .get_or_init(|| Mutex::new(Fake::new()))
        .lock()
        // A panic inside an export is caught at the FFI boundary; keep serving afterwards.
        .unwrap_or_else(|e| e.into_inner())
}

/// The report, unless the state is busy or the script never ran (exit-time use: never block).
pub fn try_report_json(phase: &str) -> Option<String> {
    let g = match STATE.get()?.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    g.played.then(|| g.report_json(phase))
}

pub fn api_version() -> u32 {
    drop(lock()); // make sure the environment was read
    API_VERSION.load(Ordering::Relaxed)
}

/// Resets everything to a fresh library's state (tests; `fakecupti_reset`).
pub fn reset() {
    let mut g = lock();
    *g = Fake::new();
}

/// Interned, leaked C string: records hold `const char *` that must stay valid forever.
pub fn intern(s: &str) -> &'static CStr {
    static NAMES: OnceLock<Mutex<HashMap<String, &'static CStr>>> = OnceLock::new();
    let mut m = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(c) = m.get(s) {
        return c;
    }
    let c: &'static CStr = Box::leak(
        CString::new(s.replace('\0', ""))
            .expect("NULs removed")
            .into_boxed_c_str(),
    );
    m.insert(s.to_string(), c);
    c
}

pub fn gettid() -> u64 {
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// Emits one record from the calling thread, as CUPTI would: into this thread's current buffer,
/// requesting a new one from the client when it is full (the full one is completed first).
/// `cbid` is set for API records so per-cbid disabling applies.
pub fn emit(what: Counted, rec: &RecordBytes, cbid: Option<u32>) {
    let tid = gettid();
    let i = what.idx();
    let len = rec.bytes.len();
    let mut g = lock();
    g.emitted[i] += 1;
    if g.requested.is_none() || g.completed.is_none() {
        g.undelivered += 1;
        return;
    }
    let Some(kind) = what.kinds().iter().copied().find(|k| g.enabled.contains(k)) else {
        g.suppressed[i] += 1;
        return;
    };
    if let Some(cbid) = cbid {
        let domain = if what == Counted::Driver {
            CB_DOMAIN_DRIVER_API
        } else {
            CB_DOMAIN_RUNTIME_API
        };
        if g.disabled_cbids.contains(&(domain, cbid)) {
            g.suppressed[i] += 1;
            return;
        }
    }
    // Fast path: room in this thread's current buffer.
    if let Some(b) = g.current.get_mut(&tid) {
        if b.valid + len <= b.size
            && (b.max_records == 0 || (b.n_records() as usize) < b.max_records)
        {
            write_record(b, rec, kind, i);
            return;
        }
    }
    // Full (or none yet): hand the old one back and ask for a new one, both outside the lock.
    let old = g.current.remove(&tid);
    let old = match old {
        Some(b) if g.shuffle => {
            g.parked.push(b);
            None
        }
        Some(b) => Some(g.hand_back(b)),
        None => None,
    };
    let refused = if g.refuse > 0 {
        g.refuse -= 1;
        true
    } else {
        false
    };
    let requested = g.requested;
    if !refused {
        g.buffers_requested += 1;
    }
    drop(g);
    if let Some(d) = old {
        d.deliver();
    }
    if refused {
        drop_refused();
        return;
    }
    let (mut ptr, mut size, mut max) = (std::ptr::null_mut::<u8>(), 0usize, 0usize);
    if let Some(f) = requested {
        unsafe { f(&mut ptr, &mut size, &mut max) };
    }
    if ptr.is_null() || size == 0 {
        // Real CUPTI before API 27 (CUDA 12.9) cannot take "no buffer": a client that
        // answers so would crash the application there, so the fake stops it loudly.
        let version = API_VERSION.load(Ordering::Relaxed);
        if version < 27 && requested.is_some() {
            eprintln!("fakecupti: the client returned no buffer at CUPTI API {version} (< 27)");
            std::process::abort();
        }
        drop_refused();
        return;
    }
    let start = ptr.align_offset(8).min(size);
    let mut b = Buf {
        ptr,
        size,
        valid: start,
        max_records: max,
        records: [0; 11],
    };
    let mut g = lock();
    if b.valid + len > b.size {
        // Too small for even this record: give it straight back, empty, and drop the record.
        g.dropped_refused += 1;
        g.dropped_unread += 1;
        let d = g.hand_back(b);
        drop(g);
        d.deliver();
        return;
    }
    write_record(&mut b, rec, kind, i);
    g.current.insert(tid, b);
}

/// A record lost because no buffer was had for it (scripted refusal or the client said no).
fn drop_refused() {
    let mut g = lock();
    g.buffers_refused += 1;
    g.dropped_refused += 1;
    g.dropped_unread += 1;
}

fn write_record(b: &mut Buf, rec: &RecordBytes, kind: u32, i: usize) {
    unsafe {
        let dst = b.ptr.add(b.valid);
        std::ptr::copy_nonoverlapping(rec.bytes.as_ptr(), dst, rec.bytes.len());
        // The kind actually delivered (KERNEL vs CONCURRENT_KERNEL) depends on what is enabled.
        std::ptr::copy_nonoverlapping(kind.to_le_bytes().as_ptr(), dst, 4);
    }
    b.valid += rec.bytes.len();
    b.records[i] += 1;
}

/// `cuptiActivityFlushAll` and the script's `flush`: completes every buffer holding records.
pub fn flush_all() {
    let deliveries = lock().take_for_flush();
    for d in deliveries {
        d.deliver();
    }
}
