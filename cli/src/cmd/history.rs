//! The history commands: `gpuq diff`, `trend`, `scaling`, `check`, `repeat`, `skew`. `check`
//! prints the verdict of [`gpuq_query::analyses::history::gate`]; it does not judge.

use super::analysis::analysis;
use crate::args::OutputFormat;
use crate::exec::{exit_code, one_line, open_store, run_sql_text};
use crate::output::write_batches;
use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::context::SessionContext;
use gpuq_engine::Store;
use gpuq_query::analyses::history::compare::{self, Row};
use gpuq_query::analyses::history::gate::{gate, GateOptions, GateReport};
use gpuq_query::analyses::history::profile::Level;
use gpuq_query::analyses::history::trend::{self, Metric, Point};
use gpuq_query::analyses::{literal, select_sql};
use gpuq_query::functions::durations::fmt_dur;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// A table of text columns for people.
fn text_batch(headers: &[&str], rows: &[Vec<String>]) -> anyhow::Result<RecordBatch> {
    let schema = Arc::new(Schema::new(
        headers
            .iter()
            .map(|h| Field::new(*h, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let columns: Vec<ArrayRef> = (0..headers.len())
        .map(|c| Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r[c]))) as ArrayRef)
        .collect();
    Ok(RecordBatch::try_new(schema, columns)?)
}

fn print_text(headers: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let b = text_batch(headers, rows)?;
    write_batches(
        &mut std::io::stdout(),
        OutputFormat::Table,
        &b.schema(),
        &[b],
    )
}

fn pct_change(r: &Row) -> String {
    r.ratio()
        .map_or("new".into(), |x| format!("{:+.1} %", 100.0 * (x - 1.0)))
}

/// A key's change beyond the run-wide shift it was judged against (`-` without one).
fn vs_run(r: &Row) -> String {
    match (r.run_shift, r.judged_ratio()) {
        (Some(_), Some(x)) => format!("{:+.1} %", 100.0 * (x - 1.0)),
        _ => "-".into(),
    }
}

fn p_text(p: Option<f64>) -> String {
    p.map_or("-".into(), |p| {
        if p < 1e-4 {
            "<0.0001".into()
        } else {
            format!("{p:.4}")
        }
    })
}

/// `gpuq diff A B`: the summary metrics, then the changed keys of the level.
pub(super) async fn diff(
    ctx: &SessionContext,
    a: &str,
    b: &str,
    level: &str,
    threshold: f64,
    limit: Option<usize>,
    all: bool,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let level = Level::parse(level).map_err(anyhow::Error::msg)?;
    let level_name = level.name();
    let call = |lvl: &str| {
        format!(
            "compare({}, {}, '{lvl}', {threshold})",
            literal(a),
            literal(b)
        )
    };
    let filter = if all {
        ""
    } else {
        " AND status <> 'unchanged'"
    };
    let sql = if format == OutputFormat::Table {
        let mut sql = format!(
            "SELECT name AS metric, fmt_dur(CAST(value_a AS BIGINT)) AS a, \
             fmt_dur(CAST(value_b AS BIGINT)) AS b, fmt_dur(delta) AS \"b - a\", \
             round(100 * (ratio - 1), 1) AS change_pct, test, round(p_adjusted, 4) AS p_adjusted, \
             status, coalesce(note, '') AS note FROM {} WHERE rank IS NULL AND count_a + count_b > 0",
            call("summary")
        );
        if level != Level::Summary {
            sql.push_str(&format!(
                "; SELECT CASE WHEN length(name) > 100 THEN left(name, 97) || '...' ELSE name END \
                 AS name, count_a, count_b, fmt_dur(CAST(value_a AS BIGINT)) AS a, \
                 fmt_dur(CAST(value_b AS BIGINT)) AS b, fmt_dur(delta) AS \"b - a\", \
                 round(100 * (ratio - 1), 1) AS change_pct, round(p_adjusted, 4) AS p_adj, status \
                 FROM {} WHERE rank IS NULL{filter} ORDER BY abs(delta) DESC, name LIMIT {}",
                call(level_name),
                limit.unwrap_or(20)
            ));
        }
        sql
    } else {
        let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
        format!(
            "SELECT * FROM {} WHERE true{filter} ORDER BY rank NULLS FIRST, abs(delta) DESC, name{limit}",
            call(level_name)
        )
    };
    if format == OutputFormat::Table {
        println!(
            "a = {a}, b = {b}; per step when both sides have steps; without steps, kernels per \
             instance and the summary per second of window; \
             changes under {threshold} % or not significant (p < {}) are unchanged; \
             without steps or with one, keys are judged relative to the run-wide shift \
             (compare()'s run_shift; the summary's notes show it)\n",
            compare::ALPHA
        );
    }
    let failed = run_sql_text(ctx, &sql, format, &mut std::io::stdout()).await;
    Ok(exit_code(failed))
}

const SPARKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The most marks a sparkline has: one line on a terminal however many runs there are.
const SPARK_WIDTH: usize = 80;

/// Consecutive values merged into at most [`SPARK_WIDTH`], each the value of its share of the
/// runs farthest from the median of all (a spike or a dip in one run of thousands still
/// shows, whichever way is worse for the metric), and how many runs a mark stands for.
fn spark_marks(values: &[Option<f64>]) -> (Vec<Option<f64>>, usize) {
    if values.len() <= SPARK_WIDTH {
        return (values.to_vec(), 1);
    }
    let mut present: Vec<f64> = values.iter().flatten().copied().collect();
    present.sort_by(f64::total_cmp);
    let median = present.get(present.len() / 2).copied().unwrap_or(0.0);
    let per = values.len().div_ceil(SPARK_WIDTH);
    let marks = values
        .chunks(per)
        .map(|c| {
            c.iter()
                .flatten()
                .copied()
                .max_by(|a, b| (a - median).abs().total_cmp(&(b - median).abs()))
        })
        .collect();
    (marks, per)
}

/// A terminal sparkline of `values` (missing values as spaces).
fn sparkline(values: &[Option<f64>]) -> String {
    let present: Vec<f64> = values.iter().flatten().copied().collect();
    let (lo, hi) = present
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
            (l.min(*v), h.max(*v))
        });
    values
        .iter()
        .map(|v| match v {
            None => ' ',
            Some(_) if hi <= lo => SPARKS[3],
            Some(v) => SPARKS[(((v - lo) / (hi - lo)) * 7.0).round() as usize],
        })
        .collect()
}

