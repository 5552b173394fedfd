//! Opening a store, reading its newest manifest, and committing new versions.
//!
//! Writers stage files in directories of their own ([`staging`]) without any lock, and take
//! the store's lock only to commit: under it a commit reads the newest version, applies its
//! change to it (a run added or appended to, parts merged, tags set), places its files and
//! writes the next version. A long ingest or a watch that appends for hours therefore never
//! keeps other writers out for longer than a commit.
//!
//! Data files live under `_data/<table>/run=<id>/`, where they stay while any version kept
//! for readers names them; the Hive tree `<table>/run=<id>/` holds hard links to the newest
//! version's files only, so that another engine's glob over it counts what gpuq counts.
//!
//! Versions are kept as a log ([`log`]): a commit writes what it changed, and after it
//! touches only what it changed (the Hive tree of its runs, the files whose grace period
//! ended), so that it costs the same in a store of ten runs and of ten thousand. What only a
//! crash leaves behind (files placed but never committed, Hive links a dead writer did not
//! make) is swept from the whole store every [`FULL_SWEEP_INTERVAL`] versions.

use crate::error::{Error, Result};
use crate::manifest::{FileEntry, Manifest, RunEntry, RunMeta, Tombstone};
use crate::part;
use crate::paths::{manifest_file_name, StorePaths};
use crate::run_id::RunId;
use crate::schema::TableKind;
use datafusion::arrow::array::RecordBatch;
use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Every this many versions, the writer of the first checkpoint past a multiple of it sweeps
/// the whole store for what crashed writers left (see the module documentation).
pub const FULL_SWEEP_INTERVAL: u64 = 256;
/// Files dropped by a commit stay on disk this long, for readers still on an older version.
const TOMBSTONE_GRACE_MS: u64 = 10 * 60 * 1000;
/// Parts with fewer rows than this are merged by compaction.
pub const SMALL_PART_ROWS: u64 = 1 << 20;
/// Compaction writes parts of at most this many rows.
pub const COMPACTED_PART_ROWS: u64 = 4 << 20;
/// A table of a run with more tiny parts than this is compacted after an append.
pub const AUTO_COMPACT_PARTS: usize = 8;
/// Parts with fewer rows than this count as the fragments of many small commits (one per step,
/// say). Ingest writes parts of 256 Ki rows (plus one remainder per file): a large trace is
/// many parts by design, and rewriting it after every append would double the ingest.
pub const TINY_PART_ROWS: u64 = 1 << 16;

mod lock;
pub mod log;
mod staging;
pub use lock::DEFAULT_LOCK_TIMEOUT;
use staging::Staging;

/// A store opened for reading. Cheap to clone; never blocks on writers.
#[derive(Debug, Clone)]
pub struct Store {
    paths: StorePaths,
    /// The newest version read or committed through this store.
    cache: Arc<Mutex<Option<Arc<Manifest>>>>,
    /// How long [`Store::writer`] waits for another writer's lock (`None`: for ever).
    lock_timeout: Option<std::time::Duration>,
}

