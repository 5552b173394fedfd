//! `gpuq report` through the binary: the page is self-contained (no network reference), its
//! figures are the SQL functions' own (checked through the exact values the page carries), a
//! comparison against a baseline lists what changed, and the sections of analyses a run holds
//! no data for are left out.

mod common;

use common::{gpuq, kineto_with_kernels, ok, query_csv, stderr};
use std::path::Path;
use std::process::Command;

fn generate(dir: &Path, name: &str, seed: &str) -> String {
    let f = dir.join(name);
    let o = Command::new(env!("CARGO_BIN_EXE_gpuq"))
        .args([
            "generate",
            f.to_str().unwrap(),
            "--steps",
            "6",
            "--seed",
            seed,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    f.to_str().unwrap().to_string()
}

/// The page from `marker` to the next section.
fn section_of<'a>(html: &'a str, marker: &str) -> &'a str {
    let start = html.find(marker).expect("section present");
    let section = &html[start..];
    let end = section[1..]
        .find("<section")
        .map_or(section.len(), |e| e + 1);
    &section[..end]
}

/// The values of attribute `name` in `html`, in order.
fn attr_values<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    html.split(&format!(" {name}=\""))
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect()
}

/// The values that follow each `prefix` (up to the next quote) in `html`, in order.
fn values_after<'a>(html: &'a str, prefix: &str) -> Vec<&'a str> {
    html.split(prefix)
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect()
}

/// A query's rows (the header left out).
fn csv_rows(store: &Path, sql: &str) -> Vec<String> {
    query_csv(store, sql)
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// The ids of the page's sections, in order.
fn section_ids(html: &str) -> Vec<&str> {
    values_after(html, "<section id=\"")
}

/// The `data-ns` values of the page's elements whose text follows `marker`, in order.
fn data_ns_after<'a>(html: &'a str, marker: &str) -> Vec<&'a str> {
    let start = html.find(marker).expect("section present");
    let section = &html[start..];
    let end = section[1..]
        .find("<section")
        .map_or(section.len(), |e| e + 1);
    section[..end]
        .split("data-ns=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect()
}

