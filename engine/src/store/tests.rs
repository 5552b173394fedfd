use super::*;
use crate::schema::TableKind;
use datafusion::arrow::array::{Float64Array, Int32Array, Int64Array, StringDictionaryBuilder};
use datafusion::arrow::datatypes::Int32Type;
use std::sync::Arc;

fn counters(n: usize, ts0: i64) -> RecordBatch {
    let mut names = StringDictionaryBuilder::<Int32Type>::new();
    for _ in 0..n {
        names.append_value("[memory] Total Allocated");
    }
    RecordBatch::try_new(
        TableKind::Counters.file_schema(),
        vec![
            Arc::new(Int32Array::from(vec![Some(0); n])),
            Arc::new(Int32Array::from(vec![Some(0); n])),
            Arc::new(Int64Array::from(vec![Some(1); n])),
            Arc::new(names.finish()),
            Arc::new(Int64Array::from_iter_values(
                (0..n as i64).rev().map(|i| ts0 + i),
            )),
            Arc::new(Float64Array::from(vec![1.5; n])),
        ],
    )
    .unwrap()
}

fn run(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

pub(super) fn meta(hash: &str) -> RunMeta {
    RunMeta {
        format: "test".into(),
        sources: vec![crate::manifest::SourceFile {
            path: "x".into(),
            hash: hash.into(),
            bytes: 1,
            rank: None,
            format: "test".into(),
            files: Vec::new(),
        }],
        events: 10,
        ..Default::default()
    }
}

fn data_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for table in TableKind::ALL {
        let dir = root.join(table.name());
        let Ok(runs) = fs::read_dir(dir) else {
            continue;
        };
        for r in runs.flatten() {
            for f in fs::read_dir(r.path()).unwrap().flatten() {
                out.push(format!(
                    "{}/{}/{}",
                    table.name(),
                    r.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_run_is_visible_only_after_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    let staged = w
        .write_part(TableKind::Counters, vec![counters(100, 1000)])
        .unwrap();
    assert_eq!(staged.rows, 100);
    assert_eq!(staged.stats["ts"], Some((1000, 1099)));
    assert!(
        store.manifest().unwrap().runs.is_empty(),
        "staged data must not be visible"
    );
    let v = w
        .put_run(&run("r1"), meta("h1"), vec![staged], PutMode::Create)
        .unwrap();
    assert_eq!(v, 1);
    let m = store.manifest().unwrap();
    assert_eq!(m.version, 1);
    let files = &m.runs[&run("r1")].files;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].path, "counters/run=r1/part-0000000000.parquet");
    assert!(dir.path().join(&files[0].path).exists());
    assert_eq!(m.run_with_source_hash("h1"), Some(&run("r1")));
}

#[test]
fn an_abandoned_writer_leaves_the_store_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    {
        let mut w = store.writer().unwrap();
        let s = w
            .write_part(TableKind::Counters, vec![counters(10, 0)])
            .unwrap();
        w.put_run(&run("kept"), meta("a"), vec![s], PutMode::Create)
            .unwrap();
    }
    let before = data_files(dir.path());
    {
        let w = store.writer().unwrap();
        w.write_part(TableKind::Counters, vec![counters(10, 0)])
            .unwrap();
        // dropped without commit, like a killed process
    }
    // A data file moved into place but never committed (writer died between rename and commit).
    let orphan = dir
        .path()
        .join("counters/run=ghost/part-0000000099.parquet");
    fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    fs::write(&orphan, b"partial").unwrap();
    assert_eq!(store.manifest().unwrap().runs.len(), 1);
    // The next writer removes the dead writer's staged files.
    drop(store.writer().unwrap());
    assert_eq!(
        fs::read_dir(dir.path().join("_staging")).unwrap().count(),
        0
    );
    // Files placed but never committed: the full sweep (every FULL_SWEEP_INTERVAL versions,
    // and `gpuq doctor --repair`) removes them; no commit in between reads them.
    let w = store.writer().unwrap();
    w.collect_garbage().unwrap();
    drop(w);
    assert_eq!(data_files(dir.path()), before);
    assert!(!dir.path().join("counters/run=ghost").exists());
}

#[test]
fn replace_remove_and_tag() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    let s = w
        .write_part(TableKind::Counters, vec![counters(10, 0)])
        .unwrap();
    w.put_run(&run("r"), meta("a"), vec![s], PutMode::Create)
        .unwrap();
    let s = w
        .write_part(TableKind::Counters, vec![counters(5, 0)])
        .unwrap();
    assert!(w
        .put_run(&run("r"), meta("b"), vec![s.clone()], PutMode::Create)
        .is_err());
    w.put_run(&run("r"), meta("b"), vec![s], PutMode::Replace)
        .unwrap();
    let m = store.manifest().unwrap();
    let e = &m.runs[&run("r")];
    assert_eq!(e.files.len(), 1);
    assert_eq!(e.files[0].rows, 5);
    assert_eq!(e.meta.sources[0].hash, "b");
    // The replaced file stays for readers still on the old version, outside the Hive tree.
    assert_eq!(m.tombstones.len(), 1);
    assert!(store.paths().data_file(&m.tombstones[0].path).exists());
    assert!(!store.paths().absolute(&m.tombstones[0].path).exists());

    let s = w
        .write_part(TableKind::Counters, vec![counters(7, 50)])
        .unwrap();
    w.put_run(&run("r"), meta("c"), vec![s], PutMode::Append)
        .unwrap();
    let m = store.manifest().unwrap();
    assert_eq!(m.runs[&run("r")].files.len(), 2);
    assert_eq!(m.runs[&run("r")].meta.events, 20);

    w.set_tags(&run("r"), &[("branch".into(), "main".into())])
        .unwrap();
    assert_eq!(
        store.manifest().unwrap().runs[&run("r")].meta.tags["branch"],
        "main"
    );
    w.set_tags(&run("r"), &[("branch".into(), String::new())])
        .unwrap();
    assert!(store.manifest().unwrap().runs[&run("r")]
        .meta
        .tags
        .is_empty());

    w.remove_run(&run("r")).unwrap();
    assert!(store.manifest().unwrap().runs.is_empty());
    assert!(matches!(w.remove_run(&run("r")), Err(Error::UnknownRun(_))));
    assert!(matches!(
        w.set_tags(&run("nope"), &[]),
        Err(Error::UnknownRun(_))
    ));
}

/// Writers stage without the store's lock and commit against the newest version: a writer
/// opened before another's commits neither waits for it nor loses what it committed.
#[test]
fn writers_stage_at_once_and_each_commit_builds_on_the_newest_version() {
    let dir = tempfile::tempdir().unwrap();
    // Not waiting for a lock at all: before, the second writer could not even open.
    let store = Store::open(dir.path())
        .unwrap()
        .with_lock_timeout(Some(std::time::Duration::ZERO));
    let mut w = store.writer().unwrap();
    put(&mut w, "kept", &[10], PutMode::Create);
    // A long-lived writer (a watch) stages, and keeps its writer open.
    let mut watch = store.writer().unwrap();
    let first = watch
        .write_part(TableKind::Counters, vec![counters(7, 0)])
        .unwrap();
    // Meanwhile other writers open, commit and close; the watch's staged file survives their
    // cleanup.
    let mut other = store.writer().unwrap();
    put(&mut other, "other", &[5], PutMode::Create);
    other
        .set_tags(&run("kept"), &[("k".into(), "v".into())])
        .unwrap();
    drop(other);
    assert!(
        first.staged_path.exists(),
        "another writer removed a live writer's file"
    );
    let v = watch
        .put_run(&run("live"), meta("c1"), vec![first], PutMode::Append)
        .unwrap();
    assert_eq!(v, 4);
    // The watch appends again after another writer appended to the same run: both appends
    // are in it, and so is everything the others committed.
    let mut other = store.writer().unwrap();
    put(&mut other, "live", &[3], PutMode::Append);
    drop(other);
    let second = watch
        .write_part(TableKind::Counters, vec![counters(2, 100)])
        .unwrap();
    watch
        .put_run(&run("live"), meta("c2"), vec![second], PutMode::Append)
        .unwrap();
    let m = store.manifest().unwrap();
    assert_eq!(m.version, 6);
    assert_eq!(
        m.runs.keys().map(|r| r.as_str()).collect::<Vec<_>>(),
        ["kept", "live", "other"]
    );
    assert_eq!(m.runs[&run("kept")].meta.tags["k"], "v");
    assert_eq!(counter_rows(&store, &run("live")).len(), 7 + 3 + 2);
    // Part numbers are never reused across the writers.
    let named = named_files(&m);
    let mut numbers: Vec<&str> = named.iter().map(|p| &p[p.rfind('/').unwrap()..]).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!((named.len(), numbers.len()), (5, 5), "{named:?}");
    assert_eq!(data_files(dir.path()), named);
    // A run created meanwhile by another writer is still a conflict for `Create`.
    let mut late = store.writer().unwrap();
    let s = late
        .write_part(TableKind::Counters, vec![counters(1, 0)])
        .unwrap();
    assert!(matches!(
        late.put_run(&run("other"), meta("x"), vec![s], PutMode::Create),
        Err(Error::RunExists(_))
    ));
    drop((w, watch, late));
    assert_eq!(
        fs::read_dir(dir.path().join("_staging")).unwrap().count(),
        0
    );
}

/// A commit waits for the lock only while another writer commits; the lock is not held
/// between commits.
#[test]
fn the_store_lock_is_held_only_while_committing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[1], PutMode::Create);
    let lock = fs::OpenOptions::new()
        .write(true)
        .open(store.paths().lock_file())
        .unwrap();
    assert!(lock.try_lock().is_ok(), "an open writer holds the lock");
    // While someone holds it, commits give up after the timeout and change nothing.
    let mut blocked = Store::open(dir.path())
        .unwrap()
        .with_lock_timeout(Some(std::time::Duration::from_millis(100)))
        .writer()
        .unwrap();
    assert!(matches!(
        blocked.set_tags(&run("a"), &[("k".into(), "v".into())]),
        Err(Error::LockTimeout { .. })
    ));
    drop(lock);
    blocked
        .set_tags(&run("a"), &[("k".into(), "v".into())])
        .unwrap();
    assert_eq!(store.manifest().unwrap().version, 2);
}

