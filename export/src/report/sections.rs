//! The report's sections for the analyses a run may or may not hold data for: GPU time per
//! `nn.Module` (`module_breakdown`), per precision (`precision`), serving phases
//! (`inference_phases`), collectives (`collectives`), the allocator's memory (`memory_usage`)
//! and what the profiler cost (`profiler_overhead`).
//!
//! Each is `None` when it would have nothing to say (no module ranges, no serving markers, no
//! communication kernels, no allocator events...) or when its analysis fails (a run without
//! steps, say): the page leaves it out rather than show an empty section or fail. Each lists
//! a bounded number of rows, so that the page stays small on any run.

use super::{esc, human_ns, query, stacked_bar, Table, PALETTE};
use datafusion::execution::context::SessionContext;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Rows a section's table lists at most (modules, collective kinds, fp32/fp64 kernels).
const MAX_ROWS: usize = 10;
/// Steps a per-step chart or table shows at most.
const MAX_STEPS: usize = 50;
/// Devices (memory) or ranks (overhead, phases) shown at most.
const MAX_DEVICES: usize = 16;
/// Devices whose per-step memory is drawn.
const MAX_CHARTS: usize = 8;

/// A query's rows, `None` when it fails or returns none.
async fn fetch(ctx: &SessionContext, sql: &str) -> Option<Table> {
    query(ctx, sql).await.ok().filter(|t| !t.rows.is_empty())
}

/// Bytes for people: `812 B`, `13.3 KiB`, `4.1 MiB`, `1.52 GiB`.
pub fn human_bytes(b: i64) -> String {
    let a = b.unsigned_abs() as f64;
    let sign = if b < 0 { "-" } else { "" };
    const K: f64 = 1024.0;
    if a < K {
        format!("{sign}{a:.0} B")
    } else if a < K * K {
        format!("{sign}{:.1} KiB", a / K)
    } else if a < K * K * K {
        format!("{sign}{:.1} MiB", a / (K * K))
    } else {
        format!("{sign}{:.2} GiB", a / (K * K * K))
    }
}

/// `rank R ` (nothing for a run without ranks).
fn rank_label(rank: Option<&str>) -> String {
    rank.map(|r| format!("rank {} ", esc(r)))
        .unwrap_or_default()
}

/// `GPU N`, or `host` for the host's memory.
fn device_label(device: Option<&str>) -> String {
    device.map_or("host".into(), |d| format!("GPU {}", esc(d)))
}

/// A table's head: `(title, numeric, width %)` per column.
fn table_head(columns: &[(&str, bool, u32)]) -> String {
    let mut h = String::from("<table class=\"sortable\"><colgroup>");
    for (_, _, w) in columns {
        let _ = write!(h, "<col style=\"width:{w}%\">");
    }
    h.push_str("</colgroup><thead><tr>");
    for (title, n, _) in columns {
        let _ = write!(
            h,
            "<th{}>{title}</th>",
            if *n { " class=\"n\"" } else { "" }
        );
    }
    h.push_str("</tr></thead><tbody>\n");
    h
}

/// A cell of nanoseconds (`-` when NULL).
fn ns_cell(ns: Option<i64>) -> String {
    match ns {
        Some(ns) => format!("<td class=\"n\" data-ns=\"{ns}\">{}</td>", human_ns(ns)),
        None => "<td class=\"n\">-</td>".into(),
    }
}

/// A cell of bytes (`-` when NULL), its exact value in `data-value`.
fn bytes_cell(class: &str, b: Option<i64>) -> String {
    match b {
        Some(b) => format!(
            "<td class=\"n{class}\" data-value=\"{b}\">{}</td>",
            human_bytes(b)
        ),
        None => format!("<td class=\"n{class}\">-</td>"),
    }
}

/// A cell of a number as the table holds it (exactly, in `data-value`), shown as `shown`.
fn value_cell(t: &Table, row: usize, column: &str, shown: impl Fn(f64) -> String) -> String {
    match (t.get(row, column), t.num(row, column)) {
        (Some(raw), Some(v)) => format!(
            "<td class=\"n\" data-value=\"{}\">{}</td>",
            esc(raw),
            shown(v)
        ),
        _ => "<td class=\"n\">-</td>".into(),
    }
}

