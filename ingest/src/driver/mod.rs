//! Ingesting trace files into a store as runs: which files form a run (plausibly one job's
//! ranks, else one run per file), content already stored (skipped, or shared under a new
//! name), and what each run's summary reports.

mod devices;
mod part_bytes;
mod parts;
mod windows;

use crate::attribute::host::{HostStructure, Launch, RangeRules};
use crate::attribute::launches::LaunchIndexWriter;
use crate::attribute::windows::RowSample;
use crate::attribute::{resolve_counters, Resolver};
use crate::columns::Kind;
use crate::formats::detect::{DetectError, Format};
use crate::formats::{kineto, nsys, rocprof, stagelog, ParsedTrace, TraceError};
use crate::redact;
use crate::source::{self, Compression, Source};
use crate::spool::{self, Spool};
use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use gpuq_engine::manifest::{DeviceInfo, RunMeta, SourceFile, SourceMember};
use gpuq_engine::schema::TableKind;
use gpuq_engine::store::{PutMode, StagedFile};
use gpuq_engine::{RunId, Store};
use parts::{part_groups, write_counters, FileSpan, PartContext};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use windows::{write_kineto_windowed, write_windowed};

/// Rows per data file written.
pub const PART_ROWS: usize = 1 << 18;

/// Bytes of spooled counters (compressed) held in memory before they go to a scratch file.
const COUNTER_BUDGET: usize = 8 << 20;

/// Host rows attributed at a time where a file is attributed by windows (Nsight Systems
/// exports, large Kineto traces): one time window's rows, with their ranges and launches, are
/// what attribution holds in memory.
pub const WINDOW_ROWS: usize = 1 << 19;

/// Why an ingest failed. The store is unchanged whenever one of these is returned. The
/// message says it all: the inner error is not also a `source()`, which error reporters would
/// print a second time.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{}: {error}", path.display())]
    Detect { path: PathBuf, error: DetectError },
    #[error("{}: {error}", path.display())]
    Trace {
        path: PathBuf,
        error: TraceErrorDisplay,
    },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: no trace files in this directory (tried: {})", .0.display(), crate::formats::detect::TRIED)]
    EmptyDirectory(PathBuf),
    #[error("{} and {} do not look like one job ({why}); ingest them without --run (one run \
             each), or pass --merge-unrelated to store them as one run", a.display(), b.display())]
    Unrelated { a: PathBuf, b: PathBuf, why: String },
    #[error(transparent)]
    Store(#[from] gpuq_engine::Error),
}

impl IngestError {
    /// Whether the file ended before its trace did (cut short, or still being written): a
    /// truncated trace, or a compressed stream that stops in the middle. Reading it again once
    /// it has grown may succeed; any other error stays.
    pub fn is_truncated(&self) -> bool {
        match self {
            IngestError::Trace { error, .. } => error.0.truncated,
            IngestError::Io { error, .. } => error.kind() == std::io::ErrorKind::UnexpectedEof,
            _ => false,
        }
    }
}

/// [`TraceError`] as an error type.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TraceErrorDisplay(pub TraceError);

/// Options of one `gpuq ingest`.
#[derive(Debug, Clone, Default)]
pub struct IngestOptions {
    /// Run to ingest into; default: derived from each argument's file name.
    pub run: Option<RunId>,
    pub tags: Vec<(String, String)>,
    pub replace: bool,
    /// Bytes of parsed events held in memory before spilling (shared with the spool of rows
    /// by window); default [`spool::DEFAULT_BUDGET`]. Also caps the bytes of spooled counters
    /// and of attributed launches held when attributing by windows; default
    /// [`crate::attribute::launches::DEFAULT_MEMORY_BUDGET`].
    pub spool_budget: Option<usize>,
    /// Read every file as this format instead of detecting it.
    pub format: Option<Format>,
    /// Ranges naming steps (Nsight Systems: NVTX ranges, default
    /// [`nsys::DEFAULT_STEP_PATTERN`]; Kineto: operators, annotations and Python functions,
    /// default `ProfilerStep#N`).
    pub step_pattern: Option<regex::Regex>,
    /// Skip (and count) unparsable lines of line-based formats instead of failing.
    pub lenient: bool,
    /// The zone in which stage-log times without a UTC offset are local time (without one they
    /// are an error; Python `logging` times are then UTC).
    pub stage_log_zone: Option<stagelog::zone::LogZone>,
    /// Store files as one run even where they do not look like one job (see [`unrelated`]).
    pub merge_unrelated: bool,
    /// Host rows attributed at a time (a time window of the file) where a file is attributed
    /// by windows; default [`WINDOW_ROWS`].
    pub window_rows: Option<usize>,
    /// Kineto: host ranges and launch calls attributed at once for a whole file; a file with
    /// more is attributed by windows. Default [`kineto::WHOLE_FILE_LIMIT`].
    pub whole_file_limit: Option<usize>,
    /// The rank of every file but stage logs, instead of the one it declares or its position
    /// among the run's files (e.g. taken from the file name by `gpuq watch --rank-from path`).
    pub rank: Option<i32>,
    /// Uncompressed stage logs are still being written, and their bytes before this one were
    /// stored by an earlier append (`gpuq watch`): only their complete lines are read, the
    /// stages that ended in the new lines are stored, and those begun and not ended are listed
    /// in the run's `open_stages` instead of being closed. A log with no complete line past
    /// this byte is an error that [`IngestError::is_truncated`].
    pub stage_log_from: Option<u64>,
}

