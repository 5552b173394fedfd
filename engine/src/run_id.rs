//! Validated run names.

use crate::error::{Error, Result};
use std::fmt;

/// A run name: 1 to 128 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
///
/// Run names become directory names (`run=<id>`), so anything that could escape the store or
/// need percent-encoding in a Hive path is rejected up front.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    pub const MAX_LEN: usize = 128;

    pub fn new(name: impl Into<String>) -> Result<RunId> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > Self::MAX_LEN {
            Some("it is longer than 128 characters")
        } else if name == "." || name == ".." {
            Some("it is a relative path")
        } else if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            Some("only letters, digits, '.', '_' and '-' are allowed")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidRunId { name, reason }),
            None => Ok(RunId(name)),
        }
    }

    /// Derives a run name from a file name: strips trace extensions and replaces every
    /// disallowed character with `_`.
    pub fn from_file_name(file_name: &str) -> Result<RunId> {
        let mut stem = file_name;
        for ext in [
            ".gz",
            ".zst",
            ".json",
            ".sqlite",
            ".csv",
            ".log",
            ".pt.trace",
            ".trace",
        ] {
            if let Some(s) = stem.strip_suffix(ext) {
                stem = s;
            }
        }
        let cleaned: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .take(Self::MAX_LEN)
            .collect();
        RunId::new(cleaned.trim_matches('.').to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RunId {
    type Error = Error;
    fn try_from(s: String) -> Result<RunId> {
        RunId::new(s)
    }
}

impl From<RunId> for String {
    fn from(r: RunId) -> String {
        r.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_path_safe_names() {
        for ok in ["llama-bs8", "a", "run_1.2", &"x".repeat(128)] {
            assert_eq!(RunId::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_unsafe_names() {
        for bad in [
            "",
            "../x",
            "a b",
            "a/b",
            ".",
            "..",
            "run=1",
            &"x".repeat(129),
            "é",
        ] {
            assert!(RunId::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn derives_from_file_names() {
        assert_eq!(
            RunId::from_file_name("rank0.json.gz").unwrap().as_str(),
            "rank0"
        );
        assert_eq!(
            RunId::from_file_name("worker0.1623143089861.pt.trace.json.gz")
                .unwrap()
                .as_str(),
            "worker0.1623143089861"
        );
        assert_eq!(
            RunId::from_file_name("my trace (1).json").unwrap().as_str(),
            "my_trace__1_"
        );
    }
}