#[test]
fn a_report_is_one_offline_page_whose_figures_are_the_sql_functions() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = generate(dir.path(), "a.json", "1");
    let b = generate(dir.path(), "b.json", "2");
    ok(&store, &["ingest", "-q", &a, "--run", "base"]);
    ok(&store, &["ingest", "-q", &b, "--run", "new"]);
    let out = dir.path().join("r.html");
    let o = gpuq(
        &store,
        &["report", "new", "--vs", "base", "-o", out.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    // Self-contained: nothing fetched from anywhere.
    for bad in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "href=\"//",
        "@import",
        "url(",
    ] {
        assert!(!html.contains(bad), "{bad}");
    }
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    // Top kernels: each total is top_kernels' total, in order.
    let want: Vec<String> = query_csv(&store, "select total from top_kernels('new', 15)")
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect();
    let top = data_ns_after(&html, "<section id=\"top\"");
    // Per row: total, then avg.
    let totals: Vec<&str> = top.iter().step_by(2).take(want.len()).copied().collect();
    assert_eq!(totals, want);
    // The breakdown's wall and idle share per device.
    let bd = query_csv(
        &store,
        "select wall, idle_pct from breakdown('new') order by rank, device",
    );
    let first = bd.lines().nth(1).unwrap();
    let (wall, idle_pct) = first.split_once(',').unwrap();
    let section = &html[html.find("<section id=\"breakdown\"").unwrap()..];
    assert!(
        section.contains(&format!("data-ns=\"{wall}\"")),
        "wall {wall}"
    );
    assert!(
        section.contains(&format!("class=\"idle-pct\" data-value=\"{idle_pct}\"")),
        "idle {idle_pct}"
    );
    // One bar per step, each the step's duration.
    let steps: Vec<String> = query_csv(
        &store,
        "select dur from step_stats('new') order by rank, step",
    )
    .lines()
    .skip(1)
    .map(str::to_string)
    .collect();
    let bars: Vec<&str> = html
        .split("<g class=\"step")
        .skip(1)
        .map(|s| {
            let at = s.find("data-ns=\"").unwrap() + 9;
            &s[at..at + s[at..].find('"').unwrap()]
        })
        .collect();
    assert_eq!(bars, steps);
    // Idle gaps by cause sum to gpu_gaps' total.
    let gaps = query_csv(&store, "select sum(dur) from gpu_gaps('new', 0)");
    let gap_total: i64 = gaps.lines().nth(1).unwrap().parse().unwrap();
    let shown: i64 = data_ns_after(&html, "<section id=\"gaps\"")
        .iter()
        .map(|v| v.parse::<i64>().unwrap())
        .sum();
    assert_eq!(shown, gap_total);
    // Every finding's title, and the comparison section.
    for title in query_csv(&store, "select title from findings('new')")
        .lines()
        .skip(1)
    {
        let title = title.trim_matches('"').replace("\"\"", "\"");
        let escaped = title
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&#39;");
        assert!(html.contains(&escaped), "finding {title}");
    }
    assert!(html.contains("<section id=\"compare\"><h2>Against base</h2>"));
    // The utilisation strip: each cell is gpu_util's chunk, in order.
    let want: Vec<String> = query_csv(
        &store,
        "select in_use_pct from gpu_util('new', 100) order by rank, device, ts",
    )
    .lines()
    .skip(1)
    .map(str::to_string)
    .collect();
    let strip = section_of(&html, "<section id=\"utilisation\"");
    let cells: Vec<&str> = attr_values(strip, "data-value");
    assert_eq!(cells.len(), want.len());
    for (c, w) in cells.iter().zip(&want) {
        let (c, w): (f64, f64) = (c.parse().unwrap(), w.parse().unwrap());
        assert!((c - w).abs() < 1e-9, "{c} vs {w}");
    }
    // The timeline: its bars hold every GPU operation of its window once (merged bars say
    // how many), with their time clipped to the window.
    let tl = section_of(&html, "<section id=\"timeline\"");
    let svg = &tl[tl.find("<svg id=\"timeline-svg\"").unwrap()..];
    let svg = &svg[..svg.find('>').unwrap()];
    let lo: i64 = attr_values(svg, "data-lo")[0].parse().unwrap();
    let ns: i64 = attr_values(svg, "data-ns")[0].parse().unwrap();
    let hi = lo + ns;
    let ops: Vec<(i64, i64)> = tl
        .split("<rect class=\"o ")
        .skip(1)
        .map(|r| {
            let r = &r[..r.find("/>").unwrap()];
            (
                attr_values(r, "data-n")[0].parse().unwrap(),
                attr_values(r, "data-b")[0].parse().unwrap(),
            )
        })
        .collect();
    let want = query_csv(
        &store,
        &format!(
            "select count(*), sum(least(ts + dur, {hi}) - greatest(ts, {lo})) from events where run = 'new' \
             and kind in ('kernel', 'memcpy', 'memset') and ts + dur >= {lo} and ts < {hi}"
        ),
    );
    let (n, busy) = want.lines().nth(1).unwrap().split_once(',').unwrap();
    assert_eq!(ops.iter().map(|o| o.0).sum::<i64>().to_string(), n);
    assert_eq!(ops.iter().map(|o| o.1).sum::<i64>().to_string(), busy);
    assert!(tl.contains("the slowest step"), "window label");
    // Findings point at their moment, with a link into the timeline where it shows.
    let at = query_csv(
        &store,
        "select at_ts from findings('new') where at_ts is not null",
    );
    for ts in at.lines().skip(1) {
        assert!(
            html.contains(&format!("data-at-ts=\"{ts}\"")),
            "finding at {ts}"
        );
    }
    assert!(html.contains("document.body.dataset.rendered='ok'"));
    analyses_sections(&store, &html);
    // With a step range, the sections follow it.
    let first: i64 = csv_rows(&store, "select min(step) from step_stats('new')")[0]
        .parse()
        .unwrap();
    let range = format!("{first}..{}", first + 1);
    let part = dir.path().join("part.html");
    ok(
        &store,
        &[
            "report",
            "new",
            "--steps",
            &range,
            "-o",
            part.to_str().unwrap(),
        ],
    );
    let part = std::fs::read_to_string(&part).unwrap();
    let memory = section_of(&part, "<section id=\"memory\"");
    assert_eq!(
        values_after(memory, "class=\"n peak\" data-value=\""),
        csv_rows(
            &store,
            &format!(
                "select peak_allocated from memory_usage('new', '{range}') where step is null \
                 order by rank, device"
            )
        )
    );
    assert_eq!(values_after(memory, "<g class=\"mstep\"").len(), 2);
    // A missing run is an error that writes nothing.
    let none = dir.path().join("none.html");
    let o = gpuq(&store, &["report", "nope", "-o", none.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(!none.exists());
}

/// The sections of the newer analyses on the generated run (allocator events with totals, an
/// 8-rank all-reduce, module ranges, bf16 and fp32 kernels, launch calls; no serving markers):
/// each figure is its SQL function's.
fn analyses_sections(store: &Path, html: &str) {
    let ids = section_ids(html);
    for id in ["precision", "modules", "collectives", "memory", "overhead"] {
        assert!(ids.contains(&id), "section {id} in {ids:?}");
    }
    assert!(!ids.contains(&"phases"), "no serving markers: {ids:?}");
    assert!(
        !html.contains("id=\"not-recorded\""),
        "everything is recorded"
    );
    // Memory: the peak per device, then each step's peak.
    let memory = section_of(html, "<section id=\"memory\"");
    let peaks = csv_rows(
        store,
        "select peak_allocated from memory_usage('new') where step is null order by rank, device",
    );
    assert!(!peaks.is_empty());
    assert_eq!(
        values_after(memory, "class=\"n peak\" data-value=\""),
        peaks
    );
    let steps = csv_rows(
        store,
        "select step, peak_allocated from memory_usage('new') where step is not null \
         and device is not null order by rank, device, step",
    );
    let bars: Vec<String> = memory
        .split("<g class=\"mstep\"")
        .skip(1)
        .map(|g| {
            let g = &g[..g.find('>').unwrap()];
            format!(
                "{},{}",
                attr_values(g, "data-step")[0],
                attr_values(g, "data-value")[0]
            )
        })
        .collect();
    assert_eq!(bars, steps);
    // Collectives: per kind its kernels, total time and bytes.
    let collectives = section_of(html, "<section id=\"collectives\"");
    let want = csv_rows(
        store,
        "select count(*), sum(dur), sum(bytes) from collectives('new') \
         group by coalesce(collective, name), algorithm, protocol, group_size order by sum(dur) desc",
    );
    let rows: Vec<String> = collectives
        .split("<tr class=\"coll\">")
        .skip(1)
        .map(|r| {
            let values = attr_values(r, "data-value");
            format!(
                "{},{},{}",
                values[1],
                attr_values(r, "data-ns")[0],
                values[2]
            )
        })
        .collect();
    assert!(!want.is_empty());
    assert_eq!(rows, want);
    assert!(collectives.contains("allreduce"));
    // Precision: time per precision in the bar, then the fp32 and fp64 kernels.
    let precision = section_of(html, "<section id=\"precision\"");
    let bar = &precision[..precision.find("</div></div>").unwrap()];
    let want = csv_rows(
        store,
        "select sum(gpu_time) from precision('new') group by coalesce(dtype, 'unknown') \
         order by sum(gpu_time) desc, coalesce(dtype, 'unknown')",
    );
    assert_eq!(attr_values(bar, "data-ns"), want);
    assert!(bar.contains("bf16") && bar.contains("fp32"), "{bar}");
    let table = &precision[precision.find("<table").unwrap()..];
    let want = csv_rows(
        store,
        "select gpu_time from precision('new') where dtype in ('fp32', 'fp64') \
         order by gpu_time desc, name limit 10",
    );
    assert_eq!(attr_values(table, "data-ns"), want);
    // Modules: the bar adds up to the run's kernel time; the table is the rows with most time.
    let modules = section_of(html, "<section id=\"modules\"");
    let (bar, table) = modules.split_at(modules.find("<table").unwrap());
    let total: i64 = csv_rows(store, "select sum(gpu_time) from module_breakdown('new')")[0]
        .parse()
        .unwrap();
    let shown: i64 = attr_values(bar, "data-ns")
        .iter()
        .map(|v| v.parse::<i64>().unwrap())
        .sum();
    assert_eq!(shown, total);
    let want = csv_rows(
        store,
        "select gpu_time from module_breakdown('new') order by gpu_time desc, module, pass limit 10",
    );
    assert_eq!(attr_values(table, "data-ns"), want);
    assert!(table.contains("GPT_0"));
    // Overhead: each launch API's median call.
    let overhead = section_of(html, "<section id=\"overhead\"");
    let want = csv_rows(
        store,
        "select med from profiler_overhead('new') where kind = 'launch_calls' \
         order by rank, total desc, name",
    );
    let shown = values_after(overhead, "class=\"launch-med\" data-value=\"");
    assert_eq!(shown.len(), want.len());
    for (s, w) in shown.iter().zip(&want) {
        assert_eq!(s.parse::<f64>().unwrap(), w.parse::<f64>().unwrap());
    }
}

/// A serving engine's steps: a prefill, then decode steps of 4 requests, each marker around
/// two launches whose kernels run on after it.
fn serving_trace(path: &Path) {
    let mut events = Vec::new();
    let mut correlation = 0;
    for i in 0..6i64 {
        let ts = 1000 + 1000 * i;
        let name = if i == 0 {
            "step[EXTEND bs=2 toks=512]"
        } else {
            "step[DECODE bs=4]"
        };
        events.push(format!(
            r#"{{"ph": "X", "cat": "user_annotation", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": 50}}"#
        ));
        for k in 0..2 {
            correlation += 1;
            events.push(format!(
                r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {}, "dur": 5, "args": {{"correlation": {correlation}}}}}"#,
                ts + 10 + 15 * k
            ));
            events.push(format!(
                r#"{{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": {}, "dur": {}, "args": {{"device": 0, "stream": 7, "correlation": {correlation}}}}}"#,
                ts + 20 + 100 * k + i,
                90 + 3 * i
            ));
        }
    }
    std::fs::write(
        path,
        format!(r#"{{"traceEvents": [{}]}}"#, events.join(",\n")),
    )
    .unwrap();
}

#[test]
fn sections_without_data_are_left_out_and_serving_steps_show_their_phases() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // Kernels alone: no allocator events, collectives, markers, modules, known precision or
    // launch calls.
    let bare = dir.path().join("bare.json");
    kineto_with_kernels(&bare, &["gemm", "my_kernel"]);
    ok(
        &store,
        &["ingest", "-q", bare.to_str().unwrap(), "--run", "bare"],
    );
    let out = dir.path().join("bare.html");
    ok(&store, &["report", "bare", "-o", out.to_str().unwrap()]);
    let html = std::fs::read_to_string(&out).unwrap();
    let ids = section_ids(&html);
    for id in [
        "memory",
        "collectives",
        "phases",
        "modules",
        "precision",
        "overhead",
    ] {
        assert!(!ids.contains(&id), "section {id} in {ids:?}");
    }
    for id in ["facts", "breakdown", "top", "findings"] {
        assert!(ids.contains(&id), "section {id} missing from {ids:?}");
    }
    // One muted line says what to record.
    let facts = section_of(&html, "<section id=\"facts\"");
    assert!(
        facts.contains("id=\"not-recorded\"")
            && facts.contains("torch.profiler.profile(profile_memory=True)")
            && facts.contains("with_stack=True"),
        "{facts}"
    );
    // Serving steps: per phase the steady steps' median latency and time per token, then each
    // step's latency.
    let serve = dir.path().join("serve.json");
    serving_trace(&serve);
    ok(
        &store,
        &["ingest", "-q", serve.to_str().unwrap(), "--run", "serve"],
    );
    let out = dir.path().join("serve.html");
    ok(&store, &["report", "serve", "-o", out.to_str().unwrap()]);
    let html = std::fs::read_to_string(&out).unwrap();
    let phases = section_of(&html, "<section id=\"phases\"");
    let want = csv_rows(
        &store,
        "select phase, count(*), cast(median(latency) as bigint), \
         cast(sum(latency) / sum(tokens) as bigint) from inference_phases('serve') \
         where coalesce(steady, true) group by phase order by phase",
    );
    assert_eq!(want.len(), 2, "{want:?}");
    let rows: Vec<String> = phases
        .split("<tr class=\"phase\"")
        .skip(1)
        .map(|r| {
            let r = &r[..r.find("</tr>").unwrap()];
            let ns = attr_values(r, "data-ns");
            format!(
                "{},{},{},{}",
                attr_values(r, "data-phase")[0],
                attr_values(r, "data-value")[0],
                ns[0],
                ns[1]
            )
        })
        .collect();
    assert_eq!(rows, want);
    let latencies: Vec<String> = phases
        .split("<tr class=\"pstep\"")
        .skip(1)
        .map(|r| attr_values(r, "data-ns")[0].to_string())
        .collect();
    assert_eq!(
        latencies,
        csv_rows(
            &store,
            "select latency from inference_phases('serve') order by rank, ts"
        )
    );
}

