//! `gpuq watch`: a directory into which a job writes trace files over time (Kineto files
//! per profiling cycle from `tensorboard_trace_handler`, on-demand traces, Nsight Systems
//! exports, rocprofv3 tables, stage logs), each finished file appended to one run as one
//! commit, so that readers see whole files only.
//!
//! A file is read once its size and modification time have not changed for the settle time
//! ([`tracker`]), or at once when inotify says its writer renamed it into place or closed it
//! (Kineto JSON only, which does not parse before its last byte), and it ingests: one found
//! cut short is read again when it changes, and reported once it stays so past a timeout; a
//! bad one is reported and skipped. Files the run already holds (its sources in the newest
//! manifest, by path) are not read again, so a restarted watch resumes where it stopped;
//! ingest's own check of content hashes is the safety net. A stored file that changes (found
//! at another size) is reported, never read again: its first rows would be stored twice.
//!
//! Files are looked for in the directory and in subdirectories of it, a few levels down
//! (rocprofv3 writes its output under `%hostname%/%pid%`-style directories), but never in
//! the store itself; below the top level only files named as profilers name them
//! ([`names::profiler_output`]). A rocprofv3 output's CSV tables are read together, as
//! `gpuq ingest` of the directory would: its GPU rows find their launches and process in its
//! API tables, so the output is appended once none of its files is still settling.
//!
//! Stage logs are the exception: they grow line by line while the job runs. Each time one
//! grows and settles, its complete lines are read again and the stages that ended in the new
//! ones are appended; stages begun and not ended are the run's `open_stages` until their end
//! line comes. The bytes stored are in the run's sources, so a restarted watch reads on from
//! there.

mod names;
mod tracker;
mod wake;

pub use names::rank_of;

use gpuq_engine::{RunId, Store};
use gpuq_ingest::{Format, IngestError, IngestOptions, NoProgress, RunReport};
use names::NameKind;
use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tracker::{InRun, Observed, Seen, State, Tracker};
use wake::Wake;

/// How long a file must stay unchanged before it is read, by default.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// How long a truncated file may stay unchanged before it is reported as incomplete.
pub const DEFAULT_INCOMPLETE_AFTER: Duration = Duration::from_secs(300);
/// How often the directory is rescanned without a wake-up from inotify, so that a change it
/// missed is found.
pub const RESCAN: Duration = Duration::from_secs(2);
/// How often the directory is rescanned when polling.
pub const POLL: Duration = Duration::from_millis(500);
/// The longest the watch sleeps before it looks at its stop flag again.
const TICK: Duration = Duration::from_millis(100);
/// How many levels of subdirectories are looked into: rocprofv3's `-d DIR` output goes to
/// `DIR/%hostname%/%pid%_...` by default, and users add levels of their own (`%rank%`).
const MAX_DEPTH: usize = 4;

/// Where a file's rank comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankFrom {
    /// The trace (Kineto `distributedInfo`); none if it declares none.
    #[default]
    Trace,
    /// The file name ([`rank_of`]): a file whose name gives none is an error.
    Path,
}

/// What to watch, and how.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    pub dir: PathBuf,
    pub run: RunId,
    /// Options of every append (`run` and `replace` are set by the watch).
    pub ingest: IngestOptions,
    pub rank_from: RankFrom,
    pub settle: Duration,
    pub incomplete_after: Duration,
    /// Read what is there (waiting for files to settle), then stop.
    pub once: bool,
    /// Stop after this long without a new or changed file.
    pub idle_exit: Option<Duration>,
    /// Rescan on the clock only (network file systems), not on inotify's notices.
    pub poll: bool,
}

impl WatchOptions {
    pub fn new(dir: PathBuf, run: RunId) -> WatchOptions {
        WatchOptions {
            dir,
            run,
            ingest: IngestOptions::default(),
            rank_from: RankFrom::Trace,
            settle: DEFAULT_SETTLE,
            incomplete_after: DEFAULT_INCOMPLETE_AFTER,
            once: false,
            idle_exit: None,
            poll: false,
        }
    }
}

/// Why the watch itself stopped (a file's failure does not stop it).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] gpuq_engine::Error),
    /// The store refused an append (not the file's fault): stopping keeps the file for the
    /// next watch.
    #[error(transparent)]
    Ingest(IngestError),
}

