//! Running SQL text: statements split by the SQL parser, executed one by one. Also what every
//! command shares before and after it runs: the store opened with its lock timeout, a session
//! over it, the user's kernel class rules, the exit status.

use crate::args::{MaxRows, OutputFormat};
use crate::output::{self, Expanded, Layout};
use anyhow::Context;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Location, Token, Tokenizer};
use gpuq_engine::Store;
use std::borrow::Cow;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
    let sql = select_all_when_from_first(sql);
    let statements = DFParser::parse_sql(&sql).map_err(|e| one_line(&e))?;
    Ok(statements.into_iter().collect())
}

/// DuckDB's FROM-first form without SELECT (`FROM runs WHERE ...`) selects every column:
/// `SELECT * ` goes before a statement's leading FROM when the statement has no SELECT of its
/// own (subqueries aside). The parser alone would refuse `FROM t WHERE ...` and take `FROM t`
/// for a query of no columns.
fn select_all_when_from_first(sql: &str) -> Cow<'_, str> {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else {
        return Cow::Borrowed(sql);
    };
    let mut inserts: Vec<Location> = Vec::new();
    let (mut at_start, mut leading_from, mut has_select, mut depth) = (true, None, false, 0i32);
    let mut end_statement = |leading_from: &mut Option<Location>, has_select: bool| {
        if let (Some(at), false) = (leading_from.take(), has_select) {
            inserts.push(at);
        }
    };
    for t in &tokens {
        match &t.token {
            Token::Whitespace(_) => continue,
            Token::SemiColon if depth == 0 => {
                end_statement(&mut leading_from, has_select);
                (at_start, has_select) = (true, false);
                continue;
            }
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if at_start && w.keyword == Keyword::FROM => {
                leading_from = Some(t.span.start)
            }
            Token::Word(w) if depth == 0 && w.keyword == Keyword::SELECT => has_select = true,
            _ => {}
        }
        at_start = false;
    }
    end_statement(&mut leading_from, has_select);
    if inserts.is_empty() {
        return Cow::Borrowed(sql);
    }
    // Locations are 1-based lines and characters.
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let mut out = sql.to_string();
    for at in inserts.iter().rev() {
        let line = line_starts[(at.line as usize).saturating_sub(1)];
        let offset = sql[line..]
            .char_indices()
            .nth((at.column as usize).saturating_sub(1))
            .map_or(sql.len(), |(i, _)| line + i);
        out.insert_str(offset, "SELECT * ");
    }
    Cow::Owned(out)
}

/// Runs one statement and collects its result; dropping the future stops its work (see
/// [`gpuq_query::cancel`]).
pub async fn run_statement(
    ctx: &SessionContext,
    stmt: Statement,
) -> datafusion::error::Result<(SchemaRef, Vec<RecordBatch>)> {
    // One store version for the whole statement, from its first table function on.
    let mut state = ctx.state();
    gpuq_query::pin(&mut state)?;
    let plan = state.statement_to_plan(stmt).await?;
    gpuq_query::policy::verify(&state, &plan)?;
    let df = match plan {
        // Statements that change the session (CREATE VIEW, SET, ...) go through it.
        LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) => ctx.execute_logical_plan(plan).await?,
        plan => DataFrame::new(state, plan),
    };
    let schema = df.schema().inner().clone();
    let batches = gpuq_query::cancel::collect(df).await?;
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
    /// Tables one column per line (`\x`).
    pub expanded: Expanded,
}

