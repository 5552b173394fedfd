//! End-to-end tests of `gpuq-fake-driver` + the fake `.so`: a minimal C injection library
//! (compiled here with `cc`; the tests skip if no C compiler exists) finds the fake through
//! `dlopen("libcupti.so.13", RTLD_NOLOAD)`, subscribes, registers buffer callbacks, counts what it
//! is handed and flushes at `atexit` — the mechanism the real collector relies on. Each scenario is
//! its own process, as `InitializeInjection`, `atexit` and SIGKILL require.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const INJECTION_C: &str = r#"
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef uint32_t R;
static R (*getVersion)(uint32_t *);
static R (*subscribe)(void **, void *, void *);
static R (*registerCb)(void *, void *);
static R (*enable)(uint32_t);
static R (*flushAll)(uint32_t);
static R (*nextRecord)(uint8_t *, size_t, void **);
static R (*numDropped)(void *, uint32_t, size_t *);
static unsigned long long records, kernels, launches, buffers, dropped;
static uint32_t version;
static void requested(uint8_t **b, size_t *s, size_t *m) {
  *s = 4096; *b = aligned_alloc(8, 4096); *m = 0;
}
static void completed(void *c, uint32_t st, uint8_t *b, size_t s, size_t valid) {
  void *r = NULL;
  /* completed runs on emitting threads and the flush thread at once */
  __atomic_fetch_add(&buffers, 1, __ATOMIC_RELAXED);
  while (nextRecord(b, valid, &r) == 0) {
    uint32_t kind = *(uint32_t *)r;
    __atomic_fetch_add(&records, 1, __ATOMIC_RELAXED);
    if (kind == 10) __atomic_fetch_add(&kernels, 1, __ATOMIC_RELAXED);
    if (kind == 5) __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
  }
  free(b);
}
static volatile int stop;
static pthread_t flusher;
static pthread_mutex_t flush_mu = PTHREAD_MUTEX_INITIALIZER;
static void *flush_loop(void *a) {
  while (!stop) { pthread_mutex_lock(&flush_mu); flushAll(0); pthread_mutex_unlock(&flush_mu); }
  return NULL;
}
static void at_exit(void) {
  size_t d = 0;
  if (getenv("INJ_FLUSH_THREAD")) { stop = 1; pthread_join(flusher, NULL); }
  flushAll(1);
  numDropped(NULL, 0, &d);
  dropped += d;
  FILE *f = fopen(getenv("INJ_OUT"), "w");
  fprintf(f, "version=%u records=%llu kernels=%llu launches=%llu buffers=%llu dropped=%llu\n",
          version, records, kernels, launches, buffers, dropped);
  fclose(f);
}
int InitializeInjection(void) {
  void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
  if (!h) { fprintf(stderr, "inj: no libcupti.so.13 mapped\n"); return 0; }
  getVersion = dlsym(h, "cuptiGetVersion"); subscribe = dlsym(h, "cuptiSubscribe");
  registerCb = dlsym(h, "cuptiActivityRegisterCallbacks"); enable = dlsym(h, "cuptiActivityEnable");
  flushAll = dlsym(h, "cuptiActivityFlushAll"); nextRecord = dlsym(h, "cuptiActivityGetNextRecord");
  numDropped = dlsym(h, "cuptiActivityGetNumDroppedRecords");
  void *sub = NULL;
  getVersion(&version);
  R r = subscribe(&sub, NULL, NULL);
  if (r != 0) { fprintf(stderr, "inj: subscribe -> %u\n", r); return 0; }
  registerCb((void *)requested, (void *)completed);
  enable(10); enable(5); enable(1);
  atexit(at_exit);
  if (getenv("INJ_FLUSH_THREAD")) pthread_create(&flusher, NULL, flush_loop, NULL);
  return 1;
}
"#;

