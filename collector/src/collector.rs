//! The running collector: its configuration, the buffer pool CUPTI's callbacks draw from, and
//! the thread that decodes buffers and writes segments.

use crate::cupti::{self, kind, Cupti};
use crate::layout::{self, Decoded, Strings};
use gpuq_cupti_wal::{self as wal, RecordKind, SegmentBuilder};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{c_int, c_void, CStr};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The activity kinds a user can ask for (`gpuq record --kinds`), and CUPTI's kind for each.
/// Devices and contexts are always collected: they map records to GPUs.
pub const KINDS: [(&str, u32); 9] = [
    ("kernel", kind::CONCURRENT_KERNEL),
    ("memcpy", kind::MEMCPY),
    ("memset", kind::MEMSET),
    ("sync", kind::SYNCHRONIZATION),
    ("runtime", kind::RUNTIME),
    ("driver", kind::DRIVER),
    ("overhead", kind::OVERHEAD),
    ("marker", kind::MARKER),
    ("external", kind::EXTERNAL_CORRELATION),
];

/// What is collected unless `GPUQ_KINDS` says otherwise: NVTX markers too, since steps,
/// operators and scopes come from them (an application that makes no NVTX call pays nothing
/// for it); external correlations matter only beside Kineto.
pub const DEFAULT_KINDS: &str = "kernel,memcpy,memset,sync,runtime,driver,overhead,marker";

/// The CUPTI kinds of a `--kinds` list, or the first name that is not one.
pub fn parse_kinds(list: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match KINDS.iter().find(|(n, _)| *n == name) {
            Some((_, k)) => out.push(*k),
            None => {
                let known: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "unknown activity kind {name:?} (known: {})",
                    known.join(", ")
                ));
            }
        }
    }
    if out.is_empty() {
        return Err("no activity kind asked for".into());
    }
    Ok(out)
}

/// The collector's settings, from the environment `gpuq record` sets.
pub struct Config {
    pub dir: PathBuf,
    pub flush: Duration,
    pub kinds: Vec<u32>,
    pub rank: Option<i64>,
    pub buffer_bytes: usize,
    pub max_buffer_bytes: usize,
}

impl Config {
    /// `None` when `GPUQ_RECORD_DIR` is not set (the library was injected by something else).
    pub fn from_env() -> Result<Option<Config>, String> {
        let Some(dir) = std::env::var_os("GPUQ_RECORD_DIR") else {
            return Ok(None);
        };
        let number = |name: &str, default: u64| -> Result<u64, String> {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name}={v:?} is not a positive whole number")),
                Err(_) => Ok(default),
            }
        };
        let kinds = parse_kinds(
            &std::env::var("GPUQ_KINDS").unwrap_or_else(|_| DEFAULT_KINDS.to_string()),
        )?;
        let rank = std::env::var("GPUQ_RANK")
            .or_else(|_| std::env::var("RANK"))
            .ok()
            .and_then(|r| r.trim().parse().ok());
        Ok(Some(Config {
            dir: dir.into(),
            flush: Duration::from_millis(number("GPUQ_FLUSH_MS", 2000)?),
            kinds,
            rank,
            buffer_bytes: number("GPUQ_BUFFER_KB", 4096)? as usize * 1024,
            max_buffer_bytes: (number("GPUQ_MAX_BUFFER_MB", 256)? as usize) << 20,
        }))
    }
}

/// Buffers handed to CUPTI: allocated up to a cap, then reused. At the cap a request gets no
/// buffer and CUPTI counts the records it could not store as dropped.
struct Pool {
    free: Mutex<Vec<usize>>,
    size: usize,
    allocated: AtomicUsize,
    max_buffers: usize,
    /// CUPTI before API version 27 (CUDA 12.9) cannot take "no buffer": past the cap it
    /// gets one anyway, counted as over the cap.
    may_refuse: bool,
    refused: AtomicU64,
    over_cap: AtomicU64,
}

impl Pool {
    fn take(&self) -> *mut u8 {
        if let Some(p) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return p as *mut u8;
        }
        if self.allocated.fetch_add(1, Ordering::SeqCst) >= self.max_buffers {
            if self.may_refuse {
                self.allocated.fetch_sub(1, Ordering::SeqCst);
                self.refused.fetch_add(1, Ordering::Relaxed);
                return std::ptr::null_mut();
            }
            self.over_cap.fetch_add(1, Ordering::Relaxed);
        }
        // CUPTI wants 8-byte aligned buffers. They live as long as the process.
        let layout = std::alloc::Layout::from_size_align(self.size, 8).expect("buffer layout");
        // SAFETY: a non-zero size.
        unsafe { std::alloc::alloc(layout) }
    }

    fn give(&self, p: *mut u8) {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(p as usize);
    }
}