/// Per-file progress, for a progress bar.
pub trait Progress: Sync {
    fn start_file(&self, _path: &Path, _bytes: u64) {}
    fn bytes(&self, _done: u64) {}
    fn finish_file(&self) {}
}

pub struct NoProgress;
impl Progress for NoProgress {}

/// What happened to one run.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub run: RunId,
    /// Files skipped because their content is already stored: (file, run holding it).
    pub duplicates: Vec<(PathBuf, RunId)>,
    pub files: usize,
    pub events: u64,
    pub kernels: u64,
    pub span_ns: Option<i64>,
    /// Bytes of the files as they are on disk (compressed or not).
    pub input_bytes: u64,
    /// Bytes parsed: the decompressed content, which the ingest speed is measured on.
    pub content_bytes: u64,
    pub seconds: f64,
    pub warnings: BTreeMap<String, u64>,
    pub redacted: usize,
    pub appended: bool,
    pub version: Option<u64>,
    /// The run whose stored files this run shares: the same content, under another name.
    pub shared_from: Option<RunId>,
    /// This file was to be part of run `.0` but is a run of its own, because `.1` (the
    /// files did not look like one job).
    pub split_from: Option<(RunId, String)>,
    /// The highest step number of the events this ingest stored (not of the whole run).
    pub last_step: Option<i64>,
    /// A stage log read while it grows ([`IngestOptions::stage_log_from`]): the byte after
    /// its last complete line, where the next append starts.
    pub read_to: Option<u64>,
}

impl RunReport {
    fn new(run: RunId, appended: bool) -> RunReport {
        RunReport {
            run,
            duplicates: Vec::new(),
            files: 0,
            events: 0,
            kernels: 0,
            span_ns: None,
            input_bytes: 0,
            content_bytes: 0,
            seconds: 0.0,
            warnings: BTreeMap::new(),
            redacted: 0,
            appended,
            version: None,
            shared_from: None,
            split_from: None,
            last_step: None,
            read_to: None,
        }
    }

    /// Takes the figures of a run's metadata.
    fn describe(&mut self, meta: &RunMeta) {
        self.events = meta.events;
        self.kernels = meta.kernels;
        self.span_ns = meta.last_ts.zip(meta.first_ts).map(|(l, f)| l - f);
        self.warnings = meta.warnings.clone();
    }
}

/// Files of one job's ranks start and end within this of each other (they profile the same
/// steps); files further apart on the epoch clock are different jobs or different captures.
pub const JOB_GAP_NS: i64 = 60 * 1_000_000_000;

/// What ingest knows of a parsed file when it decides whether files form one run.
#[derive(Debug, Clone)]
pub struct JobFacts {
    pub path: PathBuf,
    /// The rank the trace declares (Kineto `distributedInfo.rank`), not one given by position.
    pub rank: Option<i32>,
    /// First and last timestamp, ns.
    pub span: Option<(i64, i64)>,
    pub epoch_time: bool,
}

/// Why `files` cannot be the ranks of one job, if they cannot: two on different clocks, two
/// declaring the same rank, or (on the epoch clock) a gap of more than [`JOB_GAP_NS`] between
/// their time spans. Files without rank information on one clock and overlapping in time are
/// taken as one job (the processes of one capture). Returns the two files that conflict.
pub fn unrelated(files: &[JobFacts]) -> Option<(PathBuf, PathBuf, String)> {
    for (i, a) in files.iter().enumerate() {
        for b in &files[i + 1..] {
            if a.epoch_time != b.epoch_time {
                let why = "one is on the Unix epoch clock, the other on a trace-relative clock";
                return Some((a.path.clone(), b.path.clone(), why.into()));
            }
            if let Some(rank) = a.rank.filter(|_| a.rank == b.rank) {
                let why = format!("both are rank {rank}");
                return Some((a.path.clone(), b.path.clone(), why));
            }
        }
    }
    // Trace-relative clocks of different files cannot be compared: only epoch spans can.
    let mut spans: Vec<((i64, i64), &Path)> = files
        .iter()
        .filter(|f| f.epoch_time)
        .filter_map(|f| Some((f.span?, f.path.as_path())))
        .collect();
    spans.sort_by_key(|(span, _)| span.0);
    let mut reach: Option<(i64, &Path)> = None;
    for ((start, end), path) in spans {
        if let Some((furthest, last)) = reach {
            if start - furthest > JOB_GAP_NS {
                let why = format!("{} apart in time", human_gap(start - furthest));
                return Some((last.to_path_buf(), path.to_path_buf(), why));
            }
        }
        if reach.is_none_or(|(furthest, _)| end > furthest) {
            reach = Some((end, path));
        }
    }
    None
}

/// A gap between captures, in the largest unit that reads well (`3.4 years`, `5.0 min`).
fn human_gap(ns: i64) -> String {
    let s = ns as f64 / 1e9;
    const DAY: f64 = 86_400.0;
    match s {
        s if s >= 365.25 * DAY => format!("{:.1} years", s / (365.25 * DAY)),
        s if s >= DAY => format!("{:.1} days", s / DAY),
        s if s >= 3600.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} min", s / 60.0),
    }
}

/// A file to ingest, and whether it was named (rather than found in a directory).
pub type PlannedFile = (PathBuf, bool);