/// Something that happened to one file.
#[derive(Debug)]
pub enum WatchEvent<'a> {
    /// Appended to the run.
    Stored {
        path: &'a Path,
        report: &'a RunReport,
    },
    /// Its content is stored already (in `holder`): nothing appended.
    Duplicate { path: &'a Path, holder: &'a RunId },
    /// Bad (not truncated): skipped until it changes.
    Failed { path: &'a Path, error: String },
    /// Still incomplete after the timeout (or, with `once`, at the end): left alone.
    Incomplete { path: &'a Path },
    /// Changed after it was stored: not read again (its rows would be stored twice).
    ChangedAfterStore { path: &'a Path },
    /// A notice about the watch itself (e.g. polling because inotify is unavailable).
    Note(&'a str),
}

/// Counts for a status line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchStatus {
    /// Trace files seen in the directory.
    pub seen: usize,
    /// Files in the run: stored by this watch or before it.
    pub stored: usize,
    /// Files not complete yet.
    pub waiting: usize,
    pub failed: usize,
    /// The highest step number stored by this watch.
    pub last_step: Option<i64>,
}

/// Where the watch reports what it does.
pub trait WatchReporter {
    fn event(&mut self, event: WatchEvent<'_>);
    fn status(&mut self, _status: WatchStatus) {}
}

/// What one watch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchSummary {
    /// Files appended by this watch.
    pub stored: usize,
    /// Files found in the run when the watch started, not read again.
    pub resumed: usize,
    /// Files whose content another file of the store held.
    pub duplicates: usize,
    pub failed: usize,
    /// Files left incomplete.
    pub incomplete: usize,
    /// The highest step number stored.
    pub last_step: Option<i64>,
}

/// Watches `opts.dir` and appends each finished trace file to `opts.run`, until `stop` is
/// set (finishing the file in hand), or as `once` / `idle_exit` say.
pub fn watch(
    store: &Store,
    opts: &WatchOptions,
    stop: &AtomicBool,
    reporter: &mut dyn WatchReporter,
) -> Result<WatchSummary, WatchError> {
    let dir = std::fs::canonicalize(&opts.dir).map_err(|error| WatchError::Io {
        path: opts.dir.clone(),
        error,
    })?;
    let mut tracker = Tracker::new(
        opts.settle,
        opts.incomplete_after,
        stored_sources(store, &opts.run)?,
    );
    let walk = Walk {
        root: dir.clone(),
        store: std::fs::canonicalize(store.root()).unwrap_or_else(|_| store.root().into()),
    };
    let (mut wake, why) = Wake::new(&dir, opts.poll);
    if let Some(why) = why {
        reporter.event(WatchEvent::Note(&why));
    }
    let rescan_every = if wake.is_polling() { POLL } else { RESCAN };
    let mut summary = WatchSummary::default();
    let mut last_activity = Instant::now();
    let mut last_scan: Option<Instant> = None;
    let mut changed = true;
    let mut finished: Vec<wake::Finished> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        // Waiting files are looked at on every tick: whether they stay unchanged is what
        // makes them ready.
        let due = last_scan.is_none_or(|t| now.duration_since(t) >= rescan_every);
        if changed || due || tracker.count(State::Waiting) > 0 {
            let scanned = walk.scan(&mut tracker, &mut summary, reporter)?;
            if scanned.activity {
                last_activity = Instant::now();
            }
            wake.watch_also(&scanned.subdirectories);
            last_scan = Some(now);
        }
        // Files their writer is done with skip the settle time: renamed into place (written
        // under a temporary name first), or a Kineto JSON file closed after writing.
        for f in finished.drain(..) {
            let name = f.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if f.moved || names::complete_when_closed(name) {
                tracker.finished(&f.path);
            }
        }
        let units =
            tracker.ready_units(Instant::now(), SystemTime::now(), gpuq_ingest::output_named);
        for unit in units {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            // A file may have changed since the scan: read them only as they settled.
            if unit.iter().any(|p| observe(p).ok() != tracker.observed(p)) {
                continue;
            }
            append(
                store,
                opts,
                &walk,
                &unit,
                &mut tracker,
                &mut summary,
                reporter,
            )?;
            last_activity = Instant::now();
        }
        for path in tracker.abandon_stale(Instant::now()) {
            summary.incomplete += 1;
            reporter.event(WatchEvent::Incomplete { path: &path });
        }
        reporter.status(status(&tracker, summary.last_step));
        if opts.once && tracker.count(State::Waiting) == 0 {
            for path in tracker.incomplete() {
                summary.incomplete += 1;
                reporter.event(WatchEvent::Incomplete { path: &path });
            }
            break;
        }
        if let Some(idle) = opts.idle_exit {
            if tracker.count(State::Waiting) == 0 && last_activity.elapsed() >= idle {
                break;
            }
        }
        let now = Instant::now();
        let timeout = tracker
            .next_settle(now)
            .map(|t| t.duration_since(now))
            .unwrap_or(TICK)
            .min(TICK);
        let wakeup = wake.wait(timeout);
        changed = wakeup.changed;
        finished = wakeup.finished;
    }
    Ok(summary)
}

/// The run's stored sources, from the newest manifest: each file of a source read from
/// several (a rocprofv3 output) on its own.
fn stored_sources(store: &Store, run: &RunId) -> Result<Vec<InRun>, WatchError> {
    let manifest = store.manifest()?;
    let Some(entry) = manifest.runs.get(run) else {
        return Ok(Vec::new());
    };
    let mut stored = Vec::new();
    for s in &entry.meta.sources {
        if s.files.is_empty() {
            stored.push(InRun {
                path: s.path.clone(),
                bytes: s.bytes,
                grows: s.format == Format::StageLog.name(),
            });
        } else {
            stored.extend(s.files.iter().map(|f| InRun {
                path: f.path.clone(),
                bytes: f.bytes,
                grows: false,
            }));
        }
    }
    Ok(stored)
}

fn observe(path: &Path) -> std::io::Result<Observed> {
    let m = std::fs::metadata(path)?;
    Ok(Observed {
        size: m.len(),
        mtime: m.modified()?,
    })
}

/// The watched tree: the directory, and the store's root, never looked into (a store kept
/// inside the watched directory holds JSON files that are no traces).
struct Walk {
    root: PathBuf,
    store: PathBuf,
}

/// What one scan found.
struct Scanned {
    /// A file was new or changed.
    activity: bool,
    subdirectories: Vec<PathBuf>,
}

impl Walk {
    /// Looks at every file of the tree (hidden and temporary names passed over, symbolic
    /// links to directories not followed, [`MAX_DEPTH`] levels down).
    fn scan(
        &self,
        tracker: &mut Tracker,
        summary: &mut WatchSummary,
        reporter: &mut dyn WatchReporter,
    ) -> Result<Scanned, WatchError> {
        let now = Instant::now();
        let mut present = HashSet::new();
        let mut scanned = Scanned {
            activity: false,
            subdirectories: Vec::new(),
        };
        let mut pending = vec![(self.root.clone(), 0)];
        while let Some((dir, depth)) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if dir == self.root => {
                    return Err(WatchError::Io { path: dir, error });
                }
                // A subdirectory removed since it was listed, or unreadable: nothing in it
                // can be read.
                Err(_) => continue,
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if names::kind_of(name) == NameKind::Ignored {
                    continue;
                }
                let path = entry.path();
                let Ok(file_type) = entry.file_type() else {
                    continue;
                };
                if file_type.is_dir() {
                    if depth < MAX_DEPTH && path != self.store {
                        scanned.subdirectories.push(path.clone());
                        pending.push((path, depth + 1));
                    }
                    continue;
                }
                // Below the top level only what profilers name their files: configs, logs
                // and results of other tools there are no traces, and would be reported.
                if depth > 0 && !names::profiler_output(&path) {
                    continue;
                }
                // Gone between the listing and now, or not a file (a link to a directory):
                // nothing to read.
                let Ok(seen) = observe(&path) else { continue };
                if !(file_type.is_file() || file_type.is_symlink() && path.is_file()) {
                    continue;
                }
                present.insert(path.clone());
                match tracker.observe(&path, seen, now) {
                    Seen::New => scanned.activity = true,
                    Seen::Resumed => summary.resumed += 1,
                    Seen::Changed => scanned.activity = true,
                    Seen::ChangedAfterStore => {
                        reporter.event(WatchEvent::ChangedAfterStore { path: &path });
                    }
                    Seen::Same => {}
                }
            }
        }
        tracker.retain_present(&present);
        Ok(scanned)
    }

    /// `path` below the watched directory, as a rank is looked for in it.
    fn relative<'p>(&self, path: &'p Path) -> Cow<'p, str> {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .to_string_lossy()
    }
}

