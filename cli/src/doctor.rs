//! `gpuq doctor [--repair]`: prints what [`gpuq_engine::store::doctor`] found and did, and
//! exits 0 when the store is healthy (after repairs), 1 when it is damaged.

use anyhow::{bail, Context};
use gpuq_engine::store::doctor;
use gpuq_engine::Store;
use std::path::Path;
use std::process::ExitCode;

pub fn run(store_path: &Path, repair: bool) -> anyhow::Result<ExitCode> {
    if !store_path.is_dir() {
        bail!("no store at {}", store_path.display());
    }
    let store = Store::open(store_path)
        .with_context(|| format!("cannot open the store at {}", store_path.display()))?;
    let report = doctor::check(&store, repair)?;
    let versions = match (report.versions.first(), report.versions.last()) {
        (Some(a), Some(b)) => format!("manifest versions {a}..{b}"),
        _ => "no manifest version".to_string(),
    };
    println!(
        "store {}: {versions}, {} data files of version {} checked",
        store.root().display(),
        report.files_checked,
        report
            .readable
            .map_or_else(|| "(none readable)".to_string(), |v| v.to_string())
    );
    if report.writer_running {
        println!(
            "a writer is running: leftovers were not looked for{}",
            if repair {
                " and nothing was repaired"
            } else {
                ""
            }
        );
    }
    for f in &report.findings {
        match &f.repaired {
            Some(done) => println!("repaired: {}: {done}", f.problem),
            None => println!("damaged: {}", f.problem),
        }
    }
    if report.damaged() {
        if !repair {
            println!("the store is damaged; `gpuq doctor --repair` repairs what it can");
        }
        Ok(ExitCode::from(1))
    } else {
        println!("healthy");
        Ok(ExitCode::SUCCESS)
    }
}
