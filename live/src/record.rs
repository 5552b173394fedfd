//! `gpuq record`: runs a command with gpuq's CUPTI collector injected, and commits the GPU
//! activity it streams to a run while the command runs.
//!
//! The collector (crate `gpuq-collector`, loaded by the CUDA driver through
//! `CUDA_INJECTION64_PATH`) writes a segment file per process every flush interval into a
//! spool directory; this loop reads each new segment in sequence, maps it to rows
//! ([`gpuq_ingest::cupti::Recording`]), commits them as an append to the run, and deletes the
//! segment. When the command exits, the last segments are read and the run is complete.

use gpuq_cupti_wal::{self as wal, read_segment};
use gpuq_engine::manifest::{RunMeta, SourceFile};
use gpuq_engine::schema::TableKind;
use gpuq_engine::store::PutMode;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::cupti::{Recording, Taken};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What `gpuq record` was asked to do.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    pub run: RunId,
    pub tags: Vec<(String, String)>,
    /// How often the collector hands over what CUPTI holds, and the run is committed.
    pub flush: Duration,
    /// Activity kinds (`kernel,memcpy,...`), checked by the caller.
    pub kinds: String,
    pub step_pattern: Option<regex::Regex>,
    /// The collector library.
    pub collector: PathBuf,
    /// Where segments are written; a fresh directory under the system's temporary one when
    /// `None`, removed at the end.
    pub spool: Option<PathBuf>,
}

/// How a recording ended.
#[derive(Debug, Default)]
pub struct RecordSummary {
    /// The command's exit status (`None` if it could not be waited for).
    pub status: Option<ExitStatus>,
    pub processes: usize,
    pub segments: u64,
    pub events: u64,
    pub kernels: u64,
    pub commits: u64,
    /// Processes whose collector did not record, and why.
    pub disabled: Vec<(u32, String)>,
    /// Processes that ended without their collector's last flush (killed).
    pub incomplete: Vec<u32>,
    /// Processes in which the collector started (it left a status file).
    pub collectors: usize,
    pub warnings: BTreeMap<String, u64>,
}