impl Store {
    /// Opens (creating if needed) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root: PathBuf = root.into();
        fs::create_dir_all(&root).map_err(Error::io(&root))?;
        // Absolute paths: the query layer addresses files by URL.
        let root = fs::canonicalize(&root).map_err(Error::io(&root))?;
        let paths = StorePaths::new(root);
        let manifest_dir = paths.manifest_dir();
        fs::create_dir_all(&manifest_dir).map_err(Error::io(&manifest_dir))?;
        Ok(Store {
            paths,
            cache: Arc::new(Mutex::new(None)),
            lock_timeout: Some(DEFAULT_LOCK_TIMEOUT),
        })
    }

    /// The same store, its writers waiting at most `timeout` for another writer's lock
    /// (`None`: for ever; zero: not at all) instead of [`DEFAULT_LOCK_TIMEOUT`].
    pub fn with_lock_timeout(mut self, timeout: Option<std::time::Duration>) -> Store {
        self.lock_timeout = timeout;
        self
    }

    pub fn paths(&self) -> &StorePaths {
        &self.paths
    }

    pub fn root(&self) -> &Path {
        self.paths.root()
    }

    /// Where a reader of `manifest` finds the data file `rel` (a manifest path): under
    /// `_data/`, which keeps it as long as a version kept for readers names it.
    pub fn file_path(&self, manifest: &Manifest, rel: &str) -> PathBuf {
        if manifest.data_area {
            self.paths.data_file(rel)
        } else {
            self.paths.absolute(rel)
        }
    }

    /// The newest committed manifest: the version held already and the log entries since
    /// (or the newest checkpoint and the entries after it), read only when a newer version
    /// exists.
    ///
    /// A commit file or checkpoint that does not parse, or names files it must not
    /// ([`Manifest::check`]), is an error naming the file: each is synced before it is put
    /// in place, so only damage makes it unreadable, and falling back to an older version
    /// would hide the newest runs from readers and make every later commit conflict with the
    /// damaged version.
    pub fn manifest(&self) -> Result<Arc<Manifest>> {
        let dir = self.paths.manifest_dir();
        refuse_symlink(&dir)?;
        // A writer deletes the versions before each new checkpoint: when one listed here was
        // deleted before it could be read, there is a newer checkpoint; look again.
        let mut attempts = 0;
        loop {
            let listing = log::Listing::read(&dir)?;
            let held = self.cache.lock().expect("manifest cache").clone();
            if listing.newest().is_none() {
                return Ok(Arc::new(Manifest::default()));
            }
            if let Some(m) = held
                .as_ref()
                .filter(|m| Some(m.version) == listing.newest())
            {
                return Ok(m.clone());
            }
            match log::load(&self.paths, &listing, held.as_deref()) {
                Err(Error::Io { error, path }) if error.kind() == std::io::ErrorKind::NotFound => {
                    attempts += 1;
                    if attempts < 100 {
                        continue;
                    }
                    let newest = listing.newest().unwrap_or_default();
                    return Err(Error::CorruptManifest {
                        path: self.paths.manifest_file(newest),
                        reason: format!(
                            "cannot be read: it builds on {}, which is missing",
                            path.display()
                        ),
                    });
                }
                Err(e) => return Err(e),
                Ok(m) => {
                    let m = Arc::new(m);
                    self.remember(m.clone());
                    return Ok(m);
                }
            }
        }
    }

    /// Keeps `m` as the newest version known, unless a newer one is.
    fn remember(&self, m: Arc<Manifest>) {
        let mut cache = self.cache.lock().expect("manifest cache");
        if cache.as_ref().is_none_or(|held| held.version < m.version) {
            *cache = Some(m);
        }
    }

    /// Where a reader of `manifest` opens its data file `f`, after checking that nothing on
    /// the way is a symbolic link (the path could then lead out of the store) and that the
    /// file has the size the manifest records, before that size is used for anything (a
    /// crafted 2^64-1 would size the reads of the file's footer).
    pub fn checked_file_path(&self, manifest: &Manifest, f: &FileEntry) -> Result<PathBuf> {
        let path = self.file_path(manifest, &f.path);
        let real = fs::canonicalize(&path).map_err(|e| Error::DamagedFile {
            path: path.clone(),
            reason: format!("(a data file of the manifest) cannot be opened: {e}"),
        })?;
        if real != path {
            let mut link = path.clone();
            // Name the link itself: the first component that is one.
            for ancestor in path.ancestors() {
                if fs::symlink_metadata(ancestor).is_ok_and(|m| m.file_type().is_symlink()) {
                    link = ancestor.to_path_buf();
                }
            }
            return Err(Error::Symlink { path: link });
        }
        let size = fs::metadata(&path).map_err(Error::io(&path))?.len();
        if size != f.size {
            return Err(Error::DamagedFile {
                path,
                reason: format!("has {size} bytes where the manifest records {}", f.size),
            });
        }
        Ok(path)
    }

    /// A writer: it stages files in a directory of its own, and takes the store's lock (waiting
    /// for another writer's commit up to the store's lock timeout, and saying so on stderr)
    /// only while it commits. Opening one removes what crashed writers left behind, unless
    /// another writer is committing (which does the same).
    pub fn writer(&self) -> Result<StoreWriter> {
        let staging_root = self.paths.staging_dir();
        refuse_symlink(&staging_root)?;
        create_real_dir(self.paths.root(), &staging_root)?;
        let staging = Staging::create(&staging_root)?;
        let base = self.manifest()?;
        let mut writer = StoreWriter {
            store: self.clone(),
            base,
            next_staged: AtomicU64::new(0),
            staging,
        };
        if let Some(_lock) = lock::try_acquire(&self.paths.lock_file())? {
            // What the garbage is depends on the newest version: read it under the lock.
            writer.refresh()?;
            writer.clean_up_after_crashes()?;
        }
        Ok(writer)
    }
}

