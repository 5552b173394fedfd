//! The files of the watched directory and what is known of each: when a file is ready to
//! read (its size and modification time have not changed for the settle time), what reading
//! it gave, and which files the run already holds (seeded from the run's sources, so that a
//! restarted watch reads none of them again). A stage log is followed as it grows: the bytes
//! of it the run holds are remembered, and a longer log is read again from there.

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
    /// Its writer said it is done with it ([`Tracker::finished`]): no settle time.
    finished: bool,
    /// A stage log followed as it grows: the bytes of it the run holds.
    read_to: Option<u64>,
}

/// A source the run holds: its path as stored, its bytes, and whether it is a stage log (read
/// again from there when it grows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InRun {
    pub path: String,
    pub bytes: u64,
    pub grows: bool,
}

/// The files of one watched directory.
#[derive(Debug)]
pub struct Tracker {
    files: BTreeMap<PathBuf, Tracked>,
    /// The run's sources: path as stored -> (bytes, a stage log that may grow). The bytes of
    /// a log appended several times are those of its latest append.
    in_run: HashMap<String, (u64, bool)>,
    settle: Duration,
    incomplete_after: Duration,
}

impl Tracker {
    /// `in_run`: the run's stored sources.
    pub fn new(
        settle: Duration,
        incomplete_after: Duration,
        in_run: impl IntoIterator<Item = InRun>,
    ) -> Tracker {
        let mut known: HashMap<String, (u64, bool)> = HashMap::new();
        for s in in_run {
            let e = known.entry(s.path).or_default();
            *e = (e.0.max(s.bytes), e.1 || s.grows);
        }
        Tracker {
            files: BTreeMap::new(),
            in_run: known,
            settle,
            incomplete_after,
        }
    }

