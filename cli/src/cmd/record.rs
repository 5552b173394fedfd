//! `gpuq record -- COMMAND`: runs the command with the CUPTI collector injected and records
//! its GPU activity into a run as it runs ([`gpuq_live::record`]); exits with the command's
//! exit status.

use crate::args::{parse_tags, RecordArgs};
use crate::exec::open_store;
use gpuq_engine::RunId;
use gpuq_live::{RecordOptions, RecordSummary};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The collector's file name, as cargo builds it.
const COLLECTOR_FILE: &str = "libgpuq_collector.so";

pub(super) async fn run(store_path: &Path, args: RecordArgs) -> anyhow::Result<ExitCode> {
    let run = match args.run {
        Some(name) => RunId::new(name)?,
        None => RunId::new(
            chrono::Local::now()
                .format("record-%Y%m%d-%H%M%S")
                .to_string(),
        )?,
    };
    let step_pattern = args
        .step_pattern
        .map(|p| gpuq_ingest::step_pattern(&p))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let collector = match args.collector {
        Some(path) if path.is_file() => path,
        Some(path) => anyhow::bail!("collector library {} does not exist", path.display()),
        None => find_collector()?,
    };
    let opts = RecordOptions {
        run,
        tags: parse_tags(&args.tags)?,
        flush: Duration::from_nanos(args.flush_interval.max(1_000_000) as u64),
        kinds: args.kinds,
        step_pattern,
        collector,
        spool: args.spool,
    };
    let store = open_store(store_path)?;
    let command = args.command;
    let summary = tokio::task::spawn_blocking(move || {
        gpuq_live::record(&store, &opts, &command, &mut |_| {}).map(|s| (s, opts.run))
    })
    .await??;
    let (summary, run) = summary;
    report(&run, &summary);
    Ok(exit_code(&summary))
}

/// The collector beside the gpuq executable (`cargo build --release` puts both in
/// `target/release/`; test builds update only `deps/`), or in `../lib/`: the newest of them.
fn find_collector() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join(COLLECTOR_FILE),
        dir.join("deps").join(COLLECTOR_FILE),
        dir.join("../lib").join(COLLECTOR_FILE),
    ];
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone());
    newest.ok_or_else(|| {
        anyhow::anyhow!(
            "gpuq record needs the collector library {COLLECTOR_FILE}, which was not found \
             beside {} (nor in deps/ or ../lib/). Build it with `cargo build --release \
             --workspace` (it lands beside the gpuq binary), or name it with --collector or \
             GPUQ_COLLECTOR. `cargo install` does not install shared libraries.",
            exe.display()
        )
    })
}

fn report(run: &RunId, s: &RecordSummary) {
    eprintln!(
        "record: run {run}: {} events ({} kernels) from {} process{} in {} segment{}, {} commit{}",
        s.events,
        s.kernels,
        s.processes,
        if s.processes == 1 { "" } else { "es" },
        s.segments,
        if s.segments == 1 { "" } else { "s" },
        s.commits,
        if s.commits == 1 { "" } else { "s" },
    );
    for (warning, n) in &s.warnings {
        eprintln!("record: warning: {warning} ({n})");
    }
    if let Some(why) = s.nothing_recorded() {
        eprintln!("record: nothing was recorded: {why}");
    }
}

/// The command's exit status as ours: its code, or 128 + the signal that ended it.
fn exit_code(s: &RecordSummary) -> ExitCode {
    let code = match s.status {
        Some(st) => st
            .code()
            .or_else(|| st.signal().map(|sig| 128 + sig))
            .unwrap_or(1),
        None => 1,
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