/// Fails when `path` is a symbolic link (absent is fine).
fn refuse_symlink(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(Error::Symlink {
            path: path.to_path_buf(),
        }),
        _ => Ok(()),
    }
}

/// Whether `path` is a directory itself, not a symbolic link to one (nor absent).
fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_dir())
}

/// Whether `dir` and every directory between `root` and it is a directory itself (none a
/// symbolic link): what is deleted in it is inside the store.
fn is_real_dir_below(root: &Path, dir: &Path) -> bool {
    let Ok(rel) = dir.strip_prefix(root) else {
        return false;
    };
    let mut at = root.to_path_buf();
    rel.components().all(|c| {
        at.push(c);
        is_real_dir(&at)
    })
}

/// Creates `dir` (under `root`) and its missing parents, refusing to go through a symbolic
/// link on the way: what the writer puts there must land inside the store.
fn create_real_dir(root: &Path, dir: &Path) -> Result<()> {
    let rel = dir.strip_prefix(root).map_err(|_| Error::Symlink {
        path: dir.to_path_buf(),
    })?;
    let mut at = root.to_path_buf();
    for component in rel.components() {
        at.push(component);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => return Err(Error::Symlink { path: at }),
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Io {
                    path: at,
                    error: std::io::Error::other("a file where the store keeps a directory"),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match fs::create_dir(&at) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    refuse_symlink(&at)?;
                }
                Err(e) => return Err(Error::Io { path: at, error: e }),
            },
            Err(e) => return Err(Error::Io { path: at, error: e }),
        }
    }
    Ok(())
}

/// A data file written to the staging area, not yet part of any version.
#[derive(Debug, Clone)]
pub struct StagedFile {
    pub table: TableKind,
    /// Its number among the writer's staged files (its part number is given at commit).
    pub seq: u64,
    pub staged_path: PathBuf,
    pub size: u64,
    pub rows: u64,
    pub stats: BTreeMap<String, Option<(i64, i64)>>,
    pub kinds: BTreeMap<String, Vec<(u64, u64)>>,
}

impl StagedFile {
    fn new(table: TableKind, seq: u64, staged_path: PathBuf, written: part::WrittenPart) -> Self {
        StagedFile {
            table,
            seq,
            staged_path,
            size: written.size,
            rows: written.rows,
            stats: written.stats,
            kinds: written.kinds,
        }
    }
}

/// How a commit treats a run that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// The run must not exist yet.
    Create,
    /// Drop the run's old files and metadata.
    Replace,
    /// Add files to the run (creating it if needed) and merge its metadata.
    Append,
}

/// A writer of the store. It stages files without a lock and commits each change under the
/// store's lock, against the newest version; dropping it without committing leaves the store as
/// it was (its staged files go with it, or with the next writer if its process died).
#[derive(Debug)]
pub struct StoreWriter {
    store: Store,
    /// The version this writer last read or committed.
    base: Arc<Manifest>,
    next_staged: AtomicU64,
    staging: Staging,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Writes `bytes` to a new file at `tmp` and syncs it; on failure (a full disk) removes the
/// half-written file, of no use to anyone.
fn write_synced(tmp: &Path, bytes: &[u8]) -> Result<()> {
    let written = File::create(tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    written.map_err(|error| {
        let _ = fs::remove_file(tmp);
        Error::Io {
            path: tmp.to_path_buf(),
            error,
        }
    })
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(dir))
}

impl StoreWriter {
    /// The version this writer last read or committed. Its commits apply to the newest
    /// version, which may be newer (another writer committed since).
    pub fn manifest(&self) -> &Manifest {
        &self.base
    }

