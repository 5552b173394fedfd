//! `gpuq record` through the binary, with the fake libcupti (`gpuq-fakecupti`) and its
//! harness playing the CUDA driver and the application: collector -> segments -> sink ->
//! store -> SQL, including a record visible while the command runs, a SIGKILL, a CUPTI
//! subscriber already taken, dropped records, every CUPTI struct version, a command without
//! CUDA, and the same workload through the Kineto path.

mod common;

use common::{gpuq, ok, query_csv, stderr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The harness, built beside the gpuq binary (`cargo test --workspace` builds every bin).
fn fake_driver() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_gpuq")).parent().unwrap();
    let p = dir.join("gpuq-fake-driver");
    assert!(
        p.is_file(),
        "{} missing: build the workspace (cargo build --release --workspace)",
        p.display()
    );
    p
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn record_cmd(store: &Path, script: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuq"));
    c.arg("--store")
        .arg(store)
        .arg("record")
        .args(args)
        .arg("--")
        .arg(fake_driver())
        .arg(script);
    c
}

fn record(store: &Path, script: &Path, args: &[&str]) -> Output {
    record_cmd(store, script, args).output().unwrap()
}

/// One step of `n` launches and kernels from t0 (ns), NVTX step range around them.
fn step_lines(step: i64, t0: i64, n: u32, corr0: u32) -> String {
    let mut s = format!(
        "marker flags=2 id={step} timestamp={t0} pid=1 tid=7 name=\"ProfilerStep#{step}\"\n"
    );
    for i in 0..n {
        let t = t0 + 1_000 + i as i64 * 10_000;
        let c = corr0 + i;
        s += &format!(
            "runtime cbid=211 start={t} end={} pid=1 tid=7 correlation={c}\n",
            t + 2_000
        );
        s += &format!(
            "kernel start={} end={} device=0 context=1 stream=7 correlation={c} grid=8,1,1 block=256,1,1 registers=40 static_smem=1024 dynamic_smem=2048 name=_Z6gemm_kPfS_i\n",
            t + 3_000,
            t + 8_000
        );
    }
    s += &format!(
        "marker flags=4 id={step} timestamp={} pid=1 tid=7\n",
        t0 + 1_000 + n as i64 * 10_000
    );
    s
}

const PREAMBLE: &str = "device id=0 name=\"NVIDIA H100 80GB HBM3\" sms=132 memory=85899345920 cc=9.0 uuid=00112233445566778899aabbccddeeff\ncontext id=1 device=0\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const KINDS: &str = "--kinds=kernel,memcpy,memset,sync,runtime,driver,overhead,marker";

#[test]
fn a_recorded_run_holds_every_record_attributed_and_the_exit_status_is_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t0 = now_ns();
    let mut script = PREAMBLE.to_string();
    script += &step_lines(1, t0, 50, 100);
    script += "flush\n";
    script += &step_lines(2, t0 + 1_000_000, 50, 200);
    script += &format!(
        "memcpy start={} end={} device=0 context=1 stream=7 correlation=999 bytes=4096 copy_kind=1 src_kind=1 dst_kind=3\n",
        t0 + 3_000_000,
        t0 + 3_001_000
    );
    script += "print_env NVTX_INJECTION64_PATH\nexit 7\n";
    let s = write(dir.path(), "s.txt", &script);
    let spool = dir.path().join("spool");
    let o = record(
        &store,
        &s,
        &[
            "--run",
            "r",
            KINDS,
            "--tag",
            "job=test",
            "--spool",
            spool.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("run r: 203 events (100 kernels)"), "{err}");
    // With NVTX markers asked for, NVTX's injection is the collector (which passes it on).
    assert!(
        err.contains("fakecupti: NVTX_INJECTION64_PATH=/")
            && err.contains("libgpuq_collector.so\n"),
        "{err}"
    );
    assert_eq!(
        query_csv(
            &store,
            "select step, count(*), sum(dur), min(name), min(grid_x), min(shared_mem), min(registers) \
             from events where kind = 'kernel' group by step order by step"
        ),
        "step,count(*),sum(events.dur),min(events.name),min(events.grid_x),min(events.shared_mem),min(events.registers)\n\
         1,50,250000,\"gemm_k(float*, float*, int)\",8,3072,40\n\
         2,50,250000,\"gemm_k(float*, float*, int)\",8,3072,40\n"
    );
    // Steps are annotations, as torch.profiler's are; the memcpy has no launch (stored and
    // counted); the device and the tag are in the run's metadata.
    assert_eq!(
        query_csv(
            &store,
            "select count(*) from events where kind = 'annotation' and name like 'ProfilerStep#%'"
        ),
        "count(*)\n2\n"
    );
    assert_eq!(
        query_csv(
            &store,
            "select name, bytes, copy_kind from events where kind = 'memcpy'"
        ),
        "name,bytes,copy_kind\n[CUDA memcpy Host-to-Device],4096,HtoD\n"
    );
    let runs = query_csv(
        &store,
        "select format, kernels, devices, tags, warning_details from runs",
    );
    assert!(runs.contains("cupti,100"), "{runs}");
    assert!(runs.contains("H100"), "{runs}");
    assert!(runs.contains("job"), "{runs}");
    // Analyses work on a recorded run as on an ingested trace.
    let top = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "select * from top_kernels('r') limit 1",
        ],
    );
    assert!(top.contains("gemm_k"), "{top}");
    // Committed segments are deleted from the spool.
    let left: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn kernels_are_queryable_while_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t0 = now_ns();
    let mut script = PREAMBLE.to_string();
    script += &step_lines(1, t0, 20, 100);
    script += "flush\nsleep 6000\nexit 0\n";
    let s = write(dir.path(), "s.txt", &script);
    let started = Instant::now();
    let mut child = record_cmd(&store, &s, &["--run", "live", "--flush-interval", "200ms"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut seen = None;
    while started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        let o = gpuq(
            &store,
            &[
                "query",
                "--format",
                "csv",
                "select count(*) from events where kind = 'kernel'",
            ],
        );
        if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("\n20\n") {
            seen = Some(started.elapsed());
            break;
        }
    }
    let seen = seen.expect("the kernels were not queryable while the command ran");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the command had already exited"
    );
    // Flushed at once, so queryable within the flush interval + 1 s of the start.
    assert!(seen < Duration::from_millis(1_200 + 1_000), "{seen:?}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_killed_command_keeps_what_was_flushed_and_the_run_says_it_is_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t0 = now_ns();
    let mut script = PREAMBLE.to_string();
    script += &step_lines(1, t0, 30, 100);
    script += "flush\nsleep 400\n";
    script += &step_lines(2, t0 + 1_000_000, 30, 200);
    script += "kill\n";
    let s = write(dir.path(), "s.txt", &script);
    let o = record(&store, &s, &["--run", "k", "--flush-interval", "100ms"]);
    assert_eq!(o.status.code(), Some(128 + 9), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("recording incomplete"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        query_csv(&store, "select count(*) from events where kind = 'kernel'"),
        "count(*)\n30\n"
    );
    let w = query_csv(&store, "select warning_details from runs");
    assert!(w.contains("recording incomplete"), "{w}");
    // The store is consistent for the next command.
    ok(&store, &["doctor"]);
}

#[test]
fn a_taken_cupti_subscriber_or_no_cuda_records_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = write(
        dir.path(),
        "s.txt",
        &format!(
            "subscriber_taken torch.profiler\n{PREAMBLE}{}exit 0\n",
            step_lines(1, now_ns(), 5, 1)
        ),
    );
    let o = record(&store, &s, &["--run", "t"]);
    assert_eq!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(
        err.contains("nothing was recorded") && err.contains("another tool"),
        "{err}"
    );
    // A command that never initialises CUDA.
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(&store)
        .args(["record", "--run", "n", "--", "sh", "-c", "exit 4"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4));
    assert!(
        stderr(&o).contains("never initialised CUDA"),
        "{}",
        stderr(&o)
    );
    // A command that cannot start is an error, and the store stays as it was.
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(&store)
        .args(["record", "--run", "m", "--", "/nonexistent/command"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("/nonexistent/command"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        query_csv(&store, "select count(*) from runs"),
        "count(*)\n1\n"
    );
}

#[test]
fn dropped_records_are_counted_in_the_runs_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // The first record (the device) finds no buffer.
    let mut script = "drop 17\nrefuse_buffers 1\n".to_string();
    script += PREAMBLE;
    script += &step_lines(1, now_ns(), 10, 100);
    script += "print_env NVTX_INJECTION64_PATH\nsleep 1500\nexit 0\n";
    let s = write(dir.path(), "s.txt", &script);
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let bad = spool.join("cupti-0000000001-0000000001.seg");
    // A spool holding another recording's segments is refused, before anything runs.
    std::fs::write(&bad, b"GPUQCUPT\x07\0\0\0\0\0\0\0").unwrap();
    let args = [
        "--run",
        "d",
        "--kinds=kernel,runtime",
        "--spool",
        spool.to_str().unwrap(),
    ];
    let o = record(&store, &s, &args);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("another recording"), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("fakecupti"),
        "the command ran: {}",
        stderr(&o)
    );
    // A segment that is not one, appearing while the command runs, is reported and skipped;
    // the recording goes on.
    std::fs::remove_file(&bad).unwrap();
    let child = record_cmd(&store, &s, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&bad, b"GPUQCUPT\x07\0\0\0\0\0\0\0").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cupti-0000000001-0000000001.seg: byte 8: segment format"),
        "{}",
        stderr(&o)
    );
    let w = query_csv(&store, "select warning_details from runs");
    // 17 scripted, and the one record that found no buffer.
    assert!(
        w.contains("records CUPTI dropped") && w.contains("18"),
        "{w}"
    );
    assert!(w.contains("could not be read"), "{w}");
    assert!(
        stderr(&o).contains("records CUPTI dropped"),
        "{}",
        stderr(&o)
    );
    // Without markers asked for, NVTX is left alone.
    assert!(
        stderr(&o).contains("fakecupti: NVTX_INJECTION64_PATH=\n"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        query_csv(
            &store,
            "select sum(value) from counters where name = 'cupti.dropped_records'"
        ),
        "sum(counters.value)\n18.0\n"
    );
}

