//! Running SQL text: statements split by the SQL parser, executed one by one.

use crate::args::{MaxRows, OutputFormat};
use crate::output;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::{DFParser, Statement};
use std::io::Write;
use std::time::Instant;

/// What `gpuq runs` and `\\runs` show.
pub const RUNS_SQL: &str =
    "SELECT run, format, ranks, gpus, events, kernels, span, tags, imported_at FROM runs ORDER BY run";

/// One line of an error: DataFusion messages can carry newlines and backtraces.
pub fn one_line(e: &dyn std::fmt::Display) -> String {
    let s = e.to_string();
    let s = s.split("\n\nbacktrace").next().unwrap_or(&s);
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Splits SQL text into statements (quotes and comments respected).
pub fn split_statements(sql: &str) -> Result<Vec<Statement>, String> {
    let statements = DFParser::parse_sql(sql).map_err(|e| one_line(&e))?;
    Ok(statements.into_iter().collect())
}

/// Runs one statement and collects its result.
pub async fn run_statement(
    ctx: &SessionContext,
    stmt: Statement,
) -> datafusion::error::Result<(SchemaRef, Vec<RecordBatch>)> {
    let plan = ctx.state().statement_to_plan(stmt).await?;
    let df = ctx.execute_logical_plan(plan).await?;
    let schema = df.schema().inner().clone();
    let batches = df.collect().await?;
    Ok((schema, batches))
}

/// How statement results are shown.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    pub format: OutputFormat,
    /// Rows a table shows at most (other formats print every row).
    pub max_rows: MaxRows,
    /// Print "N row(s) in X s" after each statement (to stderr).
    pub timing: bool,
}

impl From<OutputFormat> for Show {
    /// Every row, no timing: what analysis commands and scripts want.
    fn from(format: OutputFormat) -> Show {
        Show {
            format,
            max_rows: MaxRows(None),
            timing: false,
        }
    }
}

/// Runs every statement of `sql`; prints results to `out` and errors to stderr.
/// Returns the number of failed statements.
pub async fn run_sql_text(
    ctx: &SessionContext,
    sql: &str,
    show: impl Into<Show>,
    out: &mut dyn Write,
) -> usize {
    let show = show.into();
    let statements = match split_statements(sql) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpuq: error: {e}");
            return 1;
        }
    };
    let mut failed = 0;
    for stmt in statements {
        let started = Instant::now();
        match run_statement(ctx, stmt).await {
            Ok((schema, batches)) => {
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                let limit = match (show.format, show.max_rows.0) {
                    (OutputFormat::Table, Some(n)) if rows > n => Some(n),
                    _ => None,
                };
                let written = match limit {
                    Some(n) => output::write_batches(out, show.format, &schema, &head(&batches, n))
                        .and_then(|()| {
                            writeln!(
                                out,
                                "{rows} rows, the first {n} shown (all: --maxrows inf, or \\maxrows inf in the shell)"
                            )
                            .map_err(Into::into)
                        }),
                    None => output::write_batches(out, show.format, &schema, &batches),
                };
                if let Err(e) = written {
                    eprintln!("gpuq: error: {}", one_line(&e));
                    failed += 1;
                }
                if show.timing {
                    eprintln!("{rows} row(s) in {:.3} s", started.elapsed().as_secs_f64());
                }
            }
            Err(e) => {
                eprintln!("gpuq: error: {}", one_line(&e));
                failed += 1;
            }
        }
    }
    let _ = out.flush();
    failed
}

/// The first `n` rows of `batches`.
fn head(batches: &[RecordBatch], mut n: usize) -> Vec<RecordBatch> {
    let mut kept = Vec::new();
    for b in batches {
        if n == 0 {
            break;
        }
        let take = n.min(b.num_rows());
        kept.push(b.slice(0, take));
        n -= take;
    }
    kept
}
