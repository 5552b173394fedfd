//! The analysis commands (`gpuq top`, `gaps`, `util`, `breakdown`, `roofline`, `projection`,
//! `stages`, `findings`): each prints its table function's rows, through the SQL that formats them
//! for people when the output is a table.

use crate::args::OutputFormat;
use crate::exec::{exit_code, open_store, run_sql_text};
use anyhow::bail;
use gpuq_engine::RunId;
use gpuq_query::analyses;
use std::path::Path;
use std::process::ExitCode;

/// `gpuq top`: a run's kernels by GPU time.
pub(super) async fn top(
    store_path: &Path,
    run: &str,
    limit: Option<usize>,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let limit = limit.map(|n| Some(n as i64));
    let sql = analyses::select_sql_in("top_kernels", run, &[limit.flatten()], steps);
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT name, time_pct, fmt_dur(total) AS total, instances, fmt_dur(avg) AS avg, \
             fmt_dur(med) AS med, fmt_dur(min) AS min, fmt_dur(max) AS max, \
             fmt_dur(stddev) AS stddev, class, top_op, busy_pct FROM ({sql})"
        )
    } else {
        sql
    };
    analysis(store_path, run, &sql, format).await
}

/// `gpuq gaps`: when the GPUs sat idle and why.
pub(super) async fn gaps(
    store_path: &Path,
    run: &str,
    min_gap: Option<i64>,
    limit: Option<usize>,
    per_stream: bool,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = gaps_sql(run, min_gap, limit, per_stream, steps, format);
    analysis(store_path, run, &sql, format).await
}

/// `gpuq util`: GPU utilisation over time.
pub(super) async fn util(
    store_path: &Path,
    run: &str,
    chunks: i64,
    threshold: Option<i64>,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("gpu_util", run, &[Some(chunks), threshold], steps);
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT rank, pid, device, ts, {}, fmt_dur(dur) AS duration, in_use_pct \
             FROM ({sql}) CROSS JOIN ({}) ORDER BY rank, pid, device, ts",
            since_start("ts"),
            run_start_sql(run)
        )
    } else {
        sql
    };
    analysis(store_path, run, &sql, format).await
}

/// `gpuq breakdown`: per device, where the GPU time went.
pub(super) async fn breakdown(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("breakdown", run, &[], steps);
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
    analysis(store_path, run, &sql, format).await
}

/// `gpuq roofline`: GEMM-like operators against the GPU's roofline, with notes on what is
/// missing.
pub(super) async fn roofline(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("roofline", run, &[], steps);
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
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &sql, format, &mut std::io::stdout()).await;
    roofline_notes(&ctx, run, steps).await?;
    Ok(exit_code(failed))
}

/// `gpuq projection`: host ranges projected onto the GPU, longest projection first.
pub(super) async fn projection(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    limit: Option<usize>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("gpu_projection", run, &[], steps);
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT name, kind, instances, fmt_dur(proj_time) AS proj_time, \
             fmt_dur(gpu_busy) AS gpu_busy, fmt_dur(range_time) AS host_time, \
             fmt_dur(proj_avg) AS proj_avg, fmt_dur(proj_max) AS proj_max, gpu_ops, \
             round(avg_level, 1) AS level FROM ({sql})"
        )
    } else {
        sql
    };
    let sql = match limit {
        Some(n) => format!("SELECT * FROM ({sql}) LIMIT {n}"),
        None => sql,
    };
    analysis(store_path, run, &sql, format).await
}

/// `gpuq modules`: GPU time per module path, with a note when the run has no module ranges.
pub(super) async fn modules(
    store_path: &Path,
    run: &str,
    depth: Option<u32>,
    steps: Option<&str>,
    limit: Option<usize>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let depth = depth.map(i64::from);
    let sql = analyses::select_sql_in("module_breakdown", run, &[depth], steps);
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT module, pass, fmt_dur(gpu_time) AS gpu_time, kernels, round(share, 1) AS \
             share_pct, short_name(top_kernel) AS top_kernel, fmt_dur(top_kernel_time) AS \
             top_kernel_time FROM ({sql})"
        )
    } else {
        sql
    };
    let sql = match limit {
        Some(n) => format!("SELECT * FROM ({sql}) LIMIT {n}"),
        None => sql,
    };
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &sql, format, &mut std::io::stdout()).await;
    if analyses::module::module_ranges(&ctx, run).await? == 0 {
        eprintln!(
            "note: run {run} has no nn.Module ranges, so every kernel is under (none): record \
             with torch.profiler.profile(with_stack=True) to have PyTorch write them"
        );
    }
    Ok(exit_code(failed))
}

