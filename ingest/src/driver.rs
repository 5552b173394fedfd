//! Ingesting trace files into a store as runs: which files form a run (plausibly one job's
//! ranks, else one run per file), content already stored (skipped, or shared under a new
//! name), and what each run's summary reports.

use crate::events::{HostStructure, Kind, Launch, RangeRules};
use crate::kineto;
use crate::launches::LaunchIndexWriter;
use crate::nsys;
use crate::part_bytes;
use crate::redact;
use crate::resolve::{resolve_counters, Resolver};
use crate::rocprof;
use crate::source::{self, DetectError, Format, Source};
use crate::spool::{self, RowSample, Spool};
use crate::stagelog;
use crate::trace::{ParsedTrace, TraceError};
use datafusion::arrow::array::{Array, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use gpuq_engine::manifest::{DeviceInfo, RunMeta, SourceFile};
use gpuq_engine::schema::TableKind;
use gpuq_engine::store::{PutMode, StagedFile};
use gpuq_engine::{RunId, Store};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
    #[error("{}: no trace files in this directory (tried: {})", .0.display(), source::TRIED)]
    EmptyDirectory(PathBuf),
    #[error("{} and {} do not look like one job ({why}); ingest them without --run (one run \
             each), or pass --merge-unrelated to store them as one run", a.display(), b.display())]
    Unrelated { a: PathBuf, b: PathBuf, why: String },
    #[error(transparent)]
    Store(#[from] gpuq_engine::Error),
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
    /// [`crate::launches::DEFAULT_MEMORY_BUDGET`].
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
                Ok(s) => sources.push(s),
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
        planned.push((run, source::group_rocprof(sources)));
    }
    let mut reports = Vec::new();
    for (run, sources) in planned {
        reports.extend(ingest_run(store, &run, sources, opts, progress)?);
    }
    Ok(reports)
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
                .unwrap_or(crate::launches::DEFAULT_MEMORY_BUDGET),
            step_pattern: opts.step_pattern.clone(),
        };
        let spools = (spool, counters);
        let file = finish_file(
            &writer,
            parsed,
            spools,
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
        meta.sources.push(SourceFile {
            path: src.path.display().to_string(),
            hash,
            bytes: src.size,
            rank: file.rank,
            format: src.format.name().into(),
        });
        done.push(IngestedFile {
            source: position,
            staged: file.staged,
            meta,
            declared_rank: file.declared_rank,
            positional_rank: file.declared_rank.is_none() && file.rank.is_some(),
            redacted: file.redacted,
            seconds: file_started.elapsed().as_secs_f64(),
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
        let hash = source::hash_file(&src.path).map_err(io_error(&src.path))?;
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
    let mut meta = entry.meta;
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
fn finish_file(
    writer: &gpuq_engine::StoreWriter,
    mut parsed: ParsedTrace,
    (spool, counter_spool): (Spool, Spool),
    fallback_rank: Option<i32>,
    gpu: Option<GpuInput<'_>>,
    scratch: &WindowScratch,
    redactor: &redact::Redactor,
) -> Result<FinishedFile, IngestError> {
    let declared_rank = parsed
        .top_level
        .get("distributedInfo")
        .and_then(|d| d.get("rank"))
        .and_then(|r| {
            r.as_i64()
                .or_else(|| r.as_str().and_then(|s| s.parse().ok()))
        })
        .map(|r| r as i32);
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

    let mut facts = Facts::default();
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
    let (device_names, naming) = crate::devices::device_names(&device_entries, &used);
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
    })
}

/// Writes a file's counters (those the adapter kept, then those it spooled) as parts.
fn write_counters(
    ctx: &PartContext<'_>,
    mut spool: Spool,
    kept: Vec<RecordBatch>,
) -> Result<Vec<StagedFile>, IngestError> {
    let (rank, time_base_ns) = (ctx.rank, ctx.time_base_ns);
    for b in kept {
        spool
            .push(b)
            .map_err(io_error(Path::new("counter spool")))?;
    }
    let rows = spool.rows();
    let frames = spool
        .drain()
        .map_err(io_error(Path::new("counter spool")))?;
    let mut staged = Vec::new();
    for group in part_groups(frames, rows, 1) {
        let counters = group
            .and_then(|group| {
                group
                    .iter()
                    .map(|f| resolve_counters(&f.decode()?, rank, time_base_ns))
                    .collect::<std::io::Result<Vec<RecordBatch>>>()
            })
            .map_err(io_error(Path::new("counter spool")))?;
        staged.push(ctx.write(TableKind::Counters, counters)?);
    }
    Ok(staged)
}

/// Where and how one file's parts are written.
struct PartContext<'a> {
    writer: &'a gpuq_engine::StoreWriter,
    rank: Option<i32>,
    time_base_ns: i64,
    host_span: Option<(i64, i64)>,
    /// Every part's texts pass through it on their way to the store.
    redactor: &'a redact::Redactor,
}