#[test]
fn every_cupti_struct_version_records_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = now_ns();
    let body = format!(
        "{PREAMBLE}{}flush\n{}exit 0\n",
        step_lines(1, t0, 20, 100),
        step_lines(2, t0 + 1_000_000, 20, 200)
    );
    let mut seen = Vec::new();
    for version in ["12080", "13000", "13050"] {
        let store = dir.path().join(format!("store-{version}"));
        let s = write(
            dir.path(),
            &format!("s{version}.txt"),
            &format!("version {version}\n{body}"),
        );
        let o = record(&store, &s, &["--run", "v", KINDS]);
        assert!(o.status.success(), "{}", stderr(&o));
        seen.push(query_csv(
            &store,
            "select kind, name, step, ts, dur, device, stream, correlation, grid_x, block_x, registers, shared_mem, bytes \
             from events order by ts, kind",
        ));
    }
    assert!(seen[0].lines().count() > 80);
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0], seen[2]);
}

#[test]
fn the_same_workload_through_cupti_and_through_kineto_gives_the_same_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let kineto_store = dir.path().join("kineto");
    let trace = dir.path().join("t.json");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            trace.to_str().unwrap(),
            "--steps",
            "3",
            "--rank",
            "0",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    ok(
        &kineto_store,
        &["ingest", "-q", trace.to_str().unwrap(), "--run", "k"],
    );
    // The workload as CUPTI would report it: each kernel and its launch, and the steps.
    let rows = query_csv(
        &kineto_store,
        "select g.ts, g.dur, g.device, g.stream, g.correlation, g.name, l.ts, l.dur, l.pid, l.tid \
         from events g join events l on l.correlation = g.correlation and l.kind in ('runtime', 'driver') \
         where g.kind = 'kernel' order by g.ts",
    );
    let steps = query_csv(
        &kineto_store,
        "select ts, dur, pid, tid, name from events where kind in ('annotation', 'cpu_op') and name like 'ProfilerStep#%' order by ts",
    );
    let mut script = String::from("context id=1 device=0\n");
    for (i, line) in steps.lines().skip(1).enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let (ts, dur): (i64, i64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        let (pid, tid): (i64, i64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        script += &format!(
            "marker flags=2 id={} timestamp={ts} pid={} tid={} name=\"{}\"\nmarker flags=4 id={} timestamp={} pid={} tid={}\n",
            i + 1, pid as u32, tid as u32, f[4], i + 1, ts + dur, pid as u32, tid as u32
        );
    }
    let mut reader = csv::Reader::from_reader(rows.as_bytes());
    let mut kernels = 0;
    for r in reader.records() {
        let r = r.unwrap();
        let n = |i: usize| r[i].parse::<i64>().unwrap();
        script += &format!(
            "runtime cbid=211 start={} end={} pid={} tid={} correlation={}\n",
            n(6),
            n(6) + n(7),
            n(8) as u32,
            n(9) as u32,
            n(4)
        );
        script += &format!(
            "kernel start={} end={} device={} context=1 stream={} correlation={} name=\"{}\"\n",
            n(0),
            n(0) + n(1),
            n(2),
            n(3),
            n(4),
            &r[5]
        );
        kernels += 1;
    }
    assert!(kernels > 100, "{kernels} kernels");
    script += "exit 0\n";
    let s = write(dir.path(), "s.txt", &script);
    let cupti_store = dir.path().join("cupti");
    let o = record(&cupti_store, &s, &["--run", "k", KINDS]);
    assert!(o.status.success(), "{}", stderr(&o));
    let per_step = "select step, count(*), sum(dur), count(distinct name), min(ts), max(ts + dur) \
                    from events where kind = 'kernel' group by step order by step";
    let kineto = query_csv(&kineto_store, per_step);
    assert_eq!(query_csv(&cupti_store, per_step), kineto);
    assert!(kineto.lines().count() >= 4, "{kineto}");
}

