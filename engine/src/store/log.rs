//! The manifest log: how the store's versions are kept on disk.
//!
//! A commit writes one small file, `_manifest/<inverted version>.json`: a [`LogEntry`] with
//! what it changed (the runs it added or changed, whole; the runs it removed; the files kept
//! for readers). A commit therefore costs what it changed, not the size of the store: at
//! 10,000 runs a whole manifest is tens of megabytes, the entry of one ingest a few
//! kilobytes. Creating that file if absent is still the commit point.
//!
//! Every [`checkpoint_interval`] versions (16 up to 16,000 runs, then one more per 1,000
//! runs), the writer that committed it also writes
//! `<inverted version>.checkpoint.json`: the whole manifest at that version, as JSON lines (a
//! header, then one line a run) so that its runs are parsed and checked on every core at
//! once. A reader opening
//! the store loads the newest checkpoint and applies the few entries after it; a reader that
//! already holds a version (a REPL, a watch) applies only the entries since. Versions before
//! the newest checkpoint are deleted. Stores written before the log hold a whole manifest in
//! each commit file; such a file is a checkpoint of its own, and the log continues from it.

use super::Error;
use crate::error::Result;
use crate::manifest::{check_tombstones, shared_runs, Manifest, RunEntry, Tombstone};
use crate::paths::{parse_checkpoint_file_name, parse_manifest_file_name, StorePaths};
use crate::run_id::RunId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::sync::Arc;

/// The fewest versions between checkpoints: a reader opening the store reads at most this
/// many entries after the checkpoint in a store of up to 16,000 runs.
pub const CHECKPOINT_INTERVAL: u64 = 16;

/// Versions between checkpoints in a store of `runs` runs. Writing a checkpoint costs time in
/// proportion to the runs (0.9 s at 100,000): spread over one more commit per 1,000 runs it
/// costs each commit under 10 ms, while a reader opening the store reads at most 100 small
/// entries more at 100,000 runs.
pub fn checkpoint_interval(runs: usize) -> u64 {
    (runs as u64 / 1000).max(CHECKPOINT_INTERVAL)
}

/// The value of [`LogEntry::log`]: the format of the entries.
const LOG_FORMAT: u32 = 1;

/// What one commit changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogEntry {
    /// Always 1 for now: it tells an entry from a whole manifest (which has no such field).
    pub log: u32,
    pub version: u64,
    pub next_file_seq: u64,
    /// Runs this commit added or changed, each whole.
    #[serde(with = "shared_runs")]
    pub put: BTreeMap<RunId, Arc<RunEntry>>,
    /// Runs this commit removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<RunId>,
    /// Every file kept for readers after this commit (those dropped in the grace period).
    pub tombstones: Vec<Tombstone>,
    pub data_area: bool,
}

impl LogEntry {
    /// What turns `old` into `new` (`new` made from a copy of `old`: an unchanged run is the
    /// same shared entry in both, so a change is found by pointer, not by comparing runs).
    /// Both are walked once, side by side, in run order.
    pub fn between(old: &Manifest, new: &Manifest) -> LogEntry {
        let mut put = BTreeMap::new();
        let mut removed = Vec::new();
        let mut olds = old.runs.iter().peekable();
        for (run, entry) in &new.runs {
            while let Some((gone, _)) = olds.next_if(|(o, _)| *o < run) {
                removed.push(gone.clone());
            }
            match olds.next_if(|(o, _)| *o == run) {
                Some((_, o)) if Arc::ptr_eq(o, entry) => {}
                _ => {
                    put.insert(run.clone(), entry.clone());
                }
            }
        }
        removed.extend(olds.map(|(run, _)| run.clone()));
        LogEntry {
            log: LOG_FORMAT,
            version: new.version,
            next_file_seq: new.next_file_seq,
            put,
            removed,
            tombstones: new.tombstones.clone(),
            data_area: new.data_area,
        }
    }

    /// Turns `state`, the version before this entry's, into this entry's version.
    pub fn apply(self, state: &mut Manifest) -> std::result::Result<(), String> {
        if self.version != state.version + 1 {
            return Err(format!(
                "is the entry of version {} but follows version {}",
                self.version, state.version
            ));
        }
        for run in &self.removed {
            state.runs.remove(run);
        }
        state.runs.extend(self.put);
        state.version = self.version;
        state.next_file_seq = self.next_file_seq;
        state.tombstones = self.tombstones;
        state.data_area = self.data_area;
        Ok(())
    }

    /// The runs this commit added, changed or removed.
    pub fn touched(&self) -> impl Iterator<Item = &RunId> {
        self.put.keys().chain(&self.removed)
    }

