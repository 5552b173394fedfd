//! The shell and what it prints: closed pipes, readable tables, CSV of nested columns,
//! FROM-first SQL, dot-commands and `\x`, cancellation with Ctrl-C. The real `gpuq` binary,
//! run in temporary directories.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{ok, shell_output, stderr, stdout};

fn gpuq_cmd(store: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuq"));
    c.arg("--store").arg(store).args(args);
    c
}

/// A generated Kineto trace of `bytes` (demo kernels, long C++ names) at `path`.
fn generate(path: &Path, bytes: u64, seed: u64) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            path.to_str().unwrap(),
            "--bytes",
            &bytes.to_string(),
        ])
        .args(["--seed", &seed.to_string(), "--steps", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A store under `dir` with runs `a` and `b` (tagged `model=llama`).
fn store_with_two_runs(dir: &Path) -> PathBuf {
    let store = dir.join("store");
    for (run, seed) in [("a", 1), ("b", 2)] {
        let t = dir.join(format!("{run}.json"));
        generate(&t, 400_000, seed);
        ok(
            &store,
            &[
                "ingest",
                "-q",
                t.to_str().unwrap(),
                "--run",
                run,
                "--tag",
                "model=llama",
            ],
        );
    }
    store
}

/// Runs `gpuq` with its standard output a pipe whose reading end is already closed.
fn into_closed_pipe(mut cmd: Command, stdin: Option<&str>) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(text.as_bytes());
    }
    child.wait_with_output().unwrap()
}

/// Every command ends at its first write to a closed pipe, killed by SIGPIPE as `cat` is,
/// with nothing on stderr: no panic, no "Broken pipe".
#[test]
fn every_command_ends_quietly_on_a_closed_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let s = store.to_str().unwrap();
    let trace = dir.path().join("c.json");
    generate(&trace, 200_000, 3);
    let generated = dir.path().join("g.json");
    let nsys = dir.path().join("g.sqlite");
    let demo = dir.path().join("demo-store");
    let commands: Vec<(Vec<&str>, Option<&str>)> = vec![
        (vec!["ingest", trace.to_str().unwrap(), "--run", "c"], None),
        (vec!["query", "SELECT * FROM kernels"], None),
        (
            vec!["query", "--format", "csv", "SELECT * FROM events"],
            None,
        ),
        (vec!["runs"], None),
        (vec!["runs", "tag", "c", "k=v"], None),
        (vec!["top", "a"], None),
        (vec!["gaps", "a"], None),
        (vec!["util", "a"], None),
        (vec!["breakdown", "a"], None),
        (vec!["roofline", "a"], None),
        (vec!["stages", "a"], None),
        (vec!["findings", "a"], None),
        (vec!["findings", "a", "--format", "json"], None),
        (vec!["diff", "a", "b"], None),
        (vec!["trend", "--where", "run <> 'none'"], None),
        (vec!["check", "--baseline", "a", "--candidate", "b"], None),
        (vec!["repeat", "--where", "run <> 'none'"], None),
        (vec!["skew", "a"], None),
        (vec!["compact"], None),
        (
            vec!["generate", generated.to_str().unwrap(), "--bytes", "100000"],
            None,
        ),
        (
            vec!["generate", "--format", "nsys", nsys.to_str().unwrap()],
            None,
        ),
        (vec!["sql"], Some("SELECT * FROM kernels;\nSELECT 1;\n")),
        (vec!["runs", "rm", "c"], None),
    ];
    for (args, stdin) in &commands {
        let o = into_closed_pipe(gpuq_cmd(&store, args), *stdin);
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "gpuq --store {s} {args:?}: {:?}, stderr: {}",
            o.status,
            stderr(&o)
        );
        assert_eq!(stderr(&o), "", "gpuq {args:?}");
    }
    let o = into_closed_pipe(gpuq_cmd(&demo, &["demo", "--steps", "2"]), None);
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "demo: {}",
        stderr(&o)
    );
    assert_eq!(stderr(&o), "", "demo");
    // Cut short after their commits: the ingest stored run c (tagged k=v), `runs rm` removed it.
    let n = ok(
        &store,
        &["query", "--format", "csv", "SELECT count(*) AS n FROM runs"],
    );
    assert_eq!(n, "n\n2\n");
}