/// A compaction that merged parts another writer has since replaced commits nothing.
#[test]
fn a_compaction_overtaken_by_a_replace_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "r", &[10, 20, 30], PutMode::Create);
    let mut compactor = store.writer().unwrap();
    let mut other = store.writer().unwrap();
    // The compactor has read version 1 and merged its parts when the replace lands.
    put(&mut other, "r", &[4], PutMode::Replace);
    let entry = compactor.manifest().runs[&run("r")].clone();
    assert_eq!(entry.files.len(), 3);
    let staged = compactor
        .write_part(TableKind::Counters, vec![counters(60, 0)])
        .unwrap();
    let merged: HashSet<String> = entry.files.iter().map(|f| f.path.clone()).collect();
    assert!(!compactor
        .commit_merged(&run("r"), &merged, vec![staged.clone()])
        .unwrap());
    assert!(
        !staged.staged_path.exists(),
        "a stale merge's file is dropped"
    );
    assert_eq!(counter_rows(&store, &run("r")).len(), 4);
    // compact_run itself reads the newest version: nothing to merge in one part.
    assert_eq!(compactor.compact_run(&run("r")).unwrap(), 0);
    assert_eq!(store.manifest().unwrap().version, 2);
}

/// A store with run `r` in version 1 and a damaged version 2 (`{not json`).
fn store_with_damaged_newest_manifest(dir: &Path) -> Store {
    let store = Store::open(dir).unwrap();
    let mut w = store.writer().unwrap();
    let s = w
        .write_part(TableKind::Counters, vec![counters(1, 0)])
        .unwrap();
    w.put_run(&run("r"), meta("a"), vec![s], PutMode::Create)
        .unwrap();
    drop(w);
    fs::write(store.paths().manifest_file(2), b"{not json").unwrap();
    store
}

