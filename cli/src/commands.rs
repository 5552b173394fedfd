//! The subcommands.

use crate::args::{
    parse_tags, store_dir, Cli, Command, FilesFormat, FilesTable, GenerateFormat, OutputFormat,
    RunsAction,
};
use crate::exec::{run_sql_text, Show};
use crate::history;
use anyhow::{bail, Context};
use gpuq_engine::{RunId, Store};
use gpuq_ingest::{redact_text, IngestOptions, Progress, RunReport};
use gpuq_query::analyses;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let store_path = store_dir(cli.store);
    if let Some(t) = cli.lock_timeout {
        let _ = LOCK_TIMEOUT.set(t.0);
    }
    load_class_rules(cli.classes.as_deref(), &store_path)?;
    match cli.command {
        Command::Ingest {
            paths,
            run,
            tags,
            format,
            step_pattern,
            lenient,
            tz,
            replace,
            merge_unrelated,
            quiet,
        } => {
            let run = run.map(RunId::new).transpose()?;
            let tags = parse_tags(&tags)?;
            let step_pattern = step_pattern
                .map(|p| gpuq_ingest::step_pattern(&p))
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let store = open_store(&store_path)?;
            let opts = IngestOptions {
                run,
                tags,
                replace,
                format: format.format(),
                step_pattern,
                lenient,
                stage_log_zone: tz,
                merge_unrelated,
                ..Default::default()
            };
            ingest(&store, &paths, &opts, quiet)
        }
        Command::Query {
            sql,
            file,
            format,
            maxrows,
            access,
        } => {
            let text = match (sql, file) {
                (Some(s), None) => s,
                (None, Some(f)) if f.as_os_str() == "-" => {
                    std::io::read_to_string(std::io::stdin())?
                }
                (None, Some(f)) => {
                    std::fs::read_to_string(&f).with_context(|| f.display().to_string())?
                }
                (Some(_), Some(_)) => {
                    bail!("give the SQL either as an argument or with -f, not both")
                }
                (None, None) => bail!("no SQL given (pass it as an argument or with -f FILE)"),
            };
            let ctx = gpuq_query::open_session(&open_store(&store_path)?).await?;
            gpuq_query::policy::set_file_access(&ctx, access.access());
            let failed = run_sql_text(
                &ctx,
                &text,
                Show {
                    format,
                    max_rows: maxrows,
                    timing: false,
                    expanded: crate::output::Expanded::Off,
                },
                &mut std::io::stdout(),
            )
            .await;
            Ok(exit_code(failed))
        }
        Command::Sql {
            format,
            maxrows,
            access,
        } => {
            let store = open_store(&store_path)?;
            let ctx = gpuq_query::open_session(&store).await?;
            gpuq_query::policy::set_file_access(&ctx, access.access());
            let errors = crate::repl::run(ctx, format, maxrows, store.root()).await?;
            Ok(exit_code(errors))
        }
        Command::Runs { action, format } => runs(&open_store(&store_path)?, action, format).await,
        Command::Top {
            run,
            limit,
            steps,
            format,
        } => {
            let limit = limit.map(|n| Some(n as i64));
            let sql =
                analyses::select_sql_in("top_kernels", &run, &[limit.flatten()], steps.as_deref());
            let sql = if format == OutputFormat::Table {
                format!(
                    "SELECT name, time_pct, fmt_dur(total) AS total, instances, fmt_dur(avg) AS avg, \
                     fmt_dur(med) AS med, fmt_dur(min) AS min, fmt_dur(max) AS max, \
                     fmt_dur(stddev) AS stddev, class, top_op, busy_pct FROM ({sql})"
                )
            } else {
                sql
            };
            analysis(&store_path, &run, &sql, format).await
        }
        Command::Gaps {
            run,
            min_gap,
            limit,
            per_stream,
            steps,
            format,
        } => {
            let sql = gaps_sql(&run, min_gap, limit, per_stream, steps.as_deref(), format);
            analysis(&store_path, &run, &sql, format).await
        }
        Command::Util {
            run,
            chunks,
            threshold,
            steps,
            format,
        } => {
            let sql = analyses::select_sql_in(
                "gpu_util",
                &run,
                &[Some(chunks), threshold],
                steps.as_deref(),
            );
            let sql = if format == OutputFormat::Table {
                format!(
                    "SELECT rank, pid, device, ts, {}, fmt_dur(dur) AS duration, in_use_pct \
                     FROM ({sql}) CROSS JOIN ({}) ORDER BY rank, pid, device, ts",
                    since_start("ts"),
                    run_start_sql(&run)
                )
            } else {
                sql
            };
            analysis(&store_path, &run, &sql, format).await
        }
        Command::Breakdown { run, steps, format } => {
            let sql = analyses::select_sql_in("breakdown", &run, &[], steps.as_deref());
            let sql = if format == OutputFormat::Table {
                format!(
                    "SELECT rank, pid, device, fmt_dur(span) AS span, fmt_dur(busy) AS busy, \
                     idle_pct, fmt_dur(compute) AS compute, fmt_dur(comm_exposed) AS exposed_comm, \
                     comm_overlap_pct, fmt_dur(memcpy_exposed) AS exposed_memcpy, \
                     fmt_dur(memset_exposed) AS exposed_memset, fmt_dur(sync) AS sync, \
                     fmt_dur(wall) AS wall, fmt_dur(unaccounted) AS unaccounted FROM ({sql})"
                )
            } else {
                sql
            };
            analysis(&store_path, &run, &sql, format).await
        }
        Command::Roofline { run, steps, format } => {
            let sql = analyses::select_sql_in("roofline", &run, &[], steps.as_deref());
            let sql = if format == OutputFormat::Table {
                format!(
                    "SELECT op, dtype, gpu, instances, fmt_dur(kernel_time) AS kernel_time, \
                     round(tflops, 1) AS tflops, round(intensity, 1) AS flop_per_byte, \
                     round(ridge, 1) AS ridge, bound, round(pct_of_attainable, 1) AS pct_of_roof \
                     FROM ({sql})"
                )
            } else {
                sql
            };
            let ctx = session_with_run(&store_path, &run).await?;
            let failed = run_sql_text(&ctx, &sql, format, &mut std::io::stdout()).await;
            roofline_notes(&ctx, &run, steps.as_deref()).await?;
            Ok(exit_code(failed))
        }
        Command::Stages { run, steps, format } => {
            let (stages, steps) = (
                analyses::select_sql_in("stages", &run, &[], steps.as_deref()),
                analyses::select_sql_in("step_stats", &run, &[], steps.as_deref()),
            );
            let sql = if format == OutputFormat::Table {
                format!(
                    "SELECT rank, kind, name, instances, fmt_dur(wall) AS wall, share_pct, \
                     fmt_dur(gpu_busy) AS gpu_busy, gpu_busy_pct FROM ({stages}); \
                     SELECT rank, step, ts, {}, fmt_dur(dur) AS duration, \
                     fmt_dur(gpu_busy) AS gpu_busy, idle_pct, kernels, vs_median, top_kernel \
                     FROM ({steps}) CROSS JOIN ({}) ORDER BY rank, step",
                    since_start("ts"),
                    run_start_sql(&run)
                )
            } else {
                format!("{stages}; {steps}")
            };
            analysis(&store_path, &run, &sql, format).await
        }
        Command::Findings { run, steps, format } => {
            findings(&store_path, &run, steps.as_deref(), format).await
        }
        Command::Diff {
            a,
            b,
            level,
            threshold,
            limit,
            all,
            format,
        } => {
            let ctx = gpuq_query::open_session(&open_store(&store_path)?).await?;
            history::diff(&ctx, &a, &b, &level, threshold, limit, all, format).await
        }
        Command::Trend {
            selector,
            metric,
            order_tag,
            threshold,
            format,
        } => {
            let store = open_store(&store_path)?;
            let ctx = gpuq_query::open_session(&store).await?;
            let tag = order_tag.as_deref();
            history::trend(&ctx, &store, &selector, &metric, tag, threshold, format).await
        }
        Command::Check {
            baseline,
            candidate,
            max_regression,
            metrics,
            fail_untested,
            format,
        } => {
            // 1 means "regressed"; a check that could not run exits 2 so CI can tell them apart.
            let checked = async {
                let store = open_store(&store_path)?;
                let ctx = gpuq_query::open_session(&store).await?;
                let opts = history::CheckOptions {
                    baseline: &baseline,
                    candidate: &candidate,
                    max_regression,
                    metrics: &metrics,
                    fail_untested,
                    format,
                };
                history::check(&ctx, &store, &opts).await
            };
            match checked.await {
                Ok(code) => Ok(code),
                Err(e) => {
                    eprintln!("gpuq: error: {}", crate::exec::one_line(&format!("{e:#}")));
                    Ok(ExitCode::from(2))
                }
            }
        }
        Command::Repeat {
            selector,
            top,
            format,
        } => {
            let ctx = gpuq_query::open_session(&open_store(&store_path)?).await?;
            history::repeat(&ctx, &selector, top, format).await
        }
        Command::Skew { run, format } => {
            analysis(&store_path, &run, &history::skew_sql(&run, format), format).await
        }
        Command::Files {
            runs,
            table,
            format,
        } => files(&open_store(&store_path)?, &runs, table, format),
        Command::Doctor { repair } => crate::doctor::run(&store_path, repair),
        Command::Compact { runs } => compact(&open_store(&store_path)?, &runs),
        Command::Demo { steps } => demo(&open_store(&store_path)?, steps).await,
        Command::Generate {
            output,
            format: GenerateFormat::Nsys,
            kernels,
            seed,
            ..
        } => generate_nsys(&output, kernels, seed),
        Command::Generate {
            output,
            bytes,
            seed,
            rank,
            steps,
            jitter,
            repeat,
            scale_kernel,
            steady,
            ..
        } => {
            use gpuq_synth::SynthConfig;
            let mut cfg = match bytes {
                Some(b) => SynthConfig::sized(b),
                None => SynthConfig::demo(),
            };
            cfg.seed = seed;
            cfg.rank = rank;
            if let Some(n) = steps {
                cfg.steps = n;
            }
            cfg.jitter_pct = jitter;
            cfg.steady = steady;
            cfg.jitter_seed = repeat;
            if let Some(spec) = scale_kernel {
                let parsed = spec
                    .rsplit_once('=')
                    .and_then(|(text, pct)| Some((text.to_string(), pct.parse::<u32>().ok()?)));
                match parsed {
                    Some((text, pct)) if !text.is_empty() => cfg.kernel_scale = Some((text, pct)),
                    _ => bail!("--scale-kernel {spec:?} is not TEXT=PERCENT (e.g. gemm_relu=120)"),
                }
            }
            generate(&output, &cfg)
        }
    }
}