impl RecordSummary {
    /// Why nothing was recorded, when nothing was.
    pub fn nothing_recorded(&self) -> Option<String> {
        if self.segments > 0 {
            return None;
        }
        if let Some((pid, why)) = self.disabled.first() {
            return Some(format!("process {pid}: {why}"));
        }
        if self.collectors > 0 {
            return Some(format!(
                "the collector ran in {} process{}, but CUPTI delivered no activity (no GPU work of the kinds asked for)",
                self.collectors,
                if self.collectors == 1 { "" } else { "es" }
            ));
        }
        Some(
            "the command never initialised CUDA, so the driver never loaded the collector \
             (no NVIDIA driver or GPU here, or the command did not use CUDA)"
                .into(),
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Store(#[from] gpuq_engine::Error),
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot start {command}: {error}")]
    Spawn {
        command: String,
        error: std::io::Error,
    },
    #[error("run {0} already exists: record into a new run (or remove it first)")]
    RunExists(RunId),
    #[error("{}: holds another recording's segments; give an empty directory as --spool", .0.display())]
    SpoolInUse(PathBuf),
}

/// Set by SIGTERM: the command is asked to stop (it gets SIGTERM too) and the recording
/// finishes.
static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

/// Runs `command` with the collector injected and records its GPU activity into
/// `opts.run`, committing every flush interval. Returns when the command has exited and its
/// last segments are stored. `progress` is called after each commit.
pub fn record(
    store: &Store,
    opts: &RecordOptions,
    command: &[OsString],
    progress: &mut dyn FnMut(&RecordSummary),
) -> Result<RecordSummary, RecordError> {
    if store.manifest()?.runs.contains_key(&opts.run) {
        return Err(RecordError::RunExists(opts.run.clone()));
    }
    let (spool, owned_spool) = match &opts.spool {
        Some(dir) => (dir.clone(), false),
        None => {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            (
                std::env::temp_dir().join(format!("gpuq-record-{}-{nanos}", std::process::id())),
                true,
            )
        }
    };
    std::fs::create_dir_all(&spool).map_err(|error| RecordError::Io {
        path: spool.clone(),
        error,
    })?;
    // Another recording's segments or status files would be read into this run.
    let used = holds(&spool, |n| {
        wal::parse_segment_name(n).is_some() || wal::parse_status_name(n).is_some()
    })
    .map_err(|error| RecordError::Io {
        path: spool.clone(),
        error,
    })?;
    if used {
        return Err(RecordError::SpoolInUse(spool));
    }
    let result = record_into(store, opts, command, &spool, progress);
    // A temporary spool goes, unless an error left segments in it that were not stored.
    let unstored = holds(&spool, |n| wal::parse_segment_name(n).is_some()).unwrap_or(false);
    if owned_spool && (result.is_ok() || !unstored) {
        let _ = std::fs::remove_dir_all(&spool);
    }
    result
}

/// Whether `dir` holds a file whose name `wanted` accepts.
fn holds(dir: &Path, wanted: impl Fn(&str) -> bool) -> std::io::Result<bool> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .any(|e| e.file_name().to_str().is_some_and(&wanted)))
}

/// How long after the command exits its processes' collectors may still be writing their
/// last segment (a process the command started and did not wait for, or one in its exit
/// flush): the collector's own wait at exit, and a margin.
const EXIT_GRACE: Duration = Duration::from_secs(6);

fn record_into(
    store: &Store,
    opts: &RecordOptions,
    command: &[OsString],
    spool: &Path,
    progress: &mut dyn FnMut(&RecordSummary),
) -> Result<RecordSummary, RecordError> {
    // The store is opened for writing before the command starts: a store that cannot be
    // written fails here, not after the job.
    let mut sink = Sink::new(store, opts)?;
    let program = command.first().cloned().unwrap_or_default();
    let mut cmd = Command::new(&program);
    // NVTX ranges reach CUPTI through NVTX's own injection: the collector passes it on to
    // libcupti. A path the user set is left alone.
    if opts.kinds.split(',').any(|k| k.trim() == "marker")
        && std::env::var_os("NVTX_INJECTION64_PATH").is_none()
    {
        cmd.env("NVTX_INJECTION64_PATH", &opts.collector);
    }
    let mut child = cmd
        .args(&command[1..])
        .env("CUDA_INJECTION64_PATH", &opts.collector)
        .env("GPUQ_RECORD_DIR", spool)
        .env("GPUQ_FLUSH_MS", opts.flush.as_millis().max(1).to_string())
        .env("GPUQ_KINDS", &opts.kinds)
        .spawn()
        .map_err(|error| RecordError::Spawn {
            command: program.to_string_lossy().into_owned(),
            error,
        })?;
    // Ctrl-C reaches the command through the terminal's process group: gpuq waits for it to
    // exit and stores what it flushed. SIGTERM is passed on. (Set after the spawn, so the
    // command keeps the default dispositions.)
    // SAFETY: installing handlers that only store to an atomic, or ignore.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(
            libc::SIGTERM,
            on_terminate as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    let result = follow(&mut child, &mut sink, opts, spool, progress);
    if let Err(e) = &result {
        // Recording failed (the store could not be written): the command is the user's
        // job, so it is not killed. Said now, not after the job; the spool is removed so
        // the collectors' segments stop filling the disk (their writes fail, counted).
        eprintln!("record: recording stopped: {e}; waiting for the command to exit");
        let _ = std::fs::remove_dir_all(spool);
        let mut passed_on = false;
        while let Ok(None) = child.try_wait() {
            pass_on_terminate(&child, &mut passed_on);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    result
}

/// Passes a SIGTERM gpuq received on to the command, once.
fn pass_on_terminate(child: &std::process::Child, passed_on: &mut bool) {
    if TERMINATE.load(Ordering::SeqCst) && !*passed_on {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        *passed_on = true;
    }
}

/// Reads and commits segments until `child` has exited and its last segments are stored.
fn follow(
    child: &mut std::process::Child,
    sink: &mut Sink<'_>,
    opts: &RecordOptions,
    spool: &Path,
    progress: &mut dyn FnMut(&RecordSummary),
) -> Result<RecordSummary, RecordError> {
    let poll = (opts.flush / 4).clamp(Duration::from_millis(20), Duration::from_millis(250));
    let mut passed_on = false;
    let status = loop {
        pass_on_terminate(child, &mut passed_on);
        let exited = child.try_wait().map_err(|error| RecordError::Io {
            path: PathBuf::from("the command"),
            error,
        })?;
        sink.read_new(spool, false)?;
        sink.commit(false)?;
        progress(&sink.summary);
        if let Some(status) = exited {
            break status;
        }
        std::thread::sleep(poll);
    };
    // The command is gone. Processes it left behind, or still in their exit flush, may
    // write their last segments for a little while: until every collector says it exited.
    let gone = Instant::now();
    while statuses(spool).values().any(|s| s == "running") && gone.elapsed() < EXIT_GRACE {
        sink.read_new(spool, false)?;
        std::thread::sleep(poll);
    }
    sink.read_new(spool, true)?;
    sink.finish(spool);
    sink.commit(true)?;
    sink.summary.status = Some(status);
    progress(&sink.summary);
    Ok(std::mem::take(&mut sink.summary))
}

/// The collectors' states (`running`, `disabled`, `exited`), by process.
fn statuses(spool: &Path) -> BTreeMap<u32, String> {
    status_files(spool)
        .into_iter()
        .map(|(pid, v)| {
            let state = v.get("state").and_then(|s| s.as_str()).unwrap_or("");
            (pid, state.to_string())
        })
        .collect()
}

fn status_files(spool: &Path) -> BTreeMap<u32, serde_json::Value> {
    let mut out = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(spool) {
        for entry in dir.flatten() {
            let name = entry.file_name();
            if let Some(pid) = name.to_str().and_then(wal::parse_status_name) {
                if let Ok(text) = std::fs::read_to_string(entry.path()) {
                    if let Ok(v) = serde_json::from_str(&text) {
                        out.insert(pid, v);
                    }
                }
            }
        }
    }
    out
}

/// Reads segments in sequence per process and commits what they hold.
struct Sink<'a> {
    opts: &'a RecordOptions,
    writer: gpuq_engine::StoreWriter,
    recording: Recording,
    /// Segments read and not committed yet (deleted once their rows are committed).
    read: Vec<PathBuf>,
    /// Per process, the sequence number of the last segment read.
    next_seq: BTreeMap<u32, u64>,
    /// Processes whose source entry is committed.
    sourced: BTreeSet<u32>,
    last_commit: Instant,
    summary: RecordSummary,
    /// Warnings of the recording itself (not of its records), for the next commit.
    pending_warnings: BTreeMap<String, u64>,
    metadata_written: bool,
}

impl<'a> Sink<'a> {
    fn new(store: &'a Store, opts: &'a RecordOptions) -> Result<Sink<'a>, RecordError> {
        Ok(Sink {
            opts,
            writer: store.writer()?,
            recording: Recording::new(opts.step_pattern.clone()),
            read: Vec::new(),
            next_seq: BTreeMap::new(),
            sourced: BTreeSet::new(),
            last_commit: Instant::now(),
            summary: RecordSummary::default(),
            pending_warnings: BTreeMap::new(),
            metadata_written: false,
        })
    }

    /// Reads the segments written since the last call, in order per process. A process's
    /// segments are numbered 1, 2, ... without gaps, but a directory listing taken while
    /// two are renamed into place may show the later one only: it waits for the one before,
    /// unless `all` (the processes are gone, nothing more will come).
    fn read_new(&mut self, spool: &Path, all: bool) -> Result<(), RecordError> {
        let io = |error| RecordError::Io {
            path: spool.to_path_buf(),
            error,
        };
        let mut names: Vec<(u32, u64, PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(spool).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some((pid, seq)) = name.to_str().and_then(wal::parse_segment_name) else {
                continue;
            };
            if seq >= *self.next_seq.get(&pid).unwrap_or(&1) {
                names.push((pid, seq, entry.path()));
            }
        }
        names.sort();
        for (pid, seq, path) in names {
            if !all && seq != *self.next_seq.get(&pid).unwrap_or(&1) {
                continue;
            }
            self.next_seq.insert(pid, seq + 1);
            // A segment that cannot be read is reported and skipped: the others still are.
            let read = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| read_segment(&bytes).map_err(|e| e.to_string()))
                .and_then(|segment| self.recording.push(&segment));
            if let Err(message) = read {
                eprintln!("record: {}: {message}; skipped", path.display());
                *self
                    .pending_warnings
                    .entry("collector segments that could not be read (skipped)".into())
                    .or_default() += 1;
                continue;
            }
            self.summary.segments += 1;
            self.summary.processes = self.next_seq.len();
            self.read.push(path);
        }
        Ok(())
    }