/// `gpuq scaling`: per key, the exponent of its time against a numeric tag.
pub(super) async fn scaling(
    ctx: &SessionContext,
    selector: &str,
    tag: &str,
    level: &str,
    limit: usize,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let call = format!(
        "scaling({}, {}, {})",
        literal(selector),
        literal(tag),
        literal(level)
    );
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT name, round(exponent, 2) AS exponent, round(ci_low, 2) AS ci_low, \
             round(ci_high, 2) AS ci_high, growth, runs, tag_min, tag_max, \
             fmt_dur(CAST(time_at_max AS BIGINT)) AS time_at_max, round(r2, 3) AS r2 \
             FROM {call} LIMIT {limit}"
        )
    } else {
        format!("SELECT * FROM {call} LIMIT {limit}")
    };
    let failed = run_sql_text(ctx, &sql, format, &mut std::io::stdout()).await;
    Ok(exit_code(failed))
}

pub(super) async fn trend(
    ctx: &SessionContext,
    store: &Store,
    selector: &str,
    metric: &str,
    order_tag: Option<&str>,
    threshold: f64,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let metric = Metric::parse(metric).map_err(anyhow::Error::msg)?;
    let points = trend::trend(ctx, store, selector, &metric, order_tag, threshold).await?;
    if format != OutputFormat::Table {
        let batches = trend::to_batch(&points, metric.unit())?;
        write_batches(&mut std::io::stdout(), format, &trend::schema(), &batches)?;
        return Ok(ExitCode::SUCCESS);
    }
    let show = |v: Option<f64>| match (v, metric.unit()) {
        (None, _) => "-".to_string(),
        (Some(v), "%") => format!("{v:.1} %"),
        (Some(v), _) => fmt_dur(v.round() as i64),
    };
    let rows: Vec<Vec<String>> = points
        .iter()
        .enumerate()
        .map(|(i, p): (usize, &Point)| {
            vec![
                (i + 1).to_string(),
                p.run.clone(),
                p.order_key.clone().unwrap_or_else(|| {
                    chrono::DateTime::from_timestamp_nanos(p.captured_ns)
                        .format("%Y-%m-%d %H:%M:%S")
                        .to_string()
                }),
                p.samples.len().to_string(),
                show(p.value),
                p.change_pct.map_or("".into(), |c| format!("{c:+.1} %")),
                if p.change_point {
                    "<< change".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    let at = order_tag.unwrap_or("captured");
    print_text(
        &[
            "#",
            "run",
            at,
            "steps",
            "value",
            "vs before",
            "change point",
        ],
        &rows,
    )?;
    let values: Vec<Option<f64>> = points.iter().map(|p| p.value).collect();
    let changes = points.iter().filter(|p| p.change_point).count();
    let (marks, per) = spark_marks(&values);
    let merged = if per > 1 {
        format!(" (a mark: of {per} runs, the one farthest from the median)")
    } else {
        String::new()
    };
    println!(
        "{}  {} run(s), {} change point(s); value = median per step (total for runs without steps){merged}",
        sparkline(&marks),
        points.len(),
        changes
    );
    Ok(ExitCode::SUCCESS)
}

/// `gpuq check`: exit 1 on a significant regression of a gated metric; a check that could
/// not run exits 2, so CI can tell them apart. The verdict is [`gate`]'s; this prints it.
pub(super) async fn check(
    store_path: &Path,
    opts: &GateOptions<'_>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let checked = async {
        let store = open_store(store_path)?;
        let ctx = gpuq_query::open_session(&store).await?;
        let report = gate(&ctx, &store, opts).await?;
        print_gate(&report, opts, format)?;
        anyhow::Ok(report.pass())
    };
    match checked.await {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::FAILURE),
        Err(e) => {
            eprintln!("gpuq: error: {}", one_line(&format!("{e:#}")));
            Ok(ExitCode::from(2))
        }
    }
}

/// Prints the gate's verdict: a JSON object for machines, tables and a last PASS / FAIL line
/// for people.
fn print_gate(
    report: &GateReport,
    opts: &GateOptions<'_>,
    format: OutputFormat,
) -> anyhow::Result<()> {
    let GateReport {
        baseline_runs: base_runs,
        candidate_runs: cand_runs,
        gated,
        untested,
        evidence,
        failures,
        ..
    } = report;
    let (baseline, candidate) = (opts.baseline, opts.candidate);
    let (max_regression, fail_untested) = (opts.max_regression, opts.fail_untested);
    let regressed = |r: &Row| report.is_regression(r);
    let pass = report.pass();
    if format == OutputFormat::Json || format == OutputFormat::Ndjson {
        let row_json = |r: &Row| {
            serde_json::json!({
                "name": r.name, "baseline": r.value_a, "candidate": r.value_b, "delta": r.delta(),
                "change_pct": r.ratio().map(|x| 100.0 * (x - 1.0)), "p_value": r.p_value,
                "p_adjusted": r.p_adjusted, "test": r.test, "status": r.status,
                "regression": regressed(r), "note": r.note,
            })
        };
        let out = serde_json::json!({
            "pass": pass,
            "baseline": {"selector": baseline, "runs": base_runs},
            "candidate": {"selector": candidate, "runs": cand_runs},
            "max_regression_pct": max_regression,
            "fail_untested": fail_untested,
            "metrics": gated.iter().map(|r| row_json(r)).collect::<Vec<_>>(),
            "untested": untested.iter().map(|r| serde_json::json!({
                "name": r.name, "status": r.status, "why": r.note,
            })).collect::<Vec<_>>(),
            "evidence": evidence.iter().map(|r| row_json(r)).collect::<Vec<_>>(),
        });
        println!("{out}");
    } else {
        println!(
            "baseline: {} ({} run(s)); candidate: {}; max regression {max_regression} %",
            baseline,
            base_runs.len(),
            candidate
        );
        let rows: Vec<Vec<String>> = gated
            .iter()
            .map(|r| {
                vec![
                    if regressed(r) { "FAIL" } else { "ok" }.to_string(),
                    r.name.clone(),
                    fmt_dur(r.value_a.round() as i64),
                    fmt_dur(r.value_b.round() as i64),
                    pct_change(r),
                    r.test.to_string(),
                    p_text(r.p_adjusted),
                    r.status.to_string(),
                ]
            })
            .collect();
        print_text(
            &[
                "",
                "metric",
                "baseline",
                "candidate",
                "change",
                "test",
                "p_adjusted",
                "status",
            ],
            &rows,
        )?;
        // What the kernels' evidence counted (and the run-wide shift), where it decided.
        let judged_by_kernels: Vec<&Row> = gated
            .iter()
            .filter(|r| r.test == "kernels" && r.status != "unchanged")
            .collect();
        if !judged_by_kernels.is_empty() {
            println!("\njudged by the kernels:");
            for r in judged_by_kernels {
                // One clause a line: a note runs past 160 columns.
                println!("  {}:", r.name);
                for clause in r.note.as_deref().unwrap_or_default().split("; ") {
                    println!("    {clause}");
                }
            }
        }
        if !untested.is_empty() {
            let gate = if fail_untested {
                "they fail the check (--fail-untested)"
            } else {
                "they do not fail the check (--fail-untested would)"
            };
            println!("\nmoved past the threshold but could not be tested; {gate}:");
            for r in untested {
                println!("  {}: {}", r.name, r.note.as_deref().unwrap_or("no test"));
            }
        }
        if !evidence.is_empty() {
            println!("\nkernels that got slower or appeared (largest change first):");
            let rows: Vec<Vec<String>> = evidence
                .iter()
                .map(|r| {
                    vec![
                        r.name.chars().take(80).collect(),
                        fmt_dur(r.value_a.round() as i64),
                        fmt_dur(r.value_b.round() as i64),
                        fmt_dur(r.delta()),
                        pct_change(r),
                        vs_run(r),
                        p_text(r.p_adjusted),
                        r.status.to_string(),
                    ]
                })
                .collect();
            print_text(
                &[
                    "kernel",
                    "baseline",
                    "candidate",
                    "delta",
                    "change",
                    "vs_run",
                    "p_adjusted",
                    "status",
                ],
                &rows,
            )?;
            if let Some(shift) = evidence.iter().find_map(|r| r.run_shift) {
                println!(
                    "kernels judged relative to the {} (vs_run: their change beyond it)",
                    shift.describe()
                );
            }
        }
        println!(
            "\n{}",
            if pass {
                "PASS: no gated metric regressed significantly beyond the threshold".to_string()
            } else {
                format!("FAIL: {} gated metric(s) regressed", failures)
            }
        );
    }
    Ok(())
}

pub(super) async fn repeat(
    ctx: &SessionContext,
    selector: &str,
    top: usize,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let call = format!("repeatability({}, {top})", literal(selector));
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT top_rank AS rank, name, runs, fmt_dur(CAST(mean AS BIGINT)) AS mean, \
             cv_pct, fmt_dur(CAST(min AS BIGINT)) AS min, fmt_dur(CAST(max AS BIGINT)) AS max \
             FROM {call} ORDER BY top_rank LIMIT {}; \
             SELECT DISTINCT ranking_tau AS top_{top}_kendall_tau FROM {call}",
            top.max(20)
        )
    } else {
        format!("SELECT * FROM {call}")
    };
    let failed = run_sql_text(ctx, &sql, format, &mut std::io::stdout()).await;
    Ok(exit_code(failed))
}

