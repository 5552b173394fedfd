//! `inference_phases(run [, steps])`: the steps of a serving engine, each as prefill, decode or
//! mixed, with its batch size, tokens, GPU time and time per token, and which steps are steady.
//!
//! Serving engines mark each forward step with an annotation (`user_annotation` / NVTX range):
//! - SGLang: `step[EXTEND bs=15 toks=15360]`, `step[DECODE bs=64]`, `step[MIXED ...]`, `IDLE`,
//!   `TARGET_VERIFY`, `DRAFT_EXTEND`: EXTEND is prefill; a DECODE step without `toks` makes one
//!   token per request;
//! - vLLM (and TraceLens' annotations of it): `execute_N_context_C(sq..)_generation_G(sq..)`:
//!   N tokens, C prefill (context) requests and G decode (generation) requests.
//!
//! A marker inside another marker of the same thread describes the same step more tightly
//! (SGLang writes both), so only innermost markers are steps. Per step: `phase` (`prefill`,
//! `decode`, `mixed` when both kinds of request are batched, else the engine's word in lower
//! case), `requests`, `prefill_requests`, `decode_requests`, `tokens` (NULL when the marker
//! does not say), `dur` (the marker's host time), the GPU work launched inside it as
//! `gpu_projection` defines it (`gpu_span`, first start to last end; `gpu_busy`, their union;
//! `gpu_ops`), `latency`, from the marker's start until both it and its GPU work have ended
//! (the host only launches: a prefill marker of 29 ms can launch 0.5 s of GPU work), and
//! `per_token` = `latency / tokens` in ns.
//!
//! `steady` marks the steady state of each (rank, phase): with three steps or more, the first
//! tenth (at least one step) is warm-up, and a later step is steady when its duration is within
//! [`STEADY_TOLERANCE_PCT`] % of the median latency of the later steps. With fewer than three
//! it is NULL.
//!
//! ```sql
//! SELECT phase, count(*), avg(per_token) FROM inference_phases('serve') WHERE steady GROUP BY phase;
//! ```

use super::data::{Names, Scope};
use super::history::stats::median_ints;
use super::projection;
use super::{batch, Call, Spec};
use datafusion::arrow::array::StringArray;
use datafusion::arrow::array::{ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use futures::FutureExt;
use std::collections::BTreeMap;
use std::sync::Arc;

pub static INFERENCE_PHASES: Spec = Spec::of_run("inference_phases", schema, |ctx, call| {
    compute(ctx, call).boxed()
});

/// A step within this share of its phase's median duration is steady.
pub const STEADY_TOLERANCE_PCT: f64 = 25.0;

fn schema() -> SchemaRef {
    let f = |name, t, null| Field::new(name, t, null);
    Arc::new(Schema::new(vec![
        f("run", DataType::Utf8, false),
        f("rank", DataType::Int32, true),
        f("ts", DataType::Int64, false),
        f("dur", DataType::Int64, false),
        f("name", DataType::Utf8, false),
        f("phase", DataType::Utf8, false),
        f("requests", DataType::Int64, true),
        f("prefill_requests", DataType::Int64, true),
        f("decode_requests", DataType::Int64, true),
        f("tokens", DataType::Int64, true),
        f("gpu_span", DataType::Int64, false),
        f("gpu_busy", DataType::Int64, false),
        f("gpu_ops", DataType::Int64, false),
        f("latency", DataType::Int64, false),
        f("per_token", DataType::Float64, true),
        f("steady", DataType::Boolean, true),
    ]))
}

/// What a step marker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub phase: String,
    pub requests: Option<i64>,
    pub prefill_requests: Option<i64>,
    pub decode_requests: Option<i64>,
    pub tokens: Option<i64>,
}

