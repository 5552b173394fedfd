#!/usr/bin/env bash
# How soon a finished cycle file is queryable under `gpuq watch`, against the time
# `gpuq ingest` takes for the same file (target: at most its ingest time + 1 s).
#
# Generates one Kineto cycle of BYTES (default 100 MB), times `gpuq ingest` of it 3 times, then
# 3 times each way: starts a watch on an empty directory and either copies the file in under
# a hidden name and renames it into place (as a writer that writes under a temporary name
# does), or writes it under its final name and closes it (as torch.profiler's handler does);
# then polls `gpuq query` every 20 ms until the run's kernels appear. The time printed runs
# from the rename or the close to the first query that sees them (a query's own start,
# ~20-50 ms, included).
#
# Usage: benches/watch_latency.sh GPUQ_BINARY [BYTES]
set -euo pipefail
BIN=$(realpath "$1") BYTES=${2:-100000000}
WORK=$(mktemp -d /tmp/gpuq-watch-latency.XXXXXX)
trap 'kill $WATCH 2>/dev/null || true; rm -rf "$WORK"' EXIT
WATCH=
cd "$WORK"
"$BIN" generate --bytes "$BYTES" --seed 5 --rank 0 cycle.json
for i in 1 2 3; do
  rm -rf ingest-store
  /usr/bin/time -f "gpuq ingest: %e s" "$BIN" --store ingest-store ingest -q cycle.json --run r
done
for i in rename-1 rename-2 rename-3 write-1 write-2 write-3; do
  rm -rf store dir && mkdir dir
  "$BIN" --store store watch dir --run live --idle-exit 30s > "watch-$i.log" 2>&1 &
  WATCH=$!
  sleep 1.5
  python3 - "$BIN" "${i%-*}" <<'PY'
import os, shutil, subprocess, sys, time
gpuq, how = sys.argv[1], sys.argv[2]
if how == "rename":
    shutil.copyfile("cycle.json", "dir/.cycle.tmp")
    os.rename("dir/.cycle.tmp", "dir/worker0.1.pt.trace.json")
else:
    shutil.copyfile("cycle.json", "dir/worker0.1.pt.trace.json")
start = time.time()
while time.time() - start < 60:
    out = subprocess.run([gpuq, "--store", "store", "query", "--format", "csv",
                          "select count(*) from kernels where run = 'live'"],
                         capture_output=True, text=True).stdout.split()
    if out and out[-1].isdigit() and out[-1] != "0":
        print(f"gpuq watch: queryable {time.time() - start:.2f} s after the {how} ({out[-1]} kernels)")
        sys.exit(0)
    time.sleep(0.02)
sys.exit("not queryable within 60 s")
PY
  kill "$WATCH"; wait "$WATCH" 2>/dev/null || true
done