/// `SELECT * FROM runs` as CSV: the `tags` map is one cell of JSON text.
#[test]
fn csv_prints_nested_columns_as_json_and_from_first_selects_every_column() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let csv = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT * FROM runs ORDER BY run",
        ],
    );
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("run,format,") && header.contains("tags"),
        "{csv}"
    );
    assert!(csv.contains(r#""{""model"":""llama""}""#), "{csv}");
    assert_eq!(csv.lines().count(), 3, "{csv}");
    // DuckDB's FROM-first form: every column, in the query command and in the shell.
    let from_first = ok(
        &store,
        &["query", "--format", "csv", "FROM runs ORDER BY run"],
    );
    assert_eq!(from_first, csv);
    let shell = run_shell(&store, &["--format", "csv"], "FROM runs WHERE run = 'b';\n");
    assert!(shell.starts_with(header), "{shell}");
    assert!(shell.lines().nth(1).unwrap().starts_with("b,"), "{shell}");
}

/// Runs the shell over `input` from a pipe; returns standard output, asserting success.
fn run_shell(store: &Path, args: &[&str], input: &str) -> String {
    let out = shell_output(store, args, input);
    assert!(out.status.success(), "{input}: {}", stderr(&out));
    stdout(&out)
}

/// `cmd` started with its standard streams piped, and its standard input.
fn spawn_piped(mut cmd: Command) -> (std::process::Child, std::process::ChildStdin) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    (child, stdin)
}

/// The real traces under ../shared: a Kineto trace with long kernel names and an Nsight
/// Systems export; empty (that part is skipped) without ../shared.
fn real_traces() -> Vec<PathBuf> {
    [
        (
            "kineto/tracelens",
            "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        ),
        ("nsys", "fuser_8fa9ec2_h100x2_report1.sqlite"),
    ]
    .iter()
    .filter_map(|(kind, file)| gpuq_testkit::shared_traces(kind).map(|dir| dir.join(file)))
    .filter(|p| p.is_file())
    .collect()
}

/// Every analysis command's table output fits the terminal at 80, 120 and 160 columns, on
/// generated and real traces: names shortened first, then (when even that is too wide) one
/// `column | value` line per column.
#[test]
fn every_analysis_table_fits_the_terminal_width() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let mut runs = vec!["a".to_string()];
    for (i, trace) in real_traces().iter().enumerate() {
        let run = format!("real{i}");
        ok(
            &store,
            &["ingest", "-q", trace.to_str().unwrap(), "--run", &run],
        );
        runs.push(run);
    }
    for width in [80, 120, 160] {
        let mut commands: Vec<Vec<String>> = vec![vec![
            "repeat".into(),
            "--where".into(),
            "run IN ('a', 'b')".into(),
        ]];
        for run in &runs {
            for command in [
                "top",
                "gaps",
                "util",
                "breakdown",
                "stages",
                "roofline",
                "skew",
            ] {
                commands.push(vec![command.into(), run.clone()]);
            }
            commands.push(vec!["gaps".into(), run.clone(), "--per-stream".into()]);
        }
        for args in &commands {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = gpuq_cmd(&store, &args)
                .env("COLUMNS", width.to_string())
                .output()
                .unwrap();
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            let out = stdout(&o);
            let widest = out.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            assert!(
                widest <= width,
                "{args:?} at {width}: {widest} columns\n{out}"
            );
        }
    }
    // `top` at the default width of 160 is a table, names cut to what fits.
    let top = stdout(
        &gpuq_cmd(&store, &["top", "a"])
            .env_remove("COLUMNS")
            .output()
            .unwrap(),
    );
    assert!(top.starts_with("+-"), "{top}");
    assert!(top.lines().all(|l| l.chars().count() <= 160), "{top}");
}