/// A buffer CUPTI has filled: its address, valid bytes, context and stream.
struct Completed {
    buffer: usize,
    valid: usize,
    context: usize,
    stream: u32,
}

pub struct Collector {
    cupti: Cupti,
    cfg: Config,
    pid: u32,
    pool: Pool,
    queue: Mutex<VecDeque<Completed>>,
    wake: Condvar,
    stopping: AtomicBool,
    /// The collector's thread died (a bug): buffers go straight back to the pool.
    failed: AtomicBool,
    /// The process stopped waiting for the last flush: no more CUPTI calls.
    abandoned: AtomicBool,
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
    /// CUPTI's timestamp and the realtime clock, read together at start.
    clock: (i64, i64),
    host: String,
}

static COLLECTOR: OnceLock<Collector> = OnceLock::new();

/// The first CUPTI API version whose buffer request may be answered with no buffer (Kineto's
/// `kCuptiBufferRejectionMinVersion`).
const FIRST_VERSION_TAKING_NO_BUFFER: u32 = 27;

/// Segments are cut at this many records, whatever the flush interval (a segment's blocks
/// have 32-bit lengths): ~120 MB.
const MAX_SEGMENT_RECORDS: u32 = 1 << 20;

/// Starts the collector (the body of `InitializeInjection`): 1 when it runs, else 0.
pub fn start() -> c_int {
    let cfg = match Config::from_env() {
        Ok(Some(cfg)) => cfg,
        Ok(None) => return 0,
        Err(e) => {
            disabled(
                std::env::var_os("GPUQ_RECORD_DIR").map(PathBuf::from),
                &e,
                None,
            );
            return 0;
        }
    };
    if COLLECTOR.get().is_some() {
        return 1;
    }
    let cupti = match Cupti::load() {
        Ok(c) => c,
        Err(e) => {
            disabled(Some(cfg.dir), &e, None);
            return 0;
        }
    };
    let version = cupti.version();
    let mut subscriber: *mut c_void = std::ptr::null_mut();
    // SAFETY: CUPTI's subscribe with a valid out pointer and a callback that does nothing.
    let r = unsafe { (cupti.subscribe)(&mut subscriber, on_callback, std::ptr::null_mut()) };
    if r == cupti::ERROR_MULTIPLE_SUBSCRIBERS {
        let why = "another tool already subscribed to CUPTI in this process (torch.profiler, \
                   Nsight Systems, or another injection library; before CUDA 13.3 with driver \
                   r610 CUPTI allows one subscriber): nothing is recorded from it";
        disabled(Some(cfg.dir), why, Some((&cupti, version)));
        return 0;
    }
    if r != cupti::SUCCESS {
        disabled(
            Some(cfg.dir),
            &format!("cuptiSubscribe failed with CUPTI error {r}"),
            Some((&cupti, version)),
        );
        return 0;
    }
    // SAFETY: plain CUPTI calls with valid arguments.
    unsafe { (cupti.set_thread_id_type)(cupti::THREAD_ID_TYPE_SYSTEM) };
    let clock = (cupti.timestamp(), realtime_ns());
    let buffer_bytes = cfg.buffer_bytes.max(64 << 10);
    let collector = Collector {
        pool: Pool {
            free: Mutex::new(Vec::new()),
            size: buffer_bytes,
            allocated: AtomicUsize::new(0),
            max_buffers: (cfg.max_buffer_bytes / buffer_bytes).max(2),
            may_refuse: version >= FIRST_VERSION_TAKING_NO_BUFFER,
            refused: AtomicU64::new(0),
            over_cap: AtomicU64::new(0),
        },
        pid: std::process::id(),
        cupti,
        cfg,
        queue: Mutex::new(VecDeque::new()),
        wake: Condvar::new(),
        stopping: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        abandoned: AtomicBool::new(false),
        stopped: Mutex::new(false),
        stopped_cv: Condvar::new(),
        clock,
        host: hostname(),
    };
    if COLLECTOR.set(collector).is_err() {
        return 1;
    }
    let c = COLLECTOR.get().expect("just set");
    // The thread first, so that no buffer is handed out before something drains them.
    if std::thread::Builder::new()
        .name("gpuq-collector".into())
        .spawn(move || writer_thread(c))
        .is_err()
    {
        undo(c, subscriber);
        disabled(
            Some(c.cfg.dir.clone()),
            "could not start the collector's thread",
            Some((&c.cupti, version)),
        );
        return 0;
    }
    // SAFETY: registering our two callbacks, which never unwind.
    let r = unsafe { (c.cupti.register_callbacks)(buffer_requested, buffer_completed) };
    if r != cupti::SUCCESS {
        undo(c, subscriber);
        disabled(
            Some(c.cfg.dir.clone()),
            &format!("cuptiActivityRegisterCallbacks failed with CUPTI error {r}"),
            Some((&c.cupti, version)),
        );
        return 0;
    }
    let mut refused_kinds = Vec::new();
    for k in [kind::DEVICE, kind::CONTEXT].iter().chain(&c.cfg.kinds) {
        // SAFETY: a plain CUPTI call.
        let r = unsafe { (c.cupti.enable)(*k) };
        if r != cupti::SUCCESS {
            refused_kinds.push(format!("{k} (error {r})"));
        }
    }
    // SAFETY: registering an extern "C" function that never unwinds.
    unsafe { libc::atexit(at_exit) };
    write_status(c, "running", None, &refused_kinds);
    1
}

