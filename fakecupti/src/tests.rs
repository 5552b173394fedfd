//! Unit tests of the fake: its layouts against `layouts.golden` (all three header sets), records
//! emitted through registered callbacks and walked with `cuptiActivityGetNextRecord` (fields read
//! back at the *golden* offsets, not the fake's own table), refusals, drops, flushing, shuffling,
//! subscriber and script errors. The fake is process-global, so tests run one at a time.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::{Mutex, MutexGuard};

use crate::layout::{consts::*, LayoutSet, Rec, ALL_SETS};
use crate::state;
use crate::*;

const GOLDEN: &str = include_str!("../../tools/cupti_layouts/layouts.golden");

/// (api, struct, field) -> (offset, size)
fn golden() -> HashMap<(u32, String, String), (usize, usize)> {
    let mut m = HashMap::new();
    for line in GOLDEN
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let c: Vec<&str> = line.split('\t').collect();
        assert_eq!(c.len(), 5, "golden row {line:?}");
        m.insert(
            (c[0].parse().unwrap(), c[1].to_string(), c[2].to_string()),
            (c[3].parse().unwrap(), c[4].parse().unwrap()),
        );
    }
    m
}

fn g_off(g: &HashMap<(u32, String, String), (usize, usize)>, api: u32, s: &str, f: &str) -> usize {
    g.get(&(api, s.to_string(), f.to_string()))
        .unwrap_or_else(|| panic!("golden lacks {api} {s} {f}"))
        .0
}

static SERIAL: Mutex<()> = Mutex::new(());

/// What the test's buffer callbacks saw.
struct Sink {
    buffer_size: usize,
    refuse_next: usize,
    /// Copies of completed buffers (u64 storage keeps CUPTI's 8-byte alignment), valid bytes.
    completed: Vec<(Vec<u64>, usize)>,
    requests: usize,
}

static SINK: Mutex<Sink> = Mutex::new(Sink {
    buffer_size: 0,
    refuse_next: 0,
    completed: Vec::new(),
    requests: 0,
});

fn sink() -> MutexGuard<'static, Sink> {
    SINK.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn test_requested(buf: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let mut s = sink();
    s.requests += 1;
    *max = 0;
    if s.refuse_next > 0 {
        s.refuse_next -= 1;
        *buf = std::ptr::null_mut();
        *size = 0;
        return;
    }
    let words = s.buffer_size / 8;
    let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
    *buf = Box::into_raw(b) as *mut u8;
    *size = words * 8;
}

unsafe extern "C" fn test_completed(
    _ctx: *mut c_void,
    _stream: u32,
    buf: *mut u8,
    size: usize,
    valid: usize,
) {
    let b = Box::from_raw(std::ptr::slice_from_raw_parts_mut(
        buf as *mut u64,
        size / 8,
    ));
    sink().completed.push((b.to_vec(), valid));
}

/// Fresh fake + sink, callbacks registered, the usual kinds enabled.
fn setup(buffer_size: usize) -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    state::reset();
    {
        let mut s = sink();
        s.buffer_size = buffer_size;
        s.refuse_next = 0;
        s.completed.clear();
        s.requests = 0;
    }
    unsafe {
        assert_eq!(
            cuptiActivityRegisterCallbacks(Some(test_requested), Some(test_completed)),
            0
        );
        for k in [1, 2, 4, 5, 8, 9, 10, 12, 17, 38, 39] {
            assert_eq!(cuptiActivityEnable(k), 0);
        }
    }
    guard
}

fn play_text(text: &str) -> i32 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "fakecupti-test-{}-{}.txt",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let code = unsafe { fakecupti_play(c.as_ptr()) };
    let _ = std::fs::remove_file(&path);
    code
}

