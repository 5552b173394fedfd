//! Secret redaction: every text a run stores passes through here before it is written (event
//! names, `args`, operators and scopes, counter names, trace metadata, source paths, tags,
//! warnings, run names taken from file names).
//!
//! Two kinds of secret are replaced with [`REDACTED`], also inside longer texts:
//! - tokens of well-known formats: `hf_…`, `ghp_…` (and `gho_`, `ghu_`, `ghs_`, `ghr_`),
//!   `github_pat_…`, `sk-…`, Slack `xox?-…`, `glpat-…`, AWS `AKIA…`, JWTs (`eyJ….….…`), the
//!   token after `Bearer`, and the `user:password` of a URL;
//! - values under keys that name a secret ([`is_secret_key`]): `HF_TOKEN=…`, `"api_key": …`,
//!   `--password …`, `db_password: …`.
//!
//! Speed: a text is searched with the full patterns only where one of a few literals
//! ([`PREFILTER_LITERALS`]) occurs in it, and a column of texts is searched for them in one
//! pass over its bytes (SIMD multi-literal search), so the usual trace, which holds none, costs
//! one fast scan of its text columns.

use aho_corasick::{AhoCorasick, Input, MatchKind};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, DictionaryArray, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Int32Type};
use gpuq_engine::manifest::RunMeta;
use regex::{Captures, Regex};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

pub const REDACTED: &str = "REDACTED";

/// The warning that counts a run's redacted secrets (in `runs.warnings`).
pub const WARNING: &str = "secrets redacted (replaced by REDACTED before storing)";

/// Every text a redaction changes holds one of these. Key words are listed in the casings a
/// word of a key can have ([`key_words`] splits `apiKey` and `API_KEY` into words that are
/// lower case, upper case or capitalised): the search is case-sensitive because only that
/// is fast (SIMD "Teddy"; ASCII case-insensitive search is ~100x slower).
pub const PREFILTER_LITERALS: &[&str] = &[
    // Token formats.
    "hf_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "sk-",
    "xox",
    "glpat-",
    "AKIA",
    "eyJ",
    // `Bearer …`, `scheme://user:password@`.
    "earer",
    "EARER",
    "://",
    // Key words ([`is_secret_key`]).
    "oken",
    "OKEN",
    "assw",
    "ASSW",
    "assphrase",
    "ASSPHRASE",
    "ecret",
    "ECRET",
    "redential",
    "REDENTIAL",
    "key",
    "Key",
    "KEY",
    "auth",
    "Auth",
    "AUTH",
    "ookie",
    "OOKIE",
    // A JSON escape can spell any letter of a key (`"pass\u0077ord"`); ASCII letters are
    // `\u0041` to `\u007a`. No literal is shorter than three bytes: a two-byte one would
    // make the search's SIMD mask shorter and its false candidates many (+4 % of an ingest's
    // instructions, callgrind).
    "\\u00",
];

static PREFILTER: LazyLock<AhoCorasick> = LazyLock::new(|| {
    // Leftmost-first: the standard semantics have no SIMD prefilter.
    AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostFirst)
        .build(PREFILTER_LITERALS)
        .expect("literal patterns")
});

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("valid pattern")
}

static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    regex(concat!(
        r"hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}",
        r"|(?P<sk>sk-[A-Za-z0-9_-]{20,})|xox[abeprs]-[A-Za-z0-9-]{10,}|glpat-[A-Za-z0-9_-]{16,}",
        r"|(?P<aws>AKIA[0-9A-Z]{16})",
        r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    ))
});

static BEARER: LazyLock<Regex> =
    LazyLock::new(|| regex(r"(?:Bearer|bearer|BEARER)[ \t]+(?P<v>[A-Za-z0-9._~+/=-]{8,})"));

