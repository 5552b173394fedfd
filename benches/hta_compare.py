#!/usr/bin/env python3
"""Side-by-side check of gpuq's breakdown / stream gaps against Holistic Trace Analysis (HTA).

For each Kineto trace: ingest it with gpuq and compare, per rank,
  HTA get_temporal_breakdown: kernel_time (span), idle_time, compute_time   (whole µs)
  gpuq breakdown(run):        span, idle, compute                           (exact ns)
and per (stream, category) HTA get_idle_time_breakdown against stream_gaps(run).

HTA rounds every event to whole microseconds (start up, end down) and, with two or more
ProfilerStep markers, drops the events after the last one; gpuq does neither. The script
prints both sides and the difference, and the bound that rounding alone explains
(2 µs per operation), so a difference beyond it points at a definition, not at rounding.

    python3 -m venv /tmp/hta && /tmp/hta/bin/pip install HolisticTraceAnalysis
    /tmp/hta/bin/python benches/hta_compare.py --gpuq $CARGO_TARGET_DIR/release/gpuq ../shared/traces/kineto/*/*.json.gz
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile


def gpuq_rows(gpuq, store, sql):
    out = subprocess.run([gpuq, "--store", store, "query", "--format", "ndjson", sql],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def hta_side(trace):
    from hta.trace_analysis import TraceAnalysis
    d = tempfile.mkdtemp(prefix="hta-")
    try:
        os.symlink(os.path.abspath(trace), os.path.join(d, os.path.basename(trace)))
        # HTA's default drops the last profiler step; keep it, as gpuq does.
        a = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        tb = a.get_temporal_breakdown(visualize=False)
        idle, _ = a.get_idle_time_breakdown(visualize=False)
        return tb, idle
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpuq", default="gpuq")
    p.add_argument("--golden", help="also write HTA's temporal breakdown rows to this CSV "
                   "(tests/golden/hta_temporal_breakdown.csv, read by tests/tests/real_kineto.rs)")
    p.add_argument("traces", nargs="+")
    args = p.parse_args()
    golden = []
    logging.disable(logging.WARNING)
    worst = 0.0
    for trace in args.traces:
        name = os.path.basename(trace)
        store = tempfile.mkdtemp(prefix="gpuq-hta-")
        try:
            subprocess.run([args.gpuq, "--store", store, "ingest", trace, "--run", "t", "-q"],
                           check=True, capture_output=True)
            ours = gpuq_rows(args.gpuq, store,
                             "SELECT rank, count(*) AS devices, sum(span) AS span, sum(idle) AS idle, "
                             "sum(compute) AS compute FROM breakdown('t') GROUP BY rank ORDER BY rank")
            ops = gpuq_rows(args.gpuq, store, "SELECT count(*) AS n FROM gpu_ops WHERE run = 't'")[0]["n"]
            try:
                tb, idle = hta_side(trace)
            except Exception as e:  # HTA cannot load every trace; say so and go on
                print(f"{name}: HTA failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            for _, h in tb.iterrows():
                golden.append((os.path.join(os.path.basename(os.path.dirname(trace)), name),
                               int(h["rank"]), int(h["kernel_time(us)"]), int(h["idle_time(us)"]),
                               int(h["compute_time(us)"])))
            if not ours:
                print(f"{name}: no GPU operations (HTA kernel_time {list(tb['kernel_time(us)'])})")
                continue
            bound_us = 2 * ops
            for r in ours:
                h = tb.iloc[0] if len(tb) == 1 else tb[tb["rank"] == (r.get("rank") or 0)].iloc[0]
                row = []
                for col, hcol in (("span", "kernel_time(us)"), ("idle", "idle_time(us)"),
                                  ("compute", "compute_time(us)")):
                    g_us = r[col] / 1000.0
                    h_us = float(h[hcol])
                    diff = h_us - g_us
                    rel = abs(diff) / g_us * 100 if g_us else 0.0
                    if col == "span":
                        worst = max(worst, rel)
                    row.append(f"{col} gpuq {g_us:,.1f} µs HTA {h_us:,.0f} µs (Δ {diff:+,.1f}, {rel:.2f}%)")
                idle_pct_g = 100 * r["idle"] / r["span"] if r["span"] else 0
                idle_pct_h = float(h["idle_time_pctg"])
                print(f"{name} rank {r.get('rank')} ({r['devices']} device(s), {ops} ops, rounding bound "
                      f"{bound_us:,} µs): " + "; ".join(row)
                      + f"; idle% gpuq {idle_pct_g:.2f} HTA {idle_pct_h:.2f}")
            cats = gpuq_rows(args.gpuq, store,
                             "SELECT stream, cause, sum(dur) AS idle FROM stream_gaps('t') GROUP BY 1, 2")
            g = {(c["stream"], c["cause"]): c["idle"] / 1000.0 for c in cats}
            for _, h in idle.iterrows():
                key = (int(h["stream"]), str(h["idle_category"]))
                print(f"    stream {key[0]} {key[1]}: gpuq {g.get(key, 0.0):,.1f} µs HTA {float(h['idle_time']):,.0f} µs")
        finally:
            shutil.rmtree(store, ignore_errors=True)
    print(f"largest span difference: {worst:.2f}%")
    if args.golden:
        import csv
        with open(args.golden, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["trace", "rank", "span_us", "idle_us", "compute_us"])
            w.writerows(sorted(golden))


if __name__ == "__main__":
    sys.exit(main())
