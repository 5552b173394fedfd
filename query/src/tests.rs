use super::*;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use gpuq_engine::RunId;
use gpuq_ingest::{IngestOptions, NoProgress};
use gpuq_synth::{write_kineto, GroundTruth, SynthConfig};
use std::path::Path;

fn ingest_synth(
    store: &Store,
    dir: &Path,
    run: &str,
    cfg: &SynthConfig,
    tags: &[(&str, &str)],
) -> GroundTruth {
    ingest_synth_with_budget(store, dir, run, cfg, tags, None)
}

fn ingest_synth_with_budget(
    store: &Store,
    dir: &Path,
    run: &str,
    cfg: &SynthConfig,
    tags: &[(&str, &str)],
    spool_budget: Option<usize>,
) -> GroundTruth {
    let path = dir.join(format!("{run}.json"));
    let truth = write_kineto(cfg, std::fs::File::create(&path).unwrap()).unwrap();
    let opts = IngestOptions {
        run: Some(RunId::new(run).unwrap()),
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        replace: false,
        spool_budget,
        ..Default::default()
    };
    gpuq_ingest::ingest(store, &[path], &opts, &NoProgress).unwrap();
    truth
}

async fn query_i64(ctx: &SessionContext, sql: &str) -> Vec<Option<i64>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let c = datafusion::arrow::compute::cast(
            b.column(0),
            &datafusion::arrow::datatypes::DataType::Int64,
        )
        .unwrap();
        out.extend(c.as_primitive::<Int64Type>().iter());
    }
    out
}

async fn query_strings(ctx: &SessionContext, sql: &str) -> Vec<Option<String>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let c = datafusion::arrow::compute::cast(
            b.column(0),
            &datafusion::arrow::datatypes::DataType::Utf8,
        )
        .unwrap();
        out.extend(c.as_string::<i32>().iter().map(|s| s.map(String::from)));
    }
    out
}

#[tokio::test]
async fn a_long_lived_session_sees_runs_committed_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let ctx = open_session(&store).await.unwrap();
    assert_eq!(
        query_i64(&ctx, "SELECT count(*) FROM events").await,
        vec![Some(0)]
    );
    let truth = ingest_synth(&store, dir.path(), "r1", &SynthConfig::small(), &[]);
    assert_eq!(
        query_i64(&ctx, "SELECT count(*) FROM kernels").await,
        vec![Some(truth.kernels as i64)]
    );
    let t2 = ingest_synth(
        &store,
        dir.path(),
        "r2",
        &SynthConfig {
            seed: 9,
            ..SynthConfig::small()
        },
        &[],
    );
    assert_eq!(
        query_i64(&ctx, "SELECT count(*) FROM kernels").await,
        vec![Some((truth.kernels + t2.kernels) as i64)]
    );
    assert_eq!(
        query_strings(&ctx, "SELECT run FROM runs ORDER BY run").await,
        vec![Some("r1".into()), Some("r2".into())]
    );
}

