#!/usr/bin/env bash
# Device check of `gpuq record` on a real GPU (run through the `device` tool when a machine is
# lent). Needs, in .gpuq-dev/ (carried; built here with `cargo build --release --workspace`):
# gpuq and libgpuq_collector.so. Writes its log and summary to $OUT.
#   C1 loading: the collector ran and used the process's own libcupti (one copy mapped)
#   C2 exactness: kernel rows = launches of torch.cuda._sleep (20,000), none dropped
#   C3 clock: the first kernel starts after the workload's realtime start, within seconds
#   C4 overhead: median GEMM-bound step time recorded / plain (A/B/A/B)
#   C5 liveness: kernels queryable while the workload runs
#   C6 SIGKILL: rows of the killed workload stored, run marked incomplete
#   C7 coexistence: with torch.profiler active in the same process
set -u
OUT=${OUT:-/tmp/gpuq-device}; mkdir -p "$OUT"; exec > >(tee "$OUT/log.txt") 2>&1
B=$(pwd)/.gpuq-dev; G="$B/gpuq"; S=$(mktemp -d)/store; W=tools/device/workload.py
q() { "$G" --store "$S" query --format csv "$1" | tail -n +2; }
echo "== probe"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
export GPUQ_CUPTI_LIB=$(python3 -c "import glob, os, torch; d=os.path.dirname(os.path.dirname(torch.__file__)); print((glob.glob(d+'/nvidia/*/lib/libcupti.so.*')+glob.glob(d+'/nvidia/cuda_cupti/lib/libcupti.so.*'))[0])")
echo "libcupti: $GPUQ_CUPTI_LIB"
rec() { timeout 240 "$G" --store "$S" record --collector "$B/libgpuq_collector.so" --flush-interval 1s "$@"; }
echo "== C1/C2/C3 exact"
rec --run exact --kinds kernel,runtime,driver,marker -- python3 $W exact 20000 | tee "$OUT/exact.txt"
q "select count(*) as kernels, min(ts) as first from events where run='exact' and kind='kernel' and name like '%spin%'"
q "select count(distinct step) from events where run='exact' and kind='kernel'"
q "select warning_details, metadata from runs where run='exact'"
echo "== C4 overhead (plain, recorded, plain, recorded)"
for i in 1 2; do
  python3 $W gemm 100 | grep median
  rec --run "gemm$i" -- python3 $W gemm 100 | grep median
done
echo "== C5 liveness"
(rec --run live -- python3 $W gemm 400 > "$OUT/live.txt") & sleep 8
q "select count(*) from events where run='live' and kind='kernel'"; wait
echo "== C6 SIGKILL"
(rec --run killed -- python3 $W gemm 100000 > "$OUT/killed.txt" 2>&1) & sleep 12
pkill -9 -f "$W gemm 100000"; wait
q "select count(*) from events where run='killed' and kind='kernel'"; q "select warning_details from runs where run='killed'"
echo "== C7 torch.profiler in the same process"
rec --run profiled -- python3 $W profiled 60
q "select count(*) from events where run='profiled' and kind='kernel'"; q "select warning_details from runs where run='profiled'"
