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

fn main() -> ExitCode {
    let cli = args::Cli::parse();
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
