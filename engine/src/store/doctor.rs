//! `gpuq doctor`: checks a store's manifests and data files against each other, and repairs
//! what can be repaired without losing committed data.
//!
//! What is checked:
//! - every manifest version parses, holds the version its name says, names only data file
//!   paths of its own runs, and the kept versions are contiguous;
//! - every file the newest readable version names exists under `_data/`, has the size and the
//!   row count (Parquet footer) the manifest records, and sequence numbers below
//!   `next_file_seq` (a reused one would overwrite a file); the Hive tree holds exactly
//!   the newest version's files;
//! - no symbolic link where the store keeps its directories and files;
//! - leftovers when no writer is committing: staged files of dead writers (live writers'
//!   staging directories are locked by them), temporary manifests, and files under `_data/`
//!   that no kept version names (orphans).
//!
//! What `--repair` does, holding the store's commit lock:
//! - a damaged manifest newer than the newest readable one is moved to `_damaged/`, once
//!   every file of that readable version has checked whole (so the store reads as that
//!   version); orphan data files are then moved to `_damaged/` as well, since they may be
//!   the damaged version's (nothing that might be committed data is deleted);
//! - leftovers of dead writers are removed, and the Hive tree is brought to the newest
//!   version, as the next writer would.
//!
//! Symbolic links, missing or resized files, and gaps in the versions are reported, not
//! repaired: they need a person.

use super::{is_real_dir, log, Store};
use crate::error::Error;
use crate::manifest::Manifest;
use crate::paths::StorePaths;
use crate::schema::TableKind;
use std::collections::{BTreeMap, HashSet};
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

/// Where repairs put what they take out of the store's reach, relative to its root.
pub const DAMAGED_DIR: &str = "_damaged";

/// One thing found wrong, and what `--repair` did about it (if anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub problem: String,
    pub repaired: Option<String>,
}

/// What the doctor found.
#[derive(Debug, Default)]
pub struct Report {
    /// Manifest versions on disk, oldest first.
    pub versions: Vec<u64>,
    /// The version readers read after the check (and repair): the newest readable one.
    pub readable: Option<u64>,
    /// Data files of that version that were checked.
    pub files_checked: usize,
    pub findings: Vec<Finding>,
    /// Set when a writer held the lock: leftovers were not looked for, nothing was repaired.
    pub writer_running: bool,
}

impl Report {
    /// Whether anything found is still wrong.
    pub fn damaged(&self) -> bool {
        self.findings.iter().any(|f| f.repaired.is_none())
    }

    fn found(&mut self, problem: String) {
        self.findings.push(Finding {
            problem,
            repaired: None,
        });
    }

    fn fixed(&mut self, problem: String, repaired: String) {
        self.findings.push(Finding {
            problem,
            repaired: Some(repaired),
        });
    }
}

