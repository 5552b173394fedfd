//! A generated Nsight Systems export (no `../shared` needed): ingested through the real
//! driver, every per-name statistic and every attribution equals the generator's truth.

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use gpuq_engine::{RunId, Store};
use gpuq_ingest::{IngestOptions, NoProgress};
use gpuq_synth::{write_nsys, NsysConfig};
use std::collections::BTreeMap;

/// Rows of `sql` as (text key, ints...).
async fn rows(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> Vec<(Option<String>, Vec<i64>)> {
    let mut out = Vec::new();
    for b in ctx.sql(sql).await.unwrap().collect().await.unwrap() {
        let key = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
        let key = key.as_string::<i32>();
        let ints: Vec<_> = (1..b.num_columns())
            .map(|i| datafusion::arrow::compute::cast(b.column(i), &DataType::Int64).unwrap())
            .collect();
        for r in 0..b.num_rows() {
            let k = (!key.is_null(r)).then(|| key.value(r).to_string());
            out.push((
                k,
                ints.iter()
                    .map(|c| c.as_primitive::<Int64Type>().value(r))
                    .collect(),
            ));
        }
    }
    out
}

fn pairs(rows: Vec<(Option<String>, Vec<i64>)>) -> BTreeMap<String, (u64, i64)> {
    rows.into_iter()
        .map(|(k, v)| (k.expect("a name"), (v[0] as u64, v[1])))
        .collect()
}

#[tokio::test]
async fn a_generated_nsys_export_ingests_with_exact_statistics_and_attribution() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("capture.sqlite");
    let truth = write_nsys(&NsysConfig::small(), &file).unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new("synth").unwrap()),
        ..Default::default()
    };
    let reports = gpuq_ingest::ingest(&store, &[file], &opts, &NoProgress).unwrap();
    assert_eq!(reports[0].kernels, truth.kernels);
    let ctx = gpuq_query::open_session(&store).await.unwrap();

    let got: BTreeMap<String, (u64, i64, i64, i64)> = rows(
        &ctx,
        "SELECT name, count(*), sum(dur), min(dur), max(dur) FROM kernels GROUP BY name",
    )
    .await
    .into_iter()
    .map(|(k, v)| (k.unwrap(), (v[0] as u64, v[1], v[2], v[3])))
    .collect();
    assert_eq!(got, truth.kernel_sum_by_name);
    let got = pairs(
        rows(
            &ctx,
            "SELECT name, count(*), sum(dur) FROM memcpy GROUP BY name",
        )
        .await,
    );
    assert_eq!(got, truth.memcpy_by_op);
    let got = pairs(
        rows(
            &ctx,
            "SELECT name, count(*), sum(dur) FROM runtime GROUP BY name",
        )
        .await,
    );
    assert_eq!(got, truth.runtime_by_name);
    let got = pairs(
        rows(
            &ctx,
            "SELECT json_short, count(*), sum(dur) FROM (SELECT \
             regexp_replace(args, '^.*\"short_name\":\"([^\"]*)\".*$', '\\1') AS json_short, dur \
             FROM kernels) GROUP BY json_short",
        )
        .await,
    );
    assert_eq!(got, truth.kernel_sum_by_short_name);
    let got = rows(
        &ctx,
        "SELECT 'memset', count(*), sum(dur), sum(bytes) FROM memset",
    )
    .await;
    assert_eq!(
        got[0].1,
        vec![truth.memset.0 as i64, truth.memset.1, truth.memset.2]
    );

    // Attribution: `op` is the innermost operator range around the launch call, `scope` the
    // innermost other range; with no annotation inside an operator, the innermost range of
    // any kind is coalesce(op, scope).
    let got = rows(
        &ctx,
        "SELECT coalesce(op, scope), count(*), sum(dur) FROM kernels GROUP BY 1",
    )
    .await;
    let outside: i64 = got
        .iter()
        .filter(|(k, _)| k.is_none())
        .map(|(_, v)| v[0])
        .sum();
    assert_eq!(outside as u64, truth.kernels_outside_ranges);
    let got = pairs(got.into_iter().filter(|(k, _)| k.is_some()).collect());
    assert_eq!(got, truth.kernels_by_range);
    // Steps per process, although correlation ids collide across the processes.
    let got: BTreeMap<(i64, i64), (u64, i64)> = rows(
        &ctx,
        "SELECT CAST(pid AS VARCHAR), step, count(*), sum(dur) FROM kernels \
         WHERE step IS NOT NULL GROUP BY pid, step",
    )
    .await
    .into_iter()
    .map(|(k, v)| ((k.unwrap().parse().unwrap(), v[0]), (v[1] as u64, v[2])))
    .collect();
    assert_eq!(got, truth.kernels_by_step);
    let got: BTreeMap<(i64, i64, i64), (u64, i64)> = rows(
        &ctx,
        "SELECT CAST(pid AS VARCHAR), device, stream, count(*), sum(dur) FROM kernels \
         GROUP BY pid, device, stream",
    )
    .await
    .into_iter()
    .map(|(k, v)| {
        (
            (k.unwrap().parse().unwrap(), v[0], v[1]),
            (v[2] as u64, v[3]),
        )
    })
    .collect();
    assert_eq!(got, truth.kernels_by_stream);
    // The run catalog knows the GPUs and the clock.
    let m = store.manifest().unwrap();
    let meta = &m.runs[&RunId::new("synth").unwrap()].meta;
    assert_eq!(meta.format, "nsys");
    assert!(!meta.epoch_time, "nsys times are on the session timebase");
    // The truth's span covers API calls and GPU work; the run's also NVTX and overhead rows.
    let span = rows(
        &ctx,
        "SELECT 'span', min(ts), max(ts + dur) FROM events WHERE kind IN ('kernel', 'memcpy', 'memset', 'sync', 'runtime', 'driver')",
    )
    .await;
    assert_eq!(span[0].1, vec![truth.first_ns, truth.last_ns]);
    assert!(meta.first_ts.unwrap() <= truth.first_ns && meta.last_ts.unwrap() >= truth.last_ns);
    assert!(
        meta.devices.iter().all(|d| d.name.contains("H100")),
        "{:?}",
        meta.devices
    );
}
