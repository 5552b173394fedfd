#!/bin/sh
# RUSTC_WRAPPER for fuzz/build.sh: instruments gpuq's crates and the fuzz targets for
# libFuzzer (coverage counters, comparison tracing, debug assertions and overflow checks, as
# cargo-fuzz does) and compiles every other crate exactly as the stable release build does,
# so that DataFusion and the rest come from the warm build instead of an instrumented
# rebuild of an hour or more.
rustc="$1"
shift
# The targets link all of DataFusion's line tables otherwise: 595 MB a binary, 23 MB without.
strip=
case " $* " in *" --crate-type bin "*) strip=-Cstrip=debuginfo ;; esac
case " $* " in
*" --crate-name gpuq_"* | *" --crate-name json_scan "* | *" --crate-name kineto "* | \
    *" --crate-name sqlite_pages "* | *" --crate-name rocprof "* | \
    *" --crate-name stagelog "* | *" --crate-name duration "* | *" --crate-name manifest "*)
    exec "$rustc" "$@" -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares \
        -Cllvm-args=-sanitizer-coverage-stack-depth \
        -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
        --cfg fuzzing -Cdebug-assertions=on -Coverflow-checks=on $strip
    ;;
esac
exec "$rustc" "$@"
