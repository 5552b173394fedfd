#!/usr/bin/env bash
# `gpuq export` speed and memory: a small and a large generated Kineto run, each exported as a
# whole to Perfetto and to Chrome JSON under /usr/bin/time. Targets: at least 1 M events/s, and
# the large run's peak RSS the same as the small one's (the export streams; the findings track
# analyses the whole run, so `--no-findings` is measured too).
#
# Usage: benches/export.sh GPUQ_BINARY [SMALL_BYTES] [LARGE_BYTES]   (defaults 60 MB and 600 MB)
set -euo pipefail
BIN=$1 SMALL=${2:-60000000} LARGE=${3:-600000000}
WORK=$(mktemp -d /tmp/gpuq-export.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
for size in "$SMALL" "$LARGE"; do
  "$BIN" generate --bytes "$size" "$WORK/t.json" >/dev/null
  rm -rf "$WORK/store"
  "$BIN" --store "$WORK/store" ingest -q "$WORK/t.json" --run r
  rm -f "$WORK/t.json"
  rows=$("$BIN" --store "$WORK/store" query --format csv "select count(*) from events" | tail -1)
  for variant in "perfetto" "chrome" "perfetto --no-findings"; do
    format=${variant%% *}
    extra=${variant#"$format"}
    # shellcheck disable=SC2086
    /usr/bin/time -f "%M %e" -o "$WORK/time" "$BIN" --store "$WORK/store" export r \
      -o "$WORK/out" --format "$format" $extra 2>/dev/null
    read -r rss secs < "$WORK/time"
    bytes=$(stat -c %s "$WORK/out")
    python3 -c "print(f'{$size/1e6:.0f} MB trace, {$rows} rows, $variant: {$secs} s = {$rows/$secs/1e6:.2f} M rows/s, peak RSS {$rss/1024:.0f} MB, file {$bytes/1e6:.1f} MB ({$bytes/$rows:.0f} B/row)')"
  done
done
