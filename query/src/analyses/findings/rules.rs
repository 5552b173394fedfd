//! The findings rules, one function per category of the table in [`super`]: each reads the
//! run's data that [`super::load_in`] read once ([`RunData`]) and returns its finding when it
//! fires. `load_in` calls them in the order of that table.

use super::{At, Finding};
use crate::analyses::breakdown::Breakdown;
use crate::analyses::data::{
    collect, ints, strings, DeviceKey, Host, Names, OpClass, Range, Scope, Timelines,
};
use crate::analyses::gaps::{is_sync_call, scoped_gaps};
use crate::analyses::gpu_util::utilisation;
use crate::analyses::history::stats::median_ints as median;
use crate::analyses::intervals::{covered, union};
use crate::analyses::launch::launches;
use crate::analyses::literal;
use crate::analyses::roofline::{self, RooflineRow};
use crate::analyses::stages::load_step_stats;
use crate::functions::durations::fmt_dur;
use crate::functions::kernel_class::kernel_class;
use datafusion::error::Result;
use datafusion::execution::context::SessionContext;
use std::collections::{BTreeMap, HashMap};

/// What the rules read: one run's data within a scope, read once.
pub(super) struct RunData<'a> {
    pub ctx: &'a SessionContext,
    pub run: &'a str,
    pub scope: &'a Scope,
    /// The GPU operations with the profiler's own overhead (the gaps rule wants it).
    pub timelines: Timelines,
    /// The GPU operations without it: what every other rule reads.
    pub plain: Timelines,
    pub host: Host,
    pub names: Names,
    pub ranges: Vec<Range>,
    pub breakdown: Vec<Breakdown>,
    /// GPU span and busy time, summed over devices.
    pub span: i64,
    pub busy: i64,
}

fn severity(impact: i64, span: i64) -> &'static str {
    let share = if span > 0 {
        impact as f64 / span as f64
    } else {
        0.0
    };
    if share >= 0.10 {
        "high"
    } else if share >= 0.03 {
        "medium"
    } else {
        "low"
    }
}

fn pct(a: i64, b: i64) -> f64 {
    if b > 0 {
        (1000.0 * a as f64 / b as f64).round() / 10.0
    } else {
        0.0
    }
}

fn device_label(k: &DeviceKey) -> String {
    let mut s = String::new();
    if let Some(r) = k.rank {
        s.push_str(&format!("rank {r} "));
    }
    match k.device {
        Some(d) => s.push_str(&format!("GPU {d}")),
        None => s.push_str("GPU ?"),
    }
    if let Some(p) = k.pid {
        s.push_str(&format!(" (pid {p})"));
    }
    s
}

fn gap_action(cause: &str) -> &'static str {
    match cause {
        "host_wait" => {
            "The host issues work too late: capture the step with CUDA graphs \
             (torch.compile(mode=\"reduce-overhead\")), move Python/CPU work off the launch path, \
             and look at what the host does in these gaps (SELECT * FROM cpu_ops WHERE ts BETWEEN ...)."
        }
        "sync" => {
            "Remove host synchronisations from the hot path: .item(), .cpu(), .tolist(), \
             printing tensors, torch.cuda.synchronize(); keep values on the GPU or read them \
             once per N steps."
        }
        "dataloader" => {
            "Input loading stalls the GPU: more DataLoader workers, pin_memory=True, \
             persistent_workers, prefetching, or a faster input pipeline."
        }
        "stage" => "A non-GPU stage dominates the idle time: overlap it with GPU work or move it off the critical path.",
        "short" => {
            "Many tiny back-to-back kernels: fuse them (torch.compile, fused optimizers, \
             fused kernels) or use CUDA graphs to remove per-kernel overhead."
        }
        _ => "Inspect the longest gaps: SELECT * FROM gpu_gaps(run) ORDER BY dur DESC.",
    }
}

