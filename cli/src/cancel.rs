//! Making a running statement stoppable. Ctrl-C drops the statement's future, and DataFusion
//! aborts the tasks it spawned; but an aborted task stops only when its poll returns, and an
//! operator that never waits (a nested-loop join over in-memory batches, an aggregate over a
//! join's output) can keep a core busy for minutes inside one poll. [`yielding`] puts a
//! [`YieldingExec`] above every operator of the plan: every batch that passes one of them
//! checks the clock, and after [`TIME_SLICE`] without a pause its stream returns `Pending`
//! once (waking itself at once), so the task's poll ends and an abort takes effect.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::Stream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a stream may produce batches without returning to the scheduler.
pub const TIME_SLICE: Duration = Duration::from_millis(20);

/// `plan` with a [`YieldingExec`] above each of its operators. `EXPLAIN ANALYZE` plans are left
/// as they are, so that their output shows the plan that was asked for.
pub fn yielding(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    if plan.name() == "AnalyzeExec" {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        Ok(Transformed::new(
            Arc::new(YieldingExec::new(node)) as Arc<dyn ExecutionPlan>,
            true,
            TreeNodeRecursion::Continue,
        ))
    })
    .map(|t| t.data)
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
        let wrapped = yielding(plan).unwrap();
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
        let plan = yielding(df.create_physical_plan().await.unwrap()).unwrap();
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
}
