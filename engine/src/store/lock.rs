//! The store's commit lock: one writer commits at a time. Taken with a bounded wait, and marked with its holder's
//! process id so that a writer kept waiting can say whom it waits for.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a writer waits for the lock unless told otherwise: longer than any ingest of a
/// real trace takes (a 12 GB trace ingests in about a minute), short enough that a hung
/// writer does not block every later one forever.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// How often a waiting writer tries the lock again.
const RETRY: Duration = Duration::from_millis(50);

/// Takes the advisory lock on `path`, waiting up to `timeout` (`None`: for ever) while
/// another process holds it, and saying so once on stderr. The holder's pid is written into
/// the file.
pub(crate) fn acquire(path: &Path, timeout: Option<Duration>) -> Result<File> {
    let file = open(path)?;
    let start = Instant::now();
    let mut told = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(Error::io(path)(e)),
        }
        let holder = holder(&file);
        let waited = start.elapsed();
        if timeout.is_some_and(|t| waited >= t) {
            return Err(Error::LockTimeout {
                path: path.to_path_buf(),
                holder,
                waited_ms: waited.as_millis() as u64,
            });
        }
        if !told {
            let whom = holder.map_or("another process".to_string(), |p| format!("pid {p}"));
            let limit = match timeout {
                Some(t) => format!("giving up after {}", seconds(t)),
                None => "without a time limit".to_string(),
            };
            eprintln!(
                "waiting for the store lock held by {whom} ({}; {limit})...",
                path.display()
            );
            told = true;
        }
        std::thread::sleep(match timeout {
            Some(t) => RETRY.min(t.saturating_sub(waited)),
            None => RETRY,
        });
    }
    mark(&file, path)?;
    Ok(file)
}

/// Takes the lock on `path` if no one holds it (`None` if someone does), without waiting or
/// saying anything.
pub(crate) fn try_acquire(path: &Path) -> Result<Option<File>> {
    let file = open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(None),
        Err(TryLockError::Error(e)) => return Err(Error::io(path)(e)),
    }
    mark(&file, path)?;
    Ok(Some(file))
}

fn open(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(Error::io(path))
}

/// Writes this process's id into the lock file, for writers kept waiting.
fn mark(file: &File, path: &Path) -> Result<()> {
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all_at(pid.as_bytes(), 0))
        .map_err(Error::io(path))
}

/// The pid the lock's holder wrote into the file, if it has yet.
fn holder(file: &File) -> Option<u32> {
    let mut buf = [0u8; 16];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// `d` as people write it: `600 s`, `1.5 s`.
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}
