#!/usr/bin/env bash
# The CUPTI collector's own cost per record, with the fake libcupti (no GPU needed), and the
# whole `gpuq record` path's throughput.
#
# The fake's harness plays an application: THREADS threads each launch KERNELS kernels (a
# runtime API record and a kernel record per launch). Measured, each ROUNDS times:
#   1. the collector's decode + segment-building time per record, as its segments' health
#      blocks report it (`decode_ns` / records; the collector's own thread, off the
#      application's threads);
#   2. the application's wall time with and without the collector injected (what CUPTI's
#      buffer callbacks, the collector's pool and queue add to the emitting threads, plus
#      the final flush at exit);
#   3. `gpuq record` end to end: records stored per second.
#
# Usage: benches/collector_cost.sh TARGET_DIR [KERNELS] [THREADS] [ROUNDS]
#   TARGET_DIR: where gpuq, gpuq-fake-driver, libgpuq_collector.so and libgpuq_fakecupti.so
#   are (e.g. ~/.cache/gpuq/target/release after `cargo build --release --workspace`).
set -euo pipefail
T=$1 KERNELS=${2:-500000} THREADS=${3:-1} ROUNDS=${4:-3}
WORK=$(mktemp -d /tmp/gpuq-collector-cost.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "threads $THREADS kernels=$KERNELS start=1700000000000000000 stream_base=7" > "$WORK/s.txt"
echo "exit 0" >> "$WORK/s.txt"
RECORDS=$((2 * KERNELS * THREADS))
# `cargo test` relinks libraries in deps/ without updating the copies beside the binaries.
newest() { ls -t "$T/$1" "$T/deps/$1" 2>/dev/null | head -1; }
COLLECTOR=$(newest libgpuq_collector.so)
export GPUQ_FAKE_CUPTI=$(newest libgpuq_fakecupti.so)
secs() { python3 -c "import time; print(time.perf_counter())"; }
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK/spool" && mkdir "$WORK/spool"
  a=$(secs)
  "$T/gpuq-fake-driver" "$WORK/s.txt" 2>/dev/null
  b=$(secs)
  CUDA_INJECTION64_PATH="$COLLECTOR" GPUQ_RECORD_DIR="$WORK/spool" \
    GPUQ_FLUSH_MS=1000 "$T/gpuq-fake-driver" "$WORK/s.txt" 2>/dev/null
  c=$(secs)
  python3 - "$WORK/spool" "$RECORDS" "$a" "$b" "$c" <<'PY'
import json, os, re, sys
spool, expected, a, b, c = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:])
records = decode_ns = 0
for name in sorted(os.listdir(spool)):
    if not name.endswith(".seg"):
        continue
    data = open(os.path.join(spool, name), "rb").read()
    for m in re.finditer(rb'\{"records":\d+[^}]*\}', data):
        h = json.loads(m.group())
        records += h["records"]; decode_ns += h["decode_ns"]
assert records == expected, f"{records} records in the segments, {expected} emitted"
print(f"collector: {records} records, decode+segment {decode_ns / records:.1f} ns/record; "
      f"application wall {b - a:.3f} s plain, {c - b:.3f} s injected "
      f"(+{(c - b - (b - a)) * 1e9 / records:.0f} ns/record)")
PY
  rm -rf "$WORK/store"
  d=$(secs)
  "$T/gpuq" --store "$WORK/store" record --run r --flush-interval 1s --collector "$COLLECTOR" -- \
    "$T/gpuq-fake-driver" "$WORK/s.txt" 2>/dev/null
  e=$(secs)
  n=$("$T/gpuq" --store "$WORK/store" query --format csv "select count(*) from events" | tail -1)
  [[ $n == "$RECORDS" ]] || { echo "gpuq record stored $n rows of $RECORDS" >&2; exit 1; }
  python3 -c "print(f'gpuq record: {$n} rows stored in {$e - $d:.3f} s ({$n / ($e - $d) / 1e6:.2f} M rows/s)')"
done
