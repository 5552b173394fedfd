//! The Kineto generator's output against its own ground truth.
use super::*;
use serde_json::Value;
use std::collections::HashMap;

fn gen(cfg: &SynthConfig) -> (Vec<u8>, GroundTruth) {
    let mut v = Vec::new();
    let gt = write_kineto(cfg, &mut v).unwrap();
    (v, gt)
}

/// `"1234.567"` or `"1234"` microseconds, exactly, in ns.
fn parse_us(s: &str) -> i64 {
    match s.split_once('.') {
        Some((i, f)) => {
            assert_eq!(f.len(), 3, "not 3 decimals: {s}");
            i.parse::<i64>().unwrap() * 1000 + f.parse::<i64>().unwrap()
        }
        None => s.parse::<i64>().unwrap() * 1000,
    }
}

/// The raw number text after `"key": ` in an event line.
fn raw<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\": ");
    let i = line.find(&pat)? + pat.len();
    let rest = &line[i..];
    let n = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(rest.len());
    Some(&rest[..n])
}

struct Ev {
    v: Value,
    ts: i64,
    dur: i64,
}

/// Events of the trace, one per line, with exact times.
fn events(bytes: &[u8], base: i64) -> Vec<Ev> {
    let text = std::str::from_utf8(bytes).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim();
        if !l.starts_with("{\"ph\"") {
            continue;
        }
        let l = l.strip_suffix(',').unwrap_or(l);
        let v: Value = serde_json::from_str(l).unwrap();
        let ts = raw(l, "ts").map(parse_us).unwrap_or(0) + base;
        let dur = raw(l, "dur").map(parse_us).unwrap_or(0);
        out.push(Ev { v, ts, dur });
    }
    out
}

fn kind_of(e: &Value) -> Option<&'static str> {
    match e["ph"].as_str()? {
        "i" => Some("instant"),
        "X" => Some(match e["cat"].as_str()? {
            "user_annotation" => "annotation",
            "cpu_op" => "cpu_op",
            "cuda_runtime" => "runtime",
            "kernel" => "kernel",
            "gpu_memcpy" => "memcpy",
            "gpu_memset" => "memset",
            "python_function" => "python",
            other => panic!("unexpected cat {other}"),
        }),
        _ => None,
    }
}

