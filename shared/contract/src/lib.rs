//! Agen's cross-process contract, spoken from this one crate by every process: the run protocol
//! ([`run`]: what a run is given, the events it leaves, the typed ids of everything that crosses
//! a process) and the A2A types ([`a2a`]). Plain serde types: no IO, no async runtime, no gRPC;
//! the protobuf side converts to and from these types once, in `agen_proto::convert`.
//!
//! Invariant: a type moved here keeps its serde encoding (the ids are `#[serde(transparent)]`),
//! so a data dir and a run log written before still read (`tests/e2e/old_data_dir.rs`,
//! `run/fixtures/`).

pub mod a2a;
pub mod run;
