//! The scenario language of the fake: parses a text script (one command per line, `key=value`
//! arguments, `name="with spaces"`) and plays it against the fake CUPTI state — emitting records
//! into the client's buffers, flushing, dropping, refusing buffers, spawning emitting threads,
//! exiting or dying. The command reference is in `lib.rs`.
//!
//! The whole script is parsed before anything runs, so a typo on the last line fails the run
//! (exit 99) instead of leaving a half-played scenario.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::layout::{consts::*, LayoutSet, RecordBytes};
use crate::state::{self, Counted};

/// Exit code for a bad script (the brief's contract with the tests).
pub const SCRIPT_ERROR: i32 = 99;

#[derive(Debug, Clone)]
enum Val {
    Num(u64),
    Str(Option<String>),
    /// Raw bytes at a field (uuid).
    Bytes(Vec<u8>),
    /// CUpti_ActivityObjectKindId.pt {processId, threadId}.
    Thread(u32, u32),
}

#[derive(Debug, Clone)]
enum Cmd {
    Version(u32),
    Taken(String),
    CallbackName {
        domain: u32,
        cbid: u32,
        name: String,
    },
    Emit {
        what: Counted,
        fields: Vec<(&'static str, Val)>,
        cbid: Option<u32>,
    },
    Flush,
    Drop(u64),
    Refuse(u64),
    Sleep(u64),
    Threads {
        n: u64,
        kernels: u64,
        start: u64,
        stream_base: u64,
    },
    Shuffle,
    /// Prints an environment variable as the application sees it (what the collector set).
    PrintEnv(String),
    Exit(i32),
    Kill,
}

impl Cmd {
    /// Commands that configure what the collector sees at `InitializeInjection` time.
    fn is_setup(&self) -> bool {
        matches!(
            self,
            Cmd::Version(_) | Cmd::Taken(_) | Cmd::CallbackName { .. }
        )
    }
}

/// Splits a line into tokens: whitespace-separated, `"..."` quotes group (and are removed), an
/// unquoted `#` starts a trailing comment.
fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut in_quote, mut had_quote) = (false, false);
    for c in line.chars() {
        match c {
            '"' => {
                in_quote = !in_quote;
                had_quote = true;
            }
            '#' if !in_quote && cur.is_empty() && !had_quote => break,
            c if c.is_whitespace() && !in_quote => {
                if !cur.is_empty() || had_quote {
                    out.push(std::mem::take(&mut cur));
                }
                had_quote = false;
            }
            c => cur.push(c),
        }
    }
    if in_quote {
        return Err("unterminated quote".into());
    }
    if !cur.is_empty() || had_quote {
        out.push(cur);
    }
    Ok(out)
}

/// `key=value` arguments; every key must be consumed, so misspelt keys are errors.
struct Args {
    kv: Vec<(String, String)>,
    used: HashSet<String>,
}

impl Args {
    fn parse(tokens: &[String]) -> Result<Args, String> {
        let mut kv = Vec::new();
        for t in tokens {
            let (k, v) = t
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {t:?}"))?;
            if kv.iter().any(|(k2, _): &(String, String)| k2 == k) {
                return Err(format!("duplicate key {k}"));
            }
            kv.push((k.to_string(), v.to_string()));
        }
        Ok(Args {
            kv,
            used: HashSet::new(),
        })
    }

    fn get(&mut self, key: &str) -> Option<String> {
        let v = self
            .kv
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone());
        if v.is_some() {
            self.used.insert(key.to_string());
        }
        v
    }

    fn num(&mut self, key: &str) -> Result<u64, String> {
        self.get(key).map_or(Ok(0), |v| parse_num(key, &v))
    }

    fn required_num(&mut self, key: &str) -> Result<u64, String> {
        match self.get(key) {
            Some(v) => parse_num(key, &v),
            None => Err(format!("missing {key}=")),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.kv.iter().find(|(k, _)| !self.used.contains(k)) {
            Some((k, _)) => Err(format!("unknown key {k}")),
            None => Ok(()),
        }
    }
}

fn parse_num(key: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .map_err(|_| format!("{key}={v:?} is not a decimal number"))
}

fn u32_of(key: &str, v: u64) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{key}={v} does not fit in 32 bits"))
}

