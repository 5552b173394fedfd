//! The fuzzers' seed corpus, made when it is needed: from gpuq's trace generators
//! (`gpuq_synth`), the repository's fixtures, and small slices of the
//! shared traces when `../shared` is present. Nothing here is stored in the repository.

use crate::fuzz::{rocprof_input, Target};
use gpuq_synth::{write_kineto, SynthConfig};
use gpuq_synth::{write_nsys, NsysConfig};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest seed: libFuzzer's mutations pay per byte, and a parser's paths show in a few KB.
const MAX_SEED: usize = 24 << 10;

pub fn seeds(target: Target) -> Vec<Vec<u8>> {
    let mut out = match target {
        Target::JsonScan => json_scan_seeds(),
        Target::Kineto => kineto_seeds(),
        Target::SqlitePages => sqlite_seeds(),
        Target::Rocprof => rocprof_seeds(),
        Target::StageLog => stagelog_seeds(),
        Target::Duration => duration_seeds(),
        Target::Manifest => manifest_seeds(),
    };
    out.retain(|s| s.len() <= MAX_SEED);
    out.sort();
    out.dedup();
    out
}

fn repo_dir() -> PathBuf {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|d| d.join("../ingest/fixtures").is_dir())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    crate_dir.join("..")
}

/// Small Kineto traces from the generator, in each of its time and shape options.
fn synth_kineto() -> Vec<Vec<u8>> {
    let mut configs = Vec::new();
    let mut c = SynthConfig::small();
    c.steps = 1;
    c.layers = 1;
    configs.push(c.clone());
    let mut f = c.clone();
    f.float_ts = true;
    f.base_time_ns = Some(1_700_000_000_000_000_000);
    configs.push(f);
    let mut d = c.clone();
    d.rank = Some(1);
    d.world_size = 2;
    d.nccl = true;
    d.streams = 2;
    d.copies = false;
    configs.push(d);
    configs
        .iter()
        .map(|cfg| {
            let mut buf = Vec::new();
            write_kineto(cfg, &mut buf).expect("generate a trace");
            buf
        })
        .collect()
}

/// Hand-written shapes the generator does not write: a bare event array (also unterminated),
/// legacy category names, string ids, escapes, counters, instants.
const KINETO_SHAPES: &[&str] = &[
    r#"[{"ph":"X","cat":"Operator","name":"aten::mm","pid":1,"tid":1,"ts":1,"dur":5},
{"ph":"X","cat":"Kernel","name":"k\"1\\","pid":0,"tid":7,"ts":2,"dur":3,"args":{"correlation":9,"device":0,"stream":7}}]"#,
    r#"[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1.5,"dur":2.25},"#,
    r#"{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":"stream 7","tid":"Spans","ts":"10","dur":1,"args":{"device":0,"stream":7,"correlation":1,"grid":[1,2,3],"block":[4,5,6]}},
{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":2,"ts":9,"dur":1,"args":{"correlation":1}},
{"ph":"C","name":"mem","pid":1,"tid":1,"ts":12,"args":{"bytes":100}},
{"ph":"i","cat":"cpu_instant_event","name":"[memory]","pid":1,"tid":1,"ts":13,"s":"t","args":{"Bytes":8,"Total Allocated":8,"Device Id":0}},
{"ph":"s","id":1,"pid":1,"tid":2,"ts":9,"cat":"ac2g","name":"ac2g"},
{"ph":"f","id":1,"pid":0,"tid":7,"ts":10,"cat":"ac2g","name":"ac2g","bp":"e"}],
"baseTimeNanoseconds":1700000000000000000,"distributedInfo":{"rank":0,"world_size":1},"deviceProperties":[{"id":0,"name":"NVIDIA H100"}]}"#,
    r#"{"schemaVersion":1,"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":1,"tid":1,"ts":0,"dur":100,"args":{"External id":1,"note":"\u00e9\ud83d\ude00 [{]}"}},{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD (Pageable -> Device)","pid":0,"tid":20,"ts":5,"dur":4,"args":{"device":0,"stream":20,"correlation":2,"bytes":64}}]}"#,
    r#"{"CPU functions":[{"name":"a","cpu_time_us":1}],"CUDA functions":[]}"#,
];

fn kineto_seeds() -> Vec<Vec<u8>> {
    let mut out = synth_kineto();
    out.extend(KINETO_SHAPES.iter().map(|s| s.as_bytes().to_vec()));
    out.extend(shared_kineto_slices());
    out
}

