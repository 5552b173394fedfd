//! Shell input split into meta-commands and SQL statements as it arrives: a statement ends at
//! a `;` outside quotes and comments (`'…'`, `"…"`, `--…`, `/* … */`), a meta-command (`\d`,
//! `.tables`) at the end of its line. Each piece can run as soon as it is whole, so a pipe or
//! FIFO can drive `gpuq sql` one statement at a time.

use crate::meta;

/// One piece of shell input, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A meta-command line.
    Meta(String),
    /// A statement with its `;` (or, at the end of the input, without).
    Sql(String),
}

/// Where the splitter is in the SQL text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Lexeme {
    #[default]
    Code,
    SingleQuoted,
    DoubleQuoted,
    LineComment,
    BlockComment,
}

/// Splits input into [`Piece`]s as it comes.
#[derive(Debug, Default)]
pub struct Splitter {
    /// Input not yet handed out.
    pending: String,
    /// Bytes of `pending` read so far, and where the splitter is after them.
    scanned: usize,
    lexeme: Lexeme,
    /// `pending[..scanned]` holds SQL, not only blanks and comments.
    has_sql: bool,
}

impl Splitter {
    /// Adds input; returns the pieces it completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        std::iter::from_fn(|| self.next_piece(false)).collect()
    }

    /// Ends the input: returns the pieces left (a last statement without `;`, a last
    /// meta-command without a newline).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = std::iter::from_fn(|| self.next_piece(true)).collect();
        if self.has_sql {
            pieces.push(Piece::Sql(std::mem::take(&mut self.pending)));
        }
        *self = Splitter::default();
        pieces
    }

    /// Whether the input so far is whole: no statement or quote or comment is open (what the
    /// interactive editor asks before it runs a line).
    pub fn is_idle(&self) -> bool {
        !self.has_sql && matches!(self.lexeme, Lexeme::Code | Lexeme::LineComment)
    }

    /// Hands out `pending[..end]` and starts afresh after it.
    fn take(&mut self, end: usize) -> String {
        let piece: String = self.pending.drain(..end).collect();
        self.scanned = 0;
        self.lexeme = Lexeme::Code;
        self.has_sql = false;
        piece
    }

    /// The next whole piece, reading on from where the last call stopped. Waits (`None`) where
    /// a character decides what comes before it and has not arrived yet, unless `at_end`.
    fn next_piece(&mut self, at_end: bool) -> Option<Piece> {
        let b = self.pending.as_bytes();
        let mut i = self.scanned;
        while i < b.len() {
            let next = b.get(i + 1).copied();
            if next.is_none() && !at_end && matches!(b[i], b'-' | b'/' | b'*' | b'.') {
                // `--`, `/*`, `*/` or a dot-command: decided by the next character.
                break;
            }
            match self.lexeme {
                Lexeme::Code => match b[i] {
                    // A meta-command where a statement would start: the rest of its line.
                    b'\\' | b'.' if !self.has_sql && meta::is_command(&self.pending[i..]) => {
                        let Some(newline) = memchr_newline(&b[i..]) else {
                            if !at_end {
                                break;
                            }
                            let line = self.take(b.len())[i..].trim_end().to_string();
                            return Some(Piece::Meta(line));
                        };
                        let line = self.take(i + newline + 1)[i..].trim_end().to_string();
                        return Some(Piece::Meta(line));
                    }
                    b';' => {
                        let had_sql = self.has_sql;
                        let statement = self.take(i + 1);
                        if had_sql {
                            return Some(Piece::Sql(statement));
                        }
                        // A lone `;` is no statement.
                        return self.next_piece(at_end);
                    }
                    b'\'' => (self.lexeme, self.has_sql) = (Lexeme::SingleQuoted, true),
                    b'"' => (self.lexeme, self.has_sql) = (Lexeme::DoubleQuoted, true),
                    b'-' if next == Some(b'-') => {
                        self.lexeme = Lexeme::LineComment;
                        i += 1;
                    }
                    b'/' if next == Some(b'*') => {
                        self.lexeme = Lexeme::BlockComment;
                        i += 1;
                    }
                    c if c.is_ascii_whitespace() => {}
                    _ => self.has_sql = true,
                },
                // A doubled quote inside quotes closes and reopens them.
                Lexeme::SingleQuoted if b[i] == b'\'' => self.lexeme = Lexeme::Code,
                Lexeme::DoubleQuoted if b[i] == b'"' => self.lexeme = Lexeme::Code,
                Lexeme::LineComment if b[i] == b'\n' => self.lexeme = Lexeme::Code,
                Lexeme::BlockComment if b[i] == b'*' && next == Some(b'/') => {
                    self.lexeme = Lexeme::Code;
                    i += 1;
                }
                _ => {}
            }
            i += 1;
        }
        self.scanned = i;
        None
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Splits a whole text (a script, an `\i` file, an interactive line).
pub fn split(text: &str) -> Vec<Piece> {
    let mut splitter = Splitter::default();
    let mut pieces = splitter.push(text);
    pieces.extend(splitter.finish());
    pieces
}

/// Whether `text` ends where a statement may start: its last statement has its `;`, and no
/// quote or comment is open.
pub fn statement_complete(text: &str) -> bool {
    let mut splitter = Splitter::default();
    splitter.push(text);
    splitter.is_idle()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(s: &str) -> Piece {
        Piece::Sql(s.into())
    }

    #[test]
    fn detects_complete_statements() {
        assert!(statement_complete("SELECT 1;"));
        assert!(statement_complete("SELECT 1;  \n"));
        assert!(!statement_complete("SELECT 1"));
        assert!(!statement_complete("SELECT ';'"));
        assert!(!statement_complete("SELECT 'a;"));
        assert!(statement_complete("SELECT 1 -- note\n;"));
        assert!(!statement_complete("SELECT 1 -- done;"));
        assert!(!statement_complete("SELECT 1 /* ; */"));
        assert!(!statement_complete("SELECT 1; /* open"));
        assert!(!statement_complete("SELECT 1; SELECT 2"));
    }

    #[test]
    fn statements_come_out_as_soon_as_their_semicolon_arrives() {
        let mut s = Splitter::default();
        assert_eq!(s.push("SELECT 'a;b' AS \"x;y\" -- c;\n"), vec![]);
        assert_eq!(
            s.push("/* ; */ ; SELECT 2"),
            vec![sql("SELECT 'a;b' AS \"x;y\" -- c;\n/* ; */ ;")]
        );
        assert_eq!(s.push(";"), vec![sql(" SELECT 2;")]);
        assert_eq!(s.push("\n-- trailing comment\n"), vec![]);
        assert_eq!(s.finish(), vec![]);
        // A quote doubled inside quotes, a statement split inside `--`.
        let mut s = Splitter::default();
        assert_eq!(s.push("SELECT 'it''s;' -"), vec![]);
        assert_eq!(s.push("- x;\n;"), vec![sql("SELECT 'it''s;' -- x;\n;")]);
        // The end of the input ends the last statement.
        let mut s = Splitter::default();
        assert_eq!(s.push("SELECT 1; SELECT 2"), vec![sql("SELECT 1;")]);
        assert_eq!(s.finish(), vec![sql(" SELECT 2")]);
    }

    #[test]
    fn meta_commands_wait_for_their_line() {
        let mut s = Splitter::default();
        assert_eq!(s.push("-- a comment\n  \\d ru"), vec![]);
        assert_eq!(
            s.push("ns\nSELECT 1;\n.tab"),
            vec![Piece::Meta("\\d runs".into()), sql("SELECT 1;")]
        );
        assert_eq!(s.push("les"), vec![]);
        assert_eq!(s.finish(), vec![Piece::Meta(".tables".into())]);
        // Inside a statement a backslash is SQL.
        assert_eq!(split("SELECT 1\n\\q;"), vec![sql("SELECT 1\n\\q;")]);
        assert_eq!(split(";;\\q"), vec![Piece::Meta("\\q".into())]);
    }
}