/// Recompute every ground-truth field from the text and compare.
fn check(cfg: &SynthConfig) {
    let (bytes, gt) = gen(cfg);
    assert_eq!(gt.bytes_written, bytes.len() as u64);
    let doc: Value = serde_json::from_slice(&bytes).expect("valid JSON");
    let trace = doc["traceEvents"].as_array().expect("traceEvents");
    assert_eq!(
        doc["metadata"]["env"]["HF_TOKEN"],
        "hf_synthetic_secret_do_not_store"
    );
    match cfg.rank {
        Some(r) => {
            assert_eq!(doc["distributedInfo"]["rank"], r);
            assert_eq!(doc["distributedInfo"]["world_size"], cfg.world_size);
        }
        None => assert!(doc.get("distributedInfo").is_none()),
    }
    let base = match cfg.base_time_ns {
        Some(b) => {
            assert_eq!(doc["baseTimeNanoseconds"].as_i64(), Some(b));
            b
        }
        None => {
            assert!(doc.get("baseTimeNanoseconds").is_none());
            0
        }
    };
    let evs = events(&bytes, base);
    assert_eq!(evs.len(), trace.len(), "one event per line");

    let mut n = 0u64;
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_name: BTreeMap<String, i64> = BTreeMap::new();
    let mut count_by_name: BTreeMap<String, u64> = BTreeMap::new();
    let mut launches: HashMap<i64, i64> = HashMap::new();
    let mut ops: Vec<(i64, i64, String)> = Vec::new();
    let mut gpu: Vec<(i64, i64, i64, String)> = Vec::new(); // stream, start, end, cat
    let mut kernels: Vec<(i64, i64, String)> = Vec::new(); // correlation, dur, name
    let mut steps = Vec::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for e in &evs {
        let v = &e.v;
        if let Some(k) = kind_of(v) {
            n += 1;
            *kinds.entry(k.into()).or_default() += 1;
            first = first.min(e.ts);
            last = last.max(e.ts + e.dur);
            if !cfg.float_ts {
                assert_eq!((e.ts - base) % 1000, 0);
                assert!(!raw_has_dot(v));
            }
        }
        let name = v["name"].as_str().unwrap_or("").to_string();
        match kind_of(v) {
            Some("kernel") | Some("memcpy") | Some("memset") => {
                assert_eq!(v["pid"].as_i64(), Some(cfg.device as i64));
                assert_eq!(v["args"]["device"].as_i64(), Some(cfg.device as i64));
                let s = v["args"]["stream"].as_i64().unwrap();
                assert_eq!(v["tid"].as_i64(), Some(s));
                assert!(e.dur > 0);
                gpu.push((s, e.ts, e.ts + e.dur, v["cat"].as_str().unwrap().into()));
                if kind_of(v) == Some("kernel") {
                    *by_name.entry(name.clone()).or_default() += e.dur;
                    *count_by_name.entry(name.clone()).or_default() += 1;
                    kernels.push((
                        v["args"]["correlation"].as_i64().unwrap(),
                        e.dur,
                        name.clone(),
                    ));
                }
            }
            Some("runtime") => {
                let c = v["args"]["correlation"].as_i64().unwrap();
                assert!(launches.insert(c, e.ts).is_none(), "correlation {c} reused");
            }
            Some("cpu_op") => ops.push((e.ts, e.ts + e.dur, name.clone())),
            Some("annotation") => {
                if let Some(s) = name.strip_prefix("ProfilerStep#") {
                    steps.push((s.parse::<u32>().unwrap(), e.ts, e.dur));
                }
            }
            _ => {}
        }
    }
    assert_eq!(n, gt.events);
    assert_eq!(kinds, gt.kind_counts);
    for k in [
        "annotation",
        "cpu_op",
        "runtime",
        "kernel",
        "instant",
        "python",
    ] {
        assert!(gt.kind_counts[k] > 0, "no {k}");
    }
    assert_eq!(kernels.len() as u64, gt.kernels);
    assert_eq!(by_name, gt.kernel_ns_by_name);
    assert_eq!(count_by_name, gt.kernel_count_by_name);
    steps.sort();
    assert_eq!(steps, gt.steps);
    assert_eq!(steps.len() as u32, cfg.steps);
    assert_eq!((first, last), (gt.first_ts_ns, gt.last_end_ns));

    // Innermost enclosing cpu_op of each launch (brute force).
    let mut by_op: BTreeMap<String, i64> = BTreeMap::new();
    for (c, dur, _) in &kernels {
        let t = launches[c];
        let inner = ops
            .iter()
            .filter(|(s, e, _)| *s <= t && t < *e)
            .min_by_key(|(s, e, _)| e - s)
            .expect("every launch is inside a cpu_op");
        *by_op.entry(inner.2.clone()).or_default() += dur;
    }
    assert_eq!(by_op, gt.kernel_ns_by_op);
    if cfg.nccl {
        assert!(by_op["record_param_comms"] > 0);
    }

    // Streams are serial; the union is the busy time.
    gpu.sort();
    for w in gpu.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(
                w[0].2 <= w[1].1,
                "overlap on stream {}: {:?} {:?}",
                w[0].0,
                w[0],
                w[1]
            );
        }
    }
    let mut iv: Vec<(i64, i64)> = gpu.iter().map(|g| (g.1, g.2)).collect();
    iv.sort();
    let (mut busy, mut cur) = (0i64, None::<(i64, i64)>);
    for (s, e) in iv {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                busy += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    if let Some((cs, ce)) = cur {
        busy += ce - cs;
    }
    assert_eq!(gt.busy_ns_by_device.get(&cfg.device), Some(&busy));
    let total: i64 = gpu.iter().map(|g| g.2 - g.1).sum();
    if cfg.streams > 1 || cfg.nccl {
        assert!(busy < total, "streams should overlap somewhere");
    }
}

fn raw_has_dot(v: &Value) -> bool {
    [&v["ts"], &v["dur"]].iter().any(|x| x.is_f64())
}

