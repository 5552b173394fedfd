//! Attributing and writing a file window by window when it is too large to attribute at
//! once: an Nsight Systems export's host rows by process and time ([`WindowState`],
//! [`write_windows`]), a large Kineto trace read back from its spool ([`write_kineto_windowed`]).

use super::parts::{part_count, DirectParts, FileSpan, PartContext};
use super::*;

/// A window's batches in [`part_count`] parts of equal rows (batches are sliced where a part
/// ends), so that the window's last parts finish together.
pub(super) fn window_groups(batches: Vec<RecordBatch>) -> Vec<Vec<RecordBatch>> {
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
pub(super) struct WindowState {
    pub(super) windows: spool::Windows,
    /// How the adapter's ranges are read from its rows.
    pub(super) ranges: RangeRules,
    /// By window, the launches no row holds ([`HostStructure::unstored_launches`]).
    pub(super) unstored_launches: Vec<Vec<Launch>>,
    /// Names and threads of all windows so far; the ranges still open.
    pub(super) host: HostStructure,
    /// `host.names` as the resolvers' dictionary values.
    pub(super) names_array: Arc<StringArray>,
    pub(super) steps: Vec<crate::attribute::host::Step>,
    pub(super) per_process: bool,
    pub(super) launches: LaunchIndexWriter,
}

impl WindowState {
    /// Window `w`'s rows and its resolver (which attributed the window's launches into the
    /// index); windows are prepared in order. Keeps the ranges still open at the next
    /// window's start for it.
    pub(super) fn prepare(
        &mut self,
        w: usize,
    ) -> Result<(Vec<RecordBatch>, Resolver), IngestError> {
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
                crate::attribute::host::host_structure(b, &mut host, &self.ranges);
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
pub(super) fn write_windows(
    ctx: &PartContext<'_>,
    host: HostStructure,
    windows: spool::Windows,
    ranges: RangeRules,
    scratch: &WindowScratch,
) -> Result<(Vec<(StagedFile, FileSpan)>, Resolver), IngestError> {
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
pub(super) fn write_kineto_windowed(
    ctx: &PartContext<'_>,
    host: HostStructure,
    sample: RowSample,
    spool: Spool,
    scratch: &WindowScratch,
) -> Result<Vec<(StagedFile, FileSpan)>, IngestError> {
    let spool_error = || io_error(Path::new("spool"));
    let mut frames = spool.into_replay().map_err(spool_error())?;
    // Both spools share the budget.
    let budget = scratch.spool_budget.saturating_sub(frames.memory_bytes());
    let mut by_window = Spool::new(scratch.spool.clone(), budget);
    // By time alone: windows in time order hold a correlation id's earliest launch first,
    // as attributing the whole file at once finds it (Kineto's ids are not per process).
    let starts = crate::attribute::windows::window_starts(sample.by_process(), scratch.window_rows);
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
pub(super) fn rows_where(
    batch: &RecordBatch,
    keep: impl Fn(Option<Kind>) -> bool,
) -> std::io::Result<Option<RecordBatch>> {
    let (kinds, kind_of) = crate::columns::kinds_of(batch);
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
pub(super) fn write_windowed(
    ctx: &PartContext<'_>,
    host: HostStructure,
    spool: Spool,
    gpu: GpuInput<'_>,
    scratch: &WindowScratch,
) -> Result<(Vec<(StagedFile, FileSpan)>, nsys::Counts), IngestError> {
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