/// `gpuq precision`: GPU time per precision, then the kernels still in fp32 or fp64; rows of
/// `precision(run)` for machines.
pub(super) async fn precision(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    limit: usize,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("precision", run, &[], steps);
    if format != OutputFormat::Table {
        return analysis(store_path, run, &sql, format).await;
    }
    let tables = format!(
        "SELECT dtype, fmt_dur(t) AS gpu_time, round(s, 1) AS share_pct, k AS kernels FROM \
         (SELECT coalesce(dtype, 'unknown') AS dtype, sum(gpu_time) AS t, sum(share) AS s, \
         sum(kernels) AS k FROM ({sql}) GROUP BY 1) ORDER BY t DESC; \
         SELECT short_name(name) AS fp32_or_fp64_kernel, class, dtype, source, op, \
         fmt_dur(gpu_time) AS gpu_time, round(share, 1) AS share_pct, kernels FROM ({sql}) \
         WHERE dtype IN ('fp32', 'fp64') LIMIT {limit}"
    );
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &tables, format, &mut std::io::stdout()).await;
    let unknown = format!("SELECT coalesce(sum(share), 0) FROM ({sql}) WHERE dtype IS NULL");
    let batches = ctx.sql(&unknown).await?.collect().await?;
    let share = batches
        .first()
        .and_then(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>()
                .map(|a| a.value(0))
        })
        .unwrap_or(0.0);
    if share >= 1.0 {
        eprintln!(
            "note: {share:.1}% of the kernel time has no known precision: neither the kernel's \
             name nor its operator says it (PyTorch records operators' input types with \
             torch.profiler.profile(record_shapes=True))"
        );
    }
    Ok(exit_code(failed))
}

/// `gpuq overhead`: the profiler's recorded overhead and the launch calls' durations.
pub(super) async fn overhead(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("profiler_overhead", run, &[], steps);
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT rank, kind, name, instances, fmt_dur(total) AS total, fmt_dur(med) AS med, \
             fmt_dur(max) AS max, fmt_dur(\"window\") AS \"window\", round(share_pct, 2) AS \
             share_pct FROM ({sql})"
        )
    } else {
        sql
    };
    analysis(store_path, run, &sql, format).await
}

/// The first two counts of `sql`'s first row (0 where absent).
async fn first_row_counts(
    ctx: &datafusion::execution::context::SessionContext,
    sql: &str,
) -> anyhow::Result<(i64, i64)> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let n = |i: usize| {
        batches.first().and_then(|b| {
            b.column(i)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>()
                .map(|a| a.value(0))
        })
    };
    Ok((n(0).unwrap_or(0), n(1).unwrap_or(0)))
}

/// `gpuq memory`: the allocator's peak per device over the selection, then per step.
pub(super) async fn memory(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("memory_usage", run, &[], steps);
    if format != OutputFormat::Table {
        return analysis(store_path, run, &sql, format).await;
    }
    let mib = |c: &str| {
        format!(
            "round({c} / 1048576.0, 1) AS {}",
            c.replace("_bytes", "") + "_mib"
        )
    };
    let device = "coalesce(CAST(device AS VARCHAR), 'host') AS device";
    let tables = format!(
        "SELECT rank, {device}, {}, peak_op, {}, {}, {}, {}, {} FROM ({sql}) \
         WHERE step IS NULL; \
         SELECT rank, {device}, step, {}, peak_op, {}, {} FROM ({sql}) WHERE step IS NOT NULL",
        mib("peak_allocated"),
        mib("start_allocated"),
        mib("end_allocated"),
        mib("peak_reserved"),
        mib("alloc_bytes"),
        mib("freed_bytes"),
        mib("peak_allocated"),
        mib("alloc_bytes"),
        mib("freed_bytes"),
    );
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &tables, format, &mut std::io::stdout()).await;
    let count = format!(
        "SELECT count(*), count(*) FILTER (WHERE relative) FROM ({sql}) WHERE step IS NULL"
    );
    match first_row_counts(&ctx, &count).await? {
        (0, _) => eprintln!(
            "note: run {run} has no allocator events: PyTorch records them with \
             torch.profiler.profile(profile_memory=True)"
        ),
        (_, relative) if relative > 0 => eprintln!(
            "note: this trace records each allocation's size but not the totals (PyTorch before \
             1.10): levels count from 0 at its first event, so only differences between them \
             mean something"
        ),
        _ => {}
    }
    Ok(exit_code(failed))
}

