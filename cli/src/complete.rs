//! Tab completion in the shell, by context: tables and table functions after FROM/JOIN,
//! columns of the statement's tables (and functions) after SELECT, WHERE, BY, ON...,
//! meta-commands after `\`.

/// What can be completed, gathered once when the shell starts.
#[derive(Debug, Default, Clone)]
pub struct Vocabulary {
    /// Tables and views with their columns.
    pub tables: Vec<(String, Vec<String>)>,
    /// Table functions with the columns they return (empty when unknown).
    pub table_functions: Vec<(String, Vec<String>)>,
    /// Scalar, aggregate and window functions.
    pub functions: Vec<String>,
}

pub const META_COMMANDS: &[&str] = &[
    "\\runs",
    "\\tables",
    "\\d",
    "\\timing",
    "\\format",
    "\\maxrows",
    "\\o",
    "\\i",
    "\\x",
    "\\pset",
    "\\help",
    "\\q",
];

const KEYWORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "ORDER BY",
    "LIMIT",
    "JOIN",
    "LEFT JOIN",
    "ON",
    "AS",
    "AND",
    "OR",
    "NOT",
    "IN",
    "LIKE",
    "ILIKE",
    "IS NULL",
    "BETWEEN",
    "DESC",
    "ASC",
    "HAVING",
    "WITH",
    "UNION ALL",
    "DISTINCT",
    "EXPLAIN",
    "ANALYZE",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "OVER",
    "PARTITION BY",
    "USING",
];

/// Keywords after which a table name comes.
const TABLE_KEYWORDS: &[&str] = &["FROM", "JOIN", "INTO", "TABLE", "UPDATE", "DESCRIBE"];

/// Keywords after which a column or an expression comes.
const EXPRESSION_KEYWORDS: &[&str] = &[
    "SELECT", "WHERE", "AND", "OR", "NOT", "BY", "ON", "HAVING", "WHEN", "THEN", "ELSE", "CASE",
    "SET", "DISTINCT", "USING",
];

/// What the word under the cursor is expected to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expecting {
    MetaCommand,
    Table,
    Expression,
    Anything,
}

impl Vocabulary {
    /// Where the word under the cursor starts and the candidates for it, sorted.
    pub fn complete(&self, line: &str, pos: usize) -> (usize, Vec<String>) {
        let before = &line[..pos];
        let start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '\\'))
            .map_or(0, |i| i + 1);
        let prefix = before[start..].to_ascii_lowercase();
        let statement = current_statement(line, pos);
        let context = expecting(&before[..start]);
        if prefix.is_empty() && context == Expecting::Anything {
            return (start, Vec::new());
        }
        let mut words: Vec<&str> = Vec::new();
        match context {
            Expecting::MetaCommand => words.extend(META_COMMANDS),
            Expecting::Table => {
                words.extend(self.tables.iter().map(|(t, _)| t.as_str()));
                words.extend(self.table_functions.iter().map(|(t, _)| t.as_str()));
            }
            Expecting::Expression => {
                words.extend(self.columns_of(&statement));
                words.extend(self.functions.iter().map(String::as_str));
                words.extend(KEYWORDS);
            }
            Expecting::Anything => {
                words.extend(KEYWORDS);
                words.extend(self.tables.iter().map(|(t, _)| t.as_str()));
                words.extend(self.table_functions.iter().map(|(t, _)| t.as_str()));
                words.extend(self.columns_of(&statement));
                words.extend(self.functions.iter().map(String::as_str));
                if start == 0 {
                    words.extend(META_COMMANDS);
                }
            }
        }
        let mut out: Vec<String> = words
            .into_iter()
            .filter(|w| w.to_ascii_lowercase().starts_with(&prefix))
            .map(str::to_string)
            .collect();
        out.sort();
        out.dedup();
        (start, out)
    }

    /// Columns of the tables and table functions the statement names; every column when it
    /// names none (yet).
    fn columns_of(&self, statement: &str) -> Vec<&str> {
        let words = words(statement);
        let named: Vec<String> = words
            .windows(2)
            .filter(|w| TABLE_KEYWORDS.contains(&w[0].to_ascii_uppercase().as_str()))
            .map(|w| w[1].to_ascii_lowercase())
            .collect();
        let all = self.tables.iter().chain(&self.table_functions);
        let chosen: Vec<&(String, Vec<String>)> = if named.is_empty() {
            all.collect()
        } else {
            all.filter(|(t, _)| named.contains(&t.to_ascii_lowercase()))
                .collect()
        };
        chosen
            .into_iter()
            .flat_map(|(_, cols)| cols.iter().map(String::as_str))
            .collect()
    }
}

/// The statement the cursor is in: from after the last `;` before it to the next `;`.
fn current_statement(line: &str, pos: usize) -> String {
    let from = line[..pos].rfind(';').map_or(0, |i| i + 1);
    let to = line[pos..].find(';').map_or(line.len(), |i| pos + i);
    line[from..to].to_string()
}

