//! The fuzz targets' bodies and their seed corpora, shared by `fuzz/` and the short fuzz run
//! in `tests/fuzz_short.rs`.

pub mod fuzz;
mod fuzz_seeds;