/// Undoes a start that failed half-way: the writer stops, CUPTI's subscriber slot is given
/// back for other tools.
fn undo(c: &Collector, subscriber: *mut c_void) {
    c.failed.store(true, Ordering::SeqCst);
    stop_writer(c);
    if let Some(unsubscribe) = c.cupti.unsubscribe {
        // SAFETY: the handle cuptiSubscribe gave.
        unsafe { unsubscribe(subscriber) };
    }
}

/// Asks the collector's thread to flush and stop. `stopping` is set under the queue's lock,
/// so the thread cannot miss the wake-up between checking it and waiting.
fn stop_writer(c: &Collector) {
    let q = c.queue.lock().unwrap_or_else(|e| e.into_inner());
    c.stopping.store(true, Ordering::SeqCst);
    c.wake.notify_all();
    drop(q);
}

/// The collector's thread. A panic in it (a bug) must not take the process down or leave
/// CUPTI drawing buffers nobody returns: the kinds are turned off, and buffers CUPTI still
/// completes go straight back to the pool.
fn writer_thread(c: &'static Collector) {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Writer::new(c).run()));
    if run.is_err() {
        c.failed.store(true, Ordering::SeqCst);
        eprintln!("gpuq collector: its thread failed; recording stops (the process goes on)");
        if let Some(disable) = c.cupti.disable {
            for k in [kind::DEVICE, kind::CONTEXT].iter().chain(&c.cfg.kinds) {
                // SAFETY: a plain CUPTI call.
                unsafe { disable(*k) };
            }
        }
        *c.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        c.stopped_cv.notify_all();
    }
}

/// Says in the status file (when there is a directory) and on stderr why nothing is recorded.
fn disabled(dir: Option<PathBuf>, reason: &str, cupti: Option<(&Cupti, u32)>) {
    eprintln!("gpuq collector: not recording: {reason}");
    let Some(dir) = dir else { return };
    let pid = std::process::id();
    let (library, version) = match cupti {
        Some((c, v)) => (json_str(&c.library), v.to_string()),
        None => ("null".into(), "null".into()),
    };
    let json = format!(
        "{{\"pid\":{pid},\"state\":\"disabled\",\"reason\":{},\"library\":{library},\"cupti_version\":{version}}}",
        json_str(reason)
    );
    let _ = wal::write_atomically(&dir, &wal::status_name(pid), json.as_bytes());
}

fn write_status(c: &Collector, state: &str, totals: Option<&Totals>, refused_kinds: &[String]) {
    let totals = totals.map_or(String::new(), |t| {
        format!(
            ",\"segments\":{},\"records\":{},\"dropped_records\":{},\"write_errors\":{}",
            t.segments, t.records, t.dropped, t.write_errors
        )
    });
    let refused = if refused_kinds.is_empty() {
        String::new()
    } else {
        format!(",\"kinds_refused\":{}", json_str(&refused_kinds.join(", ")))
    };
    let json = format!(
        "{{\"pid\":{},\"state\":\"{state}\",\"library\":{},\"cupti_version\":{}{totals}{refused}}}",
        c.pid,
        json_str(&c.cupti.library),
        c.cupti.version()
    );
    let _ = wal::write_atomically(&c.cfg.dir, &wal::status_name(c.pid), json.as_bytes());
}

