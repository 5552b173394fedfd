#!/usr/bin/env bash
# A/B ingest timing of two gpuq binaries on one trace, interleaved (A B A B ...), so that a
# busy or throttled stretch of the machine hits both alike. Reports each binary's runs and
# medians of wall, user and system time. Used for changes that must not slow ingest (e.g.
# secret redaction, see docs/benchmarks.md).
#
# Usage: benches/ingest_ab.sh BINARY_A BINARY_B TRACE [RUNS]     (RUNS default 7)
# Needs /usr/bin/time (package `time`) and python3 (for the medians).
set -euo pipefail
A=$1 B=$2 TRACE=$3 RUNS=${4:-7}
WORK=$(mktemp -d /tmp/gpuq-ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for i in $(seq 1 "$RUNS"); do
  for side in A B; do
    bin=$A; [[ $side == B ]] && bin=$B
    rm -rf "$WORK/store"
    /usr/bin/time -f "$side %e %U %S %M" -a -o "$WORK/times" "$bin" --store "$WORK/store" ingest -q "$TRACE" --run ab
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$WORK/times" "$A" "$B"
