#!/usr/bin/env bash
# How soon a record is queryable under `gpuq record`, with the fake libcupti (no GPU needed).
# Target: at most the flush interval + 1 s after the GPU finished it.
#
# The fake's harness plays an application that waits 1 s, "finishes" one kernel (hands its
# record to CUPTI's buffer, as the GPU finishing it would), then runs on for a while. A reader
# polls `gpuq query` every 20 ms from the start; the latency is the time the kernel first
# shows minus 1 s. The collector's flush ticks are not aligned with the kernel, so the figure
# varies between 0 and one interval plus the commit; ROUNDS rounds show the spread.
#
# Usage: benches/record_latency.sh TARGET_DIR [FLUSH_INTERVAL] [ROUNDS]
set -euo pipefail
T=$1 FLUSH=${2:-2s} ROUNDS=${3:-5}
WORK=$(mktemp -d /tmp/gpuq-record-latency.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
newest() { ls -t "$T/$1" "$T/deps/$1" 2>/dev/null | head -1; }
COLLECTOR=$(newest libgpuq_collector.so)
export GPUQ_FAKE_CUPTI=$(newest libgpuq_fakecupti.so)
cat > "$WORK/s.txt" <<'S'
context id=1 device=0
sleep 1000
runtime cbid=211 start=1700000000000000000 end=1700000000000001000 pid=1 tid=1 correlation=1
kernel start=1700000000000002000 end=1700000000000003000 device=0 context=1 stream=7 correlation=1 name=k
sleep 6000
exit 0
S
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK/store"
  python3 - "$T/gpuq" "$WORK/store" "$COLLECTOR" "$FLUSH" "$T/gpuq-fake-driver" "$WORK/s.txt" <<'PY'
import subprocess, sys, time
gpuq, store, collector, flush, driver, script = sys.argv[1:]
start = time.perf_counter()
rec = subprocess.Popen([gpuq, "--store", store, "record", "--run", "r", "--flush-interval", flush,
                        "--collector", collector, "--", driver, script], stderr=subprocess.DEVNULL)
seen = None
while rec.poll() is None and seen is None:
    q = subprocess.run([gpuq, "--store", store, "query", "--format", "csv",
                        "select count(*) from events where kind = 'kernel'"],
                       capture_output=True, text=True)
    if q.returncode == 0 and q.stdout.strip().endswith("\n1"):
        seen = time.perf_counter() - start
    time.sleep(0.02)
rec.wait()
assert seen is not None, "the kernel never showed while the command ran"
print(f"flush {flush}: kernel queryable {seen - 1.0:.3f} s after it finished")
PY
done
