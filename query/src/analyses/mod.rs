//! Analyses that answer "where does the GPU time go?": table functions registered in every
//! session, each also a `gpuq` subcommand that prints `SELECT * FROM <function>(...)`.
//!
//! | function | rows | definition |
//! |---|---|---|
//! | `top_kernels(run [, n] [, steps])` | per kernel name | [`top`] (Nsight Systems' `cuda_gpu_kern_sum`) |
//! | `gpu_gaps(run [, min_gap_ns])` | per idle interval of a device | [`gaps`] (nsys `gpu_gaps`, with causes) |
//! | `stream_gaps(run [, min_gap_ns])` | per idle interval of a stream | [`gaps`] (HTA's idle time breakdown) |
//! | `gpu_util(run [, chunks [, threshold_pct]])` | per time chunk of a device | [`gpu_util`] (nsys `gpu_time_util`) |
//! | `breakdown(run)` | per rank and device | [`breakdown`] |
//! | `stages(run)`, `step_stats(run)` | per stage / per step | [`stages`] |
//! | `launch_stats(run)` | per GPU operation | [`launch`] |
//! | `roofline(run)` | per GEMM-like operator and dtype | [`roofline`] (achieved TFLOP/s, arithmetic intensity, bound) |
//! | `findings(run)` | per finding | [`findings`] |
//! | `self_time(run)` | per host range name | [`self_time`] (exclusive time of nested host ranges) |
//! | `compare(a, b [, level [, threshold_pct]])` | per kernel / op / class / stage / metric | [`history::compare`] |
//! | `trend(selector, metric [, order_tag [, threshold_pct]])` | per run | [`history::trend`] |
//! | `repeatability(selector [, n])` | per kernel over repeated runs | [`history::repeatability`] |
//! | `scaling(selector, tag [, level])` | per kernel / op / class over tagged runs | [`history::scaling`] (time ≈ c · tag^k, k with a 95 % interval) |
//! | `collective_skew(run)` | per collective kernel name | [`skew`] |
//! | `gpu_projection(run)` | per host range name | [`projection`] (nsys `nvtx_gpu_proj_sum`, with GPU busy time) |
//! | `module_breakdown(run [, depth])` | per `nn.Module` path and pass | [`module`] |
//! | `profiler_overhead(run)` | per rank and overhead or launch API | [`overhead`] (what recording cost) |
//! | `precision(run)` | per kernel name and precision | [`precision`] (fp8 ... fp64, from kernel names and operator inputs) |
//! | `memory_usage(run)` | per rank, device and step | [`memory`] (allocator peak, operator at the peak, churn) |
//! | `inference_phases(run)` | per serving-engine step | [`phases`] (prefill / decode / mixed, batch, tokens, time per token, steady state) |
//! | `collectives(run)` | per collective kernel | [`collectives`] (message size, bus bandwidth, wait vs transfer, last rank) |
//!
//! Every analysis but `collective_skew` takes a step range as an optional trailing string
//! argument (`top_kernels('r', 10, '3..5')`, `breakdown('r', '4')`; see [`StepRange`] and
//! [`data::Scope`]).
//!
//! The definitions, and how they differ from HTA's, TraceLens' and Nsight Systems', are in
//! `docs/analyses.md`. An analysis reads only its run's rows (the scans prune by run), computes
//! in Rust over exact integer nanoseconds, and runs when the table is scanned, not when the
//! statement is planned.

pub mod breakdown;
pub mod collectives;
pub mod data;
pub mod findings;
pub mod gaps;
pub mod gpu_util;
pub mod history;
pub(crate) mod intervals;
pub mod launch;
pub mod memory;
pub mod module;
pub mod overhead;
pub mod phases;
pub mod precision;
pub mod projection;
pub mod roofline;
pub mod self_time;
pub mod skew;
pub mod stages;
pub mod top;

pub use top::top_kernels_sql;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::ScalarValue;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{SessionContext, SessionState};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;
use gpuq_engine::{RunId, Store};
use std::fmt;
use std::sync::Arc;

/// Quotes `s` as a SQL string literal.
pub fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The arguments of one call: the run, the optional integer parameters after it, and the
/// optional step range (a trailing string argument).
#[derive(Debug, Clone)]
pub struct Call {
    pub run: String,
    pub ints: Vec<Option<i64>>,
    pub steps: Option<StepRange>,
}

/// An inclusive range of profiler steps, as the commands' `--steps` and the table functions'
/// trailing argument write it: `'3..5'`, `'3..'`, `'..5'` or `'4'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRange {
    pub first: Option<i64>,
    pub last: Option<i64>,
}

