//! REPL meta-commands (`\d kernels`, `\format csv`, ...), parsed with nom.

use nom::branch::alt;
use nom::bytes::complete::{tag, take_while1};
use nom::character::complete::{space0, space1};
use nom::combinator::{all_consuming, map, opt, rest};
use nom::sequence::preceded;
use nom::{IResult, Parser};

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
    ))
    .parse(i)
}

/// Parses one meta-command line (leading `\`).
pub fn parse(line: &str) -> Result<Meta, String> {
    let line = line.trim().trim_end_matches(';').trim_end();
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
  \\help              this text
  \\q                 quit (also Ctrl-D)
SQL statements end with ';' and may span lines. Ctrl-C cancels the running statement.
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
}
