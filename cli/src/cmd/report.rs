//! `gpuq report RUN -o FILE [--vs BASELINE]`: one self-contained HTML page for a run
//! ([`gpuq_export::report`]). The file appears whole or not at all.

use crate::args::ReportArgs;
use crate::exec::open_session;
use gpuq_engine::RunId;
use gpuq_export::report::ReportOptions;
use gpuq_export::WholeFile;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

pub(super) async fn run(store_path: &Path, args: ReportArgs) -> anyhow::Result<ExitCode> {
    let run = RunId::new(args.run)?;
    let (store, ctx) = open_session(store_path).await?;
    let manifest = store.manifest()?;
    for r in std::iter::once(run.as_str()).chain(args.vs.as_deref()) {
        if !manifest.runs.contains_key(&RunId::new(r)?) {
            anyhow::bail!("no run {r} in {}", store_path.display());
        }
    }
    let opts = ReportOptions {
        run: run.as_str().to_string(),
        baseline: args.vs,
        steps: args.steps,
        top: args.top,
    };
    let html = gpuq_export::report::report(&ctx, &opts).await?;
    if args.output.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        out.write_all(html.as_bytes())?;
        out.flush()?;
    } else {
        let mut out = WholeFile::create(&args.output)?;
        out.file.write_all(html.as_bytes())?;
        out.commit()?;
        eprintln!(
            "report: {} ({:.0} KB)",
            args.output.display(),
            html.len() as f64 / 1e3
        );
    }
    Ok(ExitCode::SUCCESS)
}
