//! REPL meta-commands (`\d kernels`, `\format csv`, `\x`, ...), parsed with nom, and the
//! DuckDB dot-commands and psql `\pset` settings they stand for.

use nom::branch::alt;
use nom::bytes::complete::{tag, take_while1};
use nom::character::complete::{space0, space1};
use nom::combinator::{all_consuming, map, opt, rest};
use nom::sequence::preceded;
use nom::{IResult, Parser};

use crate::output::Expanded;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meta {
    Quit,
    Help,
    Runs,
    Tables,
    Describe(String),
    /// `None` toggles.
    Timing(Option<bool>),
    Format(String),
    /// `\maxrows N|inf`: the argument as typed.
    MaxRows(String),
    /// `None` goes back to standard output.
    Output(Option<String>),
    Include(String),
    /// `\x [on|off|auto]`; `None` toggles.
    Expanded(Option<Expanded>),
    /// `\set allow_write|allow_files on|off`: what statements may do with files.
    Set(FileSetting, bool),
}

/// A file access setting of `\set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSetting {
    AllowWrite,
    AllowFiles,
}

fn set(i: &str) -> IResult<&str, Meta> {
    let setting = alt((
        map(tag("allow_write"), |_| FileSetting::AllowWrite),
        map(tag("allow_files"), |_| FileSetting::AllowFiles),
    ));
    let on_off = alt((map(tag("on"), |_| true), map(tag("off"), |_| false)));
    map(
        (tag("\\set"), space1, setting, space1, on_off),
        |(_, _, s, _, v)| Meta::Set(s, v),
    )
    .parse(i)
}

fn word(i: &str) -> IResult<&str, &str> {
    take_while1(|c: char| !c.is_whitespace())(i)
}

fn arg(i: &str) -> IResult<&str, &str> {
    preceded(space1, map(rest, str::trim)).parse(i)
}

fn command(i: &str) -> IResult<&str, Meta> {
    alt((
        map(alt((tag("\\quit"), tag("\\q"))), |_| Meta::Quit),
        map(alt((tag("\\help"), tag("\\?"), tag("\\h"))), |_| Meta::Help),
        map(tag("\\runs"), |_| Meta::Runs),
        map(alt((tag("\\tables"), tag("\\dt"))), |_| Meta::Tables),
        map(preceded(tag("\\d"), preceded(space1, word)), |t: &str| {
            Meta::Describe(t.to_string())
        }),
        map(tag("\\d"), |_| Meta::Tables),
        map(
            preceded(
                tag("\\timing"),
                opt(preceded(
                    space1,
                    alt((map(tag("on"), |_| true), map(tag("off"), |_| false))),
                )),
            ),
            Meta::Timing,
        ),
        map(preceded(tag("\\format"), arg), |f: &str| {
            Meta::Format(f.to_string())
        }),
        map(preceded(tag("\\maxrows"), arg), |n: &str| {
            Meta::MaxRows(n.to_string())
        }),
        map(preceded(tag("\\o"), opt(arg)), |f: Option<&str>| {
            Meta::Output(f.filter(|f| !f.is_empty()).map(String::from))
        }),
        map(preceded(tag("\\i"), arg), |f: &str| {
            Meta::Include(f.to_string())
        }),
        map(
            preceded(tag("\\x"), opt(preceded(space1, expanded))),
            Meta::Expanded,
        ),
        set,
    ))
    .parse(i)
}

fn expanded(i: &str) -> IResult<&str, Expanded> {
    alt((
        map(tag("on"), |_| Expanded::On),
        map(tag("off"), |_| Expanded::Off),
        map(tag("auto"), |_| Expanded::Auto),
    ))
    .parse(i)
}

