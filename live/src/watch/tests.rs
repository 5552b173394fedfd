//! The watch end to end on a store in a temporary directory.

use super::*;
use gpuq_synth::{write_kineto, SynthConfig};
use std::sync::{Arc, Mutex};

/// Events as lines (`stored NAME`, `failed NAME: ...`), shared with the test.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl WatchReporter for Lines {
    fn event(&mut self, event: WatchEvent<'_>) {
        let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
        let line = match event {
            WatchEvent::Stored { path, .. } => format!("stored {}", name(path)),
            WatchEvent::Duplicate { path, .. } => format!("duplicate {}", name(path)),
            WatchEvent::Failed { path, error } => format!("failed {}: {error}", name(path)),
            WatchEvent::Incomplete { path } => format!("incomplete {}", name(path)),
            WatchEvent::ChangedAfterStore { path } => format!("changed {}", name(path)),
            WatchEvent::Note(n) => format!("note {n}"),
        };
        self.0.lock().unwrap().push(line);
    }
}

impl Lines {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn cycle(first_step: u32) -> Vec<u8> {
    let cfg = SynthConfig {
        first_step,
        steps: 2,
        ..SynthConfig::small()
    };
    let mut text = Vec::new();
    write_kineto(&cfg, &mut text).unwrap();
    text
}

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    store: Store,
    opts: WatchOptions,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("traces");
    std::fs::create_dir(&dir).unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let mut opts = WatchOptions::new(dir.clone(), RunId::new("live").unwrap());
    opts.settle = Duration::from_millis(50);
    opts.once = true;
    Fixture {
        _tmp: tmp,
        dir,
        store,
        opts,
    }
}

impl Fixture {
    /// Runs the watch to its end (`once` or `idle_exit` must be set).
    fn run_once(&self, lines: &Lines) -> WatchSummary {
        watch(
            &self.store,
            &self.opts,
            &AtomicBool::new(false),
            &mut lines.clone(),
        )
        .unwrap()
    }

    fn sources(&self) -> Vec<String> {
        let manifest = self.store.manifest().unwrap();
        let Some(entry) = manifest.runs.get(&self.opts.run) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entry
            .meta
            .sources
            .iter()
            .map(|s| {
                Path::new(&s.path)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}

#[test]
fn a_restarted_watch_reads_no_stored_file_again_and_misses_none() {
    let f = fixture();
    std::fs::write(f.dir.join("w.1.pt.trace.json"), cycle(0)).unwrap();
    let lines = Lines::default();
    let first = f.run_once(&lines);
    assert_eq!((first.stored, first.resumed), (1, 0));
    assert_eq!(lines.take(), ["stored w.1.pt.trace.json"]);
    std::fs::write(f.dir.join("w.2.pt.trace.json"), cycle(2)).unwrap();
    let second = f.run_once(&lines);
    // The first file is known from the run's sources: not read (ingest would have said
    // "duplicate").
    assert_eq!(
        (second.stored, second.resumed, second.duplicates),
        (1, 1, 0)
    );
    assert_eq!(lines.take(), ["stored w.2.pt.trace.json"]);
    assert_eq!(f.sources(), ["w.1.pt.trace.json", "w.2.pt.trace.json"]);
    // A copy of a stored file under another name is found by its content hash.
    std::fs::copy(f.dir.join("w.1.pt.trace.json"), f.dir.join("copy.json")).unwrap();
    let third = f.run_once(&lines);
    assert_eq!((third.stored, third.resumed, third.duplicates), (0, 2, 1));
    assert_eq!(lines.take(), ["duplicate copy.json"]);
}

#[test]
fn a_truncated_file_is_incomplete_until_it_is_whole() {
    let f = fixture();
    let text = cycle(0);
    let path = f.dir.join("w.1.pt.trace.json");
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    std::fs::write(f.dir.join("empty.json"), b"").unwrap();
    let lines = Lines::default();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.failed, s.incomplete), (0, 0, 2));
    assert_eq!(
        lines.take(),
        ["incomplete empty.json", "incomplete w.1.pt.trace.json"]
    );
    assert!(f.sources().is_empty());
    std::fs::write(&path, &text).unwrap();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.incomplete), (1, 1));
    assert_eq!(f.sources(), ["w.1.pt.trace.json"]);
}

