//! The files of the watched directory and what is known of each: when a file is ready to
//! read (its size and modification time have not changed for the settle time), what reading
//! it gave, and which files the run already holds (seeded from the run's sources, so that a
//! restarted watch reads none of them again).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// A file's size and modification time, as one scan saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    pub size: u64,
    pub mtime: SystemTime,
}

/// Where a file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not read yet, or changed since: read once it has settled.
    Waiting,
    /// Read and found cut short (or empty): read again once it changes.
    Truncated,
    /// In the run, stored by this watch or found among the run's sources.
    Stored,
    /// Bad (not truncated): reported, and not read again unless it changes.
    Failed,
    /// Still incomplete past the timeout: reported, left alone unless it changes.
    Abandoned,
    /// Its content is no trace format (a README beside the traces): never reported.
    NotTrace,
}

/// What a scan saw happen to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Not seen before (and not in the run).
    New,
    /// Not seen before; the run holds it already (same path and size).
    Resumed,
    /// Its size or modification time changed.
    Changed,
    /// A stored file changed, for the first time since it was stored (said once: a file that
    /// keeps growing would say it on every scan).
    ChangedAfterStore,
    /// As before.
    Same,
}

#[derive(Debug)]
struct Tracked {
    seen: Observed,
    /// When the current size and modification time were first seen.
    since: Instant,
    state: State,
    /// It changed after it was stored, and that was said.
    change_said: bool,
}

/// The files of one watched directory.
#[derive(Debug)]
pub struct Tracker {
    files: BTreeMap<PathBuf, Tracked>,
    /// The run's sources: path as stored -> bytes.
    in_run: HashMap<String, u64>,
    settle: Duration,
    incomplete_after: Duration,
}

impl Tracker {
    /// `in_run`: the run's stored sources (path as ingest stores it, bytes).
    pub fn new(
        settle: Duration,
        incomplete_after: Duration,
        in_run: impl IntoIterator<Item = (String, u64)>,
    ) -> Tracker {
        Tracker {
            files: BTreeMap::new(),
            in_run: in_run.into_iter().collect(),
            settle,
            incomplete_after,
        }
    }

    /// Records what a scan saw of `path` at `now`.
    pub fn observe(&mut self, path: &Path, seen: Observed, now: Instant) -> Seen {
        match self.files.get_mut(path) {
            None => {
                // A stored path is not read again even at another size: a file that grew
                // after it was stored would have its first rows stored twice.
                let stored = self.in_run.get(&path.display().to_string());
                let (state, said) = match stored {
                    Some(&bytes) if bytes == seen.size => (State::Stored, Seen::Resumed),
                    Some(_) => (State::Stored, Seen::ChangedAfterStore),
                    None => (State::Waiting, Seen::New),
                };
                self.files.insert(
                    path.to_path_buf(),
                    Tracked {
                        seen,
                        since: now,
                        state,
                        change_said: said == Seen::ChangedAfterStore,
                    },
                );
                said
            }
            Some(t) if t.seen == seen => Seen::Same,
            Some(t) => {
                t.seen = seen;
                t.since = now;
                // A stored file stays stored: a file that changes after it was complete is
                // not read twice (its rows would be stored twice).
                if t.state != State::Stored {
                    t.state = State::Waiting;
                    Seen::Changed
                } else if !t.change_said {
                    t.change_said = true;
                    Seen::ChangedAfterStore
                } else {
                    Seen::Same
                }
            }
        }
    }

    /// Forgets files no longer in the directory (those stored are in the run's sources).
    pub fn retain_present(&mut self, present: &HashSet<PathBuf>) {
        self.files.retain(|p, _| present.contains(p));
    }

    pub fn set(&mut self, path: &Path, state: State) {
        if let Some(t) = self.files.get_mut(path) {
            t.state = state;
            if state == State::Stored {
                self.in_run.insert(path.display().to_string(), t.seen.size);
            }
        }
    }

    #[cfg(test)]
    pub fn state(&self, path: &Path) -> Option<State> {
        self.files.get(path).map(|t| t.state)
    }

    pub fn observed(&self, path: &Path) -> Option<Observed> {
        self.files.get(path).map(|t| t.seen)
    }

    fn settled(&self, t: &Tracked, now: Instant, wall: SystemTime) -> bool {
        let unchanged = now.saturating_duration_since(t.since);
        // A file last modified longer ago than the settle time (found by a restarted or a
        // `--once` watch) need not be watched for that long again.
        let age = wall.duration_since(t.seen.mtime).unwrap_or_default();
        unchanged >= self.settle || age >= self.settle
    }

    /// Files waiting that have settled, oldest modification first (cycles in the order
    /// they were written).
    pub fn ready(&self, now: Instant, wall: SystemTime) -> Vec<PathBuf> {
        let mut ready: Vec<(&PathBuf, SystemTime)> = self
            .files
            .iter()
            .filter(|(_, t)| t.state == State::Waiting && self.settled(t, now, wall))
            .map(|(p, t)| (p, t.seen.mtime))
            .collect();
        ready.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        ready.into_iter().map(|(p, _)| p.clone()).collect()
    }

    /// Files found truncated that have not changed for the incomplete timeout: marked
    /// abandoned and returned, each once.
    pub fn abandon_stale(&mut self, now: Instant) -> Vec<PathBuf> {
        let mut stale = Vec::new();
        for (p, t) in &mut self.files {
            if t.state == State::Truncated
                && now.saturating_duration_since(t.since) >= self.incomplete_after
            {
                t.state = State::Abandoned;
                stale.push(p.clone());
            }
        }
        stale
    }

