//! Secret redaction for trace metadata.
//!
//! Traces embed environment dumps and harness configs (e.g. `metadata.system.env.HF_TOKEN`).
//! Before anything is stored, values under keys that name a secret, and string values that look
//! like well-known token formats, are replaced with `"REDACTED"`.

use serde_json::Value;

pub const REDACTED: &str = "REDACTED";

/// Whether a key names a secret: `HF_TOKEN`, `WANDB_API_KEY`, `db_password`, `AWS_SECRET_ACCESS_KEY`, ...
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    const WORDS: [&str; 10] = [
        "token",
        "password",
        "passwd",
        "secret",
        "api_key",
        "apikey",
        "private_key",
        "credential",
        "access_key",
        "auth",
    ];
    WORDS.iter().any(|w| k.contains(w)) || k.ends_with("_key") || k == "key"
}

/// Whether a string looks like a credential by itself (prefix formats of common providers).
pub fn looks_like_token(v: &str) -> bool {
    let long_tail = |prefix: &str, min: usize| {
        v.strip_prefix(prefix).is_some_and(|rest| {
            rest.len() >= min
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
    };
    long_tail("hf_", 20)
        || long_tail("ghp_", 20)
        || long_tail("gho_", 20)
        || long_tail("github_pat_", 20)
        || long_tail("sk-", 20)
        || long_tail("xoxb-", 10)
        || long_tail("glpat-", 16)
        || (v.len() == 20
            && v.starts_with("AKIA")
            && v.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
}

/// Redacts in place; returns how many values were replaced.
pub fn redact(value: &mut Value) -> usize {
    match value {
        Value::Object(map) => {
            let mut n = 0;
            for (k, v) in map.iter_mut() {
                if is_secret_key(k)
                    && !matches!(v, Value::Null | Value::Object(_) | Value::Array(_))
                {
                    if v.as_str() != Some(REDACTED) {
                        *v = Value::String(REDACTED.into());
                        n += 1;
                    }
                } else {
                    n += redact(v);
                }
            }
            n
        }
        Value::Array(items) => items.iter_mut().map(redact).sum(),
        Value::String(s) => {
            if looks_like_token(s) {
                *s = REDACTED.into();
                1
            } else {
                0
            }
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redacts_secret_keys_and_token_values() {
        let mut v = json!({
            "system": {"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz", "PATH": "/usr/bin",
                               "WANDB_API_KEY": "0123", "MY_PASSWORD": "pw", "NOTE": "ghp_0123456789abcdefghijABCD"}},
            "keys": ["plain", "sk-0123456789abcdefghijklmnop"],
            "tokens_seen": 5,
            "cuda_runtime_version": 12040
        });
        let n = redact(&mut v);
        assert_eq!(n, 6, "{v}");
        assert_eq!(v["system"]["env"]["HF_TOKEN"], "REDACTED");
        assert_eq!(v["system"]["env"]["PATH"], "/usr/bin");
        assert_eq!(v["system"]["env"]["NOTE"], "REDACTED");
        assert_eq!(v["keys"][0], "plain");
        assert_eq!(v["keys"][1], "REDACTED");
        assert_eq!(v["cuda_runtime_version"], 12040);
        assert!(!v.to_string().contains("hf_abc"));
    }
}
