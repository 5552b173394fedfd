//! Each writer's own staging directory under `_staging/`.
//!
//! Writers take the store lock only while they commit, so several stage files at once, and a
//! writer cleaning up must tell a live writer's staged files from those of one that died. A
//! writer owns its directory `_staging/<id>/` through an advisory lock on `_staging/<id>.owner`,
//! held from before the directory exists until it is removed; the kernel releases the lock when
//! the process dies, however it dies, so "the owner file can be locked" means "its writer is
//! gone".

use crate::error::{Error, Result};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const OWNER_SUFFIX: &str = ".owner";
/// An owner file is created under a temporary name, locked, then renamed: a temporary one
/// younger than this may be a writer's that is starting.
const STARTING_GRACE: Duration = Duration::from_secs(60);

/// A live writer's staging directory; removed (with what is left in it) when dropped.
#[derive(Debug)]
pub(crate) struct Staging {
    dir: PathBuf,
    owner_path: PathBuf,
    /// Holds the lock that marks the directory as a live writer's.
    _owner: File,
}

impl Staging {
    /// Creates a directory of this writer's own in `root` (which exists and is no link).
    pub(crate) fn create(root: &Path) -> Result<Staging> {
        static WRITERS: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id = format!(
            "w-{}-{nanos:x}-{}",
            std::process::id(),
            WRITERS.fetch_add(1, Ordering::Relaxed)
        );
        let starting = root.join(format!(".{id}{OWNER_SUFFIX}.tmp"));
        let owner = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&starting)
            .map_err(Error::io(&starting))?;
        owner.lock().map_err(Error::io(&starting))?;
        let owner_path = root.join(format!("{id}{OWNER_SUFFIX}"));
        fs::rename(&starting, &owner_path).map_err(Error::io(&starting))?;
        let dir = root.join(&id);
        if let Err(e) = fs::create_dir(&dir) {
            let _ = fs::remove_file(&owner_path);
            return Err(Error::Io {
                path: dir,
                error: e,
            });
        }
        Ok(Staging {
            dir,
            owner_path,
            _owner: owner,
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the files staged so far (a writer whose commit was abandoned).
    pub(crate) fn clear(&self) {
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.clear();
        let _ = fs::remove_dir(&self.dir);
        let _ = fs::remove_file(&self.owner_path);
    }
}

/// What writers that died left in the staging area `root`: their directories, owner files and
/// stray files (of writers from before per-writer directories). Live writers' are not listed.
pub(crate) fn dead_writers_leftovers(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut names: Vec<(String, fs::FileType)> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?)))
        .collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let alive = |owner: &Path| match File::open(owner).map(|f| f.try_lock()) {
        Ok(Ok(())) => false,
        Ok(Err(TryLockError::WouldBlock)) => true,
        // Unreadable: leave it to whoever can tell.
        Ok(Err(TryLockError::Error(_))) => true,
        Err(_) => false,
    };
    let mut dead = Vec::new();
    for (name, kind) in &names {
        let path = root.join(name);
        if kind.is_dir() {
            if !alive(&root.join(format!("{name}{OWNER_SUFFIX}"))) {
                dead.push(path);
            }
        } else if let Some(id) = name.strip_suffix(OWNER_SUFFIX) {
            // The directory first, then its owner file: never an owner-less live directory.
            if !alive(&path) && !names.iter().any(|(n, k)| n == id && k.is_dir()) {
                dead.push(path);
            }
        } else if name.starts_with('.') && name.ends_with(".tmp") {
            let young = fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < STARTING_GRACE);
            // A young one may be a writer between creating it and locking it, unless its
            // process is gone (a writer killed right at its start).
            if (!young || starter_gone(name)) && !alive(&path) {
                dead.push(path);
            }
        } else {
            dead.push(path);
        }
    }
    // A dead directory's owner file goes after it.
    let owners: Vec<PathBuf> = dead
        .iter()
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .map(|p| p.with_file_name(format!("{}{OWNER_SUFFIX}", file_name(p))))
        .filter(|o| o.exists())
        .collect();
    dead.extend(owners);
    dead
}

/// Whether the process that started writer `.w-<pid>-...owner.tmp` is known to be gone
/// (Linux's `/proc`; elsewhere never known).
fn starter_gone(name: &str) -> bool {
    let pid = name
        .strip_prefix(".w-")
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok());
    match pid {
        Some(pid) => {
            Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
        }
        None => false,
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Removes what [`dead_writers_leftovers`] lists. A directory's files are removed one by one
/// (a link among them is unlinked, never followed), then the directory.
pub(crate) fn remove_dead_writers_leftovers(root: &Path) {
    for path in dead_writers_leftovers(root) {
        remove_leftover(&path);
    }
}

/// Removes one leftover: a file (or link), or a staging directory and the files in it.
pub(crate) fn remove_leftover(path: &Path) -> bool {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            if let Ok(entries) = fs::read_dir(path) {
                for e in entries.flatten() {
                    let _ = fs::remove_file(e.path());
                }
            }
            fs::remove_dir(path).is_ok()
        }
        Ok(_) => fs::remove_file(path).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starting_writers_file_is_dead_once_its_process_is_gone() {
        if !Path::new("/proc/self").exists() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let mine = format!(".w-{}-1-0{OWNER_SUFFIX}.tmp", std::process::id());
        // No process has pid 4,194,304 or more on Linux (pid_max's ceiling).
        let gone = format!(".w-4194305-1-0{OWNER_SUFFIX}.tmp");
        fs::write(root.path().join(&mine), b"").unwrap();
        fs::write(root.path().join(&gone), b"").unwrap();
        assert_eq!(
            dead_writers_leftovers(root.path()),
            vec![root.path().join(&gone)]
        );
    }

    #[test]
    fn a_live_writers_directory_is_kept_and_a_dead_ones_removed() {
        let root = tempfile::tempdir().unwrap();
        let live = Staging::create(root.path()).unwrap();
        fs::write(live.dir().join("part-0.parquet"), b"x").unwrap();
        // A dead writer: its directory and an owner file nobody holds.
        let dead_dir = root.path().join("w-1-2-3");
        fs::create_dir(&dead_dir).unwrap();
        fs::write(dead_dir.join("part-0.parquet"), b"x").unwrap();
        fs::write(root.path().join("w-1-2-3.owner"), b"").unwrap();
        // A file of the old single-writer layout.
        fs::write(root.path().join("part-0000000007.parquet"), b"x").unwrap();
        let mut dead = dead_writers_leftovers(root.path());
        dead.sort();
        assert_eq!(
            dead,
            vec![
                root.path().join("part-0000000007.parquet"),
                root.path().join("w-1-2-3"),
                root.path().join("w-1-2-3.owner"),
            ]
        );
        remove_dead_writers_leftovers(root.path());
        assert!(live.dir().join("part-0.parquet").exists());
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 2);
        drop(live);
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[test]
    fn two_writers_of_one_process_have_directories_of_their_own() {
        let root = tempfile::tempdir().unwrap();
        let a = Staging::create(root.path()).unwrap();
        let b = Staging::create(root.path()).unwrap();
        assert_ne!(a.dir(), b.dir());
        // Each one's lock is seen as held from another open file, even in this process.
        assert!(dead_writers_leftovers(root.path()).is_empty());
    }
}
