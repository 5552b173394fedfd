//! `gpuq watch`: appends each finished trace file of a directory to a run
//! ([`gpuq_live::watch`]), until Ctrl-C or SIGTERM (finishing the file in hand), `--once`
//! or `--idle-exit`. On a terminal one status line; otherwise a line per file stored,
//! skipped or failed, for logs.

use crate::args::{parse_tags, RankFromArg, WatchArgs};
use crate::exec::open_store;
use gpuq_engine::RunId;
use gpuq_ingest::redact_text;
use gpuq_live::{RankFrom, WatchEvent, WatchOptions, WatchReporter, WatchStatus};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The watch `gpuq watch`'s arguments ask for.
pub(super) fn options(args: WatchArgs) -> anyhow::Result<WatchOptions> {
    let ns = |n: i64| Duration::from_nanos(n.max(0) as u64);
    let mut opts = WatchOptions::new(args.dir, RunId::new(args.run)?);
    opts.ingest.tags = parse_tags(&args.tags)?;
    opts.rank_from = match args.rank_from {
        RankFromArg::Trace => RankFrom::Trace,
        RankFromArg::Path => RankFrom::Path,
    };
    opts.once = args.once;
    opts.idle_exit = args.idle_exit.map(ns);
    opts.poll = args.poll;
    opts.settle = ns(args.settle);
    opts.incomplete_after = ns(args.incomplete_after);
    Ok(opts)
}

/// Runs the watch on a thread of its own while this task waits for Ctrl-C or SIGTERM.
pub(super) async fn run(store_path: &Path, opts: WatchOptions) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let store = open_store(store_path)?;
    let stop = Arc::new(AtomicBool::new(false));
    // Registered before the watch starts, so that no signal finds the default handler.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let on_signal = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        on_signal.store(true, Ordering::SeqCst);
    });
    let once = opts.once;
    let summary = tokio::task::spawn_blocking(move || {
        let mut reporter = Lines::new();
        let summary = gpuq_live::watch(&store, &opts, &stop, &mut reporter);
        reporter.finish();
        summary
    })
    .await??;
    println!(
        "watch: {} stored, {} already in the run, {} duplicates, {} failed, {} incomplete",
        summary.stored, summary.resumed, summary.duplicates, summary.failed, summary.incomplete
    );
    Ok(if once && summary.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// A status line on a terminal (stderr), plain lines otherwise.
struct Lines {
    bar: Option<ProgressBar>,
}

impl Lines {
    fn new() -> Lines {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("valid template"));
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Lines { bar }
    }

    fn say(&self, line: &str, error: bool) {
        let line = redact_text(line).0;
        match (&self.bar, error) {
            (Some(b), _) => b.println(line),
            (None, true) => eprintln!("{line}"),
            (None, false) => println!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl WatchReporter for Lines {
    fn event(&mut self, event: WatchEvent<'_>) {
        match event {
            WatchEvent::Stored { path, report } => self.say(
                &format!(
                    "stored {}: {} events, {} kernels{} (run {})",
                    path.display(),
                    report.events,
                    report.kernels,
                    report
                        .last_step
                        .map(|n| format!(", steps up to {n}"))
                        .unwrap_or_default(),
                    report.run
                ),
                false,
            ),
            WatchEvent::Duplicate { path, holder } => self.say(
                &format!("skipped {}: already stored in run {holder}", path.display()),
                false,
            ),
            WatchEvent::Failed { path, error } => {
                self.say(&format!("failed {}: {error}", path.display()), true)
            }
            WatchEvent::Incomplete { path } => self.say(
                &format!(
                    "incomplete {}: cut short or still being written; left alone",
                    path.display()
                ),
                false,
            ),
            WatchEvent::ChangedAfterStore { path } => self.say(
                &format!(
                    "changed {}: it changed after it was stored; not stored again",
                    path.display()
                ),
                true,
            ),
            WatchEvent::Note(note) => self.say(&format!("watch: {note}"), true),
        }
    }

    fn status(&mut self, s: WatchStatus) {
        if let Some(b) = &self.bar {
            let step = s
                .last_step
                .map(|n| format!(", last step {n}"))
                .unwrap_or_default();
            b.set_message(format!(
                "{} files seen, {} stored, {} waiting, {} failed{step}",
                s.seen, s.stored, s.waiting, s.failed
            ));
        }
    }
}