/// Runs an analysis statement over `run`, which must exist.
async fn analysis(
    store_path: &Path,
    run: &str,
    sql: &str,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, sql, format, &mut std::io::stdout()).await;
    Ok(exit_code(failed))
}

/// A session over the store, after checking that `run` exists: an analysis of an unknown run
/// says so instead of printing nothing.
async fn session_with_run(
    store_path: &Path,
    run: &str,
) -> anyhow::Result<datafusion::execution::context::SessionContext> {
    let store = open_store(store_path)?;
    let run = RunId::new(run)?;
    if !store.manifest()?.runs.contains_key(&run) {
        bail!("unknown run {run} (see `gpuq runs`)");
    }
    Ok(gpuq_query::open_session(&store).await?)
}

/// `gpuq gaps`: per-cause totals, then the longest gaps (tables); all gaps otherwise.
fn gaps_sql(
    run: &str,
    min_gap: Option<i64>,
    limit: Option<usize>,
    per_stream: bool,
    steps: Option<&str>,
    format: OutputFormat,
) -> String {
    let function = if per_stream {
        "stream_gaps"
    } else {
        "gpu_gaps"
    };
    let gaps = analyses::select_sql_in(function, run, &[min_gap], steps);
    let keys = if per_stream {
        "rank, pid, device, stream"
    } else {
        "rank, pid, device"
    };
    if format != OutputFormat::Table {
        let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
        return format!("SELECT * FROM ({gaps}) ORDER BY dur DESC, {keys}, ts{limit}");
    }
    let detail = if per_stream { "" } else { " detail," };
    format!(
        "SELECT {keys}, cause, count(*) AS gaps, fmt_dur(sum(dur)) AS total, \
           round(100.0 * sum(dur) / sum(sum(dur)) OVER (PARTITION BY {keys}), 1) AS pct_of_idle \
         FROM ({gaps}) GROUP BY {keys}, cause ORDER BY {keys}, sum(dur) DESC; \
         SELECT {keys}, ts, {}, fmt_dur(dur) AS duration, cause,{detail} next_name \
         FROM ({gaps}) CROSS JOIN ({}) ORDER BY dur DESC, {keys}, ts LIMIT {}",
        since_start("ts"),
        run_start_sql(run),
        limit.unwrap_or(20)
    )
}

