//! `gpuq report`: one self-contained HTML page per run (and, with a baseline, per
//! comparison) that shows where the time went: the run's facts, the breakdown, top kernels
//! and kernel classes, time per precision, GPU time per module, time per step with outliers
//! marked, serving phases, idle gaps by cause, collectives, each GPU's utilisation over the
//! run, a zoomable timeline of a window ([`timeline`]), the allocator's memory, the profiler's
//! overhead, the findings with their evidence and action (and their moment on the timeline),
//! and what changed against the baseline. The sections of analyses a run holds no data for
//! (no module ranges, no allocator events...) are left out ([`sections`]).
//!
//! Every figure comes from the SQL functions (`breakdown`, `top_kernels`, `step_stats`,
//! `gpu_gaps`, `precision`, `module_breakdown`, `inference_phases`, `collectives`,
//! `memory_usage`, `profiler_overhead`, `findings`, `compare`), and each carries its exact value in a `data-ns` or
//! `data-value` attribute, so a test (or a script) can check the page against SQL. Charts are
//! inline SVG and the page's little script sorts tables and zooms the timeline: it opens
//! offline, with no network request, and prints.

mod sections;
mod timeline;

use crate::{sql_text, ExportError, Result};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type};
use datafusion::execution::context::SessionContext;
use std::fmt::Write as _;

/// Kernels a report lists unless told otherwise.
pub const DEFAULT_TOP: usize = 15;

/// What the report covers.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    pub run: String,
    /// A run to compare against.
    pub baseline: Option<String>,
    /// A step range (`3..5`) the analyses are restricted to.
    pub steps: Option<String>,
    /// Kernels listed.
    pub top: usize,
}

/// A query's rows as strings (NULL as `None`), by column name.
struct Table {
    columns: Vec<String>,
    rows: Vec<Vec<Option<String>>>,
}

impl Table {
    fn get(&self, row: usize, column: &str) -> Option<&str> {
        let i = self.columns.iter().position(|c| c == column)?;
        self.rows[row][i].as_deref()
    }

    /// An integer cell exactly (epoch nanoseconds do not survive a double); a float cell
    /// rounded toward zero.
    fn int(&self, row: usize, column: &str) -> Option<i64> {
        let v = self.get(row, column)?;
        v.parse::<i64>()
            .ok()
            .or_else(|| v.parse::<f64>().ok().map(|v| v as i64))
    }

    fn num(&self, row: usize, column: &str) -> Option<f64> {
        self.get(row, column).and_then(|v| v.parse().ok())
    }
}

async fn query(ctx: &SessionContext, sql: &str) -> Result<Table> {
    let batches: Vec<RecordBatch> = ctx.sql(sql).await?.collect().await?;
    let mut t = Table {
        columns: Vec::new(),
        rows: Vec::new(),
    };
    if let Some(b) = batches.first() {
        t.columns = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
    }
    for b in &batches {
        let cols: Vec<_> = b
            .columns()
            .iter()
            .map(|c| match c.data_type() {
                DataType::Float32 | DataType::Float64 => {
                    let f = cast(c, &DataType::Float64)?;
                    let f = f.as_primitive::<Float64Type>();
                    Ok((0..f.len())
                        .map(|i| f.is_valid(i).then(|| f.value(i).to_string()))
                        .collect::<Vec<_>>())
                }
                DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64 => {
                    let f = cast(c, &DataType::Int64)?;
                    let f = f.as_primitive::<Int64Type>();
                    Ok((0..f.len())
                        .map(|i| f.is_valid(i).then(|| f.value(i).to_string()))
                        .collect())
                }
                _ => {
                    let s = cast(c, &DataType::Utf8)?;
                    let s = s.as_string::<i32>();
                    Ok((0..s.len())
                        .map(|i| s.is_valid(i).then(|| s.value(i).to_string()))
                        .collect())
                }
            })
            .collect::<std::result::Result<_, datafusion::arrow::error::ArrowError>>()?;
        for i in 0..b.num_rows() {
            t.rows.push(
                cols.iter()
                    .map(|c: &Vec<Option<String>>| c[i].clone())
                    .collect(),
            );
        }
    }
    Ok(t)
}

