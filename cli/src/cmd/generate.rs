//! `gpuq generate` (synthetic Kineto traces and Nsight Systems exports) and `gpuq demo`.

use super::analysis::findings;
use super::history::diff;
use super::ingest::print_report;
use crate::args::OutputFormat;
use crate::exec::{exit_code, run_sql_text};
use anyhow::{bail, Context};
use gpuq_engine::{RunId, Store};
use gpuq_ingest::IngestOptions;
use gpuq_synth::SynthConfig;
use std::path::Path;
use std::process::ExitCode;

/// `gpuq generate --format kineto`: the demo's job, or one of about `bytes` bytes.
#[allow(clippy::too_many_arguments)]
pub(super) fn kineto(
    output: &Path,
    bytes: Option<u64>,
    seed: u64,
    rank: Option<i32>,
    steps: Option<u32>,
    first_step: Option<u32>,
    jitter: u32,
    repeat: u64,
    scale_kernel: Option<String>,
    steady: bool,
) -> anyhow::Result<ExitCode> {
    let mut cfg = match bytes {
        Some(b) => SynthConfig::sized(b),
        None => SynthConfig::demo(),
    };
    cfg.seed = seed;
    cfg.rank = rank;
    if let Some(n) = steps {
        cfg.steps = n;
    }
    if let Some(n) = first_step {
        cfg.first_step = n;
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
    generate(output, &cfg)
}

/// Writes `cfg`'s trace to `output`, compressed as its extension says.
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

/// `gpuq generate --format nsys`.
pub(super) fn nsys(output: &Path, kernels: Option<usize>, seed: u64) -> anyhow::Result<ExitCode> {
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

/// `gpuq demo`: a generated run ingested and analysed, then a slower second run compared
/// with it.
pub(super) async fn demo(store: &Store, steps: u32) -> anyhow::Result<ExitCode> {
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
    diff(
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
