//! Deterministic synthetic traces with known ground truth: Kineto / Chrome-trace JSON
//! ([`kineto`]) and Nsight Systems SQLite exports ([`nsys`]), from one seeded generator
//! ([`rng`]). A leaf crate: tests that must run on a fresh clone, the benchmarks and
//! `gpuq generate` / `gpuq demo` use it; nothing on the ingest path does.

pub mod kineto;
pub mod nsys;
pub mod rng;

pub use kineto::{write_kineto, GroundTruth, SynthConfig};
pub use nsys::{write_nsys, NsysConfig, NsysTruth};
pub use rng::Rng;
