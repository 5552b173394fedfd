//! Analyses across runs: `compare` (two runs or run selectors), `trend` (one metric over the
//! runs a selector matches), `scaling` (time against a numeric tag), `repeatability` (repeated
//! runs of one job), and the regression gate's verdict ([`gate`]) behind `gpuq check`. Runs
//! are named by [selectors](selector);
//! each run's measures come from its [`profile`]; the tests are in [`stats`], and keys are
//! judged against the run-wide shift ([`run_shift`]). [`gate_sim`] generates pairs of runs
//! with known changes for the gate's calibration.

pub mod compare;
pub mod gate;
pub mod gate_sim;
pub mod profile;
pub mod repeatability;
pub mod run_shift;
pub mod scaling;
pub mod selector;
pub mod stats;
pub mod trend;

#[cfg(test)]
mod tests;
