//! What wakes the watch up: the kernel's notice that something in the directory (or one of
//! the subdirectories the scan found) changed (inotify), or nothing but the clock (polling,
//! for network file systems, whose changes made on other machines inotify never sees).
//! Either way the watch rescans the directory itself; a wake-up only says that a rescan is
//! worth doing now.
//!
//! inotify is used through `libc` rather than the `notify` crate: `notify` needs `mio`'s
//! `os-ext` feature, which would change the `mio` that `tokio` (and through it DataFusion) is
//! built with, and rebuild them; the wake-ups needed here are five system calls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the watch learns of changes.
pub enum Wake {
    Inotify(Inotify),
    /// Rescans on the clock only.
    Poll,
}

impl Wake {
    /// inotify on `dir`, unless `poll` asks for polling; polling as well when inotify cannot
    /// be had (no kernel support, out of watches). Returns why inotify was not used.
    pub fn new(dir: &Path, poll: bool) -> (Wake, Option<String>) {
        if poll {
            return (Wake::Poll, None);
        }
        match Inotify::watch(dir) {
            Ok(i) => (Wake::Inotify(i), None),
            Err(e) => (
                Wake::Poll,
                Some(format!("inotify unavailable ({e}): polling")),
            ),
        }
    }

    /// Waits at most `timeout`; says whether the directory changed meanwhile (polling: never
    /// known) and which files a writer finished with.
    pub fn wait(&mut self, timeout: Duration) -> Wakeup {
        match self {
            Wake::Inotify(i) => i.wait(timeout),
            Wake::Poll => {
                std::thread::sleep(timeout);
                Wakeup::default()
            }
        }
    }

    pub fn is_polling(&self) -> bool {
        matches!(self, Wake::Poll)
    }

    /// Also wakes on changes in `dirs` (subdirectories the scan found); those watched already
    /// are passed over. A directory that cannot be watched (out of watches) is still rescanned
    /// on the clock.
    pub fn watch_also(&mut self, dirs: &[PathBuf]) {
        if let Wake::Inotify(i) = self {
            for d in dirs {
                if !i.dirs.values().any(|w| w == d) {
                    // Refused: the rescan on the clock still finds its changes.
                    let _ = i.add(d);
                }
            }
        }
    }
}

/// What a wait learned.
#[derive(Debug, Default)]
pub struct Wakeup {
    /// Something in the directory changed.
    pub changed: bool,
    /// Files whose writer said it is done with them: renamed into the directory
    /// (`moved: true`), or closed after writing.
    pub finished: Vec<Finished>,
}

/// A file a writer finished with.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished {
    pub path: PathBuf,
    pub moved: bool,
}

/// An inotify instance watching a directory and subdirectories of it.
pub struct Inotify {
    fd: libc::c_int,
    /// Watch descriptor -> the directory it watches.
    dirs: HashMap<i32, PathBuf>,
}

impl Inotify {
    fn watch(dir: &Path) -> std::io::Result<Inotify> {
        // SAFETY: a plain system call; the descriptor is owned by the value made of it,
        // which closes it when dropped (also when adding the first watch fails).
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut inotify = Inotify {
            fd,
            dirs: HashMap::new(),
        };
        inotify.add(dir)?;
        Ok(inotify)
    }