#[test]
fn a_file_written_in_pieces_is_stored_once_whole() {
    let mut f = fixture();
    f.opts.once = false;
    f.opts.settle = Duration::from_millis(300);
    let text = cycle(0);
    let path = f.dir.join("w.1.pt.trace.json");
    let stop = Arc::new(AtomicBool::new(false));
    let lines = Lines::default();
    let summary = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut reporter = lines.clone();
            watch(&f.store, &f.opts, &stop, &mut reporter).unwrap()
        });
        let mut file = std::fs::File::create(&path).unwrap();
        for piece in text.chunks(text.len() / 5 + 1) {
            std::io::Write::write_all(&mut file, piece).unwrap();
            std::io::Write::flush(&mut file).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            // Nothing is stored while the file grows.
            assert!(f.sources().is_empty());
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while f.sources().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::SeqCst);
        watcher.join().unwrap()
    });
    assert_eq!((summary.stored, summary.failed), (1, 0));
    assert_eq!(lines.take(), ["stored w.1.pt.trace.json"]);
}

#[test]
fn a_bad_file_is_reported_once_with_its_position_and_the_watch_goes_on() {
    let f = fixture();
    let bad = gpuq_testkit::with_bad_timestamp(&cycle(0));
    std::fs::write(f.dir.join("a_bad.json"), &bad).unwrap();
    std::fs::write(f.dir.join("b_good.json"), cycle(2)).unwrap();
    std::fs::write(f.dir.join("notes.txt"), "not a trace at all\n").unwrap();
    // A watch that runs on for many rescans after reading them: the bad file is reported
    // once, the file that is no trace never.
    let mut f = f;
    f.opts.once = false;
    f.opts.idle_exit = Some(Duration::from_millis(800));
    let lines = Lines::default();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.failed), (1, 1));
    let got = lines.take();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].starts_with("failed a_bad.json: byte "), "{got:?}");
    assert_eq!(got[1], "stored b_good.json");
}

#[test]
fn ranks_come_from_file_names_when_asked() {
    let mut f = fixture();
    f.opts.rank_from = RankFrom::Path;
    let traced = |rank: i32| {
        let cfg = SynthConfig {
            rank: Some(0),
            world_size: 8,
            first_step: rank as u32 * 10,
            ..SynthConfig::small()
        };
        let mut text = Vec::new();
        write_kineto(&cfg, &mut text).unwrap();
        text
    };
    std::fs::write(f.dir.join("worker3.1700000000000.pt.trace.json"), traced(3)).unwrap();
    std::fs::write(f.dir.join("rank-5.json"), traced(5)).unwrap();
    std::fs::write(f.dir.join("host_77.json"), traced(7)).unwrap();
    let lines = Lines::default();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.failed), (2, 1));
    assert!(lines
        .take()
        .iter()
        .any(|l| l
            .starts_with("failed host_77.json: the file name and its directories give no rank")));
    let manifest = f.store.manifest().unwrap();
    let meta = &manifest.runs[&f.opts.run].meta;
    assert_eq!(meta.ranks, [3, 5]);
}

#[test]
fn a_stored_file_that_grows_is_reported_once_and_not_stored_again_even_after_a_restart() {
    let f = fixture();
    let path = f.dir.join("w.1.pt.trace.json");
    std::fs::write(&path, cycle(0)).unwrap();
    let lines = Lines::default();
    assert_eq!(f.run_once(&lines).stored, 1);
    lines.take();
    let mut grown = cycle(0);
    grown.extend_from_slice(b"\n\n");
    std::fs::write(&path, &grown).unwrap();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.resumed, s.duplicates), (0, 0, 0));
    assert_eq!(lines.take(), ["changed w.1.pt.trace.json"]);
    assert_eq!(f.sources(), ["w.1.pt.trace.json"]);
}

