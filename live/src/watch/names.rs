//! What a file's name says: whether it may be a trace file being written into the watched
//! directory, and the rank it names (`--rank-from path`).

use std::path::Path;

/// Names that are traces by their extension: Kineto JSON (plain, gzip, zstd), Nsight Systems
/// SQLite exports, rocprofv3 CSV tables. Other names are traces only if their content is
/// recognised (stage logs have no extension of their own).
const TRACE_SUFFIXES: &[&str] = &[".json", ".json.gz", ".json.zst", ".sqlite", ".csv"];

/// How a name relates to traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// Hidden or temporary: a writer's scratch file, never read.
    Ignored,
    /// A trace by its extension.
    Trace,
    /// A trace only if its content says so (a stage log).
    ByContent,
}

/// What the file name `name` (no directory) says. Writers that write under a temporary
/// name and rename when done (`.name.XXXX`, `name.tmp`, `name.part`) are followed by their
/// final name only.
pub fn kind_of(name: &str) -> NameKind {
    let lower = name.to_ascii_lowercase();
    if name.starts_with('.')
        || name.ends_with('~')
        || [".tmp", ".part", ".swp"].iter().any(|s| lower.ends_with(s))
    {
        NameKind::Ignored
    } else if TRACE_SUFFIXES.iter().any(|s| lower.ends_with(s)) {
        NameKind::Trace
    } else {
        NameKind::ByContent
    }
}

/// Whether a file of this name can be read as soon as its writer closes it: a Kineto JSON
/// file (plain or compressed) does not parse until its last byte is written, so reading it
/// early costs at most one retry. Other formats wait for the settle time: a stage log's
/// prefix is a valid log, and an SQLite file is written in pages.
pub fn complete_when_closed(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    kind_of(name) == NameKind::Trace
        && [".json", ".json.gz", ".json.zst"]
            .iter()
            .any(|s| lower.ends_with(s))
}

/// Whether `path` is named as profilers name their output: Kineto's `*.pt.trace.json` (plain,
/// gzip, zstd), Nsight Systems exports (`*.sqlite`), rocprofv3's CSV tables
/// (`<pid>_kernel_trace.csv`, ...). The watch reads only these below the watched directory.
pub fn profiler_output(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    let lower = name.to_ascii_lowercase();
    kind_of(name) == NameKind::Trace
        && ([
            ".pt.trace.json",
            ".pt.trace.json.gz",
            ".pt.trace.json.zst",
            ".sqlite",
        ]
        .iter()
        .any(|s| lower.ends_with(s))
            || gpuq_ingest::output_named(path).is_some())
}

/// The rank a file name gives: `worker3.*`, `rank-3.*`, `rank_3.*`, `rank3.*`, also after a
/// prefix (`job_rank3.1700000000000.pt.trace.json`); case is ignored. `None` when the name
/// names none, or names two different ones.
pub fn rank_of(name: &str) -> Option<i32> {
    let lower = name.to_ascii_lowercase();
    let mut ranks = ["worker", "rank"].into_iter().flat_map(|word| {
        let lower = &lower;
        lower.match_indices(word).filter_map(move |(at, _)| {
            // A word of its own: `frank3` names no rank.
            if lower[..at].ends_with(|c: char| c.is_ascii_alphabetic()) {
                return None;
            }
            let rest = &lower[at + word.len()..];
            let rest = rest.strip_prefix(['-', '_']).unwrap_or(rest);
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            rest[..digits].parse::<i32>().ok()
        })
    });
    let first = ranks.next()?;
    ranks.all(|r| r == first).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_and_temporary_names_are_ignored_and_traces_known_by_extension() {
        for name in [
            ".w0.json",
            "w0.json.tmp",
            "w0.json.part",
            "w0.json~",
            "x.SWP",
        ] {
            assert_eq!(kind_of(name), NameKind::Ignored, "{name}");
        }
        for name in [
            "worker0.1700000000000.pt.trace.json",
            "worker0.1700000000000.pt.trace.json.gz",
            "t.JSON.ZST",
            "report.sqlite",
            "1234_kernel_trace.csv",
        ] {
            assert_eq!(kind_of(name), NameKind::Trace, "{name}");
            assert_eq!(
                complete_when_closed(name),
                name.to_ascii_lowercase().contains(".json"),
                "{name}"
            );
        }
        for name in ["train.log", "stages.jsonl", "README"] {
            assert_eq!(kind_of(name), NameKind::ByContent, "{name}");
        }
    }

    #[test]
    fn below_the_top_level_only_profiler_names_count() {
        for name in [
            "node1/worker0.1700000000000.pt.trace.json.gz",
            "node1/report.sqlite",
            "node1/4242_kernel_trace.csv",
            "node1/4242_hip_api_trace.csv",
        ] {
            assert!(profiler_output(Path::new(name)), "{name}");
        }
        for name in [
            "wandb/config.json",
            "results/metrics.csv",
            "logs/train.log",
            "node1/.4242_kernel_trace.csv",
        ] {
            assert!(!profiler_output(Path::new(name)), "{name}");
        }
    }

    #[test]
    fn ranks_come_from_worker_and_rank_names() {
        let cases = [
            ("worker3.1700000000123.pt.trace.json", Some(3)),
            ("rank-3.json", Some(3)),
            ("rank_12.pt.trace.json.gz", Some(12)),
            ("rank3.sqlite", Some(3)),
            ("RANK7.json", Some(7)),
            ("job_rank5.1700000000000.pt.trace.json", Some(5)),
            ("host_rank2_rank2.json", Some(2)),
            // Two different ranks, none, or a word that only contains "rank".
            ("worker1_rank2.json", None),
            ("host_1234.1700000000000.pt.trace.json", None),
            ("frank3.json", None),
            ("workers.json", None),
            ("rank.json", None),
        ];
        for (name, rank) in cases {
            assert_eq!(rank_of(name), rank, "{name}");
        }
    }
}