    fn add(&mut self, dir: &Path) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let mask = libc::IN_CREATE
            | libc::IN_MODIFY
            | libc::IN_CLOSE_WRITE
            | libc::IN_MOVED_TO
            | libc::IN_MOVED_FROM
            | libc::IN_DELETE
            | libc::IN_ATTRIB;
        // SAFETY: a plain system call on this value's descriptor and a valid C string.
        let wd = unsafe { libc::inotify_add_watch(self.fd, path.as_ptr(), mask) };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.dirs.insert(wd, dir.to_path_buf());
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Wakeup {
        let mut poll = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd for the call's duration.
        let ready = unsafe { libc::poll(&mut poll, 1, ms) };
        let mut wakeup = Wakeup::default();
        if ready <= 0 {
            return wakeup;
        }
        wakeup.changed = true;
        // Drain the queued events. Only "closed after writing" and "moved in" are looked at
        // by name; what else changed the rescan finds out (an overflowed queue loses nothing
        // for the same reason).
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into a buffer of the length given.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            self.take_events(&buf[..n as usize], &mut wakeup.finished);
        }
        wakeup
    }

    /// Adds the files that `events` (whole `struct inotify_event`s, as one read returns them)
    /// say were closed after writing or moved in to `finished`, and forgets the watches the
    /// kernel dropped (their directory was deleted).
    fn take_events(&mut self, events: &[u8], finished: &mut Vec<Finished>) {
        const HEADER: usize = 16; // wd, mask, cookie, len: four 32-bit fields
        let field = |at: usize| u32::from_ne_bytes(events[at..at + 4].try_into().expect("4 bytes"));
        let mut at = 0;
        while at + HEADER <= events.len() {
            let wd = field(at) as i32;
            let mask = field(at + 4);
            let len = field(at + 12) as usize;
            let Some(name) = events.get(at + HEADER..at + HEADER + len) else {
                break;
            };
            at += HEADER + len;
            if mask & libc::IN_IGNORED != 0 {
                self.dirs.remove(&wd);
                continue;
            }
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            let moved = mask & libc::IN_MOVED_TO != 0;
            if moved || mask & libc::IN_CLOSE_WRITE != 0 {
                if let (Ok(name), Some(dir)) = (std::str::from_utf8(name), self.dirs.get(&wd)) {
                    finished.push(Finished {
                        path: dir.join(name),
                        moved,
                    });
                }
            }
        }
    }
}

impl Drop for Inotify {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's own and closed once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inotify_wakes_on_a_new_file_and_polling_never_claims_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wake, why) = Wake::new(dir.path(), false);
        assert!(why.is_none(), "{why:?}");
        assert!(!wake.wait(Duration::from_millis(10)).changed);
        std::fs::write(dir.path().join("w0.json"), b"{}").unwrap();
        let woke = wake.wait(Duration::from_secs(5));
        assert!(woke.changed);
        // Written and closed: the writer is done with it.
        assert_eq!(
            woke.finished,
            vec![Finished {
                path: dir.path().join("w0.json"),
                moved: false
            }]
        );
        // Drained: nothing more until the next change.
        assert!(!wake.wait(Duration::from_millis(10)).changed);
        // Renamed into place from a hidden name.
        std::fs::write(dir.path().join(".w2.tmp"), b"{}").unwrap();
        wake.wait(Duration::from_secs(5));
        std::fs::rename(dir.path().join(".w2.tmp"), dir.path().join("w2.json")).unwrap();
        let moved = wake.wait(Duration::from_secs(5)).finished;
        assert_eq!(
            moved,
            vec![Finished {
                path: dir.path().join("w2.json"),
                moved: true
            }]
        );
        let (mut poll, _) = Wake::new(dir.path(), true);
        assert!(poll.is_polling());
        std::fs::write(dir.path().join("w1.json"), b"{}").unwrap();
        assert!(!poll.wait(Duration::from_millis(10)).changed);
    }

    #[test]
    fn subdirectories_wake_once_watched_and_again_after_being_made_anew() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("node1");
        let (mut wake, _) = Wake::new(dir.path(), false);
        std::fs::create_dir(&sub).unwrap();
        assert!(wake.wait(Duration::from_secs(5)).changed);
        wake.watch_also(std::slice::from_ref(&sub));
        std::fs::write(sub.join("1_kernel_trace.csv"), b"x").unwrap();
        let finished = wake.wait(Duration::from_secs(5)).finished;
        assert_eq!(
            finished,
            vec![Finished {
                path: sub.join("1_kernel_trace.csv"),
                moved: false
            }]
        );
        // Deleted and made again: the kernel dropped the old watch, so it is added anew.
        std::fs::remove_dir_all(&sub).unwrap();
        while wake.wait(Duration::from_millis(200)).changed {}
        std::fs::create_dir(&sub).unwrap();
        wake.wait(Duration::from_secs(5));
        wake.watch_also(std::slice::from_ref(&sub));
        std::fs::write(sub.join("2_kernel_trace.csv"), b"x").unwrap();
        assert_eq!(
            wake.wait(Duration::from_secs(5)).finished,
            vec![Finished {
                path: sub.join("2_kernel_trace.csv"),
                moved: false
            }]
        );
    }
}