fn rocprof_fixture(case: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ingest/fixtures/rocprof");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join(case))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// The one source of `run` in `store`: its path, hash and member files (names).
fn only_source(store: &Store, run: &RunId) -> (String, String, Vec<String>) {
    let manifest = store.manifest().unwrap();
    let sources = &manifest.runs[run].meta.sources;
    assert_eq!(sources.len(), 1, "{sources:?}");
    let s = &sources[0];
    let members = s
        .files
        .iter()
        .map(|f| {
            let name = Path::new(&f.path).file_name().unwrap();
            name.to_string_lossy().into_owned()
        })
        .collect();
    (s.path.clone(), s.hash.clone(), members)
}

#[test]
fn a_rocprof_output_written_table_by_table_into_a_subdirectory_is_stored_as_one() {
    let mut f = fixture();
    f.opts.once = false;
    f.opts.settle = Duration::from_millis(400);
    f.opts.idle_exit = Some(Duration::from_millis(1500));
    let node = f.dir.join("node1");
    let tables = rocprof_fixture("modern");
    let lines = Lines::default();
    let summary = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut reporter = lines.clone();
            watch(&f.store, &f.opts, &AtomicBool::new(false), &mut reporter).unwrap()
        });
        // rocprofv3 makes its directory, then writes one table after another.
        std::thread::sleep(Duration::from_millis(200));
        std::fs::create_dir(&node).unwrap();
        for table in &tables {
            std::fs::copy(table, node.join(table.file_name().unwrap())).unwrap();
            std::thread::sleep(Duration::from_millis(150));
            assert!(f.sources().is_empty(), "stored before its last table");
        }
        watcher.join().unwrap()
    });
    assert_eq!(
        (summary.stored, summary.failed),
        (1, 0),
        "{:?}",
        lines.take()
    );
    assert_eq!(lines.take(), ["stored 4242_*.csv"]);
    let (path, hash, members) = only_source(&f.store, &f.opts.run);
    assert_eq!(Path::new(&path), node);
    assert_eq!(
        members,
        [
            "4242_agent_info.csv",
            "4242_hip_api_trace.csv",
            "4242_kernel_trace.csv",
            "4242_marker_api_trace.csv",
            "4242_memory_copy_trace.csv"
        ]
    );
    // The same bytes as `gpuq ingest` of the output directory.
    let tmp = tempfile::tempdir().unwrap();
    let reference = Store::open(tmp.path().join("store")).unwrap();
    let opts = IngestOptions {
        run: Some(f.opts.run.clone()),
        ..IngestOptions::default()
    };
    gpuq_ingest::ingest(&reference, &[node.clone()], &opts, &NoProgress).unwrap();
    assert_eq!(only_source(&reference, &f.opts.run).1, hash);
    let (watched, ingested) = (f.store.manifest().unwrap(), reference.manifest().unwrap());
    let (watched, ingested) = (
        &watched.runs[&f.opts.run].meta,
        &ingested.runs[&f.opts.run].meta,
    );
    assert_eq!(
        (watched.events, watched.kernels),
        (ingested.events, ingested.kernels)
    );
    // A restart knows each table as stored.
    f.opts.once = true;
    let again = f.run_once(&lines);
    assert_eq!((again.stored, again.resumed), (0, 5));
    assert!(lines.take().is_empty());
}

#[test]
fn outputs_of_two_processes_in_one_directory_are_two_appends_and_the_store_is_not_watched() {
    let f = fixture();
    for table in rocprof_fixture("multiprocess") {
        std::fs::copy(&table, f.dir.join(table.file_name().unwrap())).unwrap();
    }
    // A store kept inside the watched directory is passed over.
    let inner = Store::open(f.dir.join("inner-store")).unwrap();
    let opts = &f.opts;
    let lines = Lines::default();
    let s = watch(&inner, opts, &AtomicBool::new(false), &mut lines.clone()).unwrap();
    assert_eq!((s.stored, s.failed), (2, 0), "{:?}", lines.take());
    let mut got = lines.take();
    got.sort();
    assert_eq!(got, ["stored 100_*.csv", "stored 200_*.csv"]);
    let manifest = inner.manifest().unwrap();
    let sources = &manifest.runs[&opts.run].meta.sources;
    let mut members: Vec<usize> = sources.iter().map(|s| s.files.len()).collect();
    members.sort();
    assert_eq!(members, [2, 3]);
}

#[test]
fn a_table_written_after_its_output_was_stored_is_appended_apart_and_said() {
    let f = fixture();
    let node = f.dir.join("node1");
    std::fs::create_dir(&node).unwrap();
    let tables = rocprof_fixture("modern");
    let (late, early) = tables.split_last().unwrap();
    for table in early {
        std::fs::copy(table, node.join(table.file_name().unwrap())).unwrap();
    }
    let lines = Lines::default();
    assert_eq!(f.run_once(&lines).stored, 1);
    assert_eq!(lines.take(), ["stored 4242_*.csv"]);
    // A restarted watch finds the last table: it knows the others as stored.
    std::fs::copy(late, node.join(late.file_name().unwrap())).unwrap();
    let s = f.run_once(&lines);
    assert_eq!((s.stored, s.resumed), (1, early.len()));
    let got = lines.take();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[0].starts_with("note ") && got[0].contains("joins a rocprofv3 output stored before it"),
        "{got:?}"
    );
    assert_eq!(
        got[1],
        format!("stored {}", late.file_name().unwrap().to_string_lossy())
    );
}
