//! A small sqllogictest runner for the gpuq SQL functions.
//!
//! Runs every `tests/slt/*.slt` file twice — on a plain `SessionContext` and on one with
//! `datafusion.execution.batch_size = 7` and `target_partitions = 4` — with
//! [`gpuq_query::functions::register_all`]. Supported records (separated by blank lines;
//! `#` lines are comments):
//!
//! ```text
//! statement ok            statement error <regex>
//! <sql>                   <sql>
//!
//! query <types> [rowsort] query error <regex>
//! <sql>                   <sql>
//! ----
//! <expected rows: columns joined by one space; NULL; (empty) for an empty string>
//! ```
//!
//! `<types>` has one letter per column (`I` integer, `R` float, `T` text, `B` boolean); only the
//! count is checked. Floats print with at most 12 decimals, trailing zeros removed.
//!
//! The files of `tests/slt/analyses/` pin the analyses, which read a store: they run on a
//! session over a fresh store, once, and take one more record, which ingests the traces
//! beside the file (`tests/slt/analyses/traces/`) as one run, with tags:
//!
//! ```text
//! ingest <run> <trace>... [K=V]...
//! ```

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::prelude::{SessionConfig, SessionContext};
use regex::Regex;
use std::path::{Path, PathBuf};

#[derive(Debug)]
enum Expect {
    Ok,
    Error(String),
    Rows {
        columns: usize,
        rowsort: bool,
        rows: Vec<String>,
    },
    /// Ingest these traces (paths relative to the file's `traces/`) as `run` with `tags`.
    Ingest {
        run: String,
        traces: Vec<String>,
        tags: Vec<(String, String)>,
    },
}

#[derive(Debug)]
struct Record {
    line: usize,
    sql: String,
    expect: Expect,
}

fn parse(text: &str, file: &Path) -> Vec<Record> {
    let lines: Vec<&str> = text.lines().collect();
    let mut records = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end();
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            i += 1;
            continue;
        }
        let start = i + 1;
        let words: Vec<&str> = line.split_whitespace().collect();
        let header_error = |rest: &str| -> String {
            line.split_once(rest)
                .map(|(_, r)| r.trim().to_string())
                .unwrap_or_default()
        };
        let (is_query, expect) = match words.as_slice() {
            ["ingest", run, rest @ ..] => {
                let (tags, traces): (Vec<&str>, Vec<&str>) =
                    rest.iter().partition(|w| w.contains('='));
                records.push(Record {
                    line: start,
                    sql: String::new(),
                    expect: Expect::Ingest {
                        run: run.to_string(),
                        traces: traces.iter().map(|t| t.to_string()).collect(),
                        tags: tags
                            .iter()
                            .filter_map(|t| t.split_once('='))
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    },
                });
                i += 1;
                continue;
            }
            ["statement", "ok"] => (false, Expect::Ok),
            ["statement", "error", ..] => (false, Expect::Error(header_error("error"))),
            ["query", "error", ..] => (true, Expect::Error(header_error("error"))),
            ["query", types, rest @ ..] => (
                true,
                Expect::Rows {
                    columns: types.len(),
                    rowsort: rest.contains(&"rowsort"),
                    rows: Vec::new(),
                },
            ),
            _ => panic!("{}:{start}: unknown record header {line:?}", file.display()),
        };
        i += 1;
        let mut sql = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && lines[i].trim_end() != "----" {
            sql.push(lines[i]);
            i += 1;
        }
        let mut expect = expect;
        if i < lines.len() && lines[i].trim_end() == "----" {
            assert!(
                is_query,
                "{}:{start}: ---- after a statement",
                file.display()
            );
            i += 1;
            let mut rows = Vec::new();
            while i < lines.len() && !lines[i].trim().is_empty() {
                rows.push(lines[i].trim_end().to_string());
                i += 1;
            }
            match &mut expect {
                Expect::Rows { rows: r, .. } => *r = rows,
                _ => panic!("{}:{start}: ---- after query error", file.display()),
            }
        }
        records.push(Record {
            line: start,
            sql: sql.join("\n"),
            expect,
        });
    }
    records
}

fn format_value(col: &ArrayRef, row: usize) -> String {
    if col.is_null(row) {
        return "NULL".into();
    }
    let float = |v: f64| {
        if v.is_nan() || v.is_infinite() {
            return format!("{v}");
        }
        let s = format!("{v:.12}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".into()
        } else {
            s.to_string()
        }
    };
    match col.data_type() {
        DataType::Float64 => float(col.as_primitive::<Float64Type>().value(row)),
        DataType::Float32 => float(col.as_primitive::<Float32Type>().value(row) as f64),
        _ => {
            let s = array_value_to_string(col, row).expect("displayable value");
            if s.is_empty() {
                "(empty)".into()
            } else {
                s
            }
        }
    }
}