/// psql's `\pset OPTION [VALUE]`, for the options gpuq has: `format` and `expanded` (`x`).
fn pset(line: &str) -> Result<Meta, String> {
    let mut words = line.split_whitespace().skip(1);
    let (option, value) = (words.next(), words.next());
    match (option, value) {
        (Some("format"), Some(f)) => Ok(Meta::Format(f.to_string())),
        (Some("expanded" | "x"), v) => match v.map(|v| all_consuming(expanded).parse(v)) {
            None => Ok(Meta::Expanded(None)),
            Some(Ok((_, x))) => Ok(Meta::Expanded(Some(x))),
            Some(Err(_)) => Err(format!("\\pset expanded takes on, off or auto, not {:?}", v.unwrap_or(""))),
        },
        (Some(other), _) => Err(format!(
            "\\pset {other} is not supported: gpuq's \\pset knows `format FMT` and `expanded [on|off|auto]`"
        )),
        (None, _) => Err("\\pset needs an option: `format FMT` or `expanded [on|off|auto]`".into()),
    }
}

/// A DuckDB/SQLite dot-command (`.tables`, `.mode csv`) as the meta-command that does the
/// same; the others get an error that says what to use instead.
fn dot_command(line: &str) -> Result<Meta, String> {
    let (command, arg) = match line.split_once(char::is_whitespace) {
        Some((c, a)) => (c, a.trim()),
        None => (line, ""),
    };
    let needs = |m: fn(String) -> Meta| {
        if arg.is_empty() {
            Err(format!("{command} needs an argument"))
        } else {
            Ok(m(arg.to_string()))
        }
    };
    match command {
        ".quit" | ".exit" | ".q" => Ok(Meta::Quit),
        ".help" => Ok(Meta::Help),
        ".tables" => Ok(Meta::Tables),
        ".schema" | ".describe" if !arg.is_empty() => Ok(Meta::Describe(arg.to_string())),
        ".schema" | ".describe" => Ok(Meta::Tables),
        ".mode" => needs(|m| Meta::Format(if m == "box" || m == "duckbox" { "table".into() } else { m })),
        ".maxrows" => needs(Meta::MaxRows),
        ".read" => needs(Meta::Include),
        ".output" | ".once" => Ok(Meta::Output((!arg.is_empty()).then(|| arg.to_string()))),
        ".timer" => match arg {
            "on" => Ok(Meta::Timing(Some(true))),
            "off" => Ok(Meta::Timing(Some(false))),
            _ => Err(".timer takes on or off".into()),
        },
        _ => Err(format!(
            "unknown dot-command {command:?}: gpuq's shell commands start with \\ (\\help lists them;              .tables, .schema, .mode, .timer, .output, .read, .maxrows and .quit also work)"
        )),
    }
}

/// Whether a line is a shell command rather than SQL: `\...`, or a dot-command (`.` and a
/// letter, so that SQL such as `.5` is not taken for one).
pub fn is_command(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with('\\')
        || (t.starts_with('.') && t[1..].starts_with(|c: char| c.is_ascii_alphabetic()))
}

/// Parses one meta-command line (leading `\`).
pub fn parse(line: &str) -> Result<Meta, String> {
    let line = line.trim().trim_end_matches(';').trim_end();
    if line.starts_with('.') {
        return dot_command(line);
    }
    if line == "\\pset" || line.starts_with("\\pset ") {
        return pset(line);
    }
    match all_consuming(preceded(space0, command)).parse(line) {
        Ok((_, m)) => Ok(m),
        Err(_) => Err(format!(
            "unknown or malformed meta-command {line:?} (\\help lists them)"
        )),
    }
}

pub const HELP: &str = "\
Meta-commands:
  \\runs              list the runs in the store
  \\tables  (\\d)      list tables and views
  \\d TABLE           describe a table's columns
  \\timing [on|off]   print how long each statement took
  \\format FMT        table | csv | json | ndjson | markdown
  \\maxrows N|inf     rows a table shows at most (default 40)
  \\o [FILE]          send results to FILE (no FILE: back to the terminal)
  \\i FILE.sql        run the statements in a file
  \\x [on|off|auto]  expanded display: one line per column (auto: when a table is too wide)
  \\pset format FMT | \\pset expanded [on|off|auto]   psql's spelling of \\format and \\x
  \\set allow_write on|off   let COPY ... TO / INSERT write files (never inside the store)
  \\set allow_files on|off   let CREATE EXTERNAL TABLE read files
  \\help              this text
  \\q                 quit (also Ctrl-D)