/// Reads a serving engine's step marker; `None` for any other name.
pub fn parse_marker(name: &str) -> Option<Marker> {
    if let Some(inner) = name.strip_prefix("step[").and_then(|s| s.strip_suffix(']')) {
        // SGLang: step[MODE key=value ...]
        let mut words = inner.split_whitespace();
        let mode = words.next()?;
        if !mode.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
            return None;
        }
        let value = |key: &str| {
            inner
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse::<i64>().ok())
        };
        let bs = value("bs");
        let toks = value("toks");
        let (phase, prefill, decode, tokens) = match mode {
            "EXTEND" | "PREFILL" => ("prefill".to_string(), bs, Some(0), toks),
            "DECODE" => ("decode".to_string(), Some(0), bs, toks.or(bs)),
            other => (other.to_ascii_lowercase(), None, None, toks),
        };
        return Some(Marker {
            phase,
            requests: bs,
            prefill_requests: prefill,
            decode_requests: decode,
            tokens,
        });
    }
    // vLLM: execute_N_context_C(...)_generation_G(...)
    let rest = name.strip_prefix("execute_")?;
    let (tokens, rest) = rest.split_once("_context_")?;
    let tokens: i64 = tokens.parse().ok()?;
    let (context, rest) = rest.split_once('(')?;
    let context: i64 = context.parse().ok()?;
    let (_, generation) = rest.split_once(")_generation_")?;
    let generation: i64 = generation.split('(').next()?.parse().ok()?;
    let phase = match (context > 0, generation > 0) {
        (true, true) => "mixed",
        (true, false) => "prefill",
        (false, true) => "decode",
        (false, false) => "idle",
    };
    Some(Marker {
        phase: phase.to_string(),
        requests: Some(context + generation),
        prefill_requests: Some(context),
        decode_requests: Some(generation),
        tokens: Some(tokens),
    })
}

/// One step of `inference_phases`.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseStep {
    pub rank: Option<i32>,
    pub ts: i64,
    pub dur: i64,
    pub name: String,
    pub marker: Marker,
    pub gpu_span: i64,
    pub gpu_busy: i64,
    pub gpu_ops: i64,
    pub latency: i64,
    pub steady: Option<bool>,
}

impl PhaseStep {
    pub fn per_token(&self) -> Option<f64> {
        self.marker
            .tokens
            .filter(|t| *t > 0)
            .map(|t| self.latency as f64 / t as f64)
    }
}

/// The steps of `run` within `scope`, in time order per rank.
pub async fn load(ctx: &SessionContext, run: &str, scope: &Scope) -> Result<Vec<PhaseStep>> {
    let mut names = Names::default();
    let projected = projection::load(ctx, run, &mut names).await?;
    // rank -> markers that launched GPU work: (start, end, name id, projection)
    let mut by_rank: BTreeMap<Option<i32>, Vec<(projection::Projected, Marker)>> = BTreeMap::new();
    for (rank, p) in projected {
        if let Some(m) = parse_marker(names.get(p.key.0)) {
            by_rank.entry(rank).or_default().push((p, m));
        }
    }
    let mut out = Vec::new();
    for (rank, mut markers) in by_rank {
        markers.sort_by_key(|(p, _)| (p.range_start, std::cmp::Reverse(p.range_dur)));
        // Innermost only: a marker that holds another marker of the rank is the same step.
        // Of two markers with the same span, the first in this order counts.
        let holds = |o: usize, i: usize| {
            let (outer, inner) = (&markers[o].0, &markers[i].0);
            let same = (outer.range_start, outer.range_dur) == (inner.range_start, inner.range_dur);
            o != i
                && outer.range_start <= inner.range_start
                && inner.range_start + inner.range_dur <= outer.range_start + outer.range_dur
                && (!same || o > i)
        };
        let inner: Vec<usize> = (0..markers.len())
            .filter(|&o| !(0..markers.len()).any(|i| holds(o, i)))
            .collect();
        for i in inner {
            let (p, m) = &markers[i];
            let Some((ts, end)) = scope.clip(rank, p.range_start, p.range_start + p.range_dur)
            else {
                continue;
            };
            if (ts, end) != (p.range_start, p.range_start + p.range_dur) {
                continue;
            }
            out.push(PhaseStep {
                rank,
                ts: p.range_start,
                dur: p.range_dur,
                name: names.get(p.key.0).to_string(),
                marker: m.clone(),
                gpu_span: p.proj_end - p.proj_start,
                gpu_busy: p.busy,
                gpu_ops: p.ops,
                latency: (p.range_start + p.range_dur).max(p.proj_end) - p.range_start,
                steady: None,
            });
        }
    }
    mark_steady(&mut out);
    Ok(out)
}

