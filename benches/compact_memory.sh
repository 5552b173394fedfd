#!/usr/bin/env bash
# Peak memory (RSS) and wall time of `gpuq compact` on a fragmented run, for two gpuq binaries
# interleaved (A B A B ...), so that a busy stretch of the machine hits both alike.
#
# The run: PIECES synthetic Kineto traces of 220 MB each (seeds 1..PIECES), each appended to
# one run by BINARY_A. An append of ~650 K events and ~73 K counter rows stores parts of
# ~150 K event rows and one counters part, all above the 64 Ki rows that trigger automatic
# compaction and under the 1 Mi rows of a small part. So the run ends fragmented (14 pieces:
# 9.1 M events in ~60 parts, ~100 MB of Parquet), and `gpuq compact` merges it into parts of
# up to 4 Mi rows. Each timing compacts a fresh copy of that store; both binaries' results
# are checked to answer the same (row count and sums of the events).
#
# Usage: benches/compact_memory.sh BINARY_A BINARY_B [PIECES] [RUNS]   (defaults 14 and 3)
# Needs /usr/bin/time (package `time`) and python3 (for the medians).
set -euo pipefail
A=$1 B=$2 PIECES=${3:-14} RUNS=${4:-3}
WORK=$(mktemp -d /tmp/gpuq-compact.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for i in $(seq 1 "$PIECES"); do
  "$A" generate --bytes 220000000 --seed "$i" "$WORK/piece.json" >/dev/null
  "$A" --store "$WORK/base" ingest -q "$WORK/piece.json" --run frag
done
rm -f "$WORK/piece.json"
CHECK="select count(*), sum(ts % 1000003), sum(dur), count(distinct name) from events"
parts() { echo "$("$1" --store "$2" files --table events | wc -l) events and" \
  "$("$1" --store "$2" files --table counters | wc -l) counters parts"; }
echo "run: $PIECES appended pieces, $(parts "$A" "$WORK/base"), $(du -sm "$WORK/base/_data" | cut -f1) MB of Parquet"
"$A" --store "$WORK/base" query "$CHECK" > "$WORK/want"
for i in $(seq 1 "$RUNS"); do
  for side in A B; do
    bin=$A; [[ $side == B ]] && bin=$B
    rm -rf "$WORK/store"
    cp -a "$WORK/base" "$WORK/store"
    /usr/bin/time -f "$side %e %U %S %M" -a -o "$WORK/times" \
      "$bin" --store "$WORK/store" compact > "$WORK/out"
    "$bin" --store "$WORK/store" query "$CHECK" > "$WORK/got"
    cmp -s "$WORK/want" "$WORK/got" || { echo "$side: compaction changed the rows" >&2; exit 1; }
    if [[ $i == 1 ]]; then
      echo "$side: $(tail -1 "$WORK/out"); after: $(parts "$bin" "$WORK/store")"
    fi
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$WORK/times" "$A" "$B"
