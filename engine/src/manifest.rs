//! The manifest: the complete, versioned list of runs and their files.
//!
//! This is the state of one version. How versions are kept on disk (a log of the changes of
//! each commit, with periodic checkpoints of the whole state) is [`crate::store`]'s `log`.
//! Run entries are shared between versions ([`Arc`]): the next version is a cheap copy of the
//! newest, a commit changes the few runs it touches, and what it changed is told by pointer.

use crate::run_id::RunId;
use crate::schema::TableKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One committed version of the store.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u64,
    /// Next free sequence number for data file names; never reused.
    pub next_file_seq: u64,
    #[serde(with = "shared_runs")]
    pub runs: BTreeMap<RunId, Arc<RunEntry>>,
    /// Files dropped by a commit, deleted once no reader can still be using them.
    #[serde(default)]
    pub tombstones: Vec<Tombstone>,
    /// Every file this version names (and every tombstoned one) is under `_data/`, where
    /// readers read it; the Hive tree holds links to the live files only. `false` for stores
    /// written before `_data/` existed: their files are read from the Hive tree.
    #[serde(default)]
    pub data_area: bool,
}

/// (De)serialises shared run entries as plain ones (serde's `rc` feature would change the
/// features of every crate built on serde, DataFusion's included).
pub(crate) mod shared_runs {
    use super::{RunEntry, RunId};
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(
        runs: &BTreeMap<RunId, Arc<RunEntry>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(runs.iter().map(|(k, v)| (k, &**v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<RunId, Arc<RunEntry>>, D::Error> {
        let runs = BTreeMap::<RunId, RunEntry>::deserialize(d)?;
        Ok(runs.into_iter().map(|(k, v)| (k, Arc::new(v))).collect())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunEntry {
    pub meta: RunMeta,
    pub files: Vec<FileEntry>,
}

/// A data file of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    pub table: TableKind,
    /// Relative to the store root.
    pub path: String,
    pub size: u64,
    pub rows: u64,
    /// Min/max of the table's stat columns; `None` when every value is null.
    pub stats: BTreeMap<String, Option<(i64, i64)>>,
    /// Where each kind's rows are: half-open row ranges of the sorted file (a superset: ranges
    /// closer than [`crate::part::KIND_RANGE_GAP`] rows are merged). Lets a scan filtered on
    /// `kind` read only those rows. Empty for files written before it existed (then every row
    /// is read).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kinds: BTreeMap<String, Vec<(u64, u64)>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tombstone {
    pub path: String,
    pub removed_at_ms: u64,
}

/// A source file that went into a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SourceFile {
    pub path: String,
    /// XXH3-128 of the file's bytes, 32 hex digits (as `xxhsum -H2` prints them).
    pub hash: String,
    pub bytes: u64,
    pub rank: Option<i32>,
    pub format: String,
    /// The files of a source read as one (a rocprofv3 output: its CSV tables), each with its
    /// size; empty when the source is the one file `path`. A watch that restarts knows each
    /// file it stored from these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<SourceMember>,
}

/// One file of a source read from several files.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SourceMember {
    pub path: String,
    pub bytes: u64,
}

/// A GPU of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub rank: Option<i32>,
    pub id: i32,
    pub name: String,
}

/// What the `runs` table shows about a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunMeta {
    pub format: String,
    pub sources: Vec<SourceFile>,
    pub imported_at_ns: i64,
    pub ranks: Vec<i32>,
    pub world_size: Option<i64>,
    pub devices: Vec<DeviceInfo>,
    pub first_ts: Option<i64>,
    pub last_ts: Option<i64>,
    pub events: u64,
    pub kernels: u64,
    /// `true` when `ts` is nanoseconds since the Unix epoch, `false` when since trace start.
    pub epoch_time: bool,
    pub tags: BTreeMap<String, String>,
    /// Trace metadata (framework / CUDA / NCCL versions, ...), secrets already redacted.
    pub metadata: serde_json::Value,
    /// Ingest warnings: message -> occurrences.
    pub warnings: BTreeMap<String, u64>,
    /// Stages begun and not ended yet in the stage logs a live watch follows, by log path
    /// as stored (each append of a log replaces its list): a stage is stored as an event
    /// once its end line is written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub open_stages: BTreeMap<String, Vec<OpenStage>>,
}

/// A stage begun in a stage log that is still growing, and not ended yet.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpenStage {
    pub name: String,
    /// When it began, on the run's clock (ns).
    pub ts: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<i64>,
    /// The begin line's other fields, as compact JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
}

