#!/usr/bin/env bash
# Ingest benchmark: gpuq vs DuckDB read_json on the same Kineto trace.
#
# Usage: benches/ingest_vs_duckdb.sh [WORKDIR]        (default /tmp/gpuq-bench)
#
# Environment:
#   GPUQ          gpuq binary   (default $HOME/.cache/gpuq/target/release/gpuq)
#   BIG_BYTES     size of the main trace            (default 1080000000)
#   HUGE_BYTES    size of the peak-RSS trace        (default 6000000000; 0 skips)
#   NRUNS         runs in the point-query store     (default 100)
#   PAIRS         side-by-side gpuq/DuckDB pairs on the main trace (default 3): DuckDB's
#                 time on one machine varies by 2x from run to run, so one pair says little
#   RUN_BYTES     size of each of those runs        (default 20000000)
#   SKIP_DUCKDB   1 skips the DuckDB side
#   KEEP          1 keeps the big files at the end
#
# Needs: /usr/bin/time (package `time`), python3 with the duckdb package, gzip.
# Disk: about 1.1 GB + store for the main trace, plus HUGE_BYTES + its store
# while step 7 runs (checked; step 7 is skipped when the disk is short).
#
# Note: the store path is made absolute here for clear logs; gpuq itself accepts
# relative --store paths.
set -uo pipefail

WORK=$(realpath -m "${1:-/tmp/gpuq-bench}")
GPUQ=${GPUQ:-$HOME/.cache/gpuq/target/release/gpuq}
BIG_BYTES=${BIG_BYTES:-1080000000}
HUGE_BYTES=${HUGE_BYTES:-6000000000}
NRUNS=${NRUNS:-100}
PAIRS=${PAIRS:-3}
RUN_BYTES=${RUN_BYTES:-20000000}
SKIP_DUCKDB=${SKIP_DUCKDB:-0}
KEEP=${KEEP:-0}

mkdir -p "$WORK"
BIG="$WORK/trace-1g.json"
STORE="$WORK/store"
MANY="$WORK/store-many"
LOG="$WORK/log"
mkdir -p "$LOG"
ERRORS=()
declare -A R   # results for the summary

say() { printf '\n== %s\n' "$*"; }
err() { ERRORS+=("$*"); printf 'ERROR: %s\n' "$*" >&2; }
now() { date +%s.%N; }
fsize() { stat -c %s "$1"; }
calc() { python3 -c "print($*)"; }

[[ -x $GPUQ ]] || { echo "gpuq binary not found: $GPUQ" >&2; exit 1; }
if [[ ! -x /usr/bin/time ]]; then
  say "installing /usr/bin/time"
  apt-get update -qq && apt-get install -y -qq time >/dev/null || { echo "cannot install time" >&2; exit 1; }
fi
if [[ $SKIP_DUCKDB != 1 ]] && ! python3 -c 'import duckdb' 2>/dev/null; then
  say "installing duckdb (pip)"
  pip install -q duckdb || { echo "pip install duckdb failed; rerun with SKIP_DUCKDB=1" >&2; exit 1; }
fi

# timed NAME CMD...: runs CMD under /usr/bin/time -v; sets R[NAME.wall], R[NAME.rss_mb], R[NAME.rc]
timed() {
  local name=$1; shift
  local tv="$LOG/$name.time" out="$LOG/$name.out"
  /usr/bin/time -v -o "$tv" "$@" >"$out" 2>&1
  local rc=$?
  R[$name.rc]=$rc
  local el rss
  el=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tv")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tv")
  R[$name.wall]=$(python3 -c "
p='$el'.split(':'); s=0.0
for x in p: s=s*60+float(x)
print(f'{s:.2f}')")
  R[$name.rss_mb]=$(calc "round(${rss:-0}/1024)")
  printf '%-14s rc=%s wall=%ss peakRSS=%s MB\n' "$name" "$rc" "${R[$name.wall]}" "${R[$name.rss_mb]}"
  if [[ $rc != 0 ]]; then
    err "$name exited $rc: $(tail -c 600 "$out")"
  fi
  return $rc
}