/// Analysis tables: durations through fmt_dur, kernel names shortened to the width
/// (COLUMNS), distinct names distinct, offsets from the run start beside timestamps; CSV keeps
/// integers and full names.
#[test]
fn analysis_tables_are_readable_and_csv_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let table = |args: &[&str], width: &str| {
        let o = gpuq_cmd(&store, args)
            .env("COLUMNS", width)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let csv = ok(&store, &["top", "a", "--format", "csv"]);
    let longest = csv.lines().skip(1).map(|l| l.len()).max().unwrap();
    assert!(longest > 200, "the demo kernels have long names: {csv}");
    assert!(csv.contains(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>"
    ));
    let totals: Vec<i64> = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT total FROM top_kernels('a')",
        ],
    )
    .lines()
    .skip(1)
    .map(|l| l.parse().unwrap())
    .collect();
    assert!(!totals.is_empty());

    let top = table(&["top", "a"], "200");
    let rows: Vec<&str> = top
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .collect();
    assert_eq!(rows.len(), csv.lines().count() - 1, "{top}");
    assert!(top.lines().all(|l| l.chars().count() <= 200), "{top}");
    // Durations in units, not raw nanoseconds.
    assert!(!top.contains(&format!(" {} ", totals[0])), "{top}");
    assert!(top.contains(" ms ") || top.contains(" us "), "{top}");
    // Every kernel keeps a name of its own.
    let mut names: Vec<&str> = rows
        .iter()
        .map(|r| r.split('|').nth(1).unwrap().trim())
        .collect();
    assert!(names.iter().any(|n| n.contains('…')), "{top}");
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "shortened names collide: {top}");

    // Wider terminal, longer names; a huge one shows them whole.
    let wide = table(&["top", "a"], "100000");
    assert!(wide.contains(
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>"
    ));

    // gaps, util and steps: the offset from the run's start beside the absolute time.
    let run_start: i64 = ok(
        &store,
        &[
            "query",
            "--format",
            "csv",
            "SELECT first_ts FROM runs WHERE run = 'a'",
        ],
    )
    .lines()
    .nth(1)
    .unwrap()
    .parse()
    .unwrap();
    for (args, header) in [
        (&["gaps", "a"][..], "since_start"),
        (&["util", "a"], "since_start"),
        (&["stages", "a"], "since_start"),
    ] {
        let out = table(args, "200");
        assert!(out.contains(header), "{args:?}: {out}");
        // Every offset agrees with its absolute timestamp.
        let lines: Vec<&str> = out.lines().collect();
        let head = lines
            .iter()
            .position(|l| l.contains("since_start"))
            .unwrap();
        let cols: Vec<&str> = lines[head].split('|').map(str::trim).collect();
        let (ts_at, off_at) = (
            cols.iter().position(|c| *c == "ts").unwrap(),
            cols.iter().position(|c| *c == "since_start").unwrap(),
        );
        let mut checked = 0;
        for line in lines[head + 2..].iter().take_while(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let ts: i64 = cells[ts_at].parse().unwrap();
            let offset = cells[off_at];
            let d = ts - run_start;
            assert_eq!(
                offset,
                format!("+{}.{:06} s", d / 1_000_000_000, d % 1_000_000_000 / 1000),
                "{args:?}: {line}"
            );
            checked += 1;
        }
        assert!(checked > 0, "{args:?}: {out}");
    }
    // CSV keeps the absolute integers only.
    let gaps = ok(&store, &["gaps", "a", "--format", "csv"]);
    assert!(
        !gaps.contains("since_start") && !gaps.contains(" s"),
        "{gaps}"
    );
}

/// Dot-commands, `\pset`, `\x` and table functions in `\d` and `\help`, from a pipe.
#[test]
fn the_shell_knows_dot_commands_pset_expanded_display_and_table_functions() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let out = run_shell(
        &store,
        &[],
        "\\x on\nSELECT 1 AS one, 'two' AS two;\n\\x off\n\
         .mode csv\nSELECT 3 AS three;\n\\pset format json\nSELECT 4 AS four;\n\
         \\pset expanded\nSELECT 5 AS five;\n.mode table\n\\x\n\\x\n.tables\n\\help\n",
    );
    assert!(out.contains("-[ RECORD 1 ]"), "{out}");
    assert!(out.contains("one | 1\ntwo | two\n"), "{out}");
    assert!(out.contains("three\n3\n"), "{out}");
    assert!(out.contains("[{\"four\":4}]"), "{out}");
    // `\pset expanded` toggles, and JSON output is not a table: no records.
    assert!(out.contains("[{\"five\":5}]"), "{out}");
    // `.tables` lists tables, views and the table functions with their arguments.
    assert!(
        out.contains("kernels") && out.contains("top_kernels(run [, n] [, 'steps'])"),
        "{out}"
    );
    assert!(out.contains("TABLE FUNCTION"), "{out}");
    assert!(
        out.contains("compare(a, b [, level [, threshold_pct]])"),
        "{out}"
    );
    // `\help` lists them too.
    let help = &out[out.find("Meta-commands:").expect("help")..];
    assert!(
        help.contains("Table functions")
            && help.contains("gpu_gaps(run [, min_gap_ns] [, 'steps'])"),
        "{help}"
    );

    // Unknown dot-commands and \pset options: a clear error, the session goes on, and the
    // next statement is not glued to them as a continuation line.
    let o = shell_output(
        &store,
        &["--format", "csv"],
        ".dump\n\\pset null x\nSELECT 6 AS six;\n",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("unknown dot-command \".dump\""),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("\\pset null is not supported"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "six\n6\n");
}

