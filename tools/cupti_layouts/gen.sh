#!/usr/bin/env bash
# gen.sh — regenerate tools/cupti_layouts/layouts.golden, the layout truth table of the CUPTI
# activity records gpuq reads (offsetof/sizeof/enum values compiled by gcc against the headers of
# three CUPTI releases). Run by a developer when a CUDA release adds a header set; not run by CI.
#
#   tools/cupti_layouts/gen.sh [WHEEL_DIR]
#
# WHEEL_DIR: a directory already holding (some of) the wheels below; missing ones are fetched with
# `pip download --no-deps` into a temporary directory. The runtime wheels supply cuda.h and
# builtin_types.h (CUPTI's headers include them); their crt/host_defines.h is absent, so a stub
# with gcc's attribute spellings is written (it only defines qualifier macros, no layouts).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/layouts.golden"
given="${1:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
CC="${CC:-gcc}"

# CUPTI wheel, matching runtime wheel (headers only), include dir inside both wheels.
sets=(
  "nvidia-cuda-cupti-cu12==12.8.90 nvidia-cuda-runtime-cu12==12.8.90 nvidia/cuda_cupti/include nvidia/cuda_runtime/include"
  "nvidia-cuda-cupti==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia/cu13/include nvidia/cu13/include"
  "nvidia-cuda-cupti==13.5.25 nvidia-cuda-runtime==13.5.37 nvidia/cu13/include nvidia/cu13/include"
)

# generic name : C struct base name : fields (the order the golden table lists them in)
records=(
  "kernel:Kernel:kind registersPerThread start end completed deviceId contextId streamId gridX gridY gridZ blockX blockY blockZ staticSharedMemory dynamicSharedMemory correlationId gridId name queued submitted launchType graphNodeId graphId"
  "memcpy:Memcpy:kind copyKind srcKind dstKind flags bytes start end deviceId contextId streamId correlationId graphNodeId graphId"
  "memset:Memset:kind value bytes start end deviceId contextId streamId correlationId flags memoryKind graphNodeId graphId"
  "api:API:kind cbid start end processId threadId correlationId returnValue"
  "sync:Synchronization:kind type start end correlationId contextId streamId cudaEventId"
  "external_correlation:ExternalCorrelation:kind externalKind externalId correlationId"
  "marker:Marker:kind flags timestamp id objectKind objectId name domain"
  "overhead:Overhead:kind overheadKind objectKind objectId start end correlationId"
  "device:Device:kind globalMemorySize numMultiprocessors computeCapabilityMajor computeCapabilityMinor id uuid name"
  "context:Context:kind contextId deviceId"
)

# wheel_path SPEC -> path of the wheel file for "name==version" (from $given, else downloaded)
wheel_path() {
  local spec="$1" name ver pat f
  name="${spec%%==*}"; ver="${spec##*==}"
  pat="$(echo "$name" | tr '-' '_')-${ver}-"
  if [[ -n "$given" ]]; then
    f="$(ls "$given"/"$pat"*.whl 2>/dev/null | head -n1 || true)"
    [[ -n "$f" ]] && { echo "$f"; return; }
  fi
  mkdir -p "$work/dl"
  f="$(ls "$work/dl"/"$pat"*.whl 2>/dev/null | head -n1 || true)"
  if [[ -z "$f" ]]; then
    python3 -m pip download --quiet --no-deps -d "$work/dl" "$spec" >&2
    f="$(ls "$work/dl"/"$pat"*.whl | head -n1)"
  fi
  echo "$f"
}

# The stub: host_defines.h (runtime wheel) includes crt/host_defines.h, which ships with nvcc.
mkdir -p "$work/stub/crt"
cat >"$work/stub/crt/host_defines.h" <<'EOF'
/* Stub of nvcc's crt/host_defines.h for a host-only gcc compile (qualifiers only). */
#pragma once
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __attribute__((aligned(a)))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __launch_bounds__(...)
EOF

rows="$work/rows.tsv"; comments="$work/comments.txt"; : >"$rows"; : >"$comments"
for s in "${sets[@]}"; do
  read -r cupti_spec rt_spec cupti_inc rt_inc <<<"$s"
  d="$work/$(echo "$cupti_spec" | tr '=' '_')"
  mkdir -p "$d/cupti" "$d/rt"
  unzip -q -o "$(wheel_path "$cupti_spec")" "$cupti_inc/*" -d "$d/cupti"
  unzip -q -o "$(wheel_path "$rt_spec")" "$rt_inc/*" -d "$d/rt"
  act="$d/cupti/$cupti_inc/cupti_activity.h"

  # gen_fields.h: the newest struct of each kind and which of the wanted fields it has.
  hdr="$d/gen_fields.h"
  { echo "#define STRUCTS(X) \\"
    for r in "${records[@]}"; do
      IFS=: read -r generic base _ <<<"$r"
      t="$(grep -oE "\} CUpti_Activity${base}[0-9]*;" "$act" | sed -E 's/^\} //; s/;$//' | sort -V | tail -n1)"
      [[ -n "$t" ]] || { echo "gen.sh: no CUpti_Activity${base}* in $act" >&2; exit 1; }
      echo "  X($generic, $t) \\"
      echo "$generic $t" >>"$d/structs.txt"
    done
    echo ""
  } >"$hdr"
  fields_line="#define FIELDS(X) \\"; missing_line="#define MISSING(X) \\"
  for r in "${records[@]}"; do
    IFS=: read -r generic base fields <<<"$r"
    t="$(awk -v g="$generic" '$1==g {print $2}' "$d/structs.txt")"
    # The struct body without doc comments: lines between its `typedef struct` and `} T;`.
    body="$(awk -v n="} $t;" '/typedef struct/ {buf=""; on=1} on {buf=buf"\n"$0} on && index($0, n)==1 {print buf; on=0}' "$act" \
      | grep -vE '^\s*(\*|/\*)')"
    for f in $fields; do
      if grep -qE "[^A-Za-z0-9_]${f}(\[[0-9]+\])?;" <<<"$body"; then
        fields_line+=$'\n'"  X($generic, $t, $f) \\"
      else
        missing_line+=$'\n'"  X($generic, $t, $f) \\"
      fi
    done
  done
  { echo "$fields_line"; echo ""; echo "$missing_line"; echo ""; } >>"$hdr"

  "$CC" -std=c11 -O0 -Wall -I"$d" -I"$d/cupti/$cupti_inc" -I"$d/rt/$rt_inc" -I"$work/stub" \
    "$here/layouts.c" -o "$d/layouts"
  "$d/layouts" >"$d/out.txt"
  api="$(awk -F'\t' '$2=="enum" && $3=="CUPTI_API_VERSION" {print $4}' "$d/out.txt")"
  echo "# api $api from $cupti_spec (cuda.h etc. from $rt_spec)" >>"$comments"
  grep '^#' "$d/out.txt" >>"$comments" || true
  grep -v '^#' "$d/out.txt" >>"$rows"
done

{
  echo "# layouts.golden — CUPTI activity record layouts, generated by tools/cupti_layouts/gen.sh"
  echo "# (gcc $("$CC" -dumpfullversion), x86_64 LP64: offsetof/sizeof/enum values compiled against"
  echo "# each wheel's headers). Do not edit by hand; rerun gen.sh."
  echo "# columns: api_version struct field offset size; field (sizeof) = record size;"
  echo "# struct enum = constant (offset column = its value)."
  cat "$comments"
  grep -q 'has no field' "$comments" || echo "# every listed field exists in every header set above."
  cat "$rows"
} >"$out"
echo "wrote $out ($(wc -l <"$rows") rows)" >&2