#[test]
fn a_damaged_newest_manifest_is_an_error_naming_it_for_readers_and_writers() {
    let dir = tempfile::tempdir().unwrap();
    store_with_damaged_newest_manifest(dir.path());
    let fresh = Store::open(dir.path()).unwrap();
    let damaged = fresh.paths().manifest_file(2);
    for e in [fresh.manifest().unwrap_err(), fresh.writer().unwrap_err()] {
        match &e {
            Error::CorruptManifest { path, .. } => assert_eq!(path, &damaged),
            other => panic!("expected a corrupt manifest error, got {other}"),
        }
        let message = e.to_string();
        assert!(message.contains("the store is damaged"), "{message}");
        assert!(message.contains("gpuq doctor"), "{message}");
    }
}

#[test]
fn doctor_moves_a_damaged_newest_manifest_aside_and_writers_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_damaged_newest_manifest(dir.path());
    // A file the damaged version may have named: it must survive the repair.
    let orphan = store
        .paths()
        .data_file("counters/run=r2/part-0000000007.parquet");
    fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    fs::write(&orphan, b"rows of version 2").unwrap();

    let report = doctor::check(&store, false).unwrap();
    assert!(report.damaged());
    assert_eq!(report.readable, Some(1));
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.problem.contains(&manifest_file_name(2))),
        "{:?}",
        report.findings
    );
    assert!(store.manifest().is_err(), "a check repairs nothing");

    let report = doctor::check(&store, true).unwrap();
    assert!(!report.damaged(), "{:?}", report.findings);
    let aside = dir
        .path()
        .join(doctor::DAMAGED_DIR)
        .join("_manifest")
        .join(manifest_file_name(2));
    assert_eq!(fs::read(&aside).unwrap(), b"{not json");
    let kept = dir
        .path()
        .join(doctor::DAMAGED_DIR)
        .join("_data/counters/run=r2/part-0000000007.parquet");
    assert_eq!(fs::read(&kept).unwrap(), b"rows of version 2");

    let fresh = Store::open(dir.path()).unwrap();
    assert_eq!(fresh.manifest().unwrap().version, 1);
    let mut w = fresh.writer().unwrap();
    w.set_tags(&run("r"), &[("k".into(), "v".into())]).unwrap();
    drop(w);
    assert_eq!(fresh.manifest().unwrap().version, 2);
    let report = doctor::check(&fresh, false).unwrap();
    assert!(!report.damaged(), "{:?}", report.findings);
}

#[test]
fn doctor_finds_missing_and_resized_files_and_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    put(&mut w, "b", &[10], PutMode::Create);
    drop(w);
    assert!(!doctor::check(&store, false).unwrap().damaged());
    let m = store.manifest().unwrap();
    let a = store.file_path(&m, &m.runs[&run("a")].files[0].path);
    let b = store.file_path(&m, &m.runs[&run("b")].files[0].path);
    fs::remove_file(&a).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&b)
        .unwrap()
        .write_all(b"x")
        .unwrap();
    fs::write(store.paths().manifest_dir().join(".tmp-1-9"), b"{").unwrap();
    let report = doctor::check(&store, true).unwrap();
    let problems: Vec<&str> = report.findings.iter().map(|f| f.problem.as_str()).collect();
    assert!(report.damaged());
    let unrepaired: Vec<&str> = report
        .findings
        .iter()
        .filter(|f| f.repaired.is_none())
        .map(|f| f.problem.as_str())
        .collect();
    assert!(
        unrepaired.iter().any(|p| p.contains(&*a.to_string_lossy())),
        "{problems:?}"
    );
    assert!(
        unrepaired
            .iter()
            .any(|p| p.contains(&*b.to_string_lossy()) && p.contains("bytes")),
        "{problems:?}"
    );
    assert!(!store.paths().manifest_dir().join(".tmp-1-9").exists());
}