/// Groups the arguments into runs: with `--run`, all files form one run (one rank per file);
/// without, each argument (a file, or a directory of rank files) is its own run.
pub fn plan_runs(
    paths: &[PathBuf],
    run: Option<&RunId>,
) -> Result<Vec<(RunId, Vec<PlannedFile>)>, IngestError> {
    let mut groups = Vec::new();
    for p in paths {
        let files = source::expand(p).map_err(io_error(&p))?;
        if files.is_empty() {
            return Err(IngestError::EmptyDirectory(p.clone()));
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into());
        let id = match run {
            Some(r) => r.clone(),
            None => run_named_after(&name)?,
        };
        let named = !p.is_dir();
        groups.push((
            id,
            files.into_iter().map(|f| (f, named)).collect::<Vec<_>>(),
        ));
    }
    if run.is_some() {
        let id = groups[0].0.clone();
        let all = groups.into_iter().flat_map(|g| g.1).collect();
        return Ok(vec![(id, all)]);
    }
    Ok(groups)
}

/// Ingests every run planned from `paths`. Each run is committed on its own; on error the run
/// being ingested is not visible and the runs before it stay committed.
pub fn ingest(
    store: &Store,
    paths: &[PathBuf],
    opts: &IngestOptions,
    progress: &dyn Progress,
) -> Result<Vec<RunReport>, IngestError> {
    let plan = plan_runs(paths, opts.run.as_ref())?;
    // Fail on an unreadable or unrecognised file before any work is done.
    let mut planned = Vec::new();
    for (run, files) in plan {
        let mut sources = Vec::new();
        for (f, named) in &files {
            match Source::open(f, opts.format) {
                Ok(mut s) => {
                    if let Some(from) = opts.stage_log_from {
                        complete_lines_after(&mut s, from)?;
                    }
                    sources.push(s)
                }
                // A file named as rocprofv3 names its tables is one, damaged: the adapter
                // says what is wrong (a missing column, binary content), rather than the run
                // being stored without its rows.
                Err(_) if !named && rocprof::named_as_output(f) => {
                    sources.push(Source::by_name(f, Format::Rocprof).map_err(io_error(f))?)
                }
                // A directory may hold other files (READMEs, stats): only named files must be
                // traces.
                Err(_) if !named => {}
                Err(e) => {
                    return Err(IngestError::Detect {
                        path: f.clone(),
                        error: e,
                    })
                }
            }
        }
        if sources.is_empty() {
            let dir = files
                .first()
                .and_then(|(f, _)| f.parent())
                .unwrap_or(Path::new("."));
            return Err(IngestError::EmptyDirectory(dir.to_path_buf()));
        }
        planned.push((run, group_rocprof(sources)));
    }
    let mut reports = Vec::new();
    for (run, sources) in planned {
        reports.extend(ingest_run(store, &run, sources, opts, progress)?);
    }
    Ok(reports)
}