fn class_action(class: &str) -> &'static str {
    match class {
        "gemm" | "conv" => {
            "Likely compute-bound: make sure tensor cores are used (bf16/fp16/fp8 or TF32, \
             dimensions multiples of 16), prefer larger batched GEMMs, check for cuBLAS \
             fallbacks to slow kernels."
        }
        "attention" => "Attention dominates: use FlashAttention / SDPA kernels and check the sequence-length scaling.",
        "elementwise" | "norm" | "softmax" | "reduction" | "copy" => {
            "Likely memory-bound: fuse elementwise/normalisation chains (torch.compile, fused \
             kernels), avoid extra copies and dtype conversions."
        }
        "communication" => "Communication dominates kernel time: see exposed communication; use larger buckets or fewer collectives.",
        _ => "Look at the top kernels of this class: SELECT * FROM top_kernels(run, 20).",
    }
}

/// The busy intervals of each stream of each device (ops without a stream: one timeline per
/// device).
fn busy_by_stream(timelines: &Timelines) -> HashMap<(DeviceKey, Option<i64>), Vec<(i64, i64)>> {
    let mut spans: HashMap<(DeviceKey, Option<i64>), Vec<(i64, i64)>> = HashMap::new();
    for (key, ops) in &timelines.devices {
        for o in ops {
            spans
                .entry((key.clone(), o.stream))
                .or_default()
                .push((o.start, o.end));
        }
    }
    spans.into_iter().map(|(k, v)| (k, union(v))).collect()
}

/// `idle_gaps`: the GPU idle 5 % of its span or more, by gap cause.
pub(super) fn idle_gaps(d: &RunData) -> Option<Finding> {
    let (timelines, host, names, ranges, scope, span) =
        (&d.timelines, &d.host, &d.names, &d.ranges, d.scope, d.span);
    let gaps = scoped_gaps(&timelines, &host, &names, &ranges, scope, 0);
    let idle: i64 = gaps.iter().map(|g| g.dur).sum();
    if !(span > 0 && idle * 20 >= span) {
        return None;
    }
    let mut by_cause: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for g in &gaps {
        let e = by_cause.entry(g.cause).or_default();
        e.0 += 1;
        e.1 += g.dur;
    }
    let mut causes: Vec<_> = by_cause.into_iter().collect();
    causes.sort_by_key(|c| std::cmp::Reverse(c.1 .1));
    let dominant = causes[0].0;
    let longest = gaps.iter().max_by_key(|g| g.dur).expect("gaps exist");
    let split = causes
        .iter()
        .map(|(c, (n, t))| format!("{c} {}% ({n} gaps, {})", pct(*t, idle), fmt_dur(*t)))
        .collect::<Vec<_>>()
        .join(", ");
    Some(Finding {
        severity: severity(idle, span),
        category: "idle_gaps",
        title: format!(
            "GPU idle {}% of its span ({}), mostly {dominant}",
            pct(idle, span),
            fmt_dur(idle)
        ),
        evidence: format!(
            "{} gaps on {} device timeline(s); by cause: {split}; longest {} at ts {} on {} \
                 (cause {}{}, before {})",
            gaps.len(),
            timelines.devices.len(),
            fmt_dur(longest.dur),
            longest.start,
            device_label(&longest.key),
            longest.cause,
            longest
                .detail
                .as_ref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default(),
            longest.next_name
        ),
        action: gap_action(dominant).to_string(),
        impact_ns: idle,
        at: Some(At {
            rank: longest.key.rank,
            ts: longest.start,
            dur: longest.dur,
        }),
    })
}