#[test]
fn cleanup_never_follows_a_symlink_out_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("precious.txt"), b"keep me").unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    drop(w);
    // A run directory of the Hive tree, and one of the data area, that lead outside.
    let hive_link = store.root().join("events/run=zzz");
    fs::create_dir_all(hive_link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(outside.path(), &hive_link).unwrap();
    let data_link = store.paths().data_file("counters/run=b");
    std::os::unix::fs::symlink(outside.path(), &data_link).unwrap();

    let mut w = store.writer().unwrap(); // collects garbage
    put(&mut w, "c", &[10], PutMode::Create); // commits, collects again
    let s = w
        .write_part(TableKind::Counters, vec![counters(5, 0)])
        .unwrap();
    // Placing run b's file would write through the link: refused.
    match w.put_run(&run("b"), meta("b"), vec![s], PutMode::Create) {
        Err(Error::Symlink { path }) => assert_eq!(path, data_link),
        other => panic!("expected a symlink error, got {other:?}"),
    }
    drop(w);
    assert_eq!(
        fs::read(outside.path().join("precious.txt")).unwrap(),
        b"keep me"
    );
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
    assert!(fs::symlink_metadata(&hive_link)
        .unwrap()
        .file_type()
        .is_symlink());

    let report = doctor::check(&store, true).unwrap();
    assert!(report.damaged());
    assert!(report
        .findings
        .iter()
        .any(|f| f.problem.contains("run=zzz") && f.problem.contains("symbolic link")));
}

#[test]
fn a_staging_area_that_is_a_symlink_stops_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("precious.txt"), b"keep me").unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    std::os::unix::fs::symlink(outside.path(), store.paths().staging_dir()).unwrap();
    assert!(matches!(store.writer(), Err(Error::Symlink { .. })));
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 1);
}

/// Writes `m` as the next version by hand (a crafted or damaged manifest).
fn write_manifest(store: &Store, m: &Manifest) {
    fs::write(
        store.paths().manifest_file(m.version),
        serde_json::to_vec(m).unwrap(),
    )
    .unwrap();
}

#[test]
fn manifest_entries_that_escape_the_store_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    drop(w);
    let good = (*store.manifest().unwrap()).clone();
    for (i, bad_path) in [
        "/etc/passwd",
        "../../etc/passwd",
        "counters/run=a/../../../etc/passwd",
        "counters/run=other/part-0000000000.parquet",
    ]
    .into_iter()
    .enumerate()
    {
        let mut m = good.clone();
        m.version = good.version + 1 + i as u64;
        Arc::make_mut(m.runs.get_mut(&run("a")).unwrap()).files[0].path = bad_path.to_string();
        write_manifest(&store, &m);
        let e = Store::open(store.root()).unwrap().manifest().unwrap_err();
        assert!(
            matches!(&e, Error::CorruptManifest { reason, .. } if reason.contains(bad_path)),
            "{bad_path}: {e}"
        );
    }
}

#[test]
fn a_file_reached_through_a_symlink_or_of_another_size_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    drop(w);
    let mut m = (*store.manifest().unwrap()).clone();
    let path = store
        .checked_file_path(&m, &m.runs[&run("a")].files[0])
        .unwrap();
    Arc::make_mut(m.runs.get_mut(&run("a")).unwrap()).files[0].size = u64::MAX;
    match store.checked_file_path(&m, &m.runs[&run("a")].files[0]) {
        Err(Error::DamagedFile { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains(&u64::MAX.to_string()), "{reason}");
        }
        other => panic!("expected a damaged file, got {other:?}"),
    }
    // The run directory replaced by a link to a copy elsewhere.
    let m = store.manifest().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let run_dir = path.parent().unwrap();
    for f in fs::read_dir(run_dir).unwrap().flatten() {
        fs::copy(f.path(), elsewhere.path().join(f.file_name())).unwrap();
    }
    fs::remove_dir_all(run_dir).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), run_dir).unwrap();
    match store.checked_file_path(&m, &m.runs[&run("a")].files[0]) {
        Err(Error::Symlink { path }) => assert_eq!(path, run_dir),
        other => panic!("expected a symlink error, got {other:?}"),
    }
}

#[test]
fn old_manifest_versions_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    let s = w
        .write_part(TableKind::Counters, vec![counters(1, 0)])
        .unwrap();
    w.put_run(&run("r"), meta("a"), vec![s], PutMode::Create)
        .unwrap();
    for i in 0..30 {
        w.set_tags(&run("r"), &[("i".into(), i.to_string())])
            .unwrap();
    }
    let n = fs::read_dir(store.paths().manifest_dir()).unwrap().count();
    assert!(n <= 20, "{n} manifest files kept");
    assert_eq!(store.manifest().unwrap().version, 31);
}