    /// The command has exited: processes whose collector did not say it exited were killed
    /// (their last interval is lost), and records still waiting are stored as they are.
    fn finish(&mut self, spool: &Path) {
        let statuses = status_files(spool);
        self.summary.collectors = statuses.len();
        for (pid, status) in &statuses {
            match status.get("state").and_then(|s| s.as_str()) {
                Some("disabled") => {
                    let why = status
                        .get("reason")
                        .and_then(|r| r.as_str())
                        .unwrap_or("unknown reason");
                    self.summary.disabled.push((*pid, why.to_string()));
                    *self
                        .pending_warnings
                        .entry(format!("a process recorded nothing: {why}"))
                        .or_default() += 1;
                }
                Some("running") => self.summary.incomplete.push(*pid),
                _ => {}
            }
        }
        self.recording.finish();
        if !self.summary.incomplete.is_empty() {
            let n = self.summary.incomplete.len() as u64;
            *self
                .pending_warnings
                .entry(format!(
                    "recording incomplete: a process ended without its collector's last flush (killed?); up to its last {} ms of GPU activity are lost",
                    self.opts.flush.as_millis()
                ))
                .or_default() += n;
        }
    }

    /// Commits the rows read, on the flush interval, or now when `last`.
    fn commit(&mut self, last: bool) -> Result<(), RecordError> {
        if !last && self.last_commit.elapsed() < self.opts.flush.mul_f32(0.5) {
            return Ok(());
        }
        let taken = self.recording.take();
        let mut warnings = self.recording.take_warnings();
        for (k, v) in std::mem::take(&mut self.pending_warnings) {
            *warnings.entry(k).or_default() += v;
        }
        let new_processes: Vec<u32> = self
            .recording
            .metas
            .keys()
            .filter(|p| !self.sourced.contains(p))
            .copied()
            .collect();
        if taken.events.is_none() && taken.counters.is_none() && new_processes.is_empty() {
            // Warnings alone wait for rows (a run created by warnings alone would have its
            // metadata replaced by the first append with rows), unless nothing more comes.
            if !last || warnings.is_empty() {
                self.pending_warnings = warnings;
                self.delete_read();
                return Ok(());
            }
        }
        let Taken {
            events,
            counters,
            rows,
            kernels,
            first_ts,
            last_ts,
        } = taken;
        let mut staged = Vec::new();
        if let Some(b) = events {
            staged.push(self.writer.write_part(TableKind::Events, vec![b])?);
        }
        if let Some(b) = counters {
            staged.push(self.writer.write_part(TableKind::Counters, vec![b])?);
        }
        let mut meta = RunMeta {
            format: "cupti".into(),
            imported_at_ns: now_ns(),
            devices: self.recording.devices.clone(),
            first_ts,
            last_ts,
            events: rows,
            kernels,
            epoch_time: true,
            tags: self.opts.tags.iter().cloned().collect(),
            ..RunMeta::default()
        };
        for (k, v) in &warnings {
            *self.summary.warnings.entry(k.clone()).or_default() += v;
        }
        meta.warnings = warnings;
        for pid in &new_processes {
            let m = &self.recording.metas[pid];
            if let Some(r) = m.rank {
                meta.ranks.push(r);
            }
            let id = format!("{}:{}:{}", m.host, m.pid, m.clock.realtime_ns);
            meta.sources.push(SourceFile {
                path: format!("cupti://{}/{}", m.host, m.pid),
                hash: format!("{:032x}", twox_hash::XxHash3_128::oneshot(id.as_bytes())),
                bytes: 0,
                rank: m.rank,
                format: "cupti".into(),
                files: Vec::new(),
            });
        }
        if !self.metadata_written {
            if let Some(m) = self.recording.metas.values().next() {
                meta.metadata = serde_json::json!({
                    "recorded": {
                        "cupti_version": m.cupti_version,
                        "cupti_library": m.library,
                        "flush_ms": self.opts.flush.as_millis() as u64,
                        "kinds": self.opts.kinds,
                    },
                    "devices": self.recording.device_details,
                });
                self.metadata_written = true;
            }
        }
        self.writer
            .put_run(&self.opts.run, meta, staged, PutMode::Append)?;
        self.sourced.extend(new_processes);
        self.summary.events += rows;
        self.summary.kernels += kernels;
        self.summary.commits += 1;
        self.last_commit = Instant::now();
        self.delete_read();
        Ok(())
    }

    /// Segments whose rows are committed (or held in memory for the next commit) are done.
    fn delete_read(&mut self) {
        for path in self.read.drain(..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}
