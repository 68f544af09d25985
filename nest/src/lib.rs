//! The Agen Nest: the node daemon and everything that runs on a node.
//!
//! Reading order: `config`, `model` (the Nest's domain types: placements, instance reports,
//! run orders and events, log requests), `daemon` (the Nest's `run`), `hub_link` (the one
//! outbound stream to the Hub, reconnects), `supervisor` (instance processes, restart policy,
//! process-group guards), `bundles` (cache by digest), `artifact_relay` (artifact transfers),
//! `child_relay` (delegate calls' child tasks), `cgroup` (per-instance resource limits and usage), `logs` (instances' and tool servers' stderr,
//! kept in rotated files and served to `agen logs`), `metrics` (`--metrics-listen`),
//! `run_context` (a run's history and replay, fetched from the Hub before the run starts),
//! `socket` (the Nest ⇄ instance protocol), `hub_client` (the bottom: the gRPC client, its
//! typed calls and the one protobuf ⇄ domain conversion), `instance` (the `agen instance`
//! process: bundle, tool servers, runs through the harness crate `agen-harness`).
//!
//! Invariants: the Nest never opens the Hub's store; instances never hold Hub credentials and
//! talk only to their Nest over a Unix socket; no child outlives the Nest; only `hub_link` and
//! `hub_client` know protobuf (everything else speaks `model`), and nothing below `hub_link`
//! imports it.

pub mod artifact_relay;
pub mod bundles;
pub mod cgroup;
pub mod child_relay;
pub mod config;
pub mod daemon;
pub mod deltas;
pub mod hub_client;
pub mod hub_link;
pub mod instance;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod netns;
pub mod outbox;
pub mod refused_run;
pub mod run_context;
pub mod separation;
pub mod socket;
pub mod supervisor;
