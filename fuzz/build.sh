#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's instrumentation on the stable toolchain, reusing
# the warm release build of the workspace for every dependency (an instrumented build of
# DataFusion, as `cargo fuzz build` makes, takes an hour or more on a small machine).
#   fuzz/build.sh            -> $CARGO_FUZZ_TARGET_DIR/release/<target>
# The build directory starts as a hard-linked copy of the workspace build's dependencies
# (no extra disk), without gpuq's own crates, which rustc-sancov.sh instruments. The
# dependencies get the workspace's features because fuzz/Cargo.toml lists its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
stable="${CARGO_TARGET_DIR:-$HOME/.cache/gpuq/target}"
fz="${CARGO_FUZZ_TARGET_DIR:-$HOME/.cache/gpuq/target-fuzz/fz}"
if [ ! -d "$fz/release/deps" ]; then
    [ -d "$stable/release/deps" ] || cargo build --release --workspace
    mkdir -p "$fz/release"
    for d in deps build .fingerprint; do cp -al "$stable/release/$d" "$fz/release/"; done
    rm -rf "$fz"/release/{deps,build,.fingerprint}/*gpuq*
fi
cp Cargo.lock fuzz/Cargo.lock # the workspace's versions, so the warm builds match
CARGO_TARGET_DIR="$fz" RUSTC_WRAPPER="$PWD/fuzz/rustc-sancov.sh" \
    nice -n 19 cargo build --release --manifest-path fuzz/Cargo.toml --bins