/// HTML-escaped text.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A duration for people: `812 ns`, `13.3 us`, `4.07 ms`, `1.52 s`.
pub fn human_ns(ns: i64) -> String {
    let a = ns.unsigned_abs() as f64;
    let sign = if ns < 0 { "-" } else { "" };
    if a < 1e3 {
        format!("{sign}{a:.0} ns")
    } else if a < 1e6 {
        format!("{sign}{:.1} us", a / 1e3)
    } else if a < 1e9 {
        format!("{sign}{:.2} ms", a / 1e6)
    } else {
        format!("{sign}{:.2} s", a / 1e9)
    }
}

const COLORS: [(&str, &str); 7] = [
    ("compute", "#4e79a7"),
    ("communication", "#f28e2b"),
    ("memcpy", "#59a14f"),
    ("memset", "#8cd17d"),
    ("sync", "#e15759"),
    ("idle", "#bab0ac"),
    ("unaccounted", "#d4a6c8"),
];

const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

/// A horizontal 100 % bar of labelled parts (ns), with a legend.
fn stacked_bar(parts: &[(&str, &str, i64)], total: i64) -> String {
    let mut svg = String::from(
        "<svg class=\"bar\" viewBox=\"0 0 1000 28\" preserveAspectRatio=\"none\" role=\"img\">",
    );
    let mut x = 0.0;
    for (label, color, ns) in parts {
        if *ns <= 0 || total <= 0 {
            continue;
        }
        let w = *ns as f64 / total as f64 * 1000.0;
        let _ = write!(
            svg,
            "<rect x=\"{x:.2}\" y=\"0\" width=\"{w:.2}\" height=\"28\" fill=\"{color}\"><title>{}: {} ({:.1}%)</title></rect>",
            esc(label),
            human_ns(*ns),
            *ns as f64 / total as f64 * 100.0
        );
        x += w;
    }
    svg.push_str("</svg><div class=\"legend\">");
    for (label, color, ns) in parts {
        if *ns <= 0 {
            continue;
        }
        let pct = if total > 0 {
            *ns as f64 / total as f64 * 100.0
        } else {
            0.0
        };
        let _ = write!(
            svg,
            "<span><i style=\"background:{color}\"></i>{} <b data-ns=\"{ns}\">{}</b> ({pct:.1}%)</span>",
            esc(label),
            human_ns(*ns)
        );
    }
    svg.push_str("</div>");
    svg
}