/// Walks a completed buffer with the exported iterator; returns record byte offsets.
fn walk(buf: &[u64], valid: usize) -> Vec<usize> {
    let base = buf.as_ptr() as *mut u8;
    let mut rec: *mut c_void = std::ptr::null_mut();
    let mut out = Vec::new();
    loop {
        match unsafe { cuptiActivityGetNextRecord(base, valid, &mut rec) } {
            0 => out.push(rec as usize - base as usize),
            12 => return out,
            e => panic!("GetNextRecord error {e} after {out:?}"),
        }
    }
}

fn rd(buf: &[u64], off: usize, size: usize) -> u64 {
    let bytes: &[u8] =
        unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
    let mut v = [0u8; 8];
    v[..size].copy_from_slice(&bytes[off..off + size]);
    u64::from_le_bytes(v)
}

fn cstr_at(buf: &[u64], off: usize) -> Option<String> {
    let p = rd(buf, off, 8) as *const std::ffi::c_char;
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[test]
fn layouts_equal_golden_for_every_version() {
    let g = golden();
    for set in ALL_SETS {
        assert_eq!(
            g[&(set.api, "enum".into(), "CUPTI_API_VERSION".into())].0,
            set.api as usize
        );
        for rec in Rec::ALL {
            let name = rec.golden_name();
            assert_eq!(
                set.size(rec),
                g[&(set.api, name.into(), "(sizeof)".into())].1,
                "{} {name}",
                set.api
            );
            assert_eq!(set.size(rec) % 8, 0);
        }
        // Every fake field is golden, and every golden field of these records is in the fake.
        for (rec, field, off, size) in set.fields() {
            let key = (set.api, rec.golden_name().to_string(), field.to_string());
            assert_eq!(g.get(&key), Some(&(*off, *size)), "{key:?}");
        }
        for ((api, s, f), v) in &g {
            if *api != set.api || s == "enum" || f == "(sizeof)" {
                continue;
            }
            let rec = Rec::ALL
                .iter()
                .find(|r| r.golden_name() == s)
                .expect("known struct");
            assert_eq!(set.field(*rec, f), Some(*v), "{api} {s} {f}");
        }
    }
    assert_eq!(LayoutSet::for_version(12080).unwrap().api, 26);
    assert_eq!(LayoutSet::for_version(13000).unwrap().api, 130001);
    assert_eq!(LayoutSet::for_version(13050).unwrap().api, 130500);
    let e = |n: &str| g[&(130001, "enum".to_string(), n.to_string())].0 as u32;
    for (name, v) in [
        ("CUPTI_ACTIVITY_KIND_MEMCPY", KIND_MEMCPY),
        ("CUPTI_ACTIVITY_KIND_MEMSET", KIND_MEMSET),
        ("CUPTI_ACTIVITY_KIND_KERNEL", KIND_KERNEL),
        ("CUPTI_ACTIVITY_KIND_DRIVER", KIND_DRIVER),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", KIND_RUNTIME),
        ("CUPTI_ACTIVITY_KIND_DEVICE", KIND_DEVICE),
        ("CUPTI_ACTIVITY_KIND_CONTEXT", KIND_CONTEXT),
        (
            "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
            KIND_CONCURRENT_KERNEL,
        ),
        ("CUPTI_ACTIVITY_KIND_MARKER", KIND_MARKER),
        ("CUPTI_ACTIVITY_KIND_OVERHEAD", KIND_OVERHEAD),
        ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", KIND_SYNCHRONIZATION),
        (
            "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION",
            KIND_EXTERNAL_CORRELATION,
        ),
        ("CUPTI_SUCCESS", SUCCESS),
        ("CUPTI_ERROR_INVALID_PARAMETER", ERROR_INVALID_PARAMETER),
        ("CUPTI_ERROR_MAX_LIMIT_REACHED", ERROR_MAX_LIMIT_REACHED),
        ("CUPTI_ERROR_INVALID_KIND", ERROR_INVALID_KIND),
        ("CUPTI_ERROR_NOT_INITIALIZED", ERROR_NOT_INITIALIZED),
        (
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
            ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
        ),
        ("CUPTI_ERROR_UNKNOWN", ERROR_UNKNOWN),
        ("CUPTI_CB_DOMAIN_DRIVER_API", CB_DOMAIN_DRIVER_API),
        ("CUPTI_CB_DOMAIN_RUNTIME_API", CB_DOMAIN_RUNTIME_API),
        ("CUPTI_ACTIVITY_OBJECT_THREAD", OBJECT_THREAD),
    ] {
        assert_eq!(e(name), v, "{name}");
    }
}

const ALL_KINDS_SCRIPT: &str = r#"
device id=0 name="NVIDIA H100 80GB HBM3" sms=132 memory=85000000000 cc=9.0 uuid=00112233445566778899aabbccddeeff
context id=1 device=0
runtime cbid=211 start=1000 end=1500 pid=42 tid=43 correlation=7 return=0
kernel start=2000 end=3000 device=0 context=1 stream=13 correlation=7 grid=4,5,6 block=128,2,1 registers=40 static_smem=1024 dynamic_smem=2048 name=_Z3fooPf graph_id=9 graph_node=77 launch_type=1 queued=1900 submitted=1950
memcpy start=3100 end=3200 device=0 context=1 stream=13 correlation=8 bytes=4096 copy_kind=1 src_kind=2 dst_kind=3 graph_node=5
memset start=3300 end=3400 device=0 context=1 stream=13 correlation=9 bytes=512 value=255 memory_kind=3
driver cbid=307 start=1100 end=1400 pid=42 tid=43 correlation=10 return=1
sync type=3 start=3500 end=3600 correlation=11 context=1 stream=4294967295 event=0
external_correlation kind=3 id=123456789012 correlation=7
marker flags=2 timestamp=900 id=5 pid=42 tid=43 name="ProfilerStep#3" domain=dom
marker flags=4 timestamp=3700 id=5 pid=42 tid=43
overhead kind=65536 object_kind=2 pid=42 tid=43 start=3800 end=3900 correlation=0
flush
"#;

#[test]
fn emitted_records_walk_back_at_golden_offsets_for_every_version() {
    let g = golden();
    for (v, api) in [(12080, 26u32), (13000, 130001), (13050, 130500)] {
        let _s = setup(1 << 16);
        assert_eq!(play_text(&format!("version {v}\n{ALL_KINDS_SCRIPT}")), 0);
        let mut ver = 0;
        unsafe { cuptiGetVersion(&mut ver) };
        assert_eq!(ver, api);
        let done = std::mem::take(&mut sink().completed);
        assert_eq!(done.len(), 1, "one thread, one buffer");
        let (buf, valid) = &done[0];
        let offs = walk(buf, *valid);
        assert_eq!(offs.len(), 12);
        let o = |s: &str, f: &str| g_off(&g, api, s, f);
        let size = |s: &str| g[&(api, s.to_string(), "(sizeof)".to_string())].1;
        let kinds: Vec<u64> = offs.iter().map(|&r| rd(buf, r, 4)).collect();
        assert_eq!(kinds, [8, 9, 5, 10, 1, 2, 4, 38, 39, 12, 12, 17]);
        // Records are packed back to back with the golden sizes.
        let sizes = [
            "device",
            "context",
            "api",
            "kernel",
            "memcpy",
            "memset",
            "api",
            "sync",
            "external_correlation",
            "marker",
            "marker",
            "overhead",
        ];
        let mut at = 0;
        for (i, s) in sizes.iter().enumerate() {
            assert_eq!(offs[i], at, "{s}");
            at += size(s);
        }
        assert_eq!(at, *valid);

        let [dev, ctx, rt, k, mc, ms, drv, sy, ec, m1, m2, ov] = offs[..].try_into().unwrap();
        assert_eq!(rd(buf, dev + o("device", "numMultiprocessors"), 4), 132);
        assert_eq!(
            rd(buf, dev + o("device", "globalMemorySize"), 8),
            85_000_000_000
        );
        assert_eq!(rd(buf, dev + o("device", "computeCapabilityMajor"), 4), 9);
        assert_eq!(rd(buf, dev + o("device", "computeCapabilityMinor"), 4), 0);
        assert_eq!(rd(buf, dev + o("device", "uuid"), 8), 0x7766554433221100);
        assert_eq!(
            cstr_at(buf, dev + o("device", "name")).as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(rd(buf, ctx + o("context", "contextId"), 4), 1);
        assert_eq!(rd(buf, rt + o("api", "cbid"), 4), 211);
        assert_eq!(rd(buf, rt + o("api", "start"), 8), 1000);
        assert_eq!(rd(buf, rt + o("api", "threadId"), 4), 43);
        assert_eq!(rd(buf, rt + o("api", "correlationId"), 4), 7);
        assert_eq!(rd(buf, k + o("kernel", "start"), 8), 2000);
        assert_eq!(rd(buf, k + o("kernel", "end"), 8), 3000);
        assert_eq!(rd(buf, k + o("kernel", "streamId"), 4), 13);
        assert_eq!(rd(buf, k + o("kernel", "gridZ"), 4), 6);
        assert_eq!(rd(buf, k + o("kernel", "blockY"), 4), 2);
        assert_eq!(rd(buf, k + o("kernel", "registersPerThread"), 2), 40);
        assert_eq!(rd(buf, k + o("kernel", "dynamicSharedMemory"), 4), 2048);
        assert_eq!(rd(buf, k + o("kernel", "correlationId"), 4), 7);
        assert_eq!(rd(buf, k + o("kernel", "graphId"), 4), 9);
        assert_eq!(rd(buf, k + o("kernel", "graphNodeId"), 8), 77);
        assert_eq!(rd(buf, k + o("kernel", "launchType"), 1), 1);
        assert_eq!(rd(buf, k + o("kernel", "submitted"), 8), 1950);
        assert_eq!(
            cstr_at(buf, k + o("kernel", "name")).as_deref(),
            Some("_Z3fooPf")
        );
        assert_eq!(rd(buf, mc + o("memcpy", "bytes"), 8), 4096);
        assert_eq!(rd(buf, mc + o("memcpy", "dstKind"), 1), 3);
        assert_eq!(rd(buf, mc + o("memcpy", "graphNodeId"), 8), 5);
        assert_eq!(rd(buf, ms + o("memset", "value"), 4), 255);
        assert_eq!(rd(buf, ms + o("memset", "memoryKind"), 2), 3);
        assert_eq!(rd(buf, drv + o("api", "returnValue"), 4), 1);
        assert_eq!(rd(buf, sy + o("sync", "streamId"), 4), 0xffff_ffff);
        assert_eq!(
            rd(buf, ec + o("external_correlation", "externalId"), 8),
            123456789012
        );
        assert_eq!(rd(buf, m1 + o("marker", "objectKind"), 4), 2);
        assert_eq!(rd(buf, m1 + o("marker", "objectId"), 4), 42);
        assert_eq!(rd(buf, m1 + o("marker", "objectId") + 4, 4), 43);
        assert_eq!(
            cstr_at(buf, m1 + o("marker", "name")).as_deref(),
            Some("ProfilerStep#3")
        );
        assert_eq!(
            cstr_at(buf, m1 + o("marker", "domain")).as_deref(),
            Some("dom")
        );
        assert_eq!(rd(buf, m2 + o("marker", "flags"), 4), 4);
        assert_eq!(cstr_at(buf, m2 + o("marker", "name")), None);
        assert_eq!(rd(buf, ov + o("overhead", "overheadKind"), 4), 65536);
        assert_eq!(rd(buf, ov + o("overhead", "objectId") + 4, 4), 43);
    }
}

#[test]
fn buffers_roll_over_and_flush_all_delivers_every_thread() {
    let _s = setup(1024); // 4 kernels of <= 248 B per buffer
    assert_eq!(
        play_text("version 13000\nthreads 3 kernels=10 start=1000 stream_base=7\n"),
        0
    );
    let before = sink().completed.len();
    assert!(before > 0, "full buffers are completed during emission");
    unsafe { assert_eq!(cuptiActivityFlushAll(0), 0) };
    let done = std::mem::take(&mut sink().completed);
    assert_eq!(
        done.len(),
        before + 3,
        "one partial buffer per emitting thread"
    );
    let mut kernels = 0;
    let mut launches = std::collections::HashSet::new();
    for (buf, valid) in &done {
        for r in walk(buf, *valid) {
            match rd(buf, r, 4) {
                5 => assert!(launches.insert(rd(buf, r + 32, 4))),
                10 => kernels += 1,
                k => panic!("kind {k}"),
            }
        }
    }
    assert_eq!((kernels, launches.len()), (30, 30));
    // Nothing left: a second flush delivers nothing.
    unsafe { cuptiActivityFlushAll(1) };
    assert!(sink().completed.is_empty());
    let report = state::lock().report_json("t");
    assert!(report.contains("\"delivered\":{\"kernel\":30,"), "{report}");
    assert!(report.contains("\"pending\":0,"), "{report}");
}

#[test]
fn refused_buffers_are_counted_as_dropped() {
    let _s = setup(4096);
    // Two scripted refusals, then the client itself refuses one request (NULL buffer).
    assert_eq!(
        play_text("refuse_buffers 2\nruntime cbid=211\nruntime cbid=211\n"),
        0
    );
    sink().refuse_next = 1;
    assert_eq!(
        play_text("runtime cbid=211\nruntime cbid=211\ndrop 5\nflush\n"),
        0
    );
    let mut n = 0usize;
    unsafe {
        assert_eq!(
            cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut n),
            0
        );
        assert_eq!(n, 2 + 1 + 5);
        cuptiActivityGetNumDroppedRecords(std::ptr::null_mut(), 0, &mut n);
    }
    assert_eq!(n, 0, "reading resets");
    let done = std::mem::take(&mut sink().completed);
    assert_eq!(
        done.iter().map(|(b, v)| walk(b, *v).len()).sum::<usize>(),
        1
    );
    assert_eq!(
        sink().requests,
        2,
        "scripted refusals never reach the client"
    );
}

#[test]
fn disabled_kinds_and_cbids_are_suppressed_and_no_callbacks_means_undelivered() {
    let _s = setup(4096);
    unsafe {
        cuptiActivityDisable(KIND_MEMSET);
        cuptiActivityEnableRuntimeApi(17, 0);
    }
    assert_eq!(
        play_text("memset bytes=1\nruntime cbid=17\nruntime cbid=211\nflush\n"),
        0
    );
    let r = state::lock().report_json("t");
    assert!(
        r.contains("\"suppressed\":{\"kernel\":0,\"memcpy\":0,\"memset\":1,\"runtime\":1,"),
        "{r}"
    );
    state::reset();
    assert_eq!(play_text("kernel start=1\n"), 0);
    assert!(state::lock()
        .report_json("t")
        .contains("\"undelivered\":1,"));
}

#[test]
fn shuffle_delivers_buffers_in_reverse_order() {
    let _s = setup(256); // one kernel record per buffer
    assert_eq!(
        play_text(
            "shuffle\nkernel correlation=1\nkernel correlation=2\nkernel correlation=3\nflush\n"
        ),
        0
    );
    let done = std::mem::take(&mut sink().completed);
    let corr: Vec<u64> = done.iter().map(|(b, _)| rd(b, 92, 4)).collect();
    assert_eq!(corr, [3, 2, 1]);
}

#[test]
fn subscriber_versions_and_callback_names() {
    let _s = setup(4096);
    let mut sub: *mut c_void = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            cuptiSubscribe(&mut sub, std::ptr::null_mut(), std::ptr::null_mut()),
            0
        );
        assert!(!sub.is_null());
        let mut other: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            cuptiSubscribe(&mut other, std::ptr::null_mut(), std::ptr::null_mut()),
            39
        );
        assert_eq!(cuptiUnsubscribe(sub), 0);
        assert_eq!(play_text("subscriber_taken kineto\n"), 0);
        assert_eq!(
            cuptiSubscribe(&mut sub, std::ptr::null_mut(), std::ptr::null_mut()),
            39
        );

        let mut name: *const std::ffi::c_char = std::ptr::null();
        assert_eq!(cuptiGetCallbackName(2, 211, &mut name), 0);
        assert_eq!(
            CStr::from_ptr(name).to_str().unwrap(),
            "cudaLaunchKernel_v7000"
        );
        assert_eq!(cuptiGetCallbackName(1, 307, &mut name), 0);
        assert_eq!(CStr::from_ptr(name).to_str().unwrap(), "cuLaunchKernel");
        assert_eq!(cuptiGetCallbackName(2, 9999, &mut name), 1);
        assert!(name.is_null());
        assert_eq!(
            play_text("callback_name domain=runtime cbid=9999 name=\"my api\"\n"),
            0
        );
        assert_eq!(cuptiGetCallbackName(2, 9999, &mut name), 0);
        assert_eq!(CStr::from_ptr(name).to_str().unwrap(), "my api");

        let mut ts = 0u64;
        cuptiGetTimestamp(&mut ts);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        assert!((now.as_nanos() as i128 - ts as i128).abs() < 1_000_000_000);
        let mut s: *const std::ffi::c_char = std::ptr::null();
        assert_eq!(cuptiGetResultString(39, &mut s), 0);
        assert_eq!(
            CStr::from_ptr(s).to_str().unwrap(),
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        );
    }
    assert_eq!(play_text("version 12080\n"), 0);
    assert_eq!(state::api_version(), 26);
}