impl RunMeta {
    /// Folds the metadata of another ingest into this run (used when appending to a run).
    pub fn merge(&mut self, other: RunMeta) {
        let mut formats: Vec<&str> = self
            .format
            .split('+')
            .chain(other.format.split('+'))
            .filter(|f| !f.is_empty())
            .collect();
        formats.sort_unstable();
        formats.dedup();
        self.format = formats.join("+");
        if self.epoch_time != other.epoch_time {
            *self
                .warnings
                .entry(
                    "sources on different clocks (epoch ns and trace-relative ns) in one run"
                        .into(),
                )
                .or_default() += 1;
        }
        self.epoch_time &= other.epoch_time;
        self.sources.extend(other.sources);
        for r in other.ranks {
            if !self.ranks.contains(&r) {
                self.ranks.push(r);
            }
        }
        self.ranks.sort_unstable();
        for d in other.devices {
            if !self.devices.contains(&d) {
                self.devices.push(d);
            }
        }
        self.world_size = self.world_size.or(other.world_size);
        self.first_ts = min_opt(self.first_ts, other.first_ts);
        self.last_ts = self.last_ts.max(other.last_ts);
        self.events += other.events;
        self.kernels += other.kernels;
        for (k, v) in other.tags {
            self.tags.entry(k).or_insert(v);
        }
        if self.metadata.is_null() {
            self.metadata = other.metadata;
        } else if let (Some(a), serde_json::Value::Object(b)) =
            (self.metadata.as_object_mut(), other.metadata)
        {
            for (k, v) in b {
                a.entry(k).or_insert(v);
            }
        }
        for (k, v) in other.warnings {
            *self.warnings.entry(k).or_default() += v;
        }
        // The newest read of a log says which of its stages are open now.
        for (log, open) in other.open_stages {
            if open.is_empty() {
                self.open_stages.remove(&log);
            } else {
                self.open_stages.insert(log, open);
            }
        }
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A data file name as the writer makes them: `part-<digits>.parquet`.
fn is_part_file_name(name: &str) -> bool {
    name.strip_prefix("part-")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `path` is a data file path the writer could have made for `run`'s `table`:
/// `<table>/run=<run>/part-<seq>.parquet`. Nothing else can name a file outside its run's
/// directory (no absolute path, no `..`, no other run's or table's directory).
fn is_part_path(path: &str, table: TableKind, run: &str) -> bool {
    let mut parts = path.split('/');
    parts.next() == Some(table.name())
        && parts.next().and_then(|d| d.strip_prefix("run=")) == Some(run)
        && parts.next().is_some_and(is_part_file_name)
        && parts.next().is_none()
}

impl Manifest {
    /// Checks what a reader relies on before it opens any file the manifest names: every
    /// path is a data file path of its own run and table (a crafted `../../etc/x` or
    /// `/etc/x` is refused), and every kind range lies within its file's rows. The files
    /// themselves are checked when they are opened (sizes, symbolic links).
    pub fn check(&self) -> std::result::Result<(), String> {
        for (run, entry) in &self.runs {
            entry.check(run)?;
        }
        check_tombstones(&self.tombstones)
    }
}

/// [`Manifest::check`] for the files kept for readers: data file paths, nothing else.
pub(crate) fn check_tombstones(tombstones: &[Tombstone]) -> std::result::Result<(), String> {
    for t in tombstones {
        let valid = TableKind::ALL.iter().any(|&table| {
            let mut parts = t.path.split('/');
            parts.next() == Some(table.name())
                && parts
                    .next()
                    .and_then(|d| d.strip_prefix("run="))
                    .is_some_and(|r| RunId::new(r).is_ok() && is_part_path(&t.path, table, r))
        });
        if !valid {
            return Err(format!(
                "keeps {:?} for readers, which is not a data file path",
                t.path
            ));
        }
    }
    Ok(())
}

impl RunEntry {
    /// [`Manifest::check`] for the files of one run.
    pub fn check(&self, run: &RunId) -> std::result::Result<(), String> {
        for f in &self.files {
            if !is_part_path(&f.path, f.table, run.as_str()) {
                return Err(format!(
                    "names the file {:?} for run {run}, which is not a data file path of \
                     that run ({}/run={run}/part-N.parquet)",
                    f.path,
                    f.table.name()
                ));
            }
            let ranges = f.kinds.values().flatten();
            if let Some((lo, hi)) = ranges.into_iter().find(|(lo, hi)| lo >= hi || *hi > f.rows) {
                return Err(format!(
                    "gives {} a row range {lo}..{hi} outside its {} rows",
                    f.path, f.rows
                ));
            }
        }
        Ok(())
    }
}

impl Manifest {
    /// The run whose sources include a file with this content hash, if any.
    pub fn run_with_source_hash(&self, hash: &str) -> Option<&RunId> {
        self.runs
            .iter()
            .find(|(_, e)| e.meta.sources.iter().any(|s| s.hash == hash))
            .map(|(r, _)| r)
    }

    /// Every data file of `table`, with its run.
    pub fn files(&self, table: TableKind) -> impl Iterator<Item = (&RunId, &FileEntry)> {
        self.runs.iter().flat_map(move |(r, e)| {
            e.files
                .iter()
                .filter(move |f| f.table == table)
                .map(move |f| (r, f))
        })
    }
}