/// Appends the settled files of `unit` (one file, or one rocprofv3 output's tables) to the
/// run, and records what came of it.
fn append(
    store: &Store,
    opts: &WatchOptions,
    walk: &Walk,
    unit: &[PathBuf],
    tracker: &mut Tracker,
    summary: &mut WatchSummary,
    reporter: &mut dyn WatchReporter,
) -> Result<(), WatchError> {
    let shown = shown_path(unit);
    let path = shown.as_path();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let format = match names::kind_of(&name) {
        NameKind::ByContent if unit.len() == 1 => match gpuq_ingest::detect_format(path) {
            Some(format) => Some(format),
            None => {
                tracker.set(path, State::NotTrace);
                return Ok(());
            }
        },
        _ => None,
    };
    if unit
        .iter()
        .any(|p| tracker.observed(p).is_some_and(|o| o.size == 0))
    {
        tracker.set_each(unit, State::Truncated);
        return Ok(());
    }
    let mut ingest = IngestOptions {
        run: Some(opts.run.clone()),
        replace: false,
        // A stage log is read as it grows, each time from where the run's copy ends.
        stage_log_from: (format == Some(Format::StageLog)).then(|| tracker.read_to(path)),
        ..opts.ingest.clone()
    };
    if let Some(output) = gpuq_ingest::output_named(&unit[0]) {
        if tracker.any_stored(|p| gpuq_ingest::output_named(p).as_ref() == Some(&output)) {
            reporter.event(WatchEvent::Note(&format!(
                "{} joins a rocprofv3 output stored before it: appended apart, its GPU rows \
                 find no launches in the tables stored then (raise --settle if the tables \
                 of an output are written more than that apart)",
                path.display()
            )));
        }
    }
    if opts.rank_from == RankFrom::Path {
        // The file's name first; a directory's (`rank3/4242_kernel_trace.csv`) only where
        // the name gives none.
        match rank_of(&name).or_else(|| rank_of(&walk.relative(path))) {
            Some(rank) => ingest.rank = Some(rank),
            None => {
                return fail(
                    unit,
                    path,
                    "the file name and its directories give no rank (--rank-from path: \
                     worker3.*, rank-3.*, rank_3.*, rank3.*)"
                        .into(),
                    tracker,
                    summary,
                    reporter,
                )
            }
        }
    }
    let ingested = gpuq_ingest::ingest(store, unit, &ingest, &NoProgress);
    release_free_memory();
    match ingested {
        Ok(reports) => {
            let report = &reports[0];
            match report.read_to {
                Some(read_to) => tracker.stored_to(path, read_to),
                None => tracker.set_each(unit, State::Stored),
            }
            match report.duplicates.first() {
                Some((_, holder)) if report.files == 0 => {
                    summary.duplicates += 1;
                    reporter.event(WatchEvent::Duplicate { path, holder });
                }
                // A growing stage log whose new lines neither ended nor began a stage.
                None if report.files == 0 => {}
                _ => {
                    summary.stored += 1;
                    summary.last_step = summary.last_step.max(report.last_step);
                    reporter.event(WatchEvent::Stored { path, report });
                }
            }
            Ok(())
        }
        Err(e) if e.is_truncated() => {
            tracker.set_each(unit, State::Truncated);
            Ok(())
        }
        Err(e @ IngestError::Store(_)) => Err(WatchError::Ingest(e)),
        Err(e) => {
            // The error names the file already (for an output, the file of its tables
            // that is bad).
            let message = e.to_string();
            let message = message
                .strip_prefix(&format!("{}: ", path.display()))
                .unwrap_or(&message)
                .to_string();
            fail(unit, path, message, tracker, summary, reporter)
        }
    }
}

