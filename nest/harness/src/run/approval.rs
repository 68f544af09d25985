//! Approvals of `ask` calls: before a call to a tool the permissions put in `ask` is sent, the
//! run's [`Approver`] decides. `agen run` asks on its terminal ([`crate::standalone`]); a
//! harness with no approver denies every such call and says why.
//!
//! Invariant: an `ask` call is sent only after an approver said yes; a denied one is recorded
//! as `tool.failed` (`denied`) with the reason and never reaches its server.

use agen_shared::run::ToolFailure;
use serde_json::Value;

use super::state::Run;
use crate::model::ToolCall;
use crate::redact::traced_arguments;

/// One call waiting for a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    pub call_id: String,
    /// `<server>.<tool>`, or the Keen / built-in name.
    pub tool: String,
    /// The call's arguments, secrets redacted.
    pub arguments: Value,
}

/// What the approver decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    Approved,
    /// Denied, with the reason the model is told.
    Denied(String),
}

/// Who decides `ask` calls: a trait so the loop knows neither terminals nor the Hub.
#[async_trait::async_trait]
pub trait Approver: Send + Sync {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalDecision;
}

/// Denies every call with one reason (no one is there to approve).
pub struct NoApprover(pub String);

impl NoApprover {
    /// The default of a harness that was given no approver (fleet runs in this version).
    pub fn fleet() -> NoApprover {
        NoApprover("no one to approve: fleet approvals are not available yet; move the tool from `ask` to `allow` in x-agen/config.json `permissions` if it may run unattended".into())
    }
}

#[async_trait::async_trait]
impl Approver for NoApprover {
    async fn decide(&self, _request: &ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Denied(self.0.clone())
    }
}

/// Approves every call (`agen run --approve-all`).
pub struct ApproveAll;

#[async_trait::async_trait]
impl Approver for ApproveAll {
    async fn decide(&self, _request: &ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Approved
    }
}

impl Run<'_> {
    /// Asks the approver about an `ask` call; `Some(refusal)` (recorded as `tool.failed`
    /// `denied`) when it may not be sent.
    pub(super) async fn approve(&self, call: &ToolCall) -> Option<String> {
        let tool = self
            .h
            .gated_name(&call.name)
            .unwrap_or_else(|| call.name.clone());
        let request = ApprovalRequest {
            call_id: call.id.clone(),
            tool: tool.clone(),
            arguments: traced_arguments(&call.arguments, &self.h.redactor),
        };
        self.activity(format!("waiting for approval of {tool}"))
            .await;
        match self.h.approver.decide(&request).await {
            ApprovalDecision::Approved => None,
            ApprovalDecision::Denied(reason) => {
                let content = format!(
                    "tool {} was not run: it needs approval and was denied: {reason}",
                    call.name
                );
                let _ = self
                    .emit(
                        self.failed(call, &tool, &content, ToolFailure::Denied, 0),
                        false,
                    )
                    .await;
                Some(content)
            }
        }
    }
}
