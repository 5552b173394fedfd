//! The interactive SQL shell.

use crate::args::{MaxRows, OutputFormat};
use crate::complete::Vocabulary;
use crate::exec::{one_line, run_sql_text, Show};
use crate::meta::{self, FileSetting, Meta};
use crate::output::Expanded;
use crate::script::{self, statement_complete, Piece};
use datafusion::execution::context::SessionContext;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{CompletionType, Context, Editor, Helper};
use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

/// State of a shell session.
pub struct Shell {
    pub ctx: SessionContext,
    pub show: Show,
    pub output: Option<(String, File)>,
    pub errors: usize,
}

/// What to do after a line.
enum Flow {
    Continue,
    Quit,
}

impl Shell {
    pub fn new(ctx: SessionContext, format: OutputFormat, max_rows: MaxRows) -> Shell {
        Shell {
            ctx,
            show: Show {
                format,
                max_rows,
                timing: false,
                expanded: Expanded::Off,
            },
            output: None,
            errors: 0,
        }
    }

    async fn run_sql(&mut self, sql: &str, interactive: bool) {
        let show = self.show;
        let ctx = self.ctx.clone();
        let mut stdout = std::io::stdout();
        let out: &mut dyn Write = match &mut self.output {
            Some((_, f)) => f,
            None => &mut stdout,
        };
        if interactive {
            // Ctrl-C cancels the statement (dropping the future aborts its tasks, which pause
            // often enough to stop: `gpuq_query::cancel`) and keeps the shell.
            tokio::select! {
                failed = run_sql_text(&ctx, sql, show, out) => self.errors += failed,
                _ = tokio::signal::ctrl_c() => eprintln!("cancelled"),
            }
        } else {
            self.errors += run_sql_text(&ctx, sql, show, out).await;
        }
        // Whoever reads the other end of a pipe sees each result as it is complete.
        let _ = out.flush();
    }

