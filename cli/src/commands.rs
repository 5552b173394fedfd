//! The subcommands.

use crate::args::{parse_tags, store_dir, Cli, Command, GenerateFormat, OutputFormat, RunsAction};
use crate::exec::run_sql_text;
use anyhow::{bail, Context};
use gpuq_engine::{RunId, Store};
use gpuq_ingest::driver::{self, IngestOptions, Progress, RunReport};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let store_path = store_dir(cli.store);
    match cli.command {
        Command::Ingest {
            paths,
            run,
            tags,
            format,
            step_pattern,
            lenient,
            replace,
            quiet,
        } => {
            let run = run.map(RunId::new).transpose()?;
            let tags = parse_tags(&tags)?;
            let step_pattern = step_pattern
                .map(|p| gpuq_ingest::nsys::step_pattern(&p))
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
                ..Default::default()
            };
            ingest(&store, &paths, &opts, quiet)
        }
        Command::Query { sql, file, format } => {
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
            let failed = run_sql_text(&ctx, &text, format, false, &mut std::io::stdout()).await;
            Ok(exit_code(failed))
        }
        Command::Sql { format } => {
            let store = open_store(&store_path)?;
            let ctx = gpuq_query::open_session(&store).await?;
            let errors = crate::repl::run(ctx, format, store.root()).await?;
            Ok(exit_code(errors))
        }
        Command::Runs { action, format } => runs(&open_store(&store_path)?, action, format).await,
        Command::Top { run, limit, format } => {
            let run = RunId::new(run)?;
            let store = open_store(&store_path)?;
            if !store.manifest()?.runs.contains_key(&run) {
                anyhow::bail!("unknown run {run} (see `gpuq runs`)");
            }
            let ctx = gpuq_query::open_session(&store).await?;
            let sql = gpuq_query::analyses::top_kernels_sql(run.as_str(), limit);
            let failed = run_sql_text(&ctx, &sql, format, false, &mut std::io::stdout()).await;
            Ok(exit_code(failed))
        }
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
            ..
        } => generate(&output, bytes, seed, rank),
    }
}

/// Exit status of a command that ran `failures` failing statements.
fn exit_code(failures: usize) -> ExitCode {
    if failures > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn open_store(path: &Path) -> anyhow::Result<Store> {
    Store::open(path).with_context(|| format!("cannot open the store at {}", path.display()))
}

struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start_file(&self, path: &Path, bytes: u64) {
        if let Some(b) = &self.0 {
            b.reset();
            b.set_length(bytes);
            b.set_position(0);
            b.set_message(
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
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
    let reports = driver::ingest(store, paths, opts, &progress)?;
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    if !quiet {
        for r in &reports {
            print_report(r);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &RunReport) {
    for (path, holder) in &r.duplicates {
        println!("{}: already stored in run {holder} (same content); skipped (use --replace to re-ingest)", path.display());
    }
    if r.files == 0 {
        return;
    }
    let mb = r.input_bytes as f64 / 1e6;
    let verb = if r.appended { "added to" } else { "stored as" };
    println!(
        "{verb} run {}: {} file(s), {} events, {} kernels, span {}, {:.1} MB in {:.2} s ({:.0} MB/s)",
        r.run,
        r.files,
        r.events,
        r.kernels,
        r.span_ns.map(human_ns).unwrap_or_else(|| "-".into()),
        mb,
        r.seconds,
        mb / r.seconds.max(1e-9)
    );
    if r.redacted > 0 {
        println!(
            "  redacted {} secret value(s) in the trace metadata",
            r.redacted
        );
    }
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
            let failed = run_sql_text(&ctx, sql, format, false, &mut std::io::stdout()).await;
            Ok(exit_code(failed))
        }
        Some(RunsAction::Rm { run }) => {
            let run = RunId::new(run)?;
            store.writer()?.remove_run(&run)?;
            println!("removed run {run}");
            Ok(ExitCode::SUCCESS)
        }
        Some(RunsAction::Tag { run, tags }) => {
            let run = RunId::new(run)?;
            let tags = parse_tags(&tags)?;
            store.writer()?.set_tags(&run, &tags)?;
            println!("tagged run {run}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn generate(
    output: &Path,
    bytes: Option<u64>,
    seed: u64,
    rank: Option<i32>,
) -> anyhow::Result<ExitCode> {
    use gpuq_ingest::synth::{write_kineto, SynthConfig};
    let mut cfg = match bytes {
        Some(b) => SynthConfig::sized(b),
        None => SynthConfig::demo(),
    };
    cfg.seed = seed;
    cfg.rank = rank;
    let file = std::fs::File::create(output).with_context(|| output.display().to_string())?;
    let name = output.to_string_lossy();
    let truth = if name.ends_with(".gz") {
        let mut w = flate2::write::GzEncoder::new(
            std::io::BufWriter::new(file),
            flate2::Compression::new(6),
        );
        let t = write_kineto(&cfg, &mut w)?;
        w.finish()?;
        t
    } else if name.ends_with(".zst") {
        let mut w = zstd::Encoder::new(std::io::BufWriter::new(file), 3)?;
        let t = write_kineto(&cfg, &mut w)?;
        w.finish()?;
        t
    } else {
        write_kineto(&cfg, std::io::BufWriter::with_capacity(1 << 20, file))?
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
    use gpuq_ingest::synth_nsys::{write_nsys, NsysConfig};
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
    use gpuq_ingest::synth::{write_kineto, SynthConfig};
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
    for r in driver::ingest(store, &[path.clone()], &opts, &gpuq_ingest::NoProgress)? {
        print_report(&r);
    }
    let _ = std::fs::remove_file(&path);
    let ctx = gpuq_query::open_session(store).await?;
    let sql = "\
        SELECT name, count(*) AS instances, sum(dur) AS total_ns, \
               round(100.0 * sum(dur) / sum(sum(dur)) OVER (), 1) AS time_pct, \
               first_value(op) AS top_op \
        FROM kernels WHERE run = 'demo' GROUP BY name ORDER BY total_ns DESC LIMIT 10; \
        SELECT op, count(*) AS kernels, sum(dur) AS total_ns FROM kernels WHERE run = 'demo' \
        GROUP BY op ORDER BY total_ns DESC LIMIT 10; \
        SELECT step, count(*) AS kernels, sum(dur) AS kernel_ns FROM kernels WHERE run = 'demo' \
        GROUP BY step ORDER BY step LIMIT 5;";
    println!("\nTop kernels of run 'demo':");
    let failed = run_sql_text(
        &ctx,
        sql,
        OutputFormat::Table,
        false,
        &mut std::io::stdout(),
    )
    .await;
    println!("Try: gpuq --store {} sql", store.root().display());
    Ok(exit_code(failed))
}
