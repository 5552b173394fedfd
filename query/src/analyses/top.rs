//! `top_kernels(run [, n] [, steps])`: per-kernel statistics, as SQL over the `kernels` view.
//! With a step range (`top_kernels('r', 10, '3..5')`) only the kernels launched in the
//! selected steps count.

use super::data::collect;
use super::{literal, Call, Spec, StepRange};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::sync::Arc;

pub static TOP_KERNELS: Spec = Spec {
    name: "top_kernels",
    params: &["n"],
    schema,
    compute: |ctx, call| compute(ctx, call).boxed(),
    validate: |call| match call.int(0) {
        Some(n) if n < 0 => Err(format!("n must be >= 0, got {n}")),
        _ => Ok(()),
    },
};

fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("name", DataType::Utf8, false),
        f("time_pct", DataType::Float64, true),
        f("total", DataType::Int64, true),
        f("instances", DataType::Int64, false),
        f("avg", DataType::Float64, true),
        f("med", DataType::Float64, true),
        f("min", DataType::Int64, true),
        f("max", DataType::Int64, true),
        f("stddev", DataType::Float64, true),
        f("class", DataType::Utf8, true),
        f("top_op", DataType::Utf8, true),
        f("busy_pct", DataType::Float64, true),
    ]))
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    // Checks that the range selects a step of the run.
    call.scope(&ctx).await?;
    let sql = top_kernels_sql_in(&call.run, call.int(0).map(|n| n as usize), call.steps);
    let schema = schema();
    collect(&ctx, &sql)
        .await?
        .into_iter()
        .map(|b| {
            let columns = schema
                .fields()
                .iter()
                .zip(b.columns())
                .map(|(f, c)| cast(c, f.data_type()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect()
}

/// Per-kernel statistics of one run, computed as Nsight Systems' `cuda_gpu_kern_sum`:
/// `time_pct` (100 · total / all kernels' total, rounded to 0.1), `total`, `instances`,
/// `avg`, `med` (mean of the two middle values for an even count), `min`, `max`, `stddev`
/// (sample standard deviation, 0 for one instance; avg/med/stddev rounded to 0.1 like nsys),
/// ordered by total descending, then instances, then name; plus the kernel's `class`
/// ([`kernel_class`](crate::functions)), the operator that launched it most often (`top_op`)
/// and its share of the run's GPU kernel busy time (`busy_pct`: total / union of all kernel
/// intervals; above 100 when kernels overlap).
///
/// ```sql
/// SELECT name, total, instances, class FROM top_kernels('llama-bs8', 10);
/// ```
pub fn top_kernels_sql(run: &str, limit: Option<usize>) -> String {
    top_kernels_sql_in(run, limit, None)
}

/// [`top_kernels_sql`] over the kernels launched in the steps of `steps`.
pub fn top_kernels_sql_in(run: &str, limit: Option<usize>, steps: Option<StepRange>) -> String {
    let run = literal(run);
    let mut in_steps = String::new();
    if let Some(r) = steps {
        in_steps.push_str(" AND step IS NOT NULL");
        if let Some(a) = r.first {
            in_steps.push_str(&format!(" AND step >= {a}"));
        }
        if let Some(b) = r.last {
            in_steps.push_str(&format!(" AND step <= {b}"));
        }
    }
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!(
        "WITH k AS (SELECT name, dur, ts, op FROM kernels WHERE run = {run}{in_steps}), \
         stats AS (SELECT name, sum(dur) AS total, count(*) AS instances, \
           avg(CAST(dur AS DOUBLE)) AS mean, median(CAST(dur AS DOUBLE)) AS med, \
           min(dur) AS min, max(dur) AS max, stddev_samp(CAST(dur AS DOUBLE)) AS sd \
           FROM k GROUP BY name), \
         ops AS (SELECT name, op, row_number() OVER (PARTITION BY name \
           ORDER BY count(*) DESC, op) AS rank FROM k WHERE op IS NOT NULL GROUP BY name, op), \
         whole AS (SELECT sum(dur) AS all_total, busy_time(ts, dur) AS busy FROM k) \
         SELECT stats.name, round(100.0 * total / all_total, 1) AS time_pct, total, instances, \
           round(mean, 1) AS avg, round(med, 1) AS med, min, max, \
           round(coalesce(sd, 0.0), 1) AS stddev, kernel_class(stats.name) AS class, \
           ops.op AS top_op, round(100.0 * total / busy, 1) AS busy_pct \
         FROM stats CROSS JOIN whole LEFT JOIN ops ON ops.name = stats.name AND ops.rank = 1 \
         ORDER BY total DESC, instances, stats.name{limit}"
    )
}
