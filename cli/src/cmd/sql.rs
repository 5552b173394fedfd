//! `gpuq query` (statements from an argument, a file or standard input, for scripts) and
//! `gpuq sql` (the interactive shell).

use crate::args::{FileAccessArgs, MaxRows, OutputFormat};
use crate::exec::{exit_code, open_store, run_sql_text, Show};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `gpuq query`: runs the statements and prints each result; exit 1 if any failed.
pub(super) async fn query(
    store_path: &Path,
    sql: Option<String>,
    file: Option<PathBuf>,
    format: OutputFormat,
    maxrows: MaxRows,
    access: FileAccessArgs,
) -> anyhow::Result<ExitCode> {
    let text = match (sql, file) {
        (Some(s), None) => s,
        (None, Some(f)) if f.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())?,
        (None, Some(f)) => std::fs::read_to_string(&f).with_context(|| f.display().to_string())?,
        (Some(_), Some(_)) => {
            bail!("give the SQL either as an argument or with -f, not both")
        }
        (None, None) => bail!("no SQL given (pass it as an argument or with -f FILE)"),
    };
    let ctx = gpuq_query::open_session(&open_store(store_path)?).await?;
    gpuq_query::policy::set_file_access(&ctx, access.access());
    let failed = run_sql_text(
        &ctx,
        &text,
        Show {
            format,
            max_rows: maxrows,
            timing: false,
            expanded: crate::output::Expanded::Off,
        },
        &mut std::io::stdout(),
    )
    .await;
    Ok(exit_code(failed))
}

/// `gpuq sql`: the shell; exit 1 if a statement failed.
pub(super) async fn shell(
    store_path: &Path,
    format: OutputFormat,
    maxrows: MaxRows,
    access: FileAccessArgs,
) -> anyhow::Result<ExitCode> {
    let store = open_store(store_path)?;
    let ctx = gpuq_query::open_session(&store).await?;
    gpuq_query::policy::set_file_access(&ctx, access.access());
    let errors = crate::repl::run(ctx, format, maxrows, store.root()).await?;
    Ok(exit_code(errors))
}
