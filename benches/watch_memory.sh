#!/usr/bin/env bash
# Peak memory (RSS) of `gpuq watch` after SMALL and after LARGE profiling cycles: the watcher's
# memory must stay flat however long the job runs (target: within 10 %).
#
# Each measurement starts a fresh store and a watch (`--idle-exit 3s`, under /usr/bin/time),
# then writes the cycles into the watched directory one at a time, as torch.profiler does:
# each a small generated Kineto trace (2 steps numbered on from the last cycle's, rank 0),
# written under a hidden name and renamed into place. The watch appends each to one run and
# exits 3 s after the last; the run's kernel count is checked against the cycles written.
#
# Usage: benches/watch_memory.sh GPUQ_BINARY [SMALL] [LARGE]   (defaults 10 and 1000)
# Needs /usr/bin/time (package `time`).
set -euo pipefail
BIN=$1 SMALL=${2:-10} LARGE=${3:-1000}
WORK=$(mktemp -d /tmp/gpuq-watch-memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$BIN" generate --steps 2 --rank 0 "$WORK/one.json" >/dev/null
"$BIN" --store "$WORK/one" ingest -q "$WORK/one.json" --run one
PER_CYCLE=$("$BIN" --store "$WORK/one" query --format csv \
  "select count(*) from events where kind = 'kernel'" | tail -1)

measure() {
  local cycles=$1 dir="$WORK/traces-$1" store="$WORK/store-$1"
  mkdir -p "$dir"
  /usr/bin/time -f "%M %e" -o "$WORK/time-$cycles" \
    "$BIN" --store "$store" watch "$dir" --run live --idle-exit 3s --settle 100ms \
    > "$WORK/watch-$cycles.log" &
  local watch=$!
  for i in $(seq 0 $((cycles - 1))); do
    "$BIN" generate --steps 2 --rank 0 --first-step $((2 * i)) "$dir/.cycle.tmp" >/dev/null
    mv "$dir/.cycle.tmp" "$dir/worker0.$((1000 + i)).pt.trace.json"
  done
  wait "$watch"
  local kernels
  kernels=$("$BIN" --store "$store" query --format csv \
    "select count(*) from events where run = 'live' and kind = 'kernel'" | tail -1)
  if [[ $kernels != $((cycles * PER_CYCLE)) ]]; then
    echo "$cycles cycles: $kernels kernels stored, $((cycles * PER_CYCLE)) written" >&2
    exit 1
  fi
  read -r rss secs < "$WORK/time-$cycles"
  echo "$cycles cycles: peak RSS $((rss / 1024)) MB ($rss KB), $secs s; $(tail -1 "$WORK/watch-$cycles.log")"
  eval "RSS_$cycles=$rss"
}

measure "$SMALL"
measure "$LARGE"
small=RSS_$SMALL large=RSS_$LARGE
python3 -c "print(f'peak RSS after $LARGE cycles / after $SMALL: {${!large} / ${!small}:.3f}')"
