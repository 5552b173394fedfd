//! Secrets planted in every place a trace, a stage log, a tag or a file name can carry them
//! never reach the store or what gpuq prints: each is replaced with `REDACTED` before
//! anything is written, and the runs say how many were. The real `gpuq` binary, in temporary
//! directories.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{generate_nsys, gpuq, ok, query_csv, repo_file, stderr, stdout};

/// One secret per place, each of another kind.
const FILE_NAME: &str = "hf_FileNameSecret0123456789abcd";
const ARGS_TOKEN: &str = "ghp_ArgsSecret0123456789abcdefghijklmn";
const ARGS_KEY_VALUE: &str = "argsKeyValue77";
const ARGS_AWS: &str = "AKIAARGSSECRET012345";
const KERNEL_NAME: &str = "sk-NameSecret0123456789abcdefgh";
const ANNOTATION_BEARER: &str = "AnnotBearer0123456789";
const OP_URL_PASSWORD: &str = "UrlPassw0rd";
const META_PASSWORD: &str = "MetaPassw0rd";
const META_TOKEN: &str = "hf_MetaSecret0123456789abcdefgh";
const META_JWT: &str = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtZXRhIn0.c2lnbmF0dXJlMDEyMzQ1";
const TAG_VALUE: &str = "TagValueSecret99";
const TAG_TOKEN: &str = "github_pat_TagSecret0123456789abcdefgh";
const STAGE_PASSWORD: &str = "StagePassw0rd";
const STAGE_TOKEN: &str = "sk-StageSecret0123456789abcdef";
const STAGE_NAME: &str = "xoxb-1234567890-StageName";
const NSYS_KERNEL: &str = "glpat-NsysKernelSecret0123";
const NSYS_NVTX: &str = "NvtxSecretValue42";
const NSYS_URL_PASSWORD: &str = "NsysUrlPassw0rd";
const ROCPROF_KERNEL: &str = "hf_RocprofSecret0123456789abc";
const ROCPROF_MARKER: &str = "AKIAROCPROFSECRETS12";
const DIR_NAME: &str = "ghs_DirSecret0123456789abcdefg";

const SECRETS: &[&str] = &[
    FILE_NAME,
    ARGS_TOKEN,
    ARGS_KEY_VALUE,
    ARGS_AWS,
    KERNEL_NAME,
    ANNOTATION_BEARER,
    OP_URL_PASSWORD,
    META_PASSWORD,
    META_TOKEN,
    META_JWT,
    TAG_VALUE,
    TAG_TOKEN,
    STAGE_PASSWORD,
    STAGE_TOKEN,
    STAGE_NAME,
    NSYS_KERNEL,
    NSYS_NVTX,
    NSYS_URL_PASSWORD,
    ROCPROF_KERNEL,
    ROCPROF_MARKER,
    DIR_NAME,
];

/// A Kineto trace with secrets in its metadata, operator and annotation names, a kernel name
/// and event `args`, beside look-alikes that must stay.
fn kineto_trace(path: &Path) {
    let trace = format!(
        r###"{{"schemaVersion": 1,
  "run_config": {{"command": "torchrun train.py --password {META_PASSWORD} --lr 3e-4",
                  "HF_TOKEN": "{META_TOKEN}", "note": "sent {META_JWT}",
                  "TOKENIZERS_PARALLELISM": "false"}},
  "deviceProperties": [{{"id": 0, "name": "NVIDIA H100 80GB HBM3"}}],
  "traceEvents": [
  {{"ph": "X", "cat": "user_annotation", "name": "## forward Bearer {ANNOTATION_BEARER} ##", "pid": 1, "tid": 1, "ts": 100, "dur": 100}},
  {{"ph": "X", "cat": "cpu_op", "name": "load https://alice:{OP_URL_PASSWORD}@hub.example.com/m", "pid": 1, "tid": 1, "ts": 110, "dur": 50,
    "args": {{"External id": 1, "Concrete Inputs": ["", "login --token {ARGS_TOKEN}"], "api_key": "{ARGS_KEY_VALUE}", "max_tokens": 512}}}},
  {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 120, "dur": 5,
    "args": {{"correlation": 7, "note": "key id {ARGS_AWS}"}}}},
  {{"ph": "X", "cat": "kernel", "name": "gemm_{KERNEL_NAME}", "pid": 0, "tid": 7, "ts": 130, "dur": 10,
    "args": {{"device": 0, "stream": 7, "correlation": 7}}}}
]}}"###
    );
    std::fs::write(path, trace).unwrap();
}

