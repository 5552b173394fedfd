#!/usr/bin/env python3
"""Each binary's runs and medians from interleaved A/B timings: lines `SIDE wall user sys
maxrss_kb`, as `/usr/bin/time -f "SIDE %e %U %S %M"` writes them (benches/ingest_ab.sh,
benches/compact_memory.sh).

Usage: ab_summary.py TIMES BINARY_A BINARY_B
"""
import statistics
import sys

times, a, b = sys.argv[1:4]
rows = [line.split() for line in open(times) if line.strip()]
for side, path in (("A", a), ("B", b)):
    r = [list(map(float, x[1:])) for x in rows if x[0] == side]
    med = [statistics.median(c) for c in zip(*r)]
    print(f"{side} {path}")
    print("  wall s: " + " ".join(f"{x[0]:.3f}" for x in r))
    print("  peak RSS MB: " + " ".join(f"{x[3] / 1024:.0f}" for x in r))
    print(
        f"  median wall {med[0]:.3f} s, user {med[1]:.3f} s, sys {med[2]:.3f} s, "
        f"peak RSS {med[3] / 1024:.0f} MB"
    )
