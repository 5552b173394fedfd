//! Writes the fuzz targets' seed corpus: `fuzz-seeds DIR [TARGET...]` fills `DIR/<target>/`
//! with one file per seed, named by its content's hash (fuzz/seed.sh runs it).

use gpuq_tests::fuzz::{seeds, Target};
use std::hash::{Hash, Hasher};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: fuzz-seeds DIR [TARGET...]");
        std::process::exit(2);
    };
    let named: Vec<String> = args.collect();
    let mut targets = Vec::new();
    for name in &named {
        match Target::of_name(name) {
            Some(t) => targets.push(t),
            None => {
                eprintln!("unknown target {name:?}");
                std::process::exit(2);
            }
        }
    }
    if targets.is_empty() {
        targets = Target::ALL.to_vec();
    }
    for target in targets {
        let out = std::path::Path::new(&dir).join(target.name());
        std::fs::create_dir_all(&out).expect("create the corpus directory");
        let corpus = seeds(target);
        for seed in &corpus {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            std::fs::write(out.join(format!("seed-{:016x}", h.finish())), seed)
                .expect("write a seed");
        }
        println!(
            "{}: {} seeds in {}",
            target.name(),
            corpus.len(),
            out.display()
        );
    }
}