/// GPU time per `nn.Module`: a bar by the innermost module's class, then the paths with the
/// most time. Only for runs with module ranges.
pub async fn modules(ctx: &SessionContext, run: &str, steps: &str) -> Option<String> {
    let rows_sql = format!("SELECT * FROM module_breakdown({run}{steps})");
    let top = fetch(
        ctx,
        &format!(
            "SELECT module, pass, gpu_time, kernels, share, top_kernel, short_name(top_kernel) AS short \
             FROM ({rows_sql}) ORDER BY gpu_time DESC, module, pass LIMIT {MAX_ROWS}"
        ),
    )
    .await?;
    let kinds = fetch(
        ctx,
        &format!(
            "SELECT CASE WHEN module = '(none)' THEN '(no module, ' || pass || ')' \
             ELSE regexp_replace(regexp_replace(module, '^.*/', ''), '_[0-9]+$', '') END AS kind, \
             sum(gpu_time) AS total, bool_or(module <> '(none)') AS has_module \
             FROM ({rows_sql}) GROUP BY 1 ORDER BY total DESC, kind"
        ),
    )
    .await?;
    if !(0..kinds.rows.len()).any(|i| kinds.get(i, "has_module") == Some("true")) {
        return None;
    }
    let total: i64 = (0..kinds.rows.len())
        .filter_map(|i| kinds.int(i, "total"))
        .sum();
    // The nine classes with the most time, the rest together.
    let mut parts: Vec<(String, &str, i64)> = Vec::new();
    for i in 0..kinds.rows.len() {
        let kind = kinds.get(i, "kind").unwrap_or("?");
        let ns = kinds.int(i, "total").unwrap_or(0);
        if i < 9 {
            // Kernels outside every module in greys, one per pass.
            let color = if kinds.get(i, "has_module") == Some("true") {
                PALETTE[parts.len() % 9]
            } else {
                let greys = ["#bab0ac", "#8f8782", "#dcd7d4"];
                greys[parts.iter().filter(|p| greys.contains(&p.1)).count() % 3]
            };
            parts.push((kind.to_string(), color, ns));
        } else if i == 9 {
            parts.push(("other modules".into(), "#d4a6c8", ns));
        } else {
            parts[9].2 += ns;
        }
    }
    let parts: Vec<(&str, &str, i64)> =
        parts.iter().map(|(k, c, n)| (k.as_str(), *c, *n)).collect();
    let mut h = format!(
        "<section id=\"modules\"><h2>GPU time per module</h2>\n<p class=\"note\">Each kernel under the <code>nn.Module</code> whose forward launched it (backward kernels under their forward's module; <code>module_breakdown</code>): look for the part of the model that takes the time. The bar adds up the innermost modules by class.</p>\n<div id=\"module-classes\">{}</div>\n",
        stacked_bar(&parts, total)
    );
    h.push_str("<h3>Module paths with the most time</h3>\n");
    h.push_str(&table_head(&[
        ("module", false, 44),
        ("pass", false, 9),
        ("share", true, 8),
        ("GPU time", true, 10),
        ("kernels", true, 7),
        ("top kernel", false, 22),
    ]));
    for i in 0..top.rows.len() {
        let module = top.get(i, "module").unwrap_or("");
        let _ = write!(
            h,
            "<tr><td class=\"name\" title=\"{}\">{}</td><td>{}</td>{}{}<td class=\"n\" data-value=\"{}\">{}</td><td class=\"name\" title=\"{}\">{}</td></tr>\n",
            esc(module),
            esc(&short_path(module)),
            esc(top.get(i, "pass").unwrap_or("")),
            value_cell(&top, i, "share", |v| format!("{v:.1}%")),
            ns_cell(top.int(i, "gpu_time")),
            top.int(i, "kernels").unwrap_or(0),
            top.int(i, "kernels").unwrap_or(0),
            esc(top.get(i, "top_kernel").unwrap_or("")),
            esc(top.get(i, "short").unwrap_or("")),
        );
    }
    h.push_str("</tbody></table></section>\n");
    Some(h)
}