fn triple(key: &str, v: &str) -> Result<[u64; 3], String> {
    let parts: Vec<&str> = v.split(',').collect();
    if parts.len() != 3 {
        return Err(format!("{key}={v:?}: want X,Y,Z"));
    }
    let mut out = [0; 3];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = parse_num(key, p)?;
    }
    Ok(out)
}

fn positional(cmd: &str, rest: &[String]) -> Result<u64, String> {
    match rest {
        [n] => parse_num(cmd, n),
        _ => Err(format!("{cmd} takes exactly one number")),
    }
}

/// Numeric script keys of an emit command and the golden field each fills.
fn numeric_keys(what: Counted) -> &'static [(&'static str, &'static str)] {
    match what {
        Counted::Kernel => &[
            ("start", "start"),
            ("end", "end"),
            ("completed", "completed"),
            ("device", "deviceId"),
            ("context", "contextId"),
            ("stream", "streamId"),
            ("correlation", "correlationId"),
            ("registers", "registersPerThread"),
            ("static_smem", "staticSharedMemory"),
            ("dynamic_smem", "dynamicSharedMemory"),
            ("graph_id", "graphId"),
            ("graph_node", "graphNodeId"),
            ("grid_id", "gridId"),
            ("launch_type", "launchType"),
            ("queued", "queued"),
            ("submitted", "submitted"),
        ],
        Counted::Memcpy => &[
            ("start", "start"),
            ("end", "end"),
            ("device", "deviceId"),
            ("context", "contextId"),
            ("stream", "streamId"),
            ("correlation", "correlationId"),
            ("bytes", "bytes"),
            ("copy_kind", "copyKind"),
            ("src_kind", "srcKind"),
            ("dst_kind", "dstKind"),
            ("flags", "flags"),
            ("graph_node", "graphNodeId"),
            ("graph_id", "graphId"),
        ],
        Counted::Memset => &[
            ("start", "start"),
            ("end", "end"),
            ("device", "deviceId"),
            ("context", "contextId"),
            ("stream", "streamId"),
            ("correlation", "correlationId"),
            ("bytes", "bytes"),
            ("value", "value"),
            ("memory_kind", "memoryKind"),
            ("flags", "flags"),
            ("graph_node", "graphNodeId"),
            ("graph_id", "graphId"),
        ],
        Counted::Runtime | Counted::Driver => &[
            ("start", "start"),
            ("end", "end"),
            ("pid", "processId"),
            ("tid", "threadId"),
            ("correlation", "correlationId"),
            ("return", "returnValue"),
        ],
        Counted::Sync => &[
            ("type", "type"),
            ("start", "start"),
            ("end", "end"),
            ("correlation", "correlationId"),
            ("context", "contextId"),
            ("stream", "streamId"),
            ("event", "cudaEventId"),
        ],
        Counted::ExternalCorrelation => &[
            ("kind", "externalKind"),
            ("id", "externalId"),
            ("correlation", "correlationId"),
        ],
        Counted::Marker => &[("flags", "flags"), ("timestamp", "timestamp"), ("id", "id")],
        Counted::Overhead => &[
            ("kind", "overheadKind"),
            ("object_kind", "objectKind"),
            ("start", "start"),
            ("end", "end"),
            ("correlation", "correlationId"),
        ],
        Counted::Device => &[
            ("id", "id"),
            ("sms", "numMultiprocessors"),
            ("memory", "globalMemorySize"),
        ],
        Counted::Context => &[("id", "contextId"), ("device", "deviceId")],
    }
}