    /// Reads the newest version into [`Self::manifest`].
    pub fn refresh(&mut self) -> Result<()> {
        self.base = self.store.manifest()?;
        Ok(())
    }

    /// Sorts the rows of `batches` together, writes them as one Parquet file in the staging
    /// area and syncs it. Safe to call from several threads at once.
    pub fn write_part(&self, table: TableKind, batches: Vec<RecordBatch>) -> Result<StagedFile> {
        for b in &batches {
            part::check_schema(table, b)?;
        }
        let sorted = part::sort_batches(table, batches)?;
        let seq = self.next_staged.fetch_add(1, Ordering::SeqCst);
        let staged_path = self.scratch_path(&format!("part-{seq:010}.parquet"));
        let written = part::write_parquet(table, &staged_path, &sorted)?;
        Ok(StagedFile::new(table, seq, staged_path, written))
    }

    /// Stages a hard link to a file of this writer's version (same rows, no copy), so that a
    /// run holding content already stored can be committed under another name. The two runs'
    /// files are distinct paths to one inode: removing either run leaves the other whole.
    pub fn link_part(&self, file: &FileEntry) -> Result<StagedFile> {
        let seq = self.next_staged.fetch_add(1, Ordering::SeqCst);
        let staged_path = self.scratch_path(&format!("part-{seq:010}.parquet"));
        let source = self.store.checked_file_path(&self.base, file)?;
        fs::hard_link(&source, &staged_path).map_err(Error::io(&source))?;
        Ok(StagedFile {
            table: file.table,
            seq,
            staged_path,
            size: file.size,
            rows: file.rows,
            stats: file.stats.clone(),
            kinds: file.kinds.clone(),
        })
    }

    /// A path in this writer's staging directory for its temporary files (e.g. spilled
    /// batches). Whatever is left there is removed with the writer, or by the next writer if
    /// this one's process died.
    pub fn scratch_path(&self, name: &str) -> PathBuf {
        self.staging.dir().join(name)
    }

    /// Commits a run: moves its staged files into place and creates the next manifest version.
    /// Nothing is visible to readers before the manifest file exists. An append to a run that
    /// has become fragmented (many tiny parts) is followed by a compaction of the run.
    pub fn put_run(
        &mut self,
        run: &RunId,
        meta: RunMeta,
        staged: Vec<StagedFile>,
        mode: PutMode,
    ) -> Result<u64> {
        let mut appended = false;
        let version = self.commit(|w, next| {
            appended = next.runs.contains_key(run) && mode == PutMode::Append;
            let mut dropped = Vec::new();
            w.add_run(next, &mut dropped, run, meta, staged, mode)?;
            Ok(Some(dropped))
        })?;
        let version = version.expect("a run is always committed");
        if appended {
            // The append is committed whatever happens here; a failed compaction only leaves
            // the run fragmented until the next one.
            if let Ok(n) = self.compact_if_fragmented(run) {
                if n > 0 {
                    return Ok(self.base.version);
                }
            }
        }
        Ok(version)
    }

    /// Commits several runs in one version (all or none), each as [`Self::put_run`] does but
    /// without compacting: the files of one ingest that became runs of their own.
    pub fn put_runs(
        &mut self,
        runs: Vec<(RunId, RunMeta, Vec<StagedFile>)>,
        mode: PutMode,
    ) -> Result<u64> {
        let version = self.commit(|w, next| {
            let mut dropped = Vec::new();
            for (run, meta, staged) in runs {
                w.add_run(next, &mut dropped, &run, meta, staged, mode)?;
            }
            Ok(Some(dropped))
        })?;
        Ok(version.expect("runs are always committed"))
    }

