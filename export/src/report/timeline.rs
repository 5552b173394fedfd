//! The report's pictures of time: a timeline of a window of the run (the selected steps; else
//! the slowest step with its neighbours; else the whole run) with a lane per GPU stream, the
//! idle gaps by cause, the steps and the findings' moments, drawn as inline SVG that zooms and
//! pans in the page; and a utilisation strip per GPU (`gpu_util`) over the run.
//!
//! The page must stay small on any run: operations closer than a pixel of the window merge
//! into one bar (its tooltip says how many it holds), and the merge coarsens until the whole
//! timeline holds at most [`MAX_BARS`] bars.

use super::{esc, human_ns, Table};
use crate::{for_each_batch, i32s, i64s, opt, sql_text, strs, text, Result};
use datafusion::execution::context::SessionContext;
use gpuq_query::analyses::data::Names;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The most bars a timeline draws (about 75 bytes each).
pub const MAX_BARS: usize = 12_000;

/// The SVG's width in its own units: times map to `0..WIDTH`.
const WIDTH: f64 = 10_000.0;
const LANE: f64 = 14.0;

/// Operation and gap classes, with their colours.
const CLASSES: [(&str, &str); 19] = [
    ("gemm", "#4e79a7"),
    ("conv", "#2f5f8a"),
    ("attention", "#76b7b2"),
    ("elementwise", "#a0cbe8"),
    ("reduction", "#86bcb6"),
    ("norm", "#9c755f"),
    ("softmax", "#b07aa1"),
    ("copy", "#8cd17d"),
    ("communication", "#f28e2b"),
    ("other", "#79706e"),
    ("memcpy", "#59a14f"),
    ("memset", "#b6992d"),
    // Gap causes.
    ("sync", "#e15759"),
    ("dataloader", "#ff9da7"),
    ("host_wait", "#edc948"),
    ("short", "#d7d7d7"),
    ("stage", "#d4a6c8"),
    ("step", "#cfcfcf"),
    ("finding", "#e15759"),
];

fn class_index(class: &str) -> u8 {
    CLASSES.iter().position(|c| c.0 == class).unwrap_or(9) as u8
}

/// The time the timeline shows, and why.
pub(super) struct Window {
    pub lo: i64,
    pub hi: i64,
    pub label: String,
}