impl From<OutputFormat> for Show {
    /// Every row, no timing, tables that fit the terminal (expanded when nothing else fits):
    /// what analysis commands want.
    fn from(format: OutputFormat) -> Show {
        Show {
            format,
            max_rows: MaxRows(None),
            timing: false,
            expanded: Expanded::Auto,
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
    let layout = Layout {
        expanded: show.expanded,
        ..Layout::terminal()
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
                    Some(n) => output::write_batches_with(
                        out,
                        show.format,
                        &schema,
                        &head(&batches, n),
                        layout,
                    )
                        .and_then(|()| {
                            writeln!(
                                out,
                                "{rows} rows, the first {n} shown (all: --maxrows inf, or \\maxrows inf in the shell)"
                            )
                            .map_err(Into::into)
                        }),
                    None => {
                        output::write_batches_with(out, show.format, &schema, &batches, layout)
                    }
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

/// Exit status of a command that ran `failures` failing statements.
pub fn exit_code(failures: usize) -> ExitCode {
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--lock-timeout` / `GPUQ_LOCK_TIMEOUT`, when given: how long writers wait for the lock.
static LOCK_TIMEOUT: OnceLock<Option<Duration>> = OnceLock::new();

/// Sets how long writers wait for another writer's lock (`None`: for ever), once per process.
pub fn set_lock_timeout(timeout: Option<Duration>) {
    let _ = LOCK_TIMEOUT.set(timeout);
}

/// The store at `path`, its writers waiting for the lock as `--lock-timeout` says.
pub fn open_store(path: &Path) -> anyhow::Result<Store> {
    let store = Store::open(path)
        .with_context(|| format!("cannot open the store at {}", path.display()))?;
    Ok(match LOCK_TIMEOUT.get() {
        Some(&t) => store.with_lock_timeout(t),
        None => store,
    })
}

/// The store at `path` and a session over it.
pub async fn open_session(path: &Path) -> anyhow::Result<(Store, SessionContext)> {
    let store = open_store(path)?;
    let ctx = gpuq_query::open_session(&store).await?;
    Ok((store, ctx))
}

/// The store's rules file of kernel classes, used when `--classes` is not given.
const CLASS_RULES_FILE: &str = "kernel_classes.txt";

/// Installs the user's kernel class rules: `--classes FILE`, else the store's rules file if it
/// exists. An unreadable or invalid file is an error naming the file and line.
pub fn load_class_rules(flag: Option<&Path>, store: &Path) -> anyhow::Result<()> {
    let in_store = store.join(CLASS_RULES_FILE);
    let path = match flag {
        Some(p) => p.to_path_buf(),
        None if in_store.is_file() => in_store,
        None => return Ok(()),
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the class rules {}", path.display()))?;
    let rules = gpuq_query::functions::kernel_class::ClassRules::parse(&text)
        .with_context(|| format!("invalid class rules {}", path.display()))?;
    gpuq_query::functions::kernel_class::install_user_rules(rules);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_first_without_select_selects_every_column() {
        let rewritten = |sql: &str| select_all_when_from_first(sql).into_owned();
        assert_eq!(rewritten("FROM runs"), "SELECT * FROM runs");
        assert_eq!(
            rewritten("from runs WHERE run = 'a' LIMIT 2;"),
            "SELECT * from runs WHERE run = 'a' LIMIT 2;"
        );
        assert_eq!(
            rewritten("SELECT 'FROM x';\n  -- note\n  FROM runs (r) ; FROM kernels"),
            "SELECT 'FROM x';\n  -- note\n  SELECT * FROM runs (r) ; SELECT * FROM kernels"
        );
        assert_eq!(
            rewritten("SELECT 'é'; FROM runs"),
            "SELECT 'é'; SELECT * FROM runs"
        );
        // FROM-first with a SELECT keeps its columns; a subquery's SELECT does not count.
        assert_eq!(rewritten("FROM runs SELECT run"), "FROM runs SELECT run");
        assert_eq!(
            rewritten("FROM (SELECT 1 AS a)"),
            "SELECT * FROM (SELECT 1 AS a)"
        );
        assert_eq!(rewritten("SELECT 1"), "SELECT 1");
        assert_eq!(
            split_statements("FROM runs WHERE run = 'a'").unwrap().len(),
            1
        );
    }
}