T0=$(now)
echo "gpuq: $GPUQ ($("$GPUQ" --version 2>&1))"
echo "work: $WORK"
echo "cpus: $(nproc)  mem: $(free -g | awk '/Mem:/{print $2}') GB  disk free: $(df -h --output=avail "$WORK" | tail -1)"

# ---------------------------------------------------------------- 1. trace
say "1. generate ${BIG_BYTES}-byte trace"
if [[ -s $BIG ]] && (( $(fsize "$BIG") > BIG_BYTES * 9 / 10 )); then
  echo "reusing $BIG"
else
  t=$(now); "$GPUQ" generate "$BIG" --bytes "$BIG_BYTES" --seed 1 || err "generate failed"
  echo "generated in $(calc "round($(now)-$t,2)") s"
fi
BIG_SIZE=$(fsize "$BIG")
BIG_MB=$(calc "round($BIG_SIZE/1e6,1)")
echo "trace: $BIG_SIZE bytes"

# ---------------------------------------------------------------- 2. gpuq ingest
say "2. gpuq ingest"
rm -rf "$STORE"
sync
timed gpuq_ingest "$GPUQ" --store "$STORE" ingest "$BIG" --run bench -q
R[gpuq_ingest.mbps]=$(calc "round($BIG_SIZE/1e6/${R[gpuq_ingest.wall]},1)")
echo "throughput: ${R[gpuq_ingest.mbps]} MB/s"

# ---------------------------------------------------------------- 3. duckdb
# DuckDB's auto-detection of the whole traceEvents struct fails on Kineto traces
# ("Duplicate name "Bytes" in struct auto-detected in JSON": memory events carry
# both "bytes" and "Bytes" in args), so two working forms are measured:
#   duckdb_cols : explicit columns= with just the three needed fields (fast form)
#   duckdb_auto : full auto-detection with ignore_errors=true (the naive query)
DUCK_PY="$WORK/duck_kernel_sum.py"
cat >"$DUCK_PY" <<'EOF'
import csv, sys, duckdb
path, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "cols":
    src = (f"read_json('{path}', format='auto', records=true, maximum_object_size=2000000000, "
           "columns={'traceEvents': 'STRUCT(name VARCHAR, cat VARCHAR, dur DOUBLE)[]'})")
else:
    src = f"read_json('{path}', maximum_object_size=2000000000, ignore_errors=true)"
q = f"""SELECT e.name AS name, count(*) AS n, sum(e.dur) AS total_us,
               sum(round(e.dur * 1000)::BIGINT) AS total_ns
        FROM (SELECT unnest(traceEvents) AS e FROM {src})
        WHERE e.cat = 'kernel' GROUP BY 1 ORDER BY 1"""
print(q)
rows = duckdb.connect().execute(q).fetchall()
with open(out, "w", newline="") as f:
    w = csv.writer(f); w.writerow(["name", "n", "total_us", "total_ns"]); w.writerows(rows)
print(f"{len(rows)} kernel names")
EOF
if [[ $SKIP_DUCKDB == 1 ]]; then
  echo "skipped (SKIP_DUCKDB=1)"
else
  python3 -c 'import duckdb; print("duckdb", duckdb.__version__)'
  sync
  timed duckdb_cols python3 "$DUCK_PY" "$BIG" cols "$WORK/duck_cols.csv"
  sync
  timed duckdb_auto python3 "$DUCK_PY" "$BIG" auto "$WORK/duck_auto.csv"
fi