unsafe extern "C" fn on_callback(_: *mut c_void, _: u32, _: u32, _: *const c_void) {}

/// CUPTI asks for a buffer: one from the pool, or none at the cap.
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let _ = std::panic::catch_unwind(|| {
        let (p, n) = match COLLECTOR.get() {
            Some(c) => {
                let p = c.pool.take();
                (p, if p.is_null() { 0 } else { c.pool.size })
            }
            None => (std::ptr::null_mut(), 0),
        };
        // SAFETY: CUPTI passes valid out pointers.
        unsafe {
            *buffer = p;
            *size = n;
            *max = 0;
        }
    });
}

/// CUPTI hands a buffer back: it is queued for the collector's thread, nothing more.
unsafe extern "C" fn buffer_completed(
    context: *mut c_void,
    stream: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    let _ = std::panic::catch_unwind(|| {
        let Some(c) = COLLECTOR.get() else { return };
        if buffer.is_null() {
            return;
        }
        if c.failed.load(Ordering::Relaxed) {
            c.pool.give(buffer);
            return;
        }
        c.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Completed {
                buffer: buffer as usize,
                valid,
                context: context as usize,
                stream,
            });
        c.wake.notify_one();
    });
}

/// At exit: the collector's thread flushes everything CUPTI holds and writes the last
/// segment; the process waits for it at most this long.
const EXIT_WAIT: Duration = Duration::from_secs(5);

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(c) = COLLECTOR.get() else { return };
        // A forked child inherits the handler but not the thread.
        if std::process::id() != c.pid {
            return;
        }
        stop_writer(c);
        let stopped = c.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (_stopped, waited) = c
            .stopped_cv
            .wait_timeout_while(stopped, EXIT_WAIT, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() {
            // The process goes on to unload CUDA: the thread must not call CUPTI after this.
            c.abandoned.store(true, Ordering::SeqCst);
        }
    });
}

/// Counts over the collector's life, for the status file.
#[derive(Default)]
struct Totals {
    segments: u64,
    records: u64,
    dropped: u64,
    write_errors: u64,
}

/// Counts of the segment being built.
#[derive(Default)]
struct Health {
    dropped: u64,
    refused_buffers: u64,
    over_cap_buffers: u64,
    zero_timestamp: u64,
    unknown: u64,
    invalid: u64,
    buffers: u64,
    decode_ns: u64,
}

impl Health {
    fn is_quiet(&self) -> bool {
        self.dropped == 0
            && self.refused_buffers == 0
            && self.zero_timestamp == 0
            && self.unknown == 0
            && self.invalid == 0
    }
}

/// A map keyed by addresses and small ids, looked up once or twice per record: a multiply
/// and rotate per word instead of SipHash, whose resistance to chosen keys buys nothing for
/// keys the collector makes itself.
type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[derive(Default)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Strings seen so far (CUPTI's names by address, checked by content, since an address may be
/// reused after a module is unloaded), and which of them the current segment defines.
#[derive(Default)]
struct Interner {
    by_address: FastMap<usize, u32>,
    by_text: HashMap<Box<[u8]>, u32>,
    texts: Vec<Box<[u8]>>,
    /// Per id (index id - 1): the segment that last defined it.
    defined_in: Vec<u64>,
    api_names: FastMap<(RecordKind, u32), u32>,
}

impl Interner {
    fn id_of_text(&mut self, text: &[u8]) -> u32 {
        if let Some(id) = self.by_text.get(text) {
            return *id;
        }
        self.texts.push(text.into());
        self.defined_in.push(u64::MAX);
        let id = self.texts.len() as u32;
        self.by_text.insert(text.into(), id);
        id
    }
}

/// The interner bound to the segment being built: a string's first use in a segment defines
/// it there, so each segment reads on its own.
struct SegmentStrings<'a> {
    interner: &'a mut Interner,
    segment: &'a mut SegmentBuilder,
    seq: u64,
}

impl SegmentStrings<'_> {
    fn define(&mut self, id: u32) -> u32 {
        let slot = &mut self.interner.defined_in[id as usize - 1];
        if *slot != self.seq {
            *slot = self.seq;
            self.segment
                .string(id, &self.interner.texts[id as usize - 1]);
        }
        id
    }
}

