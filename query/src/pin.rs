//! One statement, one store version: the manifest every table and table function of a
//! statement reads is read once and kept in the statement's session configuration
//! ([`PinnedManifest`]).
//!
//! [`PinningPlanner`] pins it when a statement's physical plan is made (every table is
//! scanned then, and an analysis runs its own queries inside that scan, with the same
//! configuration); [`pin`] pins it earlier, before the logical plan, for callers that plan
//! statements themselves (the shell), so that a table function's run check sees the same
//! version too. A version already pinned is kept: an analysis's queries read its caller's.

use crate::tables::PinnedManifest;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use gpuq_engine::Store;
use std::sync::Arc;

/// The store a session reads, kept in its configuration.
#[derive(Debug)]
pub struct SessionStore(pub Store);

/// Pins the newest manifest of the session's store in `state`, unless a version is pinned
/// already (or the session has no store).
pub fn pin(state: &mut SessionState) -> Result<()> {
    let config = state.config();
    if config.get_extension::<PinnedManifest>().is_some() {
        return Ok(());
    }
    let Some(store) = config.get_extension::<SessionStore>() else {
        return Ok(());
    };
    let manifest = store
        .0
        .manifest()
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    state
        .config_mut()
        .set_extension(Arc::new(PinnedManifest(manifest)));
    Ok(())
}

/// DataFusion's physical planner, run with the statement's manifest pinned.
#[derive(Debug, Default)]
pub struct PinningPlanner;

#[async_trait]
impl QueryPlanner for PinningPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = session
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| DataFusionError::Internal("gpuq plans with a SessionState".into()))?;
        let mut state = state.clone();
        pin(&mut state)?;
        DefaultPhysicalPlanner::default()
            .create_physical_plan(logical_plan, &state)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::open_session;
    use crate::tables::{ManifestTable, RunsTable};
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
    use datafusion::catalog::TableProvider;
    use datafusion::execution::context::SessionContext;
    use datafusion::logical_expr::{Expr, TableType};
    use gpuq_engine::schema::TableKind;
    use gpuq_engine::RunId;
    use gpuq_ingest::{IngestOptions, NoProgress};
    use gpuq_synth::{write_kineto, SynthConfig};
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Run `r` of a store, replaced in turn by two traces with different kernel counts.
    #[derive(Debug)]
    struct Flipper {
        store: Store,
        traces: [PathBuf; 2],
        next: AtomicUsize,
    }

    impl Flipper {
        fn new(store: &Store, dir: &Path) -> Flipper {
            let traces = [1u32, 3].map(|steps| {
                let path = dir.join(format!("steps{steps}.json"));
                let cfg = SynthConfig {
                    steps,
                    ..SynthConfig::small()
                };
                write_kineto(&cfg, std::fs::File::create(&path).unwrap()).unwrap();
                path
            });
            let flipper = Flipper {
                store: store.clone(),
                traces,
                next: AtomicUsize::new(0),
            };
            flipper.commit();
            flipper
        }

        /// Replaces run `r` with the other trace: one commit.
        fn commit(&self) {
            let i = self.next.fetch_add(1, Ordering::SeqCst) % 2;
            let opts = IngestOptions {
                run: Some(RunId::new("r").unwrap()),
                replace: true,
                ..Default::default()
            };
            gpuq_ingest::ingest(&self.store, &[self.traces[i].clone()], &opts, &NoProgress)
                .unwrap();
        }
    }

    /// A table that has a writer commit right after it is scanned, before the statement's
    /// next table is.
    #[derive(Debug)]
    struct CommitsAfterScan {
        inner: Arc<dyn TableProvider>,
        flipper: Arc<Flipper>,
    }

    #[async_trait]
    impl TableProvider for CommitsAfterScan {
        fn schema(&self) -> SchemaRef {
            self.inner.schema()
        }

        fn table_type(&self) -> TableType {
            TableType::Base
        }

        async fn scan(
            &self,
            state: &dyn Session,
            projection: Option<&Vec<usize>>,
            filters: &[Expr],
            limit: Option<usize>,
        ) -> Result<Arc<dyn ExecutionPlan>> {
            let plan = self.inner.scan(state, projection, filters, limit).await?;
            self.flipper.commit();
            Ok(plan)
        }
    }

    /// `runs.kernels` of run `r` and the number of its kernel rows, as one statement saw them.
    async fn kernels_both_ways(ctx: &SessionContext, runs: &str, events: &str) -> (i64, i64) {
        let sql = format!(
            "SELECT r.kernels, k.n FROM {runs} r JOIN \
             (SELECT run, count(*) AS n FROM {events} WHERE kind = 'kernel' GROUP BY run) k \
             ON r.run = k.run"
        );
        let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
        let b = batches.iter().find(|b| b.num_rows() > 0).expect("a row");
        let value = |i: usize| {
            let c = datafusion::arrow::compute::cast(b.column(i), &DataType::Int64).unwrap();
            c.as_primitive::<Int64Type>().value(0)
        };
        (value(0), value(1))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_table_of_a_statement_reads_the_version_pinned_when_it_was_planned() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let flipper = Arc::new(Flipper::new(&store, dir.path()));
        let ctx = open_session(&store).await.unwrap();
        let wrap = |inner: Arc<dyn TableProvider>| {
            Arc::new(CommitsAfterScan {
                inner,
                flipper: flipper.clone(),
            })
        };
        ctx.register_table("runs_c", wrap(Arc::new(RunsTable::new(store.clone()))))
            .unwrap();
        ctx.register_table(
            "events_c",
            wrap(Arc::new(ManifestTable::new(
                store.clone(),
                TableKind::Events,
            ))),
        )
        .unwrap();
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            // Whichever table is scanned first, a commit comes before the other's scan.
            let (meta, rows) = kernels_both_ways(&ctx, "runs_c", "events_c").await;
            assert_eq!(
                meta, rows,
                "runs.kernels and the kernel rows of one statement"
            );
            seen.insert(rows);
            flipper.commit();
        }
        assert_eq!(seen.len(), 2, "both traces were read: {seen:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_reader_sees_whole_versions_while_a_writer_commits_in_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        let flipper = Arc::new(Flipper::new(&store, dir.path()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (flipper, stop) = (flipper.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    flipper.commit();
                }
            })
        };
        let ctx = open_session(&store).await.unwrap();
        for _ in 0..40 {
            let (meta, rows) = kernels_both_ways(&ctx, "runs", "kernels").await;
            assert_eq!(
                meta, rows,
                "runs.kernels and the kernel rows of one statement"
            );
        }
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(
            flipper.next.load(Ordering::SeqCst) > 2,
            "the writer committed"
        );
    }
}