#[test]
fn records_delivered_out_of_order_are_attributed_as_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // CUPTI does not order its buffers: here every kernel is delivered a flush before the
    // call that launched it and the step around that call; then four threads launch 500
    // kernels each, and their four buffers are delivered in reverse order.
    let lines = step_lines(1, now_ns(), 40, 100);
    let (kernels, host): (Vec<&str>, Vec<&str>) =
        lines.lines().partition(|l| l.starts_with("kernel"));
    let script = format!(
        "{PREAMBLE}{}\nflush\n{}\nflush\nshuffle\nthreads 4 kernels=500 start={} stream_base=20\nexit 0\n",
        kernels.join("\n"),
        host.join("\n"),
        now_ns()
    );
    let s = write(dir.path(), "s.txt", &script);
    let o = record(&store, &s, &["--run", "o", "--flush-interval", "100ms"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        query_csv(
            &store,
            "select step, count(*) from events where kind = 'kernel' and stream = 7 group by step"
        ),
        "step,count(*)\n1,40\n"
    );
    assert_eq!(
        query_csv(
            &store,
            "select count(*) from events k join events l on k.correlation = l.correlation \
             and l.kind = 'runtime' where k.kind = 'kernel'"
        ),
        "count(*)\n2040\n"
    );
    let w = query_csv(
        &store,
        "select coalesce(warning_details, '') as w from runs",
    );
    assert!(!w.contains("without the call"), "{w}");
}

