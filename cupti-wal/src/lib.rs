//! The write-ahead log between gpuq's CUPTI collector (inside the profiled process) and its
//! sink (`gpuq record`): segment files of decoded activity records.
//!
//! The collector decodes each CUPTI record into one fixed-size [`RawRecord`] (the fields gpuq
//! stores, whatever the record's struct version) and, every flush interval, writes the
//! records of that interval as one segment: written under a hidden name, synced, then renamed
//! to [`segment_name`], so that a segment that exists is whole and a crash loses at most the
//! interval in hand. A segment carries the strings its records use (kernel names, API names,
//! marker texts), so each one reads on its own.
//!
//! Layout (little-endian): the 8-byte [`MAGIC`], a `u32` format version, a `u32` zero; then
//! blocks, each a `u32` tag, a `u32` payload length and the payload: [`Block::Meta`] (JSON),
//! [`Block::Strings`], [`Block::Records`], [`Block::Health`] (JSON), and last [`Block::End`]
//! with the number of records. No crate reads or writes such a format for us, and a
//! fixed-size record costs the collector a few stores per field where Arrow builders cost
//! ~350 ns a record (measured in the research prototype).

mod format;

pub use format::*;