/// A headless Chromium (Debian's `chromium-headless-shell` or `chromium`); when missing the
/// browser test is skipped (saying so) unless `GPUQ_REQUIRE_BROWSER=1`, as CI sets.
fn browser() -> Option<&'static str> {
    let found = ["chromium-headless-shell", "chromium"]
        .into_iter()
        .find(|b| {
            Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        assert!(
            std::env::var("GPUQ_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "GPUQ_REQUIRE_BROWSER=1 but no chromium-headless-shell or chromium"
        );
        eprintln!("skipped: no headless Chromium (apt-get install chromium-headless-shell)");
    }
    found
}

#[test]
fn the_report_renders_in_a_headless_browser_without_the_network() {
    let Some(chrome) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let a = generate(dir.path(), "a.json", "1");
    ok(&store, &["ingest", "-q", &a, "--run", "r"]);
    let page = dir.path().join("r.html");
    ok(&store, &["report", "r", "-o", page.to_str().unwrap()]);
    let url = format!("file://{}", page.display());
    // Every host resolves to nothing: a request for anything off the page would fail, and
    // the page's script would not finish (it marks the body when it ran without error).
    let common = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--virtual-time-budget=3000",
    ];
    let dom = Command::new(chrome)
        .args(common)
        .args(["--dump-dom", &url])
        .output()
        .unwrap();
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("data-rendered=\"ok\""),
        "the page's script did not run"
    );
    let top = query_csv(&store, "select total from top_kernels('r', 1)");
    let total = top.lines().nth(1).unwrap();
    assert!(dom.contains(&format!("data-ns=\"{total}\"")));
    // The timeline zooms to the part an address names (ms after its window's start).
    assert!(
        dom.contains("data-view=\"0-"),
        "the timeline's script did not run"
    );
    let zoomed = Command::new(chrome)
        .args(common)
        .args(["--dump-dom", &format!("{url}#t=0.5-1.5")])
        .output()
        .unwrap();
    let zoomed = String::from_utf8_lossy(&zoomed.stdout);
    assert!(
        zoomed.contains("data-view=\"500000-1500000\""),
        "zoom by address: {}",
        &zoomed[zoomed.find("timeline-svg").unwrap_or(0)..][..300.min(zoomed.len())]
    );
    assert!(zoomed.contains("data-rendered=\"ok\""));
    let shot = dir.path().join("r.png");
    let o = Command::new(chrome)
        .args(common)
        .args(["--window-size=1200,1600", "--hide-scrollbars"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
}