    /// [`Manifest::check`] for what the entry names.
    fn check(&self) -> std::result::Result<(), String> {
        for (run, entry) in &self.put {
            entry.check(run)?;
        }
        check_tombstones(&self.tombstones)
    }
}

/// A commit file's content.
#[derive(Debug)]
pub enum Commit {
    /// A whole manifest (stores written before the log).
    Whole(Manifest),
    Entry(LogEntry),
}

/// Reads and checks the commit file of a version: it parses, holds the version its name
/// says, and names only files it may ([`Manifest::check`]).
pub(crate) fn read_commit(path: &Path) -> Result<Commit> {
    let bytes = fs::read(path).map_err(Error::io(path))?;
    let corrupt = corrupt(path);
    let holds = |version| holds_named_version(path, parse_manifest_file_name, version);
    /// Whether a commit file is a log entry: it has the field `log` (wherever a tool that
    /// rewrote the file put it).
    #[derive(Deserialize)]
    struct Probe {
        log: Option<u32>,
    }
    let probe: Probe =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("does not parse: {e}")))?;
    if probe.log.is_some() {
        let entry: LogEntry =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("does not parse: {e}")))?;
        if entry.log != LOG_FORMAT {
            return Err(corrupt(format!(
                "is a log entry of format {}, which this gpuq does not read (it reads {LOG_FORMAT})",
                entry.log
            )));
        }
        holds(entry.version)?;
        entry.check().map_err(corrupt)?;
        Ok(Commit::Entry(entry))
    } else {
        let manifest = read_whole(path, &bytes)?;
        holds(manifest.version)?;
        Ok(Commit::Whole(manifest))
    }
}

/// The first line of a checkpoint: everything of the manifest but its runs.
#[derive(Serialize, Deserialize)]
struct CheckpointHeader {
    /// Always [`CHECKPOINT_FORMAT`].
    checkpoint: u32,
    version: u64,
    next_file_seq: u64,
    tombstones: Vec<Tombstone>,
    data_area: bool,
    /// The lines of runs that follow.
    runs: usize,
}

const CHECKPOINT_FORMAT: u32 = 1;

/// A checkpoint's bytes: its header line, then one line a run (`["<run>", {entry}]`), each
/// serialised on its own core.
fn checkpoint_bytes(manifest: &Manifest) -> Vec<u8> {
    use rayon::prelude::*;
    let header = CheckpointHeader {
        checkpoint: CHECKPOINT_FORMAT,
        version: manifest.version,
        next_file_seq: manifest.next_file_seq,
        tombstones: manifest.tombstones.clone(),
        data_area: manifest.data_area,
        runs: manifest.runs.len(),
    };
    let runs: Vec<(&RunId, &Arc<RunEntry>)> = manifest.runs.iter().collect();
    let lines: Vec<Vec<u8>> = runs
        .par_chunks(256)
        .map(|chunk| {
            let mut out = Vec::new();
            for (run, entry) in chunk {
                serde_json::to_writer(&mut out, &(run, &***entry)).expect("run serialises");
                out.push(b'\n');
            }
            out
        })
        .collect();
    let mut bytes = serde_json::to_vec(&header).expect("header serialises");
    bytes.push(b'\n');
    for chunk in lines {
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

/// Parses a checkpoint's lines, the runs on every core, each run checked as it is parsed.
fn parse_checkpoint(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    use rayon::prelude::*;
    let corrupt = corrupt(path);
    let mut lines = bytes.split(|b| *b == b'\n');
    let header: CheckpointHeader = serde_json::from_slice(lines.next().unwrap_or_default())
        .map_err(|e| corrupt(format!("line 1 does not parse: {e}")))?;
    if header.checkpoint != CHECKPOINT_FORMAT {
        return Err(corrupt(format!(
            "is a checkpoint of format {}, which this gpuq does not read (it reads \
             {CHECKPOINT_FORMAT})",
            header.checkpoint
        )));
    }
    check_tombstones(&header.tombstones).map_err(corrupt)?;
    let lines: Vec<&[u8]> = lines.filter(|l| !l.is_empty()).collect();
    if lines.len() != header.runs {
        return Err(corrupt(format!(
            "holds {} runs where its header says {} (cut short?)",
            lines.len(),
            header.runs
        )));
    }
    let runs: Vec<(RunId, Arc<RunEntry>)> = lines
        .par_iter()
        .enumerate()
        .map(|(i, line)| {
            let (run, entry): (RunId, RunEntry) = serde_json::from_slice(line)
                .map_err(|e| format!("line {} does not parse: {e}", i + 2))?;
            entry.check(&run)?;
            Ok((run, Arc::new(entry)))
        })
        .collect::<std::result::Result<_, String>>()
        .map_err(corrupt)?;
    Ok(Manifest {
        version: header.version,
        next_file_seq: header.next_file_seq,
        runs: runs.into_iter().collect(),
        tombstones: header.tombstones,
        data_area: header.data_area,
    })
}

/// Reads and checks a checkpoint: the whole manifest of the version its name says.
pub(crate) fn read_checkpoint(path: &Path) -> Result<Manifest> {
    let bytes = fs::read(path).map_err(Error::io(path))?;
    let manifest = parse_checkpoint(path, &bytes)?;
    holds_named_version(path, parse_checkpoint_file_name, manifest.version)?;
    Ok(manifest)
}

fn read_whole(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    let corrupt = corrupt(path);
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("does not parse: {e}")))?;
    manifest.check().map_err(corrupt)?;
    Ok(manifest)
}