/// Makes an uncompressed stage log still being written ([`IngestOptions::stage_log_from`])
/// end at its last complete line; an error that [`IngestError::is_truncated`] when no line
/// was completed after byte `from`. Other sources are left as they are.
fn complete_lines_after(src: &mut Source, from: u64) -> Result<(), IngestError> {
    if src.format != Format::StageLog || src.compression != Compression::None {
        return Ok(());
    }
    let end = src.complete_lines_only().map_err(io_error(&src.path))?;
    if end > from {
        return Ok(());
    }
    Err(IngestError::Trace {
        path: src.path.clone(),
        error: TraceErrorDisplay(TraceError {
            truncated: true,
            ..TraceError::at_byte(from, None, "no complete line after this byte yet")
        }),
    })
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> IngestError + '_ {
    move |error| IngestError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The clock of the traces read so far by this command (their first file's, widened to the
/// span of them all): a stage log given with its traces goes on their clock.
fn traces_clock(done: &[IngestedFile], sources: &[Source]) -> Option<stagelog::clock::RunClock> {
    let mut clocks = done
        .iter()
        .filter(|f| sources[f.source].format != Format::StageLog)
        .filter_map(|f| stagelog::clock::RunClock::of(&f.meta));
    let mut clock = clocks.next()?;
    for other in clocks {
        clock.first_ts = clock.first_ts.min(other.first_ts);
        clock.last_ts = clock.last_ts.max(other.last_ts);
    }
    Some(clock)
}

/// One parsed file of a run, staged but not committed.
struct IngestedFile {
    /// Index into the run's sources.
    source: usize,
    staged: Vec<StagedFile>,
    /// Its metadata alone, its source entry included.
    meta: RunMeta,
    declared_rank: Option<i32>,
    /// Its rows carry a rank given by its position among the run's files.
    positional_rank: bool,
    redacted: usize,
    seconds: f64,
    last_step: Option<i64>,
}

/// Whether a stage log read as it grows ended no stage in its new lines, warned of nothing
/// there, and has the same stages open as the run says: a commit would only record that it
/// was read (a chatty log, read every second, would add a manifest version each time).
fn adds_nothing(
    writer: &gpuq_engine::StoreWriter,
    run: &RunId,
    src: &Source,
    parsed: &ParsedTrace,
) -> bool {
    let stored = writer
        .manifest()
        .runs
        .get(run)
        .and_then(|e| e.meta.open_stages.get(&src.path.display().to_string()));
    parsed.events == 0
        && parsed.warnings.is_empty()
        && parsed.open_stages.as_deref().unwrap_or_default()
            == stored.map(Vec::as_slice).unwrap_or_default()
}

/// Ingests `sources` as `run`: skips content the run (or, without `--run`, any run) holds
/// already, shares the files of a run with exactly the same content under a new `--run`
/// name, and checks that the files plausibly are one job ([`unrelated`]): otherwise a run
/// named by the user is refused, and a run named after a directory becomes one run per file.
fn ingest_run(
    store: &Store,
    run: &RunId,
    mut sources: Vec<Source>,
    opts: &IngestOptions,
    progress: &dyn Progress,
) -> Result<Vec<RunReport>, IngestError> {
    let started = Instant::now();
    let mut writer = store.writer()?;
    let exists = writer.manifest().runs.contains_key(run);
    // Stage logs go on the clock of the run's traces, so those are read first.
    sources.sort_by_key(|s| s.format == Format::StageLog);
    let stored_clock = writer
        .manifest()
        .runs
        .get(run)
        .filter(|_| !opts.replace)
        .and_then(|e| stagelog::clock::RunClock::of(&e.meta));
    let mut report = RunReport::new(run.clone(), exists && !opts.replace);
    let holders = stored_holders(&writer, run, &sources, opts)?;
    if let Some(holder) = shareable(&writer, run, &holders, opts, exists) {
        let hashes: Vec<&str> = holders.iter().flatten().map(|(h, _)| h.as_str()).collect();
        return share_run(
            writer, run, &holder, &sources, &hashes, opts, report, started,
        )
        .map(|r| vec![r]);
    }
    let imported_at_ns = now_ns();
    // Stage logs belong to the whole run; every other file is a rank of a multi-file run.
    let rank_files = sources
        .iter()
        .filter(|s| s.format != Format::StageLog)
        .count();
    let multi = rank_files > 1;
    let mut rank_position = 0;
    let mut done: Vec<IngestedFile> = Vec::new();
    for (position, src) in sources.iter().enumerate() {
        // A file this run holds is skipped; so is one any run holds when the run is named
        // after the argument. Under a `--run` name it is stored again (or shared, above):
        // the named run must hold everything it was given.
        if let Some((_, holder)) = &holders[position] {
            if holder == run || opts.run.is_none() {
                report.duplicates.push((src.path.clone(), holder.clone()));
                continue;
            }
        }
        let file_started = Instant::now();
        progress.start_file(&src.path, src.size);
        let mut spool = Spool::new(
            writer.scratch_path(&format!("spool-{position}.arrows")),
            opts.spool_budget.unwrap_or(spool::DEFAULT_BUDGET),
        );
        let mut counters = Spool::new(
            writer.scratch_path(&format!("counters-{position}.arrows")),
            opts.spool_budget
                .unwrap_or(spool::DEFAULT_BUDGET)
                .min(COUNTER_BUDGET),
        );
        // Adapters that open their files themselves (SQLite, CSV directories) do not stream
        // the bytes past the hasher: hash those files on a thread of their own meanwhile,
        // instead of reading them once more afterwards (1.5 s for a 1 GB export).
        let reads_itself = matches!(src.format, Format::Nsys | Format::Rocprof);
        let run_clock = match src.format {
            Format::StageLog => traces_clock(&done, &sources).or_else(|| stored_clock.clone()),
            _ => None,
        };
        let redactor = redact::Redactor::default();
        let (parsed, hash) = std::thread::scope(|scope| {
            let early_hash = reads_itself.then(|| scope.spawn(|| src.hash()));
            let parsed = parse_source(
                src,
                opts,
                progress,
                run_clock.as_ref(),
                &mut spool,
                &mut counters,
                &redactor,
            );
            let hash = match early_hash {
                Some(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the hashing thread panicked"))),
                // Streamed through the reader: the hash is ready once the parse is done.
                None => Ok(String::new()),
            };
            (parsed, hash)
        });
        let (parsed, gpu_tables) = parsed?;
        if src.complete_lines() && adds_nothing(&writer, run, src, &parsed) {
            // The next read starts from the same byte: nothing of the new lines is lost.
            report.read_to = opts.stage_log_from;
            continue;
        }
        // Equal content implies equal size, so the check above caught every stored duplicate.
        let hash = if reads_itself { hash } else { src.hash() }.map_err(io_error(&src.path))?;
        let fallback_rank = (multi && src.format != Format::StageLog).then_some(rank_position);
        if src.format != Format::StageLog {
            rank_position += 1;
        }
        let report_fraction = |fraction: f64| progress.bytes((fraction * src.size as f64) as u64);
        let gpu = gpu_tables.map(|tables| GpuInput {
            tables,
            progress: &report_fraction,
        });
        let scratch = WindowScratch {
            spool: writer.scratch_path(&format!("windows-{position}.arrows")),
            spool_budget: opts.spool_budget.unwrap_or(spool::DEFAULT_BUDGET),
            window_rows: opts.window_rows.unwrap_or(WINDOW_ROWS),
            launch_index: writer.scratch_path(&format!("launches-{position}.bin")),
            launch_budget: opts
                .spool_budget
                .unwrap_or(crate::attribute::launches::DEFAULT_MEMORY_BUDGET),
            step_pattern: opts.step_pattern.clone(),
        };
        let spools = (spool, counters);
        let file = finish_file(
            &writer,
            parsed,
            spools,
            opts.rank.filter(|_| src.format != Format::StageLog),
            fallback_rank,
            gpu,
            &scratch,
            &redactor,
        )
        .map_err(|e| match e {
            IngestError::Io { error, .. } => IngestError::Io {
                path: src.path.clone(),
                error,
            },
            IngestError::Trace { error, .. } => IngestError::Trace {
                path: src.path.clone(),
                error,
            },
            e => e,
        })?;
        progress.finish_file();
        let mut meta = file.meta;
        meta.format = src.format.name().into();
        if let Some(open) = file.open_stages {
            meta.open_stages
                .insert(src.path.display().to_string(), open);
        }
        meta.sources.push(SourceFile {
            path: src.path.display().to_string(),
            hash,
            bytes: src.size,
            rank: file.rank,
            format: src.format.name().into(),
            files: members_of(&src),
        });
        done.push(IngestedFile {
            source: position,
            staged: file.staged,
            meta,
            declared_rank: file.declared_rank,
            positional_rank: file.declared_rank.is_none() && file.rank.is_some(),
            redacted: file.redacted,
            seconds: file_started.elapsed().as_secs_f64(),
            last_step: file.last_step,
        });
    }
    if done.is_empty() {
        // Everything was already stored: nothing to commit.
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(vec![report]);
    }
    let facts: Vec<JobFacts> = done
        .iter()
        .filter(|f| sources[f.source].format != Format::StageLog)
        .map(|f| JobFacts {
            path: sources[f.source].path.clone(),
            rank: f.declared_rank,
            span: f.meta.first_ts.zip(f.meta.last_ts),
            epoch_time: f.meta.epoch_time,
        })
        .collect();
    // A directory whose other files were stored as runs of their own (split by an earlier
    // ingest) adds its new files as runs of their own too, not as a run of the directory.
    if opts.run.is_none() && report.duplicates.iter().any(|(_, holder)| holder != run) {
        let why = "the directory's other files are stored as runs of their own";
        let mut reports = vec![report];
        reports.extend(split_run(
            store, writer, run, &sources, done, opts, progress, why,
        )?);
        return Ok(reports);
    }
    let mut merged_anyway = None;
    if let Some((a, b, why)) = unrelated(&facts) {
        if opts.merge_unrelated {
            merged_anyway = Some(format!(
                "files of unrelated jobs stored as one run on request (--merge-unrelated): {} and {}: {why}",
                a.display(),
                b.display()
            ));
        } else if opts.run.is_some() {
            return Err(IngestError::Unrelated { a, b, why });
        } else {
            let why = format!("{} and {}: {why}", a.display(), b.display());
            let mut reports = vec![report];
            reports.extend(split_run(
                store, writer, run, &sources, done, opts, progress, &why,
            )?);
            return Ok(reports);
        }
    }
    let mut meta: Option<RunMeta> = None;
    let mut staged = Vec::new();
    for file in done {
        let src = &sources[file.source];
        staged.extend(file.staged);
        report.redacted += file.redacted;
        report.last_step = report.last_step.max(file.last_step);
        if src.complete_lines() {
            report.read_to = Some(src.size);
        }
        report.input_bytes += src.size;
        report.content_bytes += src.content_bytes();
        // A rocprofv3 output counts its CSV files.
        report.files += src.files.len();
        // Merging warns of sources on different clocks, so the first file is not merged
        // into an empty (trace-relative) one.
        match &mut meta {
            Some(meta) => meta.merge(file.meta),
            None => meta = Some(file.meta),
        }
    }
    let mut meta = meta.expect("at least one file was ingested");
    if let Some(warning) = merged_anyway {
        meta.warnings.insert(warning, 1);
    }
    meta.imported_at_ns = imported_at_ns;
    meta.tags = opts.tags.iter().cloned().collect();
    report.redacted = seal(&mut meta, report.redacted);
    report.describe(&meta);
    report.version = Some(writer.put_run(run, meta, staged, put_mode(opts))?);
    report.seconds = started.elapsed().as_secs_f64();
    Ok(vec![report])
}

/// Redacts what a run's metadata holds besides its rows ([`redact::run_meta`]: paths, tags,
/// ...) and counts in its warnings the secrets redacted there and in its files (`in_files`).
/// Returns how many there were.
fn seal(meta: &mut RunMeta, in_files: usize) -> usize {
    let n = in_files + redact::run_meta(meta);
    if n > 0 {
        *meta.warnings.entry(redact::WARNING.into()).or_default() += n as u64;
    }
    n
}

/// The run named after a file or directory: its name without extensions and secrets.
fn run_named_after(file_name: &str) -> Result<RunId, IngestError> {
    Ok(RunId::from_file_name(&redact::redact_text(file_name).0)?)
}

fn put_mode(opts: &IngestOptions) -> PutMode {
    if opts.replace {
        PutMode::Replace
    } else {
        PutMode::Append
    }
}

/// For each source, its content hash and the run that already holds it, if any (`run`
/// itself preferred). With `--replace` nothing counts as stored.
fn stored_holders(
    writer: &gpuq_engine::StoreWriter,
    run: &RunId,
    sources: &[Source],
    opts: &IngestOptions,
) -> Result<Vec<Option<(String, RunId)>>, IngestError> {
    let manifest = writer.manifest();
    let mut holders = Vec::with_capacity(sources.len());
    for src in sources {
        // Only a same-sized stored source can have the same content: hash up front then, so
        // re-ingesting a stored file costs one read and no parse.
        let same_size = manifest
            .runs
            .values()
            .any(|e| e.meta.sources.iter().any(|s| s.bytes == src.size));
        if !same_size || opts.replace {
            holders.push(None);
            continue;
        }
        let hash = src.hash_unread().map_err(io_error(&src.path))?;
        let held_by_run = manifest
            .runs
            .get(run)
            .is_some_and(|e| e.meta.sources.iter().any(|s| s.hash == hash));
        let holder = if held_by_run {
            Some(run.clone())
        } else {
            manifest.run_with_source_hash(&hash).cloned()
        };
        holders.push(holder.map(|h| (hash, h)));
    }
    Ok(holders)
}

/// The run whose files a new run named by `--run` can share: every source is stored, all in
/// that one run, and that run holds exactly these sources.
fn shareable(
    writer: &gpuq_engine::StoreWriter,
    run: &RunId,
    holders: &[Option<(String, RunId)>],
    opts: &IngestOptions,
    exists: bool,
) -> Option<RunId> {
    if opts.run.is_none() || opts.replace || exists || holders.is_empty() {
        return None;
    }
    let holder = holders[0].as_ref()?.1.clone();
    let mut hashes = Vec::new();
    for h in holders {
        let (hash, r) = h.as_ref()?;
        if *r != holder {
            return None;
        }
        hashes.push(hash.as_str());
    }
    let mut held: Vec<&str> = writer.manifest().runs[&holder]
        .meta
        .sources
        .iter()
        .map(|s| s.hash.as_str())
        .collect();
    hashes.sort_unstable();
    held.sort_unstable();
    (holder != *run && hashes == held).then_some(holder)
}

/// Commits `run` as a run of its own that shares `holder`'s stored files (hard links: no
/// copy, and removing either run leaves the other whole), with this ingest's tags and paths.
#[allow(clippy::too_many_arguments)]
fn share_run(
    mut writer: gpuq_engine::StoreWriter,
    run: &RunId,
    holder: &RunId,
    sources: &[Source],
    hashes: &[&str],
    opts: &IngestOptions,
    mut report: RunReport,
    started: Instant,
) -> Result<RunReport, IngestError> {
    let entry = writer.manifest().runs[holder].clone();
    let staged = entry
        .files
        .iter()
        .map(|f| writer.link_part(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut meta = entry.meta.clone();
    meta.imported_at_ns = now_ns();
    meta.tags = opts.tags.iter().cloned().collect();
    for stored in &mut meta.sources {
        if let Some(i) = hashes.iter().position(|h| *h == stored.hash) {
            stored.path = sources[i].path.display().to_string();
        }
    }
    report.redacted = seal(&mut meta, 0);
    report.files = sources.iter().map(|s| s.files.len()).sum();
    report.input_bytes = sources.iter().map(|s| s.size).sum();
    report.describe(&meta);
    report.shared_from = Some(holder.clone());
    report.version = Some(writer.put_run(run, meta, staged, PutMode::Create)?);
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Commits each of `done` as a run of its own, named after its file (`-2`, `-3`, ... where
/// the name is taken, in the store or by another file: a file of another job must not be
/// appended to a stored run), because the files are not one job (`why`). A file whose rows
/// carry a rank given by its position is parsed again alone, so that it is stored as it
/// would be by itself.
#[allow(clippy::too_many_arguments)]
fn split_run(
    store: &Store,
    mut writer: gpuq_engine::StoreWriter,
    run: &RunId,
    sources: &[Source],
    done: Vec<IngestedFile>,
    opts: &IngestOptions,
    progress: &dyn Progress,
    why: &str,
) -> Result<Vec<RunReport>, IngestError> {
    // With --replace the runs named after the files are replaced.
    let mut taken: BTreeSet<RunId> = if opts.replace {
        BTreeSet::new()
    } else {
        writer.manifest().runs.keys().cloned().collect()
    };
    let mut reports = Vec::new();
    let mut again = Vec::new();
    let mut runs = Vec::new();
    for file in done {
        let src = &sources[file.source];
        let name = file_run_name(&src.path, &mut taken)?;
        if file.positional_rank {
            again.push((name, src.reopen()));
            continue;
        }
        let exists = writer.manifest().runs.contains_key(&name);
        let mut report = RunReport::new(name.clone(), exists && !opts.replace);
        let mut meta = file.meta;
        meta.imported_at_ns = now_ns();
        meta.tags = opts.tags.iter().cloned().collect();
        report.redacted = seal(&mut meta, file.redacted);
        report.describe(&meta);
        report.files = src.files.len();
        report.input_bytes = src.size;
        report.content_bytes = src.content_bytes();
        report.seconds = file.seconds;
        report.last_step = file.last_step;
        report.split_from = Some((run.clone(), why.to_string()));
        reports.push(report);
        runs.push((name, meta, file.staged));
    }
    // One commit: a commit clears the staging area, where the other files' parts still are.
    if !runs.is_empty() {
        let version = writer.put_runs(runs, put_mode(opts))?;
        for report in &mut reports {
            report.version = Some(version);
        }
    }
    // The lock is per open file: release it before the files parsed again take it.
    drop(writer);
    for (name, src) in again {
        for mut report in ingest_run(store, &name, vec![src], opts, progress)? {
            report.split_from = Some((run.clone(), why.to_string()));
            reports.push(report);
        }
    }
    Ok(reports)
}

/// A run name from `path`'s file name that no other file of this ingest took.
fn file_run_name(path: &Path, taken: &mut BTreeSet<RunId>) -> Result<RunId, IngestError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let base = run_named_after(&file_name)?;
    let mut name = base.clone();
    let mut n = 1;
    while taken.contains(&name) {
        n += 1;
        name = RunId::new(&format!("{base}-{n}"))?;
    }
    taken.insert(name.clone());
    Ok(name)
}

/// Parses `src` into `spool` (Kineto: its counters into `counters`, other adapters keep theirs
/// in the trace), the rows' secrets redacted on the way (spools may go to scratch files). An
/// nsys export comes back with its GPU tables still unread: [`finish_file`] reads them once it
/// can attribute their rows.
fn parse_source(
    src: &Source,
    opts: &IngestOptions,
    progress: &dyn Progress,
    run_clock: Option<&stagelog::clock::RunClock>,
    spool: &mut Spool,
    counters: &mut Spool,
    redactor: &redact::Redactor,
) -> Result<(ParsedTrace, Option<nsys::GpuTables>), IngestError> {
    let trace_error = |e| IngestError::Trace {
        path: src.path.clone(),
        error: TraceErrorDisplay(e),
    };
    match src.format {
        Format::Kineto => {
            let reader = src.reader().map_err(io_error(&src.path))?;
            let report = |_: u64| progress.bytes(src.bytes_read());
            let limit = opts.whole_file_limit.unwrap_or(kineto::WHOLE_FILE_LIMIT);
            let steps = opts.step_pattern.as_ref();
            kineto::parse_into(
                reader,
                &report,
                limit,
                steps,
                &mut |b| spool.push(redactor.batch(b)),
                &mut |b| counters.push(redactor.batch(b)),
            )
            .map(|t| (t, None))
            .map_err(trace_error)
        }
        Format::Nsys => {
            let mut nsys_opts = nsys::NsysOptions::default();
            if let Some(p) = &opts.step_pattern {
                nsys_opts.step_pattern = p.clone();
            }
            let report = |fraction: f64| progress.bytes((fraction * src.size as f64) as u64);
            let export = nsys::Export::open(&src.path, &nsys_opts).map_err(trace_error)?;
            let windows = export
                .windows(opts.window_rows.unwrap_or(WINDOW_ROWS))
                .map_err(trace_error)?;
            spool.set_windows(windows, true);
            export
                .read_host(&report, &mut |b| spool.push(redactor.batch(b)))
                .map(|(t, gpu)| (t, Some(gpu)))
                .map_err(trace_error)
        }
        Format::Rocprof => rocprof::parse(&src.files, &mut |b| spool.push(redactor.batch(b)))
            .map(|t| (t, None))
            .map_err(|(path, e)| IngestError::Trace {
                path,
                error: TraceErrorDisplay(e),
            }),
        Format::StageLog => {
            let reader = src.reader().map_err(io_error(&src.path))?;
            stagelog::parse_onto(
                std::io::BufReader::with_capacity(1 << 20, reader),
                opts.lenient,
                opts.stage_log_zone.as_ref(),
                run_clock,
                opts.stage_log_from.filter(|_| src.complete_lines()),
                &mut |b| spool.push(redactor.batch(b)),
            )
            .map(|t| (t, None))
            .map_err(trace_error)
        }
    }
}

struct FinishedFile {
    staged: Vec<StagedFile>,
    meta: RunMeta,
    rank: Option<i32>,
    /// The rank the trace itself declares (`rank` may be the fallback by position).
    declared_rank: Option<i32>,
    redacted: usize,
    last_step: Option<i64>,
    /// A stage log read while it grows: its stages not ended yet.
    open_stages: Option<Vec<gpuq_engine::manifest::OpenStage>>,
}

/// Tables of a file still to read once its rows can be attributed (nsys GPU tables).
struct GpuInput<'a> {
    tables: nsys::GpuTables,
    progress: &'a (dyn Fn(f64) + Sync),
}

/// Scratch files and budgets of a file attributed by windows.
struct WindowScratch {
    /// Spool of host rows by window (Kineto: they are spooled in file order first), and its
    /// bytes held in memory.
    spool: PathBuf,
    spool_budget: usize,
    window_rows: usize,
    /// Scratch file of the attributed launches, and their bytes held in memory before it.
    launch_index: PathBuf,
    launch_budget: usize,
    /// Kineto's `--step-pattern`: ranges it matches are scopes ([`RangeRules::step_pattern`]).
    step_pattern: Option<regex::Regex>,
}

/// Attributes, sorts and writes one parsed file (and reads its remaining GPU tables straight
/// into parts); returns its staged files and metadata.
#[allow(clippy::too_many_arguments)]
fn finish_file(
    writer: &gpuq_engine::StoreWriter,
    mut parsed: ParsedTrace,
    (spool, counter_spool): (Spool, Spool),
    forced_rank: Option<i32>,
    fallback_rank: Option<i32>,
    gpu: Option<GpuInput<'_>>,
    scratch: &WindowScratch,
    redactor: &redact::Redactor,
) -> Result<FinishedFile, IngestError> {
    // A rank given by the user counts as declared: it is the file's own, not a position.
    let declared_rank = forced_rank.or_else(|| {
        parsed
            .top_level
            .get("distributedInfo")
            .and_then(|d| d.get("rank"))
            .and_then(|r| {
                r.as_i64()
                    .or_else(|| r.as_str().and_then(|s| s.parse().ok()))
            })
            .map(|r| r as i32)
    });
    let rank = declared_rank.or(fallback_rank);
    let time_base_ns = parsed.time_base_ns;
    let host = std::mem::take(&mut parsed.host);
    let host_span = host
        .host_span
        .map(|(lo, hi)| (lo + time_base_ns, hi + time_base_ns));
    let ctx = PartContext {
        writer,
        rank,
        time_base_ns,
        host_span,
        redactor,
    };
    // The counters' parts are written beside the events' (they need no attribution), so that
    // they are not left for one core after the events' last part.
    let counters = std::mem::take(&mut parsed.counters);
    let (written, counter_parts) = std::thread::scope(|scope| {
        let counter_parts = scope.spawn(|| write_counters(&ctx, counter_spool, counters));
        let written = match gpu {
            Some(gpu) => write_windowed(&ctx, host, spool, gpu, scratch).map(|(parts, counts)| {
                counts.add_to(&mut parsed);
                parts
            }),
            None if parsed.windowed => {
                let sample = std::mem::take(&mut parsed.host_sample);
                write_kineto_windowed(&ctx, host, sample, spool, scratch)
            }
            None => {
                let resolver = Resolver::new(host);
                let parallel = rayon::current_num_threads().max(1);
                let rows = spool.rows();
                spool
                    .drain()
                    .map_err(io_error(Path::new("spool")))
                    .and_then(|frames| {
                        ctx.write_parts(
                            &resolver,
                            part_groups(frames, rows, parallel),
                            |f| f.decode(),
                            parallel,
                        )
                    })
            }
        };
        let counter_parts = counter_parts
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (written, counter_parts)
    });
    let written = written?;
    let counter_parts = counter_parts?;
    let ParsedTrace {
        mut top_level,
        mut warnings,
        events,
        kernels,
        epoch_time: parsed_epoch_time,
        open_stages,
        ..
    } = parsed;
    let world_size = top_level
        .get("distributedInfo")
        .and_then(|d| d.get("world_size"))
        .and_then(|w| w.as_i64());
    let device_entries: Vec<(i64, String)> = top_level
        .get("deviceProperties")
        .and_then(|d| d.as_array())
        .map(|list| {
            list.iter()
                .filter_map(|d| {
                    Some((d.get("id")?.as_i64()?, d.get("name")?.as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    top_level.remove("deviceProperties");
    let mut metadata = serde_json::Value::Object(top_level);
    let redacted = redact::redact(&mut metadata) + redactor.count();

    let mut facts = FileSpan::default();
    let mut staged = Vec::with_capacity(written.len() + 1);
    for (file, f) in written {
        staged.push(file);
        facts.merge(f);
    }
    if facts.gpu_outside_host > 0 {
        *warnings
            .entry("GPU events more than 10 s outside the host time range (CUPTI timestamp corruption?)".into())
            .or_default() += facts.gpu_outside_host;
    }
    staged.extend(counter_parts);
    let used: Vec<i64> = facts.devices.iter().map(|&d| d as i64).collect();
    let (device_names, naming) = devices::device_names(&device_entries, &used);
    if let Some(w) = naming {
        *warnings.entry(w).or_default() += 1;
    }
    let devices = facts
        .devices
        .iter()
        .map(|&id| DeviceInfo {
            rank,
            id,
            name: device_names.get(&(id as i64)).cloned().unwrap_or_default(),
        })
        .collect();
    let meta = RunMeta {
        ranks: rank.into_iter().collect(),
        world_size,
        devices,
        first_ts: facts.first_ts,
        last_ts: facts.last_ts,
        events,
        kernels,
        epoch_time: parsed_epoch_time,
        metadata,
        warnings,
        ..Default::default()
    };
    Ok(FinishedFile {
        staged,
        meta,
        rank,
        declared_rank,
        redacted,
        last_step: facts.last_step,
        open_stages,
    })
}

/// The files of a source read from several (a rocprofv3 output), each with its size now;
/// none for a source of one file.
fn members_of(src: &Source) -> Vec<SourceMember> {
    if src.files.len() < 2 {
        return Vec::new();
    }
    src.files
        .iter()
        .map(|f| SourceMember {
            path: f.display().to_string(),
            bytes: std::fs::metadata(f).map(|m| m.len()).unwrap_or(0),
        })
        .collect()
}

/// Merges the rocprofv3 CSV sources of each directory into one source (one rocprofv3 output);
/// other sources are kept as they are, in order.
fn group_rocprof(sources: Vec<Source>) -> Vec<Source> {
    let mut out: Vec<Source> = Vec::with_capacity(sources.len());
    for src in sources {
        if src.format == Format::Rocprof {
            let dir = src.path.parent().map(Path::to_path_buf);
            if let Some(group) = out.iter_mut().find(|o| {
                o.format == Format::Rocprof && o.path.parent().map(Path::to_path_buf) == dir
            }) {
                group.files.extend(src.files);
                group.files.sort();
                group.size += src.size;
                continue;
            }
        }
        out.push(src);
    }
    for o in &mut out {
        if o.format == Format::Rocprof && o.files.len() > 1 {
            if let Some(dir) = o.path.parent() {
                o.path = dir.to_path_buf();
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