# ---------------------------------------------------------------- 3b. more pairs
# The first pair is steps 2 and 3; each further pair runs gpuq (into a scratch store) and then
# DuckDB's fast form, one right after the other.
say "3b. side-by-side pairs: $PAIRS"
PAIR_LINES=()
pair_line() {  # pair_line N GPUQ_NAME DUCK_NAME
  local g=${R[$2.wall]:-} d=${R[$3.wall]:-}
  [[ -n $g && -n $d && ${R[$2.rc]} == 0 && ${R[$3.rc]} == 0 ]] || return 0
  PAIR_LINES+=("$(printf 'pair %-3s gpuq %6.2f s   duckdb %6.2f s   ratio %5.2fx' "$1" "$g" "$d" "$(calc "$d/$g")")")
  R[pair_ratios]+="$(calc "round($d/$g,2)") "
}
if [[ $SKIP_DUCKDB != 1 ]]; then
  pair_line 1 gpuq_ingest duckdb_cols
  for ((p = 2; p <= PAIRS; p++)); do
    rm -rf "$WORK/store-pair"; sync
    timed gpuq_ingest_$p "$GPUQ" --store "$WORK/store-pair" ingest "$BIG" --run bench -q
    sync
    timed duckdb_cols_$p python3 "$DUCK_PY" "$BIG" cols "$WORK/duck_cols_$p.csv"
    pair_line "$p" gpuq_ingest_$p duckdb_cols_$p
  done
  rm -rf "$WORK/store-pair"
  printf '%s\n' "${PAIR_LINES[@]}"
fi

# ---------------------------------------------------------------- 4. agreement
say "4. result agreement"
GQ_SQL="SELECT name, count(*) AS n, sum(dur) AS total FROM kernels WHERE run='bench' GROUP BY name ORDER BY name"
t=$(now)
if "$GPUQ" --store "$STORE" query --format csv "$GQ_SQL" >"$WORK/gpuq.csv" 2>"$LOG/gpuq_sum.err"; then
  R[gpuq_sum.wall]=$(calc "round($(now)-$t,2)")
  echo "gpuq kernel-sum over the stored run: ${R[gpuq_sum.wall]} s"
else
  err "gpuq kernel-sum query failed: $(cat "$LOG/gpuq_sum.err")"
fi
compare() {  # compare DUCK_CSV LABEL
  python3 - "$WORK/gpuq.csv" "$1" "$2" <<'EOF'
import csv, sys
g = {r["name"]: r for r in csv.DictReader(open(sys.argv[1]))}
d = {r["name"]: r for r in csv.DictReader(open(sys.argv[2]))}
label = sys.argv[3]
only_g, only_d = sorted(set(g) - set(d)), sorted(set(d) - set(g))
cnt_bad = exact_bad = 0; max_float_diff = 0
for k in set(g) & set(d):
    gn, gt = int(g[k]["n"]), int(g[k]["total"])
    if gn != int(d[k]["n"]): cnt_bad += 1
    if gt != int(d[k]["total_ns"]): exact_bad += 1
    max_float_diff = max(max_float_diff, abs(gt - round(float(d[k]["total_us"]) * 1000)))
tot_g = sum(int(r["n"]) for r in g.values()); tot_d = sum(int(r["n"]) for r in d.values())
ok = not only_g and not only_d and cnt_bad == 0 and exact_bad == 0
print(f"{label}: names gpuq={len(g)} duckdb={len(d)} only_gpuq={len(only_g)} only_duckdb={len(only_d)}; "
      f"kernels gpuq={tot_g} duckdb={tot_d}; count mismatches={cnt_bad}; "
      f"ns-sum mismatches (per-event rounded)={exact_bad}; max |gpuq_ns - round(duck_us_sum*1000)|={max_float_diff} ns")
for k in (only_g + only_d)[:5]: print("  differing name:", k)
print("AGREE" if ok else "DISAGREE")
EOF
}
for m in cols auto; do
  f="$WORK/duck_$m.csv"
  if [[ -s $f && -s $WORK/gpuq.csv ]]; then
    line=$(compare "$f" "duckdb_$m"); echo "$line"
    R[agree_$m]=$(tail -1 <<<"$line")
    [[ ${R[agree_$m]} == AGREE ]] || err "gpuq vs duckdb_$m disagree: $line"
  fi
done

# ---------------------------------------------------------------- 5. size
say "5. stored size"
R[store_bytes]=$(du -sb "$STORE/events" | cut -f1)
t=$(now)
R[gzip_bytes]=$(gzip -6 -c "$BIG" | wc -c)
echo "gzip -6 took $(calc "round($(now)-$t,1)") s"
echo "json=$BIG_SIZE  gpuq events/=${R[store_bytes]}  gzip-6=${R[gzip_bytes]}"
echo "ratio json/gpuq=$(calc "round($BIG_SIZE/${R[store_bytes]},1)")  gpuq/gzip=$(calc "round(${R[store_bytes]}/${R[gzip_bytes]},3)")"