/// `launch_bound`: stretches under 50 % busy where most kernels are short.
pub(super) fn launch_bound(d: &RunData) -> Option<Finding> {
    let (plain, host, span) = (&d.plain, &d.host, d.span);
    let launched = launches(&plain, &host);
    let mut kernel_launches: HashMap<(Option<i32>, Option<i32>), Vec<(i64, i64, i64)>> =
        HashMap::new();
    for l in launched.iter().filter(|l| l.kind == "kernel") {
        kernel_launches
            .entry((l.rank, l.device))
            .or_default()
            .push((l.gpu_ts, l.gpu_dur, l.launch_dur));
    }
    for v in kernel_launches.values_mut() {
        v.sort_unstable();
    }
    let (mut lb_time, mut lb_lost, mut lb_chunks, mut lb_kernels) = (0i64, 0i64, 0usize, 0usize);
    let (mut lb_gpu, mut lb_launch) = (Vec::new(), Vec::new());
    // The stretch that lost the most GPU time.
    let mut worst: Option<(i64, At)> = None;
    for c in utilisation(&plain, 30, None) {
        if c.in_use_pct >= 50.0 {
            continue;
        }
        let Some(ks) = kernel_launches.get(&(c.key.rank, c.key.device)) else {
            continue;
        };
        let lo = ks.partition_point(|k| k.0 < c.start);
        let hi = ks.partition_point(|k| k.0 < c.start + c.dur);
        let inside = &ks[lo..hi];
        let short = inside.iter().filter(|k| k.1 < 10_000 || k.1 < k.2).count();
        if inside.len() >= 20 && short * 2 > inside.len() {
            lb_chunks += 1;
            lb_time += c.dur;
            let lost = c.dur - (c.dur as f64 * c.in_use_pct / 100.0).round() as i64;
            lb_lost += lost;
            if worst.is_none_or(|w| lost > w.0) {
                let at = At {
                    rank: c.key.rank,
                    ts: c.start,
                    dur: c.dur,
                };
                worst = Some((lost, at));
            }
            lb_kernels += inside.len();
            lb_gpu.extend(inside.iter().map(|k| k.1));
            lb_launch.extend(inside.iter().map(|k| k.2));
        }
    }
    if !(lb_chunks > 0) {
        return None;
    }
    let med = |v: Vec<i64>| median(v).map_or("?".into(), |m| fmt_dur(m.round() as i64));
    Some(Finding {
        severity: severity(lb_lost, span),
        category: "launch_bound",
        title: format!(
            "Launch-bound: {} of GPU time in stretches under 50% busy with many short kernels",
            fmt_dur(lb_time)
        ),
        evidence: format!(
            "{lb_chunks} of {} time chunks; {lb_kernels} kernels there, median kernel {} vs \
                 median launch call {}; {} of GPU idle inside them",
            30 * plain.devices.len(),
            med(lb_gpu),
            med(lb_launch),
            fmt_dur(lb_lost)
        ),
        action: "The GPU waits on kernel launches: use CUDA graphs \
                     (torch.compile(mode=\"reduce-overhead\") or torch.cuda.graphs), fuse small \
                     kernels (torch.compile), batch more work per launch."
            .to_string(),
        impact_ns: lb_lost,
        at: worst.map(|w| w.1),
    })
}

/// The run's copy calls, tallied for the copy rules (one read of `memcpy` serves them all).
pub(super) struct CopyCalls {
    sync_n: i64,
    sync_t: i64,
    sync_b: i64,
    sync_calls: BTreeMap<String, i32>,
    wait_n: i64,
    wait_t: i64,
    longest_wait: i64,
    page_n: i64,
    page_t: i64,
    page_b: i64,
    /// Unified-memory page migration time, and all copy time.
    um_t: i64,
    copy_t: i64,
}

