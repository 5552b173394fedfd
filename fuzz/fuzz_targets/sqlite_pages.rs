#![no_main]
//! cargo-fuzz target: the body is `gpuq_tests::fuzz::Target::SqlitePages`, also run by the stable
//! short run in `tests/tests/fuzz_short.rs`.
use gpuq_tests::fuzz::Target;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| Target::SqlitePages.run(data));
