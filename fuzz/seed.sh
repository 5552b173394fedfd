#!/usr/bin/env bash
# Writes every fuzz target's seed corpus into fuzz/corpus/<target>/: inputs from gpuq's
# generators and fixtures, plus small slices of ../shared/traces when it is present.
# Usage: fuzz/seed.sh [TARGET...]   (stable toolchain; the corpus is git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpuq/target}"
# --workspace: the features the warm build has (one package alone would rebuild DataFusion).
cargo build --release --workspace --bin fuzz-seeds -q
"$CARGO_TARGET_DIR/release/fuzz-seeds" fuzz/corpus "$@"
