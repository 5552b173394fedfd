//! Run selectors: which runs a comparison, trend or gate looks at.
//!
//! A selector is either the name of a stored run (`main-0412`) or a SQL condition on the
//! `runs` table (`tags['branch'] = 'main'`, `run LIKE 'nightly-%'`, `true` for every run,
//! `gpus LIKE '%H100%' AND tags['bs'] = '8'`). A run-like name that is neither stored nor a
//! valid condition is an unknown run, and a condition that matches nothing is an error too, so
//! a typo never compares against an empty side.

use crate::analyses::data::{collect, strings};
use crate::analyses::literal;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use gpuq_engine::{RunId, Store};
use std::collections::BTreeMap;

/// A selected run with what orders it in a trend.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub run: String,
    /// When the trace was captured: its first timestamp when the run's clock is the Unix
    /// epoch, else when it was imported.
    pub captured_ns: i64,
    pub tags: BTreeMap<String, String>,
}

/// The names of the runs `selector` names, in [`resolve`]'s order.
pub async fn run_names(ctx: &SessionContext, store: &Store, selector: &str) -> Result<Vec<String>> {
    Ok(resolve(ctx, store, selector)
        .await?
        .into_iter()
        .map(|r| r.run)
        .collect())
}

/// The runs `selector` names, ordered by capture time (then name).
pub async fn resolve(ctx: &SessionContext, store: &Store, selector: &str) -> Result<Vec<RunInfo>> {
    let selector = selector.trim();
    let manifest = {
        let state = ctx.state_ref();
        let state = state.read();
        crate::tables::statement_manifest(store, state.config())?
    };
    let as_run = RunId::new(selector).ok();
    let names: Vec<String> = match &as_run {
        Some(run) if manifest.runs.contains_key(run) => vec![run.as_str().to_string()],
        _ => {
            let sql = format!("SELECT run FROM runs WHERE {selector}");
            let batches = match collect(ctx, &sql).await {
                Ok(b) => b,
                // `pr-1234` parses as arithmetic on unknown columns: it meant a run.
                Err(_) if as_run.is_some() => {
                    return Err(DataFusionError::Plan(format!(
                    "unknown run {selector} (see `gpuq runs`; a selector is a run name or a SQL \
                         condition on the runs table, e.g. tags['branch'] = 'main')"
                )))
                }
                Err(e) => {
                    return Err(DataFusionError::Plan(format!(
                    "selector {} is neither a run name nor a valid condition on the runs table: {}",
                    literal(selector),
                    e.to_string()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                )))
                }
            };
            let mut names = Vec::new();
            for b in &batches {
                names.extend(strings(b, 0)?.into_iter().flatten());
            }
            if names.is_empty() {
                return Err(DataFusionError::Plan(format!(
                    "selector {} matches no run",
                    literal(selector)
                )));
            }
            names
        }
    };
    let mut runs: Vec<RunInfo> = names
        .into_iter()
        .filter_map(|name| {
            let entry = manifest.runs.get(&RunId::new(name.as_str()).ok()?)?;
            let meta = &entry.meta;
            let captured_ns = match (meta.epoch_time, meta.first_ts) {
                (true, Some(ts)) => ts,
                _ => meta.imported_at_ns,
            };
            Some(RunInfo {
                run: name,
                captured_ns,
                tags: meta.tags.clone(),
            })
        })
        .collect();
    runs.sort_by(|a, b| (a.captured_ns, &a.run).cmp(&(b.captured_ns, &b.run)));
    runs.dedup_by(|a, b| a.run == b.run);
    Ok(runs)
}
