use super::*;
use datafusion::arrow::array::{Int32Array, StringArray};
use datafusion::arrow::datatypes::{Field, Schema};
use serde_json::json;

const HF: &str = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567";
const GHP: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
const PAT: &str = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz";
const SK: &str = "sk-proj-Abc123def456GHI789jkl012MNO345";
const AWS: &str = "AKIAIOSFODNN7EXAMPLE";
const JWT: &str =
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";

fn redacted(text: &str) -> (String, usize) {
    let (r, n) = redact_text(text);
    (r.into_owned(), n)
}

#[test]
fn tokens_inside_longer_texts_are_replaced() {
    for token in [HF, GHP, PAT, SK, AWS, JWT] {
        for text in [
            token.to_string(),
            format!("load(model, token={token})"),
            format!("/data/{token}/trace.json"),
            format!("python train.py --resume {token} --lr 3e-4"),
            format!("[{token}]"),
        ] {
            let (r, n) = redacted(&text);
            assert!(!r.contains(token), "{text} -> {r}");
            assert!(r.contains(REDACTED), "{text} -> {r}");
            assert!(n >= 1, "{text}");
        }
    }
    let (r, n) = redacted("curl -H 'Authorization: Bearer abc123def456ghi' https://x");
    assert!(!r.contains("abc123def456ghi"), "{r}");
    assert_eq!(n, 1, "{r}");
    let (r, n) = redacted("clone https://alice:s3cr3t-pw@git.example.com/repo.git done");
    assert_eq!(r, "clone https://REDACTED@git.example.com/repo.git done");
    assert_eq!(n, 1);
    let (r, _) = redacted("postgres://bob:pa55@db:5432/x and s3://bucket/key");
    assert_eq!(r, "postgres://REDACTED@db:5432/x and s3://bucket/key");
}