/// Every row of `run`'s counters, read back from the files of the current version.
fn counter_rows(store: &Store, run: &RunId) -> Vec<(i64, i64)> {
    counter_rows_of(store, &store.manifest().unwrap(), run)
}

/// Every row of `run`'s counters in version `m`, read where a reader of `m` reads them.
fn counter_rows_of(store: &Store, m: &Manifest, run: &RunId) -> Vec<(i64, i64)> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let mut rows = Vec::new();
    for f in &m.runs[run].files {
        for b in part::read_parquet(f.table, &store.file_path(m, &f.path)).unwrap() {
            let ts = b.column_by_name("ts").unwrap().as_primitive::<Int64Type>();
            let pid = b.column_by_name("pid").unwrap().as_primitive::<Int64Type>();
            rows.extend((0..b.num_rows()).map(|i| (ts.value(i), pid.value(i))));
        }
    }
    rows.sort_unstable();
    rows
}

#[test]
fn many_small_appends_are_compacted_without_changing_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let r = run("steps");
    // One commit per "step": AUTO_COMPACT_PARTS appends stay as they are...
    for i in 0..AUTO_COMPACT_PARTS as i64 {
        let mut w = store.writer().unwrap();
        let staged = w
            .write_part(TableKind::Counters, vec![counters(50, 1000 * i)])
            .unwrap();
        w.put_run(&r, meta(&format!("h{i}")), vec![staged], PutMode::Append)
            .unwrap();
    }
    let before = counter_rows(&store, &r);
    assert_eq!(before.len(), 50 * AUTO_COMPACT_PARTS);
    assert_eq!(
        store.manifest().unwrap().runs[&r].files.len(),
        AUTO_COMPACT_PARTS
    );
    // ...one more and the run is merged into one sorted part, in a commit of its own.
    let reader_view = store.manifest().unwrap();
    let mut w = store.writer().unwrap();
    let staged = w
        .write_part(TableKind::Counters, vec![counters(50, 99_000)])
        .unwrap();
    let v = w
        .put_run(&r, meta("last"), vec![staged], PutMode::Append)
        .unwrap();
    drop(w);
    let m = store.manifest().unwrap();
    assert_eq!(v, m.version);
    assert_eq!(v, reader_view.version + 2, "append, then compaction");
    let files = &m.runs[&r].files;
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].rows, 50 * (AUTO_COMPACT_PARTS as u64 + 1));
    assert_eq!(files[0].stats["ts"], Some((0, 99_049)));
    let mut want = before;
    want.extend((0..50).map(|i| (99_000 + i, 1)));
    want.sort_unstable();
    assert_eq!(counter_rows(&store, &r), want);
    // The merged file is sorted by the table's key (ts ascending within rank/device/pid).
    let b =
        &part::read_parquet(files[0].table, &store.paths().absolute(&files[0].path)).unwrap()[0];
    let ts = b.column_by_name("ts").unwrap();
    let ts = ts.as_any().downcast_ref::<Int64Array>().unwrap();
    assert!(ts.values().windows(2).all(|w| w[0] <= w[1]));
    // A reader still on the old version can read all of its files (grace period), under
    // _data/; the Hive tree holds only the new version's.
    for f in &reader_view.runs[&r].files {
        assert!(
            store.file_path(&reader_view, &f.path).exists(),
            "{}",
            f.path
        );
        assert!(!store.paths().absolute(&f.path).exists(), "{}", f.path);
    }
    assert_eq!(m.runs[&r].meta.sources.len(), AUTO_COMPACT_PARTS + 1);
    // Nothing left to merge; an unknown run is an error.
    let mut w = store.writer().unwrap();
    assert_eq!(w.compact_run(&r).unwrap(), 0);
    assert!(matches!(
        w.compact_run(&run("nope")),
        Err(Error::UnknownRun(_))
    ));
}

#[test]
fn a_new_run_and_appends_of_large_parts_are_not_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let r = run("big");
    // A large trace arrives as many parts in its first commit: that layout is kept.
    let mut w = store.writer().unwrap();
    let staged = (0..AUTO_COMPACT_PARTS as i64 + 3)
        .map(|i| {
            w.write_part(TableKind::Counters, vec![counters(50, 1000 * i)])
                .unwrap()
        })
        .collect();
    let v = w
        .put_run(&r, meta("first"), staged, PutMode::Append)
        .unwrap();
    drop(w);
    assert_eq!(
        v,
        store.manifest().unwrap().version,
        "one commit, no compaction"
    );
    assert_eq!(
        store.manifest().unwrap().runs[&r].files.len(),
        AUTO_COMPACT_PARTS + 3
    );
    // Appending parts of at least TINY_PART_ROWS rows does not make the run fragmented.
    let other = run("other");
    for i in 0..AUTO_COMPACT_PARTS as i64 + 1 {
        let mut w = store.writer().unwrap();
        let staged = w
            .write_part(
                TableKind::Counters,
                vec![counters(TINY_PART_ROWS as usize, 1 << (20 + i))],
            )
            .unwrap();
        w.put_run(
            &other,
            meta(&format!("o{i}")),
            vec![staged],
            PutMode::Append,
        )
        .unwrap();
    }
    assert_eq!(
        store.manifest().unwrap().runs[&other].files.len(),
        AUTO_COMPACT_PARTS + 1
    );
}