/// Tallies the copy calls of `d`'s run: Nsight Systems' cuda_memcpy_sync and
/// cuda_memcpy_async rules.
pub(super) async fn copy_calls(d: &RunData<'_>) -> Result<CopyCalls> {
    let (ctx, run, plain, host, names, scope) =
        (d.ctx, d.run, &d.plain, &d.host, &d.names, d.scope);
    // copy call first waits for the work queued before it on its stream, then copies: the
    // wait is a synchronisation (memcpy_wait), only the rest is the copy's own cost. Other
    // streams busy meanwhile (a NCCL stream, a side stream) are not what the copy waited for.
    let stream_busy = busy_by_stream(&plain);
    let sql = format!(
        "SELECT rank, pid, device, correlation, bytes, copy_kind, name, args, ts, dur, step, \
         stream FROM memcpy WHERE run = {}",
        literal(run)
    );
    let (mut sync_n, mut sync_t, mut sync_b) = (0i64, 0i64, 0i64);
    let (mut wait_n, mut wait_t, mut longest_wait) = (0i64, 0i64, 0i64);
    let (mut page_n, mut page_t, mut page_b) = (0i64, 0i64, 0i64);
    let mut sync_calls = BTreeMap::new();
    // Unified-memory page migrations (copy kinds `UM ...`) are no copy call: pinning is no
    // advice for them.
    let (mut um_t, mut copy_t) = (0i64, 0i64);
    for b in collect(ctx, &sql).await? {
        let (rank, pid, device, corr, bytes) = (
            ints(&b, 0)?,
            ints(&b, 1)?,
            ints(&b, 2)?,
            ints(&b, 3)?,
            ints(&b, 4)?,
        );
        let (kind, name, args) = (strings(&b, 5)?, strings(&b, 6)?, strings(&b, 7)?);
        let (ts, dur, step) = (ints(&b, 8)?, ints(&b, 9)?, ints(&b, 10)?);
        let stream = ints(&b, 11)?;
        for i in 0..b.num_rows() {
            if !scope.keeps(step[i]) {
                continue;
            }
            copy_t += dur[i].unwrap_or(0);
            if kind[i].as_deref().is_some_and(|k| k.starts_with("UM ")) {
                um_t += dur[i].unwrap_or(0);
                continue;
            }
            let key = DeviceKey {
                rank: rank[i].map(|r| r as i32),
                pid: pid[i],
                device: device[i].map(|d| d as i32),
            };
            let Some(l) = host.launch(&key, corr[i]) else {
                continue;
            };
            let api = names.get(l.name);
            let is_copy_api = api.starts_with("cudaMemcpy") || api.starts_with("hipMemcpy");
            if !is_copy_api {
                continue;
            }
            let (n, kind) = (bytes[i].unwrap_or(0), kind[i].as_deref().unwrap_or(""));
            let pageable = name[i].as_deref().unwrap_or("").contains("Pageable")
                || args[i].as_deref().unwrap_or("").contains("\"Pageable\"");
            if api.contains("Async") {
                if pageable {
                    page_n += 1;
                    page_t += l.end - l.start;
                    page_b += n;
                }
            } else if !(kind == "HtoD" && n <= 64_000) && kind != "DtoD" {
                let blocked = (l.end - l.start).max(dur[i].unwrap_or(0));
                // Before the copy starts, the call waits while its stream runs earlier work.
                let copy_start = ts[i].unwrap_or(l.start).clamp(l.start, l.end);
                let wait = stream_busy
                    .get(&(key.clone(), stream[i]))
                    .map_or(0, |busy| covered(busy, l.start, copy_start));
                if wait > 0 {
                    wait_n += 1;
                    wait_t += wait;
                    longest_wait = longest_wait.max(wait);
                }
                sync_n += 1;
                sync_t += blocked - wait;
                sync_b += n;
                *sync_calls.entry(api.to_string()).or_insert(0) += 1;
            }
        }
    }
    Ok(CopyCalls {
        sync_n,
        sync_t,
        sync_b,
        sync_calls,
        wait_n,
        wait_t,
        longest_wait,
        page_n,
        page_t,
        page_b,
        um_t,
        copy_t,
    })
}

/// `memcpy_wait`: synchronous copy calls waiting for work queued before them on their stream.
pub(super) fn memcpy_wait(d: &RunData, c: &CopyCalls) -> Option<Finding> {
    let span = d.span;
    let CopyCalls {
        wait_n,
        wait_t,
        longest_wait,
        sync_t,
        ..
    } = *c;
    if !(wait_n > 0) {
        return None;
    }
    Some(Finding {
            severity: severity(wait_t, span),
            category: "memcpy_wait",
            title: format!(
                "{wait_n} synchronous {} wait{} {} for GPU work queued before them",
                if wait_n == 1 { "copy" } else { "copies" },
                if wait_n == 1 { "s" } else { "" },
                fmt_dur(wait_t)
            ),
            evidence: format!(
                "the copies' streams were busy with earlier work for {} of the copy calls' time (longest wait \
                 {}); the copies themselves block {} (sync_memcpy): the host waits for the \
                 queue to drain, an implicit synchronisation",
                fmt_dur(wait_t),
                fmt_dur(longest_wait),
                fmt_dur(sync_t)
            ),
            action: "A synchronous copy (often a device-to-host read: .item(), .cpu(), \
                     .tolist(), printing a tensor) makes the host wait for all queued GPU work. \
                     Read results less often (once per N steps), keep them on the GPU, or copy \
                     with cudaMemcpyAsync into pinned memory and wait on an event only where the \
                     value is needed."
                .to_string(),
            impact_ns: wait_t,
            at: None,
        })
}

