#!/usr/bin/env bash
# Nsight Systems adapter benchmark: ingest a generated export with KERNELS kernel rows
# (plus as many runtime rows and more NVTX rows) and report rows/s and peak RSS.
#
# Usage: benches/nsys_ingest.sh [WORKDIR]      (default /tmp/gpuq-nsys-bench)
# Environment: GPUQ (binary, default $HOME/.cache/gpuq/target/release/gpuq),
#              KERNELS (default 5000000), KEEP=1 keeps the files.
# Needs /usr/bin/time (package `time`) and python3 (for the arithmetic and the row count).
set -euo pipefail
WORK=$(realpath -m "${1:-/tmp/gpuq-nsys-bench}")
GPUQ=${GPUQ:-$HOME/.cache/gpuq/target/release/gpuq}
KERNELS=${KERNELS:-5000000}
mkdir -p "$WORK"
DB="$WORK/report-${KERNELS}.sqlite"
STORE="$WORK/store"
rm -rf "$STORE"
if [[ ! -f $DB ]]; then
  echo "== generating $DB"
  /usr/bin/time -f "generate: %e s, %M KB" "$GPUQ" generate --format nsys --kernels "$KERNELS" "$DB"
fi
ROWS=$(python3 -c "
import sqlite3; c = sqlite3.connect('$DB')
t = ['CUPTI_ACTIVITY_KIND_KERNEL','CUPTI_ACTIVITY_KIND_MEMCPY','CUPTI_ACTIVITY_KIND_MEMSET',
     'CUPTI_ACTIVITY_KIND_SYNCHRONIZATION','CUPTI_ACTIVITY_KIND_RUNTIME','NVTX_EVENTS','PROFILER_OVERHEAD']
print(sum(c.execute(f'select count(*) from {x}').fetchone()[0] for x in t))")
echo "== ingesting $(stat -c %s "$DB") bytes, $ROWS source rows"
/usr/bin/time -f "%e %M" -o "$WORK/time" "$GPUQ" --store "$STORE" ingest -q "$DB" --run bench
read -r SECS KB < "$WORK/time"
python3 -c "
rows, secs, kb = $ROWS, $SECS, $KB
print(f'ingest: {secs:.1f} s, {rows/secs/1e6:.2f} M rows/s, peak RSS {kb/1024:.0f} MB')"
"$GPUQ" --store "$STORE" query "SELECT count(*) AS kernels, sum(dur) AS total_ns FROM kernels"
du -sh "$STORE"
[[ ${KEEP:-0} == 1 ]] || rm -rf "$STORE"
