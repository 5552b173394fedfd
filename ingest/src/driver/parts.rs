//! Writing a file's attributed rows as Parquet parts: parts of about equal rows written on
//! every core ([`PartContext`]), attributed as batches arrive ([`DirectParts`]), the counters'
//! parts, and what the parts hold ([`FileSpan`]: time span, devices).

use super::*;

/// Writes a file's counters (those the adapter kept, then those it spooled) as parts.
pub(super) fn write_counters(
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
pub(super) struct PartContext<'a> {
    pub(super) writer: &'a gpuq_engine::StoreWriter,
    pub(super) rank: Option<i32>,
    pub(super) time_base_ns: i64,
    pub(super) host_span: Option<(i64, i64)>,
    /// Every part's texts pass through it on their way to the store.
    pub(super) redactor: &'a redact::Redactor,
}

impl PartContext<'_> {
    /// Writes `batches` as a part of `table`, their secrets redacted.
    pub(super) fn write(
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
    pub(super) fn write_parts<T: Send + Sync>(
        &self,
        resolver: &Resolver,
        groups: impl Iterator<Item = std::io::Result<Vec<T>>> + Send,
        batch: impl Fn(&T) -> std::io::Result<RecordBatch> + Sync,
        parallel: usize,
    ) -> Result<Vec<(StagedFile, FileSpan)>, IngestError> {
        let groups = Mutex::new(groups.enumerate());
        let written = Mutex::new(Vec::new());
        let failure: Mutex<Option<IngestError>> = Mutex::new(None);
        let write = |group: Vec<T>| -> Result<Vec<(StagedFile, FileSpan)>, IngestError> {
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
                    let facts = FileSpan::of(&part, self.host_span);
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
pub(super) fn part_count(rows: usize, cores: usize) -> usize {
    match rows.div_ceil(PART_ROWS) {
        0 | 1 => 1,
        n => n.next_multiple_of(cores.max(1)),
    }
}

/// Consecutive spool frames (`rows` in all) in [`part_count`] groups of about equal rows: a
/// group ends with the frame whose middle row reaches its share (whole frames).
pub(super) fn part_groups(
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

/// Attributes batches as they come (from several threads) and writes them in parts of about
/// `part_rows` rows.
pub(super) struct DirectParts<'a> {
    pub(super) ctx: &'a PartContext<'a>,
    pub(super) resolver: &'a Resolver,
    /// Rows a part is written at.
    pub(super) part_rows: usize,
    /// Attributed batches not yet written, and their rows.
    pub(super) pending: Mutex<(Vec<RecordBatch>, usize)>,
    pub(super) written: Mutex<Vec<(StagedFile, FileSpan)>>,
    /// The first write error; `push` fails from then on.
    pub(super) error: Mutex<Option<IngestError>>,
}

impl<'a> DirectParts<'a> {
    pub(super) fn new(ctx: &'a PartContext<'a>, resolver: &'a Resolver, part_rows: usize) -> Self {
        DirectParts {
            ctx,
            resolver,
            part_rows,
            pending: Mutex::new((Vec::new(), 0)),
            written: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        }
    }

    pub(super) fn push(&self, batch: RecordBatch) -> Result<(), ()> {
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

    pub(super) fn write(&self, group: Vec<RecordBatch>) -> Result<(), ()> {
        for part in part_bytes::split(group, part_bytes::PART_STRING_BYTES) {
            let facts = FileSpan::of(&part, self.ctx.host_span);
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
    pub(super) fn finish(self) -> Result<Vec<(StagedFile, FileSpan)>, IngestError> {
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
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Span, devices and host/GPU time ranges of a file's events.
#[derive(Default)]
pub(super) struct FileSpan {
    pub(super) first_ts: Option<i64>,
    pub(super) last_ts: Option<i64>,
    pub(super) devices: BTreeSet<i32>,
    /// GPU events starting more than [`FileSpan::MARGIN_NS`] outside the host events' span.
    pub(super) gpu_outside_host: u64,
    /// The highest step number of the events.
    pub(super) last_step: Option<i64>,
}

impl FileSpan {
    pub(super) fn merge(&mut self, o: FileSpan) {
        let min = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.first_ts = min(self.first_ts, o.first_ts);
        self.last_ts = self.last_ts.max(o.last_ts);
        self.devices.extend(o.devices);
        self.gpu_outside_host += o.gpu_outside_host;
        self.last_step = self.last_step.max(o.last_step);
    }

    const MARGIN_NS: i64 = 10_000_000_000;

    /// The span of resolved batches; `host_span` is the host events' span in the same time base.
    pub(super) fn of(batches: &[RecordBatch], host_span: Option<(i64, i64)>) -> FileSpan {
        let mut f = FileSpan::default();
        for b in batches {
            let (kinds, kind_of) = crate::columns::kinds_of(b);
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
            let step = b
                .column_by_name("step")
                .expect("step")
                .as_primitive::<Int64Type>();
            f.last_step = f.last_step.max(datafusion::arrow::compute::max(step));
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