/// `sync_memcpy`: synchronous copies blocking the host (Nsight Systems' cuda_memcpy_sync).
pub(super) fn sync_memcpy(d: &RunData, c: &CopyCalls) -> Option<Finding> {
    let span = d.span;
    let CopyCalls {
        sync_n,
        sync_t,
        sync_b,
        ..
    } = *c;
    let sync_calls = &c.sync_calls;
    if !(sync_n > 0 && sync_t > 0) {
        return None;
    }
    let apis = sync_calls
        .iter()
        .map(|(a, n)| format!("{a} × {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(Finding {
        severity: severity(sync_t, span),
        category: "sync_memcpy",
        title: format!(
            "{sync_n} synchronous memory {} the host ({})",
            if sync_n == 1 {
                "copy blocks"
            } else {
                "copies block"
            },
            fmt_dur(sync_t)
        ),
        evidence: format!(
            "{apis}; {sync_b} bytes in total (Nsight Systems' cuda_memcpy_sync rule); \
                 time waiting for earlier GPU work is not counted here (memcpy_wait)"
        ),
        action: "Use cudaMemcpyAsync / tensor.to(device, non_blocking=True) from pinned memory \
                     so the host keeps launching while the copy runs."
            .to_string(),
        impact_ns: sync_t,
        at: None,
    })
}

/// `pageable_memcpy`: 'async' copies from or to pageable host memory (cuda_memcpy_async).
pub(super) fn pageable_memcpy(d: &RunData, c: &CopyCalls) -> Option<Finding> {
    let span = d.span;
    let CopyCalls {
        page_n,
        page_t,
        page_b,
        ..
    } = *c;
    if !(page_n > 0) {
        return None;
    }
    Some(Finding {
        severity: severity(page_t, span),
        category: "pageable_memcpy",
        title: format!("{page_n} 'async' copies use pageable host memory, so they are synchronous"),
        evidence: format!(
            "{page_b} bytes; {} spent in the copy calls (Nsight Systems' cuda_memcpy_async rule)",
            fmt_dur(page_t)
        ),
        action: "Allocate the host buffers pinned (pin_memory=True, cudaHostAlloc) so the \
                     copies run asynchronously."
            .to_string(),
        impact_ns: page_t,
        at: None,
    })
}

/// `sync_api`: host calls that block until the GPU is done (cuda_api_sync).
pub(super) fn sync_api(d: &RunData) -> Option<Finding> {
    let (host, names, scope, span) = (&d.host, &d.names, d.scope, d.span);
    let mut api_sync: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    let mut longest: Option<At> = None;
    for c in &host.calls {
        let n = names.get(c.name);
        if !is_sync_call(n) {
            continue;
        }
        if let Some((s, e)) = scope.clip(c.rank, c.start, c.end) {
            let entry = api_sync.entry(n).or_default();
            entry.0 += 1;
            entry.1 += e - s;
            // The longest; among equals the first rank's earliest (calls come in any order).
            let key = |a: &At| (a.dur, std::cmp::Reverse((a.rank, a.ts)));
            let this = At {
                rank: c.rank,
                ts: s,
                dur: e - s,
            };
            if longest.is_none_or(|l| key(&this) > key(&l)) {
                longest = Some(this);
            }
        }
    }
    if !(!api_sync.is_empty()) {
        return None;
    }
    let (n, t) = api_sync
        .values()
        .fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
    let sev = match severity(t, span) {
        "high" => "medium",
        s => s,
    };
    Some(Finding {
        severity: sev,
        category: "sync_api",
        title: format!(
            "{n} host synchronisation calls ({} of host time blocked in them)",
            fmt_dur(t)
        ),
        evidence: api_sync
            .iter()
            .map(|(a, (n, t))| format!("{a} × {n} ({})", fmt_dur(*t)))
            .collect::<Vec<_>>()
            .join(", ")
            + " (Nsight Systems' cuda_api_sync rule; host-side time in the calls, not \
                   breakdown's GPU-side `sync` column); gaps they cause are counted under \
                   idle_gaps as 'sync'",
        action: "Synchronise only where a result is needed on the host; replace device-wide \
                     syncs with events or stream waits."
            .to_string(),
        impact_ns: t,
        at: longest,
    })
}