impl PartContext<'_> {
    /// Writes `batches` as a part of `table`, their secrets redacted.
    fn write(
        &self,
        table: TableKind,
        batches: Vec<RecordBatch>,
    ) -> Result<StagedFile, gpuq_engine::Error> {
        let batches = batches
            .into_iter()
            .map(|b| self.redactor.batch(b))
            .collect();
        self.writer.write_part(table, batches)
    }

    /// Attributes and writes each group of `groups` (spool frames or batches) as a part, on
    /// `parallel` workers that each take the next group as soon as their part is written (no
    /// round waits for its slowest part; one worker reads the next group's frames while the
    /// others encode). Each part's batches are freed once it is written, so memory stays near
    /// that of the parts in flight. The parts come back in the order of their groups.
    fn write_parts<T: Send + Sync>(
        &self,
        resolver: &Resolver,
        groups: impl Iterator<Item = std::io::Result<Vec<T>>> + Send,
        batch: impl Fn(&T) -> std::io::Result<RecordBatch> + Sync,
        parallel: usize,
    ) -> Result<Vec<(StagedFile, Facts)>, IngestError> {
        let groups = Mutex::new(groups.enumerate());
        let written = Mutex::new(Vec::new());
        let failure: Mutex<Option<IngestError>> = Mutex::new(None);
        let write = |group: Vec<T>| -> Result<Vec<(StagedFile, Facts)>, IngestError> {
            let resolved = group
                .par_iter()
                .with_max_len(1)
                .map(|item| resolver.resolve(&batch(item)?, self.rank, self.time_base_ns))
                .collect::<std::io::Result<Vec<RecordBatch>>>()
                .map_err(io_error(Path::new("spool")))?;
            drop(group);
            part_bytes::split(resolved, part_bytes::PART_STRING_BYTES)
                .into_iter()
                .map(|part| {
                    let facts = Facts::of(&part, self.host_span);
                    Ok((self.write(TableKind::Events, part)?, facts))
                })
                .collect()
        };
        let worker = || loop {
            if lock(&failure).is_some() {
                return;
            }
            let next = lock(&groups).next();
            let outcome = match next {
                None => return,
                Some((i, Ok(group))) => write(group).map(|part| (i, part)),
                Some((_, Err(e))) => Err(io_error(Path::new("spool"))(e)),
            };
            match outcome {
                Ok(part) => lock(&written).push(part),
                Err(e) => {
                    lock(&failure).get_or_insert(e);
                    return;
                }
            }
        };
        rayon::scope(|scope| {
            for _ in 0..parallel.max(1) {
                scope.spawn(|_| worker());
            }
        });
        if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        let mut written = written.into_inner().unwrap_or_else(|e| e.into_inner());
        written.sort_unstable_by_key(|(i, _)| *i);
        Ok(written.into_iter().flat_map(|(_, parts)| parts).collect())
    }
}

/// The number of parts for `rows` rows: at most about [`PART_ROWS`] each, and a multiple of
/// the `cores` writing them, so that the cores' last parts finish together.
fn part_count(rows: usize, cores: usize) -> usize {
    match rows.div_ceil(PART_ROWS) {
        0 | 1 => 1,
        n => n.next_multiple_of(cores.max(1)),
    }
}

/// Consecutive spool frames (`rows` in all) in [`part_count`] groups of about equal rows: a
/// group ends with the frame whose middle row reaches its share (whole frames).
fn part_groups(
    frames: impl Iterator<Item = std::io::Result<spool::Frame>>,
    rows: usize,
    cores: usize,
) -> impl Iterator<Item = std::io::Result<Vec<spool::Frame>>> {
    let count = part_count(rows, cores);
    let mut frames = frames.peekable();
    let (mut group_index, mut done) = (0, 0);
    std::iter::from_fn(move || {
        group_index += 1;
        let end = if group_index >= count {
            usize::MAX
        } else {
            group_index * rows / count
        };
        let mut group = Vec::new();
        while let Some(next) = frames
            .next_if(|f| group.is_empty() || f.as_ref().map_or(true, |f| done + f.rows() / 2 < end))
        {
            match next {
                Ok(f) => {
                    done += f.rows();
                    group.push(f);
                }
                Err(e) => return Some(Err(e)),
            }
        }
        (!group.is_empty()).then_some(Ok(group))
    })
}

