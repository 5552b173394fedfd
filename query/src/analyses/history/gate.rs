//! The verdict of the regression gate (`gpuq check`): which gated summary metrics of the
//! candidate runs regressed significantly beyond the threshold against the baseline runs,
//! which moved past it but could not be tested, and the kernels behind a regression. The
//! CLI only renders the [`GateReport`].

use super::compare::{self, Row};
use super::profile::{Level, SUMMARY_METRICS};
use super::selector::run_names;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use gpuq_engine::Store;

/// What the gate compares and how it judges.
pub struct GateOptions<'a> {
    /// Selector of the baseline runs (their median is the baseline).
    pub baseline: &'a str,
    /// Selector of the runs under test.
    pub candidate: &'a str,
    /// Largest accepted regression, in percent (the comparison's threshold).
    pub max_regression: f64,
    /// The gated summary metrics.
    pub metrics: &'a [String],
    /// Whether a gated metric past the threshold that could not be tested fails the gate.
    pub fail_untested: bool,
}

/// Why the gate could not judge.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("unknown metric {0:?} (one of {list})", list = SUMMARY_METRICS.join(", "))]
    UnknownMetric(String),
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// The gate's verdict and what it rests on.
#[derive(Debug)]
pub struct GateReport {
    pub baseline_runs: Vec<String>,
    pub candidate_runs: Vec<String>,
    /// Whether an untested gated metric counts as a regression ([`GateOptions::fail_untested`]).
    pub fail_untested: bool,
    /// The gated metrics' comparison rows (all ranks together).
    pub gated: Vec<Row>,
    /// Gated metrics past the threshold that could not be tested.
    pub untested: Vec<Row>,
    /// Up to 10 kernels that got slower or appeared, largest change first; looked up only
    /// when a gated metric regressed (the passing path of a CI gate stays cheap).
    pub evidence: Vec<Row>,
    /// How many gated metrics regressed.
    pub failures: usize,
}

impl GateReport {
    /// No gated metric regressed.
    pub fn pass(&self) -> bool {
        self.failures == 0
    }

    /// Whether `r` counts as a regression: significantly slower, or untested when
    /// untested changes fail (without a test, noise cannot be excluded).
    pub fn is_regression(&self, r: &Row) -> bool {
        r.status == "slower" || (self.fail_untested && r.status == "slower (untested)")
    }
}

/// Judges `opts.candidate` against `opts.baseline` on the gated metrics.
pub async fn gate(
    ctx: &SessionContext,
    store: &Store,
    opts: &GateOptions<'_>,
) -> Result<GateReport, GateError> {
    if let Some(m) = opts
        .metrics
        .iter()
        .find(|m| !SUMMARY_METRICS.contains(&m.as_str()))
    {
        return Err(GateError::UnknownMetric(m.clone()));
    }
    let baseline_runs = run_names(ctx, store, opts.baseline).await?;
    let candidate_runs = run_names(ctx, store, opts.candidate).await?;
    let gated_names: Vec<&str> = opts.metrics.iter().map(String::as_str).collect();
    let summary = compare::compare_runs(
        ctx,
        &baseline_runs,
        &candidate_runs,
        Level::Summary,
        &gated_names,
        opts.max_regression,
    )
    .await?;
    let mut report = GateReport {
        baseline_runs,
        candidate_runs,
        fail_untested: opts.fail_untested,
        gated: summary
            .into_iter()
            .filter(|r| r.rank.is_none() && opts.metrics.contains(&r.name))
            .collect(),
        untested: Vec::new(),
        evidence: Vec::new(),
        failures: 0,
    };
    report.untested = report
        .gated
        .iter()
        .filter(|r| r.is_untested())
        .cloned()
        .collect();
    report.failures = report
        .gated
        .iter()
        .filter(|r| report.is_regression(r))
        .count();
    if report.failures > 0 {
        let kernels = compare::compare_runs(
            ctx,
            &report.baseline_runs,
            &report.candidate_runs,
            Level::Kernel,
            &[],
            opts.max_regression,
        )
        .await?;
        report.evidence = kernels
            .into_iter()
            .filter(|r| r.rank.is_none() && (r.status.starts_with("slower") || r.status == "added"))
            .take(10)
            .collect();
    }
    Ok(report)
}