static URL_CREDENTIALS: LazyLock<Regex> = LazyLock::new(|| {
    regex(r#"[A-Za-z][A-Za-z0-9+.-]*://(?P<v>[^\s/?#@:"'<>\\]+:[^\s/?#@"'<>\\]*)@"#)
});

/// `"key": value`, `'key': value`, `--key value`, `--key=value`, `key=value`, `key: value`.
static KEY_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    let quoted = r#""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"#;
    regex(&format!(
        concat!(
            r#""(?P<jk>[^"\\\n]{{1,100}})"[ \t]*:[ \t]*(?P<jv>{q}|-?[0-9][0-9.eE+-]*)"#,
            r#"|'(?P<sk>[^'\\\n]{{1,100}})'[ \t]*:[ \t]*(?P<sv>{q}|-?[0-9][0-9.eE+-]*)"#,
            r#"|(?P<fk>--?[A-Za-z][A-Za-z0-9_.-]*)(?:=|[ \t]+)(?P<fv>{q}|[^\s"'\\-][^\s"'\\,;&)>]*)"#,
            r#"|(?P<kk>[A-Za-z_][A-Za-z0-9_.-]*)(?:[ \t]*=[ \t]*|:[ \t]+)(?P<kv>{q}|[^\s"'\\,;&)>}}\]]+)"#,
        ),
        q = quoted
    ))
});

/// Words of an `Authorization` value that come before the credentials.
const AUTH_SCHEMES: &[&str] = &["Bearer", "Basic", "Token", "Digest"];

/// Words before `token` that make it a tokenizer setting (`pad_token`), not a credential.
const TOKENIZER_WORDS: &[&str] = &[
    "bos", "eos", "pad", "unk", "sep", "cls", "mask", "start", "end", "special",
];

/// Words before `key` that make it a data structure's key (`sort_key`), not a credential.
const ORDINARY_KEYS: &[&str] = &[
    "sort",
    "cache",
    "primary",
    "partition",
    "foreign",
    "hash",
    "group",
    "shard",
    "join",
    "index",
    "map",
    "dict",
    "lookup",
    "routing",
];