/// A module path short enough for its cell: the outermost module and the two innermost, the
/// ones between elided (`Qwen2Model_0/…/Qwen2MLP_3/Linear_9`).
fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() <= 3 || path.len() <= 48 {
        return path.to_string();
    }
    format!(
        "{}/…/{}/{}",
        parts[0],
        parts[parts.len() - 2],
        parts[parts.len() - 1]
    )
}

/// The colour of a precision.
fn dtype_color(dtype: &str) -> &'static str {
    match dtype {
        "fp8" => "#76b7b2",
        "int8" => "#9c755f",
        "bf16" => "#4e79a7",
        "fp16" => "#59a14f",
        "tf32" => "#edc948",
        "fp32" => "#f28e2b",
        "fp64" => "#e15759",
        _ => "#bab0ac",
    }
}

/// GPU time per precision, then the fp32 and fp64 kernels with the most time. Only when some
/// kernel's precision is known.
pub async fn precision(
    ctx: &SessionContext,
    run: &str,
    steps: &str,
    kineto: bool,
) -> Option<String> {
    let rows_sql = format!("SELECT * FROM precision({run}{steps})");
    let per = fetch(
        ctx,
        &format!(
            "SELECT coalesce(dtype, 'unknown') AS dtype, sum(gpu_time) AS total, sum(share) AS share \
             FROM ({rows_sql}) GROUP BY 1 ORDER BY total DESC, dtype"
        ),
    )
    .await?;
    if !(0..per.rows.len()).any(|i| per.get(i, "dtype") != Some("unknown")) {
        return None;
    }
    let total: i64 = (0..per.rows.len())
        .filter_map(|i| per.int(i, "total"))
        .sum();
    let parts: Vec<(&str, &str, i64)> = (0..per.rows.len())
        .map(|i| {
            let d = per.get(i, "dtype").unwrap_or("unknown");
            (d, dtype_color(d), per.int(i, "total").unwrap_or(0))
        })
        .collect();
    let unknown = (0..per.rows.len())
        .find(|&i| per.get(i, "dtype") == Some("unknown"))
        .and_then(|i| per.num(i, "share"))
        .unwrap_or(0.0);
    let mut h = format!(
        "<section id=\"precision\"><h2>Time per precision</h2>\n<p class=\"note\">GPU kernel time by the precision each kernel ran in, from its name or its operator's input types (<code>precision</code>): fp32 or fp64 time on tensor-core GPUs is often a missed cast.{}</p>\n<div id=\"precisions\">{}</div>\n",
        if unknown >= 1.0 && kineto {
            " Operators' input types, which place kernels whose name says nothing, are recorded with <code>torch.profiler.profile(record_shapes=True)</code>."
        } else {
            ""
        },
        stacked_bar(&parts, total)
    );
    if let Some(wide) = fetch(
        ctx,
        &format!(
            "SELECT name, short_name(name) AS short, class, dtype, source, op, gpu_time, kernels, share \
             FROM ({rows_sql}) WHERE dtype IN ('fp32', 'fp64') ORDER BY gpu_time DESC, name LIMIT {MAX_ROWS}"
        ),
    )
    .await
    {
        h.push_str("<h3>fp32 and fp64 kernels with the most time</h3>\n");
        h.push_str(&table_head(&[
            ("kernel", false, 38),
            ("precision", false, 9),
            ("from", false, 9),
            ("operator", false, 20),
            ("share", true, 8),
            ("GPU time", true, 9),
            ("count", true, 7),
        ]));
        for i in 0..wide.rows.len() {
            let _ = write!(
                h,
                "<tr><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td>{}</td><td class=\"name\" title=\"{}\">{}</td>{}{}<td class=\"n\" data-value=\"{}\">{}</td></tr>\n",
                esc(wide.get(i, "name").unwrap_or("")),
                esc(wide.get(i, "short").unwrap_or("")),
                esc(wide.get(i, "dtype").unwrap_or("")),
                esc(wide.get(i, "source").unwrap_or("")),
                esc(wide.get(i, "op").unwrap_or("")),
                esc(wide.get(i, "op").unwrap_or("")),
                value_cell(&wide, i, "share", |v| format!("{v:.1}%")),
                ns_cell(wide.int(i, "gpu_time")),
                wide.int(i, "kernels").unwrap_or(0),
                wide.int(i, "kernels").unwrap_or(0),
            );
        }
        h.push_str("</tbody></table>\n");
    }
    h.push_str("</section>\n");
    Some(h)
}