/// The window: the selected steps' span; else the slowest step (by `vs_median`) and its
/// neighbours, on every rank; else the run's GPU span. `steps` is `step_stats`' rows
/// (`rank, step, ts, dur, vs_median`).
pub(super) async fn choose(
    ctx: &SessionContext,
    run: &str,
    steps: &Table,
    selected: Option<&str>,
) -> Result<Option<Window>> {
    let n = steps.rows.len();
    let span_of = |keep: &dyn Fn(i64) -> bool| {
        let mut lo = i64::MAX;
        let mut hi = i64::MIN;
        for i in 0..n {
            let (Some(step), Some(ts), Some(dur)) = (
                steps.int(i, "step"),
                steps.int(i, "ts"),
                steps.int(i, "dur"),
            ) else {
                continue;
            };
            if keep(step) {
                lo = lo.min(ts);
                hi = hi.max(ts + dur);
            }
        }
        (lo < hi).then_some((lo, hi))
    };
    if let Some(sel) = selected {
        if let Some((lo, hi)) = span_of(&|_| true) {
            return Ok(Some(Window {
                lo,
                hi,
                label: format!("steps {sel}"),
            }));
        }
    }
    let slowest = (0..n)
        .filter_map(|i| Some((steps.num(i, "vs_median")?, steps.int(i, "step")?)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((vs, step)) = slowest {
        if let Some((lo, hi)) = span_of(&|s| (step - 1..=step + 1).contains(&s)) {
            return Ok(Some(Window {
                lo,
                hi,
                label: format!(
                    "steps {}..{}: the slowest step ({step}, {vs:.2}x the median) with its neighbours",
                    step - 1,
                    step + 1
                ),
            }));
        }
    }
    let span = super::query(
        ctx,
        &format!(
            "SELECT min(ts) AS lo, max(ts + dur) AS hi FROM events WHERE run = {} AND kind IN ('kernel', 'memcpy', 'memset')",
            sql_text(run)
        ),
    )
    .await?;
    Ok(match (span.int(0, "lo"), span.int(0, "hi")) {
        (Some(lo), Some(hi)) if hi > lo => Some(Window {
            lo,
            hi,
            label: "the whole run".into(),
        }),
        _ => None,
    })
}

/// A lane of the timeline, in drawing order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Lane {
    Findings,
    Steps(Option<i32>),
    Stream(Option<i32>, Option<i32>, Option<i64>),
    Gaps(Option<i32>, Option<i32>),
}

impl Lane {
    fn label(&self) -> String {
        let q = |v: Option<i64>| v.map_or("?".to_string(), |v| v.to_string());
        let rank = |r: &Option<i32>| r.map_or(String::new(), |r| format!("rank {r} "));
        match self {
            Lane::Findings => "findings".into(),
            Lane::Steps(r) => format!("{}steps", rank(r)),
            Lane::Stream(r, d, s) => {
                format!("{}GPU {} stream {}", rank(r), q(d.map(i64::from)), q(*s))
            }
            Lane::Gaps(r, d) => format!("{}GPU {} idle", rank(r), q(d.map(i64::from))),
        }
    }
}

/// A bar: one operation, or several closer than the merge distance.
#[derive(Debug, Clone, Copy)]
struct Bar {
    start: i64,
    end: i64,
    /// Operations merged, and their summed time.
    count: u32,
    busy: i64,
    class: u8,
    /// The name (index into the page's name list) of a single operation.
    name: u32,
}

/// Bars per lane, merging each new one into the last when they are closer than `gap_ns` (and
/// of one class, unless `mix`).
#[derive(Default)]
struct Lanes {
    bars: BTreeMap<Lane, Vec<Bar>>,
}

impl Lanes {
    fn push(&mut self, lane: Lane, bar: Bar, gap_ns: i64, mix: bool) {
        // Steps never merge: each is its own bar.
        let merges = !matches!(lane, Lane::Steps(_));
        let v = self.bars.entry(lane).or_default();
        if let (Some(last), true) = (v.last_mut(), merges) {
            if bar.start - last.end <= gap_ns && (mix || last.class == bar.class) {
                if mix && bar.busy > last.busy {
                    last.class = bar.class;
                }
                last.end = last.end.max(bar.end);
                last.count += bar.count;
                last.busy += bar.busy;
                return;
            }
        }
        v.push(bar);
    }

    fn len(&self) -> usize {
        self.bars.values().map(Vec::len).sum()
    }

    /// The same lanes merged again, coarser.
    fn coarser(self, gap_ns: i64, mix: bool) -> Lanes {
        let mut out = Lanes::default();
        for (lane, bars) in self.bars {
            for b in bars {
                out.push(lane.clone(), b, gap_ns, mix);
            }
        }
        out
    }
}

/// The timeline section's HTML (without its heading): lanes, bars, a range line and the
/// script's data. `findings` is the `findings` rows (`at_rank`, `at_ts`, `at_dur`, `title`,
/// `severity`).
pub(super) async fn timeline(
    ctx: &SessionContext,
    run: &str,
    window: &Window,
    findings: &Table,
) -> Result<String> {
    let (lo, hi) = (window.lo, window.hi);
    let ns = (hi - lo).max(1);
    // Operations closer than a pixel of a 2,500-pixel-wide timeline merge.
    let mut gap_ns = ns / 2_500;
    let mut names = Names::default();
    let mut lanes = Lanes::default();
    let run_sql = sql_text(run);
    let ops = format!(
        "SELECT rank, device, stream, CASE WHEN kind = 'kernel' THEN kernel_class(name) ELSE CAST(kind AS VARCHAR) END AS class, \
         short_name(name) AS short, ts, dur FROM events \
         WHERE run = {run_sql} AND kind IN ('kernel', 'memcpy', 'memset') AND ts + dur >= {lo} AND ts < {hi} \
         ORDER BY rank, device, stream, ts"
    );
    for_each_batch(ctx, &ops, |b| {
        let (rank, device, stream) = (i32s(&b, "rank")?, i32s(&b, "device")?, i64s(&b, "stream")?);
        let (class, short) = (strs(&b, "class")?, strs(&b, "short")?);
        let (ts, dur) = (i64s(&b, "ts")?, i64s(&b, "dur")?);
        for i in 0..b.num_rows() {
            let (s, e) = (ts.value(i).max(lo), (ts.value(i) + dur.value(i)).min(hi));
            let lane = Lane::Stream(opt(&rank, i), opt(&device, i), opt(&stream, i));
            let bar = Bar {
                start: s,
                end: e.max(s),
                count: 1,
                busy: e - s,
                class: class_index(text(&class, i).unwrap_or("other")),
                name: names.id(text(&short, i).unwrap_or("")),
            };
            lanes.push(lane, bar, gap_ns, false);
        }
        Ok(())
    })
    .await?;
    let gaps = format!(
        "SELECT rank, device, ts, dur, cause FROM gpu_gaps({run_sql}, 0) \
         WHERE ts + dur >= {lo} AND ts < {hi} ORDER BY rank, device, ts"
    );
    for_each_batch(ctx, &gaps, |b| {
        let (rank, device) = (i32s(&b, "rank")?, i32s(&b, "device")?);
        let (ts, dur, cause) = (i64s(&b, "ts")?, i64s(&b, "dur")?, strs(&b, "cause")?);
        for i in 0..b.num_rows() {
            let (s, e) = (ts.value(i).max(lo), (ts.value(i) + dur.value(i)).min(hi));
            let cause = text(&cause, i).unwrap_or("other");
            let bar = Bar {
                start: s,
                end: e.max(s),
                count: 1,
                busy: e - s,
                class: class_index(cause),
                name: names.id(cause),
            };
            lanes.push(
                Lane::Gaps(opt(&rank, i), opt(&device, i)),
                bar,
                gap_ns,
                false,
            );
        }
        Ok(())
    })
    .await?;
    let steps = format!(
        "SELECT rank, step, ts, dur FROM steps WHERE run = {run_sql} AND ts + dur >= {lo} AND ts < {hi} ORDER BY rank, ts"
    );
    for_each_batch(ctx, &steps, |b| {
        let (rank, step) = (i32s(&b, "rank")?, i64s(&b, "step")?);
        let (ts, dur) = (i64s(&b, "ts")?, i64s(&b, "dur")?);
        for i in 0..b.num_rows() {
            let (s, e) = (ts.value(i).max(lo), (ts.value(i) + dur.value(i)).min(hi));
            let name = opt(&step, i).map_or("step".into(), |s| format!("step {s}"));
            let bar = Bar {
                start: s,
                end: e.max(s),
                count: 1,
                busy: e - s,
                class: class_index("step"),
                name: names.id(&name),
            };
            lanes.push(Lane::Steps(opt(&rank, i)), bar, 0, false);
        }
        Ok(())
    })
    .await?;
    // Findings whose moment falls in the window, as markers.
    let mut markers = Vec::new();
    for i in 0..findings.rows.len() {
        let (Some(ts), Some(dur)) = (findings.int(i, "at_ts"), findings.int(i, "at_dur")) else {
            continue;
        };
        if ts + dur < lo || ts >= hi {
            continue;
        }
        markers.push((i, ts.max(lo), (ts + dur).min(hi)));
    }
    // Coarser until the page stays small: first merging within a class, then across.
    let mut rounds = 0;
    while lanes.len() > MAX_BARS && rounds < 24 {
        gap_ns = (gap_ns * 2).max(1);
        lanes = lanes.coarser(gap_ns, rounds >= 6);
        rounds += 1;
    }
    let order: Vec<Lane> = {
        let mut v: Vec<Lane> = lanes.bars.keys().cloned().collect();
        if !markers.is_empty() {
            v.push(Lane::Findings);
        }
        // By rank, then findings and steps first, then each GPU's streams and its idle lane.
        v.sort_by_key(|l| match l {
            Lane::Findings => (None, 0, None, 0, None),
            Lane::Steps(r) => (*r, 1, None, 0, None),
            Lane::Stream(r, d, s) => (*r, 2, *d, 0, *s),
            Lane::Gaps(r, d) => (*r, 2, *d, 1, None),
        });
        v
    };
    let height = order.len() as f64 * LANE;
    let x = |t: i64| (t - lo) as f64 / ns as f64 * WIDTH;
    let mut svg = String::with_capacity(lanes.len() * 80 + 4096);
    let mut labels = String::new();
    let _ = write!(
        svg,
        "<svg id=\"timeline-svg\" viewBox=\"0 0 {WIDTH} {height}\" preserveAspectRatio=\"none\" style=\"height:{height}px\" \
         data-lo=\"{lo}\" data-ns=\"{ns}\" data-w=\"{WIDTH}\" data-h=\"{height}\" role=\"img\">"
    );
    for (row, lane) in order.iter().enumerate() {
        let y = row as f64 * LANE;
        let _ = write!(
            labels,
            "<div class=\"lane\" title=\"{0}\">{0}</div>",
            esc(&lane.label())
        );
        if row % 2 == 1 {
            let _ = write!(
                svg,
                "<rect x=\"0\" y=\"{y}\" width=\"{WIDTH}\" height=\"{LANE}\" fill=\"#f7f7f7\"/>"
            );
        }
        if *lane == Lane::Findings {
            for &(i, s, e) in &markers {
                let severity = findings.get(i, "severity").unwrap_or("low");
                let _ = write!(
                    svg,
                    "<rect class=\"fm {}\" x=\"{:.3}\" y=\"{:.1}\" width=\"{:.3}\" height=\"{:.1}\" data-f=\"{i}\" data-ts=\"{s}\" data-dur=\"{}\"/>",
                    esc(severity),
                    x(s),
                    y + 1.0,
                    (x(e) - x(s)).max(0.0),
                    LANE - 2.0,
                    e - s
                );
            }
            continue;
        }
        let Some(bars) = lanes.bars.get(lane) else {
            continue;
        };
        let kind = match lane {
            Lane::Gaps(..) => "g",
            Lane::Steps(..) => "s",
            _ => "o",
        };
        for b in bars {
            let _ = write!(
                svg,
                "<rect class=\"{kind} c{}\" x=\"{:.3}\" y=\"{:.1}\" width=\"{:.3}\" height=\"{:.1}\" data-k=\"{}\" data-n=\"{}\" data-b=\"{}\"/>",
                b.class,
                x(b.start),
                y + 1.0,
                (x(b.end) - x(b.start)).max(0.0),
                LANE - 2.0,
                b.name,
                b.count,
                b.busy
            );
        }
    }
    svg.push_str("</svg>");
    let mut css = String::new();
    for (i, (_, color)) in CLASSES.iter().enumerate() {
        let _ = write!(css, "#timeline .c{i}{{fill:{color}}}");
    }
    let legend: String = CLASSES
        .iter()
        .filter(|(c, _)| !matches!(*c, "finding" | "step"))
        .map(|(c, color)| format!("<span><i style=\"background:{color}\"></i>{c}</span>"))
        .collect();
    let finding_titles: Vec<String> = (0..findings.rows.len())
        .map(|i| findings.get(i, "title").unwrap_or("").to_string())
        .collect();
    let data = serde_json::json!({
        "names": names.names,
        "classes": CLASSES.iter().map(|c| c.0).collect::<Vec<_>>(),
        "findings": finding_titles,
    });
    let mut h = String::with_capacity(svg.len() + labels.len() + 4096);
    let _ = write!(
        h,
        "<p class=\"note\">{} &middot; <span data-ns=\"{ns}\">{}</span> from <span data-ns=\"{lo}\">{lo}</span> ns. \
         Wheel or the buttons to zoom, drag to pan, double-click to reset; the address <code>#t=FROM-TO</code> (ms after the window's start) opens a part. \
         Operations closer than a pixel merge into one bar; the full detail is in <code>gpuq export</code>'s Perfetto trace.</p>\n\
         <div class=\"tl-tools\"><button type=\"button\" data-z=\"in\">zoom in</button><button type=\"button\" data-z=\"out\">zoom out</button><button type=\"button\" data-z=\"reset\">whole window</button> <span id=\"tl-range\"></span></div>\n\
         <div class=\"tl\"><div class=\"lanes\">{labels}</div><div class=\"tl-plot\">{svg}</div></div><div id=\"tl-tip\"></div>\n\
         <div class=\"legend\">{legend}<span><i style=\"background:#e15759;outline:1px solid #900\"></i>finding</span></div>\n\
         <style>{css}#timeline .s{{stroke:#fff;stroke-width:2;vector-effect:non-scaling-stroke}}#timeline .fm{{fill:#e15759;fill-opacity:.35;stroke:#b00;stroke-width:1;vector-effect:non-scaling-stroke}}#timeline .fm.medium{{fill:#f28e2b}}#timeline .fm.low{{fill:#bab0ac}}</style>\n\
         <script type=\"application/json\" id=\"tl-data\">{}</script>\n",
        esc(&window.label),
        human_ns(ns),
        // `</` must not end the script element early.
        data.to_string().replace("</", "<\\/"),
    );
    Ok(h)
}

/// Each GPU's utilisation over the run (`gpu_util`, 100 chunks): a strip of cells shaded by
/// `in_use_pct`, each cell's exact value in `data-value`.
pub(super) async fn utilisation(
    ctx: &SessionContext,
    run: &str,
    steps: Option<&str>,
) -> Result<String> {
    let steps_arg = steps.map_or(String::new(), |s| format!(", NULL, {}", sql_text(s)));
    let rows = super::query(
        ctx,
        &format!(
            "SELECT rank, device, ts, dur, in_use_pct FROM gpu_util({}, 100{steps_arg}) ORDER BY rank, device, ts",
            sql_text(run)
        ),
    )
    .await?;
    let n = rows.rows.len();
    if n == 0 {
        return Ok("<p>No GPU work.</p>".into());
    }
    let lo = (0..n).filter_map(|i| rows.int(i, "ts")).min().unwrap_or(0);
    let hi = (0..n)
        .filter_map(|i| Some(rows.int(i, "ts")? + rows.int(i, "dur")?))
        .max()
        .unwrap_or(lo + 1);
    let ns = (hi - lo).max(1) as f64;
    let mut by_device: BTreeMap<(Option<i64>, Option<i64>), Vec<usize>> = BTreeMap::new();
    for i in 0..n {
        by_device
            .entry((rows.int(i, "rank"), rows.int(i, "device")))
            .or_default()
            .push(i);
    }
    let mut h = String::new();
    for ((rank, device), cells) in &by_device {
        let label = match rank {
            Some(r) => format!(
                "rank {r} GPU {}",
                device.map_or("?".into(), |d| d.to_string())
            ),
            None => format!("GPU {}", device.map_or("?".into(), |d| d.to_string())),
        };
        let _ = write!(
            h,
            "<div class=\"util\"><div class=\"label\">{}</div><svg class=\"strip\" viewBox=\"0 0 1000 16\" preserveAspectRatio=\"none\" role=\"img\">",
            esc(&label)
        );
        for &i in cells {
            let (ts, dur) = (
                rows.int(i, "ts").unwrap_or(0),
                rows.int(i, "dur").unwrap_or(0),
            );
            let pct = rows.num(i, "in_use_pct").unwrap_or(0.0);
            let _ = write!(
                h,
                "<rect x=\"{:.2}\" y=\"0\" width=\"{:.2}\" height=\"16\" fill=\"{}\" data-value=\"{pct}\"><title>{} for {}: {pct:.1}% busy</title></rect>",
                (ts - lo) as f64 / ns * 1000.0,
                dur as f64 / ns * 1000.0,
                shade(pct),
                human_ns(ts - lo),
                human_ns(dur),
            );
        }
        h.push_str("</svg></div>\n");
    }
    h.push_str("<div class=\"legend\"><span><i style=\"background:#f4f4f4\"></i>idle</span><span><i style=\"background:#6b8fb8\"></i>50% busy</span><span><i style=\"background:#1f3f66\"></i>100%</span> &middot; time runs left to right over the GPUs' span</div>");
    Ok(h)
}

/// A cell's colour: light grey at 0 % to dark blue at 100 % (and above).
fn shade(pct: f64) -> String {
    let t = (pct / 100.0).clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(244.0, 31.0),
        mix(244.0, 63.0),
        mix(244.0, 102.0)
    )
}