/// `gpuq skew`: per collective, the start and end skew across ranks and the straggler rank.
pub(super) async fn skew(
    store_path: &Path,
    run: &str,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    analysis(store_path, run, &skew_sql(run, format), format).await
}

fn skew_sql(run: &str, format: OutputFormat) -> String {
    let sql = select_sql("collective_skew", run, &[]);
    if format == OutputFormat::Table {
        format!(
            "SELECT name, ranks, calls, fmt_dur(CAST(start_skew_avg AS BIGINT)) AS start_skew_avg, \
             fmt_dur(start_skew_max) AS start_skew_max, fmt_dur(CAST(end_skew_avg AS BIGINT)) AS end_skew_avg, \
             fmt_dur(end_skew_max) AS end_skew_max, straggler_rank, straggler_pct FROM ({sql})"
        )
    } else {
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_of_thousands_of_runs_fits_a_line_and_keeps_a_spike_and_a_dip() {
        let mut values: Vec<Option<f64>> = (0..10_033).map(|i| Some((i % 7) as f64)).collect();
        values[5_000] = Some(100.0);
        values[7_000] = Some(-100.0);
        values[9_999] = None;
        let (marks, per) = spark_marks(&values);
        assert_eq!(per, 126);
        assert!(marks.len() <= SPARK_WIDTH, "{}", marks.len());
        let line = sparkline(&marks);
        assert_eq!(line.chars().count(), marks.len());
        assert_eq!(line.chars().filter(|&c| c == '█').count(), 1, "{line}");
        assert_eq!(line.chars().nth(5_000 / per), Some('█'));
        // The dip shows as well.
        assert_eq!(line.chars().filter(|&c| c == '▁').count(), 1, "{line}");
        assert_eq!(line.chars().nth(7_000 / per), Some('▁'));
        // Few runs: a mark each, as before.
        let few = [Some(1.0), None, Some(3.0)];
        assert_eq!(spark_marks(&few), (few.to_vec(), 1));
        assert_eq!(sparkline(&few), "▁ █");
    }
}