/// Serving-engine steps: per phase the steady steps' batch, latency and time per token, then
/// the first steps. Only for runs with step markers.
pub async fn phases(ctx: &SessionContext, run: &str, steps: &str) -> Option<String> {
    let rows_sql = format!("SELECT * FROM inference_phases({run}{steps})");
    // Per phase: its steady steps where the steady state is known, else all of them.
    let summary = fetch(
        ctx,
        &format!(
            "SELECT rank, phase, count(*) AS steps, count(*) FILTER (WHERE steady) AS steady, count(steady) AS judged, \
             median(requests) AS med_batch, sum(tokens) AS tokens, \
             CAST(median(latency) AS BIGINT) AS med_latency, \
             CAST(sum(latency) / sum(tokens) AS BIGINT) AS per_token, \
             CAST(median(gpu_busy) AS BIGINT) AS med_gpu_busy \
             FROM ({rows_sql}) WHERE coalesce(steady, true) GROUP BY rank, phase ORDER BY rank, phase"
        ),
    )
    .await?;
    let list = fetch(
        ctx,
        &format!(
            "SELECT rank, ts, phase, requests, tokens, latency, gpu_busy, per_token, steady, name, \
             count(*) OVER () AS n FROM ({rows_sql}) ORDER BY rank, ts LIMIT {MAX_STEPS}"
        ),
    )
    .await?;
    let mut h = String::from(
        "<section id=\"phases\"><h2>Serving phases</h2>\n<p class=\"note\">Per prefill and decode phase of the serving engine's steps (<code>inference_phases</code>; steady steps where there are three or more): latency runs from the step's start until its GPU work ended, so compare time per token across batch sizes.</p>\n",
    );
    h.push_str(&table_head(&[
        ("rank", false, 7),
        ("phase", false, 11),
        ("steps", true, 8),
        ("steady", true, 8),
        ("median batch", true, 12),
        ("tokens", true, 11),
        ("median latency", true, 15),
        ("per token", true, 13),
        ("median GPU busy", true, 15),
    ]));
    for i in 0..summary.rows.len().min(MAX_DEVICES * 3) {
        let _ = write!(
            h,
            "<tr class=\"phase\" data-phase=\"{}\"><td>{}</td><td>{}</td><td class=\"n\" data-value=\"{}\">{}</td><td class=\"n\" data-value=\"{}\">{}</td>{}{}{}{}{}</tr>\n",
            esc(summary.get(i, "phase").unwrap_or("")),
            esc(summary.get(i, "rank").unwrap_or("-")),
            esc(summary.get(i, "phase").unwrap_or("")),
            summary.int(i, "steps").unwrap_or(0),
            summary.int(i, "steps").unwrap_or(0),
            summary.int(i, "steady").unwrap_or(0),
            match summary.int(i, "judged") {
                Some(n) if n > 0 => summary.int(i, "steady").unwrap_or(0).to_string(),
                _ => "-".into(),
            },
            value_cell(&summary, i, "med_batch", |v| format!("{v}")),
            value_cell(&summary, i, "tokens", |v| format!("{v}")),
            ns_cell(summary.int(i, "med_latency")),
            ns_cell(summary.int(i, "per_token")),
            ns_cell(summary.int(i, "med_gpu_busy")),
        );
    }
    h.push_str("</tbody></table>\n");
    let n = list.int(0, "n").unwrap_or(0);
    // The steps themselves, where they say more than the summary.
    if n as usize > summary.rows.len() {
        let _ = write!(
            h,
            "<h3>Steps{}</h3>\n",
            if n as usize > list.rows.len() {
                format!(" (the first {} of {n})", list.rows.len())
            } else {
                String::new()
            }
        );
        h.push_str(&table_head(&[
            ("rank", false, 6),
            ("phase", false, 9),
            ("batch", true, 8),
            ("tokens", true, 9),
            ("latency", true, 11),
            ("GPU busy", true, 11),
            ("per token", true, 11),
            ("steady", false, 8),
            ("marker", false, 27),
        ]));
        for i in 0..list.rows.len() {
            let _ = write!(
                h,
                "<tr class=\"pstep\" data-ts=\"{}\"><td>{}</td><td>{}</td>{}{}{}{}{}<td>{}</td><td class=\"name\" title=\"{}\">{}</td></tr>\n",
                list.int(i, "ts").unwrap_or(0),
                esc(list.get(i, "rank").unwrap_or("-")),
                esc(list.get(i, "phase").unwrap_or("")),
                value_cell(&list, i, "requests", |v| format!("{v}")),
                value_cell(&list, i, "tokens", |v| format!("{v}")),
                ns_cell(list.int(i, "latency")),
                ns_cell(list.int(i, "gpu_busy")),
                ns_cell(list.num(i, "per_token").map(|v| v.round() as i64)),
                match list.get(i, "steady") {
                    Some("true") => "yes",
                    Some("false") => "no",
                    _ => "-",
                },
                esc(list.get(i, "name").unwrap_or("")),
                esc(list.get(i, "name").unwrap_or("")),
            );
        }
        h.push_str("</tbody></table>\n");
    }
    h.push_str("</section>\n");
    Some(h)
}