/// Total CPU time (user + system) of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// The `gpuq` process whose command line contains `needle`. The executable is checked, not
/// only the command line: `script` runs its command through `sh -c`, and where `sh` is dash
/// that shell stays as an idle parent whose command line holds the same words.
fn find_process(needle: &str) -> Option<u32> {
    let gpuq = std::fs::canonicalize(env!("CARGO_BIN_EXE_gpuq")).ok()?;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/exe")).ok().as_ref() != Some(&gpuq) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            return Some(pid);
        }
    }
    None
}

/// Ctrl-C in the terminal shell stops the statement's work, not only its wait: the process
/// is idle within a second.
#[test]
fn ctrl_c_stops_the_work_of_the_running_statement() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED: util-linux `script` is not installed; the Ctrl-C test did not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_two_runs(dir.path());
    let cmd = format!(
        "{} --store {} sql",
        env!("CARGO_BIN_EXE_gpuq"),
        store.display()
    );
    let mut script = Command::new("script");
    script
        .args(["-qfec", &cmd, "/dev/null"])
        .env("TERM", "xterm");
    let (mut child, mut stdin) = spawn_piped(script);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(k) = out.read(&mut buf) {
                if k == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..k]));
            }
        })
    };
    let wait_for = |what: &str, count: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.lock().unwrap().matches(what).count() < count {
            assert!(
                Instant::now() < deadline,
                "no {what:?}: {}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut send = |keys: &[u8]| {
        use std::io::Write;
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
    };
    wait_for("gpuq>", 1);
    let pid =
        find_process(&format!("--store {} sql", store.display())).expect("the shell's process");
    let statements: [&[u8]; 2] = [
        // Cross joins that would run for hours: an aggregate over a join's output, which
        // before kept a core busy after Ctrl-C until the plan ended.
        b"SELECT count(*) FROM events a, events b, events c WHERE a.dur > 0;\r",
        b"SELECT a.value % 1000 AS k, count(*) FROM generate_series(1, 1000000) a, \
          generate_series(1, 1000000) b GROUP BY k;\r",
    ];
    for (i, statement) in statements.iter().enumerate() {
        send(statement);
        std::thread::sleep(Duration::from_millis(1500));
        let busy = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(500));
        assert!(cpu_ticks(pid) > busy, "statement {i} is not running");
        send(b"\x03");
        wait_for("cancelled", i + 1);
        // Give the cancelled work a second to end, then measure a second of idleness.
        std::thread::sleep(Duration::from_millis(1000));
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(1000));
        let used = cpu_ticks(pid) - before;
        // Ticks are 1/100 s: a busy core would use 100.
        assert!(
            used <= 5,
            "statement {i}: {used} ticks of CPU in the second after Ctrl-C"
        );
    }
    send(b"SELECT 7 AS after;\r");
    wait_for("| 7 ", 1);
    send(b"\\q\r");
    drop(send);
    drop(stdin);
    child.wait().unwrap();
    reader.join().unwrap();
}

/// With stdin a pipe, each statement runs as soon as its `;` arrives: a program can write a
/// statement, read its result, then write the next, before it closes the pipe.
#[test]
fn a_pipe_drives_the_shell_one_statement_at_a_time() {
    use std::io::{BufRead, BufReader, Write};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (mut child, mut stdin) = spawn_piped(gpuq_cmd(&store, &["sql", "--format", "csv"]));
    let (lines, received) = std::sync::mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let reader = std::thread::spawn(move || {
        for line in stdout.lines() {
            if lines.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let next_line = || {
        received
            .recv_timeout(Duration::from_secs(60))
            .expect("a result before the input ends")
    };
    // A `;` in quotes or a comment ends nothing; the statement's own `;` ends it, mid-line.
    stdin
        .write_all(b"SELECT 'a;b' AS \"x;y\" -- not yet;\n, 40 + 2 AS answer; SELECT")
        .unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_line(), "x;y,answer");
    assert_eq!(next_line(), "a;b,42");
    stdin.write_all(b" 'second' AS s;\n").unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_line(), "s");
    assert_eq!(next_line(), "second");
    // A meta-command runs at the end of its line; the end of the input ends a last statement.
    stdin.write_all(b"\\format json\nSELECT 3 AS last").unwrap();
    drop(stdin);
    assert_eq!(next_line(), "[{\"last\":3}]");
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success());
}