/// The relative paths of every file the version names (what the Hive tree must hold).
fn named_files(m: &Manifest) -> Vec<String> {
    let mut out: Vec<String> = m
        .runs
        .values()
        .flat_map(|e| e.files.iter().map(|f| f.path.clone()))
        .collect();
    out.sort();
    out
}

fn put(w: &mut StoreWriter, name: &str, rows: &[usize], mode: PutMode) {
    let staged = rows
        .iter()
        .map(|&n| {
            w.write_part(TableKind::Counters, vec![counters(n, 0)])
                .unwrap()
        })
        .collect();
    w.put_run(&run(name), meta(name), staged, mode).unwrap();
}

#[test]
fn the_hive_tree_holds_exactly_the_current_version_while_older_readers_keep_reading() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "r", &[10, 20], PutMode::Create);
    put(&mut w, "other", &[5], PutMode::Create);
    let v1 = store.manifest().unwrap();
    assert_eq!(data_files(dir.path()), named_files(&v1));
    let rows_v1 = counter_rows_of(&store, &v1, &run("r"));
    assert_eq!(rows_v1.len(), 30);

    // Replace: the old files leave the Hive tree at once; a reader of v1 still reads them.
    put(&mut w, "r", &[7], PutMode::Replace);
    let v2 = store.manifest().unwrap();
    assert_eq!(data_files(dir.path()), named_files(&v2));
    assert_eq!(counter_rows_of(&store, &v1, &run("r")), rows_v1);
    assert_eq!(counter_rows(&store, &run("r")).len(), 7);

    // Appends, then compaction: the merged parts leave the tree too.
    for _ in 0..3 {
        put(&mut w, "r", &[3], PutMode::Append);
    }
    let v3 = store.manifest().unwrap();
    assert!(w.compact_run(&run("r")).unwrap() > 0);
    assert_eq!(
        data_files(dir.path()),
        named_files(&store.manifest().unwrap())
    );
    assert_eq!(
        counter_rows(&store, &run("r")),
        counter_rows_of(&store, &v3, &run("r"))
    );

    // Removal.
    w.remove_run(&run("r")).unwrap();
    let v4 = store.manifest().unwrap();
    assert_eq!(data_files(dir.path()), named_files(&v4));
    assert_eq!(counter_rows_of(&store, &v2, &run("r")).len(), 7);
    assert_eq!(counter_rows_of(&store, &v1, &run("r")), rows_v1);
}

#[test]
fn a_writer_that_died_after_its_commit_leaves_a_hive_tree_the_next_one_repairs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "r", &[10], PutMode::Create);
    let v1 = store.manifest().unwrap();
    put(&mut w, "r", &[4], PutMode::Replace);
    drop(w);
    let v2 = store.manifest().unwrap();
    // As if the writer died between the manifest and the Hive tree: the new file is not
    // linked yet and the dropped one still is.
    let new = &named_files(&v2)[0];
    let old = &named_files(&v1)[0];
    fs::remove_file(store.paths().absolute(new)).unwrap();
    fs::hard_link(store.paths().data_file(old), store.paths().absolute(old)).unwrap();
    assert_ne!(data_files(dir.path()), named_files(&v2));
    drop(store.writer().unwrap());
    assert_eq!(data_files(dir.path()), named_files(&v2));
    // The dropped file is still kept for readers of v1.
    assert_eq!(counter_rows_of(&store, &v1, &run("r")).len(), 10);
}

#[test]
fn a_store_from_before_the_data_area_is_read_as_it_was_and_moved_on_its_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "r", &[10, 6], PutMode::Create);
    drop(w);
    // The old layout: files only in the Hive tree, a manifest without `data_area`.
    fs::remove_dir_all(store.paths().data_dir()).unwrap();
    let mut old = (*store.manifest().unwrap()).clone();
    old.version += 1;
    old.data_area = false;
    let json = serde_json::to_value(&old).unwrap();
    let mut json = json.as_object().unwrap().clone();
    json.remove("data_area");
    fs::write(
        store.paths().manifest_file(old.version),
        serde_json::to_vec(&json).unwrap(),
    )
    .unwrap();
    let v_old = store.manifest().unwrap();
    assert!(!v_old.data_area);
    assert_eq!(counter_rows(&store, &run("r")).len(), 16);

    let mut w = store.writer().unwrap();
    put(&mut w, "s", &[3], PutMode::Create);
    let v_new = store.manifest().unwrap();
    assert!(v_new.data_area);
    assert_eq!(data_files(dir.path()), named_files(&v_new));
    assert_eq!(counter_rows(&store, &run("r")).len(), 16);
    w.remove_run(&run("r")).unwrap();
    assert_eq!(
        data_files(dir.path()),
        named_files(&store.manifest().unwrap())
    );
    assert_eq!(counter_rows_of(&store, &v_new, &run("r")).len(), 16);
}