/// Per kind of collective its kernels, time, bytes, bus bandwidth (over the kernel and over the
/// transfer), share of time waiting and the rank that came last most often. Only for runs with
/// communication kernels.
pub async fn collectives(ctx: &SessionContext, run: &str, steps: &str) -> Option<String> {
    let rows_sql = format!("SELECT * FROM collectives({run}{steps})");
    let kinds = fetch(
        ctx,
        &format!(
            "SELECT *, short_name(collective) AS short FROM ({})",
            gpuq_query::analyses::collectives::kinds_sql(&rows_sql)
        ),
    )
    .await?;
    let mut h = String::from(
        "<section id=\"collectives\"><h2>Collectives</h2>\n<p class=\"note\">Per kind of collective (<code>collectives</code>): bandwidth over the whole kernel counts the wait for the last rank as transfer, so where much of the time is waiting, look at the rank that came last rather than at the links.</p>\n",
    );
    h.push_str(&table_head(&[
        ("collective", false, 24),
        ("algorithm", false, 8),
        ("protocol", false, 7),
        ("ranks", true, 5),
        ("kernels", true, 6),
        ("total", true, 8),
        ("data", true, 8),
        ("bus GB/s", true, 7),
        ("over transfer", true, 10),
        ("waiting", true, 8),
        ("last most", true, 9),
    ]));
    for i in 0..kinds.rows.len().min(MAX_ROWS) {
        let last = match (kinds.get(i, "last_rank"), kinds.int(i, "last_calls")) {
            (Some(r), Some(n)) => format!(
                "<td class=\"n\" data-value=\"{}\" title=\"came last in {n} call{}\">rank {}</td>",
                esc(r),
                if n == 1 { "" } else { "s" },
                esc(r)
            ),
            _ => "<td class=\"n\">-</td>".into(),
        };
        let _ = write!(
            h,
            "<tr class=\"coll\"><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td>{}</td>{}<td class=\"n\" data-value=\"{}\">{}</td>{}{}{}{}{}{last}</tr>\n",
            esc(kinds.get(i, "collective").unwrap_or("")),
            esc(kinds.get(i, "short").unwrap_or("")),
            esc(kinds.get(i, "algorithm").unwrap_or("-")),
            esc(kinds.get(i, "protocol").unwrap_or("-")),
            value_cell(&kinds, i, "group_size", |v| format!("{v}")),
            kinds.int(i, "kernels").unwrap_or(0),
            kinds.int(i, "kernels").unwrap_or(0),
            ns_cell(kinds.int(i, "total")),
            bytes_cell("", kinds.int(i, "bytes")),
            value_cell(&kinds, i, "busbw_gbps", |v| format!("{v:.1}")),
            value_cell(&kinds, i, "transfer_busbw_gbps", |v| format!("{v:.1}")),
            value_cell(&kinds, i, "wait_pct", |v| format!("{v:.1}%")),
        );
    }
    h.push_str("</tbody></table>\n");
    if kinds.rows.len() > MAX_ROWS {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} more kinds with less time: <code>gpuq collectives</code> lists them.</p>",
            kinds.rows.len() - MAX_ROWS
        );
    }
    h.push_str("</section>\n");
    Some(h)
}

