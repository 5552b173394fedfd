//! The `gpuq` binary: argument parsing and dispatch. Every command lives in [`cmd`].

mod args;
mod cmd;
mod complete;
mod doctor;
mod exec;
mod fit;
mod meta;
mod output;
mod repl;
mod script;

use clap::Parser;
use std::process::ExitCode;

/// Allocator settings for ingest, which moves large buffers (a part's columns, tens of MB)
/// between threads:
/// - glibc gives threads that contend for the allocator arenas of their own (up to 8 per
///   core), and the free memory left in extra arenas counts as resident: on a 6 GB trace about
///   90 MB of the peak. Two arenas cost ingest no measurable speed; queries, which allocate and
///   free small buffers on every thread, spend a tenth of their time waiting for the arena
///   locks, so only ingest limits them.
/// - Buffers up to 32 MB come from the arenas and freed memory is kept for the next part,
///   instead of each buffer being mapped afresh and its pages zeroed by the kernel on first
///   touch (page faults were ~7 % of a Kineto ingest's CPU; these settings save 3-9 %).
fn tune_malloc_for_ingest() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; it is called before any other thread
    // exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// Allocator settings for a watch: two arenas as for ingest, but freed memory goes back to
/// the system (the watch trims after each file, `gpuq_live::watch`), so that its resident
/// memory between files is what it holds, not the most any file needed, and a watch that runs
/// for days over thousands of files stays flat.
fn tune_malloc_for_watch() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as in `tune_malloc_for_ingest`.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// A closed output pipe (`gpuq findings RUN | head -8`) ends the process at once and quietly,
/// killed by SIGPIPE as `cat` and `grep` are (status 141 in a shell), whichever command was
/// writing. Rust starts programs with SIGPIPE ignored, which turns the closed pipe into write
/// errors: a panic in `println!`, "Broken pipe" from the rest.
fn die_quietly_on_closed_pipes() {
    #[cfg(unix)]
    // SAFETY: restores the default disposition of one signal before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    die_quietly_on_closed_pipes();
    let cli = args::Cli::parse();
    match cli.command {
        args::Command::Ingest { .. } => tune_malloc_for_ingest(),
        args::Command::Watch { .. } => tune_malloc_for_watch(),
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuq: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cmd::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // Errors name the files they concern: their paths may hold secrets too.
            let message = exec::one_line(&format!("{e:#}"));
            eprintln!("gpuq: error: {}", gpuq_ingest::redact_text(&message).0);
            ExitCode::FAILURE
        }
    }
}