/// Kernel totals per name and per op, event counts per kind and the step list equal the
/// generator's ground truth.
async fn assert_ground_truth(ctx: &SessionContext, truth: &GroundTruth) {
    let names = query_strings(ctx, "SELECT name FROM kernels GROUP BY name ORDER BY name").await;
    let totals = query_i64(
        ctx,
        "SELECT sum(dur) FROM kernels GROUP BY name ORDER BY name",
    )
    .await;
    let got: Vec<(String, i64)> = names
        .into_iter()
        .zip(totals)
        .map(|(n, t)| (n.unwrap(), t.unwrap()))
        .collect();
    let want: Vec<(String, i64)> = truth.kernel_ns_by_name.clone().into_iter().collect();
    assert_eq!(got, want);
    let ops = query_strings(ctx, "SELECT op FROM kernels GROUP BY op ORDER BY op").await;
    let op_totals = query_i64(ctx, "SELECT sum(dur) FROM kernels GROUP BY op ORDER BY op").await;
    let got: Vec<(String, i64)> = ops
        .into_iter()
        .zip(op_totals)
        .map(|(n, t)| (n.unwrap_or_default(), t.unwrap()))
        .collect();
    let want: Vec<(String, i64)> = truth.kernel_ns_by_op.clone().into_iter().collect();
    assert_eq!(got, want);
    for (kind, n) in &truth.kind_counts {
        let got = query_i64(
            ctx,
            &format!("SELECT count(*) FROM events WHERE kind = '{kind}'"),
        )
        .await;
        assert_eq!(got, vec![Some(*n as i64)], "kind {kind}");
    }
    let steps = query_i64(ctx, "SELECT step FROM steps ORDER BY step").await;
    assert_eq!(
        steps,
        truth
            .steps
            .iter()
            .map(|s| Some(s.0 as i64))
            .collect::<Vec<_>>()
    );
    let step_durs = query_i64(ctx, "SELECT dur FROM steps ORDER BY step").await;
    assert_eq!(
        step_durs,
        truth.steps.iter().map(|s| Some(s.2)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn kernel_totals_match_the_generators_ground_truth() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let truth = ingest_synth(&store, dir.path(), "gt", &SynthConfig::small(), &[]);
    let ctx = open_session(&store).await.unwrap();
    assert_ground_truth(&ctx, &truth).await;
}

#[tokio::test]
async fn a_trace_spilled_to_disk_and_split_into_several_parts_gives_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    // ~300 K events: more than one 256 K-row part; budget 0 spills every parsed batch.
    let cfg = SynthConfig::sized(100_000_000);
    let truth = ingest_synth_with_budget(&store, dir.path(), "spilled", &cfg, &[], Some(0));
    let m = store.manifest().unwrap();
    let files = m.runs[&RunId::new("spilled").unwrap()]
        .files
        .iter()
        .filter(|f| f.table == TableKind::Events)
        .count();
    assert!(files >= 2, "{files} event files");
    let ctx = open_session(&store).await.unwrap();
    assert_ground_truth(&ctx, &truth).await;
    assert_eq!(
        query_i64(&ctx, "SELECT count(*) FROM events").await,
        vec![Some(truth.events as i64)]
    );
    let staging = std::fs::read_dir(store.root().join("_staging"))
        .unwrap()
        .count();
    assert_eq!(staging, 0, "spill or staged files left behind");

    // The store declares each scan partition sorted by (run, rank, device, stream, ts), so a
    // per-stream gap() window streams without a sort even over a run of several parts, and
    // gives what it gives over an unordered in-memory copy of the same rows.
    ingest_synth(&store, dir.path(), "after", &SynthConfig::small(), &[]);
    let ctx = open_session(&store).await.unwrap();
    ctx.sql("CREATE TABLE copy AS SELECT * FROM gpu_ops")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let per_stream = |table: &str| {
        format!(
            "SELECT run, rank, device, stream, sum(g) AS idle, count(g) AS n FROM (\
               SELECT run, rank, device, stream, \
                 gap(ts, dur) OVER (PARTITION BY run, rank, device, stream ORDER BY ts) AS g \
               FROM {table}) \
             GROUP BY run, rank, device, stream ORDER BY run, rank, device, stream"
        )
    };
    let plan = explain_analyze(&ctx, &per_stream("gpu_ops")).await;
    assert!(
        plan.contains("BoundedWindowAggExec"),
        "not streaming:\n{plan}"
    );
    let window_input = plan.split("BoundedWindowAggExec").nth(1).unwrap_or("");
    assert!(
        !window_input.contains("SortExec"),
        "sorts its input:\n{plan}"
    );
    let from_store = ctx
        .sql(&per_stream("gpu_ops"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let from_copy = ctx
        .sql(&per_stream("copy"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = |b: &[RecordBatch]| {
        datafusion::arrow::util::pretty::pretty_format_batches(b)
            .unwrap()
            .to_string()
    };
    assert_eq!(text(&from_store), text(&from_copy));
    assert!(from_store.iter().map(|b| b.num_rows()).sum::<usize>() >= 4);
}

#[tokio::test]
async fn tags_are_queryable_and_secrets_are_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    ingest_synth(
        &store,
        dir.path(),
        "tagged",
        &SynthConfig::small(),
        &[("model", "llama"), ("bs", "8")],
    );
    let ctx = open_session(&store).await.unwrap();
    assert_eq!(
        query_strings(&ctx, "SELECT tags['model'] FROM runs").await,
        vec![Some("llama".into())]
    );
    assert_eq!(
        query_strings(&ctx, "SELECT run FROM runs WHERE tags['bs'] = '8'").await,
        vec![Some("tagged".into())]
    );
    let metadata = query_strings(&ctx, "SELECT metadata FROM runs").await;
    let metadata = metadata[0].as_deref().unwrap();
    assert!(metadata.contains("REDACTED"), "{metadata}");
    assert!(!metadata.contains("hf_synthetic_secret"), "{metadata}");
    // Nothing anywhere in the store holds the secret.
    for entry in walk(store.root()) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !bytes.windows(19).any(|w| w == b"hf_synthetic_secret"),
            "secret in {}",
            entry.display()
        );
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Sum of a metric over the plan's `DataSourceExec` nodes in `EXPLAIN ANALYZE` output.
fn metric(plan: &str, name: &str) -> u64 {
    plan.split(&format!("{name}="))
        .skip(1)
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

async fn explain_analyze(ctx: &SessionContext, sql: &str) -> String {
    let batches = ctx
        .sql(&format!("EXPLAIN ANALYZE {sql}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn filters_on_run_ts_and_step_prune_files_and_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let big = SynthConfig {
        steps: 40,
        ..SynthConfig::small()
    };
    for (i, run) in ["a", "b", "c"].iter().enumerate() {
        ingest_synth(
            &store,
            dir.path(),
            run,
            &SynthConfig {
                seed: i as u64,
                ..big.clone()
            },
            &[],
        );
    }
    let ctx = open_session(&store).await.unwrap();
    let total = query_i64(&ctx, "SELECT count(*) FROM events").await[0].unwrap();
    // run = 'b': only b's files are scanned (the others never reach the Parquet reader).
    let plan = explain_analyze(&ctx, "SELECT count(*) FROM events WHERE run = 'b'").await;
    let files_b = store.manifest().unwrap().runs[&RunId::new("b").unwrap()]
        .files
        .iter()
        .filter(|f| f.table == TableKind::Events)
        .count();
    assert!(
        plan.contains(&format!("file_groups={{{files_b} group"))
            || plan.matches(".parquet").count() <= files_b + 1,
        "{plan}"
    );
    assert!(
        !plan.contains("run=a/") && !plan.contains("run=c/"),
        "{plan}"
    );
    // A narrow ts window prunes row groups inside the files by their statistics.
    let (lo, hi) = {
        let v = query_i64(&ctx, "SELECT min(ts) FROM events WHERE run = 'a'").await[0].unwrap();
        let w = query_i64(&ctx, "SELECT max(ts) FROM events WHERE run = 'a'").await[0].unwrap();
        (v, w)
    };
    let mid = lo + (hi - lo) / 2;
    let sql = format!(
        "SELECT count(*) FROM events WHERE run = 'a' AND ts BETWEEN {mid} AND {}",
        mid + 1000
    );
    let plan = explain_analyze(&ctx, &sql).await;
    let pruned =
        metric(&plan, "row_groups_pruned_statistics") + metric(&plan, "page_index_rows_pruned");
    assert!(pruned > 0, "nothing pruned: {plan}");
    assert!(
        metric_total(&plan, "page_index_pages_pruned") > 0.0,
        "{plan}"
    );
    // Filters on nothing the rows are ordered by (a kind, a run) skip statistics and page
    // index: they cannot prune inside a file, and reading them costs every file.
    let kernels_a = "SELECT count(*) FROM kernels WHERE run = 'a'";
    let plan = explain_analyze(&ctx, kernels_a).await;
    assert_eq!(
        metric_total(&plan, "page_index_pages_pruned"),
        0.0,
        "{plan}"
    );
    assert_eq!(
        query_i64(&ctx, kernels_a).await[0],
        query_i64(
            &ctx,
            "SELECT sum(CASE WHEN kind = 'kernel' AND run = 'a' THEN 1 ELSE 0 END) FROM events"
        )
        .await[0]
    );
    // Results stay exact under pruning.
    let n = query_i64(&ctx, &sql).await[0].unwrap();
    let brute = query_i64(&ctx, &format!("SELECT sum(CASE WHEN run = 'a' AND ts BETWEEN {mid} AND {} THEN 1 ELSE 0 END) FROM events", mid + 1000)).await[0].unwrap();
    assert_eq!(n, brute);
    assert!(n < total);
    // Step filters prune files by the manifest's step ranges when steps are far apart.
    let plan = explain_analyze(&ctx, "SELECT count(*) FROM events WHERE step = 1000000").await;
    assert!(
        !plan.contains(".parquet"),
        "files scanned for an impossible step: {plan}"
    );
}

#[tokio::test]
async fn views_cover_their_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    ingest_synth(&store, dir.path(), "v", &SynthConfig::small(), &[]);
    let ctx = open_session(&store).await.unwrap();
    let gpu = query_i64(&ctx, "SELECT count(*) FROM gpu_ops").await[0].unwrap();
    let parts = query_i64(
        &ctx,
        "SELECT (SELECT count(*) FROM kernels) + (SELECT count(*) FROM memcpy) + (SELECT count(*) FROM memset)",
    )
    .await[0]
    .unwrap();
    assert_eq!(gpu, parts);
    let bad = ctx.sql("SELECT * FROM no_such_table").await;
    assert!(bad.is_err());
}

/// Aggregates computed by dictionary code (`dict_agg`) equal DataFusion's own, row for row, over
/// several runs, a run of several parts, NULL arguments and every supported aggregate.
#[tokio::test]
async fn dictionary_partial_aggregates_equal_datafusions_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    for (i, run) in ["a", "b", "c"].iter().enumerate() {
        let cfg = SynthConfig {
            seed: 7 + i as u64,
            ..SynthConfig::small()
        };
        ingest_synth(&store, dir.path(), run, &cfg, &[]);
    }
    // A run of several parts, every one with its own dictionaries.
    ingest_synth_with_budget(
        &store,
        dir.path(),
        "multi",
        &SynthConfig::sized(60_000_000),
        &[],
        Some(0),
    );
    let fast = open_session(&store).await.unwrap();
    let plain = open_session_with(&store, false).await.unwrap();
    let queries = [
        "SELECT run, name, sum(dur) AS total FROM kernels GROUP BY run, name",
        "SELECT name, run, count(*), min(ts), max(ts + dur) FROM kernels GROUP BY name, run",
        "SELECT kind, name, count(correlation), sum(bytes), min(bytes), max(bytes) FROM events GROUP BY kind, name",
        "SELECT name, count(*) FROM events WHERE kind IN ('cpu_op', 'kernel') GROUP BY name HAVING count(*) > 3",
        "SELECT run, kind, sum(dur) FROM events WHERE dur < 0 GROUP BY run, kind",
        "SELECT run, name, sum(dur) AS t FROM kernels GROUP BY run, name ORDER BY t DESC LIMIT 5",
        // Rewritten into two aggregations; the upper one counts by name.
        "SELECT name, count(DISTINCT stream) FROM kernels GROUP BY name",
    ];
    for q in queries {
        let plan = explain_analyze(&fast, q).await;
        if !q.contains("LIMIT") {
            assert!(
                plan.contains("DictionaryPartialAggregateExec"),
                "{q}:\n{plan}"
            );
        }
        let got = fast.sql(q).await.unwrap().collect().await.unwrap();
        let want = plain.sql(q).await.unwrap().collect().await.unwrap();
        let rows = |b: &[RecordBatch]| {
            let text = datafusion::arrow::util::pretty::pretty_format_batches(b)
                .unwrap()
                .to_string();
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            lines.sort();
            lines
        };
        assert_eq!(rows(&got), rows(&want), "{q}");
        if !q.contains("dur < 0") {
            assert!(got.iter().map(|b| b.num_rows()).sum::<usize>() >= 3, "{q}");
        }
    }
    // Not eligible: a nullable group key, avg.
    for q in [
        "SELECT op, sum(dur) FROM kernels GROUP BY op",
        "SELECT name, avg(dur) FROM kernels GROUP BY name",
    ] {
        let plan = explain_analyze(&fast, q).await;
        assert!(
            !plan.contains("DictionaryPartialAggregateExec"),
            "{q}:\n{plan}"
        );
    }
}

/// A number in an `EXPLAIN ANALYZE` metric such as `pushdown_rows_pruned=34.21 M`.
fn metric_total(plan: &str, name: &str) -> f64 {
    plan.split(&format!("{name}="))
        .skip(1)
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let value: f64 = words.next()?.trim_end_matches(',').parse().ok()?;
            Some(match words.next() {
                Some("K") => value * 1e3,
                Some("M") => value * 1e6,
                Some("B") => value * 1e9,
                _ => value,
            })
        })
        .sum()
}

/// Filters on `kind` read only the rows the manifest's kind ranges hold: the same answers as
/// a filter the scan cannot use, from fewer rows; files without such rows are not opened.
#[tokio::test]
async fn kind_filters_read_only_the_kinds_row_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    ingest_synth(&store, dir.path(), "a", &SynthConfig::small(), &[]);
    let no_copies = SynthConfig {
        copies: false,
        ..SynthConfig::small()
    };
    ingest_synth(&store, dir.path(), "b", &no_copies, &[]);
    ingest_synth_with_budget(
        &store,
        dir.path(),
        "multi",
        &SynthConfig::sized(60_000_000),
        &[],
        Some(0),
    );
    let m = store.manifest().unwrap();
    assert!(m.files(TableKind::Events).all(|(_, f)| !f.kinds.is_empty()));
    let ctx = open_session(&store).await.unwrap();
    let all_rows = query_i64(&ctx, "SELECT count(*) FROM events").await[0].unwrap() as f64;
    // (filter, most rows it may read): GPU kinds sit in the GPU block at the end of each file,
    // host kinds in the (larger) host block before it.
    for (filter, share) in [
        ("kind = 'kernel'", 0.5),
        ("kind IN ('memcpy', 'memset')", 0.5),
        ("kind = 'runtime' OR kind = 'driver'", 0.99),
        ("kind = 'annotation'", 0.99),
    ] {
        let q = |f: &str| {
            format!("SELECT run, count(*), sum(dur), min(ts) FROM events WHERE {f} GROUP BY run ORDER BY run")
        };
        let same = filter.replace("kind", "concat(kind, '')");
        let got = ctx.sql(&q(filter)).await.unwrap().collect().await.unwrap();
        let want = ctx.sql(&q(&same)).await.unwrap().collect().await.unwrap();
        let text = |b: &[RecordBatch]| {
            datafusion::arrow::util::pretty::pretty_format_batches(b)
                .unwrap()
                .to_string()
        };
        assert_eq!(text(&got), text(&want), "{filter}");
        assert!(
            got.iter().map(|b| b.num_rows()).sum::<usize>() >= 1,
            "{filter}"
        );
        let plan = explain_analyze(&ctx, &q(filter)).await;
        // Rows the scan read and filtered (page-level metrics count whole row groups).
        let read = metric_total(&plan, "pushdown_rows_pruned")
            + metric_total(&plan, "pushdown_rows_matched");
        assert!(
            read > 0.0 && read < share * all_rows,
            "{filter}: {read} of {all_rows} rows:\n{plan}"
        );
    }
    // Run b has no copies: its file is not even opened for them; no file has an unknown kind.
    let plan = explain_analyze(
        &ctx,
        "SELECT count(*) FROM events WHERE run = 'b' AND kind = 'memcpy'",
    )
    .await;
    assert!(!plan.contains("DataSourceExec"), "{plan}");
    assert_eq!(
        query_i64(
            &ctx,
            "SELECT count(*) FROM events WHERE kind = 'no such kind'"
        )
        .await,
        vec![Some(0)]
    );
}

/// `json_get`, `json_get_int` read values inside `args` and `runs.metadata`, equal to what
/// serde_json reads from the same text.
#[tokio::test]
async fn json_functions_read_args_and_run_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    ingest_synth(&store, dir.path(), "j", &SynthConfig::small(), &[]);
    let ctx = open_session(&store).await.unwrap();
    let metadata = query_strings(&ctx, "SELECT metadata FROM runs").await;
    let metadata: serde_json::Value =
        serde_json::from_str(metadata[0].as_deref().unwrap()).unwrap();
    let path_env = metadata["metadata"]["env"]["PATH"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        query_strings(
            &ctx,
            "SELECT json_get(metadata, 'metadata', 'env', 'PATH') FROM runs"
        )
        .await,
        vec![Some(path_env)]
    );
    // Objects and arrays come back as JSON text; a missing path or a non-integer is NULL.
    let env = query_strings(
        &ctx,
        "SELECT json_get(metadata, 'metadata', 'env') FROM runs",
    )
    .await;
    let env: serde_json::Value = serde_json::from_str(env[0].as_deref().unwrap()).unwrap();
    assert_eq!(env, metadata["metadata"]["env"]);
    for sql in [
        "SELECT json_get(metadata, 'nope', 0) FROM runs",
        "SELECT json_get_int(metadata, 'metadata', 'env', 'PATH') FROM runs",
        "SELECT json_get('not json', 'a')",
    ] {
        assert_eq!(query_strings(&ctx, sql).await, vec![None], "{sql}");
    }
    let schema_version = metadata["schemaVersion"].as_i64().unwrap();
    assert_eq!(
        query_strings(
            &ctx,
            "SELECT json_get_int(metadata, 'schemaVersion') FROM runs"
        )
        .await,
        vec![Some(schema_version.to_string())]
    );

    // Every operator's External id, read in SQL and by serde_json from the same args.
    let sql = "SELECT args, json_get_int(args, 'External id') FROM events \
               WHERE kind = 'cpu_op' AND args IS NOT NULL ORDER BY ts";
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut checked = 0;
    for b in &batches {
        let args = datafusion::arrow::compute::cast(
            b.column(0),
            &datafusion::arrow::datatypes::DataType::Utf8,
        )
        .unwrap();
        let args = args.as_string::<i32>();
        let ids = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let v: serde_json::Value = serde_json::from_str(args.value(i)).unwrap();
            let want = v["External id"].as_i64();
            let got = datafusion::arrow::array::Array::is_valid(ids, i).then(|| ids.value(i));
            assert_eq!(got, want, "{}", args.value(i));
            checked += want.is_some() as usize;
        }
    }
    assert!(checked > 10, "only {checked} operators with an External id");
}
