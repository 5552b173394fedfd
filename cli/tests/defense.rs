//! The store defends itself, through the real `gpuq` binary: SQL that writes or reads files
//! only when allowed and never inside the store, a damaged manifest named and repaired by
//! `gpuq doctor`, no cleanup through symbolic links, crafted manifest sizes refused, and no
//! temporary manifest left by a failed write.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{gpuq, ok, shell_output, stderr, stdout};

/// A store holding run `r`, from a small generated trace.
fn store_with_a_run(dir: &Path) -> PathBuf {
    let trace = dir.join("t.json");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args(["generate", trace.to_str().unwrap(), "--bytes", "200000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let store = dir.join("store");
    ok(
        &store,
        &["ingest", "--quiet", "--run", "r", trace.to_str().unwrap()],
    );
    store
}

/// The newest manifest file of `store`.
fn newest_manifest(store: &Path) -> PathBuf {
    let mut names: Vec<PathBuf> = std::fs::read_dir(store.join("_manifest"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter(|p| !p.to_string_lossy().ends_with(".checkpoint.json"))
        .collect();
    names.sort();
    names.remove(0)
}

/// Writes the next manifest version: the newest commit (a log entry that put run `r`) again
/// as the next version, its run `r` changed by `change`.
fn craft_next_manifest(store: &Path, change: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let newest = newest_manifest(store);
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&newest).unwrap()).unwrap();
    let version = m["version"].as_u64().unwrap() + 1;
    m["version"] = version.into();
    assert!(
        m["put"]["r"].is_object(),
        "the newest commit puts run r: {m}"
    );
    change(&mut m["put"]["r"]);
    let path = store
        .join("_manifest")
        .join(format!("{:020}.json", u64::MAX - version));
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    path
}

#[test]
fn sql_writes_and_reads_files_only_when_allowed_and_never_inside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_a_run(dir.path());
    let out = dir.path().join("out.csv");
    let copy = format!("COPY (SELECT run FROM runs) TO '{}'", out.display());

    let o = gpuq(&store, &["query", &copy]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--allow-write"), "{}", stderr(&o));
    assert!(!out.exists());
    ok(&store, &["query", "--allow-write", &copy]);
    assert!(std::fs::read_to_string(&out).unwrap().contains('r'));

    // Inside the store, even when allowed, by any spelling of the path.
    let manifest = newest_manifest(&store);
    let before = std::fs::read(&manifest).unwrap();
    let inside = [
        store.join("_manifest/evil.json"),
        dir.path().join("store/../store/_data/x.csv"),
        manifest.clone(),
    ];
    for target in inside {
        let sql = format!(
            "COPY (SELECT 1 AS x) TO '{}' STORED AS CSV",
            target.display()
        );
        let o = gpuq(&store, &["query", "--allow-write", &sql]);
        assert!(!o.status.success(), "{sql}");
        assert!(stderr(&o).contains("inside the store"), "{}", stderr(&o));
    }
    assert!(!store.join("_manifest/evil.json").exists());
    assert_eq!(std::fs::read(&manifest).unwrap(), before);

    let create = format!(
        "CREATE EXTERNAL TABLE o STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true'); \
         SELECT count(*) AS n FROM o",
        out.display()
    );
    let o = gpuq(&store, &["query", &create]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--allow-files"), "{}", stderr(&o));
    let text = ok(
        &store,
        &["query", "--allow-files", "--format", "csv", &create],
    );
    assert!(text.contains("n\n1"), "{text}");
}

#[test]
fn the_shell_turns_file_access_on_with_set() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = dir.path().join("shell.csv");
    let copy = format!("COPY (SELECT 1 AS x) TO '{}' STORED AS CSV;", out.display());
    let shell = |script: &str| shell_output(&store, &[], script);
    let o = shell(&format!("{copy}\n"));
    assert!(stderr(&o).contains("allow_write on"), "{}", stderr(&o));
    assert!(!out.exists());
    let o = shell(&format!("\\set allow_write on\n{copy}\n"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.exists());
}

#[test]
fn a_damaged_newest_manifest_is_named_and_doctor_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_a_run(dir.path());
    let newest = newest_manifest(&store);
    let damaged = craft_next_manifest(&store, |_| {});
    std::fs::write(&damaged, b"{not json").unwrap();

    for args in [&["runs"][..], &["query", "SELECT count(*) FROM kernels"]] {
        let o = gpuq(&store, args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(
            e.contains("damaged") && e.contains(&*damaged.to_string_lossy()),
            "{e}"
        );
    }
    let o = gpuq(&store, &["doctor"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("damaged:"), "{}", stdout(&o));
    assert_eq!(gpuq(&store, &["doctor", "--bogus"]).status.code(), Some(2));

    let o = gpuq(&store, &["doctor", "--repair"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("repaired:"), "{}", stdout(&o));
    assert!(!damaged.exists() && newest.exists());
    assert!(ok(&store, &["runs"]).contains('r'));
    // Writers go on from the version before the damaged one.
    ok(&store, &["runs", "tag", "r", "k=v"]);
    let o = gpuq(&store, &["doctor"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn an_ingest_never_deletes_through_a_symlink_out_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_a_run(dir.path());
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious.txt"), b"keep me").unwrap();
    std::os::unix::fs::symlink(&outside, store.join("events/run=zzz")).unwrap();
    ok(&store, &["runs", "tag", "r", "k=v"]);
    let trace = dir.path().join("t.json");
    ok(
        &store,
        &["ingest", "--quiet", "--run", "r2", trace.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(outside.join("precious.txt")).unwrap(),
        b"keep me"
    );
    let o = gpuq(&store, &["doctor"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("symbolic link"), "{}", stdout(&o));
}

#[test]
fn a_crafted_part_size_or_path_is_refused_before_anything_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_a_run(dir.path());
    craft_next_manifest(&store, |m| {
        m["files"][0]["size"] = u64::MAX.into();
    });
    let o = gpuq(&store, &["query", "SELECT count(*) FROM events"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!("where the manifest records {}", u64::MAX)),
        "{}",
        stderr(&o)
    );
    craft_next_manifest(&store, |m| {
        m["files"][0]["path"] = "../../../../etc/passwd".into();
    });
    let o = gpuq(&store, &["query", "SELECT count(*) FROM events"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("etc/passwd"), "{}", stderr(&o));
}

#[test]
fn a_failed_manifest_write_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_a_run(dir.path());
    // Files may grow to 512 bytes: the manifest's write fails as on a full disk (EFBIG, with
    // SIGXFSZ ignored).
    let o = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1; exec \"$0\" --store \"$1\" runs tag r k=v")
        .arg(env!("CARGO_BIN_EXE_gpuq"))
        .arg(&store)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stderr(&o));
    let left: Vec<String> = std::fs::read_dir(store.join("_manifest"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!ok(&store, &["runs", "--format", "csv"]).contains("k=v"));
}