# ---------------------------------------------------------------- 6. point query over many runs
say "6. point query over $NRUNS runs of ${RUN_BYTES} bytes"
rm -rf "$MANY"
t=$(now)
for i in $(seq 1 "$NRUNS"); do
  j="$WORK/r$i.json"
  "$GPUQ" generate "$j" --bytes "$RUN_BYTES" --seed "$((1000 + i))" >/dev/null 2>"$LOG/gen_r$i.err" \
    || err "generate r$i: $(cat "$LOG/gen_r$i.err")"
  "$GPUQ" --store "$MANY" ingest "$j" --run "r$i" -q 2>"$LOG/ingest_r$i.err" \
    || err "ingest r$i: $(cat "$LOG/ingest_r$i.err")"
  rm -f "$j"
done
R[many_build]=$(calc "round($(now)-$t,1)")
R[many_bytes]=$(du -sb "$MANY" | cut -f1)
echo "built in ${R[many_build]} s, store ${R[many_bytes]} bytes, files: $(find "$MANY/events" -name '*.parquet' | wc -l)"
median5() {  # median5 NAME CMD...: 5 timed runs (wall incl. process start)
  local name=$1; shift; local ts=()
  for k in 1 2 3 4 5; do
    local s; s=$(now)
    "$@" >"$LOG/$name.out" 2>&1 || err "$name failed: $(tail -c 600 "$LOG/$name.out")"
    ts+=("$(calc "$(now)-$s")")
  done
  R[$name]=$(python3 -c "import statistics,sys; v=sorted(map(float,sys.argv[1:])); print(f'{statistics.median(v)*1000:.0f} ms (min {v[0]*1000:.0f}, max {v[-1]*1000:.0f})')" "${ts[@]}")
  echo "$name: ${R[$name]}"
}
PQ_RUN="r$(( (NRUNS + 1) / 2 ))"
PQ="SELECT name, sum(dur) FROM kernels WHERE run = '$PQ_RUN' GROUP BY name ORDER BY 2 DESC LIMIT 5"
median5 point_query "$GPUQ" --store "$MANY" query "$PQ"
cat "$LOG/point_query.out"
# A point query that finds nothing would time nothing.
grep -q '[0-9]' "$LOG/point_query.out" || err "point query on $PQ_RUN returned no rows"
median5 runs_list "$GPUQ" --store "$MANY" runs
echo "runs listed: $(grep -c '| r[0-9]' "$LOG/runs_list.out")"
median5 all_runs_query "$GPUQ" --store "$MANY" query "SELECT count(*) FROM kernels"
cat "$LOG/all_runs_query.out"

# ---------------------------------------------------------------- 7. huge trace peak RSS
say "7. peak RSS ingesting a ${HUGE_BYTES}-byte trace"
HUGE="$WORK/trace-huge.json"; HSTORE="$WORK/store-huge"
avail=$(( $(df --output=avail -B1 "$WORK" | tail -1) ))
need=$(( HUGE_BYTES * 13 / 10 + 2000000000 ))
if (( HUGE_BYTES == 0 )); then
  echo "skipped (HUGE_BYTES=0)"; R[huge]=skipped
elif (( avail < need )); then
  echo "skipped: disk free $avail < needed $need"; R[huge]="skipped (disk)"
else
  rm -rf "$HSTORE"
  t=$(now); "$GPUQ" generate "$HUGE" --bytes "$HUGE_BYTES" --seed 7 || err "generate huge failed"
  echo "generated in $(calc "round($(now)-$t,1)") s"
  HUGE_SIZE=$(fsize "$HUGE")
  sync
  timed gpuq_huge "$GPUQ" --store "$HSTORE" ingest "$HUGE" --run huge -q
  R[gpuq_huge.mbps]=$(calc "round($HUGE_SIZE/1e6/${R[gpuq_huge.wall]},1)")
  R[huge_store]=$(du -sb "$HSTORE/events" | cut -f1)
  R[huge]="json=$HUGE_SIZE"
  "$GPUQ" --store "$HSTORE" query --format csv "SELECT count(*) AS events, sum(CASE WHEN kind='kernel' THEN 1 ELSE 0 END) AS kernels FROM events" \
    >"$LOG/huge_count.out" 2>&1 || err "huge count query: $(cat "$LOG/huge_count.out")"
  cat "$LOG/huge_count.out"
  [[ $KEEP == 1 ]] || rm -rf "$HUGE" "$HSTORE"