#[test]
fn a_run_sharing_another_runs_files_survives_its_removal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10, 6], PutMode::Create);
    let files = store.manifest().unwrap().runs[&run("a")].files.clone();
    let staged = files.iter().map(|f| w.link_part(f).unwrap()).collect();
    w.put_run(&run("b"), meta("a"), staged, PutMode::Create)
        .unwrap();
    let m = store.manifest().unwrap();
    assert_eq!(data_files(dir.path()), named_files(&m));
    assert_eq!(
        counter_rows(&store, &run("b")),
        counter_rows(&store, &run("a"))
    );
    w.remove_run(&run("a")).unwrap();
    // Past the grace period the next writer deletes a's files; b's links keep the data.
    let mut m = (*store.manifest().unwrap()).clone();
    for t in &mut m.tombstones {
        t.removed_at_ms = 0;
    }
    w.base = Arc::new(m);
    w.collect_garbage().unwrap();
    assert_eq!(counter_rows(&store, &run("b")).len(), 16);
    assert!(!store.paths().data_file(&files[0].path).exists());
}

#[test]
fn a_replace_keeps_the_tags_unless_it_gives_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "r", &[1], PutMode::Create);
    w.set_tags(&run("r"), &[("commit".into(), "abc".into())])
        .unwrap();
    put(&mut w, "r", &[2], PutMode::Replace);
    let tags = store.manifest().unwrap().runs[&run("r")].meta.tags.clone();
    assert_eq!(tags.get("commit").map(String::as_str), Some("abc"));
    let s = w
        .write_part(TableKind::Counters, vec![counters(3, 0)])
        .unwrap();
    let mut m = meta("r");
    m.tags.insert("branch".into(), "dev".into());
    w.put_run(&run("r"), m, vec![s], PutMode::Replace).unwrap();
    let tags = store.manifest().unwrap().runs[&run("r")].meta.tags.clone();
    assert_eq!(tags.len(), 1);
    assert_eq!(tags["branch"], "dev");
}

/// Automatic compaction merges only the tiny parts: a part that has reached
/// [`TINY_PART_ROWS`] rows is not rewritten by later appends, so a run of thousands of appends
/// does not rewrite itself every few appends.
#[test]
fn automatic_compaction_leaves_parts_that_are_no_longer_tiny() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "live", &[TINY_PART_ROWS as usize], PutMode::Append);
    let grown = store.manifest().unwrap().runs[&run("live")].files[0].clone();
    for i in 0..=AUTO_COMPACT_PARTS {
        let staged = w
            .write_part(TableKind::Counters, vec![counters(10, 1 << (30 + i))])
            .unwrap();
        w.put_run(
            &run("live"),
            meta(&format!("c{i}")),
            vec![staged],
            PutMode::Append,
        )
        .unwrap();
    }
    let files = store.manifest().unwrap().runs[&run("live")].files.clone();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(
        files.iter().any(|f| f.path == grown.path),
        "the grown part was rewritten"
    );
    assert!(files
        .iter()
        .any(|f| f.rows == 10 * (AUTO_COMPACT_PARTS as u64 + 1)));
    // `gpuq compact` still merges every small part.
    assert_eq!(w.compact_run(&run("live")).unwrap(), 2);
    assert_eq!(store.manifest().unwrap().runs[&run("live")].files.len(), 1);
}

/// The state of `store`'s newest version as JSON, read by a fresh reader.
fn fresh_state(store: &Store) -> serde_json::Value {
    let fresh = Store::open(store.root()).unwrap();
    serde_json::to_value(&*fresh.manifest().unwrap()).unwrap()
}

