#!/usr/bin/env bash
# Did a change alter what ingest stores? Generates the trace benches/ingest_vs_duckdb.sh uses
# (`gpuq generate --bytes BYTES --seed 1`), ingests it into a temporary store and prints the
# md5 of the generated file and of each stored table as CSV ordered by every column (events,
# counters). Run it with the binaries before and after a change: equal lines, same stored
# columns (row order and part layout aside).
#
# Usage: benches/columns_md5.sh GPUQ_BINARY [BYTES]      (BYTES default 1080000000, ~1.09 GB)
# The default trace (3.2 M events) takes about a minute and 2 GB of memory at its peak.
set -euo pipefail
GPUQ=$1 BYTES=${2:-1080000000}
WORK=$(mktemp -d /tmp/gpuq-md5.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$GPUQ" generate "$WORK/trace.json" --bytes "$BYTES" --seed 1 >/dev/null
echo "trace    $(md5sum <"$WORK/trace.json" | cut -d' ' -f1)  $(stat -c %s "$WORK/trace.json") bytes"
"$GPUQ" --store "$WORK/store" ingest -q "$WORK/trace.json" --run columns
q() { "$GPUQ" --store "$WORK/store" query --format csv "$1"; }
for table in events counters; do
  columns=$(q "SELECT * FROM $table LIMIT 0" | head -1)
  rows=$(q "SELECT count(*) FROM $table" | tail -1)
  echo "$table $(q "SELECT * FROM $table ORDER BY $columns" | md5sum | cut -d' ' -f1)  $rows rows"
done
