//! `agen`: an Agen agent inside your own Rust program (the embedded SDK). The tutorial below is
//! this crate's README; every code block in it is compiled and run as a doc-test.
//!
//! Everything here is re-exported from the harness crate (`agen-harness`), the same agent loop a
//! fleet instance and `agen run` use; this crate adds no behaviour of its own. It depends on
//! neither the Hub, the Nest nor tonic.
#![doc = include_str!("../README.md")]

pub use agen_contract::run::{ArtifactSaved, TurnDelta, Usage};
pub use agen_harness::agent::{
    schema_of, Agent, AgentBuilder, AgentError, Conversation, Outcome, RunItem, RunItems,
    RunOptions, RunStream, Tool, ToolBuilder, EMBEDDED_NAMESPACE,
};
pub use agen_harness::artifacts::{ArtifactStore, LocalArtifacts, MemoryArtifacts};
pub use agen_harness::run::{
    ApprovalDecision, ApprovalRequest, ApproveAll, Approver, CallMeta, HostTool, HostToolSpec,
    Message, ResponseType, RunEventBody, RunState, ToolContext, ToolError, ToolPolicy,
};
/// The run events' field types (`ToolStarted`, `ModelAnswered`, …).
pub mod events {
    pub use agen_contract::run::{
        Activity, ArtifactSaved, ModelAnswered, ModelRequested, RunFinished, ToolCompleted,
        ToolFailed, ToolFailure, ToolStarted,
    };
}
pub use async_trait::async_trait;
pub use schemars;
pub use tokio_util::sync::CancellationToken;