impl StepRange {
    pub fn parse(text: &str) -> std::result::Result<StepRange, String> {
        let bad = || {
            format!("{text:?} is not a step range (write '3..5', '3..', '..5' or '4'; steps are integers >= 0)")
        };
        let number = |s: &str| -> std::result::Result<Option<i64>, String> {
            let s = s.trim();
            if s.is_empty() {
                return Ok(None);
            }
            match s.parse::<i64>() {
                Ok(n) if n >= 0 && s.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
                _ => Err(bad()),
            }
        };
        let range = match text.split_once("..") {
            Some((a, b)) => StepRange {
                first: number(a)?,
                last: number(b)?,
            },
            None => {
                let n = number(text)?.ok_or_else(bad)?;
                StepRange {
                    first: Some(n),
                    last: Some(n),
                }
            }
        };
        match (range.first, range.last) {
            (Some(a), Some(b)) if a > b => Err(format!(
                "step range {text:?} is empty: its first step {a} is after its last {b}"
            )),
            _ => Ok(range),
        }
    }

    pub fn contains(&self, step: i64) -> bool {
        self.first.is_none_or(|a| step >= a) && self.last.is_none_or(|b| step <= b)
    }
}

impl fmt::Display for StepRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.first, self.last) {
            (Some(a), Some(b)) if a == b => write!(f, "{a}"),
            (a, b) => {
                if let Some(a) = a {
                    write!(f, "{a}")?;
                }
                f.write_str("..")?;
                if let Some(b) = b {
                    write!(f, "{b}")?;
                }
                Ok(())
            }
        }
    }
}

impl Call {
    fn int(&self, i: usize) -> Option<i64> {
        self.ints.get(i).copied().flatten()
    }

    /// The part of the run the call selects: the steps of its step range, or all of it.
    pub(crate) async fn scope(&self, ctx: &SessionContext) -> Result<data::Scope> {
        data::Scope::load(ctx, &self.run, self.steps).await
    }

    /// The `run` column of a result of `rows` rows (every analysis's first column).
    pub(crate) fn run_column(&self, rows: usize) -> ArrayRef {
        Arc::new(datafusion::arrow::array::StringArray::from(vec![
            self.run
                .as_str(
                );
            rows
        ]))
    }
}

type Compute = fn(SessionContext, Call) -> BoxFuture<'static, Result<Vec<RecordBatch>>>;

/// One table function: its name, its optional integer parameters (after `run`), its output
/// schema and how it is computed.
pub struct Spec {
    pub name: &'static str,
    pub params: &'static [&'static str],
    pub schema: fn() -> SchemaRef,
    compute: Compute,
    /// Checks the integer parameters before anything runs.
    validate: fn(&Call) -> std::result::Result<(), String>,
}

impl Spec {
    /// A table function of the run (and an optional step range) alone: no integer
    /// parameters, nothing to check before it runs.
    pub(crate) const fn of_run(
        name: &'static str,
        schema: fn() -> SchemaRef,
        compute: Compute,
    ) -> Spec {
        Spec {
            name,
            params: &[],
            schema,
            compute,
            validate: no_checks,
        }
    }
}

impl Spec {
    /// Whether the function takes a step range after its parameters.
    pub fn takes_steps(&self) -> bool {
        !WITHOUT_STEPS.contains(&self.name)
    }
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Spec").field("name", &self.name).finish()
    }
}

/// Analyses that do not restrict themselves to a step range (a collective's skew is over every
/// instance).
const WITHOUT_STEPS: &[&str] = &["collective_skew"];

fn no_checks(_: &Call) -> std::result::Result<(), String> {
    Ok(())
}

/// Every analysis table function.
pub fn specs() -> Vec<&'static Spec> {
    vec![
        &top::TOP_KERNELS,
        &gaps::GPU_GAPS,
        &gaps::STREAM_GAPS,
        &gpu_util::GPU_UTIL,
        &breakdown::BREAKDOWN,
        &stages::STAGES,
        &stages::STEP_STATS,
        &launch::LAUNCH_STATS,
        &roofline::ROOFLINE,
        &findings::FINDINGS,
        &self_time::SELF_TIME,
        &skew::COLLECTIVE_SKEW,
        &projection::GPU_PROJECTION,
        &module::MODULE_BREAKDOWN,
        &precision::PRECISION,
        &overhead::PROFILER_OVERHEAD,
        &collectives::COLLECTIVES,
        &memory::MEMORY,
        &phases::INFERENCE_PHASES,
    ]
}

/// Registers every analysis as a table function of `ctx`.
pub fn register_all(ctx: &SessionContext, store: &Store) {
    for spec in specs() {
        ctx.register_udtf(
            spec.name,
            Arc::new(AnalysisFunction {
                spec,
                store: store.clone(),
            }),
        );
    }
    let store = store.clone();
    ctx.register_udtf(
        "compare",
        Arc::new(history::compare::CompareFunction {
            store: store.clone(),
        }),
    );
    ctx.register_udtf(
        "trend",
        Arc::new(history::trend::TrendFunction {
            store: store.clone(),
        }),
    );
    ctx.register_udtf(
        "scaling",
        Arc::new(history::scaling::ScalingFunction {
            store: store.clone(),
        }),
    );
    ctx.register_udtf(
        "repeatability",
        Arc::new(history::repeatability::RepeatabilityFunction { store }),
    );
}