/// Writes the report's HTML.
pub async fn report(ctx: &SessionContext, opts: &ReportOptions) -> Result<String> {
    let run = sql_text(&opts.run);
    let steps_arg = opts.steps.as_deref().map(sql_text);
    let with_steps = |prefix: &str| match &steps_arg {
        Some(s) => format!("{prefix}{s}"),
        None => String::new(),
    };
    let facts = query(
        ctx,
        &format!(
            "SELECT run, format, ranks, gpus, span, events, kernels, first_ts, warnings FROM runs WHERE run = {run}"
        ),
    )
    .await?;
    if facts.rows.is_empty() {
        return Err(ExportError::Window(format!("no run {}", opts.run)));
    }
    let breakdown = query(
        ctx,
        &format!(
            "SELECT rank, device, wall, compute, comm_exposed, memcpy_exposed, memset_exposed, sync, idle, idle_pct \
             FROM breakdown({run}{}) ORDER BY rank, device",
            with_steps(", ")
        ),
    )
    .await?;
    let top = query(
        ctx,
        &format!(
            "SELECT name, short_name(name) AS short, time_pct, total, instances, avg, class, top_op \
             FROM top_kernels({run}, {}{})",
            opts.top.max(1),
            with_steps(", ")
        ),
    )
    .await?;
    let classes = query(
        ctx,
        &format!(
            "SELECT class, sum(total) AS total FROM top_kernels({run}, 1000000{}) GROUP BY class ORDER BY total DESC",
            with_steps(", ")
        ),
    )
    .await?;
    let steps = query(
        ctx,
        &format!(
            "SELECT rank, step, ts, dur, gpu_busy, idle_pct, vs_median FROM step_stats({run}{}) ORDER BY rank, step",
            with_steps(", ")
        ),
    )
    .await
    .unwrap_or(Table {
        columns: Vec::new(),
        rows: Vec::new(),
    });
    let gaps = query(
        ctx,
        &format!(
            "SELECT cause, count(*) AS gaps, sum(dur) AS total FROM gpu_gaps({run}, 0{}) GROUP BY cause ORDER BY total DESC",
            with_steps(", ")
        ),
    )
    .await?;
    let findings = query(
        ctx,
        &format!(
            "SELECT severity, category, title, evidence, action, impact_ns, at_rank, at_ts, at_dur FROM findings({run}{})",
            with_steps(", ")
        ),
    )
    .await?;
    let comparison = match &opts.baseline {
        Some(b) => Some(
            query(
                ctx,
                &format!(
                    "SELECT name, short_name(name) AS short, value_a, value_b, delta, ratio, typical_ratio, \
                     run_shift, p_adjusted, status, test FROM compare({}, {run}) \
                     WHERE status <> 'unchanged' ORDER BY abs(delta) DESC LIMIT 20",
                    sql_text(b)
                ),
            )
            .await?,
        ),
        None => None,
    };
    // The analyses a run may hold no data for: each is None then.
    let kineto = facts.get(0, "format") == Some("kineto");
    let steps_sql = with_steps(", ");
    let precision = sections::precision(ctx, &run, &steps_sql, kineto).await;
    let modules = sections::modules(ctx, &run, &steps_sql).await;
    let phases = sections::phases(ctx, &run, &steps_sql).await;
    let collectives = sections::collectives(ctx, &run, &steps_sql).await;
    let memory = sections::memory(ctx, &run, &steps_sql).await;
    let overhead = sections::overhead(ctx, &run, &steps_sql).await;

    let mut h = String::with_capacity(64 << 10);
    let title = match &opts.baseline {
        Some(b) => format!("gpuq report: {} against {}", opts.run, b),
        None => format!("gpuq report: {}", opts.run),
    };
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{STYLE}</style></head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    // Facts.
    let span = facts.int(0, "span").unwrap_or(0);
    let _ = write!(
        h,
        "<section id=\"facts\"><table class=\"facts\">\
         <tr><th>GPUs</th><td>{}</td><th>ranks</th><td>{}</td><th>steps</th><td>{}</td></tr>\
         <tr><th>span</th><td data-ns=\"{span}\">{}</td><th>events</th><td>{}</td><th>kernels</th><td>{}</td></tr>\
         <tr><th>format</th><td>{}</td><th>warnings</th><td>{}</td><th>steps shown</th><td>{}</td></tr></table>{}</section>\n",
        esc(facts.get(0, "gpus").unwrap_or("?")),
        esc(facts.get(0, "ranks").unwrap_or("?")),
        steps.rows.len(),
        human_ns(span),
        esc(facts.get(0, "events").unwrap_or("?")),
        esc(facts.get(0, "kernels").unwrap_or("?")),
        esc(facts.get(0, "format").unwrap_or("?")),
        esc(facts.get(0, "warnings").unwrap_or("0")),
        esc(opts.steps.as_deref().unwrap_or("all")),
        not_recorded(kineto, memory.is_none(), modules.is_none()),
    );
    // Breakdown.
    h.push_str("<section id=\"breakdown\"><h2>Where the GPU time went</h2>\n");
    for i in 0..breakdown.rows.len() {
        let wall = breakdown.int(i, "wall").unwrap_or(0);
        let v = |c: &str| breakdown.int(i, c).unwrap_or(0);
        let known = v("compute")
            + v("comm_exposed")
            + v("memcpy_exposed")
            + v("memset_exposed")
            + v("sync")
            + v("idle");
        let parts = [
            (COLORS[0].0, COLORS[0].1, v("compute")),
            ("communication (exposed)", COLORS[1].1, v("comm_exposed")),
            ("memcpy (exposed)", COLORS[2].1, v("memcpy_exposed")),
            ("memset (exposed)", COLORS[3].1, v("memset_exposed")),
            (COLORS[4].0, COLORS[4].1, v("sync")),
            (COLORS[5].0, COLORS[5].1, v("idle")),
            (COLORS[6].0, COLORS[6].1, (wall - known).max(0)),
        ];
        let _ = write!(
            h,
            "<div class=\"row\" data-rank=\"{}\" data-device=\"{}\"><div class=\"label\">rank {} GPU {} &middot; wall <span data-ns=\"{wall}\">{}</span> &middot; idle <span class=\"idle-pct\" data-value=\"{}\">{}%</span></div>{}</div>\n",
            esc(breakdown.get(i, "rank").unwrap_or("")),
            esc(breakdown.get(i, "device").unwrap_or("")),
            esc(breakdown.get(i, "rank").unwrap_or("-")),
            esc(breakdown.get(i, "device").unwrap_or("-")),
            human_ns(wall),
            breakdown.num(i, "idle_pct").unwrap_or(0.0),
            breakdown.num(i, "idle_pct").unwrap_or(0.0),
            stacked_bar(&parts, wall)
        );
    }
    h.push_str("</section>\n");
    // Top kernels.
    h.push_str("<section id=\"top\"><h2>Top kernels</h2>\n<table class=\"sortable\"><colgroup><col style=\"width:36%\"><col style=\"width:11%\"><col style=\"width:20%\"><col style=\"width:11%\"><col style=\"width:8%\"><col style=\"width:6%\"><col style=\"width:8%\"></colgroup><thead><tr><th>kernel</th><th>class</th><th>operator</th><th class=\"n\">share</th><th class=\"n\">total</th><th class=\"n\">count</th><th class=\"n\">avg</th></tr></thead><tbody>\n");
    let max_pct = (0..top.rows.len())
        .filter_map(|i| top.num(i, "time_pct"))
        .fold(0.0f64, f64::max)
        .max(1e-9);
    for i in 0..top.rows.len() {
        let pct = top.num(i, "time_pct").unwrap_or(0.0);
        let total = top.int(i, "total").unwrap_or(0);
        let avg = top.num(i, "avg").unwrap_or(0.0);
        let _ = write!(
            h,
            "<tr><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td class=\"name\" title=\"{}\">{}</td><td class=\"n\" data-value=\"{pct}\"><span class=\"share\" style=\"width:{:.1}px\"></span>{pct:.1}%</td><td class=\"n\" data-ns=\"{total}\">{}</td><td class=\"n\" data-value=\"{}\">{}</td><td class=\"n\" data-ns=\"{}\">{}</td></tr>\n",
            esc(top.get(i, "name").unwrap_or("")),
            esc(top.get(i, "short").unwrap_or("")),
            esc(top.get(i, "class").unwrap_or("")),
            esc(top.get(i, "top_op").unwrap_or("")),
            esc(top.get(i, "top_op").unwrap_or("")),
            pct / max_pct * 60.0,
            human_ns(total),
            top.int(i, "instances").unwrap_or(0),
            top.int(i, "instances").unwrap_or(0),
            avg.round() as i64,
            human_ns(avg.round() as i64),
        );
    }
    h.push_str("</tbody></table>\n");
    // Kernel classes.
    let class_total: i64 = (0..classes.rows.len())
        .filter_map(|i| classes.int(i, "total"))
        .sum();
    let class_parts: Vec<(String, i64)> = (0..classes.rows.len())
        .map(|i| {
            (
                classes.get(i, "class").unwrap_or("other").to_string(),
                classes.int(i, "total").unwrap_or(0),
            )
        })
        .collect();
    let parts: Vec<(&str, &str, i64)> = class_parts
        .iter()
        .enumerate()
        .map(|(i, (c, n))| (c.as_str(), PALETTE[i % PALETTE.len()], *n))
        .collect();
    let _ = write!(
        h,
        "<h3>Kernel time by class</h3><div id=\"classes\">{}</div></section>\n",
        stacked_bar(&parts, class_total)
    );
    h.push_str(precision.as_deref().unwrap_or(""));
    h.push_str(modules.as_deref().unwrap_or(""));
    // Steps.
    h.push_str("<section id=\"steps\"><h2>Time per step</h2>\n");
    if steps.rows.is_empty() {
        h.push_str("<p>No profiler steps in this run.</p>\n");
    } else {
        h.push_str(&steps_chart(&steps));
    }
    h.push_str("</section>\n");
    h.push_str(phases.as_deref().unwrap_or(""));
    // Gaps.
    h.push_str("<section id=\"gaps\"><h2>Idle gaps by cause</h2>\n");
    let gap_total: i64 = (0..gaps.rows.len())
        .filter_map(|i| gaps.int(i, "total"))
        .sum();
    if gaps.rows.is_empty() {
        h.push_str("<p>No idle gaps.</p>\n");
    } else {
        let owned: Vec<(String, i64)> = (0..gaps.rows.len())
            .map(|i| {
                (
                    format!(
                        "{} ({} gaps)",
                        gaps.get(i, "cause").unwrap_or("?"),
                        gaps.get(i, "gaps").unwrap_or("?")
                    ),
                    gaps.int(i, "total").unwrap_or(0),
                )
            })
            .collect();
        let parts: Vec<(&str, &str, i64)> = owned
            .iter()
            .enumerate()
            .map(|(i, (c, n))| (c.as_str(), PALETTE[i % PALETTE.len()], *n))
            .collect();
        h.push_str(&stacked_bar(&parts, gap_total));
    }
    h.push_str("</section>\n");
    h.push_str(collectives.as_deref().unwrap_or(""));
    // Utilisation and the timeline.
    let _ = write!(
        h,
        "<section id=\"utilisation\"><h2>GPU utilisation over the run</h2>\n{}</section>\n",
        timeline::utilisation(ctx, &opts.run, opts.steps.as_deref()).await?
    );
    let window = timeline::choose(ctx, &opts.run, &steps, opts.steps.as_deref()).await?;
    if let Some(w) = &window {
        let _ = write!(
            h,
            "<section id=\"timeline\"><h2>Timeline</h2>\n{}</section>\n",
            timeline::timeline(ctx, &opts.run, w, &findings).await?
        );
    }
    h.push_str(memory.as_deref().unwrap_or(""));
    h.push_str(overhead.as_deref().unwrap_or(""));
    // Findings.
    h.push_str("<section id=\"findings\"><h2>Findings</h2>\n");
    if findings.rows.is_empty() {
        h.push_str("<p>No findings.</p>\n");
    }
    for i in 0..findings.rows.len() {
        let severity = findings.get(i, "severity").unwrap_or("info");
        // Where it points, as a link that zooms the timeline there when it is in its window.
        let at = match (findings.int(i, "at_ts"), findings.int(i, "at_dur")) {
            (Some(ts), Some(dur)) => {
                let link = window
                    .as_ref()
                    .filter(|w| ts < w.hi && ts + dur >= w.lo)
                    .map(|w| {
                        let pad = (dur / 2).max(1);
                        let ms = |t: i64| (t - w.lo).max(0) as f64 / 1e6;
                        format!(
                            " <a href=\"#t={:.6}-{:.6}\">show on the timeline</a>",
                            ms(ts - pad),
                            ms(ts + dur + pad)
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "<div class=\"at\" data-at-ts=\"{ts}\" data-ns=\"{dur}\">at {} ns{}, for {}{link}</div>",
                    ts,
                    findings
                        .get(i, "at_rank")
                        .map(|r| format!(" on rank {}", esc(r)))
                        .unwrap_or_default(),
                    human_ns(dur)
                )
            }
            _ => String::new(),
        };
        let _ = write!(
            h,
            "<div class=\"finding {}\"><div class=\"ftitle\"><span class=\"sev\">{}</span> {}</div><div class=\"evidence\">{}</div><div class=\"action\">{}</div>{at}</div>\n",
            esc(severity),
            esc(severity),
            esc(findings.get(i, "title").unwrap_or("")),
            esc(findings.get(i, "evidence").unwrap_or("")),
            esc(findings.get(i, "action").unwrap_or("")),
        );
    }
    h.push_str("</section>\n");
    // Comparison.
    if let (Some(c), Some(b)) = (&comparison, &opts.baseline) {
        let _ = write!(h, "<section id=\"compare\"><h2>Against {}</h2>\n", esc(b));
        if c.rows.is_empty() {
            h.push_str("<p>No kernel changed significantly.</p>\n");
        } else {
            h.push_str("<p class=\"note\">What <code>compare</code> says: each kernel's time per step (per instance without steps), the change, and its status: <i>slower</i>/<i>faster</i> only past 2 % and significant (p &lt; 0.01, corrected for the number of kernels), judged beyond the run-wide shift where there is one.</p>\n<table class=\"sortable\"><colgroup><col style=\"width:34%\"><col style=\"width:13%\"><col style=\"width:10%\"><col style=\"width:10%\"><col style=\"width:10%\"><col style=\"width:8%\"><col style=\"width:8%\"><col style=\"width:7%\"></colgroup><thead><tr><th>kernel</th><th>status</th><th class=\"n\">baseline</th><th class=\"n\">this run</th><th class=\"n\">delta</th><th class=\"n\">ratio</th><th class=\"n\">beyond run</th><th class=\"n\">p (adj.)</th></tr></thead><tbody>\n");
            for i in 0..c.rows.len() {
                let (a, bb, d) = (
                    c.num(i, "value_a").unwrap_or(0.0).round() as i64,
                    c.num(i, "value_b").unwrap_or(0.0).round() as i64,
                    c.num(i, "delta").unwrap_or(0.0).round() as i64,
                );
                let status = c.get(i, "status").unwrap_or("");
                let beyond = match (c.num(i, "typical_ratio"), c.num(i, "run_shift")) {
                    (Some(t), Some(r)) if r > 0.0 => format!("{:.2}x", t / r),
                    (Some(t), None) => format!("{t:.2}x"),
                    _ => "-".into(),
                };
                let _ = write!(
                    h,
                    "<tr class=\"{}\"><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td class=\"n\" data-ns=\"{a}\">{}</td><td class=\"n\" data-ns=\"{bb}\">{}</td><td class=\"n\" data-ns=\"{d}\">{}</td><td class=\"n\">{}</td><td class=\"n\">{beyond}</td><td class=\"n\">{}</td></tr>\n",
                    esc(status.split(' ').next().unwrap_or("")),
                    esc(c.get(i, "name").unwrap_or("")),
                    esc(c.get(i, "short").unwrap_or("")),
                    esc(status),
                    human_ns(a),
                    human_ns(bb),
                    human_ns(d),
                    c.num(i, "ratio").map_or("-".into(), |r| format!("{r:.2}x")),
                    c.num(i, "p_adjusted").map_or("-".into(), |p| format!("{p:.3}")),
                );
            }
            h.push_str("</tbody></table>\n");
        }
        h.push_str("</section>\n");
    }
    let _ = write!(
        h,
        "<footer>Made by gpuq from run {}. Every figure is what the SQL functions return; exact values in each element's data-ns (nanoseconds) or data-value attribute.</footer>\n<script>{}{SCRIPT}</script>\n</body></html>\n",
        esc(&opts.run),
        timeline::SCRIPT
    );
    Ok(h)
}

/// A muted line under the facts naming what a PyTorch trace did not record and how to record
/// it (allocator events, module ranges); empty when nothing is missing or the trace is not
/// PyTorch's.
fn not_recorded(kineto: bool, no_memory: bool, no_modules: bool) -> String {
    let mut missing = Vec::new();
    if kineto && no_memory {
        missing.push(
            "the allocator's memory (<code>torch.profiler.profile(profile_memory=True)</code>)",
        );
    }
    if kineto && no_modules {
        missing.push("<code>nn.Module</code> ranges (<code>with_stack=True</code>)");
    }
    if missing.is_empty() {
        return String::new();
    }
    format!(
        "<p class=\"note\" id=\"not-recorded\">Not recorded in this trace: {}.</p>",
        missing.join("; ")
    )
}

/// Bars of each step's duration (first rank's steps; steps of other ranks as a dot), busy part
/// darker, outliers (more than 1.2 times the median) marked.
fn steps_chart(steps: &Table) -> String {
    let n = steps.rows.len();
    let max = (0..n)
        .filter_map(|i| steps.int(i, "dur"))
        .max()
        .unwrap_or(1)
        .max(1);
    let width = (n as f64 * 12.0).clamp(300.0, 1000.0);
    let bar = width / n as f64;
    let mut svg = format!(
        "<svg class=\"steps\" viewBox=\"0 0 {width:.0} 160\" role=\"img\"><line x1=\"0\" y1=\"150\" x2=\"{width:.0}\" y2=\"150\" stroke=\"#888\"/>"
    );
    for i in 0..n {
        let dur = steps.int(i, "dur").unwrap_or(0);
        let busy = steps.int(i, "gpu_busy").unwrap_or(0).min(dur);
        let vs = steps.num(i, "vs_median").unwrap_or(1.0);
        let hgt = dur as f64 / max as f64 * 145.0;
        let hb = busy as f64 / max as f64 * 145.0;
        let x = i as f64 * bar;
        let outlier = vs > 1.2;
        let _ = write!(
            svg,
            "<g class=\"step{}\" data-step=\"{}\" data-rank=\"{}\" data-ns=\"{dur}\"><title>rank {} step {}: {} ({}x median), GPU busy {}, idle {}%</title><rect x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{hgt:.2}\" fill=\"{}\"/><rect x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{hb:.2}\" fill=\"#4e79a7\"/></g>",
            if outlier { " outlier" } else { "" },
            esc(steps.get(i, "step").unwrap_or("")),
            esc(steps.get(i, "rank").unwrap_or("")),
            esc(steps.get(i, "rank").unwrap_or("-")),
            esc(steps.get(i, "step").unwrap_or("?")),
            human_ns(dur),
            vs,
            human_ns(busy),
            steps.num(i, "idle_pct").unwrap_or(0.0),
            150.0 - hgt,
            (bar * 0.85).max(0.5),
            if outlier { "#e15759" } else { "#bab0ac" },
            150.0 - hb,
            (bar * 0.85).max(0.5),
        );
    }
    svg.push_str("</svg><div class=\"legend\"><span><i style=\"background:#4e79a7\"></i>GPU busy</span><span><i style=\"background:#bab0ac\"></i>step</span><span><i style=\"background:#e15759\"></i>over 1.2x the median step</span></div>");
    svg
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}h3{font-size:15px}\
table{border-collapse:collapse;width:100%;table-layout:fixed}.note{color:#555;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}\
th{cursor:pointer;background:#f6f6f6}.n{text-align:right;white-space:nowrap}.name{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}\
.facts th{width:10%;cursor:default}.facts{table-layout:auto}.bar{width:100%;height:28px;display:block}.steps{width:100%;height:170px}.mem{width:100%;height:64px;display:block;margin-bottom:6px}.ovh{font-size:13px;margin:4px 0}\
.legend span{margin-right:14px;white-space:nowrap;font-size:13px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px}\
.row{margin:10px 0}.label{font-size:13px;margin-bottom:2px}.share{display:inline-block;height:9px;background:#4e79a7;margin-right:6px}\
.finding{border-left:4px solid #bab0ac;padding:6px 10px;margin:10px 0;background:#fafafa}.finding.high{border-color:#e15759}.finding.medium{border-color:#f28e2b}\
.sev{font-weight:bold;text-transform:uppercase;font-size:12px}.ftitle{font-weight:600}.evidence{color:#555;font-size:13px}.action{margin-top:3px}\
tr.slower td{background:#fdecea}tr.faster td{background:#eaf6ea}footer{margin-top:30px;color:#777;font-size:12px}\
.util{margin:4px 0}.strip{width:100%;height:16px;display:block}.tl{display:flex;border:1px solid #ddd}.lanes{flex:0 0 170px;font-size:11px;border-right:1px solid #ddd}\
.lane{height:14px;line-height:14px;overflow:hidden;white-space:nowrap;text-overflow:ellipsis;padding:0 4px}.tl-plot{flex:1;min-width:0}#timeline-svg{width:100%;display:block;cursor:grab}\
#tl-tip{min-height:18px;font-size:12px;color:#333;margin:3px 0}.tl-tools{margin:4px 0;font-size:12px}.tl-tools button{margin-right:4px}.at{font-size:12px;color:#555}\
@media print{th{cursor:default}.tl-tools{display:none}}";

/// Sorts a table by the clicked column (by `data-ns`/`data-value` where present), and marks
/// the page rendered.
const SCRIPT: &str = "document.querySelectorAll('table.sortable th').forEach(function(th,col){th.addEventListener('click',function(){\
var body=th.closest('table').tBodies[0];var rows=Array.prototype.slice.call(body.rows);var asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';\
function key(r){var c=r.cells[col];var v=c.dataset.ns||c.dataset.value;return v!==undefined?parseFloat(v):c.textContent;}\
rows.sort(function(a,b){var x=key(a),y=key(b);var r=(typeof x==='number'&&typeof y==='number')?x-y:String(x).localeCompare(String(y));return asc?r:-r;});\
rows.forEach(function(r){body.appendChild(r);});});});document.body.dataset.rendered='ok';";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human_ns(812), "812 ns");
        assert_eq!(human_ns(13_300), "13.3 us");
        assert_eq!(human_ns(4_070_000), "4.07 ms");
        assert_eq!(human_ns(1_520_000_000), "1.52 s");
        assert_eq!(human_ns(-2_000), "-2.0 us");
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
