//! The fuzz targets' short run, on the stable toolchain: each target's body
//! (`gpuq_tests::fuzz`) over its seed corpus and a few thousand deterministic mutations of it
//! (bit flips, interesting bytes, truncations, insertions, deletions, splices), asserting no
//! panic, no hang (a time bound per input) and errors that say where. The long runs are
//! cargo-fuzz's (`fuzz/README.md`).
//!
//! A failing input is written to `$TMPDIR/gpuq-fuzz-failures/` and can be replayed with the
//! cargo-fuzz target of the same name. `GPUQ_FUZZ_CASES` sets the mutations per target.

use gpuq_synth::Rng;
use gpuq_tests::fuzz::{seeds, Target};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Mutated inputs per target, unless `GPUQ_FUZZ_CASES` says otherwise.
const CASES: usize = 8000;
/// The longest one input may take: the slowest seed parses in milliseconds, so this is a hang
/// even on a loaded machine.
const PER_INPUT: Duration = Duration::from_secs(10);

/// Inputs that fail because of a defect known and being fixed elsewhere: (target, FNV-1a
/// hash of the input, why). Each is still run; its failure is reported, not fatal.
const KNOWN: &[(Target, u64, &str)] = &[];

/// Seeded draws in `0..n` (0 when `n` is 0).
fn below(rng: &mut Rng, n: usize) -> usize {
    if n == 0 {
        0
    } else {
        rng.below(n as u64) as usize
    }
}

/// Bytes that change the meaning of text inputs: quotes, brackets, separators, escapes,
/// digits, signs, line ends, NUL, and the starts of multi-byte and invalid UTF-8.
const INTERESTING: &[u8] = b"\"\\{}[],:\n\r\t 0123456789-+.eE=_#\x00\x7f\x80\xc3\xff";

/// Tokens that push parsers to their limits.
const TOKENS: &[&[u8]] = &[
    b"99999999999999999999",
    b"-9223372036854775808",
    b"9223372036854775807",
    b"1e308",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"NaN",
    b"\"\"",
    b"{}",
    b"[]",
    b"..",
    b"\xef\xbb\xbf",
];

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + below(rng, 4) {
        let len = d.len();
        let at = below(rng, len + 1);
        match below(rng, 9) {
            0 if len > 0 => {
                let i = below(rng, len);
                d[i] ^= 1 << below(rng, 8);
            }
            1 if len > 0 => {
                let i = below(rng, len);
                d[i] = INTERESTING[below(rng, INTERESTING.len())];
            }
            2 => d.truncate(at),
            3 => {
                let n = 1 + below(rng, 8);
                let bytes: Vec<u8> = (0..n)
                    .map(|_| {
                        if below(rng, 2) == 0 {
                            INTERESTING[below(rng, INTERESTING.len())]
                        } else {
                            rng.next() as u8
                        }
                    })
                    .collect();
                d.splice(at..at, bytes);
            }
            4 => {
                let end = (at + 1 + below(rng, 64)).min(len);
                d.drain(at.min(end)..end);
            }
            5 => {
                let from = below(rng, other.len() + 1);
                d.truncate(at);
                d.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => {
                let a = below(rng, len);
                let b = (a + 1 + below(rng, 256)).min(len);
                let chunk = d[a..b].to_vec();
                d.splice(at..at, chunk);
            }
            7 => {
                let t = TOKENS[below(rng, TOKENS.len())];
                d.splice(at..at, t.iter().copied());
            }
            _ => {
                // A run of digits replaced by a huge one: sizes, counts and times overflow.
                if let Some(i) = (at..len).find(|&i| d[i].is_ascii_digit()) {
                    let j = (i..len).find(|&j| !d[j].is_ascii_digit()).unwrap_or(len);
                    let t = TOKENS[below(rng, 3)];
                    d.splice(i..j, t.iter().copied());
                }
            }
        }
    }
    d
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Keeps a failing input where it can be replayed; returns its path.
fn keep(target: Target, data: &[u8]) -> String {
    let dir = std::env::temp_dir().join("gpuq-fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{}-{:016x}", target.name(), fnv1a(data)));
    let _ = std::fs::write(&path, data);
    path.display().to_string()
}