/// The allocator's memory per device: its peak, what ran then, the churn, and a chart per
/// device of each step's peak. Only for runs with allocator events.
pub async fn memory(ctx: &SessionContext, run: &str, steps: &str) -> Option<String> {
    let rows_sql = format!("SELECT * FROM memory_usage({run}{steps})");
    let whole = fetch(
        ctx,
        &format!(
            "SELECT rank, device, relative, start_allocated, peak_allocated, peak_op, peak_alloc_op, \
             end_allocated, peak_reserved, allocs, alloc_bytes, frees, freed_bytes \
             FROM ({rows_sql}) WHERE step IS NULL ORDER BY rank, device"
        ),
    )
    .await?;
    let per_step = query(
        ctx,
        &format!(
            "SELECT rank, device, step, start_allocated, peak_allocated, peak_op, alloc_bytes \
             FROM ({rows_sql}) WHERE step IS NOT NULL ORDER BY device IS NULL, rank, device, step"
        ),
    )
    .await
    .ok();
    let relative = (0..whole.rows.len()).any(|i| whole.get(i, "relative") == Some("true"));
    let mut h = format!(
        "<section id=\"memory\"><h2>Memory</h2>\n<p class=\"note\">The caching allocator's memory per device (<code>memory_usage</code>): look at the peak against the GPU's memory and at what ran then; bytes allocated far above the peak mean the allocator recycles blocks all along.{}</p>\n",
        if relative {
            " This trace records no totals (PyTorch before 1.10): levels count from 0 at its first event, so only differences between them mean something."
        } else {
            ""
        }
    );
    h.push_str(&table_head(&[
        ("rank", false, 6),
        ("device", false, 7),
        ("peak", true, 9),
        ("reserved", true, 9),
        ("at start", true, 9),
        ("at end", true, 9),
        ("operator at the peak", false, 25),
        ("allocated", true, 10),
        ("freed", true, 9),
    ]));
    for i in 0..whole.rows.len().min(MAX_DEVICES) {
        let op = whole.get(i, "peak_op").unwrap_or("-");
        let alloc_op = whole
            .get(i, "peak_alloc_op")
            .map(|o| format!(" (allocating: {o})"))
            .unwrap_or_default();
        let _ = write!(
            h,
            "<tr data-rank=\"{}\" data-device=\"{}\"><td>{}</td><td>{}</td>{}{}{}{}<td class=\"name\" title=\"{}{}\">{}</td>{}{}</tr>\n",
            esc(whole.get(i, "rank").unwrap_or("")),
            esc(whole.get(i, "device").unwrap_or("")),
            esc(whole.get(i, "rank").unwrap_or("-")),
            device_label(whole.get(i, "device")),
            bytes_cell(" peak", whole.int(i, "peak_allocated")),
            bytes_cell("", whole.int(i, "peak_reserved")),
            bytes_cell("", whole.int(i, "start_allocated")),
            bytes_cell("", whole.int(i, "end_allocated")),
            esc(op),
            esc(&alloc_op),
            esc(op),
            bytes_cell("", whole.int(i, "alloc_bytes")),
            bytes_cell("", whole.int(i, "freed_bytes")),
        );
    }
    h.push_str("</tbody></table>\n");
    if whole.rows.len() > MAX_DEVICES {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} more devices: <code>gpuq memory</code> lists them.</p>",
            whole.rows.len() - MAX_DEVICES
        );
    }
    // Each step's peak, per device.
    if let Some(t) = per_step.filter(|t| !t.rows.is_empty()) {
        let mut devices: BTreeMap<(bool, Option<&str>, Option<&str>), Vec<usize>> = BTreeMap::new();
        let mut order = Vec::new();
        // GPUs (host memory only where the run has no GPU's), with two steps or more.
        let gpus = (0..t.rows.len()).any(|i| t.get(i, "device").is_some());
        for i in 0..t.rows.len() {
            if gpus && t.get(i, "device").is_none() {
                continue;
            }
            let key = (
                t.get(i, "device").is_none(),
                t.get(i, "rank"),
                t.get(i, "device"),
            );
            if !devices.contains_key(&key) {
                order.push(key);
            }
            devices.entry(key).or_default().push(i);
        }
        order.retain(|k| devices[k].len() >= 2);
        if !order.is_empty() {
            h.push_str("<h3>Peak per step</h3>\n");
        }
        for key in order.iter().take(MAX_CHARTS) {
            h.push_str(&memory_chart(&t, &devices[key]));
        }
        if !order.is_empty() {
            h.push_str("<div class=\"legend\"><span><i style=\"background:#4e79a7\"></i>allocated at the step's start</span><span><i style=\"background:#a0cbe8\"></i>rise to the step's peak</span></div>\n");
        }
        if order.len() > MAX_CHARTS {
            let _ = writeln!(
                h,
                "<p class=\"note\">{} more devices: <code>gpuq memory</code> lists their steps.</p>",
                order.len() - MAX_CHARTS
            );
        }
    }
    h.push_str("</section>\n");
    Some(h)
}