    /// Puts `run` into `next` (its dropped files into `dropped`).
    fn add_run(
        &self,
        next: &mut Manifest,
        dropped: &mut Vec<String>,
        run: &RunId,
        mut meta: RunMeta,
        staged: Vec<StagedFile>,
        mode: PutMode,
    ) -> Result<()> {
        let existing = next.runs.remove(run).map(Arc::unwrap_or_clone);
        if existing.is_some() && mode == PutMode::Create {
            return Err(Error::RunExists(run.to_string()));
        }
        let mut entry = match (existing, mode) {
            (Some(old), PutMode::Append) => old,
            (Some(old), _) => {
                dropped.extend(old.files.into_iter().map(|f| f.path));
                // A replaced run keeps its tags unless the new ingest gives some.
                if meta.tags.is_empty() {
                    meta.tags = old.meta.tags;
                }
                RunEntry {
                    meta: RunMeta::default(),
                    files: Vec::new(),
                }
            }
            (None, _) => RunEntry {
                meta: RunMeta::default(),
                files: Vec::new(),
            },
        };
        if entry.files.is_empty() && entry.meta.sources.is_empty() {
            entry.meta = meta;
        } else {
            entry.meta.merge(meta);
        }
        entry.files.extend(self.place(next, run, staged)?);
        next.runs.insert(run.clone(), Arc::new(entry));
        Ok(())
    }

    /// Moves staged files to their final paths under `_data/` for `run` (not yet referenced
    /// by any version, nor in the Hive tree), numbered from `next`'s next free sequence
    /// number, and syncs their directories. Called under the store's lock.
    fn place(
        &self,
        next: &mut Manifest,
        run: &RunId,
        staged: Vec<StagedFile>,
    ) -> Result<Vec<FileEntry>> {
        let paths = &self.store.paths;
        let mut dirs = HashSet::new();
        let mut files = Vec::new();
        for file in staged {
            let rel = StorePaths::part_rel_path(file.table, run, next.next_file_seq);
            next.next_file_seq += 1;
            let dest = paths.data_file(&rel);
            let dir = dest.parent().expect("part path has a parent").to_path_buf();
            create_real_dir(paths.root(), &dir)?;
            fs::rename(&file.staged_path, &dest).map_err(Error::io(&file.staged_path))?;
            dirs.insert(dir);
            files.push(FileEntry {
                table: file.table,
                path: rel,
                size: file.size,
                rows: file.rows,
                stats: file.stats,
                kinds: file.kinds,
            });
        }
        for dir in &dirs {
            sync_dir(dir)?;
        }
        Ok(files)
    }

    /// Removes a run from the next version; its files are deleted after a grace period.
    pub fn remove_run(&mut self, run: &RunId) -> Result<u64> {
        self.remove_runs(std::slice::from_ref(run))
    }

    /// Removes runs in one commit (all or none); their files are deleted after a grace period,
    /// by a later writer.
    pub fn remove_runs(&mut self, runs: &[RunId]) -> Result<u64> {
        let version = self.commit(|_, next| {
            let mut dropped = Vec::new();
            for run in runs {
                let old = next
                    .runs
                    .remove(run)
                    .ok_or_else(|| Error::UnknownRun(run.to_string()))?;
                dropped.extend(old.files.iter().map(|f| f.path.clone()));
            }
            Ok(Some(dropped))
        })?;
        Ok(version.expect("a removal is always committed"))
    }

    /// Sets tags of a run (an empty value removes the tag).
    pub fn set_tags(&mut self, run: &RunId, tags: &[(String, String)]) -> Result<u64> {
        let version = self.commit(|_, next| {
            let entry = next
                .runs
                .get_mut(run)
                .map(Arc::make_mut)
                .ok_or_else(|| Error::UnknownRun(run.to_string()))?;
            for (k, v) in tags {
                if v.is_empty() {
                    entry.meta.tags.remove(k);
                } else {
                    entry.meta.tags.insert(k.clone(), v.clone());
                }
            }
            Ok(Some(Vec::new()))
        })?;
        Ok(version.expect("tags are always committed"))
    }