/// `exposed_memcpy`: copies not overlapped by compute or communication, 5 % of busy or more.
pub(super) fn exposed_memcpy(d: &RunData, c: &CopyCalls) -> Option<Finding> {
    let (rows, span, busy) = (&d.breakdown, d.span, d.busy);
    let (um_t, copy_t) = (c.um_t, c.copy_t);
    let exposed_copy: i64 = rows.iter().map(|r| r.memcpy_exposed).sum();
    if !(busy > 0 && exposed_copy * 20 >= busy) {
        return None;
    }
    Some(Finding {
        severity: severity(exposed_copy, span),
        category: "exposed_memcpy",
        title: format!(
            "Copies not overlapped with compute: {} ({}% of GPU busy time)",
            fmt_dur(exposed_copy),
            pct(exposed_copy, busy)
        ),
        evidence: rows
            .iter()
            .map(|r| {
                format!(
                    "{}: {} of {} copy time exposed",
                    device_label(&r.key),
                    fmt_dur(r.memcpy_exposed),
                    fmt_dur(r.memcpy)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        action: if um_t * 2 > copy_t {
            "Most copy time is unified-memory page migration: prefetch the data to the GPU \
                 before it is used (cudaMemPrefetchAsync, cudaMemAdvise), or allocate it on the \
                 device instead of as managed memory."
        } else {
            "Overlap copies with compute: pinned memory + non_blocking=True on a side \
                 stream, prefetch the next batch, avoid device-to-host copies inside the step."
        }
        .to_string(),
        impact_ns: exposed_copy,
        at: None,
    })
}

/// `exposed_comm`: communication not hidden by compute, 5 % of busy or more.
pub(super) fn exposed_comm(d: &RunData) -> Option<Finding> {
    let (rows, span, busy) = (&d.breakdown, d.span, d.busy);
    let exposed_comm: i64 = rows.iter().map(|r| r.comm_exposed).sum();
    let comm: i64 = rows.iter().map(|r| r.comm).sum();
    if !(busy > 0 && exposed_comm * 20 >= busy) {
        return None;
    }
    Some(Finding {
        severity: severity(exposed_comm, span),
        category: "exposed_comm",
        title: format!(
            "Exposed communication: {} ({}% of communication not hidden by compute)",
            fmt_dur(exposed_comm),
            pct(exposed_comm, comm)
        ),
        evidence: rows
            .iter()
            .filter(|r| r.comm > 0)
            .map(|r| {
                format!(
                    "{}: {} of {} communication exposed, overlap {}%",
                    device_label(&r.key),
                    fmt_dur(r.comm_exposed),
                    fmt_dur(r.comm),
                    r.comm_overlap_pct().unwrap_or(0.0)
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        action: "Overlap collectives with compute (DDP bucket_cap_mb / gradient-as-bucket-view, \
                     FSDP forward/backward prefetch), use fewer, larger collectives, check for \
                     stragglers across ranks."
            .to_string(),
        impact_ns: exposed_comm,
        at: None,
    })
}

/// Kernel time by kernel class (compute and communication kernels), and its total.
pub(super) struct KernelClasses {
    by_class: BTreeMap<&'static str, i64>,
    pub total: i64,
}

pub(super) fn kernel_classes(plain: &Timelines) -> KernelClasses {
    let mut by_class: BTreeMap<&'static str, i64> = BTreeMap::new();
    let mut class_of: HashMap<u32, &'static str> = HashMap::new();
    let mut kernel_total = 0;
    for (_, ops) in &plain.devices {
        for o in ops
            .iter()
            .filter(|o| matches!(o.class, OpClass::Compute | OpClass::Communication))
        {
            let c = *class_of
                .entry(o.name)
                .or_insert_with(|| kernel_class(plain.names.get(o.name)));
            *by_class.entry(c).or_default() += o.end - o.start;
            kernel_total += o.end - o.start;
        }
    }
    KernelClasses {
        by_class,
        total: kernel_total,
    }
}

/// `dominant_class`: one kernel class with 40 % of kernel time or more.
pub(super) fn dominant_class(classes: &KernelClasses) -> Option<Finding> {
    let (by_class, kernel_total) = (&classes.by_class, classes.total);
    let (&class, &t) = by_class
        .iter()
        .max_by_key(|(c, t)| (**t, std::cmp::Reverse(**c)))?;
    if !(kernel_total > 0 && t * 10 >= kernel_total * 4) {
        return None;
    }
    let split = {
        let mut v: Vec<_> = by_class.iter().collect();
        v.sort_by_key(|(_, t)| std::cmp::Reverse(**t));
        v.iter()
            .take(4)
            .map(|(c, t)| format!("{c} {}%", pct(**t, kernel_total)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(Finding {
        severity: "low",
        category: "dominant_class",
        title: format!(
            "{class} kernels take {}% of kernel time",
            pct(t, kernel_total)
        ),
        evidence: format!(
            "kernel time {} by class: {split} (by kernel name; no FLOP counters used)",
            fmt_dur(kernel_total)
        ),
        action: class_action(class).to_string(),
        impact_ns: t,
        at: None,
    })
}

/// `roofline`: GEMM-like operators with known FLOPs far under their roof.
pub(super) async fn roofline(d: &RunData<'_>, kernel_total: i64) -> Result<Option<Finding>> {
    let roof = roofline::load(d.ctx, d.run, &d.plain, &d.host).await?;
    Ok(roofline_finding(&roof, kernel_total, d.span))
}

/// Share of the roof a well-tuned GEMM reaches; below it, the difference is time at stake.
const ROOF_TARGET_PCT: f64 = 70.0;

/// The `roofline` finding: operators with known FLOPs under [`ROOF_TARGET_PCT`] of their roof.
fn roofline_finding(rows: &[RooflineRow], kernel_total: i64, span: i64) -> Option<Finding> {
    let rated: Vec<(&RooflineRow, f64, i64)> = rows
        .iter()
        .filter_map(|r| {
            let pct = r.pct_of_attainable?;
            let lost = r.kernel_time as f64 * (1.0 - pct / ROOF_TARGET_PCT).max(0.0);
            Some((r, pct, lost.round() as i64))
        })
        .collect();
    let covered: i64 = rated.iter().map(|r| r.0.kernel_time).sum();
    let impact: i64 = rated.iter().map(|r| r.2).sum();
    if kernel_total <= 0 || covered * 10 < kernel_total || impact <= 0 {
        return None;
    }
    let mut worst = rated.clone();
    worst.sort_by_key(|r| std::cmp::Reverse(r.2));
    let (top, top_pct, _) = worst[0];
    let label = |r: &RooflineRow| format!("{} ({})", r.op, r.dtype.as_deref().unwrap_or("?"));
    let evidence = worst
        .iter()
        .filter(|r| r.2 > 0)
        .take(3)
        .map(|(r, pct, _)| {
            format!(
                "{}: {} calls, {}, {:.1} TFLOP/s at {:.0} FLOP/B (ridge {:.0}: {}-bound), \
                 {pct:.0}% of the attainable {:.0} TFLOP/s",
                label(r),
                r.instances,
                fmt_dur(r.kernel_time),
                r.tflops,
                r.intensity.unwrap_or(0.0),
                r.ridge.unwrap_or(0.0),
                r.bound.unwrap_or("?"),
                r.attainable_tflops.unwrap_or(0.0),
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let action = if top.bound == Some("memory") {
        "Memory-bound GEMMs (small or skinny shapes): batch them (bmm, grouped GEMM, \
         horizontal fusion of projections), fuse them with their neighbours (torch.compile), \
         or give each step more tokens/rows."
    } else {
        "Compute-bound GEMMs far from peak: use tensor-core friendly shapes (dimensions \
         multiples of 64/128, no odd padding), bf16/fp8 instead of fp32, larger GEMMs per \
         call, and let the library autotune (torch.compile mode=max-autotune, cuBLASLt)."
    };
    let severity = match severity(impact, span) {
        "high" => "medium",
        s => s,
    };
    Some(Finding {
        severity,
        category: "roofline",
        title: format!(
            "{} runs at {top_pct:.0}% of its roofline on the {} ({}-bound)",
            label(top),
            top.gpu.as_deref().unwrap_or("GPU"),
            top.bound.unwrap_or("?"),
        ),
        evidence: format!(
            "operators with known FLOPs: {}% of kernel time; {evidence}",
            pct(covered, kernel_total)
        ),
        action: action.to_string(),
        impact_ns: impact,
        at: None,
    })
}

/// `slow_steps`: steps whose wall or GPU busy time is over 1.5 × the rank's median.
pub(super) async fn slow_steps(d: &RunData<'_>) -> Result<Option<Finding>> {
    let span = d.span;
    let steps = load_step_stats(d.ctx, d.run, &d.plain, d.scope).await?;
    let slow: Vec<_> = steps
        .iter()
        .filter(|s| s.vs_median.is_some_and(|r| r > 1.5))
        .collect();
    if !(!slow.is_empty()) {
        return Ok(None);
    }
    let extra: i64 = slow.iter().map(|s| s.excess()).sum();
    let worst = slow
        .iter()
        .max_by_key(|s| (s.excess(), std::cmp::Reverse((s.rank, s.ts))))
        .map(|s| At {
            rank: s.rank,
            ts: s.ts,
            dur: s.dur,
        });
    let list = slow
        .iter()
        .take(5)
        .map(|s| {
            format!(
                "step {}{}: {} ({}× median; GPU busy {}, {}× median; GPU idle {}%)",
                s.step,
                s.rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
                fmt_dur(s.dur),
                s.median_dur
                    .filter(|m| *m > 0.0)
                    .map_or(0.0, |m| (100.0 * s.dur as f64 / m).round() / 100.0),
                fmt_dur(s.gpu_busy),
                s.busy_vs_median.unwrap_or(0.0),
                s.idle_pct.unwrap_or(0.0)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Some(Finding {
        severity: severity(extra, span),
        category: "slow_steps",
        title: format!(
            "{} of {} steps take over 1.5× the median step (wall or GPU busy time)",
            slow.len(),
            steps.len()
        ),
        evidence: list,
        action: "Look at the gaps inside these steps (warm-up, recompilation, garbage \
                     collection, checkpointing, dataloader stalls): SELECT * FROM gpu_gaps(run) \
                     with ts inside the step."
            .to_string(),
        impact_ns: extra,
        at: worst,
    }))
}

/// The profiler's own recorded work (buffer flushes, buffer requests) covering at least
/// [`DISTORTING_SHARE_PCT`](crate::analyses::overhead::DISTORTING_SHARE_PCT) % of a rank's
/// window: the profile's gaps and host times there are partly the profiler's. At most
/// `medium`: the profile is doubtful, not the program slow.
pub(super) async fn profiler_overhead(d: &RunData<'_>) -> Result<Option<Finding>> {
    use crate::analyses::overhead::{load, DISTORTING_SHARE_PCT};
    let rows = load(d.ctx, d.run, d.scope).await?;
    let heavy: Vec<_> = rows
        .iter()
        .filter(|r| r.kind == "recorded" && r.share_pct >= DISTORTING_SHARE_PCT)
        .collect();
    let Some(worst) = heavy.iter().max_by_key(|r| r.total) else {
        return Ok(None);
    };
    let impact: i64 = heavy.iter().map(|r| r.total).sum();
    let severity = match severity(impact, d.span) {
        "high" => "medium",
        s => s,
    };
    Ok(Some(Finding {
        severity,
        category: "profiler_overhead",
        title: format!(
            "The profiler's own work covers {:.1}% of the profiled window ({})",
            worst.share_pct, worst.name
        ),
        evidence: heavy
            .iter()
            .map(|r| {
                format!(
                    "{}: {} x {} = {} of {} ({:.1}%)",
                    r.rank.map_or("rank ?".to_string(), |x| format!("rank {x}")),
                    r.instances,
                    r.name,
                    fmt_dur(r.total),
                    fmt_dur(r.window),
                    r.share_pct
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        action: "Read idle gaps and slow host calls during these stretches as the profiler's; \
                 profile fewer steps (schedule(active=...)) or fewer activity kinds, drop \
                 with_stack / record_shapes when not needed, or enlarge the CUPTI buffers so \
                 they are flushed less often."
            .to_string(),
        impact_ns: impact,
        at: None,
    }))
}