#[test]
fn values_under_secret_keys_are_replaced() {
    let cases = [
        (
            "HF_TOKEN=abc123 python x.py",
            "HF_TOKEN=REDACTED python x.py",
        ),
        (
            "run --password hunter2 --epochs 3",
            "run --password REDACTED --epochs 3",
        ),
        (
            "run --api-key=xyz789 --epochs 3",
            "run --api-key=REDACTED --epochs 3",
        ),
        ("db_password: hunter2", "db_password: REDACTED"),
        ("WANDB_API_KEY='k e y'", "WANDB_API_KEY='REDACTED'"),
        (
            "{'client_secret': 'abc', 'lr': 1}",
            "{'client_secret': 'REDACTED', 'lr': 1}",
        ),
        (
            "stage=load accessToken=abc step=3",
            "stage=load accessToken=REDACTED step=3",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(redacted(text), (want.to_string(), 1), "{text}");
    }
}

#[test]
fn json_args_keep_their_layout() {
    let args = format!(
        r#"{{"External id": 12, "cmd": "python run.py --hf-token {HF} --lr 3e-4", "password": "hunter2", "token": 1234, "nested": {{"api_key": "abc"}}, "list": ["{GHP}"], "max_tokens": 512}}"#
    );
    let (r, n) = redacted(&args);
    assert_eq!(n, 5, "{r}");
    assert_eq!(
        r,
        r#"{"External id": 12, "cmd": "python run.py --hf-token REDACTED --lr 3e-4", "password": "REDACTED", "token": "REDACTED", "nested": {"api_key": "REDACTED"}, "list": ["REDACTED"], "max_tokens": 512}"#
    );
    serde_json::from_str::<Value>(&r).expect("still JSON");
    // Escapes inside a string stay valid JSON.
    let escaped = format!(r#"{{"msg": "say \"token={HF}\" \\ ok"}}"#);
    let (r, n) = redacted(&escaped);
    assert_eq!(n, 1, "{r}");
    let v: Value = serde_json::from_str(&r).expect("still JSON");
    assert_eq!(v["msg"], r#"say "token=REDACTED" \ ok"#);
}

#[test]
fn look_alikes_stay() {
    for text in [
        "TOKENIZERS_PARALLELISM=false",
        "max_tokens=512",
        r#"{"max_tokens": 512, "tokens_per_second": 1234.5, "num_key_value_heads": 8}"#,
        "key_padding_mask=None",
        "tokens_per_second: 1234",
        "pad_token: <pad>",
        "sort_key=ts",
        "monkey=banana",
        "author=someone",
        "task-abcdefghijklmnopqrstuvwxyz0123",
        "mask-0123456789abcdefghijklmnop",
        "sk-learn-pipeline-for-everything-here",
        "void cub::DeviceCompactInitKernel<cub::ReduceByKeyScanTileState<int, int, true>>",
        "<built-in method keys of dict object at 0x786a0c184a80>",
        "transformers/tokenization_utils_tokenizers.py(779): tokenize",
        "https://huggingface.co/black-forest-labs/FLUX.1-dev",
        "The bearer of news",
        "AKIAIOSFODNN7EXAMPLEX",
        "hf_transfer",
        "aten::scaled_dot_product_attention",
    ] {
        assert_eq!(redacted(text), (text.to_string(), 0), "{text}");
    }
}

#[test]
fn key_names() {
    for k in [
        "HF_TOKEN",
        "hf_token",
        "accessToken",
        "GITHUB_TOKEN",
        "WANDB_API_KEY",
        "apiKey",
        "APIKey",
        "AWS_SECRET_ACCESS_KEY",
        "client_secret",
        "db_password",
        "Authorization",
        "--hf-token",
        "private_key",
        "key",
        "Cookie",
        "HF_TOKEN2",
    ] {
        assert!(is_secret_key(k), "{k}");
    }
    for k in [
        "TOKENIZERS_PARALLELISM",
        "max_tokens",
        "tokens_per_second",
        "key_padding_mask",
        "num_key_value_heads",
        "pad_token",
        "eos_token_id",
        "sort_key",
        "monkey",
        "author",
        "keys",
        "External id",
        "ToKeN",
    ] {
        assert!(!is_secret_key(k), "{k}");
    }
}

/// The literal search decides what the patterns see: a text without any of the literals must
/// be one the patterns leave alone.
#[test]
fn prefilter_misses_nothing_the_patterns_find() {
    let texts = [
        "ToKeN=abc",
        "PaSsWoRd=abc",
        "x=1 y=2",
        "a:b@c",
        "pw=hunter2",
    ];
    for text in texts {
        assert!(!PREFILTER.is_match(text), "{text}");
        let mut n = 0;
        assert_eq!(plain(text, &mut n), text, "{text}");
        assert_eq!(n, 0);
    }
    // Every secret that is found holds a literal.
    for secret in [
        HF,
        GHP,
        PAT,
        SK,
        AWS,
        JWT,
        "Bearer abc123def456",
        "https://a:b@c",
    ] {
        assert!(PREFILTER.is_match(secret), "{secret}");
    }
    for key in [
        "Token",
        "TOKEN",
        "Password",
        "PASSWD",
        "Secret",
        "Credentials",
        "Key",
        "AUTH",
        "Cookie",
        "Passphrase",
    ] {
        assert!(is_secret_key(key) && PREFILTER.is_match(key), "{key}");
    }
}

#[test]
fn metadata_values_and_texts() {
    let mut v = json!({
        "system": {"env": {"HF_TOKEN": HF, "PATH": "/usr/bin",
                           "WANDB_API_KEY": "0123", "MY_PASSWORD": "pw", "NOTE": format!("see {GHP}"),
                           "TOKENIZERS_PARALLELISM": "false"}},
        "keys": ["plain", SK],
        "tokens_seen": 5,
        "command": format!("torchrun train.py --hf_token={HF}"),
        "cuda_runtime_version": 12040
    });
    let n = redact(&mut v);
    assert_eq!(n, 6, "{v}");
    assert_eq!(v["system"]["env"]["HF_TOKEN"], "REDACTED");
    assert_eq!(v["system"]["env"]["PATH"], "/usr/bin");
    assert_eq!(v["system"]["env"]["NOTE"], "see REDACTED");
    assert_eq!(v["system"]["env"]["TOKENIZERS_PARALLELISM"], "false");
    assert_eq!(v["keys"][0], "plain");
    assert_eq!(v["keys"][1], "REDACTED");
    assert_eq!(v["tokens_seen"], 5);
    assert_eq!(v["command"], "torchrun train.py --hf_token=REDACTED");
    assert_eq!(v["cuda_runtime_version"], 12040);
    // Redacting again finds nothing more.
    assert_eq!(redact(&mut v), 0);
}

#[test]
fn batches_lose_their_secrets_and_keep_the_rest() {
    let names: ArrayRef = Arc::new(StringArray::from(vec![
        "gemm".to_string(),
        format!("load {HF}"),
        "relu".to_string(),
    ]));
    let keys = Int32Array::from(vec![0, 1, 1, 2, 0]);
    let dict = Arc::new(DictionaryArray::<Int32Type>::try_new(keys, names.clone()).unwrap());
    let args = Arc::new(StringArray::from(vec![
        Some(r#"{"a": 1}"#.to_string()),
        None,
        Some(format!(r#"{{"token": "abc", "b": "{SK}"}}"#)),
        Some(String::new()),
        Some(r#"{"max_tokens": 5}"#.to_string()),
    ]));
    let schema = Arc::new(Schema::new(vec![
        Field::new("name", dict.data_type().clone(), false),
        Field::new("args", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(schema, vec![dict as ArrayRef, args as ArrayRef]).unwrap();
    let r = Redactor::default();
    let out = r.batch(batch.clone());
    // Two batches sharing the dictionary, and another with the same name: a name is counted
    // once, `args` in each row.
    let again = r.batch(batch.clone());
    let own_names: ArrayRef = Arc::new(StringArray::from(vec![format!("load {HF}")]));
    let own = DictionaryArray::<Int32Type>::try_new(Int32Array::from(vec![0]), own_names).unwrap();
    let own = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            "op",
            own.data_type().clone(),
            true,
        )])),
        vec![Arc::new(own) as ArrayRef],
    )
    .unwrap();
    let own = r.batch(own);
    assert_eq!(r.count(), 1 + 2 + 2, "name once, two in each args");
    let op = own.column(0).as_dictionary::<Int32Type>();
    assert_eq!(op.values().as_string::<i32>().value(0), "load REDACTED");
    for out in [out, again] {
        let names = out.column(0).as_dictionary::<Int32Type>();
        let name = |i: usize| {
            names
                .values()
                .as_string::<i32>()
                .value(names.keys().value(i) as usize)
                .to_string()
        };
        assert_eq!(
            (0..5).map(name).collect::<Vec<_>>(),
            ["gemm", "load REDACTED", "load REDACTED", "relu", "gemm"]
        );
        let args = out.column(1).as_string::<i32>();
        assert_eq!(args.value(0), r#"{"a": 1}"#);
        assert!(args.is_null(1));
        assert_eq!(args.value(2), r#"{"token": "REDACTED", "b": "REDACTED"}"#);
        assert_eq!(args.value(3), "");
        assert_eq!(args.value(4), r#"{"max_tokens": 5}"#);
    }
}

#[test]
fn a_literal_across_two_rows_hides_nothing() {
    // "...k" + "ey=..." spells a literal across the rows; the second row's own secret counts.
    let array = StringArray::from(vec!["monk", format!("ey {HF}").as_str(), "x"]);
    assert_eq!(candidate_rows(&array), vec![1]);
    let sliced = array.slice(1, 2);
    assert_eq!(candidate_rows(&sliced), vec![0]);
}

/// A token glued to what comes before it (a URL-encoded `=`, a word) is still a token where
/// its prefix is one no word has; `sk-` and AWS key ids inside words are not, nor names that
/// only look like a token's prefix.
#[test]
fn distinctive_tokens_glued_to_a_word_are_replaced() {
    for token in [HF, GHP, PAT, JWT] {
        for text in [format!("x{token}"), format!("/api?token%3D{token}&x=1")] {
            let (r, n) = redacted(&text);
            assert!(!r.contains(token), "{text} -> {r}");
            assert_eq!(n, 1, "{text} -> {r}");
        }
    }
    for kept in [
        format!("task{}", &SK[2..]),
        format!("X{AWS}"),
        "void gemm_tf32hf_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa_kernel".to_string(),
        "mha_fwd_hdim128_bf16_hf_rotaryembeddingkernelaaaaaaaaaa".to_string(),
    ] {
        let (r, n) = redacted(&kept);
        assert_eq!((r.as_str(), n), (kept.as_str(), 0));
    }
}

/// A key written with JSON escapes names a secret as its unescaped text does, in JSON and in
/// a text column's prefilter alike.
#[test]
fn json_keys_written_with_escapes_are_read_unescaped() {
    for text in [
        r#"{"pass\u0077ord": "hunter2", "lr": 3}"#,
        r#"{"HF\u005fTOKEN": "abc123", "lr": 3}"#,
        r#"{"cfg": {"\u0061pi_\u006bey": 12345}}"#,
    ] {
        let (r, n) = redacted(text);
        assert_eq!(n, 1, "{text} -> {r}");
        assert!(r.contains(REDACTED), "{r}");
        assert!(
            !r.contains("hunter2") && !r.contains("abc123") && !r.contains("12345"),
            "{r}"
        );
    }
}

/// The prefilter's literals are at least three bytes long: one of two bytes makes the SIMD
/// search's mask shorter and its false candidates many (+4 % of an ingest's instructions).
#[test]
fn prefilter_literals_are_at_least_three_bytes() {
    for literal in PREFILTER_LITERALS {
        assert!(literal.len() >= 3, "{literal:?}");
    }
}
