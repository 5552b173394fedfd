//! The `gpuq` binary: argument parsing and dispatch. Every command lives in [`commands`].

mod args;
mod commands;
mod exec;
mod history;
mod meta;
mod output;
mod repl;

use clap::Parser;
use std::process::ExitCode;

/// glibc gives threads that contend for the allocator arenas of their own (up to 8 per core);
/// ingest moves large buffers between several threads, and the free memory left in extra
/// arenas counts as resident: on a 6 GB trace about 90 MB of the peak. Two arenas cost ingest
/// no measurable speed; queries, which allocate and free small buffers on every thread, spend
/// a tenth of their time waiting for the arena locks, so only ingest limits them.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before any other thread
    // exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    if matches!(cli.command, args::Command::Ingest { .. }) {
        limit_malloc_arenas();
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
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuq: error: {}", exec::one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}