    /// Records what a scan saw of `path` at `now`.
    pub fn observe(&mut self, path: &Path, seen: Observed, now: Instant) -> Seen {
        match self.files.get_mut(path) {
            None => {
                // A stored path is not read again even at another size: a file that grew
                // after it was stored would have its first rows stored twice. A stage log
                // that grew is read on from where the run's copy ends.
                let stored = self.in_run.get(&path.display().to_string()).copied();
                let (state, said) = match stored {
                    Some((bytes, true)) if seen.size > bytes => (State::Waiting, Seen::Changed),
                    Some((bytes, _)) if bytes == seen.size => (State::Stored, Seen::Resumed),
                    Some(_) => (State::Stored, Seen::ChangedAfterStore),
                    None => (State::Waiting, Seen::New),
                };
                let read_to = stored.filter(|s| s.1).map(|s| s.0);
                self.files.insert(
                    path.to_path_buf(),
                    Tracked {
                        seen,
                        since: now,
                        state,
                        change_said: said == Seen::ChangedAfterStore,
                        finished: false,
                        read_to,
                    },
                );
                said
            }
            Some(t) if t.seen == seen => Seen::Same,
            Some(t) => {
                t.seen = seen;
                t.since = now;
                t.finished = false;
                // A stored file stays stored: a file that changes after it was complete is
                // not read twice (its rows would be stored twice). A stage log that grew
                // past what is stored is read on.
                let grew = t.read_to.is_some_and(|r| seen.size > r);
                if t.state != State::Stored || grew {
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

    /// The writer said it is done with `path` (it renamed the file into place, or closed a
    /// Kineto JSON file it wrote): ready at once, without the settle time. A file that was not
    /// complete after all is found cut short when read, and waits for its next change.
    pub fn finished(&mut self, path: &Path) {
        if let Some(t) = self.files.get_mut(path) {
            if t.state == State::Waiting {
                t.finished = true;
            }
        }
    }

    /// [`Self::set`] for each of `paths` (the files of one unit).
    pub fn set_each(&mut self, paths: &[PathBuf], state: State) {
        for p in paths {
            self.set(p, state);
        }
    }

    pub fn set(&mut self, path: &Path, state: State) {
        if let Some(t) = self.files.get_mut(path) {
            t.state = state;
            if state == State::Stored {
                let grows = t.read_to.is_some();
                self.in_run
                    .insert(path.display().to_string(), (t.seen.size, grows));
            }
        }
    }

    /// A stage log is stored up to byte `read_to` (its complete lines): it is read on from
    /// there when it grows past it.
    pub fn stored_to(&mut self, path: &Path, read_to: u64) {
        if let Some(t) = self.files.get_mut(path) {
            t.state = State::Stored;
            t.read_to = Some(read_to);
            t.change_said = false;
            self.in_run
                .insert(path.display().to_string(), (read_to, true));
        }
    }

    /// The bytes of a followed stage log the run holds (0: none yet).
    pub fn read_to(&self, path: &Path) -> u64 {
        self.files.get(path).and_then(|t| t.read_to).unwrap_or(0)
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
        t.finished || unchanged >= self.settle || age >= self.settle
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

    /// What is ready to read, each a list of files read as one, in [`Self::ready`]'s order: a
    /// file alone, or the files that `group_of` puts in one group (a rocprofv3 output's CSV
    /// tables) once none of them is still settling. A group's files found cut short, bad or
    /// abandoned before are read again with it, so that a group is never stored in parts
    /// because its files timed out one by one.
    pub fn ready_units(
        &self,
        now: Instant,
        wall: SystemTime,
        group_of: impl Fn(&Path) -> Option<PathBuf>,
    ) -> Vec<Vec<PathBuf>> {
        let mut done = HashSet::new();
        let mut units = Vec::new();
        for path in self.ready(now, wall) {
            let Some(group) = group_of(&path) else {
                units.push(vec![path]);
                continue;
            };
            if !done.insert(group.clone()) {
                continue;
            }
            let members: Vec<(&PathBuf, &Tracked)> = self
                .files
                .iter()
                .filter(|(p, t)| {
                    matches!(
                        t.state,
                        State::Waiting | State::Truncated | State::Failed | State::Abandoned
                    ) && group_of(p).as_ref() == Some(&group)
                })
                .collect();
            let settling = members
                .iter()
                .any(|(_, t)| t.state == State::Waiting && !self.settled(t, now, wall));
            if !settling {
                units.push(members.into_iter().map(|(p, _)| p.clone()).collect());
            }
        }
        units
    }

    /// Whether a stored file is one that `pick` picks.
    pub fn any_stored(&self, pick: impl Fn(&Path) -> bool) -> bool {
        self.files
            .iter()
            .any(|(p, t)| t.state == State::Stored && pick(p))
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
            .map(|t| {
                if t.finished {
                    now
                } else {
                    (t.since + self.settle).max(now)
                }
            })
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
    fn a_file_its_writer_finished_is_ready_at_once_until_it_changes() {
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let p = Path::new("/d/w0.json");
        let t0 = Instant::now();
        let wall = SystemTime::now();
        t.observe(p, at(10, wall), t0);
        t.finished(p);
        assert_eq!(t.ready(t0, wall), vec![p]);
        assert_eq!(t.next_settle(t0), Some(t0));
        // Written again after all: the settle time applies again.
        t.observe(p, at(20, wall), t0);
        assert!(t.ready(t0, wall).is_empty());
        // Only a waiting file is made ready.
        t.set(p, State::Truncated);
        t.finished(p);
        assert!(t.ready(t0 + SETTLE * 2, wall).is_empty());
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
        let stored = [in_run("/d/w0.json", 10, false)];
        let mut t = Tracker::new(SETTLE, TIMEOUT, stored);
        let now = Instant::now();
        let wall = SystemTime::now() - SETTLE * 2;
        let held = Path::new("/d/w0.json");
        assert_eq!(t.observe(held, at(10, wall), now), Seen::Resumed);
        // A stored path found at another size grew after it was stored: said, not read.
        let grown = Path::new("/d/w1.json");
        let mut t2 = Tracker::new(SETTLE, TIMEOUT, [in_run("/d/w1.json", 5, false)]);
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

    fn in_run(path: &str, bytes: u64, grows: bool) -> InRun {
        InRun {
            path: path.into(),
            bytes,
            grows,
        }
    }

    #[test]
    fn a_stage_log_is_read_on_each_time_it_grows_past_what_is_stored() {
        // Appended twice before (bytes 40, then 90): a restarted watch reads on from 90.
        let stored = [
            in_run("/d/train.log", 40, true),
            in_run("/d/train.log", 90, true),
            in_run("/d/done.log", 50, true),
        ];
        let mut t = Tracker::new(SETTLE, TIMEOUT, stored);
        let now = Instant::now();
        let wall = SystemTime::now() - SETTLE * 2;
        let log = Path::new("/d/train.log");
        assert_eq!(t.observe(log, at(120, wall), now), Seen::Changed);
        assert_eq!(t.read_to(log), 90);
        assert_eq!(t.ready(now, SystemTime::now()), vec![log]);
        // Its complete lines end at 118: stored to there; the half line waits.
        t.stored_to(log, 118);
        assert_eq!(t.state(log), Some(State::Stored));
        assert_eq!(t.observe(log, at(120, wall), now), Seen::Same);
        assert!(t.ready(now, SystemTime::now()).is_empty());
        // It grows: read on from 118.
        assert_eq!(t.observe(log, at(160, wall), now), Seen::Changed);
        assert_eq!(t.state(log), Some(State::Waiting));
        assert_eq!(t.read_to(log), 118);
        // A log that holds no more than the run: stored, not read.
        let done = Path::new("/d/done.log");
        assert_eq!(t.observe(done, at(50, wall), now), Seen::Resumed);
        // Rewritten shorter: said once, not read (its stages are in the run).
        assert_eq!(t.observe(done, at(20, wall), now), Seen::ChangedAfterStore);
        assert_eq!(t.state(done), Some(State::Stored));
    }

    #[test]
    fn a_group_is_ready_only_when_none_of_its_files_is_settling() {
        // Files named `<group>.<table>` belong to `<group>`; others stand alone.
        let group_of = |p: &Path| -> Option<PathBuf> {
            let name = p.file_name()?.to_str()?;
            let (group, _) = name.split_once('.').filter(|(_, t)| *t != "json")?;
            Some(p.with_file_name(group))
        };
        let mut t = Tracker::new(SETTLE, TIMEOUT, []);
        let t0 = Instant::now();
        let wall = SystemTime::now();
        let kernels = Path::new("/d/7.kernels");
        let api = Path::new("/d/7.api");
        let other = Path::new("/d/8.kernels");
        let alone = Path::new("/d/w0.json");
        t.observe(kernels, at(10, wall), t0);
        t.observe(alone, at(10, wall), t0);
        t.observe(other, at(10, wall), t0);
        // The API table appears while the kernels settle: the group waits for it.
        t.observe(api, at(10, wall + SETTLE / 2), t0 + SETTLE / 2);
        let now = t0 + SETTLE;
        assert_eq!(
            t.ready_units(now, wall + SETTLE, group_of),
            vec![vec![other.to_path_buf()], vec![alone.to_path_buf()]]
        );
        // Settled too: the two are read as one.
        let later = t0 + SETTLE * 2;
        t.set(alone, State::Stored);
        t.set(other, State::Stored);
        assert_eq!(
            t.ready_units(later, wall + SETTLE * 2, group_of),
            vec![vec![api.to_path_buf(), kernels.to_path_buf()]]
        );
        // Found cut short, then one of them changes: both are read again.
        t.set(api, State::Truncated);
        t.set(kernels, State::Truncated);
        assert!(t.ready_units(later, wall + SETTLE * 2, group_of).is_empty());
        t.observe(kernels, at(20, wall + SETTLE * 2), later);
        assert_eq!(
            t.ready_units(later + SETTLE, wall + SETTLE * 3, group_of),
            vec![vec![api.to_path_buf(), kernels.to_path_buf()]]
        );
        // Abandoned after the timeout, then one changes: still read together, never in parts.
        t.set(api, State::Abandoned);
        t.set(kernels, State::Abandoned);
        let latest = later + SETTLE * 4;
        t.observe(api, at(30, wall + SETTLE * 4), latest);
        assert_eq!(
            t.ready_units(latest + SETTLE, wall + SETTLE * 5, group_of),
            vec![vec![api.to_path_buf(), kernels.to_path_buf()]]
        );
    }
}