/// A key's words, lower-cased: split at non-letters and where case changes (`apiKey`,
/// `APIKey` and `API_KEY` are `api`, `key`).
fn key_words(key: &str) -> Vec<String> {
    let b = key.as_bytes();
    let mut words = Vec::new();
    let mut word = String::new();
    for (i, &c) in b.iter().enumerate() {
        if !c.is_ascii_alphabetic() {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        if !word.is_empty() {
            let prev = b[i - 1];
            let next_lower = b.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            let camel = prev.is_ascii_lowercase() && c.is_ascii_uppercase();
            let acronym_end = prev.is_ascii_uppercase() && c.is_ascii_uppercase() && next_lower;
            if camel || acronym_end {
                words.push(std::mem::take(&mut word));
            }
        }
        word.push(c.to_ascii_lowercase() as char);
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Whether a key names a secret: `HF_TOKEN`, `accessToken`, `WANDB_API_KEY`, `db_password`,
/// `AWS_SECRET_ACCESS_KEY`, `client_secret`, `Authorization`, `--hf-token`, ... but not
/// `TOKENIZERS_PARALLELISM`, `max_tokens`, `tokens_per_second`, `pad_token`,
/// `key_padding_mask`, `num_key_value_heads` or `sort_key`.
pub fn is_secret_key(key: &str) -> bool {
    let words = key_words(key);
    let Some(last) = words.last() else {
        return false;
    };
    let before = words.len().checked_sub(2).map(|i| words[i].as_str());
    let secret_word = |w: &String| {
        matches!(
            w.as_str(),
            "password"
                | "passwd"
                | "passphrase"
                | "secret"
                | "secrets"
                | "credential"
                | "credentials"
                | "authorization"
                | "cookie"
                | "cookies"
                | "apikey"
                | "privatekey"
                | "secretkey"
                | "accesskey"
                | "authtoken"
        )
    };
    words.iter().any(secret_word)
        || match last.as_str() {
            "token" => !before.is_some_and(|b| TOKENIZER_WORDS.contains(&b)),
            "key" => !before.is_some_and(|b| ORDINARY_KEYS.contains(&b)),
            "auth" => true,
            _ => false,
        }
}

/// What to do with one match of a pattern.
enum Found {
    /// Replace this byte range of the text with [`REDACTED`].
    Secret(Range<usize>),
    /// Not a secret: search again from this byte.
    Resume(usize),
}

/// Replaces what `judge` finds secret among the matches of `re`, left to right; counts them.
fn replace_found<'t>(
    text: &'t str,
    re: &Regex,
    count: &mut usize,
    judge: impl Fn(&str, &Captures) -> Found,
) -> Cow<'t, str> {
    let mut out = String::new();
    let (mut copied, mut at) = (0, 0);
    while at <= text.len() {
        let Some(c) = re.captures_at(text, at) else {
            break;
        };
        let whole = c.get(0).expect("group 0");
        match judge(text, &c) {
            Found::Secret(range) => {
                out.push_str(&text[copied..range.start]);
                out.push_str(REDACTED);
                copied = range.end;
                *count += 1;
                at = whole.end().max(range.end);
            }
            Found::Resume(next) => at = next,
        }
        if at <= whole.start() {
            // Always move on, to the next character.
            at = whole.start()
                + text[whole.start()..]
                    .chars()
                    .next()
                    .map_or(1, char::len_utf8);
        }
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(&text[copied..]);
    Cow::Owned(out)
}

fn alphanumeric_before(text: &str, at: usize) -> bool {
    text.as_bytes()[..at]
        .last()
        .is_some_and(u8::is_ascii_alphanumeric)
}

/// The inside of a quoted value, or the value.
fn unquoted(text: &str, value: Range<usize>) -> Range<usize> {
    let v = &text.as_bytes()[value.clone()];
    if v.len() >= 2 && matches!(v[0], b'"' | b'\'') && v[v.len() - 1] == v[0] {
        value.start + 1..value.end - 1
    } else {
        value
    }
}

/// Whether a token's text after its prefix (`hf_`, `xoxb-`) mixes at least two of lower case,
/// upper case and digits, as random tokens do and words and identifiers seldom do.
fn looks_random(token: &str) -> bool {
    let body = token.split_once(['_', '-']).map_or(token, |(_, body)| body);
    let has = |f: fn(&u8) -> bool| body.as_bytes().iter().any(f) as u8;
    has(u8::is_ascii_lowercase) + has(u8::is_ascii_uppercase) + has(u8::is_ascii_digit) >= 2
}

fn token_pass<'t>(text: &'t str, count: &mut usize) -> Cow<'t, str> {
    replace_found(text, &TOKEN, count, |text, c| {
        let m = c.get(0).expect("group 0");
        let next = m.start() + 1;
        // A token's text looks random; a name (`…_hf_rotaryembedding…`) does not. Glued to
        // what comes before it (`%3Dhf_…`, a URL-encoded `=`) a token is still one where its
        // prefix is one no word has; `sk-` and `AKIA` are inside words (`task-…`). An AWS key
        // id is exactly 20 characters.
        let aws = c.name("aws").is_some();
        let in_word = alphanumeric_before(text, m.start()) && (aws || c.name("sk").is_some());
        if in_word
            || (!aws && !looks_random(m.as_str()))
            || (aws
                && text
                    .as_bytes()
                    .get(m.end())
                    .is_some_and(u8::is_ascii_alphanumeric))
            || c.name("sk")
                .is_some_and(|sk| !sk.as_str().bytes().any(|b| b.is_ascii_digit()))
        {
            return Found::Resume(next);
        }
        Found::Secret(m.range())
    })
}

fn bearer_pass<'t>(text: &'t str, count: &mut usize) -> Cow<'t, str> {
    replace_found(text, &BEARER, count, |text, c| {
        let v = c.name("v").expect("value group");
        if alphanumeric_before(text, c.get(0).expect("group 0").start())
            || !v.as_str().bytes().any(|b| b.is_ascii_digit())
        {
            return Found::Resume(v.start());
        }
        Found::Secret(v.range())
    })
}

fn url_pass<'t>(text: &'t str, count: &mut usize) -> Cow<'t, str> {
    replace_found(text, &URL_CREDENTIALS, count, |_, c| {
        Found::Secret(c.name("v").expect("credentials group").range())
    })
}