/// A generated Nsight Systems export with secrets in its kernel names, NVTX range texts and
/// export metadata.
fn nsys_export(path: &Path) {
    generate_nsys(path);
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(&format!(
        "UPDATE StringIds SET value = value || ' {NSYS_KERNEL}'
           WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL
                        UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL);
         UPDATE StringIds SET value = value || ' token={NSYS_NVTX}'
           WHERE id IN (SELECT textId FROM NVTX_EVENTS);
         UPDATE NVTX_EVENTS SET text = text || ' token={NSYS_NVTX}' WHERE text IS NOT NULL;
         INSERT INTO META_DATA_EXPORT (name, value)
           VALUES ('ExportCommand', 'nsys export --url https://u:{NSYS_URL_PASSWORD}@host/x');"
    ))
    .unwrap();
}

/// The rocprofv3 fixture, copied to `dir` with secrets in a kernel name and a marker name.
fn rocprof_output(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let fixture = repo_file("ingest/fixtures/rocprof/modern");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace(
                "\"early_kernel\"",
                &format!("\"early_kernel {ROCPROF_KERNEL}\""),
            )
            .replace(
                "\"checkpoint\"",
                &format!("\"checkpoint {ROCPROF_MARKER}\""),
            );
        std::fs::write(dir.join(path.file_name().unwrap()), text).unwrap();
    }
}