#[test]
fn deterministic() {
    let (a, ga) = gen(&SynthConfig::small());
    let (b, gb) = gen(&SynthConfig::small());
    assert_eq!(a, b);
    assert_eq!(ga, gb);
    let (c, _) = gen(&SynthConfig {
        seed: 2,
        ..SynthConfig::small()
    });
    assert_ne!(a, c);
    let (d1, _) = gen(&SynthConfig {
        steps: 3,
        ..SynthConfig::demo()
    });
    let (d2, _) = gen(&SynthConfig {
        steps: 3,
        ..SynthConfig::demo()
    });
    assert_eq!(d1, d2);
}

#[test]
fn small_matches_ground_truth() {
    check(&SynthConfig::small());
}

#[test]
fn integer_us_f64_recompute() {
    // Integer microseconds survive f64 (epoch us < 2^53): recompute with the plain Value.
    let cfg = SynthConfig {
        streams: 2,
        nccl: true,
        ..SynthConfig::small()
    };
    let (bytes, gt) = gen(&cfg);
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let mut n = 0;
    let mut by_name: BTreeMap<String, i64> = BTreeMap::new();
    for e in doc["traceEvents"].as_array().unwrap() {
        if matches!(e["ph"].as_str(), Some("X") | Some("i")) {
            n += 1;
        }
        if e["cat"] == "kernel" {
            let dur = e["dur"].as_u64().expect("integer dur") as i64 * 1000;
            *by_name
                .entry(e["name"].as_str().unwrap().into())
                .or_default() += dur;
        }
    }
    assert_eq!(n, gt.events);
    assert_eq!(by_name, gt.kernel_ns_by_name);
    check(&cfg);
}

#[test]
fn float_epoch_multi_stream() {
    check(&SynthConfig {
        steps: 3,
        layers: 4,
        streams: 3,
        ..SynthConfig::demo()
    });
}

#[test]
fn float_base_time_relative() {
    let cfg = SynthConfig {
        steps: 2,
        layers: 3,
        base_time_ns: Some(1_712_345_678_901_234_567),
        rank: Some(3),
        world_size: 4,
        device: 3,
        first_step: 10,
        ..SynthConfig::demo()
    };
    check(&cfg);
    let (_, gt) = gen(&cfg);
    assert!(gt.first_ts_ns > 1_712_345_678_901_234_567);
    assert_eq!(gt.steps[0].0, 10);
    assert!(gt.busy_ns_by_device.contains_key(&3));
}

#[test]
fn integer_base_time_no_copies() {
    check(&SynthConfig {
        copies: false,
        base_time_ns: Some(1_700_000_000_000_000_123),
        ..SynthConfig::small()
    });
}

#[test]
fn exact_decimal_times() {
    // Epoch ns exceed 2^53: the printed text must still be exact to the ns.
    let cfg = SynthConfig {
        steps: 1,
        layers: 2,
        ..SynthConfig::demo()
    };
    let (bytes, gt) = gen(&cfg);
    let text = std::str::from_utf8(&bytes).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("\"name\": \"ProfilerStep#5\""))
        .unwrap();
    let ts = parse_us(raw(line, "ts").unwrap());
    assert_eq!(ts, gt.steps[0].1);
    assert!(ts > 1 << 53);
    assert!(raw(line, "ts").unwrap().contains('.'));
}

#[test]
fn sized_is_close() {
    let cfg = SynthConfig::sized(5_000_000);
    let gt = write_kineto(&cfg, io::sink()).unwrap();
    assert!(
        (4_000_000..=6_000_000).contains(&gt.bytes_written),
        "{} bytes",
        gt.bytes_written
    );
}

#[test]
fn write_errors_propagate() {
    struct Fail;
    impl Write for Fail {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    assert!(write_kineto(&SynthConfig::small(), Fail).is_err());
}

/// `cargo test --release -p gpuq-synth kineto::tests::throughput -- --ignored --nocapture`
#[test]
#[ignore]
fn throughput() {
    let cfg = SynthConfig::sized(500_000_000);
    let t0 = std::time::Instant::now();
    let gt = write_kineto(&cfg, io::sink()).unwrap();
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{} bytes, {} events in {:.3} s: {:.0} MB/s",
        gt.bytes_written,
        gt.events,
        s,
        gt.bytes_written as f64 / s / 1e6
    );
}
