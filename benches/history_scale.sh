#!/usr/bin/env bash
# History at scale: a store of NRUNS generated runs (~EVENTS events each; 500 x 200 k = 100 M
# rows by default), then side by side with DuckDB on the same Parquet files, and the history
# commands' latencies.
#
# Usage: benches/history_scale.sh [WORKDIR]        (default /tmp/gpuq-history)
#
# Environment:
#   GPUQ        gpuq binary (default $HOME/.cache/gpuq/target/release/gpuq)
#   NRUNS       runs (default 500)
#   EVENTS      events per run, approximately (default 200000)
#   PYTHON      python3 with the duckdb package (default: a venv made under WORKDIR)
#   REUSE       1 keeps an existing store of the same shape instead of regenerating it
#
# Runs 1..NRUNS are repeats of one configuration (same events, +-5 % kernel jitter), tagged
# model=llama, i=N, branch=main; from run 0.8*NRUNS on, the FC1 GEMM is 30 % slower (branch=pr),
# so `trend` has a change point to find.
set -uo pipefail

WORK=$(realpath -m "${1:-/tmp/gpuq-history}")
GPUQ=${GPUQ:-$HOME/.cache/gpuq/target/release/gpuq}
NRUNS=${NRUNS:-500}
EVENTS=${EVENTS:-200000}
REUSE=${REUSE:-0}
STORE="$WORK/store"
mkdir -p "$WORK"
say() { printf '\n== %s\n' "$*"; }
secs() { python3 -c 'import sys,time; print(f"{time.time():.6f}")'; }

if [ -z "${PYTHON:-}" ]; then
  PYTHON="$WORK/venv/bin/python"
  if ! "$PYTHON" -c 'import duckdb' 2>/dev/null; then
    say "installing duckdb into $WORK/venv"
    python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q duckdb || {
      echo "cannot install duckdb" >&2; exit 1; }
  fi
fi

shape="$NRUNS runs x $EVENTS events"
if [ "$REUSE" = 1 ] && [ -f "$WORK/shape" ] && [ "$(cat "$WORK/shape")" = "$shape" ]; then
  say "reusing the store in $STORE ($shape)"
else
  rm -rf "$STORE" "$WORK/gen"
  mkdir -p "$WORK/gen"
  # Calibrate: events per step of the demo shape.
  "$GPUQ" generate "$WORK/gen/cal.json" --steps 4 > "$WORK/gen/cal.out" || exit 1
  per4=$(grep -o '[0-9]* events' "$WORK/gen/cal.out" | grep -o '[0-9]*')
  STEPS=$(( EVENTS * 4 / per4 ))
  [ "$STEPS" -lt 5 ] && STEPS=5
  say "generating and ingesting $shape ($STEPS steps a run)"
  slow_from=$(( NRUNS * 8 / 10 ))
  t0=$(secs)
  for i in $(seq 1 $NRUNS); do
    f="$WORK/gen/r$(printf %04d $i).json"
    branch=main; extra=()
    [ $i -ge $slow_from ] && { branch=pr; extra=(--scale-kernel gemm_relu=130); }
    "$GPUQ" generate "$f" --steps $STEPS --steady --jitter 5 --repeat $i "${extra[@]}" > /dev/null || exit 1
    # Without --run a file becomes a run named after it (r0001, ...).
    "$GPUQ" --store "$STORE" ingest -q "$f" --tag model=llama --tag branch=$branch --tag i=$i || exit 1
    rm -f "$f"
    [ $(( i % 50 )) = 0 ] && echo "  $i runs"
  done
  t1=$(secs)
  echo "$shape" > "$WORK/shape"
  python3 -c "print(f'built the store in {$t1 - $t0:.0f} s')"
fi

rows=$("$GPUQ" --store "$STORE" query --format csv "SELECT count(*) FROM events" | tail -1)
kern=$("$GPUQ" --store "$STORE" query --format csv "SELECT count(*) FROM kernels" | tail -1)
size=$(du -sb "$STORE/events" | cut -f1)
echo "store: $rows events ($kern kernels), $(( size / 1000000 )) MB of Parquet"

Q="SELECT run, name, sum(dur) AS total FROM kernels GROUP BY run, name"
# gpuq in-process time: the REPL's \timing (stderr: "N row(s) in X s").
gpuq_time() {
  printf '\\timing\n\\o /dev/null\n%s;\n' "$1" | "$GPUQ" --store "$STORE" sql 2>&1 >/dev/null |
    grep -o 'in [0-9.]* s' | grep -o '[0-9.]*' | tail -1
}
best() { sort -g | head -1; }

say "1. $Q  (best of 3, in-process)"
g=$(for _ in 1 2 3; do gpuq_time "$Q"; done | best)
d=$("$PYTHON" - "$STORE" <<'EOF'
import duckdb, sys, time
store = sys.argv[1]
con = duckdb.connect()
q = f"""SELECT run, name, sum(dur) AS total
        FROM read_parquet('{store}/events/*/*.parquet', hive_partitioning = true)
        WHERE kind = 'kernel' GROUP BY run, name"""
best = 1e9
for _ in range(3):
    t = time.time(); con.sql(q).fetchall(); best = min(best, time.time() - t)
print(f"{best:.3f}")
EOF
)
echo "gpuq $g s, DuckDB $d s, ratio $(python3 -c "print(f'{$g / $d:.2f}')")"

say "2. one run: SELECT name, sum(dur) FROM kernels WHERE run = 'r0250' GROUP BY name"
g1=$(for _ in 1 2 3; do gpuq_time "SELECT name, sum(dur) FROM kernels WHERE run = 'r$(printf %04d $(( NRUNS / 2 )))' GROUP BY name"; done | best)
echo "gpuq $g1 s"

timed() {  # wall seconds of a command, best of 3
  for _ in 1 2 3; do
    t0=$(secs); "$@" > /dev/null 2>&1; t1=$(secs)
    python3 -c "print(f'{$t1 - $t0:.3f}')"
  done | best
}
a=r$(printf %04d $(( NRUNS / 5 + 1 ))); b=r$(printf %04d $NRUNS)
say "3. gpuq diff $a $b (wall, incl. process start)"
timed "$GPUQ" --store "$STORE" diff "$a" "$b"
"$GPUQ" --store "$STORE" diff "$a" "$b" | head -30

say "4. gpuq trend over all $NRUNS runs (wall)"
for m in step_time kernel_time "kernel:void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)"; do
  echo "metric ${m:0:40}: $(timed "$GPUQ" --store "$STORE" trend --by i --metric "$m") s"
done
"$GPUQ" --store "$STORE" trend --by i --metric "$m" | tail -1
echo "change points of ${m:0:40} (csv):"
"$GPUQ" --store "$STORE" trend --by i --metric "$m" --format csv | awk -F, '$NF == "true"'

say "5. REPL start to first prompt (echo '\\q' | gpuq sql, wall)"
timed sh -c "echo '\\q' | '$GPUQ' --store '$STORE' sql"

say "6. gpuq check (median of the main runs vs the last run, wall)"
timed "$GPUQ" --store "$STORE" check --baseline "tags['branch'] = 'main'" --candidate "$b"
"$GPUQ" --store "$STORE" check --baseline "tags['branch'] = 'main'" --candidate "$b" --max-regression 1% | tail -12
rc=${PIPESTATUS[0]}
# The candidate is a run with the slowed-down GEMM: the gate must fail, with exit status 1.
[ "$rc" = 1 ] || { echo "expected gpuq check to exit 1 (a regression), got $rc" >&2; exit 1; }