/// Checks `store` and, with `repair`, repairs what it can (see the module documentation).
pub fn check(store: &Store, repair: bool) -> crate::Result<Report> {
    let paths = store.paths();
    let mut report = Report::default();
    // The writer lock, without waiting: a running writer's staged and placed files are not
    // leftovers, and repairs must not race it.
    let lock_path = paths.lock_file();
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(Error::io(&lock_path))?;
    report.writer_running = lock.try_lock().is_err();
    let repair = repair && !report.writer_running;

    find_symlinks(paths, &mut report);

    // Every manifest version on disk, and the state of each that its checkpoint or the
    // versions before it give.
    let mdir = paths.manifest_dir();
    let listing = log::Listing::read(&mdir)?;
    let versions = log::states(paths, &listing);
    let temporaries: Vec<PathBuf> = listing.temporaries.iter().map(|n| mdir.join(n)).collect();
    report.versions = listing.commits.iter().copied().collect();
    let commits = &listing.commits;
    if let (Some(first), Some(last)) = (commits.first(), commits.last()) {
        // A version an earlier repair moved aside is accounted for.
        let set_aside = |v: &u64| {
            let name = crate::paths::manifest_file_name(*v);
            let aside = paths.root().join(DAMAGED_DIR).join("_manifest").join(name);
            fs::symlink_metadata(aside).is_ok()
        };
        let missing: Vec<u64> = (*first..*last)
            .filter(|v| !commits.contains(v) && !set_aside(v))
            .collect();
        if !missing.is_empty() {
            report.found(format!(
                "manifest versions {missing:?} are missing between {first} and {last}"
            ));
        }
    }
    let newest_readable = versions
        .iter()
        .rev()
        .find_map(|(v, m)| m.as_ref().ok().map(|m| (*v, m.clone())));
    let readable = newest_readable.as_ref().map(|(v, _)| *v);
    report.readable = readable;

    // The newest readable version's files.
    let mut whole = true;
    if let Some((_, manifest)) = &newest_readable {
        whole = check_files(store, manifest, &mut report);
    }

    // Damaged manifests: aside once the version before them reads whole.
    let damaged: Vec<(u64, String)> = versions
        .iter()
        .filter_map(|(v, m)| m.as_ref().err().map(|e| (*v, e.clone())))
        .collect();
    let mut moved_manifest = false;
    for (version, error) in &damaged {
        let path = paths.manifest_file(*version);
        let newer_than_readable = readable.is_none_or(|r| *version > r);
        if !repair {
            report.found(error.clone());
        } else if newer_than_readable && !whole {
            report.found(format!(
                "{error}; not moved aside: version {} is not whole either",
                readable.unwrap_or_default()
            ));
        } else {
            match move_aside(paths, &path) {
                Ok(to) => {
                    moved_manifest = true;
                    let readers = match readable {
                        Some(r) if newer_than_readable => {
                            format!("; readers now read version {r}")
                        }
                        _ => String::new(),
                    };
                    report.fixed(
                        error.clone(),
                        format!("moved it to {}{readers}", to.display()),
                    );
                }
                Err(e) => report.found(format!("{error}; moving it aside failed: {e}")),
            }
        }
    }

    if report.writer_running {
        return Ok(report);
    }
    // Leftovers of dead writers.
    for tmp in temporaries {
        let problem = format!("{} is a temporary manifest of a dead writer", tmp.display());
        if repair && fs::remove_file(&tmp).is_ok() {
            report.fixed(problem, "removed it".into());
        } else {
            report.found(problem);
        }
    }
    let staging = paths.staging_dir();
    if is_real_dir(&staging) {
        // Live writers stage files without the store's lock: only dead writers' count.
        for leftover in super::staging::dead_writers_leftovers(&staging) {
            let problem = format!("{} was staged by a dead writer", leftover.display());
            if repair && super::staging::remove_leftover(&leftover) {
                report.fixed(problem, "removed it".into());
            } else {
                report.found(problem);
            }
        }
    }
    let named = named_by_any_version(&versions);
    for rel in files_under(&paths.data_dir()) {
        if named.contains(rel.as_str()) {
            continue;
        }
        let path = paths.data_file(&rel);
        let problem = format!(
            "{} is named by no manifest version (an orphan)",
            path.display()
        );
        if !repair {
            report.found(problem);
        } else if damaged.is_empty() && !moved_manifest {
            // A writer that died between placing its files and committing them.
            match fs::remove_file(&path) {
                Ok(()) => report.fixed(problem, "removed it".into()),
                Err(e) => report.found(format!("{problem}; removing it failed: {e}")),
            }
        } else {
            // It may be a file of the damaged version: keep it where no writer deletes it.
            match move_aside(paths, &path) {
                Ok(to) => report.fixed(
                    problem,
                    format!(
                        "moved it to {} (it may belong to a damaged version)",
                        to.display()
                    ),
                ),
                Err(e) => report.found(format!("{problem}; moving it aside failed: {e}")),
            }
        }
    }
    if let Some((_, manifest)) = &newest_readable {
        check_hive_tree(paths, manifest, repair, &mut report);
    }
    drop(lock);
    Ok(report)
}

/// Checks every file `manifest` names; returns whether all are whole.
fn check_files(store: &Store, manifest: &Manifest, report: &mut Report) -> bool {
    let mut whole = true;
    for (run, entry) in &manifest.runs {
        for f in &entry.files {
            report.files_checked += 1;
            let seq = f
                .path
                .rsplit_once("part-")
                .and_then(|(_, n)| n.strip_suffix(".parquet")?.parse::<u64>().ok());
            if seq.is_some_and(|s| s >= manifest.next_file_seq) {
                report.found(format!(
                    "run {run}: {} has a sequence number not below the manifest's next \
                     ({}): a later file could overwrite it",
                    f.path, manifest.next_file_seq
                ));
                whole = false;
            }
            let path = match store.checked_file_path(manifest, f) {
                Ok(p) => p,
                Err(e) => {
                    report.found(format!("run {run}: {e}"));
                    whole = false;
                    continue;
                }
            };
            match footer_rows(&path) {
                Ok(rows) if rows == f.rows => {}
                Ok(rows) => {
                    report.found(format!(
                        "run {run}: {} holds {rows} rows where the manifest records {}",
                        path.display(),
                        f.rows
                    ));
                    whole = false;
                }
                Err(e) => {
                    report.found(format!(
                        "run {run}: {} is not a readable Parquet file: {e}",
                        path.display()
                    ));
                    whole = false;
                }
            }
        }
    }
    whole
}

/// The row count a Parquet file's footer records.
fn footer_rows(path: &Path) -> Result<u64, String> {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let file = fs::File::open(path).map_err(|e| e.to_string())?;
    let reader = SerializedFileReader::new(file).map_err(|e| e.to_string())?;
    u64::try_from(reader.metadata().file_metadata().num_rows()).map_err(|e| e.to_string())
}