/// Zoom, pan, tooltips and `#t=FROM-TO` (ms after the window's start) for the timeline.
pub(super) const SCRIPT: &str = "(function(){var svg=document.getElementById('timeline-svg');if(!svg)return;\
var W=+svg.dataset.w,H=+svg.dataset.h,NS=+svg.dataset.ns,x0=0,w=W;var data=JSON.parse(document.getElementById('tl-data').textContent);\
var range=document.getElementById('tl-range'),tip=document.getElementById('tl-tip');\
function fmt(ns){var a=Math.abs(ns);return a<1e3?ns.toFixed(0)+' ns':a<1e6?(ns/1e3).toFixed(1)+' us':a<1e9?(ns/1e6).toFixed(3)+' ms':(ns/1e9).toFixed(3)+' s';}\
function set(){w=Math.max(W*1e-7,Math.min(W,w));x0=Math.max(0,Math.min(x0,W-w));svg.setAttribute('viewBox',x0+' 0 '+w+' '+H);\
range.textContent=fmt(x0/W*NS)+' to '+fmt((x0+w)/W*NS)+' after the window start ('+fmt(w/W*NS)+' shown)';svg.dataset.view=(x0/W*NS).toFixed(0)+'-'+((x0+w)/W*NS).toFixed(0);}\
function zoom(f,c){var nw=w*f;x0=c-(c-x0)*(nw/w);w=nw;set();}\
svg.addEventListener('wheel',function(e){e.preventDefault();var r=svg.getBoundingClientRect();zoom(e.deltaY>0?1.25:0.8,x0+(e.clientX-r.left)/r.width*w);},{passive:false});\
var drag=null;svg.addEventListener('mousedown',function(e){drag={x:e.clientX,x0:x0};});\
window.addEventListener('mouseup',function(){drag=null;});\
window.addEventListener('mousemove',function(e){if(!drag)return;var r=svg.getBoundingClientRect();x0=drag.x0-(e.clientX-drag.x)/r.width*w;set();});\
svg.addEventListener('dblclick',function(){x0=0;w=W;set();});\
document.querySelectorAll('.tl-tools button').forEach(function(b){b.addEventListener('click',function(){var z=b.dataset.z;if(z==='reset'){x0=0;w=W;set();}else zoom(z==='in'?0.5:2,x0+w/2);});});\
svg.addEventListener('mousemove',function(e){var t=e.target,d=t.dataset;if(!d||(d.k===undefined&&d.f===undefined)){tip.textContent='';return;}\
var s=(+t.getAttribute('x'))/W*NS,len=(+t.getAttribute('width'))/W*NS,txt;\
if(d.f!==undefined)txt='finding: '+data.findings[+d.f]+' ('+fmt(+d.dur)+')';\
else{var cls=data.classes[+t.getAttribute('class').split(' c')[1]];txt=(+d.n>1?d.n+' operations ('+cls+'), busy '+fmt(+d.b)+' of '+fmt(len):data.names[+d.k]+' ('+cls+', '+fmt(len)+')');}\
tip.textContent=txt+' at '+fmt(s)+' after the window start';});\
function fromHash(){var m=/#t=([0-9.]+)-([0-9.]+)/.exec(location.hash);if(!m)return;var a=+m[1]*1e6,b=+m[2]*1e6;if(b>a){x0=a/NS*W;w=(b-a)/NS*W;}}\
fromHash();set();window.addEventListener('hashchange',function(){fromHash();set();});})();";