/// `gpuq phases`: per phase the steady steps' batch, latency and time per token, then the
/// steps.
pub(super) async fn phases(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("inference_phases", run, &[], steps);
    if format != OutputFormat::Table {
        return analysis(store_path, run, &sql, format).await;
    }
    // Per phase: its steady steps where the steady state is known, else all of them.
    let tables = format!(
        "SELECT rank, phase, count(*) AS steps, count(*) FILTER (WHERE steady) AS steady, \
         median(requests) AS med_batch, sum(tokens) AS tokens, \
         fmt_dur(CAST(median(latency) AS BIGINT)) AS med_latency, \
         fmt_dur(CAST(sum(latency) / sum(tokens) AS BIGINT)) AS per_token, \
         fmt_dur(CAST(median(gpu_busy) AS BIGINT)) AS med_gpu_busy \
         FROM ({sql}) WHERE coalesce(steady, true) GROUP BY rank, phase ORDER BY rank, phase; \
         SELECT rank, phase, requests, tokens, fmt_dur(latency) AS latency, \
         fmt_dur(gpu_busy) AS gpu_busy, fmt_dur(CAST(per_token AS BIGINT)) AS per_token, steady, \
         name FROM ({sql}) ORDER BY rank, ts"
    );
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &tables, format, &mut std::io::stdout()).await;
    let batches = ctx
        .sql(&format!("SELECT count(*) FROM ({sql})"))
        .await?
        .collect()
        .await?;
    let none = batches.first().is_some_and(|b| {
        b.column(0)
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .is_some_and(|a| a.value(0) == 0)
    });
    if none {
        eprintln!(
            "note: run {run} has no serving-engine step markers: SGLang's `step[DECODE bs=N]` \
             or vLLM's `execute_N_context_C(...)_generation_G(...)` annotations around GPU work"
        );
    }
    Ok(exit_code(failed))
}

/// `gpuq collectives`: per kind of collective (name, algorithm, protocol, group size) its
/// calls, time, bytes, median bus bandwidth, share of time waiting and most frequent last rank;
/// `--format` gives every call.
pub(super) async fn collectives(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let sql = analyses::select_sql_in("collectives", run, &[], steps);
    if format != OutputFormat::Table {
        return analysis(store_path, run, &sql, format).await;
    }
    let kinds = analyses::collectives::kinds_sql(&sql);
    let table = format!(
        "SELECT collective, algorithm, protocol, group_size, kernels, fmt_dur(total) AS total, \
         round(bytes / 1048576.0, 1) AS mib, round(busbw_gbps, 2) AS busbw_gbps, \
         round(transfer_busbw_gbps, 2) AS transfer_busbw, round(wait_pct, 1) AS wait_pct, \
         last_rank, last_calls FROM ({kinds})"
    );
    let ctx = session_with_run(store_path, run).await?;
    let failed = run_sql_text(&ctx, &table, format, &mut std::io::stdout()).await;
    let unsized_sql = format!(
        "SELECT count(*), count(*) FILTER (WHERE bytes IS NULL AND name ILIKE '%ccl%') FROM ({sql})"
    );
    match first_row_counts(&ctx, &unsized_sql).await? {
        (0, _) => eprintln!("note: run {run} has no communication kernels"),
        (_, n) if n > 0 => eprintln!(
            "note: {n} NCCL kernel(s) have no message size: the PyTorch that wrote this trace did \
             not record `In msg nelems`, `dtype` and `Group size` (newer versions do, on the \
             record_param_comms operator or the kernel)"
        ),
        _ => {}
    }
    Ok(exit_code(failed))
}

/// `gpuq stages`: macro stages and per-step statistics.
pub(super) async fn stages(
    store_path: &Path,
    run: &str,
    steps: Option<&str>,
    format: OutputFormat,
) -> anyhow::Result<ExitCode> {
    let (stages, steps) = (
        analyses::select_sql_in("stages", run, &[], steps),
        analyses::select_sql_in("step_stats", run, &[], steps),
    );
    let sql = if format == OutputFormat::Table {
        format!(
            "SELECT rank, kind, name, instances, fmt_dur(wall) AS wall, share_pct, \
             fmt_dur(gpu_busy) AS gpu_busy, gpu_busy_pct FROM ({stages}); \
             SELECT rank, step, ts, {}, fmt_dur(dur) AS duration, \
             fmt_dur(gpu_busy) AS gpu_busy, idle_pct, kernels, vs_median, top_kernel \
             FROM ({steps}) CROSS JOIN ({}) ORDER BY rank, step",
            since_start("ts"),
            run_start_sql(run)
        )
    } else {
        format!("{stages}; {steps}")
    };
    analysis(store_path, run, &sql, format).await
}

/// Runs an analysis statement over `run`, which must exist.
pub(super) async fn analysis(
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
pub(super) async fn findings(
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
