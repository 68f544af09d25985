//! The Agen Nest: the node daemon and everything that runs on a node.
//!
//! Reading order: `config`, `hub_link` (the one outbound stream to the Hub, reconnects),
//! `supervisor` (instance processes, restart policy, process-group guards), `host` (the
//! `agen instance` process: bundle, tool servers, runs), `mcp` (tool-server launcher and
//! registry), `model` (provider clients), `instance` (the agent harness), `keen` (the Keen text
//! dialect and its script/flow tools), `builtin` (the `agen mcp …` servers).
//!
//! Invariants: the Nest never opens the Hub's store; instances never hold Hub credentials and
//! talk only to their Nest over a Unix socket; no child outlives the Nest.

pub mod artifact_relay;
pub mod builtin;
pub mod bundles;
pub mod config;
pub mod daemon;
pub mod host;
pub mod hub_link;
pub mod instance;
pub mod keen;
pub mod mcp;
pub mod model;
pub mod socket;
pub mod supervisor;