fn key_value_pass<'t>(text: &'t str, count: &mut usize) -> Cow<'t, str> {
    replace_found(text, &KEY_VALUE, count, |text, c| {
        let pair = [("jk", "jv"), ("sk", "sv"), ("fk", "fv"), ("kk", "kv")]
            .into_iter()
            .find_map(|(k, v)| Some((c.name(k)?, c.name(v)?)));
        let Some((key, value)) = pair else {
            return Found::Resume(c.get(0).expect("group 0").end());
        };
        let mut inside = unquoted(text, value.range());
        if AUTH_SCHEMES
            .iter()
            .any(|s| text[inside.clone()].eq_ignore_ascii_case(s))
        {
            // `Authorization: Basic dXNlcjpw`: the credentials are the next word.
            let rest = &text[inside.end..];
            let start = inside.end + (rest.len() - rest.trim_start_matches([' ', '\t']).len());
            let len = text[start..]
                .find(|c: char| c.is_whitespace() || "\"',;".contains(c))
                .unwrap_or(text.len() - start);
            inside = start..start + len;
        }
        let v = &text[inside.clone()];
        // A value with a token already replaced (`--token=REDACTED.json`) is not counted twice.
        if is_secret_key(key.as_str().trim_start_matches('-'))
            && !v.is_empty()
            && !v.contains(REDACTED)
        {
            Found::Secret(inside)
        } else {
            // The value may hold pairs of its own (`"cmd": "run --password x"`).
            Found::Resume(key.end())
        }
    })
}

/// A plain text with its secrets replaced.
fn plain<'t>(text: &'t str, count: &mut usize) -> Cow<'t, str> {
    let passes: [for<'a> fn(&'a str, &mut usize) -> Cow<'a, str>; 4] =
        [token_pass, bearer_pass, url_pass, key_value_pass];
    let mut text = Cow::Borrowed(text);
    for pass in passes {
        let redacted = match pass(&text, count) {
            Cow::Owned(redacted) => Some(redacted),
            Cow::Borrowed(_) => None,
        };
        if let Some(redacted) = redacted {
            text = Cow::Owned(redacted);
        }
    }
    text
}

/// The index of the quote that closes the JSON string opening at `open`.
fn string_end(b: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', &b[i..])?;
        if b[i] == b'"' {
            return Some(i);
        }
        i += 2;
        if i > b.len() {
            return None;
        }
    }
}

/// The text of a JSON string literal's inside (`raw`, escapes and all).
fn json_unescape(raw: &str) -> Cow<'_, str> {
    if !raw.contains('\\') {
        return Cow::Borrowed(raw);
    }
    serde_json::from_str::<String>(&format!("\"{raw}\""))
        .map(Cow::Owned)
        .unwrap_or(Cow::Borrowed(raw))
}

/// JSON text (an event's `args`) with its secrets replaced, keeping its layout and member
/// order: a string or number under a key naming a secret becomes `"REDACTED"`; other strings
/// are redacted as plain text. `None` when it is not JSON after all.
fn json<'t>(text: &'t str, count: &mut usize) -> Option<Cow<'t, str>> {
    serde_json::from_str::<serde::de::IgnoredAny>(text).ok()?;
    let b = text.as_bytes();
    let mut out = String::new();
    let (mut copied, mut i) = (0, 0);
    let mut under_secret_key = false;
    let replace = |out: &mut String, range: Range<usize>, with: &str, copied: &mut usize| {
        out.push_str(&text[*copied..range.start]);
        out.push_str(with);
        *copied = range.end;
    };
    while i < b.len() {
        match b[i] {
            b'"' => {
                let end = string_end(b, i)?;
                let raw = &text[i + 1..end];
                let mut j = end + 1;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                if b.get(j) == Some(&b':') {
                    under_secret_key = is_secret_key(&json_unescape(raw));
                    i = j + 1;
                    continue;
                }
                if under_secret_key && !raw.is_empty() && raw != REDACTED {
                    replace(&mut out, i + 1..end, REDACTED, &mut copied);
                    *count += 1;
                } else {
                    let mut found = 0;
                    let inside = json_unescape(raw);
                    if let Cow::Owned(redacted) = plain(&inside, &mut found) {
                        let quoted = serde_json::to_string(&redacted).ok()?;
                        replace(&mut out, i..end + 1, &quoted, &mut copied);
                        *count += found;
                    }
                }
                under_secret_key = false;
                i = end + 1;
            }
            c if under_secret_key && (c == b'-' || c.is_ascii_digit()) => {
                let mut end = i + 1;
                while end < b.len()
                    && matches!(b[end], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    end += 1;
                }
                replace(&mut out, i..end, "\"REDACTED\"", &mut copied);
                *count += 1;
                under_secret_key = false;
                i = end;
            }
            c if c.is_ascii_whitespace() => i += 1,
            // A container under a secret key: its members are judged by their own keys.
            _ => {
                under_secret_key = false;
                i += 1;
            }
        }
    }
    if copied == 0 {
        return Some(Cow::Borrowed(text));
    }
    out.push_str(&text[copied..]);
    Some(Cow::Owned(out))
}