/// Every path some version on disk names (its files and the files it keeps for readers).
fn named_by_any_version(versions: &BTreeMap<u64, Result<Manifest, String>>) -> HashSet<String> {
    let mut named = HashSet::new();
    for m in versions.values().flatten() {
        for e in m.runs.values() {
            named.extend(e.files.iter().map(|f| f.path.clone()));
        }
        named.extend(m.tombstones.iter().map(|t| t.path.clone()));
    }
    named
}

/// Relative paths (`<table>/run=<id>/<file>`) of the files under `base`, without following
/// symbolic links.
fn files_under(base: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for table in TableKind::ALL {
        let table_dir = base.join(table.name());
        if !is_real_dir(&table_dir) {
            continue;
        }
        for run_dir in fs::read_dir(&table_dir).into_iter().flatten().flatten() {
            if !run_dir.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for f in fs::read_dir(run_dir.path()).into_iter().flatten().flatten() {
                out.push(format!(
                    "{}/{}/{}",
                    table.name(),
                    run_dir.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

/// Reports the symbolic links where the store keeps its own directories and files.
fn find_symlinks(paths: &StorePaths, report: &mut Report) {
    let is_link = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    let mut dirs = vec![paths.manifest_dir(), paths.staging_dir(), paths.data_dir()];
    for table in TableKind::ALL {
        dirs.push(paths.table_dir(table));
        dirs.push(paths.data_dir().join(table.name()));
    }
    let mut links: Vec<PathBuf> = dirs.iter().filter(|d| is_link(d)).cloned().collect();
    for base in [paths.root().to_path_buf(), paths.data_dir()] {
        for table in TableKind::ALL {
            let table_dir = base.join(table.name());
            if !is_real_dir(&table_dir) {
                continue;
            }
            for run_dir in fs::read_dir(&table_dir).into_iter().flatten().flatten() {
                if is_link(&run_dir.path()) {
                    links.push(run_dir.path());
                } else if run_dir.file_type().is_ok_and(|t| t.is_dir()) {
                    let files = fs::read_dir(run_dir.path()).into_iter().flatten().flatten();
                    links.extend(files.map(|f| f.path()).filter(|p| is_link(p)));
                }
            }
        }
    }
    for link in links {
        report.found(format!(
            "{} is a symbolic link inside the store (gpuq neither follows nor removes it; \
             remove it by hand)",
            link.display()
        ));
    }
}

/// Checks that the Hive tree holds exactly the files of `manifest` (a store written before
/// `_data/` existed has no separate tree), bringing it there with `repair`.
fn check_hive_tree(paths: &StorePaths, manifest: &Manifest, repair: bool, report: &mut Report) {
    if !manifest.data_area {
        return;
    }
    let live: HashSet<&str> = manifest
        .runs
        .values()
        .flat_map(|e| e.files.iter().map(|f| f.path.as_str()))
        .collect();
    let in_tree = files_under(paths.root());
    for rel in in_tree.iter().filter(|r| !live.contains(r.as_str())) {
        let path = paths.absolute(rel);
        let problem = format!(
            "{} is in the Hive tree but not in version {}",
            path.display(),
            manifest.version
        );
        // The tree holds links to `_data/`; removing one removes no data.
        if repair && fs::remove_file(&path).is_ok() {
            report.fixed(problem, "unlinked it".into());
        } else {
            report.found(problem);
        }
    }
    let in_tree: HashSet<&str> = in_tree.iter().map(String::as_str).collect();
    let mut missing: Vec<&str> = live.into_iter().filter(|r| !in_tree.contains(r)).collect();
    missing.sort_unstable();
    for rel in missing {
        let link = paths.absolute(rel);
        let problem = format!(
            "{} of version {} is missing from the Hive tree",
            link.display(),
            manifest.version
        );
        let linked = repair
            && super::create_real_dir(paths.root(), link.parent().expect("a run directory"))
                .is_ok()
            && fs::hard_link(paths.data_file(rel), &link).is_ok();
        if linked {
            report.fixed(problem, "linked it".into());
        } else {
            report.found(problem);
        }
    }
}

/// Moves `path` (inside the store) to the same relative place under `_damaged/`, never over
/// an existing file; returns where it went.
fn move_aside(paths: &StorePaths, path: &Path) -> std::io::Result<PathBuf> {
    let rel = path
        .strip_prefix(paths.root())
        .map_err(|_| std::io::Error::other("not inside the store"))?;
    let mut to = paths.root().join(DAMAGED_DIR).join(rel);
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut n = 1;
    while fs::symlink_metadata(&to).is_ok() {
        to = paths
            .root()
            .join(DAMAGED_DIR)
            .join(format!("{}.{n}", rel.display()));
        n += 1;
    }
    fs::rename(path, &to)?;
    Ok(to)
}