/// The head of each shared Kineto trace, cut after a whole event and closed: the metadata
/// and first events of real traces.
fn shared_kineto_slices() -> Vec<Vec<u8>> {
    let Some(dir) = gpuq_testkit::shared_traces("kineto") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for path in gpuq_testkit::trace_files(&dir) {
        let Some(head) = read_head(&path, 256 << 10) else {
            continue;
        };
        let Some(events) = find(&head, b"\"traceEvents\"") else {
            continue;
        };
        // The last `},` that leaves the slice under the seed size.
        let limit = (events + 12_000).min(head.len());
        let Some(cut) = head[..limit].windows(2).rposition(|w| w == b"},") else {
            continue;
        };
        if cut < events {
            continue;
        }
        let mut seed = head[..cut + 1].to_vec();
        seed.extend_from_slice(b"\n]}");
        out.push(seed);
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Up to `n` bytes of a (possibly gzipped) file's content.
fn read_head(path: &Path, n: usize) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut r: Box<dyn Read> = if path.to_string_lossy().ends_with(".gz") {
        Box::new(flate2::read::MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    };
    let mut buf = Vec::new();
    (&mut r).take(n as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}

fn json_scan_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = [
        r#"{"a":1}"#,
        r#"[1,[2,[3]],{"b":"]"}]"#,
        r#"{"name":"x\"}","args":{"k":"{\\","l":[1,2]}}"#,
        r#"{"ph":"X","args":{"a":{"b":{"c":"}}}}"}}}"#,
        "{\"s\":\"\\\\\\\"\"}   \n",
        r#"{"long":"0123456789012345678901234567890123456789012345678901234567890123456789","args":{"x":"{[\"]}"}}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    // Single events of generated traces: what the scanner is given in an ingest.
    for trace in synth_kineto() {
        for line in trace.split(|&b| b == b'\n').take(40) {
            let t = line.trim_ascii();
            let t = t.strip_suffix(b",").unwrap_or(t);
            if t.starts_with(b"{") {
                out.push(t.to_vec());
            }
        }
    }
    out.extend(KINETO_SHAPES.iter().map(|s| s.as_bytes().to_vec()));
    out
}

/// A database of the shapes the page reader meets: integers of each width, reals, NULLs,
/// text and blobs (some spilling onto overflow pages), an `INTEGER PRIMARY KEY`, and enough
/// rows for interior pages; 512-byte pages keep it small.
fn generated_database(path: &Path) -> rusqlite::Result<()> {
    let c = rusqlite::Connection::open(path)?;
    c.execute_batch(
        "PRAGMA page_size = 512; PRAGMA journal_mode = DELETE;
         CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, r REAL, s TEXT, b BLOB, n);
         CREATE TABLE w (x, y, z);",
    )?;
    let mut ins = c.prepare("INSERT INTO t (a, r, s, b, n) VALUES (?1, ?2, ?3, ?4, NULL)")?;
    for i in 0..120i64 {
        let a = match i % 6 {
            0 => 0,
            1 => 1,
            2 => 127 << (i % 50),
            3 => -i,
            4 => i64::MIN + i,
            _ => i * 1_000_003,
        };
        let s = "x".repeat(if i % 17 == 0 { 700 } else { (i % 9) as usize });
        ins.execute(rusqlite::params![
            a,
            i as f64 / 3.0,
            s,
            vec![i as u8; (i % 5) as usize]
        ])?;
    }
    c.execute_batch("INSERT INTO w VALUES (1, 2.5, 'é'), (NULL, x'00ff', 3);")?;
    Ok(())
}

/// A few rows of the big tables of an Nsight Systems export, copied into a small database.
fn export_slice(source: &Path, out: &Path) -> rusqlite::Result<()> {
    let c = rusqlite::Connection::open(out)?;
    c.execute_batch("PRAGMA page_size = 512; PRAGMA journal_mode = DELETE;")?;
    c.execute(
        "ATTACH DATABASE ?1 AS s",
        [format!("file:{}?mode=ro&immutable=1", source.display())],
    )?;
    for (table, rows) in [
        ("CUPTI_ACTIVITY_KIND_KERNEL", 12),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", 12),
        ("NVTX_EVENTS", 8),
        ("StringIds", 30),
    ] {
        let exists: bool = c.query_row(
            "SELECT count(*) > 0 FROM s.sqlite_schema WHERE type = 'table' AND name = ?1",
            [table],
            |r| r.get(0),
        )?;
        if exists {
            c.execute_batch(&format!(
                "CREATE TABLE {table} AS SELECT * FROM s.{table} LIMIT {rows}"
            ))?;
        }
    }
    c.execute_batch("DETACH DATABASE s")?;
    Ok(())
}

fn sqlite_seeds() -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut out = Vec::new();
    let generated = dir.path().join("generated.sqlite");
    generated_database(&generated).expect("generate a database");
    out.push(std::fs::read(&generated).expect("read it back"));
    let mut sources = Vec::new();
    let synth = dir.path().join("synth.sqlite");
    let mut cfg = NsysConfig::small();
    cfg.processes = 1;
    cfg.steps = 1;
    cfg.kernels_per_step = 8;
    if write_nsys(&cfg, &synth).is_ok() {
        sources.push(synth);
    }
    if let Some(nsys) = gpuq_testkit::shared_traces("nsys") {
        let shared = entries(&nsys).into_iter();
        sources.extend(
            shared
                .filter(|p| p.extension().is_some_and(|e| e == "sqlite"))
                .take(2),
        );
    }
    for (i, source) in sources.iter().enumerate() {
        let slice = dir.path().join(format!("slice{i}.sqlite"));
        if export_slice(source, &slice).is_ok() {
            if let Ok(bytes) = std::fs::read(&slice) {
                out.push(bytes);
            }
        }
    }
    out
}

/// The entries of `dir`, sorted (none when it cannot be read).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn rocprof_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for case in entries(&repo_dir().join("ingest/fixtures/rocprof")) {
        let files: Vec<(String, Vec<u8>)> = entries(&case)
            .iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_string_lossy().into_owned();
                let mut content = std::fs::read(p).ok()?;
                content.truncate(6 << 10);
                Some((name, content))
            })
            .collect();
        out.push(rocprof_input(&files));
    }
    out
}