/// A stage log with secrets in a stage name and in the fields that go to `args`.
fn stage_log(path: &Path) {
    std::fs::write(
        path,
        format!(
            "2026-12-02T10:00:00Z stage=\"load {STAGE_NAME}\" begin password={STAGE_PASSWORD} note={STAGE_TOKEN}\n\
             2026-12-02T10:00:02Z stage=\"load {STAGE_NAME}\" end max_tokens=512\n"
        ),
    )
    .unwrap();
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn leaked<'a>(text: &str) -> Vec<&'a str> {
    SECRETS
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect()
}

fn printed(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

#[test]
fn secrets_in_every_place_are_redacted_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let kineto = dir.path().join(format!("job_{FILE_NAME}.json"));
    kineto_trace(&kineto);
    let nsys = dir.path().join("capture.sqlite");
    nsys_export(&nsys);
    let rocprof = dir.path().join(format!("rocprof_{DIR_NAME}"));
    rocprof_output(&rocprof);
    let log = dir.path().join("stages.log");
    stage_log(&log);

    let mut output = String::new();
    let tag_value = format!("hf_token={TAG_VALUE}");
    let tag_token = format!("note=see {TAG_TOKEN}");
    // Run names from the file and directory names; tags on the Kineto run.
    for args in [
        vec![
            "ingest",
            kineto.to_str().unwrap(),
            "--tag",
            &tag_value,
            "--tag",
            &tag_token,
        ],
        vec!["ingest", nsys.to_str().unwrap(), "--run", "nsys"],
        vec!["ingest", rocprof.to_str().unwrap()],
        vec!["ingest", log.to_str().unwrap(), "--run", "stages"],
    ] {
        let o = gpuq(&store, &args);
        assert!(o.status.success(), "{args:?}: {}", printed(&o));
        output += &printed(&o);
    }
    // What gpuq shows: every row and column of every table, decompressed by queries.
    for sql in [
        "SELECT * FROM events",
        "SELECT * FROM counters",
        "SELECT * FROM runs",
    ] {
        output += &query_csv(&store, sql);
    }
    output += &ok(&store, &["runs"]);
    assert_eq!(leaked(&output), Vec::<&str>::new(), "{output}");
    // The store's bytes: manifests, Parquet (pages and statistics), anything else.
    for file in files(&store) {
        let bytes = std::fs::read(&file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(leaked(&text), Vec::<&str>::new(), "{}", file.display());
    }

    // Where they were, REDACTED is; look-alikes stay as written.
    let runs = query_csv(&store, "SELECT run FROM runs ORDER BY run");
    assert_eq!(
        runs, "run\njob_REDACTED\nnsys\nrocprof_REDACTED\nstages\n",
        "{runs}"
    );
    let q = |sql: &str| query_csv(&store, sql);
    assert_eq!(
        q("SELECT name FROM kernels WHERE run = 'job_REDACTED'"),
        "name\ngemm_REDACTED\n"
    );
    let args = q("SELECT args FROM cpu_ops WHERE run = 'job_REDACTED'");
    assert!(args.contains("login --token REDACTED"), "{args}");
    assert!(args.contains("api_key\"\": \"\"REDACTED"), "{args}");
    assert!(args.contains("max_tokens\"\": 512"), "{args}");
    let meta = q("SELECT metadata, tags FROM runs WHERE run = 'job_REDACTED'");
    assert!(meta.contains("--password REDACTED --lr 3e-4"), "{meta}");
    assert!(
        meta.contains("TOKENIZERS_PARALLELISM\"\":\"\"false"),
        "{meta}"
    );
    assert!(
        meta.contains("hf_token") && meta.contains("see REDACTED"),
        "{meta}"
    );
    let stage_args = q("SELECT name, args FROM annotations WHERE run = 'stages'");
    assert!(stage_args.contains("load REDACTED"), "{stage_args}");
    assert!(
        stage_args.contains("password") && stage_args.contains("note"),
        "{stage_args}"
    );
    // How many: in the runs' warnings and the ingest summary.
    let counted = q(
        "SELECT run, json_get_int(warning_details, 'secrets redacted (replaced by REDACTED before storing)') AS n \
         FROM runs ORDER BY run",
    );
    let counts: Vec<(String, i64)> = counted
        .lines()
        .skip(1)
        .map(|l| {
            let (run, n) = l.split_once(',').unwrap();
            (run.to_string(), n.parse().unwrap_or(0))
        })
        .collect();
    assert!(
        counts.iter().all(|(_, n)| *n > 0),
        "every run had secrets: {counted}"
    );
    // Kineto: file name in the path, 2 in args, AWS key, kernel, annotation, URL, 3 metadata,
    // 2 tags.
    assert_eq!(counts[0], ("job_REDACTED".to_string(), 12), "{counted}");
    assert!(
        output.contains("warning: 12 secrets redacted (replaced by REDACTED before storing)"),
        "{output}"
    );
}

/// Errors name their file; its path's secrets are redacted there too.
#[test]
fn errors_do_not_print_secrets_in_paths() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let bad = dir.path().join(format!("bad_{FILE_NAME}.json"));
    std::fs::write(&bad, "{\"traceEvents\": [{\"ph\": ").unwrap();
    let o = gpuq(&store, &["ingest", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad_REDACTED.json"), "{}", stderr(&o));
    assert!(!printed(&o).contains(FILE_NAME), "{}", printed(&o));
}

/// `gpuq runs tag` redacts like ingest's `--tag`.
#[test]
fn tags_set_later_are_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let trace = dir.path().join("t.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": {"device": 0, "stream": 7}}]}"#,
    )
    .unwrap();
    ok(
        &store,
        &["ingest", "-q", trace.to_str().unwrap(), "--run", "r"],
    );
    let api_key = format!("wandb_api_key={TAG_VALUE}");
    let url = format!("repo=https://bob:{TAG_VALUE}@git.example.com/x");
    ok(
        &store,
        &["runs", "tag", "r", &api_key, &url, "max_tokens=512"],
    );
    let tags = query_csv(&store, "SELECT tags FROM runs");
    assert!(!tags.contains(TAG_VALUE), "{tags}");
    assert!(
        tags.contains("wandb_api_key") && tags.contains("https://REDACTED@git.example.com/x"),
        "{tags}"
    );
    assert!(tags.contains("512"), "{tags}");
}