/// How a unit is named in what the watch says: its one file, or for a rocprofv3 output its
/// tables as a pattern (`node1/4242_*.csv`).
fn shown_path(unit: &[PathBuf]) -> PathBuf {
    match unit {
        [one] => one.clone(),
        _ => match gpuq_ingest::output_named(&unit[0]) {
            Some(output) => {
                let mut pattern = output.into_os_string();
                pattern.push("*.csv");
                pattern.into()
            }
            None => unit[0].clone(),
        },
    }
}

/// Gives the memory the last file's ingest freed back to the system (glibc keeps it in its
/// arenas otherwise, and the free holes left between files make the resident size creep up
/// over thousands of files).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The files of `unit` (named `path`) are bad: skipped until one of them changes.
fn fail(
    unit: &[PathBuf],
    path: &Path,
    error: String,
    tracker: &mut Tracker,
    summary: &mut WatchSummary,
    reporter: &mut dyn WatchReporter,
) -> Result<(), WatchError> {
    tracker.set_each(unit, State::Failed);
    summary.failed += 1;
    reporter.event(WatchEvent::Failed { path, error });
    Ok(())
}

fn status(tracker: &Tracker, last_step: Option<i64>) -> WatchStatus {
    WatchStatus {
        last_step,
        seen: tracker.seen(),
        stored: tracker.count(State::Stored),
        waiting: tracker.count(State::Waiting) + tracker.count(State::Truncated),
        failed: tracker.count(State::Failed),
    }
}

#[cfg(test)]
mod tests;