    /// Commits one change under the store's lock: reads the newest version, lets `change`
    /// turn it into the next (placing staged files with [`Self::place`]; it returns the files
    /// the change drops, or `None` to commit nothing), and creates version `newest + 1` with
    /// create-if-absent semantics: write its log entry to a temporary file, sync it, hard-link
    /// it to its final name (fails if that name exists), sync the directory. Then brings the
    /// Hive tree of the runs it changed to the new version and deletes what it may
    /// ([`Self::after_commit`]); a crash before that leaves it to the next writer.
    fn commit(
        &mut self,
        change: impl FnOnce(&StoreWriter, &mut Manifest) -> Result<Option<Vec<String>>>,
    ) -> Result<Option<u64>> {
        let _lock = lock::acquire(&self.store.paths.lock_file(), self.store.lock_timeout)?;
        let newest = self.store.manifest()?;
        let mut next = (*newest).clone();
        let Some(dropped) = change(self, &mut next)? else {
            self.base = newest;
            return Ok(None);
        };
        let version = newest.version + 1;
        next.version = version;
        let now = now_ms();
        let (kept, expired): (Vec<Tombstone>, Vec<Tombstone>) =
            std::mem::take(&mut next.tombstones)
                .into_iter()
                .partition(|t| now.saturating_sub(t.removed_at_ms) < TOMBSTONE_GRACE_MS);
        next.tombstones = kept;
        next.tombstones
            .extend(dropped.into_iter().map(|path| Tombstone {
                path,
                removed_at_ms: now,
            }));
        if !newest.data_area {
            self.link_into_data_area(&next)?;
        }
        next.data_area = true;
        let entry = log::LogEntry::between(&newest, &next);
        let dir = self.store.paths.manifest_dir();
        let tmp = dir.join(format!(".tmp-{}-{version}", std::process::id()));
        let final_path = dir.join(manifest_file_name(version));
        write_synced(
            &tmp,
            &serde_json::to_vec(&entry).expect("log entry serialises"),
        )?;
        let linked = fs::hard_link(&tmp, &final_path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::Conflict(version))
            }
            Err(e) => {
                return Err(Error::Io {
                    path: final_path,
                    error: e,
                })
            }
        }
        sync_dir(&dir)?;
        let next = Arc::new(next);
        self.store.remember(next.clone());
        self.base = next;
        // Everything below is cleanup: the commit already happened.
        if newest.data_area {
            let _ = self.after_commit(&entry, &expired);
        } else {
            // The first commit into a store written before `_data/`: the whole tree moves.
            let _ = self.collect_garbage();
        }
        Ok(Some(version))
    }

    /// What a commit does once it has happened, under the store's lock, in time that grows
    /// with what it changed: brings the Hive tree of the runs `entry` changed to the new
    /// version, deletes the files whose grace period ended (`expired`), and every
    /// [`log::checkpoint_interval`] versions writes a checkpoint and deletes the versions
    /// before it (every [`FULL_SWEEP_INTERVAL`] versions sweeping the whole store as well).
    fn after_commit(&self, entry: &log::LogEntry, expired: &[Tombstone]) -> Result<()> {
        let paths = &self.store.paths;
        for t in expired {
            let file = paths.data_file(&t.path);
            let dir = file.parent().expect("a data file has a run directory");
            // Never through a link: a linked run directory and all it points to stay.
            if is_real_dir_below(paths.root(), dir) {
                let _ = fs::remove_file(&file);
                // Only when empty: the run's other files are still there otherwise.
                let _ = fs::remove_dir(dir);
            }
        }
        self.reconcile_hive_tree(entry.touched())?;
        let version = self.base.version;
        let listing = log::Listing::read(&paths.manifest_dir())?;
        let last = listing.checkpoints.last().copied().unwrap_or(0);
        if version >= last + log::checkpoint_interval(self.base.runs.len()) {
            log::write_checkpoint(paths, &self.base)?;
            if version / FULL_SWEEP_INTERVAL != last / FULL_SWEEP_INTERVAL {
                self.collect_garbage()?;
            } else {
                self.prune_versions()?;
            }
        }
        Ok(())
    }

    /// What a writer that died may have left, cleaned when a writer opens (under the store's
    /// lock), in time that does not grow with the store: its staged files, its temporary
    /// manifests, and the Hive tree of the runs the newest version changed (a writer killed
    /// right after its commit did not link or unlink them). A store written before the log
    /// is swept whole, once.
    fn clean_up_after_crashes(&self) -> Result<()> {
        let paths = &self.store.paths;
        for dir in [paths.manifest_dir(), paths.staging_dir()] {
            refuse_symlink(&dir)?;
        }
        if is_real_dir(&paths.staging_dir()) {
            staging::remove_dead_writers_leftovers(&paths.staging_dir());
        }
        self.prune_versions()?;
        if self.base.version == 0 {
            return Ok(());
        }
        match log::read_commit(&paths.manifest_file(self.base.version)) {
            Ok(log::Commit::Entry(entry)) => self.reconcile_hive_tree(entry.touched()),
            // A whole manifest: a store written before the log.
            Ok(log::Commit::Whole(_)) => self.collect_garbage(),
            // A newer commit deleted this one's file since it was read: that writer cleaned up.
            Err(_) => Ok(()),
        }
    }

    /// Deletes temporary manifests (called under the store's lock: a live writer's exist only
    /// while it commits) and the versions before the newest checkpoint: a reader reads that
    /// checkpoint and what came after it.
    fn prune_versions(&self) -> Result<()> {
        let dir = self.store.paths.manifest_dir();
        let listing = log::Listing::read(&dir)?;
        for name in &listing.temporaries {
            let _ = fs::remove_file(dir.join(name));
        }
        let Some(&floor) = listing.checkpoints.range(..=self.base.version).next_back() else {
            return Ok(());
        };
        let paths = &self.store.paths;
        for &v in listing.commits.range(..floor) {
            let _ = fs::remove_file(paths.manifest_file(v));
        }
        for &v in listing.checkpoints.range(..floor) {
            let _ = fs::remove_file(paths.checkpoint_file(v));
        }
        Ok(())
    }

    /// Brings the Hive tree of `runs` to this writer's version: unlinks each file of theirs
    /// that it does not name, links each it names that is missing.
    fn reconcile_hive_tree<'a>(&self, runs: impl Iterator<Item = &'a RunId>) -> Result<()> {
        let paths = &self.store.paths;
        if !self.base.data_area {
            return Ok(());
        }
        for table in TableKind::ALL {
            refuse_symlink(&paths.table_dir(table))?;
        }
        for run in runs {
            let live: HashSet<&str> = self
                .base
                .runs
                .get(run)
                .map(|e| e.files.iter().map(|f| f.path.as_str()).collect())
                .unwrap_or_default();
            let mut in_tree = HashSet::new();
            for table in TableKind::ALL {
                let dir = paths.run_dir(table, run);
                if is_real_dir(&dir) {
                    let keep = |rel: &str| live.contains(rel);
                    sweep_run_dir(table, &dir, &keep, &mut in_tree);
                }
            }
            link_missing(
                paths,
                live.into_iter().filter(|rel| !in_tree.contains(*rel)),
            );
        }
        Ok(())
    }

    /// Links every file `next` names or keeps for readers into `_data/` (a store written
    /// before `_data/` existed, on its first commit since). Files placed by this writer are
    /// there already.
    fn link_into_data_area(&self, next: &Manifest) -> Result<()> {
        let paths = &self.store.paths;
        let named = next
            .runs
            .values()
            .flat_map(|e| e.files.iter().map(|f| f.path.as_str()))
            .chain(next.tombstones.iter().map(|t| t.path.as_str()));
        let mut dirs = HashSet::new();
        for rel in named {
            let (hive, data) = (paths.absolute(rel), paths.data_file(rel));
            if data.exists() || !hive.exists() {
                continue;
            }
            let dir = data.parent().expect("part path has a parent").to_path_buf();
            create_real_dir(paths.root(), &dir)?;
            fs::hard_link(&hive, &data).map_err(Error::io(&hive))?;
            dirs.insert(dir);
        }
        for dir in &dirs {
            sync_dir(dir)?;
        }
        Ok(())
    }

    /// Sweeps the whole store for what no reader can need (called under the store's lock):
    /// staged files and temporary manifests of dead writers, versions before the newest
    /// checkpoint, data files no version references (a writer that died between rename and
    /// commit), dropped files past their grace period. Brings the whole Hive tree to this
    /// writer's version: unlinks every file it does not name, then links the files it names
    /// that are missing (a writer that crashed right after its commit).
    fn collect_garbage(&self) -> Result<()> {
        let paths = &self.store.paths;
        // The directories the writer writes into and deletes from: through a link, both
        // would reach outside the store.
        for dir in [
            paths.manifest_dir(),
            paths.staging_dir(),
            paths.data_dir(),
            paths.table_dir(TableKind::Events),
            paths.table_dir(TableKind::Counters),
        ] {
            refuse_symlink(&dir)?;
        }
        if is_real_dir(&paths.staging_dir()) {
            staging::remove_dead_writers_leftovers(&paths.staging_dir());
        }
        self.prune_versions()?;
        let now = now_ms();
        let mut live: HashSet<&str> = HashSet::new();
        for entry in self.base.runs.values() {
            live.extend(entry.files.iter().map(|f| f.path.as_str()));
        }
        let grace: HashSet<&str> = self
            .base
            .tombstones
            .iter()
            .filter(|t| now.saturating_sub(t.removed_at_ms) < TOMBSTONE_GRACE_MS)
            .map(|t| t.path.as_str())
            .collect();
        let kept_for_readers = |rel: &str| live.contains(rel) || grace.contains(rel);
        if !self.base.data_area {
            sweep(paths.root(), &kept_for_readers);
            return Ok(());
        }
        sweep(&paths.data_dir(), &kept_for_readers);
        let in_tree = sweep(paths.root(), &|rel: &str| live.contains(rel));
        link_missing(
            paths,
            live.iter().copied().filter(|rel| !in_tree.contains(*rel)),
        );
        Ok(())
    }
}

