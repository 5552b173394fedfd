//! Making running queries stoppable: the shell's statements and the queries an analysis runs
//! inside its table function ([`collect`] runs both). Ctrl-C drops the statement's future, and
//! DataFusion aborts the tasks it spawned; but an aborted task stops only when its poll
//! returns, and an operator that never waits (a nested-loop join over in-memory batches, an aggregate over a
//! join's output) can keep a core busy for minutes inside one poll. [`yielding`] puts a
//! [`YieldingExec`] above every operator of the plan: every batch that passes one of them
//! checks the clock, and after [`TIME_SLICE`] without a pause its stream returns `Pending`
//! once (waking itself at once), so the task's poll ends and an abort takes effect.
//!
//! DataFusion's own cooperative yielding (`CooperativeExec`, put above the plan's leaves by the
//! `EnsureCooperative` rule since version 49) does not cover these cases: it spends tokio's
//! task budget only when a leaf (a scan, an exchange) is polled, and a join that makes many
//! output batches from one input batch (a self-join on repeated keys), with the aggregate above
//! it, goes on inside one poll without polling a leaf. The test
//! `datafusions_own_yielding_leaves_an_aggregate_over_a_join_in_one_poll` pins this.
//!
//! A nested-loop join whose filter almost never matches does not return from one poll either:
//! it tests every buffered left row against a right batch, and only a full output batch or the
//! next right batch ends the poll. Its filter is therefore made stoppable ([`StopOnDrop`]): once
//! the statement is dropped, the filter's next evaluation (one per left row) fails, which ends
//! the join's task.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{FieldRef, Schema};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{NestedLoopJoinExec, NestedLoopJoinExecBuilder};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::Stream;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a stream may produce batches without returning to the scheduler.
pub const TIME_SLICE: Duration = Duration::from_millis(20);

/// Runs `df` to the end and collects its batches. Dropping the future stops the work within a
/// [`TIME_SLICE`] or so: the plan runs [`yielding`], on a task of its own that the drop aborts,
/// so that the caller (a `select!` on Ctrl-C) sees the drop even while an operator is inside a
/// long poll.
pub async fn collect(df: DataFrame) -> Result<Vec<RecordBatch>> {
    let task = Arc::new(df.task_ctx());
    let stop = StopOnDrop::default();
    let plan = yielding(df.create_physical_plan().await?, &stop.flag())?;
    let batches = SpawnedTask::spawn(datafusion::physical_plan::collect(plan, task))
        .join()
        .await
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))??;
    drop(stop);
    Ok(batches)
}

/// Raised when dropped: the statement that holds it was dropped (or has ended), and the plan's
/// stoppable parts ([`yielding`]) stop at their next step.
#[derive(Debug, Default)]
pub struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `plan` with a [`YieldingExec`] above each of its operators, and its nested-loop joins'
/// filters failing once `stop` is raised. `EXPLAIN ANALYZE` plans are left as they are, so
/// that their output shows the plan that was asked for.
pub fn yielding(
    plan: Arc<dyn ExecutionPlan>,
    stop: &Arc<AtomicBool>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if plan.name() == "AnalyzeExec" {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let node = stoppable_join(node, stop)?;
        Ok(Transformed::new(
            Arc::new(YieldingExec::new(node)) as Arc<dyn ExecutionPlan>,
            true,
            TreeNodeRecursion::Continue,
        ))
    })
    .map(|t| t.data)
}

/// A nested-loop join with its filter wrapped in a [`StoppableExpr`]; any other node as it is.
fn stoppable_join(
    node: Arc<dyn ExecutionPlan>,
    stop: &Arc<AtomicBool>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(join) = node.downcast_ref::<NestedLoopJoinExec>() else {
        return Ok(node);
    };
    let Some(filter) = join.filter() else {
        return Ok(node);
    };
    let expression = Arc::new(StoppableExpr {
        inner: filter.expression().clone(),
        stop: stop.clone(),
    });
    let filter = JoinFilter::new(
        expression,
        filter.column_indices().to_vec(),
        filter.schema().clone(),
    );
    Ok(Arc::new(
        NestedLoopJoinExecBuilder::from(join)
            .with_filter(Some(filter))
            .build()?,
    ))
}

/// Evaluates `inner`, or fails once `stop` is raised.
#[derive(Debug)]
struct StoppableExpr {
    inner: Arc<dyn PhysicalExpr>,
    stop: Arc<AtomicBool>,
}