const WORKER: &str = "fuzz-worker";

/// Panics of the workers are reported with their input, not printed by the default hook;
/// every other thread's still are.
fn quiet_worker_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(WORKER) {
                default(info);
            }
        }));
    });
}

/// Runs `target` over its seeds and their mutations on a worker thread, watched for hangs.
fn short_run(target: Target) {
    let cases = std::env::var("GPUQ_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    let corpus = seeds(target);
    assert!(!corpus.is_empty(), "{}: no seeds", target.name());
    let mut rng = Rng(0x6770_7571_0000_0000 ^ fnv1a(target.name().as_bytes()));
    // The seeds, then their mutations, made as they are run (a long run holds one at a time).
    let total = corpus.len() + cases;
    let inputs = (0..total).map(|i| match corpus.get(i) {
        Some(seed) => seed.clone(),
        None => {
            let seed = &corpus[below(&mut rng, corpus.len())];
            let other = &corpus[below(&mut rng, corpus.len())];
            mutate(&mut rng, seed, other)
        }
    });
    let (tx, rx) = mpsc::channel::<(usize, Result<(), String>)>();
    let (work_tx, work_rx) = mpsc::channel::<(usize, Vec<u8>)>();
    quiet_worker_panics();
    let worker = std::thread::Builder::new()
        .name(WORKER.into())
        .spawn(move || {
            for (i, data) in work_rx {
                let outcome = catch_unwind(AssertUnwindSafe(|| target.run(&data)))
                    .map_err(|p| panic_text(p.as_ref()));
                if tx.send((i, outcome)).is_err() {
                    break;
                }
            }
        })
        .expect("spawn the worker");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut known = Vec::new();
    let mut slowest = Duration::ZERO;
    for (i, data) in inputs.enumerate() {
        let t0 = Instant::now();
        work_tx.send((i, data.clone())).expect("worker alive");
        match rx.recv_timeout(PER_INPUT) {
            Ok((_, Ok(()))) => {}
            Ok((_, Err(message))) => {
                let hash = fnv1a(&data);
                match KNOWN.iter().find(|(t, h, _)| *t == target && *h == hash) {
                    Some((_, _, why)) => known.push(format!("{hash:016x}: {why}")),
                    None => failures.push(format!(
                        "input {i} ({} bytes, {}): {message}",
                        data.len(),
                        keep(target, &data)
                    )),
                }
            }
            Err(_) => {
                panic!(
                    "{}: input {i} ({} bytes) ran past {PER_INPUT:?}: a hang? kept as {}",
                    target.name(),
                    data.len(),
                    keep(target, &data)
                );
            }
        }
        slowest = slowest.max(t0.elapsed());
    }
    drop(work_tx);
    worker.join().expect("worker");
    eprintln!(
        "{}: {total} inputs ({} seeds) in {:.2?}, slowest {slowest:.2?}; {} known failures",
        target.name(),
        corpus.len(),
        started.elapsed(),
        known.len()
    );
    for k in &known {
        eprintln!("  known: {k}");
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {total} inputs broke the target:\n{}",
        target.name(),
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn json_scan_short_run() {
    short_run(Target::JsonScan);
}

#[test]
fn kineto_short_run() {
    short_run(Target::Kineto);
}

#[test]
fn sqlite_pages_short_run() {
    short_run(Target::SqlitePages);
}

#[test]
fn rocprof_short_run() {
    short_run(Target::Rocprof);
}

#[test]
fn stagelog_short_run() {
    short_run(Target::StageLog);
}

#[test]
fn duration_short_run() {
    short_run(Target::Duration);
}

#[test]
fn manifest_short_run() {
    short_run(Target::Manifest);
}

/// The mutations are a fixed function of the seed: a failure found in CI is found again.
#[test]
fn mutations_are_reproducible() {
    let seed = br#"{"traceEvents":[{"ph":"X","ts":1,"dur":2}]}"#;
    let run = || {
        let mut rng = Rng(42);
        (0..50)
            .map(|_| mutate(&mut rng, seed, b"[1,2]"))
            .collect::<Vec<_>>()
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    assert!(a.iter().filter(|m| m.as_slice() != seed).count() > 40);
}
