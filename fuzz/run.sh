#!/usr/bin/env bash
# One long fuzzing run of one target, at the lowest CPU priority:
#   fuzz/run.sh TARGET SECONDS [libFuzzer options...]
# Builds the targets (fuzz/build.sh), seeds the target's corpus (fuzz/seed.sh) if it has
# none, and runs it; libFuzzer prints its statistics at the end. A crash, or a hang (an input
# running past -timeout seconds), stops the run with a non-zero exit and leaves the input in
# fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$1"; seconds="$2"; shift 2
fz="${CARGO_FUZZ_TARGET_DIR:-$HOME/.cache/gpuq/target-fuzz/fz}"
fuzz/build.sh
[ -n "$(ls -A "fuzz/corpus/$target" 2>/dev/null)" ] || fuzz/seed.sh "$target"
mkdir -p "fuzz/artifacts/$target"
exec nice -n 19 "$fz/release/$target" "fuzz/corpus/$target" \
    -artifact_prefix="fuzz/artifacts/$target/" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 "$@"