impl PartialEq for StoppableExpr {
    fn eq(&self, other: &Self) -> bool {
        self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for StoppableExpr {}

impl Hash for StoppableExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

impl std::fmt::Display for StoppableExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl PhysicalExpr for StoppableExpr {
    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(datafusion::error::DataFusionError::Execution(
                "the statement was cancelled".into(),
            ));
        }
        self.inner.evaluate(batch)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(Arc::new(StoppableExpr {
            inner: children.swap_remove(0),
            stop: self.stop.clone(),
        }))
    }

    fn fmt_sql(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt_sql(f)
    }
}

/// Passes its input's batches through unchanged, pausing its stream after each
/// [`TIME_SLICE`] of work.
#[derive(Debug, Clone)]
pub struct YieldingExec {
    input: Arc<dyn ExecutionPlan>,
}

impl YieldingExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> YieldingExec {
        YieldingExec { input }
    }
}

impl DisplayAs for YieldingExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "YieldingExec")
    }
}

impl ExecutionPlan for YieldingExec {
    fn name(&self) -> &str {
        "YieldingExec"
    }

    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(datafusion::error::DataFusionError::Internal(format!(
                "YieldingExec has one input, got {}",
                children.len()
            )));
        }
        Ok(Arc::new(YieldingExec::new(children.swap_remove(0))))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(YieldingStream {
            input: self.input.execute(partition, context)?,
            since: None,
        }))
    }
}

struct YieldingStream {
    input: SendableRecordBatchStream,
    /// When the stream last paused (or first ran).
    since: Option<Instant>,
}

impl Stream for YieldingStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = Instant::now();
        match self.since {
            Some(t) if now.duration_since(t) >= TIME_SLICE => {
                self.since = Some(now);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            None => self.since = Some(now),
            _ => {}
        }
        let polled = self.input.as_mut().poll_next(cx);
        if polled.is_pending() {
            // It waited anyway: a new slice starts.
            self.since = Some(Instant::now());
        }
        polled
    }
}

impl RecordBatchStream for YieldingStream {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn every_operator_is_wrapped_and_results_are_unchanged() {
        let ctx = SessionContext::new();
        let sql = "SELECT a.v % 7 AS k, count(*) AS n FROM generate_series(1, 3000) a(v), \
                   generate_series(1, 300) b(v) WHERE a.v + b.v > 100 GROUP BY k ORDER BY k";
        let plain = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let df = ctx.sql(sql).await.unwrap();
        let task = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await.unwrap();
        let operators = count(&plan);
        let stop = StopOnDrop::default();
        let wrapped = yielding(plan, &stop.flag()).unwrap();
        assert_eq!(count(&wrapped), 2 * operators);
        assert_eq!(wrapped.name(), "YieldingExec");
        let batches = datafusion::physical_plan::collect(wrapped, task)
            .await
            .unwrap();
        let text = |b: &[RecordBatch]| {
            datafusion::arrow::util::pretty::pretty_format_batches(b)
                .unwrap()
                .to_string()
        };
        assert_eq!(text(&batches), text(&plain));
    }

    fn count(plan: &Arc<dyn ExecutionPlan>) -> usize {
        1 + plan.children().into_iter().map(count).sum::<usize>()
    }

    /// A stream that is always ready pauses once per time slice.
    #[tokio::test]
    async fn a_busy_stream_pauses_after_each_time_slice() {
        use futures::StreamExt;
        let ctx = SessionContext::new();
        let df = ctx
            .sql("SELECT v FROM generate_series(1, 100000000) t(v)")
            .await
            .unwrap();
        let task = Arc::new(df.task_ctx());
        let stop = StopOnDrop::default();
        let plan = yielding(df.create_physical_plan().await.unwrap(), &stop.flag()).unwrap();
        let mut stream = plan.execute(0, task).unwrap();
        let started = Instant::now();
        let mut pauses = 0;
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while started.elapsed() < Duration::from_millis(300) {
            match stream.poll_next_unpin(&mut cx) {
                Poll::Pending => pauses += 1,
                Poll::Ready(Some(b)) => assert!(b.unwrap().num_rows() > 0),
                Poll::Ready(None) => break,
            }
        }
        assert!(pauses >= 5, "{pauses} pauses in 300 ms");
    }