impl Strings for SegmentStrings<'_> {
    fn c_string(&mut self, ptr: *const u8) -> u32 {
        if ptr.is_null() {
            return 0;
        }
        // SAFETY: CUPTI's string fields are NUL-terminated C strings (layout::decode's contract).
        let text = unsafe { CStr::from_ptr(ptr as *const std::ffi::c_char) }.to_bytes();
        if let Some(&id) = self.interner.by_address.get(&(ptr as usize)) {
            if *self.interner.texts[id as usize - 1] == *text {
                return self.define(id);
            }
        }
        let id = self.interner.id_of_text(text);
        self.interner.by_address.insert(ptr as usize, id);
        self.define(id)
    }

    fn text(&mut self, text: &str) -> u32 {
        let id = self.interner.id_of_text(text.as_bytes());
        self.define(id)
    }
}

/// The collector's thread: decodes buffers as CUPTI completes them, and every flush interval
/// flushes CUPTI and writes a segment.
struct Writer {
    c: &'static Collector,
    interner: Interner,
    segment: SegmentBuilder,
    /// The bytes of the segment being written (kept between segments).
    bytes: Vec<u8>,
    seq: u64,
    /// Segments built (written or not): the strings a segment defines are those not yet
    /// defined in this generation.
    generation: u64,
    health: Health,
    totals: Totals,
    streams: HashSet<(usize, u32)>,
}

impl Writer {
    fn new(c: &'static Collector) -> Writer {
        Writer {
            c,
            interner: Interner::default(),
            segment: SegmentBuilder::new(),
            bytes: Vec::new(),
            generation: 1,
            seq: 1,
            health: Health::default(),
            totals: Totals::default(),
            streams: HashSet::new(),
        }
    }