fn parse_emit(what: Counted, rest: &[String]) -> Result<Cmd, String> {
    let mut a = Args::parse(rest)?;
    let mut fields: Vec<(&'static str, Val)> = Vec::new();
    for (key, field) in numeric_keys(what) {
        if let Some(v) = a.get(key) {
            fields.push((field, Val::Num(parse_num(key, &v)?)));
        }
    }
    let mut cbid = None;
    match what {
        Counted::Kernel => {
            for (key, names) in [
                ("grid", ["gridX", "gridY", "gridZ"]),
                ("block", ["blockX", "blockY", "blockZ"]),
            ] {
                if let Some(v) = a.get(key) {
                    for (f, n) in names.into_iter().zip(triple(key, &v)?) {
                        fields.push((f, Val::Num(n)));
                    }
                }
            }
            fields.push(("name", Val::Str(a.get("name"))));
        }
        Counted::Runtime | Counted::Driver => {
            let c = u32_of("cbid", a.required_num("cbid")?)?;
            fields.push(("cbid", Val::Num(c as u64)));
            cbid = Some(c);
        }
        Counted::Marker => {
            fields.push(("objectKind", Val::Num(OBJECT_THREAD as u64)));
            let (pid, tid) = (u32_of("pid", a.num("pid")?)?, u32_of("tid", a.num("tid")?)?);
            fields.push(("objectId", Val::Thread(pid, tid)));
            fields.push(("name", Val::Str(a.get("name"))));
            fields.push(("domain", Val::Str(a.get("domain"))));
        }
        Counted::Overhead => {
            let (pid, tid) = (u32_of("pid", a.num("pid")?)?, u32_of("tid", a.num("tid")?)?);
            fields.push(("objectId", Val::Thread(pid, tid)));
        }
        Counted::Device => {
            fields.push(("name", Val::Str(a.get("name"))));
            if let Some(cc) = a.get("cc") {
                let (maj, min) = cc
                    .split_once('.')
                    .ok_or_else(|| format!("cc={cc:?}: want MAJOR.MINOR"))?;
                fields.push(("computeCapabilityMajor", Val::Num(parse_num("cc", maj)?)));
                fields.push(("computeCapabilityMinor", Val::Num(parse_num("cc", min)?)));
            }
            if let Some(u) = a.get("uuid") {
                fields.push(("uuid", Val::Bytes(parse_uuid(&u)?)));
            }
        }
        _ => {}
    }
    a.finish()?;
    Ok(Cmd::Emit { what, fields, cbid })
}

fn parse_uuid(u: &str) -> Result<Vec<u8>, String> {
    let hex: String = u.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("uuid={u:?}: want 32 hex digits"));
    }
    Ok((0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex"))
        .collect())
}

fn parse_line(tokens: &[String]) -> Result<Cmd, String> {
    let (cmd, rest) = tokens.split_first().expect("non-empty line");
    Ok(match cmd.as_str() {
        "version" => {
            let v = positional(cmd, rest)?;
            let set = u32::try_from(v)
                .ok()
                .and_then(LayoutSet::for_version)
                .ok_or_else(|| format!("version {v}: want 12080, 13000 or 13050"))?;
            Cmd::Version(set.api)
        }
        "subscriber_taken" => match rest {
            [n] => Cmd::Taken(n.strip_prefix("name=").unwrap_or(n).to_string()),
            _ => return Err("subscriber_taken takes one name".into()),
        },
        "callback_name" => {
            let mut a = Args::parse(rest)?;
            let domain = match a.get("domain").as_deref() {
                Some("runtime") => CB_DOMAIN_RUNTIME_API,
                Some("driver") => CB_DOMAIN_DRIVER_API,
                other => return Err(format!("domain={other:?}: want runtime or driver")),
            };
            let cbid = u32_of("cbid", a.required_num("cbid")?)?;
            let name = a.get("name").ok_or("missing name=")?;
            a.finish()?;
            Cmd::CallbackName { domain, cbid, name }
        }
        "kernel" => parse_emit(Counted::Kernel, rest)?,
        "memcpy" => parse_emit(Counted::Memcpy, rest)?,
        "memset" => parse_emit(Counted::Memset, rest)?,
        "runtime" => parse_emit(Counted::Runtime, rest)?,
        "driver" => parse_emit(Counted::Driver, rest)?,
        "sync" => parse_emit(Counted::Sync, rest)?,
        "external_correlation" => parse_emit(Counted::ExternalCorrelation, rest)?,
        "marker" => parse_emit(Counted::Marker, rest)?,
        "overhead" => parse_emit(Counted::Overhead, rest)?,
        "device" => parse_emit(Counted::Device, rest)?,
        "context" => parse_emit(Counted::Context, rest)?,
        "flush" | "shuffle" | "kill" if !rest.is_empty() => {
            return Err(format!("{cmd} takes no arguments"))
        }
        "flush" => Cmd::Flush,
        "shuffle" => Cmd::Shuffle,
        "kill" => Cmd::Kill,
        "drop" => Cmd::Drop(positional(cmd, rest)?),
        "refuse_buffers" => Cmd::Refuse(positional(cmd, rest)?),
        "sleep" => Cmd::Sleep(positional(cmd, rest)?),
        "print_env" => match rest {
            [name] => Cmd::PrintEnv(name.to_string()),
            _ => return Err("print_env NAME".into()),
        },
        "exit" => {
            let c = positional(cmd, rest)?;
            Cmd::Exit(i32::try_from(c).map_err(|_| format!("exit {c}: too large"))?)
        }
        "threads" => {
            let (n, args) = rest.split_first().ok_or("threads N kernels=K ...")?;
            let n = parse_num("threads", n)?;
            let mut a = Args::parse(args)?;
            let kernels = a.required_num("kernels")?;
            let start = a.num("start")?;
            let stream_base = a.num("stream_base")?;
            a.finish()?;
            if n == 0 || n > 1024 {
                return Err(format!("threads {n}: want 1..=1024"));
            }
            Cmd::Threads {
                n,
                kernels,
                start,
                stream_base,
            }
        }
        other => return Err(format!("unknown command {other:?}")),
    })
}