/// `text` with every secret in it replaced by [`REDACTED`], and how many were.
pub fn redact_text(text: &str) -> (Cow<'_, str>, usize) {
    if !PREFILTER.is_match(text) {
        return (Cow::Borrowed(text), 0);
    }
    let mut count = 0;
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut in_json = 0;
        if let Some(redacted) = json(text, &mut in_json) {
            return (redacted, in_json);
        }
    }
    let redacted = plain(text, &mut count);
    (redacted, count)
}

/// Redacts a JSON value in place (trace metadata); returns how many secrets were replaced.
pub fn redact(value: &mut Value) -> usize {
    match value {
        Value::Object(map) => {
            let mut n = 0;
            for (k, v) in map.iter_mut() {
                let scalar = match v {
                    Value::String(s) => !s.is_empty() && s != REDACTED,
                    Value::Number(_) => true,
                    _ => false,
                };
                if scalar && is_secret_key(k) {
                    *v = Value::String(REDACTED.into());
                    n += 1;
                } else {
                    n += redact(v);
                }
            }
            n
        }
        Value::Array(items) => items.iter_mut().map(redact).sum(),
        Value::String(s) => redact_string(s),
        _ => 0,
    }
}

/// Redacts a run's metadata besides its rows: source paths, tags (a value under a key naming
/// a secret, and secrets in keys and values), trace metadata and warnings. Returns how many
/// secrets were replaced.
pub fn run_meta(meta: &mut RunMeta) -> usize {
    let mut n = 0;
    for source in &mut meta.sources {
        n += redact_string(&mut source.path);
        for member in &mut source.files {
            n += redact_string(&mut member.path);
        }
    }
    let warnings = std::mem::take(&mut meta.warnings);
    for (mut w, count) in warnings {
        n += redact_string(&mut w);
        *meta.warnings.entry(w).or_default() += count;
    }
    let tags = std::mem::take(&mut meta.tags);
    for (k, v) in tags {
        let (k, v, secrets) = tag(&k, &v);
        n += secrets;
        meta.tags.insert(k, v);
    }
    n + redact(&mut meta.metadata)
}

/// Redacts a string in place; returns how many secrets were replaced.
pub fn redact_string(s: &mut String) -> usize {
    let redacted = match redact_text(s) {
        (Cow::Owned(r), n) => Some((r, n)),
        (Cow::Borrowed(_), _) => None,
    };
    match redacted {
        Some((r, n)) => {
            *s = r;
            n
        }
        None => 0,
    }
}

/// A tag (`key`, `value`) with its secrets replaced, and how many were.
pub fn tag(key: &str, value: &str) -> (String, String, usize) {
    let (k, in_key) = redact_text(key);
    let (v, in_value) = if is_secret_key(key) && !value.is_empty() && value != REDACTED {
        (Cow::Borrowed(REDACTED), 1)
    } else {
        redact_text(value)
    };
    (k.into_owned(), v.into_owned(), in_key + in_value)
}

/// Redacts the text columns of batches before they are written (names, `args`, operators,
/// scopes, ...), and counts the secrets it replaced: in each `args` value, and in each
/// distinct name (a name is counted once however many rows, batches and columns hold it). A
/// dictionary shared by many batches (the resolver's names) is searched once.
#[derive(Default)]
pub struct Redactor {
    count: AtomicUsize,
    /// Dictionaries seen lately, and their redacted values where they held secrets.
    dictionaries: Mutex<Vec<(ArrayRef, Option<ArrayRef>)>>,
    /// Names (dictionary values) whose secrets were counted.
    names_counted: Mutex<HashSet<String>>,
}