/// One device's steps (at most [`MAX_STEPS`]) as bars of their peak, the level at their start
/// darker.
fn memory_chart(t: &Table, rows: &[usize]) -> String {
    let shown = &rows[..rows.len().min(MAX_STEPS)];
    let max = shown
        .iter()
        .filter_map(|&i| t.int(i, "peak_allocated"))
        .max()
        .unwrap_or(1)
        .max(1);
    let first = shown[0];
    let mut svg = format!(
        "<div class=\"label\">{}{}: {}{}</div><svg class=\"mem\" viewBox=\"0 0 1000 64\" preserveAspectRatio=\"none\" role=\"img\">",
        rank_label(t.get(first, "rank")),
        device_label(t.get(first, "device")),
        if rows.len() > shown.len() {
            format!("the first {} of {} steps", shown.len(), rows.len())
        } else {
            format!("{} steps", rows.len())
        },
        format_args!(", highest {}", human_bytes(max)),
    );
    let bar = 1000.0 / shown.len().max(12) as f64;
    for (k, &i) in shown.iter().enumerate() {
        let peak = t.int(i, "peak_allocated").unwrap_or(0);
        let start = t.int(i, "start_allocated").unwrap_or(0).min(peak);
        let hp = peak as f64 / max as f64 * 62.0;
        let hs = start.max(0) as f64 / max as f64 * 62.0;
        let x = k as f64 * bar;
        let _ = write!(
            svg,
            "<g class=\"mstep\" data-step=\"{}\" data-value=\"{peak}\"><title>step {}: peak {} (at its start {}), allocated {}, at {}</title><rect x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{hp:.2}\" fill=\"#a0cbe8\"/><rect x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{hs:.2}\" fill=\"#4e79a7\"/></g>",
            esc(t.get(i, "step").unwrap_or("")),
            esc(t.get(i, "step").unwrap_or("?")),
            human_bytes(peak),
            human_bytes(start),
            human_bytes(t.int(i, "alloc_bytes").unwrap_or(0)),
            esc(t.get(i, "peak_op").unwrap_or("-")),
            64.0 - hp,
            (bar * 0.85).max(0.5),
            64.0 - hs,
            (bar * 0.85).max(0.5),
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// What the profiler cost, a line per rank: the overhead it recorded (share of the rank's
/// window) and each launch API's median call.
pub async fn overhead(ctx: &SessionContext, run: &str, steps: &str) -> Option<String> {
    let t = fetch(
        ctx,
        &format!(
            "SELECT rank, kind, name, instances, total, med, max, share_pct \
             FROM profiler_overhead({run}{steps}) ORDER BY rank, kind DESC, total DESC, name"
        ),
    )
    .await?;
    let mut ranks: Vec<(Option<&str>, Vec<usize>)> = Vec::new();
    for i in 0..t.rows.len() {
        let r = t.get(i, "rank");
        match ranks.last_mut() {
            Some((last, rows)) if *last == r => rows.push(i),
            _ => ranks.push((r, vec![i])),
        }
    }
    let mut h = String::from(
        "<section id=\"overhead\"><h2>Profiler overhead</h2>\n<p class=\"note\">What recording cost (<code>profiler_overhead</code>): gaps and host times inside recorded overhead are partly the profiler's, and a launch call's median far above the few microseconds it takes unprofiled says the host side is inflated.</p>\n",
    );
    for (rank, rows) in ranks.iter().take(MAX_DEVICES) {
        let recorded: Vec<usize> = rows
            .iter()
            .copied()
            .filter(|&i| t.get(i, "kind") == Some("recorded"))
            .collect();
        let mut line = format!(
            "<div class=\"ovh\" data-rank=\"{}\">{}",
            esc(rank.unwrap_or("")),
            rank.map(|r| format!("rank {}: ", esc(r)))
                .unwrap_or_default()
        );
        if recorded.is_empty() {
            line.push_str("no recorded overhead");
        } else {
            let share: f64 = recorded.iter().filter_map(|&i| t.num(i, "share_pct")).sum();
            let total: i64 = recorded.iter().filter_map(|&i| t.int(i, "total")).sum();
            let names: Vec<String> = recorded
                .iter()
                .map(|&i| {
                    format!(
                        "{} {}",
                        esc(t.get(i, "name").unwrap_or("")),
                        human_ns(t.int(i, "total").unwrap_or(0))
                    )
                })
                .collect();
            let _ = write!(
                line,
                "recorded overhead <b class=\"recorded\" data-value=\"{share}\" data-ns=\"{total}\">{share:.2}%</b> of the window ({})",
                names.join(", ")
            );
        }
        let launches: Vec<String> =
            rows.iter()
                .filter(|&&i| t.get(i, "kind") == Some("launch_calls"))
                .map(|&i| {
                    format!(
                    "{} <b class=\"launch-med\" data-value=\"{}\">{}</b> ({} call{}, longest {})",
                    esc(t.get(i, "name").unwrap_or("")),
                    esc(t.get(i, "med").unwrap_or("")),
                    human_ns(t.num(i, "med").unwrap_or(0.0).round() as i64),
                    t.int(i, "instances").unwrap_or(0),
                    if t.int(i, "instances") == Some(1) { "" } else { "s" },
                    human_ns(t.int(i, "max").unwrap_or(0)),
                )
                })
                .collect();
        if !launches.is_empty() {
            let _ = write!(line, "; median launch call: {}", launches.join(", "));
        }
        line.push_str("</div>\n");
        h.push_str(&line);
    }
    if ranks.len() > MAX_DEVICES {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} more ranks: <code>gpuq overhead</code> lists them.</p>",
            ranks.len() - MAX_DEVICES
        );
    }
    h.push_str("</section>\n");
    Some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(13_619), "13.3 KiB");
        assert_eq!(human_bytes(4_299_162), "4.1 MiB");
        assert_eq!(human_bytes(4_086_265_344), "3.81 GiB");
        assert_eq!(human_bytes(-2048), "-2.0 KiB");
    }
}
