//! The store's runs: `gpuq runs` (list, remove, tag), `gpuq files` (the data files another
//! engine reads) and `gpuq compact`.

use crate::args::{parse_tags, FilesFormat, FilesTable, OutputFormat, RunsAction};
use crate::exec::{exit_code, run_sql_text};
use anyhow::bail;
use gpuq_engine::{RunId, Store};
use std::process::ExitCode;

/// `gpuq runs [rm | tag]`.
pub(super) async fn runs(
    store: &Store,
    action: Option<RunsAction>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    match action {
        None => {
            let ctx = gpuq_query::open_session(store).await?;
            let sql = crate::exec::RUNS_SQL;
            let failed = run_sql_text(&ctx, sql, format, &mut std::io::stdout()).await;
            Ok(exit_code(failed))
        }
        Some(RunsAction::Rm { run, yes }) => {
            // A run name, or a selector (a condition on the runs table) for several at once.
            let ctx = gpuq_query::open_session(store).await?;
            let runs = gpuq_query::analyses::history::selector::resolve(&ctx, store, &run).await?;
            let ids = runs
                .iter()
                .map(|r| RunId::new(r.run.as_str()))
                .collect::<Result<Vec<_>, _>>()?;
            if ids.len() > 1 && !yes {
                let names: Vec<&str> = ids.iter().map(|r| r.as_str()).collect();
                bail!(
                    "{} matches {} runs ({}); add --yes to remove them all",
                    run,
                    ids.len(),
                    names.join(", ")
                );
            }
            store.writer()?.remove_runs(&ids)?;
            for r in &ids {
                println!("removed run {r}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(RunsAction::Tag { run, tags }) => {
            let run = RunId::new(run)?;
            let tags: Vec<(String, String)> = parse_tags(&tags)?
                .iter()
                .map(|(k, v)| {
                    let (k, v, _) = gpuq_ingest::redact_tag(k, v);
                    (k, v)
                })
                .collect();
            store.writer()?.set_tags(&run, &tags)?;
            println!("tagged run {run}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `gpuq compact [RUN...]`: one commit per run that had small parts to merge.
pub(super) fn compact(store: &Store, runs: &[String]) -> anyhow::Result<ExitCode> {
    let mut writer = store.writer()?;
    let runs: Vec<RunId> = if runs.is_empty() {
        writer.manifest().runs.keys().cloned().collect()
    } else {
        runs.iter().map(RunId::new).collect::<Result<_, _>>()?
    };
    let mut merged = 0;
    for run in &runs {
        let n = writer.compact_run(run)?;
        if n > 0 {
            println!("{run}: merged {n} parts");
        }
        merged += n;
    }
    println!("compacted {} run(s): {merged} parts merged", runs.len());
    Ok(ExitCode::SUCCESS)
}

/// `gpuq files`: the current version's data files of `runs` (every run when empty), as
/// absolute paths under `_data/` that stay readable 10 minutes after a later commit drops
/// them, so another engine reads exactly this version.
pub(super) fn files(
    store: &Store,
    runs: &[String],
    table: FilesTable,
    format: FilesFormat,
) -> anyhow::Result<ExitCode> {
    let manifest = store.manifest()?;
    let wanted: Vec<RunId> = runs.iter().map(RunId::new).collect::<Result<_, _>>()?;
    if let Some(unknown) = wanted.iter().find(|r| !manifest.runs.contains_key(*r)) {
        bail!("unknown run: {unknown}");
    }
    let table = match table {
        FilesTable::Events => gpuq_engine::schema::TableKind::Events,
        FilesTable::Counters => gpuq_engine::schema::TableKind::Counters,
    };
    let paths: Vec<String> = manifest
        .files(table)
        .filter(|(run, _)| wanted.is_empty() || wanted.contains(run))
        .map(|(_, f)| store.file_path(&manifest, &f.path).display().to_string())
        .collect();
    let list = serde_json::to_string(&paths)?;
    match format {
        FilesFormat::Lines => paths.iter().for_each(|p| println!("{p}")),
        FilesFormat::Json => println!("{list}"),
        // DuckDB's string literals are single-quoted (a quote doubled); a JSON array of
        // strings is also a Python list literal.
        FilesFormat::Duckdb => println!(
            "read_parquet([{}], hive_partitioning = true)",
            paths
                .iter()
                .map(|p| format!("'{}'", p.replace('\'', "''")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        FilesFormat::Polars => println!("pl.scan_parquet({list}, hive_partitioning=True)"),
    }
    Ok(ExitCode::SUCCESS)
}