/// `SELECT * FROM name('run', args...)`: the statement a subcommand runs.
pub fn select_sql(name: &str, run: &str, ints: &[Option<i64>]) -> String {
    select_sql_in(name, run, ints, None)
}

/// [`select_sql`] restricted to a step range (`'3..5'`), passed as the trailing argument.
pub fn select_sql_in(name: &str, run: &str, ints: &[Option<i64>], steps: Option<&str>) -> String {
    let mut args = vec![literal(run)];
    // Trailing parameters that are not given are left out; inner ones become NULL.
    let last = ints.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    args.extend(
        ints[..last]
            .iter()
            .map(|v| v.map_or("NULL".to_string(), |v| v.to_string())),
    );
    args.extend(steps.map(literal));
    format!("SELECT * FROM {name}({})", args.join(", "))
}

struct AnalysisFunction {
    spec: &'static Spec,
    store: Store,
}

impl fmt::Debug for AnalysisFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}()", self.spec.name)
    }
}

impl AnalysisFunction {
    fn usage(&self) -> String {
        let mut s = format!("{}(run", self.spec.name);
        for p in self.spec.params {
            s.push_str(&format!(" [, {p}"));
        }
        s.push_str(&"]".repeat(self.spec.params.len()));
        s.push_str(" [, 'steps'])");
        s
    }

    fn error(&self, msg: impl fmt::Display) -> DataFusionError {
        DataFusionError::Plan(format!("{msg} (usage: {})", self.usage()))
    }

    fn parse(&self, exprs: &[Expr]) -> Result<Call> {
        if exprs.is_empty() || exprs.len() > 2 + self.spec.params.len() {
            return Err(self.error(format!(
                "{} takes 1 to {} arguments, got {}",
                self.spec.name,
                2 + self.spec.params.len(),
                exprs.len()
            )));
        }
        let mut values = constant_args(exprs).map_err(|m| self.error(m))?;
        let run = match text_arg(&values[0]) {
            Some(s) => s.to_string(),
            None => return Err(self.error(format!("the run must be a string, got {}", values[0]))),
        };
        // A text argument after the run can only be the step range, and it comes last.
        let mut steps = None;
        if values.len() > 1 {
            if let Some(text) = values.last().and_then(text_arg) {
                let range = StepRange::parse(text).map_err(|m| {
                    match self.spec.params.get(values.len() - 2) {
                        Some(p) => self.error(format!("{m}, nor an integer {p}")),
                        None => self.error(m),
                    }
                })?;
                if WITHOUT_STEPS.contains(&self.spec.name) {
                    return Err(self.error(format!("{} takes no step range", self.spec.name)));
                }
                steps = Some(range);
                values.pop();
            }
        }
        let mut ints = Vec::new();
        for (v, name) in values[1..].iter().zip(self.spec.params) {
            ints.push(if v.is_null() {
                None
            } else {
                let n = v
                    .cast_to(&datafusion::arrow::datatypes::DataType::Int64)
                    .map_err(|_| self.error(format!("{name} must be an integer, got {v}")))?;
                match n {
                    ScalarValue::Int64(n) => n,
                    _ => None,
                }
            });
        }
        if values.len() > 1 + self.spec.params.len() {
            return Err(self.error(format!(
                "{} takes at most {} integer arguments after the run, got {}",
                self.spec.name,
                self.spec.params.len(),
                values.len() - 1
            )));
        }
        let call = Call { run, ints, steps };
        (self.spec.validate)(&call).map_err(|m| self.error(m))?;
        Ok(call)
    }
}

impl TableFunctionImpl for AnalysisFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let call = self.parse(args.exprs())?;
        let run = RunId::new(call.run.as_str())
            .map_err(|e| DataFusionError::Plan(format!("{}: {e}", self.spec.name)))?;
        let manifest = crate::tables::statement_manifest(&self.store, args.session().config())?;
        if !manifest.runs.contains_key(&run) {
            return Err(DataFusionError::Plan(format!(
                "{}: unknown run {run} (see `SELECT run FROM runs`)",
                self.spec.name
            )));
        }
        let compute = self.spec.compute;
        Ok(Arc::new(LazyTable {
            name: self.spec.name,
            schema: (self.spec.schema)(),
            compute: Arc::new(move |ctx| compute(ctx, call.clone())),
        }))
    }
}