fn target_dir() -> PathBuf {
    // This test binary lives in target/<profile>/deps/, next to the freshly built cdylib.
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds the C injection library once per test process; None if no C compiler is available.
fn injection_lib() -> Option<PathBuf> {
    static LIB: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dir = target_dir().join(format!("fakecupti-inj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let src = dir.join("inj.c");
        std::fs::write(&src, INJECTION_C).ok()?;
        let lib = dir.join("libinj.so");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let ok = Command::new(cc)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .args(["-ldl", "-lpthread"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("skipping: no C compiler to build the test injection library");
        }
        ok.then_some(lib)
    })
    .clone()
}

struct Run {
    out: Output,
    inj: String,
    report: String,
}

fn run(name: &str, script: &str, inj: Option<&Path>, env: &[(&str, &str)]) -> Run {
    let dir = target_dir().join(format!("fakecupti-run-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script_path = dir.join("script.txt");
    std::fs::write(&script_path, script).unwrap();
    let (inj_out, report) = (dir.join("inj.txt"), dir.join("report.json"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuq-fake-driver"));
    cmd.arg(&script_path)
        .env("GPUQ_FAKE_CUPTI", target_dir().join("libgpuq_fakecupti.so"))
        .env("GPUQ_FAKE_CUPTI_REPORT", &report)
        .env("INJ_OUT", &inj_out)
        .env_remove("GPUQ_FAKE_CUPTI_VERSION")
        .env_remove("GPUQ_FAKE_CUPTI_TAKEN")
        .env(
            "CUDA_INJECTION64_PATH",
            inj.map(|p| p.as_os_str()).unwrap_or_default(),
        );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let r = Run {
        out,
        inj: std::fs::read_to_string(&inj_out).unwrap_or_default(),
        report: std::fs::read_to_string(&report).unwrap_or_default(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn stderr(r: &Run) -> String {
    String::from_utf8_lossy(&r.out.stderr).into_owned()
}

#[test]
fn collector_finds_the_fake_by_soname_and_gets_everything_at_exit() {
    let Some(inj) = injection_lib() else { return };
    let script = "version 13050\nthreads 4 kernels=50 start=1000 stream_base=7\nflush\n\
                  kernel correlation=1 name=\"late kernel\"\nmemset bytes=1\nexit 0\n";
    let r = run("happy", script, Some(&inj), &[]);
    assert_eq!(r.out.status.code(), Some(0), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("InitializeInjection returned 1"),
        "{}",
        stderr(&r)
    );
    // 400 from the threads, 1 more kernel at the atexit flush; memset was never enabled.
    assert!(
        r.inj
            .starts_with("version=130500 records=401 kernels=201 launches=200 "),
        "{}",
        r.inj
    );
    assert!(r.report.contains("\"phase\":\"exit\""), "{}", r.report);
    assert!(
        r.report.contains("\"delivered\":{\"kernel\":201,"),
        "{}",
        r.report
    );
    assert!(r.report.contains("\"pending\":0,"), "{}", r.report);
}

#[test]
fn flushing_from_another_thread_while_eight_threads_emit_loses_nothing() {
    let Some(inj) = injection_lib() else { return };
    let script = "threads 8 kernels=2000 start=1000 stream_base=1\nexit 0\n";
    let r = run(
        "concurrent",
        script,
        Some(&inj),
        &[("INJ_FLUSH_THREAD", "1")],
    );
    assert_eq!(r.out.status.code(), Some(0), "{}", stderr(&r));
    assert!(
        r.inj
            .starts_with("version=130001 records=32000 kernels=16000 launches=16000 "),
        "{}",
        r.inj
    );
    assert!(r.inj.ends_with("dropped=0\n"), "{}", r.inj);
}

#[test]
fn taken_subscriber_from_the_script_header_makes_the_collector_back_off() {
    let Some(inj) = injection_lib() else { return };
    let r = run(
        "taken",
        "subscriber_taken kineto\nkernel start=1\n",
        Some(&inj),
        &[],
    );
    assert_eq!(r.out.status.code(), Some(0));
    assert!(
        stderr(&r).contains("inj: subscribe -> 39"),
        "{}",
        stderr(&r)
    );
    assert!(stderr(&r).contains("InitializeInjection returned 0"));
    assert!(r.report.contains("\"undelivered\":1,"), "{}", r.report);
    // The environment does the same, and the version reaches InitializeInjection too.
    let r = run(
        "envver",
        "drop 4\n",
        Some(&inj),
        &[("GPUQ_FAKE_CUPTI_VERSION", "12080")],
    );
    assert!(
        r.inj.starts_with("version=26 records=0 ") && r.inj.ends_with("dropped=4\n"),
        "{}",
        r.inj
    );
}

#[test]
fn plays_without_injection_and_honours_exit_and_kill() {
    let r = run(
        "noinj",
        "kernel start=1\nexit 3\nkernel start=2\n",
        None,
        &[],
    );
    assert_eq!(r.out.status.code(), Some(3), "{}", stderr(&r));
    assert!(r.report.contains("\"undelivered\":1,"), "{}", r.report);
    let r = run("kill", "kernel start=1\nkill\n", None, &[]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(r.out.status.signal(), Some(9));
    assert!(r.report.contains("\"phase\":\"kill\""), "{}", r.report);
    let r = run("bad", "kernel bogus=1\n", None, &[]);
    assert_eq!(r.out.status.code(), Some(99));
    assert!(
        stderr(&r).contains("fakecupti: script line 1: unknown key bogus"),
        "{}",
        stderr(&r)
    );
    let r = run(
        "nofake",
        "flush\n",
        None,
        &[("GPUQ_FAKE_CUPTI", "/nonexistent/libx.so")],
    );
    assert_eq!(r.out.status.code(), Some(98));
}
