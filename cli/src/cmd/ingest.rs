//! `gpuq ingest`: trace files into the store, with a progress bar on a terminal and a
//! summary per run.

use crate::args::{parse_tags, InputFormat};
use crate::exec::open_store;
use gpuq_engine::{RunId, Store};
use gpuq_ingest::redact_text;
use gpuq_ingest::LogZone;
use gpuq_ingest::{IngestOptions, Progress, RunReport};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The ingest options `gpuq ingest`'s arguments ask for.
#[allow(clippy::too_many_arguments)]
pub(super) fn options(
    run: Option<String>,
    tags: &[String],
    format: InputFormat,
    step_pattern: Option<String>,
    lenient: bool,
    tz: Option<LogZone>,
    replace: bool,
    merge_unrelated: bool,
) -> anyhow::Result<IngestOptions> {
    let run = run.map(RunId::new).transpose()?;
    let tags = parse_tags(tags)?;
    let step_pattern = step_pattern
        .map(|p| gpuq_ingest::step_pattern(&p))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(IngestOptions {
        run,
        tags,
        replace,
        format: format.format(),
        step_pattern,
        lenient,
        stage_log_zone: tz,
        merge_unrelated,
        ..Default::default()
    })
}

/// `gpuq ingest`: `paths` into the store at `store_path`.
pub(super) fn run(
    store_path: &Path,
    paths: &[PathBuf],
    opts: &IngestOptions,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    ingest(&open_store(store_path)?, paths, opts, quiet)
}

struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start_file(&self, path: &Path, bytes: u64) {
        if let Some(b) = &self.0 {
            b.reset();
            b.set_length(bytes);
            b.set_position(0);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            b.set_message(redact_text(&name).0.into_owned());
        }
    }
    fn bytes(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }
    fn finish_file(&self) {
        if let Some(b) = &self.0 {
            b.set_position(b.length().unwrap_or(0));
        }
    }
}

fn ingest(
    store: &Store,
    paths: &[PathBuf],
    opts: &IngestOptions,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b
    });
    let progress = Bar(bar);
    let reports = gpuq_ingest::ingest(store, paths, opts, &progress)?;
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    if !quiet {
        let mut split_said = std::collections::BTreeSet::new();
        for r in &reports {
            if let Some((run, why)) = &r.split_from {
                if split_said.insert(run.clone()) {
                    let why = redact_text(why).0;
                    println!("the files for run {run} do not look like one job ({why}): one run per file (--run NAME --merge-unrelated stores them as one)");
                }
            }
            print_report(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn print_report(r: &RunReport) {
    for (path, holder) in &r.duplicates {
        let path = path.display().to_string();
        let path = redact_text(&path).0;
        println!("{path}: already stored in run {holder} (same content); skipped (use --replace to re-ingest)");
    }
    if r.files == 0 {
        return;
    }
    let verb = if r.appended { "added to" } else { "stored as" };
    if let Some(holder) = &r.shared_from {
        println!(
            "{verb} run {}: the same content as run {holder}, whose stored files it shares: {} file(s), {} events, {} kernels, span {}",
            r.run,
            r.files,
            r.events,
            r.kernels,
            r.span_ns.map(human_ns).unwrap_or_else(|| "-".into()),
        );
        return;
    }
    // Speed on the bytes parsed: a gzip file's decompressed JSON, not its compressed size.
    let mb = r.content_bytes as f64 / 1e6;
    let on_disk = if r.input_bytes != r.content_bytes {
        format!(" ({:.1} MB compressed)", r.input_bytes as f64 / 1e6)
    } else {
        String::new()
    };
    println!(
        "{verb} run {}: {} file(s), {} events, {} kernels, span {}, {:.1} MB{on_disk} in {:.2} s ({:.0} MB/s)",
        r.run,
        r.files,
        r.events,
        r.kernels,
        r.span_ns.map(human_ns).unwrap_or_else(|| "-".into()),
        mb,
        r.seconds,
        mb / r.seconds.max(1e-9)
    );
    for (w, n) in &r.warnings {
        println!("  warning: {n} {w}");
    }
}

fn human_ns(ns: i64) -> String {
    let a = ns.unsigned_abs() as f64;
    let (v, unit) = if a >= 1e9 {
        (ns as f64 / 1e9, "s")
    } else if a >= 1e6 {
        (ns as f64 / 1e6, "ms")
    } else if a >= 1e3 {
        (ns as f64 / 1e3, "us")
    } else {
        (ns as f64, "ns")
    };
    format!("{v:.2} {unit}")
}