const STAGE_LOGS: &[&str] = &[
    "2026-12-02T10:00:00.123456789Z stage=load begin\n2026-12-02T10:00:01.5Z stage=load end\n",
    "time=2026-12-02T10:00:00+02:00 level=info stage=\"data prep\" event=start rank=3\n\
     time=\"2026-12-02 10:00:02+0200\" stage=\"data prep\" event=stop rank=3\n",
    "{\"ts\": \"2026-12-02T10:00:00.5Z\", \"stage\": \"load\", \"event\": \"begin\", \"pid\": 4}\n\
     {\"ts\": 1796205601.25, \"stage\": \"load\", \"event\": \"end\", \"pid\": 4, \"step\": 2}\n\
     {\"msg\": \"other\"}\n",
    "2026-12-02 10:00:00,123 INFO stage=train begin\n\
     2026-12-02 10:00:00,500 - root - INFO - stage=step begin step=0\n\
     2026-12-02 10:00:01,000 - root - INFO - stage=step end step=0\n\
     2026-12-02 10:00:02,000 INFO stage=train end\n",
    "1796205600 stage=a begin\n1796205600123 stage=a end\n1796205600123456 stage=b start\n\
     1796205600123456789 stage=b finish\n\r\n",
    "\u{feff}2026-12-02T10:00:00Z stage=outer begin\n2026-12-02T10:00:01Z stage=inner enter\n\
     2026-12-02T10:00:02Z stage=inner exit\n2026-12-02T10:00:03Z other text\n",
    "2026-12-02T10:00:00 stage=naive begin\n",
];

fn stagelog_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = STAGE_LOGS.iter().map(|s| s.as_bytes().to_vec()).collect();
    let fixture = repo_dir().join("ingest/fixtures/stagelog/python_snippet.log");
    if let Ok(mut log) = std::fs::read(fixture) {
        log.truncate(8 << 10);
        out.push(log);
    }
    out
}

fn duration_seeds() -> Vec<Vec<u8>> {
    [
        "0",
        "250ns",
        "100us",
        "1.5ms",
        "2s",
        "1h30m",
        "1m 30s",
        " .5s ",
        "-2min",
        "3 µs",
        "9223372036854775807ns",
        "0.0000000000000000000001h",
        "3..5",
        "3..",
        "..5",
        "4",
        "5..3",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// Manifests a store writes: empty, one run, two runs with one replaced (tombstones).
fn manifest_seeds() -> Vec<Vec<u8>> {
    use gpuq_engine::RunId;
    use gpuq_ingest::{ingest, IngestOptions, NoProgress};
    let dir = tempfile::tempdir().expect("temp dir");
    let store = gpuq_engine::Store::open(dir.path().join("store")).expect("store");
    let trace = dir.path().join("t.json");
    std::fs::write(&trace, &synth_kineto()[0]).expect("write trace");
    let mut out = vec![serde_json::to_vec(&gpuq_engine::Manifest::default()).expect("json")];
    for (run, replace) in [("a", false), ("b", false), ("a", true)] {
        let opts = IngestOptions {
            run: Some(RunId::new(run).expect("run id")),
            replace,
            merge_unrelated: true,
            ..Default::default()
        };
        if ingest(&store, std::slice::from_ref(&trace), &opts, &NoProgress).is_ok() {
            // Manifest names are inverted versions: the newest sorts first.
            let names = entries(&store.paths().manifest_dir());
            if let Some(bytes) = names.first().and_then(|p| std::fs::read(p).ok()) {
                out.push(bytes);
            }
        }
    }
    out
}