/// Parses a whole script: (line number, command) pairs, or the first error with its line.
fn parse_script(text: &str) -> Result<Vec<(usize, Cmd)>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let tokens = tokenize(line).map_err(|e| (n, e))?;
        if tokens.is_empty() {
            continue;
        }
        out.push((n, parse_line(&tokens).map_err(|e| (n, e))?));
    }
    Ok(out)
}

/// Builds the record of an emit command in the current layout set.
fn build(what: Counted, fields: &[(&'static str, Val)]) -> Result<RecordBytes, String> {
    let set = state::lock().layout();
    let mut r = RecordBytes::new(set, what.rec(), 0);
    for (f, v) in fields {
        match v {
            Val::Num(n) => r.put(f, *n)?,
            Val::Str(None) => {}
            Val::Str(Some(s)) => r.put(f, state::intern(s).as_ptr() as u64)?,
            Val::Bytes(b) => r.put_bytes(f, b)?,
            Val::Thread(pid, tid) => r.put_thread_object(f, *pid, *tid)?,
        }
    }
    Ok(r)
}

/// Correlation ids for `threads`: far above hand-written ones, never reused within a process.
static NEXT_THREAD_CORRELATION: AtomicU32 = AtomicU32::new(1 << 24);

fn run_threads(n: u64, kernels: u64, start: u64, stream_base: u64) -> Result<(), String> {
    let total = u32::try_from(n * kernels).map_err(|_| "threads: too many kernels".to_string())?;
    let base = NEXT_THREAD_CORRELATION.fetch_add(total, Ordering::Relaxed);
    let name = state::intern("_Z10fakeKernelPfi").as_ptr() as u64;
    let pid = std::process::id() as u64;
    let handles: Vec<_> = (0..n)
        .map(|i| {
            std::thread::Builder::new()
                .name(format!("fakecupti-{i}"))
                .spawn(move || -> Result<(), String> {
                    let tid = state::gettid();
                    let stream = stream_base + i;
                    for j in 0..kernels {
                        let corr = (base as u64) + i * kernels + j;
                        // Launch at t, kernel runs [t+800, t+1800): after its launch, increasing.
                        let t = start + j * 2000 + i;
                        let api = [
                            ("cbid", Val::Num(211)),
                            ("start", Val::Num(t)),
                            ("end", Val::Num(t + 500)),
                            ("processId", Val::Num(pid)),
                            ("threadId", Val::Num(tid & 0xffff_ffff)),
                            ("correlationId", Val::Num(corr)),
                        ];
                        state::emit(Counted::Runtime, &build(Counted::Runtime, &api)?, Some(211));
                        let k = [
                            ("start", Val::Num(t + 800)),
                            ("end", Val::Num(t + 1800)),
                            ("completed", Val::Num(t + 1800)),
                            ("deviceId", Val::Num(0)),
                            ("contextId", Val::Num(1)),
                            ("streamId", Val::Num(stream)),
                            ("correlationId", Val::Num(corr)),
                            ("gridX", Val::Num(1)),
                            ("gridY", Val::Num(1)),
                            ("gridZ", Val::Num(1)),
                            ("blockX", Val::Num(128)),
                            ("blockY", Val::Num(1)),
                            ("blockZ", Val::Num(1)),
                            ("registersPerThread", Val::Num(32)),
                            ("name", Val::Num(name)),
                        ];
                        state::emit(Counted::Kernel, &build(Counted::Kernel, &k)?, None);
                    }
                    Ok(())
                })
                .map_err(|e| format!("threads: spawn: {e}"))
        })
        .collect::<Result<_, _>>()?;
    for h in handles {
        h.join()
            .map_err(|_| "threads: a thread panicked".to_string())??;
    }
    Ok(())
}

enum Flow {
    Next,
    Exit(i32),
}

fn exec(cmd: &Cmd) -> Result<Flow, String> {
    match cmd {
        Cmd::Version(api) => state::lock().set_api(*api),
        Cmd::Taken(name) => state::lock().subscriber_taken = Some(name.clone()),
        Cmd::CallbackName { domain, cbid, name } => {
            let c = state::intern(name);
            state::lock().callback_names.insert((*domain, *cbid), c);
        }
        Cmd::Emit { what, fields, cbid } => state::emit(*what, &build(*what, fields)?, *cbid),
        Cmd::Flush => state::flush_all(),
        Cmd::Drop(n) => {
            let mut g = state::lock();
            g.dropped_scripted += n;
            g.dropped_unread += n;
        }
        Cmd::Refuse(n) => state::lock().refuse += n,
        Cmd::Sleep(ms) => std::thread::sleep(std::time::Duration::from_millis(*ms)),
        Cmd::Threads {
            n,
            kernels,
            start,
            stream_base,
        } => run_threads(*n, *kernels, *start, *stream_base)?,
        Cmd::Shuffle => state::lock().shuffle = true,
        Cmd::PrintEnv(name) => eprintln!(
            "fakecupti: {name}={}",
            std::env::var(name).unwrap_or_default()
        ),
        Cmd::Exit(c) => return Ok(Flow::Exit(*c)),
        Cmd::Kill => {
            write_report("kill");
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    }
    Ok(Flow::Next)
}

/// Writes the report JSON to `$GPUQ_FAKE_CUPTI_REPORT` if set (errors go to stderr only).
pub fn write_report(phase: &str) {
    write_report_json(|| Some(state::lock().report_json(phase)));
}

/// Writes `json()` to `$GPUQ_FAKE_CUPTI_REPORT` if that is set and `json` yields something.
pub fn write_report_json(json: impl FnOnce() -> Option<String>) {
    if let Some(path) = std::env::var_os("GPUQ_FAKE_CUPTI_REPORT").filter(|p| !p.is_empty()) {
        let Some(json) = json() else { return };
        if let Err(e) = std::fs::write(&path, json + "\n") {
            eprintln!(
                "fakecupti: cannot write report {}: {e}",
                path.to_string_lossy()
            );
        }
    }
}

fn load(path: &str) -> Result<Vec<(usize, Cmd)>, i32> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        eprintln!("fakecupti: cannot read script {path}: {e}");
        SCRIPT_ERROR
    })?;
    parse_script(&text).map_err(|(n, e)| {
        eprintln!("fakecupti: script line {n}: {e}");
        SCRIPT_ERROR
    })
}

/// Applies the leading setup commands (`version`, `subscriber_taken`, `callback_name`) only, so a
/// harness can configure what `InitializeInjection` will see before calling it.
pub fn prepare(path: &str) -> i32 {
    let cmds = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    for (_, c) in cmds.iter().take_while(|(_, c)| c.is_setup()) {
        let _ = exec(c);
    }
    0
}

/// Plays a script; returns the exit code the harness should use.
pub fn play(path: &str) -> i32 {
    state::lock().played = true;
    let cmds = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut code = 0;
    for (n, c) in &cmds {
        match exec(c) {
            Ok(Flow::Next) => {}
            Ok(Flow::Exit(c)) => {
                code = c;
                break;
            }
            Err(e) => {
                eprintln!("fakecupti: script line {n}: {e}");
                code = SCRIPT_ERROR;
                break;
            }
        }
    }
    write_report("play_end");
    code
}

#[cfg(test)]
pub(crate) fn parse_for_test(text: &str) -> Result<usize, (usize, String)> {
    parse_script(text).map(|c| c.len())
}

#[cfg(test)]
pub(crate) fn tokenize_for_test(line: &str) -> Result<Vec<String>, String> {
    tokenize(line)
}