    fn run(mut self) {
        let c = self.c;
        let mut next_flush = Instant::now() + c.cfg.flush;
        loop {
            let (taken, stopping) = {
                let mut q = c.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let now = Instant::now();
                    if !q.is_empty() || c.stopping.load(Ordering::SeqCst) || now >= next_flush {
                        break;
                    }
                    q = c
                        .wake
                        .wait_timeout(q, next_flush - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                (std::mem::take(&mut *q), c.stopping.load(Ordering::SeqCst))
            };
            self.decode_all(taken);
            if stopping {
                self.flush(cupti::FLUSH_FORCED);
                write_status(c, "exited", Some(&self.totals), &[]);
                *c.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
                c.stopped_cv.notify_all();
                return;
            }
            if Instant::now() >= next_flush {
                self.flush(0);
                next_flush = Instant::now() + c.cfg.flush;
            }
        }
    }

    /// Asks CUPTI for its buffers (it completes them on this thread), decodes them, counts
    /// what was dropped and writes the segment.
    fn flush(&mut self, flag: u32) {
        let c = self.c;
        if c.abandoned.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: a plain CUPTI call, never made from a CUPTI callback.
        unsafe { (c.cupti.flush_all)(flag) };
        let taken = std::mem::take(&mut *c.queue.lock().unwrap_or_else(|e| e.into_inner()));
        self.decode_all(taken);
        let mut dropped = 0usize;
        // SAFETY: CUPTI writes one usize; NULL context and stream 0 are the global count.
        unsafe { (c.cupti.get_num_dropped)(std::ptr::null_mut(), 0, &mut dropped) };
        self.health.dropped += dropped as u64;
        for &(context, stream) in &self.streams {
            if context == 0 && stream == 0 {
                continue;
            }
            let mut n = 0usize;
            // SAFETY: as above, for a context and stream CUPTI named.
            unsafe { (c.cupti.get_num_dropped)(context as *mut c_void, stream, &mut n) };
            self.health.dropped += n as u64;
        }
        self.health.refused_buffers += c.pool.refused.swap(0, Ordering::Relaxed);
        self.health.over_cap_buffers += c.pool.over_cap.swap(0, Ordering::Relaxed);
        self.write_segment();
    }

    fn decode_all(&mut self, taken: VecDeque<Completed>) {
        for done in taken {
            self.streams.insert((done.context, done.stream));
            self.decode_buffer(done.buffer as *mut u8, done.valid);
            if self.segment.records() >= MAX_SEGMENT_RECORDS {
                self.write_segment();
            }
        }
    }

    fn decode_buffer(&mut self, buffer: *mut u8, valid: usize) {
        let c = self.c;
        let started = Instant::now();
        let mut strings = SegmentStrings {
            interner: &mut self.interner,
            segment: &mut self.segment,
            seq: self.generation,
        };
        let mut record: *mut u8 = std::ptr::null_mut();
        loop {
            // SAFETY: walking a buffer CUPTI completed, with CUPTI's own cursor.
            let r = unsafe { (c.cupti.get_next_record)(buffer, valid, &mut record) };
            if r == cupti::ERROR_MAX_LIMIT_REACHED {
                break;
            }
            if r != cupti::SUCCESS || record.is_null() {
                self.health.invalid += 1;
                break;
            }
            // SAFETY: a whole record CUPTI returned.
            match unsafe { layout::decode(record, &mut strings) } {
                Decoded::Record(mut raw) => {
                    if matches!(raw.kind, RecordKind::Runtime | RecordKind::Driver) {
                        raw.name = api_name(&mut strings, &c.cupti, raw.kind, raw.code);
                    }
                    strings.segment.record(&raw);
                }
                Decoded::ZeroTimestamp => self.health.zero_timestamp += 1,
                Decoded::Unknown => self.health.unknown += 1,
            }
        }
        c.pool.give(buffer);
        self.health.buffers += 1;
        self.health.decode_ns += started.elapsed().as_nanos() as u64;
    }

    fn write_segment(&mut self) {
        let c = self.c;
        let records = self.segment.records();
        if records == 0 && self.health.is_quiet() {
            return;
        }
        let h = std::mem::take(&mut self.health);
        let health = format!(
            "{{\"records\":{records},\"dropped_records\":{},\"refused_buffers\":{},\"over_cap_buffers\":{},\"zero_timestamp_records\":{},\"unknown_records\":{},\"invalid_buffers\":{},\"buffers\":{},\"decode_ns\":{}}}",
            h.dropped, h.refused_buffers, h.over_cap_buffers, h.zero_timestamp, h.unknown, h.invalid, h.buffers, h.decode_ns
        );
        let meta = self.meta();
        self.segment.finish_into(&meta, &health, &mut self.bytes);
        self.generation += 1;
        match wal::write_atomically(&c.cfg.dir, &wal::segment_name(c.pid, self.seq), &self.bytes) {
            Ok(_) => {
                self.totals.segments += 1;
                self.totals.records += records as u64;
                // Numbers stay contiguous (the sink reads them in order): a segment that
                // could not be written gives its number to the next.
                self.seq += 1;
            }
            Err(e) => {
                if self.totals.write_errors == 0 {
                    eprintln!(
                        "gpuq collector: cannot write a segment to {}: {e}; its records are lost",
                        c.cfg.dir.display()
                    );
                }
                self.totals.write_errors += 1;
            }
        }
        self.totals.dropped += h.dropped;
    }

    fn meta(&self) -> String {
        let c = self.c;
        format!(
            "{{\"pid\":{},\"rank\":{},\"host\":{},\"cupti_version\":{},\"library\":{},\"clock\":{{\"cupti_ns\":{},\"realtime_ns\":{}}},\"flush_ms\":{},\"seq\":{}}}",
            c.pid,
            c.cfg.rank.map_or("null".into(), |r| r.to_string()),
            json_str(&c.host),
            c.cupti.version(),
            json_str(&c.cupti.library),
            c.clock.0,
            c.clock.1,
            c.cfg.flush.as_millis(),
            self.seq
        )
    }
}

/// The id of an API call's name (`cudaLaunchKernel_v7000`), asked of CUPTI once per call kind.
fn api_name(strings: &mut SegmentStrings<'_>, cupti: &Cupti, kind: RecordKind, cbid: u32) -> u32 {
    let id = match strings.interner.api_names.get(&(kind, cbid)) {
        Some(id) => *id,
        None => {
            let domain = if kind == RecordKind::Runtime {
                cupti::DOMAIN_RUNTIME_API
            } else {
                cupti::DOMAIN_DRIVER_API
            };
            let Some(name) = cupti.callback_name(domain, cbid) else {
                return 0;
            };
            let id = strings.interner.id_of_text(&name);
            strings.interner.api_names.insert((kind, cbid), id);
            id
        }
    };
    strings.define(id)
}

fn realtime_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut std::ffi::c_char, buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_unknown_ones_are_named() {
        assert_eq!(
            parse_kinds("kernel, memcpy").unwrap(),
            vec![kind::CONCURRENT_KERNEL, kind::MEMCPY]
        );
        assert!(parse_kinds(DEFAULT_KINDS).is_ok());
        let e = parse_kinds("kernel,kernels").unwrap_err();
        assert!(e.contains("\"kernels\"") && e.contains("memset"), "{e}");
        assert!(parse_kinds(" , ").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
