//! The subcommands: [`run`] hands each parsed [`Command`] to the module of its family.

mod analysis;
mod export;
mod generate;
mod history;
mod ingest;
mod record;
mod report;
mod runs;
mod sql;
mod watch;

use crate::args::{store_dir, Cli, Command, GenerateFormat};
use crate::exec::{load_class_rules, open_session, open_store, set_lock_timeout};
use gpuq_query::analyses::history::gate::GateOptions;
use std::process::ExitCode;

/// Runs the command `cli` names.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let store_path = store_dir(cli.store);
    if let Some(t) = cli.lock_timeout {
        set_lock_timeout(t.0);
    }
    load_class_rules(cli.classes.as_deref(), &store_path)?;
    let store_path = store_path.as_path();
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
            let opts = ingest::options(
                run,
                &tags,
                format,
                step_pattern,
                lenient,
                tz,
                replace,
                merge_unrelated,
            )?;
            ingest::run(store_path, &paths, &opts, quiet)
        }
        Command::Watch(args) => watch::run(store_path, watch::options(args)?).await,
        Command::Record(args) => record::run(store_path, args).await,
        Command::Export(args) => export::run(store_path, args).await,
        Command::Report(args) => report::run(store_path, args).await,
        Command::Query {
            sql,
            file,
            format,
            maxrows,
            access,
        } => sql::query(store_path, sql, file, format, maxrows, access).await,
        Command::Sql {
            format,
            maxrows,
            access,
        } => sql::shell(store_path, format, maxrows, access).await,
        Command::Runs { action, format } => {
            runs::runs(&open_store(store_path)?, action, format).await
        }
        Command::Files {
            runs,
            table,
            format,
        } => runs::files(&open_store(store_path)?, &runs, table, format),
        Command::Compact { runs } => runs::compact(&open_store(store_path)?, &runs),
        Command::Doctor { repair } => crate::doctor::run(store_path, repair),
        Command::Top {
            run,
            limit,
            steps,
            format,
        } => analysis::top(store_path, &run, limit, steps.as_deref(), format).await,
        Command::Gaps {
            run,
            min_gap,
            limit,
            per_stream,
            steps,
            format,
        } => {
            let steps = steps.as_deref();
            analysis::gaps(store_path, &run, min_gap, limit, per_stream, steps, format).await
        }
        Command::Util {
            run,
            chunks,
            threshold,
            steps,
            format,
        } => {
            analysis::util(
                store_path,
                &run,
                chunks,
                threshold,
                steps.as_deref(),
                format,
            )
            .await
        }
        Command::Breakdown { run, steps, format } => {
            analysis::breakdown(store_path, &run, steps.as_deref(), format).await
        }
        Command::Roofline { run, steps, format } => {
            analysis::roofline(store_path, &run, steps.as_deref(), format).await
        }
        Command::Projection {
            run,
            steps,
            limit,
            format,
        } => analysis::projection(store_path, &run, steps.as_deref(), limit, format).await,
        Command::Modules {
            run,
            depth,
            steps,
            limit,
            format,
        } => analysis::modules(store_path, &run, depth, steps.as_deref(), limit, format).await,
        Command::Precision {
            run,
            steps,
            limit,
            format,
        } => analysis::precision(store_path, &run, steps.as_deref(), limit, format).await,
        Command::Overhead { run, steps, format } => {
            analysis::overhead(store_path, &run, steps.as_deref(), format).await
        }
        Command::Memory { run, steps, format } => {
            analysis::memory(store_path, &run, steps.as_deref(), format).await
        }
        Command::Phases { run, steps, format } => {
            analysis::phases(store_path, &run, steps.as_deref(), format).await
        }
        Command::Collectives { run, steps, format } => {
            analysis::collectives(store_path, &run, steps.as_deref(), format).await
        }
        Command::Stages { run, steps, format } => {
            analysis::stages(store_path, &run, steps.as_deref(), format).await
        }
        Command::Findings { run, steps, format } => {
            analysis::findings(store_path, &run, steps.as_deref(), format).await
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
            let (_, ctx) = open_session(store_path).await?;
            history::diff(&ctx, &a, &b, &level, threshold, limit, all, format).await
        }
        Command::Trend {
            selector,
            metric,
            order_tag,
            threshold,
            format,
        } => {
            let (store, ctx) = open_session(store_path).await?;
            let tag = order_tag.as_deref();
            history::trend(&ctx, &store, &selector, &metric, tag, threshold, format).await
        }
        Command::Scaling {
            tag,
            selector,
            level,
            limit,
            format,
        } => {
            let (_, ctx) = open_session(store_path).await?;
            history::scaling(&ctx, &selector, &tag, &level, limit, format).await
        }
        Command::Check {
            baseline,
            candidate,
            max_regression,
            metrics,
            fail_untested,
            format,
        } => {
            let opts = GateOptions {
                baseline: &baseline,
                candidate: &candidate,
                max_regression,
                metrics: &metrics,
                fail_untested,
            };
            history::check(store_path, &opts, format).await
        }
        Command::Repeat {
            selector,
            top,
            format,
        } => {
            let (_, ctx) = open_session(store_path).await?;
            history::repeat(&ctx, &selector, top, format).await
        }
        Command::Skew { run, format } => history::skew(store_path, &run, format).await,
        Command::Demo { steps } => generate::demo(&open_store(store_path)?, steps).await,
        Command::Generate {
            output,
            format: GenerateFormat::Nsys,
            kernels,
            seed,
            ..
        } => generate::nsys(&output, kernels, seed),
        Command::Generate {
            output,
            bytes,
            seed,
            rank,
            steps,
            first_step,
            jitter,
            repeat,
            scale_kernel,
            steady,
            ..
        } => generate::kineto(
            &output,
            bytes,
            seed,
            rank,
            steps,
            first_step,
            jitter,
            repeat,
            scale_kernel,
            steady,
        ),
    }
}