/// Identifiers and keywords of `text`, quoted strings left out.
fn words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut in_quote = false;
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c == '\'' {
            in_quote = !in_quote;
        }
        let word_char = !in_quote && (c.is_alphanumeric() || c == '_' || c == '\\');
        match (word_char, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(&text[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// The context of a word from the text before it.
fn expecting(before: &str) -> Expecting {
    let statement = &before[before.rfind(';').map_or(0, |i| i + 1)..];
    let trimmed = statement.trim_start();
    if trimmed.is_empty() && before.ends_with('\\') {
        return Expecting::MetaCommand;
    }
    if trimmed.starts_with('\\') {
        // `\d TABLE`: a table; other meta-commands take files or settings.
        let command = trimmed.split_whitespace().next().unwrap_or("");
        return if command == "\\d" && trimmed.len() > command.len() {
            Expecting::Table
        } else if trimmed.len() == command.len() {
            Expecting::MetaCommand
        } else {
            Expecting::Anything
        };
    }
    let tail = statement.trim_end();
    if tail.ends_with('.') {
        return Expecting::Expression;
    }
    let Some(last) = words(statement).last().map(|w| w.to_ascii_uppercase()) else {
        return Expecting::Anything;
    };
    if tail.ends_with(',') {
        // A list continues what the keyword before it started: `FROM a, b` or `SELECT x, y`.
        let keyword = words(statement)
            .iter()
            .rev()
            .map(|w| w.to_ascii_uppercase())
            .find(|w| {
                TABLE_KEYWORDS.contains(&w.as_str()) || EXPRESSION_KEYWORDS.contains(&w.as_str())
            });
        return match keyword {
            Some(k) if TABLE_KEYWORDS.contains(&k.as_str()) => Expecting::Table,
            Some(_) => Expecting::Expression,
            None => Expecting::Anything,
        };
    }
    if !statement.ends_with(char::is_whitespace)
        && !tail.ends_with(['(', '=', '<', '>', '+', '-', '*', '/'])
    {
        return Expecting::Anything;
    }
    if TABLE_KEYWORDS.contains(&last.as_str()) {
        Expecting::Table
    } else if EXPRESSION_KEYWORDS.contains(&last.as_str())
        || tail.ends_with(['(', '=', '<', '>', '+', '-', '*', '/'])
    {
        Expecting::Expression
    } else {
        Expecting::Anything
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocabulary() -> Vocabulary {
        let cols = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Vocabulary {
            tables: vec![
                ("kernels".into(), cols(&["name", "dur", "ts", "stream"])),
                ("memcpy".into(), cols(&["bytes", "dur", "ts"])),
                ("runs".into(), cols(&["run", "tags"])),
            ],
            table_functions: vec![
                ("top_kernels".into(), cols(&["name", "total", "instances"])),
                ("gpu_gaps".into(), cols(&["cause", "next_name"])),
            ],
            functions: cols(&["fmt_dur", "kernel_class", "sum", "min", "max"]),
        }
    }

    fn complete(line: &str) -> Vec<String> {
        vocabulary().complete(line, line.len()).1
    }

    #[test]
    fn after_from_and_join_only_tables_and_table_functions() {
        assert_eq!(
            complete("SELECT * FROM "),
            ["gpu_gaps", "kernels", "memcpy", "runs", "top_kernels"]
        );
        assert_eq!(complete("SELECT * FROM t"), ["top_kernels"]);
        assert_eq!(complete("select * from k"), ["kernels"]);
        assert_eq!(complete("SELECT * FROM kernels k JOIN me"), ["memcpy"]);
        assert_eq!(complete("SELECT * FROM kernels, m"), ["memcpy"]);
        assert_eq!(complete("\\d ke"), ["kernels"]);
    }

    #[test]
    fn after_select_and_where_the_statements_columns_and_functions() {
        // Columns of the table named later in the statement, not of every table.
        let line = "SELECT n FROM kernels;";
        let (start, c) = vocabulary().complete(line, "SELECT n".len());
        assert_eq!((start, c), (7, vec!["NOT".to_string(), "name".to_string()]));
        assert_eq!(
            complete("SELECT name FROM kernels WHERE d"),
            ["DESC", "DISTINCT", "dur"]
        );
        assert_eq!(complete("SELECT name FROM memcpy WHERE "), {
            let mut v: Vec<String> = [
                "bytes",
                "dur",
                "ts",
                "fmt_dur",
                "kernel_class",
                "sum",
                "min",
                "max",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(KEYWORDS.iter().map(|s| s.to_string()))
            .collect();
            v.sort();
            v
        });
        assert_eq!(
            complete("SELECT c FROM gpu_gaps('r')"),
            Vec::<String>::new(),
            "cursor after FROM's table"
        );
        let line = "SELECT c FROM gpu_gaps('r')";
        assert_eq!(vocabulary().complete(line, 8).1, ["CASE", "cause"]);
        assert_eq!(complete("SELECT name, fm"), ["fmt_dur"]);
        assert_eq!(complete("SELECT k.st"), ["stream"]);
        // A column of another table is not offered.
        assert!(!complete("SELECT b FROM kernels").contains(&"bytes".to_string()));
    }

    #[test]
    fn meta_commands_after_a_backslash() {
        assert_eq!(complete("\\ti"), ["\\timing"]);
        assert_eq!(complete("\\x"), ["\\x"]);
        assert!(complete("\\").contains(&"\\pset".to_string()));
    }
}