/// Dictionaries [`Redactor`] remembers.
const DICTIONARIES_KEPT: usize = 8;

impl Redactor {
    /// Secrets replaced so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// `batch` with the secrets in its text columns replaced.
    pub fn batch(&self, batch: RecordBatch) -> RecordBatch {
        let mut columns: Option<Vec<ArrayRef>> = None;
        for (i, column) in batch.columns().iter().enumerate() {
            let redacted = match column.data_type() {
                DataType::Utf8 => self
                    .strings(column.as_string::<i32>(), false)
                    .map(|a| Arc::new(a) as ArrayRef),
                DataType::Dictionary(k, v) if **k == DataType::Int32 && **v == DataType::Utf8 => {
                    self.dictionary(column.as_dictionary::<Int32Type>())
                }
                _ => None,
            };
            if let Some(redacted) = redacted {
                columns.get_or_insert_with(|| batch.columns().to_vec())[i] = redacted;
            }
        }
        match columns {
            None => batch,
            Some(columns) => {
                RecordBatch::try_new(batch.schema(), columns).expect("the same columns' types")
            }
        }
    }

    fn dictionary(&self, column: &DictionaryArray<Int32Type>) -> Option<ArrayRef> {
        let values = column.values();
        let known = {
            let mut seen = self.dictionaries.lock().unwrap_or_else(|e| e.into_inner());
            seen.iter()
                .position(|(v, _)| Arc::ptr_eq(v, values))
                .map(|i| {
                    // Most recent last.
                    let entry = seen.remove(i);
                    let redacted = entry.1.clone();
                    seen.push(entry);
                    redacted
                })
        };
        let redacted = match known {
            Some(redacted) => redacted,
            None => {
                let redacted = values
                    .as_string_opt::<i32>()
                    .and_then(|v| self.strings(v, true))
                    .map(|a| Arc::new(a) as ArrayRef);
                let mut seen = self.dictionaries.lock().unwrap_or_else(|e| e.into_inner());
                if seen.len() >= DICTIONARIES_KEPT {
                    seen.remove(0);
                }
                seen.push((values.clone(), redacted.clone()));
                redacted
            }
        }?;
        let keys = column.keys().clone();
        Some(Arc::new(
            DictionaryArray::<Int32Type>::try_new(keys, redacted).expect("the same values' count"),
        ))
    }

    /// The texts with their secrets replaced; `None` when they hold none. `names`: count
    /// each distinct text once.
    fn strings(&self, array: &StringArray, names: bool) -> Option<StringArray> {
        let mut changed: Vec<(usize, String)> = Vec::new();
        for row in candidate_rows(array) {
            let text = array.value(row);
            if let (Cow::Owned(r), n) = redact_text(text) {
                let first = !names || {
                    let mut counted = self.names_counted.lock().unwrap_or_else(|e| e.into_inner());
                    counted.insert(text.to_string())
                };
                if first {
                    self.count.fetch_add(n, Ordering::Relaxed);
                }
                changed.push((row, r));
            }
        }
        if changed.is_empty() {
            return None;
        }
        let mut next = changed.iter().peekable();
        Some(
            (0..array.len())
                .map(|i| match next.next_if(|(row, _)| *row == i) {
                    Some((_, r)) => Some(r.as_str()),
                    None => array.is_valid(i).then(|| array.value(i)),
                })
                .collect(),
        )
    }
}

/// The rows of `array` that hold one of [`PREFILTER_LITERALS`], found in one pass over its
/// bytes (a literal across two rows is no row's).
fn candidate_rows(array: &StringArray) -> Vec<usize> {
    let offsets = array.value_offsets();
    let data = array.value_data();
    let (mut at, end) = (offsets[0] as usize, offsets[array.len()] as usize);
    let mut rows = Vec::new();
    while at < end {
        let Some(m) = PREFILTER.find(Input::new(data).span(at..end)) else {
            break;
        };
        let row = offsets.partition_point(|&o| o as usize <= m.start()) - 1;
        let row_end = offsets[row + 1] as usize;
        if m.end() <= row_end && array.is_valid(row) {
            rows.push(row);
        }
        at = row_end;
    }
    rows
}

#[cfg(test)]
mod tests;
