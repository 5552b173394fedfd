//! Command-line arguments, parsed by clap and then validated into typed values.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "gpuq",
    version,
    about = "Embedded time-series store and SQL shell for GPU profiling traces"
)]
pub struct Cli {
    /// Store directory [default: $GPUQ_STORE, else the user's data directory]
    #[arg(long, global = true, env = "GPUQ_STORE")]
    pub store: Option<PathBuf>,
    /// Kernel class rules (`CLASS = REGEX` lines, tried before the built-in table) for
    /// kernel_class() and every analysis [default: <store>/kernel_classes.txt if present]
    #[arg(long, global = true, value_name = "FILE")]
    pub classes: Option<PathBuf>,
    /// How long a command that writes waits for another writer's store lock before it gives
    /// up (e.g. 30s, 10min; 0: not at all; inf: for ever) [default: 10min]
    #[arg(long, global = true, env = "GPUQ_LOCK_TIMEOUT", value_name = "DURATION",
          value_parser = parse_lock_timeout)]
    pub lock_timeout: Option<LockTimeout>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ingest trace files (or directories of rank files) into the store
    Ingest {
        /// Trace files or directories
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Run name [default: derived from each file name]
        #[arg(long)]
        run: Option<String>,
        /// Tag the run: KEY=VALUE (repeatable)
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Input format; auto detects each file by its content
        #[arg(long, value_enum, default_value_t = InputFormat::Auto)]
        format: InputFormat,
        /// Regex for ranges that are steps (NVTX ranges; Kineto operators, annotations and
        /// Python functions), with one capture group, the step number, or none: matches are
        /// then numbered 1, 2, ... in order [default: Nsight Systems: ProfilerStep#N, step N,
        /// iteration_N, train_step[N], ...; Kineto: ProfilerStep#N]
        #[arg(long, value_name = "REGEX")]
        step_pattern: Option<String>,
        /// Skip (and count) lines of line-based formats that do not parse instead of failing
        #[arg(long)]
        lenient: bool,
        /// Time zone of stage-log times written without a UTC offset: an IANA name
        /// (Europe/Berlin) or an offset (+01:00) [default: such times are an error, Python
        /// logging times are UTC]
        #[arg(long, value_name = "ZONE", value_parser = parse_zone)]
        tz: Option<gpuq_ingest::LogZone>,
        /// Replace the run if it exists (also re-ingests files already stored); the run keeps
        /// its tags unless --tag gives new ones
        #[arg(long)]
        replace: bool,
        /// Store the files as one run even where they do not look like one job (a rank given
        /// twice, different clocks, captures more than a minute apart)
        #[arg(long)]
        merge_unrelated: bool,
        /// Print nothing but errors
        #[arg(long, short)]
        quiet: bool,
    },
    /// Run SQL statements and print their results (for scripts and CI)
    Query {
        /// SQL text; several statements separated by ';'
        sql: Option<String>,
        /// Read SQL from a file ('-' for standard input)
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Rows a table shows at most ('inf': all); CSV/JSON/NDJSON/Markdown always print all
        #[arg(long, value_name = "N|inf", default_value = "40", value_parser = parse_max_rows)]
        maxrows: MaxRows,
        #[command(flatten)]
        access: FileAccessArgs,
    },
    /// Interactive SQL shell (reads statements from standard input when it is not a terminal)
    Sql {
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
        /// Rows a table shows at most ('inf': all; `\\maxrows` changes it in the shell)
        #[arg(long, value_name = "N|inf", default_value = "40", value_parser = parse_max_rows)]
        maxrows: MaxRows,
        #[command(flatten)]
        access: FileAccessArgs,
    },
    /// Check the store's manifests and data files against each other (exit 0: healthy,
    /// 1: damaged); --repair repairs what it can without losing committed data
    Doctor {
        /// Move a damaged newest manifest aside (once the previous version checks whole),
        /// remove what dead writers left, and bring the Hive tree to the newest version
        #[arg(long)]
        repair: bool,
    },
    /// List, remove or tag runs
    Runs {
        #[command(subcommand)]
        action: Option<RunsAction>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Per-kernel time of a run, as Nsight Systems' cuda_gpu_kern_sum, with class and top op
    Top {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Show the N kernels with the most time
        #[arg(short = 'n', long)]
        limit: Option<usize>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// When the GPUs sat idle and why: per-cause totals and the longest gaps
    Gaps {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Only gaps longer than this (e.g. 100us, 1.5ms; default: every gap)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        min_gap: Option<i64>,
        /// Show the N longest gaps [default for tables: 20]
        #[arg(short = 'n', long)]
        limit: Option<usize>,
        /// Per stream (HTA's idle time breakdown) instead of per device
        #[arg(long)]
        per_stream: bool,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// GPU utilisation over time, as Nsight Systems' gpu_time_util (chunked In-Use %)
    Util {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Chunks per device (1 to 1000)
        #[arg(long, default_value_t = 30)]
        chunks: i64,
        /// Keep only chunks under this In-Use %, merging neighbours (nsys's default is 50)
        #[arg(long, value_name = "PCT")]
        threshold: Option<i64>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Per device: busy, idle, compute, exposed communication and copies, sync, overhead
    Breakdown {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// GEMM-like operators against the GPU's roofline: achieved TFLOP/s, arithmetic intensity, bound
    Roofline {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// NVTX ranges, annotations and operators projected onto the GPU: the span and busy time of the work each launched
    Projection {
        /// Run name
        run: String,
        /// Only the range instances that start in these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Show the N ranges with the longest projection
        #[arg(short = 'n', long)]
        limit: Option<usize>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// GPU kernel time per nn.Module path, forward, backward and recomputation apart (traces recorded with_stack=True)
    Modules {
        /// Run name
        run: String,
        /// Cut module paths to their first N modules (1: the model; 2: its children; ...)
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        depth: Option<u32>,
        /// Only the kernels launched in these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Show the N modules with the most GPU time
        #[arg(short = 'n', long)]
        limit: Option<usize>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// GPU time per numeric precision (fp8, bf16, fp16, tf32, fp32, ...) and the kernels still in fp32 or fp64
    Precision {
        /// Run name
        run: String,
        /// Only the kernels that start in these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        /// Show the N fp32/fp64 kernels with the most GPU time
        #[arg(short = 'n', long, default_value_t = 10)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// What the profiler itself cost: its recorded overhead (buffer flushes, ...) and the launch calls' durations
    Overhead {
        /// Run name
        run: String,
        /// Only the time within these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Allocator memory per device: the peak, the operator running at it, per step, and the allocation churn
    Memory {
        /// Run name
        run: String,
        /// Only the allocator events within these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Serving-engine steps (SGLang, vLLM markers) as prefill, decode or mixed: batch, tokens, latency, time per token, steady state
    Phases {
        /// Run name
        run: String,
        /// Only the markers within these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Collective calls per kind: bytes, bus bandwidth (NCCL's formulas), time waiting for the last rank, which rank came last
    Collectives {
        /// Run name
        run: String,
        /// Only the collectives launched in these profiler steps: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Macro stages (stage logs, profiler steps, forward/backward/optimizer/dataloader) and per-step statistics
    Stages {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// What to fix first: findings with severity, evidence and a recommended action
    Findings {
        /// Run name
        run: String,
        /// Only the profiler steps in this range: 3..5 (inclusive), 3.., ..5 or 4
        #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
        steps: Option<String>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// What got slower, faster, appeared or vanished between two runs (or run selectors)
    Diff {
        /// Baseline: a run name or a condition on the runs table (tags['branch'] = 'main')
        a: String,
        /// Candidate: a run name or a condition on the runs table
        b: String,
        /// Group by kernel, op, class or stage (the summary metrics always come first)
        #[arg(long, default_value = "kernel")]
        level: String,
        /// Changes under this are unchanged (e.g. 2%, 0.5)
        #[arg(long, value_name = "PCT", default_value = "2%", value_parser = parse_pct)]
        threshold: f64,
        /// Show the N largest changes [default for tables: 20]
        #[arg(short = 'n', long)]
        limit: Option<usize>,
        /// Also list unchanged keys
        #[arg(long)]
        all: bool,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// One metric across every run a selector matches, with change points
    Trend {
        /// Which runs: a condition on the runs table [default: every run]
        #[arg(long = "where", value_name = "SELECTOR", default_value = "true")]
        selector: String,
        /// step_time, gpu_busy, gpu_idle, idle_pct, kernel_time, compute, communication,
        /// memcpy, memset, kernel:NAME, op:NAME or class:NAME
        #[arg(long, default_value = "step_time")]
        metric: String,
        /// Order runs by this tag (numerically when every value is a number) instead of capture time
        #[arg(long = "by", value_name = "TAG")]
        order_tag: Option<String>,
        /// Shifts under this are not change points
        #[arg(long, value_name = "PCT", default_value = "5%", value_parser = parse_pct)]
        threshold: f64,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// How each kernel's (operator's, class's) time grows with a numeric run tag: the log-log exponent with a 95 % interval
    Scaling {
        /// The tag that holds the input size (e.g. seq_len, set by `gpuq ingest --tag seq_len=4096`)
        tag: String,
        /// Which runs: a condition on the runs table [default: every run]
        #[arg(long = "where", value_name = "SELECTOR", default_value = "true")]
        selector: String,
        /// kernel, op, class, stage or summary
        #[arg(long, default_value = "kernel")]
        level: String,
        /// Show the N keys that take the most time at the largest tag value
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// CI gate: exit 1 when the candidate regressed significantly beyond the threshold
    Check {
        /// A run name, or a condition on the runs table (its runs' median is the baseline)
        #[arg(long)]
        baseline: String,
        /// The run under test (a run name or a condition on the runs table)
        #[arg(long)]
        candidate: String,
        /// Largest accepted regression (e.g. 3%)
        #[arg(long, value_name = "PCT", default_value = "3%", value_parser = parse_pct)]
        max_regression: f64,
        /// Gated metrics (comma-separated summary metrics)
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "step_time,gpu_busy,kernel_time"
        )]
        metrics: Vec<String>,
        /// Also fail on a gated metric that moved past the threshold but could not be tested
        /// (e.g. a rate per second of window without steps)
        #[arg(long)]
        fail_untested: bool,
        /// table (for people) or json (for CI tooling)
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Is a profile trustworthy? Per-kernel variation over repeated runs and ranking stability
    Repeat {
        /// The repeated runs: a condition on the runs table
        #[arg(long = "where", value_name = "SELECTOR")]
        selector: String,
        /// Ranking stability over the top N kernels
        #[arg(long, default_value_t = 10)]
        top: usize,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Multi-rank runs: start/end skew of each collective across ranks and the straggler rank
    Skew {
        /// Run name
        run: String,
        #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
        format: OutputFormat,
    },
    /// Print the current version's data files (absolute paths), for reading the store with
    /// another engine; they stay readable 10 minutes after a later commit drops them
    Files {
        /// Runs [default: every run]
        runs: Vec<String>,
        /// Which table's files
        #[arg(long, value_enum, default_value_t = FilesTable::Events)]
        table: FilesTable,
        /// lines: one path a line; json: an array; duckdb: a read_parquet(...) call;
        /// polars: a pl.scan_parquet(...) call
        #[arg(long, value_enum, default_value_t = FilesFormat::Lines)]
        format: FilesFormat,
    },
    /// Merge the small Parquet parts of runs (many appends); query results do not change
    Compact {
        /// Runs to compact [default: every run]
        runs: Vec<String>,
    },
    /// Generate a multi-step training trace, ingest it, and show where the GPU time goes
    Demo {
        /// Profiler steps to generate
        #[arg(long, default_value_t = 20)]
        steps: u32,
    },
    /// Append each finished trace file a job writes into DIR to run NAME, as it is written
    /// (Kineto cycles, on-demand traces, Nsight Systems exports, rocprofv3 tables, stage logs)
    Watch(WatchArgs),
    /// Run a command with gpuq's CUPTI collector injected and record its GPU activity into
    /// a run while it runs; exits with the command's exit status
    Record(RecordArgs),
    /// Write a run (or a window of it) as a timeline for Perfetto or chrome://tracing
    Export(ExportArgs),
    /// Write one self-contained HTML page showing where a run's time went (and, with --vs,
    /// what changed against a baseline)
    Report(ReportArgs),
    /// Write a synthetic Kineto trace or Nsight Systems export (for tests and benchmarks)
    Generate {
        /// Output file ('.gz' / '.zst' suffix compresses Kineto JSON)
        output: PathBuf,
        /// What to write
        #[arg(long, value_enum, default_value_t = GenerateFormat::Kineto)]
        format: GenerateFormat,
        /// Nsight Systems: number of kernels [default: a small 2-process capture]
        #[arg(long)]
        kernels: Option<usize>,
        /// Approximate size of the JSON in bytes (e.g. 1000000000)
        #[arg(long)]
        bytes: Option<u64>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Distributed rank to record in the trace
        #[arg(long)]
        rank: Option<i32>,
        /// Kineto: profiler steps [default: 20, or as many as --bytes needs]
        #[arg(long)]
        steps: Option<u32>,
        /// Kineto: the number of the first ProfilerStep#N (a later profiling cycle of a job
        /// goes on numbering its steps) [default: 5]
        #[arg(long, value_name = "N")]
        first_step: Option<u32>,
        /// Kineto: every kernel of a shape takes the same time (before --jitter), as real
        /// kernels nearly do; without it durations spread over a wide range
        #[arg(long)]
        steady: bool,
        /// Kineto: kernel durations vary by up to ±PCT % (see --repeat)
        #[arg(long, value_name = "PCT", default_value_t = 0)]
        jitter: u32,
        /// Kineto: which repeat this is: the same events as every other repeat of the seed,
        /// with other --jitter draws
        #[arg(long, default_value_t = 0)]
        repeat: u64,
        /// Kineto: kernels whose name contains TEXT take PCT % of their duration (an injected
        /// regression, e.g. gemm_relu=120)
        #[arg(long, value_name = "TEXT=PCT")]
        scale_kernel: Option<String>,
    },
}

/// What SQL statements may do with files (off by default; never inside the store).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct FileAccessArgs {
    /// Allow statements that write files: COPY ... TO, INSERT INTO an external table
    #[arg(long)]
    pub allow_write: bool,
    /// Allow statements that read files: CREATE EXTERNAL TABLE ... LOCATION
    #[arg(long)]
    pub allow_files: bool,
}

impl FileAccessArgs {
    pub fn access(self) -> gpuq_query::policy::FileAccess {
        gpuq_query::policy::FileAccess {
            write: self.allow_write,
            read: self.allow_files,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// Remove a run and its files, or every run a selector matches (tags['branch'] = 'old')
    Rm {
        run: String,
        /// Needed when the selector matches more than one run
        #[arg(long)]
        yes: bool,
    },
    /// Set tags on a run: KEY=VALUE ... (an empty VALUE removes the tag)
    Tag {
        run: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        tags: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenerateFormat {
    /// PyTorch-profiler JSON
    Kineto,
    /// Nsight Systems SQLite export (schema 3.25)
    Nsys,
}

/// Where `gpuq watch` takes a file's rank from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RankFromArg {
    Trace,
    Path,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    Auto,
    /// PyTorch profiler / Kineto / Chrome-trace JSON (.json, .json.gz, .json.zst)
    Kineto,
    /// Nsight Systems SQLite export (nsys export --type sqlite)
    Nsys,
    /// rocprofv3 CSV output (a directory, or its CSV files)
    Rocprof,
    /// Timestamped stage log (JSON lines, key=value, Python logging)
    Stagelog,
}

impl InputFormat {
    pub fn format(self) -> Option<gpuq_ingest::Format> {
        use gpuq_ingest::Format;
        match self {
            InputFormat::Auto => None,
            InputFormat::Kineto => Some(Format::Kineto),
            InputFormat::Nsys => Some(Format::Nsys),
            InputFormat::Rocprof => Some(Format::Rocprof),
            InputFormat::Stagelog => Some(Format::StageLog),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Csv,
    Json,
    Ndjson,
    Markdown,
}

impl OutputFormat {
    pub fn parse(s: &str) -> Option<OutputFormat> {
        <OutputFormat as ValueEnum>::from_str(s, true).ok()
    }
}

/// How many rows a table shows: `None` is all of them. Tables are for reading; a result of
/// thousands of rows is cut to its first rows (as datafusion-cli and DuckDB do), with a line
/// saying how many there were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxRows(pub Option<usize>);

/// `N` or `inf` (also `0`: no limit).
pub fn parse_max_rows(s: &str) -> Result<MaxRows, String> {
    match s.trim() {
        "inf" | "0" => Ok(MaxRows(None)),
        n => n
            .parse::<usize>()
            .map(|n| MaxRows(Some(n)))
            .map_err(|_| format!("{s:?} is not a row count (a number, or 'inf' for all rows)")),
    }
}

/// `KEY=VALUE` arguments -> (KEY, VALUE) pairs.
pub fn parse_tags(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    args.iter()
        .map(|t| parse_tag(t).map_err(anyhow::Error::msg))
        .collect()
}

/// `KEY=VALUE` -> (KEY, VALUE); keys are `[A-Za-z0-9._-]+`.
fn parse_tag(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("tag {s:?} is not KEY=VALUE"))?;
    if k.is_empty()
        || !k
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "tag key {k:?} must be letters, digits, '.', '_' or '-'"
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Where the store lives: `--store`, `$GPUQ_STORE`, else `$XDG_DATA_HOME/gpuq` or
/// `~/.local/share/gpuq`.
pub fn store_dir(flag: Option<PathBuf>) -> PathBuf {
    if let Some(p) = flag {
        return p;
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("gpuq");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/gpuq")
}

/// A percentage argument (`3%`, `3`, `0.5%`) -> percent.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    s.trim()
        .trim_end_matches('%')
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| p.is_finite() && *p >= 0.0)
        .ok_or_else(|| format!("{s:?} is not a percentage (e.g. 3%, 0.5)"))
}

/// A duration argument (`500us`, `1.5ms`, `0`) -> ns.
/// A `--steps` range, checked here so that a typo fails before anything runs.
fn parse_steps(s: &str) -> Result<String, String> {
    gpuq_query::analyses::StepRange::parse(s).map(|_| s.to_string())
}

fn parse_duration(s: &str) -> Result<i64, String> {
    if s == "0" {
        return Ok(0);
    }
    gpuq_query::functions::durations::parse_dur(s)
        .filter(|n| *n >= 0)
        .ok_or_else(|| format!("{s:?} is not a duration (e.g. 250ns, 100us, 1.5ms, 2s)"))
}

fn parse_zone(s: &str) -> Result<gpuq_ingest::LogZone, String> {
    s.parse()
}

/// How long a writer waits for the store lock; `None`: for ever.
#[derive(Debug, Clone, Copy)]
pub struct LockTimeout(pub Option<std::time::Duration>);

fn parse_lock_timeout(s: &str) -> Result<LockTimeout, String> {
    if matches!(s.trim(), "inf" | "infinity" | "none") {
        return Ok(LockTimeout(None));
    }
    let ns = parse_duration(s.trim())
        .map_err(|_| format!("{s:?} is not a lock timeout (e.g. 30s, 10min, 0, inf)"))?;
    Ok(LockTimeout(Some(std::time::Duration::from_nanos(
        ns as u64,
    ))))
}

/// The stored tables `gpuq files` lists.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FilesTable {
    Events,
    Counters,
}

/// How `gpuq files` prints the paths.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FilesFormat {
    Lines,
    Json,
    Duckdb,
    Polars,
}

// `gpuq watch`'s arguments (a plain comment: a doc comment would replace the subcommand's help).
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Directory the job writes trace files into
    pub dir: PathBuf,
    /// Run to append to (the first file creates it)
    #[arg(long)]
    pub run: String,
    /// Tag the run: KEY=VALUE (repeatable)
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Where a file's rank comes from: the trace (Kineto distributedInfo) or the file
    /// name (worker3.*, rank-3.*, rank_3.*, rank3.*)
    #[arg(long, value_enum, default_value_t = RankFromArg::Trace)]
    pub rank_from: RankFromArg,
    /// Read the files there are (waiting for those still written to), report those still
    /// incomplete, and exit (0 when no file failed)
    #[arg(long)]
    pub once: bool,
    /// Exit after this long without a new or growing file (e.g. 30s, 10min)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_exit: Option<i64>,
    /// Find changes by rescanning the directory, not by inotify (network file systems,
    /// where inotify does not see other machines' writes)
    #[arg(long)]
    pub poll: bool,
    /// How long a file's size and modification time must stay unchanged before it is read
    /// (without it when inotify says its writer renamed it into place or closed it)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s")]
    pub settle: i64,
    /// How long a truncated file may stay unchanged before it is reported as incomplete
    /// and left alone
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5min")]
    pub incomplete_after: i64,
}

// `gpuq record`'s arguments.
#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Run to record into (a new run) [default: record-<date>-<time>]
    #[arg(long)]
    pub run: Option<String>,
    /// Tag the run: KEY=VALUE (repeatable)
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// How often the collector hands over what CUPTI holds and the run is committed: a
    /// record is queryable at most this long (plus a commit) after the GPU finished it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub flush_interval: i64,
    /// Activity to record, comma-separated: kernel, memcpy, memset, sync, runtime, driver,
    /// overhead, marker (NVTX ranges: steps, operators, scopes), external (external
    /// correlation ids)
    #[arg(long, default_value = gpuq_collector::collector::DEFAULT_KINDS, value_parser = parse_kinds)]
    pub kinds: String,
    /// Regex for NVTX ranges that are steps, with one capture group, the step number
    /// [default: ProfilerStep#N, step N, iteration_N, train_step[N], ...]
    #[arg(long, value_name = "REGEX")]
    pub step_pattern: Option<String>,
    /// The collector library [default: libgpuq_collector.so beside the gpuq executable]
    #[arg(long, value_name = "PATH", env = "GPUQ_COLLECTOR")]
    pub collector: Option<PathBuf>,
    /// Directory for the collector's segment files (local disk) [default: a new directory
    /// under the system's temporary one, removed at the end]
    #[arg(long, value_name = "DIR")]
    pub spool: Option<PathBuf>,
    /// The command and its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<std::ffi::OsString>,
}

fn parse_kinds(s: &str) -> Result<String, String> {
    gpuq_collector::collector::parse_kinds(s).map(|_| s.to_string())
}

/// `gpuq export`'s timeline formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Perfetto's protobuf trace (ui.perfetto.dev): exact nanoseconds, compact
    Perfetto,
    /// Chrome's JSON trace (chrome://tracing, TensorBoard)
    Chrome,
}

// `gpuq export`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// The run
    pub run: String,
    /// Output file ('-' for standard output)
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    #[arg(long, value_enum, default_value_t = ExportFormat::Perfetto)]
    pub format: ExportFormat,
    /// Only these steps (3..5, 3.., ..5, 4): from the first one's start to the last one's end
    #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
    pub steps: Option<String>,
    /// Start of the window, after the run's first event (e.g. 2s, 150ms)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub from: Option<i64>,
    /// End of the window, after the run's first event
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub to: Option<i64>,
    /// Only these ranks (comma-separated)
    #[arg(long, value_name = "RANKS", value_delimiter = ',')]
    pub ranks: Vec<i32>,
    /// Leave out slices shorter than this (e.g. 1us)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0")]
    pub min_dur: i64,
    /// Leave out the findings track (the findings analyse the whole run at once: on a very
    /// large run, this keeps the export's memory flat)
    #[arg(long)]
    pub no_findings: bool,
}

// `gpuq report`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The run
    pub run: String,
    /// Output file ('-' for standard output)
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// A baseline run to compare against
    #[arg(long, value_name = "RUN")]
    pub vs: Option<String>,
    /// Only these steps (3..5, 3.., ..5, 4)
    #[arg(long, value_name = "RANGE", value_parser = parse_steps)]
    pub steps: Option<String>,
    /// Kernels listed
    #[arg(short = 'n', long, default_value_t = gpuq_export::report::DEFAULT_TOP)]
    pub top: usize,
}