DuckDB's .tables, .schema T, .mode FMT, .timer, .output, .read and .quit work too.
SQL statements end with ';' and may span lines. Ctrl-C cancels the running statement.
`FROM t [WHERE ...]` without SELECT means `SELECT * FROM t ...`, as in DuckDB.
Tables: events, counters, runs; views: kernels, memcpy, memset, sync, runtime, cpu_ops,
annotations, gpu_ops, steps.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meta_commands() {
        assert_eq!(parse("\\q"), Ok(Meta::Quit));
        assert_eq!(parse("\\d kernels"), Ok(Meta::Describe("kernels".into())));
        assert_eq!(parse("\\d"), Ok(Meta::Tables));
        assert_eq!(parse("\\tables"), Ok(Meta::Tables));
        assert_eq!(parse("\\timing"), Ok(Meta::Timing(None)));
        assert_eq!(parse("\\timing off"), Ok(Meta::Timing(Some(false))));
        assert_eq!(parse("\\format csv"), Ok(Meta::Format("csv".into())));
        assert_eq!(parse("\\maxrows inf"), Ok(Meta::MaxRows("inf".into())));
        assert_eq!(
            parse("\\set allow_files on"),
            Ok(Meta::Set(FileSetting::AllowFiles, true))
        );
        assert_eq!(
            parse("\\set allow_write off"),
            Ok(Meta::Set(FileSetting::AllowWrite, false))
        );
        assert!(parse("\\set allow_files maybe").is_err());
        assert!(parse("\\maxrows").is_err());
        assert_eq!(
            parse("\\o /tmp/out.txt"),
            Ok(Meta::Output(Some("/tmp/out.txt".into())))
        );
        assert_eq!(parse("\\o"), Ok(Meta::Output(None)));
        assert_eq!(
            parse("\\i my file.sql"),
            Ok(Meta::Include("my file.sql".into()))
        );
        assert_eq!(parse("\\runs"), Ok(Meta::Runs));
        assert!(parse("\\bogus").is_err());
        assert!(parse("\\format").is_err());
        assert!(parse("\\timing maybe").is_err());
    }

    #[test]
    fn parses_expanded_pset_and_dot_commands() {
        assert_eq!(parse("\\x"), Ok(Meta::Expanded(None)));
        assert_eq!(parse("\\x on"), Ok(Meta::Expanded(Some(Expanded::On))));
        assert_eq!(parse("\\x auto"), Ok(Meta::Expanded(Some(Expanded::Auto))));
        assert!(parse("\\x sideways").is_err());
        assert_eq!(parse("\\pset format csv"), Ok(Meta::Format("csv".into())));
        assert_eq!(
            parse("\\pset expanded off"),
            Ok(Meta::Expanded(Some(Expanded::Off)))
        );
        assert_eq!(parse("\\pset x"), Ok(Meta::Expanded(None)));
        let e = parse("\\pset null '(null)'").unwrap_err();
        assert!(e.contains("\\pset null is not supported"), "{e}");
        assert!(parse("\\pset").is_err());
        assert_eq!(parse(".tables"), Ok(Meta::Tables));
        assert_eq!(parse(".mode csv"), Ok(Meta::Format("csv".into())));
        assert_eq!(parse(".mode box"), Ok(Meta::Format("table".into())));
        assert_eq!(
            parse(".schema kernels"),
            Ok(Meta::Describe("kernels".into()))
        );
        assert_eq!(parse(".timer on"), Ok(Meta::Timing(Some(true))));
        assert_eq!(parse(".quit"), Ok(Meta::Quit));
        assert!(parse(".mode").is_err());
        let e = parse(".dump").unwrap_err();
        assert!(e.contains("unknown dot-command \".dump\""), "{e}");
        assert!(is_command(".tables") && is_command("  \\d") && !is_command(".5 + 1;"));
        assert!(!is_command("SELECT 1;"));
    }
}