/// The error of a damaged commit file or checkpoint at `path`, for a reason.
fn corrupt(path: &Path) -> impl Fn(String) -> Error + Copy + '_ {
    move |reason| Error::CorruptManifest {
        path: path.to_path_buf(),
        reason,
    }
}

/// Fails unless the file at `path` holds the version its name says (as `parse_name` reads it).
fn holds_named_version(
    path: &Path,
    parse_name: fn(&str) -> Option<u64>,
    version: u64,
) -> Result<()> {
    let named = path
        .file_name()
        .and_then(|n| parse_name(&n.to_string_lossy()));
    match named {
        Some(n) if n != version => Err(corrupt(path)(format!(
            "holds version {version} under the name of version {n}"
        ))),
        _ => Ok(()),
    }
}

/// The versions in `_manifest/`.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub commits: BTreeSet<u64>,
    pub checkpoints: BTreeSet<u64>,
    /// Temporary files (`.tmp-*`): a writer's, while it commits; a dead writer's otherwise.
    pub temporaries: Vec<String>,
}

impl Listing {
    pub fn read(dir: &Path) -> Result<Listing> {
        let mut listing = Listing::default();
        for e in fs::read_dir(dir).map_err(Error::io(dir))?.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            if let Some(v) = parse_manifest_file_name(&name) {
                listing.commits.insert(v);
            } else if let Some(v) = parse_checkpoint_file_name(&name) {
                listing.checkpoints.insert(v);
            } else if name.starts_with(".tmp-") {
                listing.temporaries.push(name);
            }
        }
        Ok(listing)
    }

    pub fn newest(&self) -> Option<u64> {
        self.commits.last().copied()
    }
}

/// The manifest at `listing`'s newest version: the newest checkpoint at or below it (or
/// `held`, a state already read, when that is newer) and the entries after it.
pub(crate) fn load(
    paths: &StorePaths,
    listing: &Listing,
    held: Option<&Manifest>,
) -> Result<Manifest> {
    let Some(newest) = listing.newest() else {
        return Ok(Manifest::default());
    };
    let mut entries = Vec::new();
    let mut version = newest;
    let mut state = loop {
        if let Some(held) = held.filter(|m| m.version == version) {
            break held.clone();
        }
        if listing.checkpoints.contains(&version) {
            break read_checkpoint(&paths.checkpoint_file(version))?;
        }
        if version == 0 {
            break Manifest::default();
        }
        if !listing.commits.contains(&version) {
            // Deleted since the listing (a newer checkpoint exists: list again), or lost.
            let path = paths.manifest_file(version);
            let error = std::io::Error::new(std::io::ErrorKind::NotFound, "not in the log");
            return Err(Error::Io { path, error });
        }
        match read_commit(&paths.manifest_file(version))? {
            Commit::Whole(m) => break m,
            Commit::Entry(e) => entries.push(e),
        }
        version -= 1;
    };
    for entry in entries.into_iter().rev() {
        let version = entry.version;
        entry
            .apply(&mut state)
            .map_err(|reason| Error::CorruptManifest {
                path: paths.manifest_file(version),
                reason,
            })?;
    }
    Ok(state)
}

