//! The run contract: what a run is given ([`RunAssignment`]), the events it leaves in its log
//! ([`RunEvent`], one [`RunEventBody`] variant per kind), how it ends ([`RunState`],
//! [`ResponseType`]) and the conversation messages it adds ([`Message`]).
//!
//! Every process that speaks about runs goes through these types: the harness emits them, both
//! of its replays read them, the Nest ⇄ instance socket and the Nest relay carry them, the Hub
//! stores, applies and traces them, and the CLI shows them. Follow [`RunEventBody`] to find
//! where any kind is produced and consumed.
//!
//! Wire form: a kind (`"tool.started"`) plus the JSON object of its fields
//! ([`RunEventBody::kind`], [`RunEventBody::to_json`], [`RunEventBody::from_parts`]); the Hub's
//! store keeps the same pair. Logs written before this module existed hold the same kinds and
//! field names, so they are read unchanged (see the fixture test in `tests.rs`).
//!
//! Invariants: a run's last event is `run.finished`; events hold deltas (one turn's new
//! message, one tool's result), never the whole context; an unknown kind from a newer peer is
//! kept as [`RunEventBody::Unknown`] and ignored by replay, never an error.

mod body;
mod delta;
mod ids;
mod message;
mod order;
pub mod trace;
pub mod wire;

pub use body::*;
pub use delta::*;

/// The start of the message of an instance kept on an old bundle version only because runs
/// that started on that version are not over yet (running, or waiting to resume): a rollout
/// (`agen deploy --wait`) does not wait for it.
pub const DRAINING_NOTE: &str = "draining: kept for runs that started on this version";
pub use ids::*;
pub use message::*;
pub use order::*;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One event of a run log: its place in the log and what happened.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    pub run_id: RunId,
    /// The attempt that wrote it (1 for the first).
    pub attempt: u32,
    /// Position in the attempt's log, from 1.
    pub seq: u64,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    pub body: RunEventBody,
}

/// One run to execute, as the Hub assigns it to an instance (or `agen run` makes it up).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunAssignment {
    pub run_id: RunId,
    /// 1 for the first attempt; a resume elsewhere has a higher attempt.
    pub attempt: u32,
    pub task_id: TaskId,
    pub namespace: String,
    pub deployment: String,
    /// The task's input text (this run's user message).
    pub input: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub conversation_id: String,
    /// The caller's key; empty when the task has none.
    #[serde(default)]
    pub conversation_key: String,
    /// The first run of the delegation tree (this run's id when it was not delegated).
    #[serde(default)]
    pub root_run_id: RunId,
    /// How many delegate calls above this run (0 for a task a client submitted); a
    /// `call_agent`/`start_agent` child runs at this depth + 1.
    #[serde(default)]
    pub delegation_depth: u32,
    /// Earlier messages of the conversation.
    #[serde(default)]
    pub history: Vec<Message>,
    /// Events of earlier attempts of this run, in order; may be empty.
    #[serde(default)]
    pub replay: Vec<RunEventBody>,
    /// The task's tool overrides (`agen submit --allow-tool/--ask-tool/--deny-tool`): they only
    /// narrow the bundle's permissions (see [`agen_shared::bundle::Permissions::decide_narrowed`]).
    #[serde(default)]
    pub tool_overrides: agen_shared::bundle::Permissions,
    /// The run's W3C trace id when the Hub set one (a caller's traceparent); empty: derived
    /// from the run id (`trace::trace_id`).
    #[serde(default)]
    pub trace_id: String,
    /// The task's token budget over all its attempts (`agen submit --max-tokens`, or the
    /// bundle's `limits.maxTokens` as the Hub resolved it); `None`: the bundle's, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The task's own output schema (`agen submit --output-schema FILE`): it takes the place of
    /// the bundle's `outputSchema` for this run; `None`: the bundle's, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

impl RunAssignment {
    /// The root of this run's delegation tree: its own id when it was not delegated.
    pub fn root_run_id(&self) -> &RunId {
        if self.root_run_id.is_empty() {
            &self.run_id
        } else {
            &self.root_run_id
        }
    }
}
