//! Benchmark: a run that received many small appends (a live run: one commit per profiling
//! cycle) against the same rows ingested at once (issue #32: `SELECT name, sum(dur) ... GROUP BY
//! name` within 1.5x).
//!
//! ```text
//! cargo run --release -p gpuq-query --example live_appends -- [APPENDS] [STEPS]
//! ```
//!
//! A generated Kineto trace of STEPS steps (default 3000: about 2.4 M events) is ingested
//! whole as run `whole`. Its events, in time order, are then cut into APPENDS (default 10,000)
//! consecutive slices, each appended to run `live` by one long-lived writer, as `gpuq watch`
//! does: one part and one commit per slice, with the automatic compaction of fragmented runs
//! after each append. The query runs once on each run to warm up, then 7 times on each,
//! alternating; the medians are reported, and the two runs' answers must be equal.

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::{concat_batches, sort_to_indices, take_record_batch};
use datafusion::arrow::datatypes::Int64Type;
use gpuq_engine::manifest::{RunMeta, SourceFile};
use gpuq_engine::schema::TableKind;
use gpuq_engine::store::PutMode;
use gpuq_engine::{RunId, Store};
use gpuq_synth::{write_kineto, SynthConfig};
use std::time::Instant;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let appends: usize = args.next().map_or(10_000, |a| a.parse().expect("APPENDS"));
    let steps: u32 = args.next().map_or(3000, |a| a.parse().expect("STEPS"));
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let cfg = SynthConfig {
        steps,
        ..SynthConfig::small()
    };
    write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let opts = gpuq_ingest::IngestOptions {
        run: Some(RunId::new("whole").unwrap()),
        ..Default::default()
    };
    let t = Instant::now();
    gpuq_ingest::ingest(&store, &[trace], &opts, &gpuq_ingest::NoProgress).unwrap();
    let ingest_s = t.elapsed().as_secs_f64();

    // The whole run's events in time order, cut into slices.
    let m = store.manifest().unwrap();
    let whole = &m.runs[&RunId::new("whole").unwrap()];
    let mut batches = Vec::new();
    for f in whole.files.iter().filter(|f| f.table == TableKind::Events) {
        let path = store.file_path(&m, &f.path);
        batches.extend(gpuq_engine::part::read_parquet(TableKind::Events, &path).unwrap());
    }
    let all = concat_batches(&batches[0].schema(), &batches).unwrap();
    drop(batches);
    let ts = all.column_by_name("ts").unwrap();
    let order = sort_to_indices(ts, None, None).unwrap();
    let all = take_record_batch(&all, &order).unwrap();
    let rows = all.num_rows();
    let live = RunId::new("live").unwrap();
    let mut writer = store.writer().unwrap();
    let t = Instant::now();
    for i in 0..appends {
        let (from, to) = (rows * i / appends, rows * (i + 1) / appends);
        let slice: RecordBatch = all.slice(from, to - from);
        let staged = writer.write_part(TableKind::Events, vec![slice]).unwrap();
        let meta = RunMeta {
            format: "kineto".into(),
            sources: vec![SourceFile {
                path: format!("cycle-{i}.json"),
                hash: format!("{i:032x}"),
                bytes: (to - from) as u64,
                rank: None,
                format: "kineto".into(),
                files: Vec::new(),
            }],
            events: (to - from) as u64,
            ..Default::default()
        };
        writer
            .put_run(&live, meta, vec![staged], PutMode::Append)
            .unwrap();
    }
    let append_s = t.elapsed().as_secs_f64();
    drop(writer);
    let m = store.manifest().unwrap();
    let parts = |run: &str| {
        m.runs[&RunId::new(run).unwrap()]
            .files
            .iter()
            .filter(|f| f.table == TableKind::Events)
            .count()
    };
    println!(
        "{rows} events; whole: ingested in {ingest_s:.2} s, {} events parts; live: {appends} \
         appends in {append_s:.1} s ({:.2} ms each, compaction included), {} events parts, \
         manifest version {}",
        parts("whole"),
        append_s * 1000.0 / appends as f64,
        parts("live"),
        m.version
    );

    let ctx = gpuq_query::open_session(&store).await.unwrap();
    let sql = |run: &str| {
        format!(
            "SELECT name, sum(dur) AS total FROM events WHERE run = '{run}' GROUP BY name \
             ORDER BY name"
        )
    };
    let answer = |b: &[RecordBatch]| -> Vec<(String, i64)> {
        b.iter()
            .flat_map(|b| {
                let names = datafusion::arrow::compute::cast(
                    b.column(0),
                    &datafusion::arrow::datatypes::DataType::Utf8,
                )
                .unwrap();
                let names: Vec<String> = names
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.unwrap_or_default().to_string())
                    .collect();
                let totals: Vec<i64> = b
                    .column(1)
                    .as_primitive::<Int64Type>()
                    .iter()
                    .map(|v| v.unwrap_or(0))
                    .collect();
                names.into_iter().zip(totals)
            })
            .collect()
    };
    let run_once = |run: &'static str| {
        let ctx = ctx.clone();
        let sql = sql(run);
        async move {
            let t = Instant::now();
            let b = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            (t.elapsed().as_secs_f64(), b)
        }
    };
    let (_, a) = run_once("whole").await;
    let (_, b) = run_once("live").await;
    assert_eq!(answer(&a), answer(&b), "the two runs answer differently");
    let (mut tw, mut tl) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        tw.push(run_once("whole").await.0);
        tl.push(run_once("live").await.0);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, l) = (median(&mut tw), median(&mut tl));
    println!(
        "GROUP BY name: whole {:.1} ms, live {:.1} ms (median of 7): live/whole = {:.2}",
        w * 1000.0,
        l * 1000.0,
        l / w
    );
}