/// One row, `run_start`: where `run`'s offsets count from (its first timestamp).
fn run_start_sql(run: &str) -> String {
    format!(
        "SELECT first_ts AS run_start FROM runs WHERE run = {}",
        analyses::literal(run)
    )
}

/// `since_start`: how far timestamp column `ts` is into the run, in seconds to the microsecond
/// (`+1.234567 s`), printed beside the absolute value so a moment can be found in a trace
/// viewer. Integer arithmetic: no rounding of the nanoseconds before the cut.
fn since_start(ts: &str) -> String {
    let d = format!("({ts} - run_start)");
    format!(
        "CASE WHEN {d} < 0 THEN '-' ELSE '+' END || CAST(abs({d}) / 1000000000 AS VARCHAR) || '.' \
         || lpad(CAST(abs({d}) % 1000000000 / 1000 AS VARCHAR), 6, '0') || ' s' AS since_start"
    )
}

/// Why `gpuq roofline` printed no row or no verdict, and how to fix it (on stderr, so that CSV
/// and JSON output stay clean).
async fn roofline_notes(
    ctx: &datafusion::execution::context::SessionContext,
    run: &str,
    steps: Option<&str>,
) -> anyhow::Result<()> {
    let range = steps
        .map(analyses::StepRange::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let scope = analyses::data::Scope::load(ctx, run, range).await?;
    for note in analyses::roofline::notes(ctx, run, &scope).await? {
        eprintln!("note: {note}");
    }
    Ok(())
}

/// `gpuq findings`: a numbered list for people; rows for machines.
async fn findings(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("findings", run, &[], steps);
    if format != OutputFormat::Table {
        return analysis(store_path, run, &sql, format).await;
    }
    let ctx = session_with_run(store_path, run).await?;
    let batches = ctx.sql(&sql).await?.collect().await?;
    let mut n = 0;
    for b in &batches {
        let col = |name: &str| {
            datafusion::arrow::compute::cast(
                b.column_by_name(name).expect("findings column"),
                &datafusion::arrow::datatypes::DataType::Utf8,
            )
        };
        let (sev, title, evidence, action) = (
            col("severity")?,
            col("title")?,
            col("evidence")?,
            col("action")?,
        );
        use datafusion::arrow::array::AsArray;
        for r in 0..b.num_rows() {
            n += 1;
            let s =
                |c: &datafusion::arrow::array::ArrayRef| c.as_string::<i32>().value(r).to_string();
            println!("{n}. [{}] {}", s(&sev), s(&title));
            println!("   evidence: {}", s(&evidence));
            println!("   action:   {}\n", s(&action));
        }
    }
    if n == 0 {
        println!("No findings for run {run}: no idle, launch, copy, sync or communication problem crossed its threshold.");
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit status of a command that ran `failures` failing statements.
pub(crate) fn exit_code(failures: usize) -> ExitCode {
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The store's rules file of kernel classes, used when `--classes` is not given.
const CLASS_RULES_FILE: &str = "kernel_classes.txt";

/// Installs the user's kernel class rules: `--classes FILE`, else the store's rules file if it
/// exists. An unreadable or invalid file is an error naming the file and line.
fn load_class_rules(flag: Option<&Path>, store: &Path) -> anyhow::Result<()> {
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

/// `--lock-timeout` / `GPUQ_LOCK_TIMEOUT`, when given: how long writers wait for the lock.
static LOCK_TIMEOUT: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();

fn open_store(path: &Path) -> anyhow::Result<Store> {
    let store = Store::open(path)
        .with_context(|| format!("cannot open the store at {}", path.display()))?;
    Ok(match LOCK_TIMEOUT.get() {
        Some(&t) => store.with_lock_timeout(t),
        None => store,
    })
}

struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start_file(&self, path: &Path, bytes: u64) {
        if let Some(b) = &self.0 {
            b.reset();
            b.set_length(bytes);
            b.set_position(0);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            b.set_message(redact_text(&name).0.into_owned());
        }
    }
    fn bytes(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }
    fn finish_file(&self) {
        if let Some(b) = &self.0 {
            b.set_position(b.length().unwrap_or(0));
        }
    }
}

fn ingest(
    store: &Store,
    paths: &[PathBuf],
    opts: &IngestOptions,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        b
    });
    let progress = Bar(bar);
    let reports = gpuq_ingest::ingest(store, paths, opts, &progress)?;
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    if !quiet {
        let mut split_said = std::collections::BTreeSet::new();
        for r in &reports {
            if let Some((run, why)) = &r.split_from {
                if split_said.insert(run.clone()) {
                    let why = redact_text(why).0;
                    println!("the files for run {run} do not look like one job ({why}): one run per file (--run NAME --merge-unrelated stores them as one)");
                }
            }
            print_report(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &RunReport) {
    for (path, holder) in &r.duplicates {
        let path = path.display().to_string();
        let path = redact_text(&path).0;
        println!("{path}: already stored in run {holder} (same content); skipped (use --replace to re-ingest)");
    }
    if r.files == 0 {
        return;
    }
    let verb = if r.appended { "added to" } else { "stored as" };
    if let Some(holder) = &r.shared_from {
        println!(
            "{verb} run {}: the same content as run {holder}, whose stored files it shares: {} file(s), {} events, {} kernels, span {}",
            r.run,
            r.files,
            r.events,
            r.kernels,
            r.span_ns.map(human_ns).unwrap_or_else(|| "-".into()),
        );
        return;
    }
    // Speed on the bytes parsed: a gzip file's decompressed JSON, not its compressed size.
    let mb = r.content_bytes as f64 / 1e6;
    let on_disk = if r.input_bytes != r.content_bytes {
        format!(" ({:.1} MB compressed)", r.input_bytes as f64 / 1e6)
    } else {
        String::new()
    };
    println!(
        "{verb} run {}: {} file(s), {} events, {} kernels, span {}, {:.1} MB{on_disk} in {:.2} s ({:.0} MB/s)",
        r.run,
        r.files,
        r.events,
        r.kernels,
        r.span_ns.map(human_ns).unwrap_or_else(|| "-".into()),
        mb,
        r.seconds,
        mb / r.seconds.max(1e-9)
    );
    for (w, n) in &r.warnings {
        println!("  warning: {n} {w}");
    }
}

fn human_ns(ns: i64) -> String {
    let a = ns.unsigned_abs() as f64;
    let (v, unit) = if a >= 1e9 {
        (ns as f64 / 1e9, "s")
    } else if a >= 1e6 {
        (ns as f64 / 1e6, "ms")
    } else if a >= 1e3 {
        (ns as f64 / 1e3, "us")
    } else {
        (ns as f64, "ns")
    };
    format!("{v:.2} {unit}")
}

async fn runs(
    store: &Store,
    action: Option<RunsAction>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    match action {
        None => {
            let ctx = gpuq_query::open_session(store).await?;
            let sql = crate::exec::RUNS_SQL;
            let failed = run_sql_text(&ctx, sql, format, &mut std::io::stdout()).await;
            Ok(exit_code(failed))
        }
        Some(RunsAction::Rm { run, yes }) => {
            // A run name, or a selector (a condition on the runs table) for several at once.
            let ctx = gpuq_query::open_session(store).await?;
            let runs = gpuq_query::analyses::selector::resolve(&ctx, store, &run).await?;
            let ids = runs
                .iter()
                .map(|r| RunId::new(r.run.as_str()))
                .collect::<Result<Vec<_>, _>>()?;
            if ids.len() > 1 && !yes {
                let names: Vec<&str> = ids.iter().map(|r| r.as_str()).collect();
                bail!(
                    "{} matches {} runs ({}); add --yes to remove them all",
                    run,
                    ids.len(),
                    names.join(", ")
                );
            }
            store.writer()?.remove_runs(&ids)?;
            for r in &ids {
                println!("removed run {r}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(RunsAction::Tag { run, tags }) => {
            let run = RunId::new(run)?;
            let tags: Vec<(String, String)> = parse_tags(&tags)?
                .iter()
                .map(|(k, v)| {
                    let (k, v, _) = gpuq_ingest::redact_tag(k, v);
                    (k, v)
                })
                .collect();
            store.writer()?.set_tags(&run, &tags)?;
            println!("tagged run {run}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `gpuq compact [RUN...]`: one commit per run that had small parts to merge.
fn compact(store: &Store, runs: &[String]) -> anyhow::Result<ExitCode> {
    let mut writer = store.writer()?;
    let runs: Vec<RunId> = if runs.is_empty() {
        writer.manifest().runs.keys().cloned().collect()
    } else {
        runs.iter().map(RunId::new).collect::<Result<_, _>>()?
    };
    let mut merged = 0;
    for run in &runs {
        let n = writer.compact_run(run)?;
        if n > 0 {
            println!("{run}: merged {n} parts");
        }
        merged += n;
    }
    println!("compacted {} run(s): {merged} parts merged", runs.len());
    Ok(ExitCode::SUCCESS)
}

fn generate(output: &Path, cfg: &gpuq_synth::SynthConfig) -> anyhow::Result<ExitCode> {
    use gpuq_synth::write_kineto;
    let file = std::fs::File::create(output).with_context(|| output.display().to_string())?;
    let name = output.to_string_lossy();
    let truth = if name.ends_with(".gz") {
        let mut w = flate2::write::GzEncoder::new(
            std::io::BufWriter::new(file),
            flate2::Compression::new(6),
        );
        let t = write_kineto(cfg, &mut w)?;
        w.finish()?;
        t
    } else if name.ends_with(".zst") {
        let mut w = zstd::Encoder::new(std::io::BufWriter::new(file), 3)?;
        let t = write_kineto(cfg, &mut w)?;
        w.finish()?;
        t
    } else {
        write_kineto(cfg, std::io::BufWriter::with_capacity(1 << 20, file))?
    };
    println!(
        "wrote {}: {} events, {} kernels, {} bytes of JSON",
        output.display(),
        truth.events,
        truth.kernels,
        truth.bytes_written
    );
    Ok(ExitCode::SUCCESS)
}

fn generate_nsys(output: &Path, kernels: Option<usize>, seed: u64) -> anyhow::Result<ExitCode> {
    use gpuq_synth::{write_nsys, NsysConfig};
    let mut cfg = match kernels {
        Some(n) => NsysConfig::with_kernels(n),
        None => NsysConfig::small(),
    };
    cfg.seed = seed;
    let truth = write_nsys(&cfg, output).with_context(|| output.display().to_string())?;
    println!(
        "wrote {}: {} kernels, {} processes, {} bytes",
        output.display(),
        truth.kernels,
        cfg.processes,
        std::fs::metadata(output).map(|m| m.len()).unwrap_or(0)
    );
    Ok(ExitCode::SUCCESS)
}

async fn demo(store: &Store, steps: u32) -> anyhow::Result<ExitCode> {
    use gpuq_synth::{write_kineto, SynthConfig};
    let dir = store.root().join("_demo");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("demo_trace.json");
    let mut cfg = SynthConfig::demo();
    cfg.steps = steps;
    let truth = write_kineto(&cfg, std::io::BufWriter::new(std::fs::File::create(&path)?))?;
    println!(
        "generated {} ({} events, {} kernels over {} steps)",
        path.display(),
        truth.events,
        truth.kernels,
        steps
    );
    let opts = IngestOptions {
        run: Some(RunId::new("demo")?),
        tags: vec![("source".into(), "gpuq-demo".into())],
        replace: true,
        ..Default::default()
    };
    for r in gpuq_ingest::ingest(store, &[path.clone()], &opts, &gpuq_ingest::NoProgress)? {
        print_report(&r);
    }
    let _ = std::fs::remove_file(&path);
    let ctx = gpuq_query::open_session(store).await?;
    let mut failed = 0;
    for (title, sql) in [
        (
            "Top kernels of run 'demo'",
            // Kernel names run to hundreds of characters: the demo shows the readable part.
            "SELECT CASE WHEN length(k) > 60 THEN left(k, 57) || '...' ELSE k END AS kernel, \
                    instances, fmt_dur(total) AS total, time_pct, class, top_op \
             FROM (SELECT regexp_replace(name, '^void ', '') AS k, total AS total_ns, * \
                   FROM top_kernels('demo', 10)) \
             ORDER BY total_ns DESC, instances DESC, k",
        ),
        (
            "Where the GPU time went (gpuq breakdown demo)",
            "SELECT device, fmt_dur(span) AS span, fmt_dur(busy) AS busy, idle_pct, \
             fmt_dur(compute) AS compute, fmt_dur(memcpy_exposed) AS exposed_memcpy, \
             fmt_dur(unaccounted) AS unaccounted FROM breakdown('demo')",
        ),
        (
            "Idle gaps by cause (gpuq gaps demo)",
            "SELECT cause, count(*) AS gaps, fmt_dur(sum(dur)) AS total FROM gpu_gaps('demo') \
             GROUP BY cause ORDER BY sum(dur) DESC",
        ),
    ] {
        println!("\n{title}:");
        failed += run_sql_text(&ctx, sql, OutputFormat::Table, &mut std::io::stdout()).await;
    }
    println!("\nFindings (gpuq findings demo):\n");
    findings(store.root(), "demo", None, OutputFormat::Table).await?;
    // A second run of the same job with one GEMM made 50 % slower: what `gpuq diff` shows.
    let pr_cfg = SynthConfig {
        kernel_scale: Some(("gemm_relu".into(), 150)),
        jitter_pct: 3,
        jitter_seed: 1,
        ..cfg
    };
    write_kineto(
        &pr_cfg,
        std::io::BufWriter::new(std::fs::File::create(&path)?),
    )?;
    let pr_opts = IngestOptions {
        run: Some(RunId::new("demo-pr")?),
        ..opts
    };
    gpuq_ingest::ingest(store, &[path.clone()], &pr_opts, &gpuq_ingest::NoProgress)?;
    let _ = std::fs::remove_file(&path);
    println!("What changed in run demo-pr, the same job with one GEMM 50 % slower (gpuq diff demo demo-pr):\n");
    let ctx = gpuq_query::open_session(store).await?;
    history::diff(
        &ctx,
        "demo",
        "demo-pr",
        "kernel",
        2.0,
        Some(5),
        false,
        OutputFormat::Table,
    )
    .await?;
    println!("Try: gpuq --store {} sql", store.root().display());
    Ok(exit_code(failed))
}

/// `gpuq files`: the current version's data files of `runs` (every run when empty), as
/// absolute paths under `_data/` that stay readable 10 minutes after a later commit drops
/// them, so another engine reads exactly this version.
fn files(
    store: &Store,
    runs: &[String],
    table: FilesTable,
    format: FilesFormat,
) -> anyhow::Result<ExitCode> {
    let manifest = store.manifest()?;
    let wanted: Vec<RunId> = runs.iter().map(RunId::new).collect::<Result<_, _>>()?;
    if let Some(unknown) = wanted.iter().find(|r| !manifest.runs.contains_key(*r)) {
        bail!("unknown run: {unknown}");
    }
    let table = match table {
        FilesTable::Events => gpuq_engine::schema::TableKind::Events,
        FilesTable::Counters => gpuq_engine::schema::TableKind::Counters,
    };
    let paths: Vec<String> = manifest
        .files(table)
        .filter(|(run, _)| wanted.is_empty() || wanted.contains(run))
        .map(|(_, f)| store.file_path(&manifest, &f.path).display().to_string())
        .collect();
    let list = serde_json::to_string(&paths)?;
    match format {
        FilesFormat::Lines => paths.iter().for_each(|p| println!("{p}")),
        FilesFormat::Json => println!("{list}"),
        // DuckDB's string literals are single-quoted (a quote doubled); a JSON array of
        // strings is also a Python list literal.
        FilesFormat::Duckdb => println!(
            "read_parquet([{}], hive_partitioning = true)",
            paths
                .iter()
                .map(|p| format!("'{}'", p.replace('\'', "''")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        FilesFormat::Polars => println!("pl.scan_parquet({list}, hive_partitioning=True)"),
    }
    Ok(ExitCode::SUCCESS)
}