    async fn meta(&mut self, line: &str, interactive: bool) -> Flow {
        let m = match meta::parse(line) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("gpuq: error: {e}");
                self.errors += 1;
                return Flow::Continue;
            }
        };
        match m {
            Meta::Quit => return Flow::Quit,
            Meta::Help => {
                println!("{}", meta::HELP);
                let usages: Vec<String> = table_functions(&self.ctx)
                    .into_iter()
                    .map(|f| f.usage)
                    .collect();
                println!(
                    "Table functions (SELECT * FROM f(...)):\n  {}",
                    usages.join("\n  ")
                );
            }
            Meta::Runs => self.run_sql(crate::exec::RUNS_SQL, interactive).await,
            Meta::Tables => {
                // Table functions are not in information_schema: listed after the tables.
                let functions: Vec<String> = table_functions(&self.ctx)
                    .iter()
                    .map(|f| {
                        format!(
                            "({}, 'TABLE FUNCTION')",
                            gpuq_query::analyses::literal(&f.usage)
                        )
                    })
                    .collect();
                let sql = format!(
                    "SELECT table_name, table_type FROM information_schema.tables \
                     WHERE table_schema = 'public' \
                     UNION ALL SELECT * FROM (VALUES {}) \
                     ORDER BY table_type, table_name;",
                    functions.join(", ")
                );
                self.run_sql(&sql, interactive).await
            }
            Meta::Expanded(x) => {
                self.show.expanded = x.unwrap_or(match self.show.expanded {
                    Expanded::Off => Expanded::On,
                    _ => Expanded::Off,
                });
                let state = match self.show.expanded {
                    Expanded::On => "on",
                    Expanded::Off => "off",
                    Expanded::Auto => "auto",
                };
                eprintln!("expanded display is {state}");
            }
            Meta::Describe(t) => {
                let t = t.replace('\'', "''");
                let sql = format!(
                    "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
                     WHERE table_schema = 'public' AND table_name = '{t}' ORDER BY ordinal_position;"
                );
                let known = self.ctx.table_exist(t.as_str()).unwrap_or(false);
                if known {
                    self.run_sql(&sql, interactive).await
                } else {
                    eprintln!("gpuq: error: no table or view named {t:?} (\\tables lists them)");
                    self.errors += 1;
                }
            }
            Meta::Timing(v) => {
                self.show.timing = v.unwrap_or(!self.show.timing);
                eprintln!("timing is {}", if self.show.timing { "on" } else { "off" });
            }
            Meta::MaxRows(n) => match crate::args::parse_max_rows(&n) {
                Ok(m) => self.show.max_rows = m,
                Err(e) => {
                    eprintln!("gpuq: error: {e}");
                    self.errors += 1;
                }
            },
            Meta::Format(f) => {
                match OutputFormat::parse(&f) {
                    Some(f) => self.show.format = f,
                    None => {
                        eprintln!("gpuq: error: unknown format {f:?} (table, csv, json, ndjson, markdown)");
                        self.errors += 1;
                    }
                }
            }
            Meta::Output(None) => self.output = None,
            Meta::Output(Some(path)) => match File::create(&path) {
                Ok(f) => self.output = Some((path, f)),
                Err(e) => {
                    eprintln!("gpuq: error: {path}: {e}");
                    self.errors += 1;
                }
            },
            Meta::Set(setting, on) => {
                let mut access = gpuq_query::policy::file_access(&self.ctx.state());
                let name = match setting {
                    FileSetting::AllowWrite => {
                        access.write = on;
                        "allow_write"
                    }
                    FileSetting::AllowFiles => {
                        access.read = on;
                        "allow_files"
                    }
                };
                gpuq_query::policy::set_file_access(&self.ctx, access);
                eprintln!("{name} is {}", if on { "on" } else { "off" });
            }
            Meta::Include(path) => match std::fs::read_to_string(&path) {
                Ok(text) => {
                    if let Flow::Quit = Box::pin(self.run_script(&text, interactive)).await {
                        return Flow::Quit;
                    }
                }
                Err(e) => {
                    eprintln!("gpuq: error: {path}: {e}");
                    self.errors += 1;
                }
            },
        }
        Flow::Continue
    }

    /// Runs a script (an `\i` file, an interactive line): its meta-commands and statements.
    async fn run_script(&mut self, text: &str, interactive: bool) -> Flow {
        for piece in script::split(text) {
            if let Flow::Quit = self.run_piece(piece, interactive).await {
                return Flow::Quit;
            }
        }
        Flow::Continue
    }

    async fn run_piece(&mut self, piece: Piece, interactive: bool) -> Flow {
        match piece {
            Piece::Meta(line) => self.meta(&line, interactive).await,
            Piece::Sql(sql) => {
                self.run_sql(&sql, interactive).await;
                Flow::Continue
            }
        }
    }

    /// Runs what arrives on `input` (a pipe, a FIFO, a file), each statement and meta-command
    /// as soon as it is whole, until the input ends or `\q`.
    async fn run_stream(&mut self, mut input: impl Read) -> anyhow::Result<()> {
        let mut splitter = script::Splitter::default();
        let mut chunk = vec![0u8; 64 << 10];
        // Bytes read but not handed to the splitter: a character cut by the read.
        let mut unsplit: Vec<u8> = Vec::new();
        let mut offset = 0;
        loop {
            let n = match input.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(anyhow::Error::new(e).context("reading standard input")),
            };
            unsplit.extend_from_slice(&chunk[..n]);
            let whole = match std::str::from_utf8(&unsplit) {
                Ok(text) => text.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(e) => anyhow::bail!(
                    "standard input: byte {}: not UTF-8",
                    offset + e.valid_up_to()
                ),
            };
            let text = std::str::from_utf8(&unsplit[..whole]).expect("checked above");
            let pieces = splitter.push(text);
            unsplit.drain(..whole);
            offset += whole;
            for piece in pieces {
                if let Flow::Quit = self.run_piece(piece, false).await {
                    return Ok(());
                }
            }
        }
        if !unsplit.is_empty() {
            anyhow::bail!("standard input: byte {offset}: not UTF-8 (cut short)");
        }
        for piece in splitter.finish() {
            if let Flow::Quit = self.run_piece(piece, false).await {
                break;
            }
        }
        Ok(())
    }
}

/// Context-aware completion ([`Vocabulary`]); `;`-terminated multi-line input.
struct GpuqHelper {
    vocabulary: Vocabulary,
}

impl Completer for GpuqHelper {
    type Candidate = Pair;
    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let (start, words) = self.vocabulary.complete(line, pos);
        let pairs = words
            .into_iter()
            .map(|w| Pair {
                display: w.clone(),
                replacement: w,
            })
            .collect();
        Ok((start, pairs))
    }
}

impl Hinter for GpuqHelper {
    type Hint = String;
}
impl Highlighter for GpuqHelper {}
impl Helper for GpuqHelper {}

impl Validator for GpuqHelper {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        let input = ctx.input();
        let t = input.trim();
        if t.is_empty() || meta::is_command(t) || statement_complete(input) {
            Ok(ValidationResult::Valid(None))
        } else {
            Ok(ValidationResult::Incomplete)
        }
    }
}

/// A table function of the session, for `\d`, `\help` and completion.
pub struct TableFunctionInfo {
    pub name: String,
    /// `top_kernels(run [, n])`, from the function's own usage message.
    pub usage: String,
    /// The columns it returns, where known without calling it.
    pub columns: Vec<String>,
}