#[test]
fn script_errors_name_the_line_and_exit_99() {
    let _s = setup(4096);
    assert_eq!(play_text("flush\nkernel strat=1\n"), 99);
    assert_eq!(play_text("# c\n\nexit 7\nkernel start=1\n"), 7);
    assert_eq!(
        crate::script::parse_for_test("flush\n\nbogus 1\n")
            .unwrap_err()
            .0,
        3
    );
    assert_eq!(
        crate::script::parse_for_test("memcpy copy_kind=x\n")
            .unwrap_err()
            .0,
        1
    );
    assert_eq!(
        crate::script::parse_for_test("version 11000\n")
            .unwrap_err()
            .0,
        1
    );
    assert_eq!(
        crate::script::parse_for_test("kernel grid=1,2\n")
            .unwrap_err()
            .0,
        1
    );
    // Width errors show up when the record is built.
    assert_eq!(play_text("memcpy copy_kind=300\n"), 99);
    assert_eq!(
        crate::script::tokenize_for_test(r#"kernel name="a b" x=1 # trailing"#).unwrap(),
        ["kernel", "name=a b", "x=1"]
    );
    assert!(crate::script::tokenize_for_test(r#"kernel name="a b"#).is_err());
}

#[test]
fn report_export_is_json_with_counts() {
    let _s = setup(4096);
    assert_eq!(play_text("kernel start=1\nkernel start=2\ndrop 3\n"), 0);
    let n = unsafe { fakecupti_report(std::ptr::null_mut(), 0) };
    let mut out = vec![0 as std::ffi::c_char; n + 1];
    assert_eq!(unsafe { fakecupti_report(out.as_mut_ptr(), out.len()) }, n);
    let s = unsafe { CStr::from_ptr(out.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        s.starts_with("{\"phase\":\"query\",\"api_version\":130001,\"emitted\":{\"kernel\":2,"),
        "{s}"
    );
    assert!(
        s.contains("\"pending\":2,") && s.contains("\"dropped\":3,"),
        "{s}"
    );
}
