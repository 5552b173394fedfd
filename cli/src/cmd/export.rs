//! `gpuq export RUN -o FILE`: a run, or a window of it, as a Perfetto or Chrome JSON timeline
//! ([`gpuq_export`]). The file appears whole or not at all (written beside it, then renamed).

use crate::args::{ExportArgs, ExportFormat};
use crate::exec::open_session;
use gpuq_engine::RunId;
use gpuq_export::{Format, WholeFile, Window};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

pub(super) async fn run(store_path: &Path, args: ExportArgs) -> anyhow::Result<ExitCode> {
    let run = RunId::new(args.run)?;
    let (store, ctx) = open_session(store_path).await?;
    if !store.manifest()?.runs.contains_key(&run) {
        anyhow::bail!("no run {run} in {}", store_path.display());
    }
    let window = Window {
        steps: args.steps,
        from: args.from,
        to: args.to,
        ranks: args.ranks,
        min_dur: args.min_dur,
        skip_findings: args.no_findings,
    };
    let format = match args.format {
        ExportFormat::Perfetto => Format::Perfetto,
        ExportFormat::Chrome => Format::Chrome,
    };
    let to_stdout = args.output.as_os_str() == "-";
    let summary = if to_stdout {
        // Stdout itself, not its lock: the export is a future that may move between threads.
        let mut out = std::io::stdout();
        let s = gpuq_export::export(&ctx, run.as_str(), &window, format, &mut out).await?;
        out.flush()?;
        s
    } else {
        let mut out = WholeFile::create(&args.output)?;
        let summary =
            gpuq_export::export(&ctx, run.as_str(), &window, format, &mut out.file).await?;
        out.commit()?;
        summary
    };
    let size = if to_stdout {
        String::new()
    } else {
        let bytes = std::fs::metadata(&args.output).map_or(0, |m| m.len());
        format!(
            " -> {} ({:.1} MB)",
            args.output.display(),
            bytes as f64 / 1e6
        )
    };
    eprintln!(
        "export: {} slices, {} instants, {} counter values, {} flows on {} tracks, {:.3} s of run {run}{size}",
        summary.slices,
        summary.instants,
        summary.counters,
        summary.flows,
        summary.tracks,
        (summary.to_ns - summary.from_ns) as f64 / 1e9
    );
    Ok(ExitCode::SUCCESS)
}
