//! What the `primjit` binary shares with the workspace's benches: the benchmark workload (its
//! shipped widths and their reader, the trunk, deterministic inputs, the process's memory).
#![forbid(unsafe_code)]

pub mod workload;