fn format_rows(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let cols: Vec<String> = b.columns().iter().map(|c| format_value(c, r)).collect();
            out.push(cols.join(" "));
        }
    }
    out
}

async fn run_sql(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.collect().await.map_err(|e| e.to_string())
}

/// Where a file's SQL runs: a plain session with the functions, or one over a store.
enum Target {
    Functions(SessionConfig),
    Store,
}

async fn run_file(path: &Path, target: Target, label: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = gpuq_engine::Store::open(dir.path()).unwrap();
    let mut ctx = match target {
        Target::Functions(config) => {
            let ctx = SessionContext::new_with_config(config);
            gpuq_query::functions::register_all(&ctx);
            ctx
        }
        Target::Store => gpuq_query::open_session(&store).await.unwrap(),
    };
    let mut failures = Vec::new();
    for rec in parse(&text, path) {
        let at = format!("{}:{} [{label}]", path.display(), rec.line);
        if let Expect::Ingest { run, traces, tags } = &rec.expect {
            let traces_dir = path.parent().unwrap().join("traces");
            let paths: Vec<PathBuf> = traces.iter().map(|t| traces_dir.join(t)).collect();
            let opts = gpuq_ingest::IngestOptions {
                run: Some(gpuq_engine::RunId::new(run).unwrap()),
                tags: tags.clone(),
                ..Default::default()
            };
            if let Err(e) = gpuq_ingest::ingest(&store, &paths, &opts, &gpuq_ingest::NoProgress) {
                failures.push(format!("{at}: ingest failed: {e}"));
                return failures;
            }
            ctx = gpuq_query::open_session(&store).await.unwrap();
            continue;
        }
        let result = run_sql(&ctx, &rec.sql).await;
        match (&rec.expect, result) {
            (Expect::Ok, Ok(_)) => {}
            (Expect::Ok, Err(e)) => failures.push(format!("{at}: error {e}\n{}", rec.sql)),
            (Expect::Error(re), Err(e)) => {
                let re = Regex::new(re).unwrap_or_else(|err| panic!("{at}: bad regex: {err}"));
                if !re.is_match(&e) {
                    failures.push(format!(
                        "{at}: error {e:?} does not match {re:?}\n{}",
                        rec.sql
                    ));
                }
            }
            (Expect::Error(re), Ok(_)) => failures.push(format!(
                "{at}: expected error {re:?}, got rows\n{}",
                rec.sql
            )),
            (Expect::Rows { .. }, Err(e)) => failures.push(format!("{at}: error {e}\n{}", rec.sql)),
            (Expect::Ingest { .. }, _) => unreachable!("ingest records are run above"),
            (
                Expect::Rows {
                    columns,
                    rowsort,
                    rows,
                },
                Ok(batches),
            ) => {
                if let Some(b) = batches.first() {
                    if b.num_columns() != *columns {
                        failures.push(format!(
                            "{at}: {} columns, header says {columns}\n{}",
                            b.num_columns(),
                            rec.sql
                        ));
                        continue;
                    }
                }
                let mut got = format_rows(&batches);
                let mut want = rows.clone();
                if *rowsort {
                    got.sort();
                    want.sort();
                }
                if got != want {
                    failures.push(format!(
                        "{at}: wrong rows\n{}\n-- expected:\n{}\n-- got:\n{}",
                        rec.sql,
                        want.join("\n"),
                        got.join("\n")
                    ));
                }
            }
        }
    }
    failures
}

fn slt_files(sub: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/slt")
        .join(sub);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictests() {
    let files = slt_files("");
    assert!(!files.is_empty(), "no .slt files");
    let only = std::env::var("SLT_FILTER").ok();
    let mut failures = Vec::new();
    for path in &files {
        if only
            .as_deref()
            .is_some_and(|f| !path.to_string_lossy().contains(f))
        {
            continue;
        }
        let plain = Target::Functions(SessionConfig::new());
        failures.extend(run_file(path, plain, "default").await);
        let small = SessionConfig::new()
            .with_batch_size(7)
            .with_target_partitions(4);
        let label = "batch_size=7,target_partitions=4";
        failures.extend(run_file(path, Target::Functions(small), label).await);
    }
    for path in &slt_files("analyses") {
        if only
            .as_deref()
            .is_some_and(|f| !path.to_string_lossy().contains(f))
        {
            continue;
        }
        failures.extend(run_file(path, Target::Store, "store").await);
    }
    assert!(
        failures.is_empty(),
        "{} slt failure(s):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
