//! The resources each MCP server lists when it starts (`resources/list`, kept for the
//! instance's status).
//!
//! Invariants: a server that does not declare the `resources` capability is never asked for
//! its resources; a failed listing is logged and counts as none (it never stops the start).

use std::time::Duration;

use rmcp::service::{Peer, RoleClient};

use super::error_chain;

/// How long a server's `resources/list` at start may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// The most resources one server's listing keeps.
const MAX_LISTED: usize = 1000;

/// One resource of a server, as the instance reports it and `list_resources` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResourceInfo {
    /// The server's name in `mcp.json`.
    pub server: String,
    pub uri: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mime_type: String,
}

/// The resources `peer` lists, when it declares the capability (at most [`MAX_LISTED`]).
pub(super) async fn list_at_start(server: &str, peer: &Peer<RoleClient>) -> Vec<ResourceInfo> {
    let declared = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.resources.is_some());
    if !declared {
        return Vec::new();
    }
    match tokio::time::timeout(LIST_TIMEOUT, peer.list_all_resources())
        .await
        .unwrap_or(Err(rmcp::service::ServiceError::Timeout {
            timeout: LIST_TIMEOUT,
        })) {
        Ok(list) => list
            .into_iter()
            .take(MAX_LISTED)
            .map(|r| ResourceInfo {
                server: server.to_string(),
                uri: r.uri.clone(),
                name: r.name.clone(),
                description: r.description.clone().unwrap_or_default(),
                mime_type: r.mime_type.clone().unwrap_or_default(),
            })
            .collect(),
        Err(e) => {
            tracing::warn!(server, "resources/list failed: {}", error_chain(&e));
            Vec::new()
        }
    }
}