    /// One partition, so that the whole plan runs inside the polls of one stream.
    async fn one_partition(sql: &str) -> (Arc<dyn ExecutionPlan>, Arc<TaskContext>) {
        let config = datafusion::prelude::SessionConfig::new().with_target_partitions(1);
        let ctx = SessionContext::new_with_config(config);
        ctx.sql("CREATE TABLE t AS SELECT 1 AS k, value AS v FROM generate_series(1, 4000)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let df = ctx.sql(sql).await.unwrap();
        let task = Arc::new(df.task_ctx());
        (df.create_physical_plan().await.unwrap(), task)
    }

    /// The first poll of the plan's stream, made inside a tokio task (where DataFusion's
    /// cooperative yielding spends the task's budget): a batch, or `None` for `Pending`.
    async fn first_poll(plan: Arc<dyn ExecutionPlan>, task: Arc<TaskContext>) -> Option<usize> {
        use futures::StreamExt;
        tokio::spawn(async move {
            let mut stream = plan.execute(0, task).unwrap();
            std::future::poll_fn(|cx| {
                Poll::Ready(match stream.poll_next_unpin(cx) {
                    Poll::Ready(Some(b)) => Some(b.unwrap().num_rows()),
                    Poll::Ready(None) => Some(0),
                    Poll::Pending => None,
                })
            })
            .await
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn datafusions_own_yielding_leaves_an_aggregate_over_a_join_in_one_poll() {
        // 4000 × 4000 rows out of one probe batch: the aggregate consumes them all within one
        // poll of DataFusion's plan, its CooperativeExec leaves never asked again.
        let sql = "SELECT count(*) FROM t a JOIN t b ON a.k = b.k";
        let (plan, task) = one_partition(sql).await;
        assert_eq!(first_poll(plan.clone(), task.clone()).await, Some(1));
        let stop = StopOnDrop::default();
        let wrapped = yielding(plan, &stop.flag()).unwrap();
        assert_eq!(first_poll(wrapped, task).await, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nested_loop_join_that_never_matches_stops_when_its_statement_is_dropped() {
        // 200000 buffered rows tested against each right batch, never matching: no output
        // batch ends a poll, which lasts seconds.
        let sql = "SELECT count(*) FROM generate_series(1, 200000) a(v), \
                   generate_series(1, 200000) b(v) WHERE a.v + b.v < 0";
        let (plan, task) = one_partition(sql).await;
        assert!(format!(
            "{}",
            datafusion::physical_plan::displayable(plan.as_ref()).indent(false)
        )
        .contains("NestedLoopJoinExec"),);
        let stop = StopOnDrop::default();
        let plan = yielding(plan, &stop.flag()).unwrap();
        let running = tokio::spawn(datafusion::physical_plan::collect(plan, task));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !running.is_finished(),
            "the join ended before it was stopped"
        );
        let started = Instant::now();
        drop(stop);
        let ended = tokio::time::timeout(Duration::from_secs(20), running).await;
        let result = ended.expect("the join went on after its statement was dropped");
        let err = result.unwrap().unwrap_err().to_string();
        assert!(err.contains("cancelled"), "{err}");
        eprintln!("stopped {:?} after the drop", started.elapsed());
    }

    /// An analysis's table function runs its queries while the statement is planned. Dropping
    /// the statement (Ctrl-C in the shell) ends all of its work within a second, even a query
    /// that never returns from a poll; before, that query went on until its plan ended.
    #[test]
    fn an_analysis_stops_when_its_statement_is_dropped() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let config = datafusion::prelude::SessionConfig::new().with_target_partitions(1);
        let ctx = SessionContext::new_with_config(config);
        let analysis = crate::analyses::LazyTable {
            name: "endless",
            schema: Arc::new(Schema::new(vec![datafusion::arrow::datatypes::Field::new(
                "n",
                datafusion::arrow::datatypes::DataType::Int64,
                false,
            )])),
            compute: Arc::new(|ctx| {
                Box::pin(async move {
                    // Hours of a nested-loop join whose filter never matches.
                    crate::analyses::data::collect(
                        &ctx,
                        "SELECT count(*) AS n FROM generate_series(1, 200000) a(v), \
                         generate_series(1, 200000) b(v) WHERE a.v + b.v < 0",
                    )
                    .await
                })
            }),
        };
        ctx.register_table("endless", Arc::new(analysis)).unwrap();
        let statement = runtime.spawn(async move {
            let df = ctx.sql("SELECT * FROM endless").await?;
            collect(df).await
        });
        std::thread::sleep(Duration::from_millis(500));
        let metrics = runtime.metrics();
        assert!(
            metrics.num_alive_tasks() >= 2,
            "the analysis is not running: {} tasks",
            metrics.num_alive_tasks()
        );
        statement.abort();
        let dropped = Instant::now();
        while metrics.num_alive_tasks() > 0 {
            assert!(
                dropped.elapsed() < Duration::from_secs(1),
                "{} tasks still running {:?} after the statement was dropped",
                metrics.num_alive_tasks(),
                dropped.elapsed()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("all work ended {:?} after the drop", dropped.elapsed());
    }
}