#[test]
fn a_full_buffer_pool_is_never_refused_to_cupti_before_api_27() {
    // Four threads fill 64 KB buffers faster than a 1 MB pool can take them. CUDA 12.8's
    // CUPTI (API 26) cannot take "no buffer" (the fake aborts if it gets one): the collector
    // hands out buffers past its cap there and counts them; from API 27 on it refuses, and
    // CUPTI counts the records dropped.
    for (version, refuses) in [("12080", false), ("13000", true)] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let script = format!(
            "version {version}\n{PREAMBLE}threads 4 kernels=20000 start={} stream_base=20\nexit 0\n",
            now_ns()
        );
        let s = write(dir.path(), "s.txt", &script);
        let o = record_cmd(&store, &s, &["--run", "p", "--kinds=kernel,runtime"])
            .env("GPUQ_BUFFER_KB", "64")
            .env("GPUQ_MAX_BUFFER_MB", "1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{version}: {}", stderr(&o));
        let n: u64 = query_csv(&store, "select count(*) from events where kind = 'kernel'")
            .lines()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let w = query_csv(&store, "select coalesce(warning_details, '') from runs");
        if refuses {
            assert!(n <= 80_000, "{version}: {n}");
        } else {
            assert_eq!(n, 80_000, "{version}: {w}");
        }
        let _ = w;
    }
}