/// Every table function of `ctx`, by name.
pub fn table_functions(ctx: &SessionContext) -> Vec<TableFunctionInfo> {
    use datafusion::catalog::TableFunctionArgs;
    use gpuq_query::analyses;
    let state = ctx.state();
    let mut schemas: Vec<(&str, datafusion::arrow::datatypes::SchemaRef)> = analyses::specs()
        .into_iter()
        .map(|s| (s.name, (s.schema)()))
        .collect();
    schemas.push(("compare", analyses::history::compare::schema()));
    schemas.push(("trend", analyses::history::trend::schema()));
    schemas.push(("repeatability", analyses::history::repeatability::schema()));
    let mut out: Vec<TableFunctionInfo> = state
        .table_functions()
        .iter()
        .map(|(name, f)| {
            // A call without arguments fails with a message that ends in the usage line.
            let usage = f
                .create_table_provider_with_args(TableFunctionArgs::new(&[], &state))
                .err()
                .and_then(|e| {
                    let m = e.to_string();
                    let at = m.find("(usage: ")? + "(usage: ".len();
                    Some(m[at..].trim_end().strip_suffix(')')?.to_string())
                })
                .unwrap_or_else(|| format!("{name}(...)"));
            let columns = schemas
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.fields().iter().map(|f| f.name().clone()).collect())
                .unwrap_or_default();
            TableFunctionInfo {
                name: name.clone(),
                usage,
                columns,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Tables with their columns, table functions and functions of `ctx`.
async fn vocabulary(ctx: &SessionContext) -> Vocabulary {
    let sql = "SELECT table_name, column_name FROM information_schema.columns \
               WHERE table_schema = 'public' ORDER BY table_name, ordinal_position";
    let batches = match ctx.sql(sql).await {
        Ok(df) => df.collect().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let mut tables: Vec<(String, Vec<String>)> = Vec::new();
    for b in batches {
        let text = |i: usize| {
            datafusion::arrow::compute::cast(
                b.column(i),
                &datafusion::arrow::datatypes::DataType::Utf8,
            )
        };
        let (Ok(t), Ok(c)) = (text(0), text(1)) else {
            continue;
        };
        use datafusion::arrow::array::AsArray;
        let (t, c) = (t.as_string::<i32>(), c.as_string::<i32>());
        for r in 0..b.num_rows() {
            let (table, column) = (t.value(r), c.value(r));
            match tables.last_mut() {
                Some((name, cols)) if name == table => cols.push(column.to_string()),
                _ => tables.push((table.to_string(), vec![column.to_string()])),
            }
        }
    }
    let state = ctx.state();
    let mut functions: Vec<String> = state.scalar_functions().keys().cloned().collect();
    functions.extend(state.aggregate_functions().keys().cloned());
    functions.extend(state.window_functions().keys().cloned());
    functions.sort();
    functions.dedup();
    Vocabulary {
        tables,
        table_functions: table_functions(ctx)
            .into_iter()
            .map(|f| (f.name, f.columns))
            .collect(),
        functions,
    }
}

fn history_path(store: &std::path::Path) -> PathBuf {
    store.join("_history")
}

/// Runs the shell: interactive on a terminal, as a script otherwise. Returns the number of errors.
pub async fn run(
    ctx: SessionContext,
    format: OutputFormat,
    max_rows: MaxRows,
    store: &std::path::Path,
) -> anyhow::Result<usize> {
    let mut shell = Shell::new(ctx, format, max_rows);
    if !std::io::stdin().is_terminal() {
        shell.run_stream(std::io::stdin().lock()).await?;
        return Ok(shell.errors);
    }
    let helper = GpuqHelper {
        vocabulary: vocabulary(&shell.ctx).await,
    };
    let config = rustyline::Config::builder()
        .completion_type(CompletionType::List)
        .auto_add_history(false)
        .max_history_size(10_000)?
        .build();
    let mut editor: Editor<GpuqHelper, DefaultHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(helper));
    let history = history_path(store);
    let _ = editor.load_history(&history);
    println!("gpuq SQL shell. End statements with ';'. \\help for meta-commands, \\q to quit.");
    loop {
        match editor.readline("gpuq> ") {
            Ok(line) => {
                if line.trim().is_empty() {
                    continue;
                }
                let _ = editor.add_history_entry(line.as_str());
                let _ = editor.save_history(&history);
                if let Flow::Quit = shell.run_script(&line, true).await {
                    break;
                }
            }
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("gpuq: error: {}", one_line(&e));
                break;
            }
        }
    }
    let _ = editor.save_history(&history);
    Ok(0)
}