    /// When the next waiting file settles, if one is waiting.
    pub fn next_settle(&self, now: Instant) -> Option<Instant> {
        self.files
            .values()
            .filter(|t| t.state == State::Waiting)
            .map(|t| (t.since + self.settle).max(now))
            .min()
    }

    pub fn count(&self, state: State) -> usize {
        self.files.values().filter(|t| t.state == state).count()
    }

    /// Files not complete yet: waiting to settle, or found truncated.
    pub fn incomplete(&self) -> Vec<PathBuf> {
        self.files
            .iter()
            .filter(|(_, t)| matches!(t.state, State::Waiting | State::Truncated))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Trace files seen (not counting those whose content is no trace).
    pub fn seen(&self) -> usize {
        self.files.len() - self.count(State::NotTrace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(1);
    const TIMEOUT: Duration = Duration::from_secs(300);

    fn at(size: u64, mtime: SystemTime) -> Observed {
        Observed { size, mtime }
    }

    #[test]
    fn a_file_is_ready_only_once_unchanged_for_the_settle_time() {
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let p = Path::new("/d/w0.json");
        let t0 = Instant::now();
        let wall = SystemTime::now();
        assert_eq!(t.observe(p, at(10, wall), t0), Seen::New);
        assert!(t.ready(t0 + SETTLE / 2, wall + SETTLE / 2).is_empty());
        // It grows: the settle time starts again.
        let grown = at(20, wall + SETTLE / 2);
        assert_eq!(t.observe(p, grown, t0 + SETTLE / 2), Seen::Changed);
        assert!(t.ready(t0 + SETTLE, wall + SETTLE).is_empty());
        assert_eq!(t.next_settle(t0 + SETTLE), Some(t0 + SETTLE * 3 / 2));
        assert_eq!(t.observe(p, grown, t0 + SETTLE), Seen::Same);
        assert_eq!(t.ready(t0 + SETTLE * 3 / 2, wall + SETTLE * 3 / 2), vec![p]);
    }

    #[test]
    fn a_file_modified_long_ago_is_ready_at_once() {
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let now = Instant::now();
        let wall = SystemTime::now();
        let old = Path::new("/d/old.json");
        let fresh = Path::new("/d/fresh.json");
        t.observe(old, at(10, wall - SETTLE * 2), now);
        t.observe(fresh, at(10, wall), now);
        assert_eq!(t.ready(now, wall), vec![old]);
    }

    #[test]
    fn ready_files_come_oldest_first() {
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let now = Instant::now();
        let wall = SystemTime::now();
        let names = ["/d/c.json", "/d/a.json", "/d/b.json"];
        for (i, name) in names.iter().enumerate() {
            let mtime = wall - Duration::from_secs(100 - i as u64);
            t.observe(Path::new(name), at(1, mtime), now);
        }
        let ready = t.ready(now, wall);
        let expected: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
        assert_eq!(ready, expected);
    }

    #[test]
    fn a_truncated_file_waits_for_a_change_and_is_abandoned_after_the_timeout() {
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let p = Path::new("/d/w0.json");
        let t0 = Instant::now();
        let wall = SystemTime::now() - SETTLE * 2;
        t.observe(p, at(10, wall), t0);
        assert_eq!(t.ready(t0, wall + SETTLE * 2), vec![p]);
        t.set(p, State::Truncated);
        // Not read again while unchanged.
        assert!(t.ready(t0 + SETTLE * 5, wall + SETTLE * 7).is_empty());
        // It grows: waiting again, and its timeout starts again.
        t.observe(p, at(30, wall + SETTLE * 10), t0 + SETTLE * 10);
        assert_eq!(t.state(p), Some(State::Waiting));
        t.set(p, State::Truncated);
        assert!(t.abandon_stale(t0 + TIMEOUT).is_empty());
        assert_eq!(t.abandon_stale(t0 + SETTLE * 10 + TIMEOUT), vec![p]);
        assert_eq!(t.state(p), Some(State::Abandoned));
        // Reported once.
        assert!(t.abandon_stale(t0 + TIMEOUT * 3).is_empty());
    }

    #[test]
    fn files_the_run_holds_are_stored_without_being_read_and_stay_so() {
        let stored = [("/d/w0.json".to_string(), 10u64)];
        let mut t = Tracker::new(SETTLE, TIMEOUT, stored);
        let now = Instant::now();
        let wall = SystemTime::now() - SETTLE * 2;
        let held = Path::new("/d/w0.json");
        assert_eq!(t.observe(held, at(10, wall), now), Seen::Resumed);
        // A stored path found at another size grew after it was stored: said, not read.
        let grown = Path::new("/d/w1.json");
        let mut t2 = Tracker::new(SETTLE, TIMEOUT, [("/d/w1.json".to_string(), 5u64)]);
        assert_eq!(
            t2.observe(grown, at(10, wall), now),
            Seen::ChangedAfterStore
        );
        assert_eq!(t2.observe(grown, at(15, wall), now), Seen::Same);
        assert_eq!(t2.state(grown), Some(State::Stored));
        assert!(t.ready(now, SystemTime::now()).is_empty());
        // A stored file that changes is not read again, and that is said once.
        assert_eq!(t.observe(held, at(20, wall), now), Seen::ChangedAfterStore);
        assert_eq!(t.observe(held, at(30, wall), now), Seen::Same);
        assert_eq!(t.state(held), Some(State::Stored));
        assert!(t.ready(now + SETTLE * 2, SystemTime::now()).is_empty());
    }
}