/// The state of every version on disk that can be read from what is there, by version: the
/// error of one that cannot (it, or a version it builds on, is damaged). A version whose
/// base is no longer kept is left out.
pub(crate) fn states(
    paths: &StorePaths,
    listing: &Listing,
) -> BTreeMap<u64, std::result::Result<Manifest, String>> {
    let mut states: BTreeMap<u64, std::result::Result<Manifest, String>> = BTreeMap::new();
    for &version in &listing.commits {
        let path = paths.manifest_file(version);
        let state = match read_commit(&path) {
            Err(e) => Err(e.to_string()),
            Ok(_) if listing.checkpoints.contains(&version) => {
                read_checkpoint(&paths.checkpoint_file(version)).map_err(|e| e.to_string())
            }
            Ok(Commit::Whole(m)) => Ok(m),
            Ok(Commit::Entry(entry)) => {
                let base = match version {
                    1 => Some(Ok(Manifest::default())),
                    v => states.get(&(v - 1)).cloned(),
                };
                match base {
                    None => continue,
                    Some(Err(_)) => Err(format!(
                        "{} cannot be read: it changes version {}, which is damaged",
                        path.display(),
                        version - 1
                    )),
                    Some(Ok(mut m)) => entry
                        .apply(&mut m)
                        .map(|()| m)
                        .map_err(|reason| format!("{}: {reason}", path.display())),
                }
            }
        };
        states.insert(version, state);
    }
    states
}

/// Writes the checkpoint of `manifest`'s version: a temporary file, synced, renamed into
/// place (a checkpoint is derived from the commits: writing it twice writes the same).
pub(crate) fn write_checkpoint(paths: &StorePaths, manifest: &Manifest) -> Result<()> {
    let dir = paths.manifest_dir();
    let tmp = dir.join(format!(
        ".tmp-{}-checkpoint-{}",
        std::process::id(),
        manifest.version
    ));
    super::write_synced(&tmp, &checkpoint_bytes(manifest))?;
    let path = paths.checkpoint_file(manifest.version);
    fs::rename(&tmp, &path).map_err(Error::io(&tmp))?;
    super::sync_dir(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::RunMeta;

    fn entry(events: u64) -> Arc<RunEntry> {
        Arc::new(RunEntry {
            meta: RunMeta {
                events,
                ..Default::default()
            },
            files: Vec::new(),
        })
    }

    #[test]
    fn an_entry_holds_only_what_changed_and_rebuilds_the_next_version() {
        let run = |s: &str| RunId::new(s).unwrap();
        let mut old = Manifest {
            version: 7,
            next_file_seq: 3,
            ..Default::default()
        };
        for (name, events) in [("a", 1), ("b", 2), ("c", 3)] {
            old.runs.insert(run(name), entry(events));
        }
        let mut new = old.clone();
        new.version = 8;
        new.next_file_seq = 5;
        new.runs.remove(&run("a"));
        Arc::make_mut(new.runs.get_mut(&run("b")).unwrap())
            .meta
            .events = 20;
        new.runs.insert(run("d"), entry(4));

        let e = LogEntry::between(&old, &new);
        assert_eq!(e.put.keys().collect::<Vec<_>>(), [&run("b"), &run("d")]);
        assert_eq!(e.removed, [run("a")]);
        let json = serde_json::to_vec(&e).unwrap();
        let e: LogEntry = serde_json::from_slice(&json).unwrap();

        let mut rebuilt = old.clone();
        e.clone().apply(&mut rebuilt).unwrap();
        assert_eq!(
            serde_json::to_value(&rebuilt).unwrap(),
            serde_json::to_value(&new).unwrap()
        );
        // A checkpoint of it reads back the same, and one cut short is refused.
        let dir = tempfile::tempdir().unwrap();
        let paths = StorePaths::new(dir.path());
        fs::create_dir_all(paths.manifest_dir()).unwrap();
        write_checkpoint(&paths, &new).unwrap();
        let path = paths.checkpoint_file(8);
        assert_eq!(
            serde_json::to_value(read_checkpoint(&path).unwrap()).unwrap(),
            serde_json::to_value(&new).unwrap()
        );
        let bytes = fs::read(&path).unwrap();
        let cut = &bytes[..bytes.len() - 10];
        fs::write(&path, cut).unwrap();
        let err = read_checkpoint(&path).unwrap_err().to_string();
        assert!(err.contains("does not parse"), "{err}");
        let last_line = cut.iter().rposition(|b| *b == b'\n').unwrap();
        fs::write(&path, &cut[..=last_line]).unwrap();
        let err = read_checkpoint(&path).unwrap_err().to_string();
        assert!(
            err.contains("holds 2 runs where its header says 3"),
            "{err}"
        );

        // Applied to any other version than the one it follows, it is refused.
        let err = e.apply(&mut new.clone()).unwrap_err();
        assert!(err.contains("follows version 8"), "{err}");
    }
}