/// A window's batches in [`part_count`] parts of equal rows (batches are sliced where a part
/// ends), so that the window's last parts finish together.
fn window_groups(batches: Vec<RecordBatch>) -> Vec<Vec<RecordBatch>> {
    let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let count = part_count(total, rayon::current_num_threads());
    // Group `g` ends at row `(g + 1) * total / count`; a batch across that end is sliced.
    let mut groups: Vec<Vec<RecordBatch>> = vec![Vec::new(); count];
    let mut g = 0;
    let mut done = 0;
    for b in batches {
        let mut offset = 0;
        while offset < b.num_rows() {
            let room = if g + 1 == count {
                usize::MAX
            } else {
                (g + 1) * total / count - done
            };
            if room == 0 {
                g += 1;
                continue;
            }
            let take = room.min(b.num_rows() - offset);
            groups[g].push(b.slice(offset, take));
            offset += take;
            done += take;
        }
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// What attributing an export's host rows window by window carries from one window to the next.
struct WindowState {
    windows: spool::Windows,
    /// How the adapter's ranges are read from its rows.
    ranges: RangeRules,
    /// By window, the launches no row holds ([`HostStructure::unstored_launches`]).
    unstored_launches: Vec<Vec<Launch>>,
    /// Names and threads of all windows so far; the ranges still open.
    host: HostStructure,
    /// `host.names` as the resolvers' dictionary values.
    names_array: Arc<StringArray>,
    steps: Vec<crate::events::Step>,
    per_process: bool,
    launches: LaunchIndexWriter,
}

impl WindowState {
    /// Window `w`'s rows and its resolver (which attributed the window's launches into the
    /// index); windows are prepared in order. Keeps the ranges still open at the next
    /// window's start for it.
    fn prepare(&mut self, w: usize) -> Result<(Vec<RecordBatch>, Resolver), IngestError> {
        let frames = self.windows.take(w).map_err(io_error(Path::new("spool")))?;
        let batches = frames
            .par_iter()
            .map(spool::Frame::decode)
            .collect::<std::io::Result<Vec<RecordBatch>>>()
            .map_err(io_error(Path::new("spool")))?;
        drop(frames);
        // Each batch's ranges and launches on all cores, then joined (few names and threads
        // to translate).
        let found: Vec<HostStructure> = batches
            .par_iter()
            .map(|b| {
                let mut host = HostStructure::default();
                crate::events::host_structure(b, &mut host, &self.ranges);
                host
            })
            .collect();
        for host in found {
            self.host.absorb(host);
        }
        let unstored = std::mem::take(&mut self.unstored_launches[w]);
        self.host.launches.extend(unstored);
        if self.host.names.names().len() != self.names_array.len() {
            self.names_array = Arc::new(StringArray::from_iter_values(
                self.host.names.names().iter().map(|n| &**n),
            ));
        }
        let mut resolver = Resolver::window(
            self.names_array.clone(),
            self.host.threads.clone(),
            std::mem::take(&mut self.host.intervals),
            std::mem::take(&mut self.host.launches),
            self.steps.clone(),
            self.per_process,
        );
        let launches = resolver.take_launches();
        let path = self.launches.path().to_path_buf();
        self.launches.push_run(&launches).map_err(io_error(&path))?;
        // The ranges still open go on to the process's next window.
        let starts = self.windows.starts();
        if let Some(&(_, next)) = starts.get(w + 1).filter(|n| n.0 == starts[w].0) {
            self.host.intervals = resolver.open_intervals(next);
        }
        Ok((batches, resolver))
    }
}

/// Attributes and writes host rows waiting in `windows` (one process, a stretch of time),
/// finding each window's ranges (by the adapter's `ranges`) and launch calls in its rows. Each window is attributed
/// with its own ranges and those of its process still open, and its launches go to a launch
/// index (compact, in memory up to a budget, then in a scratch file): memory holds three
/// windows, not the whole file's ranges and launches. Returns the parts written and the
/// resolver through which GPU rows find their launches in the index.
fn write_windows(
    ctx: &PartContext<'_>,
    host: HostStructure,
    windows: spool::Windows,
    ranges: RangeRules,
    scratch: &WindowScratch,
) -> Result<(Vec<(StagedFile, Facts)>, Resolver), IngestError> {
    let HostStructure {
        names,
        threads,
        steps,
        correlation_per_process,
        unstored_launches: unstored,
        ..
    } = host;
    let mut unstored_launches = vec![Vec::new(); windows.len()];
    for launch in unstored {
        // Windows go by time alone where launches are not rows (Kineto).
        unstored_launches[windows.window_of(0, launch.ts)].push(launch);
    }
    let mut state = WindowState {
        windows,
        ranges,
        unstored_launches,
        host: HostStructure {
            names,
            threads,
            ..Default::default()
        },
        names_array: Arc::new(StringArray::from(Vec::<&str>::new())),
        steps,
        per_process: correlation_per_process,
        launches: LaunchIndexWriter::new(scratch.launch_index.clone(), scratch.launch_budget),
    };
    // Windows are prepared (decoded, their ranges sorted and launches attributed: mostly
    // serial work) on a thread of their own, up to two ahead of the window being written, so
    // that the writing seldom waits for it.
    let mut written = Vec::new();
    let state = std::thread::scope(|scope| -> Result<WindowState, IngestError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let preparer = scope.spawn(move || -> Result<WindowState, IngestError> {
            for w in 0..state.windows.len() {
                let prepared = state.prepare(w)?;
                if tx.send(prepared).is_err() {
                    break; // the writer failed; it reports why
                }
            }
            Ok(state)
        });
        let mut write_error = None;
        for (batches, resolver) in rx {
            let groups = window_groups(batches);
            let parallel = groups.len();
            match ctx.write_parts(
                &resolver,
                groups.into_iter().map(Ok),
                |b| Ok(b.clone()),
                parallel,
            ) {
                Ok(parts) => written.extend(parts),
                Err(e) => {
                    write_error = Some(e);
                    break;
                }
            }
        }
        let state = preparer.join().unwrap_or_else(|_| {
            Err(IngestError::Io {
                path: PathBuf::new(),
                error: std::io::Error::other("the window thread panicked"),
            })
        });
        match write_error {
            Some(e) => Err(e),
            None => state,
        }
    })?;
    let WindowState {
        host,
        names_array,
        steps,
        per_process,
        launches,
        ..
    } = state;
    let index = launches.finish().map_err(io_error(&scratch.launch_index))?;
    let resolver = Resolver::window(
        names_array,
        host.threads,
        Vec::new(),
        Vec::new(),
        steps,
        per_process,
    )
    .with_launch_index(index);
    Ok((written, resolver))
}

/// Attributes and writes a Kineto trace too large to attribute at once, its rows waiting in
/// `spool` in file order. Two passes over the spool: the host rows go to a second spool by
/// time window (chosen from `sample`), which [`write_windows`] attributes and writes; then
/// the GPU rows find their launches in the launch index.
fn write_kineto_windowed(
    ctx: &PartContext<'_>,
    host: HostStructure,
    sample: RowSample,
    spool: Spool,
    scratch: &WindowScratch,
) -> Result<Vec<(StagedFile, Facts)>, IngestError> {
    let spool_error = || io_error(Path::new("spool"));
    let mut frames = spool.into_replay().map_err(spool_error())?;
    // Both spools share the budget.
    let budget = scratch.spool_budget.saturating_sub(frames.memory_bytes());
    let mut by_window = Spool::new(scratch.spool.clone(), budget);
    // By time alone: windows in time order hold a correlation id's earliest launch first,
    // as attributing the whole file at once finds it (Kineto's ids are not per process).
    let starts = spool::window_starts(sample.by_process(), scratch.window_rows);
    by_window.set_windows(starts, false);
    // A core's worth of frames decoded at a time, their host rows then pushed in order.
    let parallel = rayon::current_num_threads().max(1);
    let mut all = frames.frames();
    loop {
        let round = all
            .by_ref()
            .take(parallel)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(spool_error())?;
        if round.is_empty() {
            break;
        }
        let host_rows = round
            .par_iter()
            .map(|f| rows_where(&f.decode()?, |kind| !kind.is_some_and(Kind::is_gpu)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(spool_error())?;
        for batch in host_rows.into_iter().flatten() {
            by_window.push(batch).map_err(spool_error())?;
        }
    }
    drop(all);
    let windows = by_window.into_windows().map_err(spool_error())?;
    let ranges = RangeRules {
        step_pattern: scratch.step_pattern.clone(),
        ..kineto::RANGES
    };
    let (mut written, resolver) = write_windows(ctx, host, windows, ranges, scratch)?;
    // Parts of a quarter of the usual rows: a part is gathered from the GPU rows of many
    // small frames, and writing such parts of 256 K rows two at a time peaked at 650 MB
    // against 330 MB at 64 K (1 GB trace, measured), and was slower.
    let direct = DirectParts::new(ctx, &resolver, PART_ROWS / 4);
    let read = frames.frames().par_bridge().try_for_each(|frame| {
        let gpu_rows =
            frame.and_then(|f| rows_where(&f.decode()?, |kind| kind.is_some_and(Kind::is_gpu)));
        match gpu_rows {
            Ok(Some(batch)) => direct.push(batch).map_err(|()| None),
            Ok(None) => Ok(()),
            Err(e) => Err(Some(e)),
        }
    });
    let parts = direct.finish()?;
    if let Err(Some(e)) = read {
        return Err(IngestError::Io {
            path: PathBuf::from("spool"),
            error: e,
        });
    }
    written.extend(parts);
    Ok(written)
}

/// The rows of `batch` whose kind passes `keep` (`None`: no such row).
fn rows_where(
    batch: &RecordBatch,
    keep: impl Fn(Option<Kind>) -> bool,
) -> std::io::Result<Option<RecordBatch>> {
    let (kinds, kind_of) = crate::events::kinds_of(batch);
    let kept: Vec<bool> = kind_of.iter().map(|&k| keep(k)).collect();
    if batch.num_rows() == 0 {
        return Ok(None);
    }
    if kept.iter().all(|&k| k) {
        return Ok(Some(batch.clone()));
    }
    if !kept.iter().any(|&k| k) {
        return Ok(None);
    }
    let mask: BooleanArray = kinds
        .keys()
        .iter()
        .map(|k| Some(k.is_some_and(|k| kept[k as usize])))
        .collect();
    // A dictionary may hold kinds no row has: the filter can keep nothing.
    let kept = filter_record_batch(batch, &mask).map_err(std::io::Error::other)?;
    Ok((kept.num_rows() > 0).then_some(kept))
}

/// Attributes and writes an Nsight Systems export whose host rows wait in `spool` by window
/// ([`write_windows`]), then reads and writes its GPU tables, whose rows find their launches in
/// the launch index.
fn write_windowed(
    ctx: &PartContext<'_>,
    host: HostStructure,
    spool: Spool,
    gpu: GpuInput<'_>,
    scratch: &WindowScratch,
) -> Result<(Vec<(StagedFile, Facts)>, nsys::Counts), IngestError> {
    let windows = spool.into_windows().map_err(io_error(Path::new("spool")))?;
    let (mut written, resolver) = write_windows(ctx, host, windows, nsys::RANGES, scratch)?;
    let direct = DirectParts::new(ctx, &resolver, PART_ROWS);
    let counts = gpu.tables.read(gpu.progress, &|b| direct.push(b));
    match (counts, direct.finish()) {
        (Err(Some(e)), _) => Err(IngestError::Trace {
            path: PathBuf::new(),
            error: TraceErrorDisplay(e),
        }),
        (_, Err(e)) => Err(e),
        // Only a write error stops the reading, and it was returned above.
        (Err(None), Ok(_)) => Err(IngestError::Io {
            path: PathBuf::new(),
            error: std::io::Error::other("reading the GPU tables stopped"),
        }),
        (Ok(counts), Ok(parts)) => {
            written.extend(parts);
            Ok((written, counts))
        }
    }
}

/// Attributes batches as they come (from several threads) and writes them in parts of about
/// `part_rows` rows.
struct DirectParts<'a> {
    ctx: &'a PartContext<'a>,
    resolver: &'a Resolver,
    /// Rows a part is written at.
    part_rows: usize,
    /// Attributed batches not yet written, and their rows.
    pending: Mutex<(Vec<RecordBatch>, usize)>,
    written: Mutex<Vec<(StagedFile, Facts)>>,
    /// The first write error; `push` fails from then on.
    error: Mutex<Option<IngestError>>,
}

impl<'a> DirectParts<'a> {
    fn new(ctx: &'a PartContext<'a>, resolver: &'a Resolver, part_rows: usize) -> Self {
        DirectParts {
            ctx,
            resolver,
            part_rows,
            pending: Mutex::new((Vec::new(), 0)),
            written: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        }
    }

    fn push(&self, batch: RecordBatch) -> Result<(), ()> {
        if lock(&self.error).is_some() {
            return Err(());
        }
        let resolved = match self
            .resolver
            .resolve(&batch, self.ctx.rank, self.ctx.time_base_ns)
        {
            Ok(resolved) => resolved,
            Err(e) => {
                lock(&self.error).get_or_insert(IngestError::Io {
                    path: PathBuf::from("launch index"),
                    error: e,
                });
                return Err(());
            }
        };
        drop(batch);
        let full = {
            let mut pending = lock(&self.pending);
            pending.1 += resolved.num_rows();
            pending.0.push(resolved);
            (pending.1 >= self.part_rows).then(|| {
                pending.1 = 0;
                std::mem::take(&mut pending.0)
            })
        };
        match full {
            Some(group) => self.write(group),
            None => Ok(()),
        }
    }

    fn write(&self, group: Vec<RecordBatch>) -> Result<(), ()> {
        for part in part_bytes::split(group, part_bytes::PART_STRING_BYTES) {
            let facts = Facts::of(&part, self.ctx.host_span);
            match self.ctx.write(TableKind::Events, part) {
                Ok(file) => lock(&self.written).push((file, facts)),
                Err(e) => {
                    lock(&self.error).get_or_insert(e.into());
                    return Err(());
                }
            }
        }
        Ok(())
    }

    /// Writes what is pending; the parts written, or the first error.
    fn finish(self) -> Result<Vec<(StagedFile, Facts)>, IngestError> {
        let rest = std::mem::take(&mut lock(&self.pending).0);
        if !rest.is_empty() && lock(&self.error).is_none() {
            let _ = self.write(rest);
        }
        if let Some(e) = lock(&self.error).take() {
            return Err(e);
        }
        Ok(std::mem::take(&mut *lock(&self.written)))
    }
}

/// A mutex's value, also after a panic elsewhere (the data stays consistent: every critical
/// section here is a push or a take, or the next group of [`PartContext::write_parts`], whose
/// panic ends the ingest anyway).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Span, devices and host/GPU time ranges of a file's events.
#[derive(Default)]
struct Facts {
    first_ts: Option<i64>,
    last_ts: Option<i64>,
    devices: BTreeSet<i32>,
    /// GPU events starting more than [`Facts::MARGIN_NS`] outside the host events' span.
    gpu_outside_host: u64,
}

impl Facts {
    fn merge(&mut self, o: Facts) {
        let min = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.first_ts = min(self.first_ts, o.first_ts);
        self.last_ts = self.last_ts.max(o.last_ts);
        self.devices.extend(o.devices);
        self.gpu_outside_host += o.gpu_outside_host;
    }

    const MARGIN_NS: i64 = 10_000_000_000;

    /// Facts of resolved batches; `host_span` is the host events' span in the same time base.
    fn of(batches: &[RecordBatch], host_span: Option<(i64, i64)>) -> Facts {
        let mut f = Facts::default();
        for b in batches {
            let (kinds, kind_of) = crate::events::kinds_of(b);
            let ts = b
                .column_by_name("ts")
                .expect("ts")
                .as_primitive::<Int64Type>();
            let dur = b
                .column_by_name("dur")
                .expect("dur")
                .as_primitive::<Int64Type>();
            let device = b
                .column_by_name("device")
                .expect("device")
                .as_primitive::<Int32Type>();
            for i in 0..b.num_rows() {
                let (t, end) = (ts.value(i), ts.value(i) + dur.value(i).max(0));
                f.first_ts = Some(f.first_ts.map_or(t, |v| v.min(t)));
                f.last_ts = Some(f.last_ts.map_or(end, |v| v.max(end)));
                if kind_of[kinds.keys().value(i) as usize].is_some_and(Kind::is_gpu) {
                    if !device.is_null(i) {
                        f.devices.insert(device.value(i));
                    }
                    if let Some((lo, hi)) = host_span {
                        if t < lo - Self::MARGIN_NS || t > hi + Self::MARGIN_NS {
                            f.gpu_outside_host += 1;
                        }
                    }
                }
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stored row of a run, in a canonical order, as text.
    fn stored_rows(store: &Store, run: &str) -> Vec<String> {
        let manifest = store.manifest().unwrap();
        let entry = &manifest.runs[&RunId::new(run).unwrap()];
        let mut rows = Vec::new();
        for f in entry.files.iter().filter(|f| f.table == TableKind::Events) {
            let path = store.paths().absolute(&f.path);
            for b in gpuq_engine::part::read_parquet(f.table, &path).unwrap() {
                let columns: Vec<_> = (0..b.num_columns())
                    .map(|c| {
                        datafusion::arrow::util::display::ArrayFormatter::try_new(
                            b.column(c).as_ref(),
                            &Default::default(),
                        )
                        .unwrap()
                    })
                    .collect();
                for i in 0..b.num_rows() {
                    let row: Vec<String> = columns.iter().map(|c| c.value(i).to_string()).collect();
                    rows.push(row.join("|"));
                }
            }
        }
        rows.sort_unstable();
        rows
    }

    #[test]
    fn a_spilled_spool_stores_the_same_rows_as_one_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.json");
        let cfg = crate::synth::SynthConfig {
            steps: 6,
            ..crate::synth::SynthConfig::small()
        };
        crate::synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
        // Two stores: the same file twice in one store would be skipped as already stored.
        let mut rows = Vec::new();
        for (store_dir, budget) in [("memory", None), ("spilled", Some(0))] {
            let store = Store::open(dir.path().join(store_dir)).unwrap();
            let opts = IngestOptions {
                run: Some(RunId::new("r").unwrap()),
                spool_budget: budget,
                ..Default::default()
            };
            ingest(&store, std::slice::from_ref(&trace), &opts, &NoProgress).unwrap();
            rows.push(stored_rows(&store, "r"));
            // Nothing is left in the staging area.
            let staging = std::fs::read_dir(store.paths().staging_dir())
                .map(|d| d.count())
                .unwrap_or(0);
            assert_eq!(staging, 0, "{store_dir}");
        }
        assert!(rows[0].len() > 100, "{} rows", rows[0].len());
        assert_eq!(rows[0], rows[1]);
    }

    #[test]
    fn spool_frames_are_grouped_into_parts_of_about_equal_rows_in_order() {
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let mut next = 0;
        let frames: Vec<spool::Frame> = (0..23)
            .map(|i| {
                let rows = 20_000 + 3_000 * (i % 5);
                let values = Int64Array::from_iter_values(next..next + rows);
                next += rows;
                let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).unwrap();
                spool::Frame::encode(&batch).unwrap()
            })
            .collect();
        let total = next as usize;
        for cores in [1, 2, 3] {
            let groups: Vec<Vec<spool::Frame>> =
                part_groups(frames.clone().into_iter().map(Ok), total, cores)
                    .collect::<std::io::Result<_>>()
                    .unwrap();
            let count = total.div_ceil(PART_ROWS).next_multiple_of(cores);
            assert_eq!(groups.len(), count, "{cores} cores");
            // Whole frames: a part is off its share by at most one frame's rows.
            for g in &groups {
                let rows: usize = g.iter().map(spool::Frame::rows).sum();
                assert!(rows.abs_diff(total / count) <= 32_000, "{rows} rows");
            }
            let got: Vec<i64> = groups
                .iter()
                .flatten()
                .flat_map(|f| {
                    f.decode()
                        .unwrap()
                        .column(0)
                        .as_primitive::<Int64Type>()
                        .values()
                        .to_vec()
                })
                .collect();
            assert_eq!(got, (0..next).collect::<Vec<_>>(), "{cores} cores");
        }
        // Fewer rows than a part: one group, whatever the cores.
        let one = part_groups(frames.into_iter().take(2).map(Ok), 43_000, 2).count();
        assert_eq!(one, 1);
    }

    #[test]
    fn a_window_is_cut_into_parts_of_equal_rows_in_order() {
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batches: Vec<RecordBatch> = (0..11)
            .map(|i| {
                let values = Int64Array::from_iter_values(i * 60_000..(i + 1) * 60_000 - 7 * i);
                RecordBatch::try_new(schema.clone(), vec![Arc::new(values)]).unwrap()
            })
            .collect();
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let want: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        let groups = window_groups(batches);
        let cores = rayon::current_num_threads().max(1);
        assert!(
            groups.len() >= 2 && groups.len() % cores == 0,
            "{} parts",
            groups.len()
        );
        let rows: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(RecordBatch::num_rows).sum())
            .collect();
        assert!(
            rows.iter().all(|&r| r.abs_diff(total / groups.len()) <= 1),
            "{rows:?}"
        );
        let got: Vec<i64> = groups
            .iter()
            .flatten()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(got, want);
        // Few rows make one part.
        let small =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
        assert_eq!(window_groups(vec![small]).len(), 1);
    }

    /// An nsys export attributed in many small time windows (ranges open across windows,
    /// launches looked up in many runs) stores exactly what one window stores.
    #[test]
    fn nsys_rows_attributed_in_time_windows_equal_those_of_one_window() {
        let dir = tempfile::tempdir().unwrap();
        let export = dir.path().join("report.sqlite");
        crate::synth_nsys::write_nsys(&crate::synth_nsys::NsysConfig::small(), &export).unwrap();
        let windows = |window_rows, spool_budget| IngestOptions {
            window_rows: Some(window_rows),
            spool_budget,
            ..Default::default()
        };
        let rows = assert_windows_change_nothing(
            &export,
            IngestOptions::default(),
            &[
                ("windows of 300 rows", windows(300, None)),
                ("spilled windows of 1000 rows", windows(1000, Some(0))),
            ],
        );
        assert!(rows.len() > 5000, "{} rows", rows.len());
        assert!(attributed_kernels(&rows) > 1000);
    }

    #[test]
    fn kineto_rows_attributed_in_time_windows_equal_those_of_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.json");
        let cfg = crate::synth::SynthConfig {
            steps: 12,
            streams: 3,
            nccl: true,
            ..crate::synth::SynthConfig::small()
        };
        crate::synth::write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
        let configs = kineto_windows(IngestOptions::default());
        let rows = assert_windows_change_nothing(&trace, IngestOptions::default(), &configs);
        assert!(rows.len() > 5000, "{} rows", rows.len());
        assert!(attributed_kernels(&rows) > 1000);
        // The real traces' shapes: string pids, ROCm, CUDA graphs, several processes, ...
        let shared = crate::test_util::shared_traces("kineto");
        let mut real = Vec::new();
        let mut dirs = vec![shared];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if crate::source::Source::open(&path, None)
                    .is_ok_and(|s| s.format == crate::source::Format::Kineto)
                {
                    real.push(path);
                }
            }
        }
        if real.is_empty() {
            eprintln!("SKIPPED: ../shared/traces/kineto not found; generated trace only");
        }
        for path in real {
            let rows =
                assert_windows_change_nothing(&path, IngestOptions::default(), &configs[..2]);
            assert!(!rows.is_empty(), "{}", path.display());
        }
    }

    /// Kineto ingests by windows (of 300 and 1000 rows, spilled, one window, and windows after
    /// some ranges were kept), with the options of `whole`.
    fn kineto_windows(whole: IngestOptions) -> Vec<(&'static str, IngestOptions)> {
        let windows = |window_rows, spool_budget| IngestOptions {
            whole_file_limit: Some(0),
            window_rows: Some(window_rows),
            spool_budget,
            ..whole.clone()
        };
        vec![
            ("windows of 300 rows", windows(300, None)),
            ("spilled windows of 1000 rows", windows(1000, Some(0))),
            ("one window", windows(usize::MAX, None)),
            (
                "windows after 500 ranges and launches were kept",
                IngestOptions {
                    whole_file_limit: Some(500),
                    ..windows(700, None)
                },
            ),
        ]
    }

    /// Column `name` of a row of [`stored_rows`].
    fn field<'a>(row: &'a str, name: &str) -> &'a str {
        let index = TableKind::Events.file_schema().index_of(name).unwrap();
        row.split('|').nth(index).unwrap()
    }

    /// Ranges that `--step-pattern` makes steps are scopes, not operators, also where a trace
    /// is attributed by windows (as operator rows, `cpu_op`, they would otherwise be the
    /// kernels' operators).
    #[test]
    fn step_pattern_scopes_are_the_same_by_windows() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.json");
        let mut events = Vec::new();
        for i in 0..400 {
            let t = 1000 + 100 * i;
            let event = |cat: &str, name: &str, ts: i64, dur: i64, args: &str| {
                format!(
                    r#"{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, "args": {{{args}}}}}"#
                )
            };
            events.push(event("cpu_op", &format!("scheduler_step {i}"), t, 90, ""));
            events.push(event("cpu_op", "aten::mm", t + 5, 50, ""));
            let correlation = format!(r#""correlation": {i}"#);
            events.push(event(
                "cuda_runtime",
                "cudaLaunchKernel",
                t + 10,
                5,
                &correlation,
            ));
            let on_gpu = format!(r#""correlation": {i}, "device": 0, "stream": 7"#);
            events.push(
                event("kernel", "gemm", t + 20, 20, &on_gpu)
                    .replace(r#""pid": 1, "tid": 1"#, r#""pid": 0, "tid": 7"#),
            );
        }
        let text = format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n"));
        std::fs::write(&trace, text).unwrap();
        let whole = IngestOptions {
            step_pattern: Some(crate::nsys::step_pattern(r"^scheduler_step (\d+)$").unwrap()),
            ..Default::default()
        };
        let rows = assert_windows_change_nothing(&trace, whole.clone(), &kineto_windows(whole));
        let kernels: Vec<&String> = rows
            .iter()
            .filter(|r| field(r, "kind") == "kernel")
            .collect();
        assert_eq!(kernels.len(), 400);
        for k in kernels {
            assert_eq!(field(k, "op"), "aten::mm", "{k}");
            let step = field(k, "step").parse::<i64>().unwrap();
            assert_eq!(field(k, "scope"), format!("scheduler_step {step}"), "{k}");
        }
    }

    /// Legacy `export_chrome_trace` links a kernel to its operator by a flow arrow, which is
    /// not stored as a row: attributing by windows must not lose it.
    #[test]
    fn legacy_flow_launches_are_the_same_by_windows() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("trace.json");
        let mut events = Vec::new();
        for i in 0..1500 {
            let t = 1_000_000 + 10 * i;
            events.push(format!(r#"{{"name": "op{i}", "ph": "X", "ts": {t}, "dur": 8, "tid": 3, "pid": "CPU functions", "args": {{}}}}"#));
            events.push(format!(r#"{{"name": "op{i}", "ph": "s", "ts": {t}, "tid": 3, "pid": "CPU functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#));
            events.push(format!(r#"{{"name": "k{i}", "ph": "f", "ts": {}, "tid": 0, "pid": "CUDA functions", "id": {i}, "cat": "cpu_to_cuda", "args": {{}}}}"#, t + 5));
            events.push(format!(r#"{{"name": "k{i}", "ph": "X", "ts": {}, "dur": 2, "tid": 0, "pid": "CUDA functions", "args": {{}}}}"#, t + 5));
        }
        std::fs::write(&trace, format!("[{}]", events.join(",\n"))).unwrap();
        let whole = IngestOptions::default();
        let rows = assert_windows_change_nothing(&trace, whole.clone(), &kineto_windows(whole));
        let kernels: Vec<&String> = rows
            .iter()
            .filter(|r| field(r, "kind") == "kernel")
            .collect();
        assert_eq!(kernels.len(), 1500);
        for k in kernels {
            assert_eq!(
                field(k, "op"),
                format!("op{}", &field(k, "name")[1..]),
                "{k}"
            );
        }
    }

    #[test]
    fn a_correlation_id_in_two_processes_finds_its_earliest_launch_also_by_windows() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.json");
        let mut events = Vec::new();
        let op = |pid: i64, name: &str, ts: i64, dur: i64| {
            format!(
                r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {pid}, "tid": {pid}, "ts": {ts}, "dur": {dur}}}"#
            )
        };
        for pid in [1, 2] {
            for i in 0..20 {
                events.push(op(pid, "filler", i * 10 + 3, 2));
            }
        }
        // Process 1 launches correlation 7 later than process 2 does.
        events.push(op(1, "opA", 105, 10));
        events.push(op(2, "opB", 15, 10));
        for (pid, ts) in [(1, 110), (2, 20)] {
            events.push(format!(r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {pid}, "ts": {ts}, "dur": 1, "args": {{"correlation": 7}}}}"#));
        }
        events.push(r#"{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 300, "dur": 4, "args": {"correlation": 7, "device": 0, "stream": 7}}"#.into());
        std::fs::write(
            &trace,
            format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
        )
        .unwrap();
        let windows = |spool_budget| IngestOptions {
            whole_file_limit: Some(0),
            window_rows: Some(4),
            spool_budget,
            ..Default::default()
        };
        let rows = assert_windows_change_nothing(
            &trace,
            IngestOptions::default(),
            &[
                ("windows of 4 rows", windows(None)),
                ("spilled windows of 4 rows", windows(Some(0))),
            ],
        );
        let kernel: Vec<&String> = rows.iter().filter(|r| r.contains("|kernel|")).collect();
        assert_eq!(kernel.len(), 1);
        assert!(kernel[0].contains("|opB|"), "{}", kernel[0]);
    }

    /// Ingests `input` with `whole` and with each of `windowed`, checks that the stored rows
    /// are the same, and returns them ([`stored_rows`]).
    fn assert_windows_change_nothing(
        input: &Path,
        whole: IngestOptions,
        windowed: &[(&str, IngestOptions)],
    ) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = Vec::new();
        let all = std::iter::once(("whole", whole)).chain(windowed.iter().cloned());
        for (i, (what, opts)) in all.enumerate() {
            let store = Store::open(dir.path().join(i.to_string())).unwrap();
            let opts = IngestOptions {
                run: Some(RunId::new("r").unwrap()),
                ..opts
            };
            ingest(&store, &[input.to_path_buf()], &opts, &NoProgress).unwrap();
            rows.push((what, stored_rows(&store, "r")));
        }
        let whole = &rows[0].1;
        for (what, other) in &rows[1..] {
            let differing: Vec<_> = whole.iter().zip(other).filter(|(a, b)| a != b).collect();
            assert_eq!(whole.len(), other.len(), "{}: {what}", input.display());
            assert!(
                differing.is_empty(),
                "{}: {what}: {} rows differ, first: {:?}",
                input.display(),
                differing.len(),
                differing[0]
            );
        }
        rows.swap_remove(0).1
    }

    /// Kernels among `rows` ([`stored_rows`]) with an operator, a scope and a step: comparing
    /// attributions means something only if there are many.
    fn attributed_kernels(rows: &[String]) -> usize {
        let schema = TableKind::Events.file_schema();
        let col = |name: &str| schema.index_of(name).unwrap();
        rows.iter()
            .map(|r| r.split('|').collect::<Vec<_>>())
            .filter(|f| f[col("kind")] == "kernel")
            .filter(|f| !f[col("op")].is_empty() && !f[col("scope")].is_empty())
            .filter(|f| !f[col("step")].is_empty())
            .count()
    }

    #[test]
    fn gpu_events_far_outside_the_host_span_are_counted_as_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.json");
        // Host activity spans 1 s..1.001 s; one kernel 60 s later (corrupt), one within range.
        std::fs::write(
            &trace,
            r#"{"traceEvents": [
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000000, "dur": 1000},
              {"ph": "X", "cat": "kernel", "name": "ok", "pid": 0, "tid": 7, "ts": 1000500, "dur": 10},
              {"ph": "X", "cat": "kernel", "name": "late", "pid": 0, "tid": 7, "ts": 61000000, "dur": 10}
            ]}"#,
        )
        .unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let reports = ingest(&store, &[trace], &IngestOptions::default(), &NoProgress).unwrap();
        let warnings = &reports[0].warnings;
        let key =
            "GPU events more than 10 s outside the host time range (CUPTI timestamp corruption?)";
        assert_eq!(warnings.get(key), Some(&1), "{warnings:?}");
        assert_eq!(reports[0].events, 3, "the suspicious event is kept");
    }

    #[test]
    fn only_sources_on_different_clocks_are_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let epoch = |seed: u64| {
            let path = dir.path().join(format!("epoch-{seed}.json"));
            let cfg = crate::synth::SynthConfig {
                seed,
                ..crate::synth::SynthConfig::small()
            };
            crate::synth::write_kineto(&cfg, std::fs::File::create(&path).unwrap()).unwrap();
            path
        };
        // Nsight Systems exports are on the session's clock (ns since its start).
        let relative = dir.path().join("relative.sqlite");
        crate::synth_nsys::write_nsys(&crate::synth_nsys::NsysConfig::small(), &relative).unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let run = |name: &str| IngestOptions {
            run: Some(RunId::new(name).unwrap()),
            ..Default::default()
        };
        // Synthetic traces carry an HF_TOKEN in their metadata: its redaction is counted too.
        let without_redaction = |r: &RunReport| {
            let mut w = r.warnings.clone();
            assert!(w.remove(redact::WARNING).is_some(), "{w:?}");
            w
        };
        let one = ingest(&store, &[epoch(1)], &run("one"), &NoProgress).unwrap();
        assert!(
            without_redaction(&one[0]).is_empty(),
            "{:?}",
            one[0].warnings
        );
        // Synthetic traces of other seeds start days apart: merged on request, with that
        // warning only.
        let apart = IngestOptions {
            merge_unrelated: true,
            ..run("two")
        };
        let two = ingest(&store, &[epoch(2), epoch(3)], &apart, &NoProgress).unwrap();
        assert_eq!(two[0].files, 2);
        let two_warnings = without_redaction(&two[0]);
        assert_eq!(two_warnings.len(), 1, "{two_warnings:?}");
        assert!(
            two_warnings.keys().all(|w| w.contains("--merge-unrelated")),
            "{two_warnings:?}"
        );
        // Refused unless asked for: files on different clocks are not one job.
        let refused = ingest(
            &store,
            &[epoch(4), relative.clone()],
            &run("mixed"),
            &NoProgress,
        );
        assert!(matches!(refused, Err(IngestError::Unrelated { .. })));
        let merge = IngestOptions {
            merge_unrelated: true,
            ..run("mixed")
        };
        let mixed = ingest(&store, &[epoch(4), relative], &merge, &NoProgress).unwrap();
        let key = "sources on different clocks (epoch ns and trace-relative ns) in one run";
        assert_eq!(
            mixed[0].warnings.get(key),
            Some(&1),
            "{:?}",
            mixed[0].warnings
        );
    }

    fn facts(path: &str, rank: Option<i32>, span_s: (i64, i64), epoch_time: bool) -> JobFacts {
        JobFacts {
            path: path.into(),
            rank,
            span: Some((span_s.0 * 1_000_000_000, span_s.1 * 1_000_000_000)),
            epoch_time,
        }
    }

    #[test]
    fn files_are_one_job_only_with_distinct_ranks_one_clock_and_no_long_gap() {
        let t = 1_700_000_000;
        let ranks: Vec<JobFacts> = (0..4)
            .map(|r| facts(&format!("r{r}"), Some(r), (t + r as i64, t + 30), true))
            .collect();
        assert_eq!(unrelated(&ranks), None);
        // Chained spans: each within a minute of the furthest end so far.
        let chained = [
            facts("a", None, (t, t + 100), true),
            facts("b", None, (t + 150, t + 200), true),
            facts("c", None, (t + 50, t + 60), true),
        ];
        assert_eq!(unrelated(&chained), None);
        let twice = [
            facts("a", Some(0), (t, t + 1), true),
            facts("b", Some(0), (t, t + 1), true),
        ];
        assert_eq!(
            unrelated(&twice),
            Some(("a".into(), "b".into(), "both are rank 0".into()))
        );
        let apart = [
            facts("late", Some(1), (t + 3 * 86_400, t + 3 * 86_400 + 5), true),
            facts("early", Some(0), (t, t + 5), true),
        ];
        assert_eq!(
            unrelated(&apart),
            Some((
                "early".into(),
                "late".into(),
                "3.0 days apart in time".into()
            ))
        );
        let clocks = [
            facts("e", None, (t, t + 1), true),
            facts("s", None, (0, 1), false),
        ];
        assert!(unrelated(&clocks).unwrap().2.contains("clock"));
        // Session clocks of different files cannot be compared: no gap is measured.
        let sessions = [
            facts("s0", Some(0), (0, 10), false),
            facts("s1", Some(1), (5000, 5010), false),
        ];
        assert_eq!(unrelated(&sessions), None);
    }
}
