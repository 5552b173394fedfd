//! `gpuq query` and the `gpuq sql` shell through the real binary: errors on one readable line,
//! the shell on a terminal and from a pipe.

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{generate, gpuq, stderr, stdout};

/// Removes terminal escape sequences.
fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn bad_sql_fails_with_one_readable_line() {
    let dir = tempfile::tempdir().unwrap();
    for sql in [
        "SELEC 1",
        "SELECT * FROM no_such_table",
        "SELECT no_col FROM kernels",
    ] {
        let o = gpuq(dir.path(), &["query", sql]);
        assert_eq!(o.status.code(), Some(1), "{sql}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("gpuq: error: "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Drives `gpuq sql` through a pseudo-terminal (util-linux `script`) as a user would.
#[test]
fn the_repl_works_on_a_terminal() {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!(
            "SKIPPED: util-linux `script` is not installed; the terminal REPL test did not run"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let t = generate(dir.path(), "t.json", 300_000, 6);
    assert!(
        gpuq(&store, &["ingest", "-q", t.to_str().unwrap(), "--run", "r"])
            .status
            .success()
    );
    let cmd = format!(
        "{} --store {} sql",
        env!("CARGO_BIN_EXE_gpuq"),
        store.display()
    );
    // The expected counts, known before the session starts.
    let count = |sql: &str| {
        let out = stdout(&gpuq(&store, &["query", "--format", "csv", sql]));
        out.lines().nth(1).unwrap().to_string()
    };
    let n = count("SELECT count(*) AS n FROM kernels");
    let m = count("SELECT count(*) AS n FROM memcpy");
    let mut child = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The terminal's output as it comes, so that keys can wait for what they answer: a Ctrl-C
    // typed while the shell is still busy with earlier lines would reach it as input, not as a
    // signal to the statement it is meant to cancel.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
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
                seen.lock().unwrap().extend_from_slice(&buf[..k]);
            }
        })
    };
    let text_now = || strip_ansi(&String::from_utf8_lossy(&seen.lock().unwrap())).replace('\r', "");
    let mut send = |keys: &[u8], answer: Option<&str>| {
        use std::io::Write;
        let before = answer.map_or(0, |a| text_now().matches(a).count());
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
        let Some(answer) = answer else {
            std::thread::sleep(Duration::from_millis(400));
            return;
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while text_now().matches(answer).count() <= before {
            if std::time::Instant::now() > deadline {
                let _ = Command::new("pkill").args(["-f", &cmd]).status();
                panic!(
                    "no {answer:?} after {:?}: {}",
                    String::from_utf8_lossy(keys),
                    text_now()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    send(b"SELECT count(*)\r", None); // multi-line: not complete yet
    send(b"  AS n FROM kernels;\r", Some(&format!("| {n} ")));
    send(b"\\timing on\r", None);
    send(b"\\format csv\r", None);
    send(b"SELECT 40 + 2 AS answer;\r", Some("answer\n42"));
    send(b"SELEC broken;\r", Some("gpuq: error: ")); // an error keeps the session
    send(b"\\d kernels\r", Some("column_name"));
    // Completion of a table name (`ker` is ambiguous: kernel_class).
    send(
        b"SELECT count(*) AS c FROM memc\t;\r",
        Some(&format!("c\n{m}")),
    );
    send(b"SELECT 'still here' AS s;\r", Some("s\nstill here"));
    send(b"\x03", None); // Ctrl-C at the prompt keeps the session
    send(
        b"SELECT count(*) FROM generate_series(1, 100000000000);\r",
        None,
    );
    std::thread::sleep(Duration::from_secs(1));
    send(b"\x03", Some("cancelled")); // Ctrl-C cancels the running statement
    send(b"SELECT 7 AS after_ctrl_c;\r", Some("after_ctrl_c\n7"));
    send(b"\\q\r", None);
    drop(send);
    drop(stdin);
    child.wait().unwrap();
    reader.join().unwrap();
    let text = text_now();
    assert!(
        text.contains(&format!("| {n} ")),
        "multi-line statement result missing: {text}"
    );
    assert!(text.contains("answer\n42"), "{text}");
    assert!(text.contains("gpuq: error: "), "{text}");
    assert!(text.contains("column_name"), "{text}");
    assert!(
        text.contains(&format!("c\n{m}")),
        "completion did not produce a runnable query: {text}"
    );
    assert!(text.contains("still here"), "{text}");
    assert!(text.contains("after_ctrl_c\n7"), "{text}");
    assert!(text.contains("cancelled"), "{text}");
    assert!(text.contains("row(s) in"), "timing missing: {text}");
    // History persists across sessions.
    let history = std::fs::read_to_string(store.join("_history")).unwrap();
    assert!(history.contains("SELECT 40 + 2 AS answer;"), "{history}");
}

#[test]
fn the_repl_runs_statements_from_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .arg("--store")
        .arg(dir.path())
        .args(["sql", "--format", "csv"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(
                b"SELECT 1 AS a;\n\\format json\nSELECT 2\n  AS b;\n\\format table\n\\maxrows 2\n\
                  SELECT column1 AS v FROM (VALUES (11), (12), (13));\n",
            )
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("a\n1\n[{\"b\":2}]\n"), "{text}");
    assert!(
        text.contains("| 11 ") && text.contains("| 12 ") && !text.contains("| 13 "),
        "{text}"
    );
    assert!(text.contains("3 rows, the first 2 shown"), "{text}");
}
