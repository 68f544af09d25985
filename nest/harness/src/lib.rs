//! The Agen harness: the agent loop as a library, used by the `agen instance` process (fleet),
//! by `agen run` (standalone) and by programs that embed an agent.
//!
//! Reading order: `run` (the loop: a [`Harness`] per instance, [`Harness::run`] per run, the
//! [`RunEventSink`] and [`ToolBackend`] seams), `model` (provider clients over real HTTP), `mcp`
//! (the tool-server host: launch rules, listing, calls with `_meta`), `keen` (the Keen text
//! dialect and its script/flow tools), `redact` (secret values and their quoted forms out of
//! results, errors, traces and tool-server stderr), `artifacts` (the built-in artifact tools' stores),
//! `standalone` (the `agen run` CLI alone), `run_log` (the local run log it and embedded agents
//! write; `local_runs` lists and reads those logs), `local_config` (secrets and model without a
//! Hub), `local_delegates` (a bundle prepared to run in-process, and delegates run that way), `agent` (the embedded SDK's [`agent::Agent`]:
//! the same loop inside a host program, with host tools).
//!
//! Invariants: the harness knows neither how its events are stored nor how its tool servers
//! were started beyond the traits it is given; no gRPC and no Hub types here.

pub mod agent;
pub mod artifacts;
pub mod keen;
pub mod local_config;
pub mod local_delegates;
pub mod local_runs;
pub mod mcp;
pub mod model;
pub mod redact;
pub mod run;
pub mod run_log;
pub mod standalone;
pub mod terminal;

pub use run::*;
