//! Benchmark: a store of many runs (issue #37: opening a 10,000-run store under 100 ms, `gpuq
//! runs` under 300 ms, a commit under 50 ms plus the data it writes).
//!
//! ```text
//! cargo run --release -p gpuq-query --example store_scale -- [RUNS] [DIR]
//! ```
//!
//! A generated Kineto trace (the demo shape, 20 steps) is ingested as run `seed`; RUNS
//! (default 10,000) runs are then committed 100 to a commit, each holding hard links to the
//! seed's files and its metadata with tags of its own (`i`, `branch`). (A file takes at most
//! 65,000 links on ext4: every 30,000 runs link to a seed of their own, `seed1`, `seed2`, ...,
//! generated with another random seed.) Measured on that store,
//! each several times with the median and the slowest reported:
//! - opening it: `Store::open` and reading the newest version, in a fresh `Store`;
//! - the `runs` table: `open_session` and `SELECT * FROM runs`, collected;
//! - a commit: a new run of one small part (the part written first, then timed: the commit
//!   alone), and a tag set on an existing run; the commits that also wrote a checkpoint
//!   (every 16 versions up to 16,000 runs, every 100 at 100,000) are reported apart;
//! - for comparison, what writing the whole manifest costs (serialise, write, fsync): what
//!   every commit cost when each version was a whole manifest.
//!
//! DIR (default: a temporary directory) keeps the store for other tools.

use gpuq_engine::manifest::RunMeta;
use gpuq_engine::schema::TableKind;
use gpuq_engine::store::PutMode;
use gpuq_engine::{RunId, Store};
use gpuq_synth::{write_kineto, SynthConfig};
use std::io::Write;
use std::time::Instant;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(0.0, f64::max)
}

fn ms(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "none".into();
    }
    format!(
        "median {:.1} ms, slowest {:.1} ms ({} times)",
        median(xs.to_vec()),
        max(xs),
        xs.len()
    )
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(10_000, |a| a.parse().expect("RUNS"));
    let tmp = tempfile::tempdir().unwrap();
    let root = args
        .next()
        .map_or_else(|| tmp.path().join("store"), std::path::PathBuf::from);
    let store = Store::open(&root).unwrap();
    let ingest_seed = |k: u64| {
        let name = if k == 0 {
            "seed".to_string()
        } else {
            format!("seed{k}")
        };
        let trace = tmp.path().join(format!("{name}.json"));
        let cfg = SynthConfig {
            steps: 20,
            seed: SynthConfig::small().seed + k,
            ..SynthConfig::small()
        };
        write_kineto(&cfg, std::fs::File::create(&trace).unwrap()).unwrap();
        let run = RunId::new(name).unwrap();
        let opts = gpuq_ingest::IngestOptions {
            run: Some(run.clone()),
            ..Default::default()
        };
        gpuq_ingest::ingest(&store, &[trace], &opts, &gpuq_ingest::NoProgress).unwrap();
        run
    };
    let seed = ingest_seed(0);

    // RUNS runs, 100 to a commit.
    let t = Instant::now();
    let mut writer = store.writer().unwrap();
    let mut seed_entry = writer.manifest().runs[&seed].clone();
    let mut built = 0;
    while built < runs {
        if built > 0 && built % 30_000 == 0 {
            let next = ingest_seed((built / 30_000) as u64);
            writer.refresh().unwrap();
            seed_entry = writer.manifest().runs[&next].clone();
        }
        let batch: Vec<_> = (built..(built + 100).min(runs))
            .map(|i| {
                let staged = seed_entry
                    .files
                    .iter()
                    .map(|f| writer.link_part(f).unwrap())
                    .collect();
                let mut meta: RunMeta = seed_entry.meta.clone();
                meta.tags.insert("i".into(), i.to_string());
                let branch = if i % 10 == 0 { "pr" } else { "main" };
                meta.tags.insert("branch".into(), branch.into());
                (RunId::new(format!("r{i:06}")).unwrap(), meta, staged)
            })
            .collect();
        built += batch.len();
        writer.put_runs(batch, PutMode::Create).unwrap();
    }
    let m = store.manifest().unwrap();
    let manifest_bytes = serde_json::to_vec(&*m).unwrap().len();
    let files: usize = m.runs.values().map(|e| e.files.len()).sum();
    println!(
        "store: {} runs, {files} files, manifest version {}, a whole manifest {:.1} MB \
         ({:.0} bytes a run); built in {:.1} s",
        m.runs.len(),
        m.version,
        manifest_bytes as f64 / 1e6,
        manifest_bytes as f64 / m.runs.len() as f64,
        t.elapsed().as_secs_f64()
    );
    drop(m);

    // Commits: a new run of one small part; a tag set. Kept apart: those that wrote a
    // checkpoint.
    let part = writer
        .manifest()
        .runs
        .get(&seed)
        .unwrap()
        .files
        .iter()
        .find(|f| f.table == TableKind::Counters)
        .cloned();
    let (mut run_commits, mut tag_commits, mut checkpoint_commits) = (vec![], vec![], vec![]);
    let checkpointed = |v: u64| store.paths().checkpoint_file(v).exists();
    for i in 0..32 {
        let staged = part.iter().map(|f| writer.link_part(f).unwrap()).collect();
        let meta = RunMeta {
            format: "kineto".into(),
            ..seed_entry.meta.clone()
        };
        let run = RunId::new(format!("new{i:03}")).unwrap();
        let t = Instant::now();
        let v = writer.put_run(&run, meta, staged, PutMode::Create).unwrap();
        let s = t.elapsed().as_secs_f64() * 1e3;
        if checkpointed(v) {
            checkpoint_commits.push(s);
        } else {
            run_commits.push(s);
        }
        let t = Instant::now();
        let v = writer
            .set_tags(&run, &[("checked".into(), "yes".into())])
            .unwrap();
        let s = t.elapsed().as_secs_f64() * 1e3;
        if checkpointed(v) {
            checkpoint_commits.push(s);
        } else {
            tag_commits.push(s);
        }
    }
    drop(writer);
    println!("commit of a new run (one part): {}", ms(&run_commits));
    println!("commit of a tag: {}", ms(&tag_commits));
    println!(
        "commit that also wrote the checkpoint: {}",
        ms(&checkpoint_commits)
    );

    // What one commit cost when each version was the whole manifest.
    let m = store.manifest().unwrap();
    let mut whole = vec![];
    for _ in 0..5 {
        let t = Instant::now();
        let bytes = serde_json::to_vec(&*m).unwrap();
        let path = tmp.path().join("whole.json");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap();
        whole.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "writing the whole manifest (each commit, before the log): {}",
        ms(&whole)
    );
    drop(m);

    // Opening: a fresh Store reads the newest checkpoint and the entries after it.
    let mut open = vec![];
    for _ in 0..7 {
        let t = Instant::now();
        let s = Store::open(&root).unwrap();
        let m = s.manifest().unwrap();
        assert!(m.runs.len() > runs);
        open.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("open (Store::open + newest version): {}", ms(&open));

    // The runs table.
    let mut table = vec![];
    for _ in 0..7 {
        let t = Instant::now();
        let s = Store::open(&root).unwrap();
        let ctx = gpuq_query::open_session(&s).await.unwrap();
        let batches = ctx
            .sql("SELECT * FROM runs")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert!(rows > runs);
        table.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("open + SELECT * FROM runs: {}", ms(&table));
}