/// Sets `steady` per (rank, phase), as the module documentation defines it.
fn mark_steady(steps: &mut [PhaseStep]) {
    let mut groups: BTreeMap<(Option<i32>, String), Vec<usize>> = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        groups
            .entry((s.rank, s.marker.phase.clone()))
            .or_default()
            .push(i);
    }
    for (_, mut idx) in groups {
        if idx.len() < 3 {
            continue;
        }
        idx.sort_by_key(|&i| steps[i].ts);
        let warmup = (idx.len() / 10).max(1);
        let later: Vec<i64> = idx[warmup..].iter().map(|&i| steps[i].latency).collect();
        let median = median_ints(later).unwrap_or(0.0);
        for (k, &i) in idx.iter().enumerate() {
            let near =
                (steps[i].latency as f64 - median).abs() <= median * STEADY_TOLERANCE_PCT / 100.0;
            steps[i].steady = Some(k >= warmup && near);
        }
    }
}

async fn compute(ctx: SessionContext, call: Call) -> Result<Vec<RecordBatch>> {
    let scope = call.scope(&ctx).await?;
    let rows = load(&ctx, &call.run, &scope).await?;
    let int = |f: fn(&PhaseStep) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
    };
    let opt = |f: fn(&PhaseStep) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        call.run_column(rows.len()),
        Arc::new(Int32Array::from_iter(rows.iter().map(|r| r.rank))),
        int(|r| r.ts),
        int(|r| r.dur),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| &r.marker.phase),
        )),
        opt(|r| r.marker.requests),
        opt(|r| r.marker.prefill_requests),
        opt(|r| r.marker.decode_requests),
        opt(|r| r.marker.tokens),
        int(|r| r.gpu_span),
        int(|r| r.gpu_busy),
        int(|r| r.gpu_ops),
        int(|r| r.latency),
        Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.per_token()))),
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| r.steady))),
    ];
    batch(schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_markers_are_read() {
        let m = parse_marker("step[EXTEND bs=15 toks=15360]").unwrap();
        assert_eq!(
            (m.phase.as_str(), m.requests, m.prefill_requests, m.tokens),
            ("prefill", Some(15), Some(15), Some(15360))
        );
        let m = parse_marker("step[DECODE bs=64]").unwrap();
        assert_eq!(
            (m.phase.as_str(), m.decode_requests, m.tokens),
            ("decode", Some(64), Some(64))
        );
        let m = parse_marker(
            "execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)",
        )
        .unwrap();
        assert_eq!(
            (
                m.phase.as_str(),
                m.requests,
                m.prefill_requests,
                m.decode_requests,
                m.tokens
            ),
            ("mixed", Some(46), Some(9), Some(37), Some(8192))
        );
        let m = parse_marker("execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(sq0sk0sqsq0sqsk0)").unwrap();
        assert_eq!(m.phase, "prefill");
        for other in [
            "ProfilerStep#3",
            "step[lowercase]",
            "execute_x_context_1()",
            "step",
        ] {
            assert_eq!(parse_marker(other), None, "{other}");
        }
    }

    #[test]
    fn warm_up_and_outliers_are_not_steady() {
        let step = |ts: i64, dur: i64| PhaseStep {
            rank: None,
            ts,
            dur,
            name: "step[DECODE bs=8]".into(),
            marker: parse_marker("step[DECODE bs=8]").unwrap(),
            gpu_span: 0,
            gpu_busy: 0,
            gpu_ops: 0,
            latency: dur,
            steady: None,
        };
        let mut steps = vec![
            step(0, 500),
            step(1, 100),
            step(2, 105),
            step(3, 95),
            step(4, 300),
        ];
        mark_steady(&mut steps);
        let got: Vec<Option<bool>> = steps.iter().map(|s| s.steady).collect();
        assert_eq!(
            got,
            vec![Some(false), Some(true), Some(true), Some(true), Some(false)]
        );
        let mut two = vec![step(0, 100), step(1, 100)];
        mark_steady(&mut two);
        assert!(two.iter().all(|s| s.steady.is_none()));
    }
}
