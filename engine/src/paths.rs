//! Typed paths of the store layout.

use crate::run_id::RunId;
use crate::schema::TableKind;
use std::path::{Path, PathBuf};

/// Where everything of one store lives.
#[derive(Debug, Clone)]
pub struct StorePaths {
    root: PathBuf,
}

impl StorePaths {
    pub fn new(root: impl Into<PathBuf>) -> StorePaths {
        StorePaths { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn manifest_dir(&self) -> PathBuf {
        self.root.join("_manifest")
    }

    /// The commit of `version`: its log entry (or, in stores written before the log, the
    /// whole manifest). The number is inverted so that the newest version sorts first.
    pub fn manifest_file(&self, version: u64) -> PathBuf {
        self.manifest_dir().join(manifest_file_name(version))
    }

    /// The checkpoint of `version`: the whole manifest at that version.
    pub fn checkpoint_file(&self, version: u64) -> PathBuf {
        self.manifest_dir().join(checkpoint_file_name(version))
    }

    pub fn staging_dir(&self) -> PathBuf {
        self.root.join("_staging")
    }

    /// Where every data file of the manifest's versions lives, by its manifest path (the
    /// Hive tree `<table>/run=<id>/` holds hard links to the current version's files only).
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("_data")
    }

    /// The stable path of a data file (relative path as kept in the manifest): it stays
    /// there while any version kept for readers names it.
    pub fn data_file(&self, rel: &str) -> PathBuf {
        self.data_dir().join(rel)
    }

    pub fn lock_file(&self) -> PathBuf {
        self.root.join("_lock")
    }

    pub fn table_dir(&self, table: TableKind) -> PathBuf {
        self.root.join(table.name())
    }

    pub fn run_dir(&self, table: TableKind, run: &RunId) -> PathBuf {
        self.table_dir(table).join(format!("run={run}"))
    }

    /// Path of a committed data file, relative to the store root (as kept in the manifest).
    pub fn part_rel_path(table: TableKind, run: &RunId, seq: u64) -> String {
        format!("{}/run={run}/part-{seq:010}.parquet", table.name())
    }

    /// The path of a data file in the Hive tree (present only while the current version
    /// names it).
    pub fn absolute(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

pub fn manifest_file_name(version: u64) -> String {
    format!("{:020}.json", u64::MAX - version)
}

/// Parses a manifest file name back into its version.
pub fn parse_manifest_file_name(name: &str) -> Option<u64> {
    parse_inverted(name.strip_suffix(".json")?)
}

pub fn checkpoint_file_name(version: u64) -> String {
    format!("{:020}.checkpoint.json", u64::MAX - version)
}

/// Parses a checkpoint file name back into its version.
pub fn parse_checkpoint_file_name(name: &str) -> Option<u64> {
    parse_inverted(name.strip_suffix(".checkpoint.json")?)
}

fn parse_inverted(digits: &str) -> Option<u64> {
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok().map(|inv| u64::MAX - inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_round_trip_and_sort_newest_first() {
        let names: Vec<String> = [1u64, 2, 10, 999]
            .iter()
            .map(|v| manifest_file_name(*v))
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted.first(), names.last());
        for (v, n) in [1u64, 2, 10, 999].iter().zip(&names) {
            assert_eq!(parse_manifest_file_name(n), Some(*v));
        }
        assert_eq!(parse_manifest_file_name(".tmp-1.json"), None);
        let checkpoint = checkpoint_file_name(42);
        assert_eq!(parse_checkpoint_file_name(&checkpoint), Some(42));
        assert_eq!(parse_manifest_file_name(&checkpoint), None);
        assert_eq!(parse_checkpoint_file_name(&names[0]), None);
    }
}