/// Links data files (manifest paths) into the Hive tree.
fn link_missing<'a>(paths: &StorePaths, rels: impl Iterator<Item = &'a str>) {
    for rel in rels {
        let link = paths.absolute(rel);
        let dir = link.parent().expect("part path has a parent");
        // A run directory that is a link (to anywhere) is left as it is, without this file.
        if create_real_dir(paths.root(), dir).is_ok() {
            let _ = fs::hard_link(paths.data_file(rel), &link);
        }
    }
}

/// Deletes the data files under `base` (`<table>/run=<id>/<file>`) whose relative path
/// `keep` rejects, and the run directories left empty; returns the relative paths kept.
///
/// Symbolic links are never followed: a table or run directory that is one is left alone
/// with everything it points to (a file that is one is unlinked like a file: the link goes,
/// what it points to stays).
fn sweep(base: &Path, keep: &dyn Fn(&str) -> bool) -> HashSet<String> {
    let mut kept = HashSet::new();
    if !is_real_dir(base) {
        return kept;
    }
    for table in TableKind::ALL {
        let table_dir = base.join(table.name());
        if !is_real_dir(&table_dir) {
            continue;
        }
        let Ok(runs) = fs::read_dir(&table_dir) else {
            continue;
        };
        for run_dir in runs.flatten() {
            if run_dir.file_type().is_ok_and(|t| t.is_dir()) {
                sweep_run_dir(table, &run_dir.path(), keep, &mut kept);
            }
        }
    }
    kept
}

/// Deletes the files of one run directory `dir` of `table` whose relative path `keep` rejects,
/// and the directory when that leaves it empty; adds the relative paths kept to `kept`.
fn sweep_run_dir(
    table: TableKind,
    dir: &Path,
    keep: &dyn Fn(&str) -> bool,
    kept: &mut HashSet<String>,
) {
    let Ok(files) = fs::read_dir(dir) else {
        return;
    };
    let run_name = dir.file_name().unwrap_or_default().to_string_lossy();
    let mut remaining = 0;
    for f in files.flatten() {
        let rel = format!(
            "{}/{run_name}/{}",
            table.name(),
            f.file_name().to_string_lossy()
        );
        if keep(&rel) {
            remaining += 1;
            kept.insert(rel);
        } else {
            let _ = fs::remove_file(f.path());
        }
    }
    if remaining == 0 {
        let _ = fs::remove_dir(dir);
    }
}

mod compact;
pub mod doctor;
#[cfg(test)]
mod tests;