fi

# ---------------------------------------------------------------- summary
TOTAL=$(calc "round($(now)-$T0)")
say "SUMMARY (total ${TOTAL} s)"
v() { echo "${R[$1]:--}"; }
{
printf '%-44s %12s %12s %12s\n' "measurement" "wall s" "peak RSS MB" "MB/s"
printf '%-44s %12s %12s %12s\n' "gpuq ingest ${BIG_MB} MB JSON" "$(v gpuq_ingest.wall)" "$(v gpuq_ingest.rss_mb)" "$(v gpuq_ingest.mbps)"
if [[ $SKIP_DUCKDB != 1 ]]; then
  printf '%-44s %12s %12s %12s\n' "duckdb kernel-sum, columns= (fast form)" "$(v duckdb_cols.wall)" "$(v duckdb_cols.rss_mb)" \
    "$( [[ -n ${R[duckdb_cols.wall]:-} ]] && calc "round($BIG_SIZE/1e6/${R[duckdb_cols.wall]},1)")"
  printf '%-44s %12s %12s %12s\n' "duckdb kernel-sum, ignore_errors=true (auto)" "$(v duckdb_auto.wall)" "$(v duckdb_auto.rss_mb)" \
    "$( [[ -n ${R[duckdb_auto.wall]:-} ]] && calc "round($BIG_SIZE/1e6/${R[duckdb_auto.wall]},1)")"
fi
printf '%-44s %12s\n' "gpuq kernel-sum query on stored run" "$(v gpuq_sum.wall)"
if [[ -n ${R[gpuq_huge.wall]:-} ]]; then
  printf '%-44s %12s %12s %12s\n' "gpuq ingest ${HUGE_BYTES}-byte JSON" "$(v gpuq_huge.wall)" "$(v gpuq_huge.rss_mb)" "$(v gpuq_huge.mbps)"
else
  printf '%-44s %12s\n' "gpuq ingest ${HUGE_BYTES}-byte JSON" "$(v huge)"
fi
if ((${#PAIR_LINES[@]})); then
  echo
  echo "gpuq ingest vs duckdb columns= kernel-sum, side by side:"
  printf '  %s\n' "${PAIR_LINES[@]}"
  echo "  ratio median $(python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" ${R[pair_ratios]})x, lowest $(python3 -c "import sys; print(min(map(float, sys.argv[1:])))" ${R[pair_ratios]})x"
fi
echo
echo "agreement gpuq vs duckdb (columns=): $(v agree_cols)   (auto): $(v agree_auto)"
echo "size: json $BIG_SIZE B | gpuq events/ $(v store_bytes) B | gzip -6 $(v gzip_bytes) B"
[[ -n ${R[huge_store]:-} ]] && echo "size huge: gpuq events/ ${R[huge_store]} B"
echo "$NRUNS-run store: built in $(v many_build) s, $(v many_bytes) B"
echo "point query (run='$PQ_RUN', median of 5, incl. process start): $(v point_query)"
echo "gpuq runs listing (median of 5):                         $(v runs_list)"
echo "count(*) over all $NRUNS runs (median of 5):               $(v all_runs_query)"
echo
if ((${#ERRORS[@]})); then
  echo "ERRORS (${#ERRORS[@]}):"; printf '  - %s\n' "${ERRORS[@]}"
else
  echo "no errors"
fi
} | tee "$WORK/summary.txt"

# ---------------------------------------------------------------- cleanup
if [[ $KEEP != 1 ]]; then
  rm -rf "$BIG" "$STORE" "$MANY" "$WORK"/r*.json "$WORK/store-huge" "$WORK/trace-huge.json" "$WORK"/duck_cols_*.csv
fi
((${#ERRORS[@]} == 0))
