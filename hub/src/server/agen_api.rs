//! The state every `AgenService` handler shares ([`AgenApi`]) and the namespace check they
//! make, below the handler files (`agen.rs`, `ops.rs`, `task_lists.rs`, …) so none of them
//! imports another to reach it.

use std::sync::Arc;

use crate::core::Core;
use crate::error::HubError;
use crate::limits;

/// The `AgenService` handlers' state.
pub struct AgenApi {
    pub core: Arc<Core>,
    /// Tokens, audit log and Nest identities (their RPCs, and the token registry).
    pub access: Arc<super::tokens::AccessApi>,
    /// Log requests waiting for their Nests' `SendLogs`.
    pub logs: Arc<crate::logs::LogRequests>,
    /// The URL A2A clients reach the Hub at (the agent card URLs start with it).
    pub public_url: String,
}

/// A namespace in a request: empty (the default) or a valid name.
pub(super) fn check_namespace(ns: &str) -> Result<(), HubError> {
    if ns.is_empty() {
        return Ok(());
    }
    limits::validate_name("namespace", ns)
}