/// Computes a table function's rows from a session over the store.
pub(crate) type LazyCompute =
    Arc<dyn Fn(SessionContext) -> BoxFuture<'static, Result<Vec<RecordBatch>>> + Send + Sync>;

/// The table a call returns; computed when scanned, not when the statement is planned.
pub(crate) struct LazyTable {
    pub name: &'static str,
    pub schema: SchemaRef,
    pub compute: LazyCompute,
}

impl fmt::Debug for LazyTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(...)", self.name)
    }
}

#[async_trait]
impl TableProvider for LazyTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = state
            .as_any()
            .downcast_ref::<SessionState>()
            .ok_or_else(|| DataFusionError::Internal("analyses need a SessionState".into()))?;
        let ctx = SessionContext::new_with_state(state.clone());
        // On a task of its own, aborted when the statement is dropped (Ctrl-C): the caller
        // sees the drop at once, and the work stops at its next await; its queries stop
        // within a time slice (`data::collect`).
        let batches = SpawnedTask::spawn((self.compute)(ctx))
            .join()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))??;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            self.schema(),
            projection.cloned(),
        )?)
    }
}

/// The arguments of a table function call as constants (folded, so `1 + 1` is 2).
pub(crate) fn constant_args(exprs: &[Expr]) -> std::result::Result<Vec<ScalarValue>, String> {
    let simplifier = ExprSimplifier::new(SimplifyContext::default());
    exprs
        .iter()
        .map(|e| match simplifier.simplify(e.clone()) {
            Ok(Expr::Literal(v, _)) => Ok(v),
            Ok(other) => Err(format!("argument {other} is not a constant")),
            Err(e) => Err(e.to_string()),
        })
        .collect()
}

/// The constant arguments of a call of a table function that takes selectors and options
/// (`compare`, `trend`, `repeatability`), with errors that end in its usage line.
pub(crate) struct FnArgs {
    values: Vec<ScalarValue>,
    usage: &'static str,
}

impl FnArgs {
    /// `usage` starts with the function's name: `compare(a, b [, level])`.
    pub fn parse(
        exprs: &[Expr],
        usage: &'static str,
        arity: std::ops::RangeInclusive<usize>,
    ) -> Result<FnArgs> {
        let name = usage.split('(').next().unwrap_or(usage);
        let error = |m: String| DataFusionError::Plan(format!("{m} (usage: {usage})"));
        let values = constant_args(exprs).map_err(error)?;
        if !arity.contains(&values.len()) {
            return Err(error(format!(
                "{name} takes {} to {} arguments, got {}",
                arity.start(),
                arity.end(),
                values.len()
            )));
        }
        Ok(FnArgs { values, usage })
    }

    pub fn error(&self, m: impl fmt::Display) -> DataFusionError {
        DataFusionError::Plan(format!("{m} (usage: {})", self.usage))
    }

    fn given(&self, i: usize) -> Option<&ScalarValue> {
        self.values.get(i).filter(|v| !v.is_null())
    }

    /// Text argument `i`, `None` when absent or NULL.
    pub fn text(&self, i: usize, what: &str) -> Result<Option<String>> {
        self.given(i)
            .map(|v| {
                text_arg(v)
                    .map(str::to_string)
                    .ok_or_else(|| self.error(format!("{what} must be a string, got {v}")))
            })
            .transpose()
    }

    /// A required text argument.
    pub fn required_text(&self, i: usize, what: &str) -> Result<String> {
        self.text(i, what)?
            .ok_or_else(|| self.error(format!("{what} must be a string, got NULL")))
    }

    /// Number argument `i` that must satisfy `ok` (described by `rule`), `None` when absent.
    pub fn number(
        &self,
        i: usize,
        what: &str,
        rule: &str,
        ok: fn(f64) -> bool,
    ) -> Result<Option<f64>> {
        self.given(i)
            .map(|v| {
                number_arg(v)
                    .filter(|x| ok(*x))
                    .ok_or_else(|| self.error(format!("{what} must be {rule}, got {v}")))
            })
            .transpose()
    }
}

/// A numeric argument as f64, `None` when it is not a finite number.
pub(crate) fn number_arg(v: &ScalarValue) -> Option<f64> {
    match v
        .cast_to(&datafusion::arrow::datatypes::DataType::Float64)
        .ok()?
    {
        ScalarValue::Float64(Some(x)) if x.is_finite() => Some(x),
        _ => None,
    }
}

/// A text argument, `None` when it is not text.
pub(crate) fn text_arg(v: &ScalarValue) -> Option<&str> {
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s),
        _ => None,
    }
}

/// One output batch from columns in schema order.
pub(crate) fn batch(schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<Vec<RecordBatch>> {
    Ok(vec![RecordBatch::try_new(schema, columns)?])
}

#[cfg(test)]
mod tests;