#[test]
fn a_commit_writes_only_what_it_changed_and_every_reader_rebuilds_the_same_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    for name in ["a", "b", "c"] {
        put(&mut w, name, &[10], PutMode::Create);
    }
    // A reader that holds version 3 before the next commits.
    let held = Store::open(dir.path()).unwrap();
    assert_eq!(held.manifest().unwrap().version, 3);
    let v = w.set_tags(&run("b"), &[("k".into(), "v".into())]).unwrap();
    w.remove_run(&run("c")).unwrap();
    let entry = match log::read_commit(&store.paths().manifest_file(v)).unwrap() {
        log::Commit::Entry(e) => e,
        log::Commit::Whole(_) => panic!("a commit wrote the whole manifest"),
    };
    assert_eq!(entry.put.keys().collect::<Vec<_>>(), [&run("b")]);
    assert!(entry.removed.is_empty());
    assert_eq!(entry.put[&run("b")].meta.tags["k"], "v");
    // The reader applies the two entries since its version; a fresh one reads them all.
    let caught_up = serde_json::to_value(&*held.manifest().unwrap()).unwrap();
    assert_eq!(caught_up, fresh_state(&store));
    assert_eq!(caught_up, serde_json::to_value(w.manifest()).unwrap());
    assert_eq!(caught_up["version"], 5);
    assert_eq!(
        caught_up["runs"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn checkpoints_bound_what_a_reader_reads_and_what_the_store_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    let held = Store::open(dir.path()).unwrap();
    assert_eq!(held.manifest().unwrap().version, 1);
    let interval = log::CHECKPOINT_INTERVAL;
    for i in 0..(2 * interval + 3) {
        w.set_tags(&run("a"), &[("i".into(), i.to_string())])
            .unwrap();
    }
    let newest = 2 * interval + 4;
    let listing = log::Listing::read(&store.paths().manifest_dir()).unwrap();
    // The newest checkpoint, and the versions from it on; nothing older.
    assert_eq!(
        listing.checkpoints.iter().copied().collect::<Vec<_>>(),
        [2 * interval]
    );
    assert_eq!(
        listing.commits.iter().copied().collect::<Vec<_>>(),
        (2 * interval..=newest).collect::<Vec<_>>()
    );
    // The held reader's entries since version 1 are gone: it reads the checkpoint instead.
    let state = serde_json::to_value(&*held.manifest().unwrap()).unwrap();
    assert_eq!(state["version"], newest);
    assert_eq!(state, fresh_state(&store));
    assert_eq!(
        state["runs"]["a"]["meta"]["tags"]["i"],
        (2 * interval + 2).to_string()
    );
}

#[test]
fn a_store_of_whole_manifests_goes_on_as_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    drop(w);
    // Version 2 as stores before the log wrote every version: the whole manifest.
    let mut whole = (*store.manifest().unwrap()).clone();
    whole.version = 2;
    write_manifest(&store, &whole);
    let mut w = Store::open(dir.path()).unwrap().writer().unwrap();
    put(&mut w, "b", &[5], PutMode::Create);
    let v = w.set_tags(&run("a"), &[("k".into(), "v".into())]).unwrap();
    assert_eq!(v, 4);
    assert!(matches!(
        log::read_commit(&store.paths().manifest_file(4)).unwrap(),
        log::Commit::Entry(_)
    ));
    let state = fresh_state(&store);
    assert_eq!(state["version"], 4);
    assert_eq!(state["runs"]["a"]["meta"]["tags"]["k"], "v");
    assert_eq!(counter_rows(&store, &run("b")).len(), 5);
    // Pruning never deletes the whole manifest the log goes on from.
    assert!(store.paths().manifest_file(2).exists());
}

/// A store of runs a, b and c, one commit each (versions 1 to 3).
fn store_of_three_runs(dir: &Path) -> Store {
    let store = Store::open(dir).unwrap();
    let mut w = store.writer().unwrap();
    for name in ["a", "b", "c"] {
        put(&mut w, name, &[10], PutMode::Create);
    }
    store
}

#[test]
fn a_damaged_entry_makes_the_versions_after_it_unreadable_and_the_doctor_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_of_three_runs(dir.path());
    fs::write(store.paths().manifest_file(2), b"{\"log\":1,").unwrap();
    let e = Store::open(dir.path()).unwrap().manifest().unwrap_err();
    assert!(
        matches!(&e, Error::CorruptManifest { path, .. } if *path == store.paths().manifest_file(2)),
        "{e}"
    );
    let report = doctor::check(&store, false).unwrap();
    assert_eq!(report.readable, Some(1));
    let problems: Vec<&str> = report.findings.iter().map(|f| f.problem.as_str()).collect();
    assert!(
        problems.iter().any(
            |p| p.contains(&manifest_file_name(3)) && p.contains("version 2, which is damaged")
        ),
        "{problems:?}"
    );
}

#[test]
fn a_log_entry_whose_predecessor_is_missing_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_of_three_runs(dir.path());
    fs::remove_file(store.paths().manifest_file(2)).unwrap();
    let e = Store::open(dir.path()).unwrap().manifest().unwrap_err();
    match &e {
        Error::CorruptManifest { path, reason } => {
            assert_eq!(path, &store.paths().manifest_file(3));
            assert!(reason.contains(&manifest_file_name(2)), "{reason}");
        }
        other => panic!("expected a corrupt manifest error, got {other}"),
    }
}

#[test]
fn files_past_their_grace_period_are_never_deleted_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let mut w = store.writer().unwrap();
    put(&mut w, "a", &[10], PutMode::Create);
    put(&mut w, "b", &[10], PutMode::Create);
    w.remove_run(&run("a")).unwrap();
    drop(w);
    // Run a's data directory replaced by a link to a directory outside holding a file of the
    // same name; then its file's grace period ends (a version that says it ended long ago).
    let mut m = (*store.manifest().unwrap()).clone();
    let dropped = m.tombstones[0].path.clone();
    let data_dir = store.paths().data_file(&dropped);
    let data_dir = data_dir.parent().unwrap();
    fs::remove_dir_all(data_dir).unwrap();
    let precious = outside
        .path()
        .join(Path::new(&dropped).file_name().unwrap());
    fs::write(&precious, b"keep me").unwrap();
    std::os::unix::fs::symlink(outside.path(), data_dir).unwrap();
    m.version += 1;
    m.tombstones[0].removed_at_ms = 0;
    write_manifest(&store, &m);

    let mut w = Store::open(store.root()).unwrap().writer().unwrap();
    w.set_tags(&run("b"), &[("k".into(), "v".into())]).unwrap();
    drop(w);
    let state = fresh_state(&store);
    assert_eq!(state["tombstones"].as_array().unwrap().len(), 0);
    assert_eq!(fs::read(&precious).unwrap(), b"keep me");
}
