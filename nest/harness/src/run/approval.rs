//! Approvals of `ask` calls: before a call to a tool the permissions put in `ask` is sent, the
//! run's [`Approver`] decides. `agen run` asks on its terminal ([`crate::standalone`]); a
//! harness with no approver denies every such call and says why.
//!
//! Before the approver is asked, `approval.requested` is made durable; its answer is recorded
//! as `approval.decided`. A resumed run whose log holds a decision for the call uses it; one
//! whose log holds only the request asks again (the Hub answers at once when it already holds
//! the decision). `limits.approvalTimeout` denies an undecided call.
//!
//! A fleet run does not hold its instance slot while a person decides: after a short wait in
//! place ([`Approver::suspend_after`]) it ends this attempt with `run.suspended`, and the Hub
//! resumes it from its log once the call is decided (or denies it at the approval deadline).
//!
//! Invariant: an `ask` call is sent only after an approver said yes; a denied one is recorded
//! as `tool.failed` (`denied`) with the reason and never reaches its server. A call a person
//! approved with edited arguments (`approval.decided` `arguments`) is sent with those alone,
//! and its result tells the model so ([`edited_note`]).

use agen_contract::run::{
    ApprovalDecided, ApprovalRequested, RunEventBody, RunSuspended, ToolFailure, WaitingFor,
};
use agen_shared::bundle::StoreToolArguments;
use agen_shared::duration::format_duration;
use serde_json::{Map, Value};
use std::time::Duration;

use super::state::Run;
use crate::model::ToolCall;
use crate::redact::Redactor;

/// `by` of a decision made by `limits.approvalTimeout`.
pub const BY_TIMEOUT: &str = "approvalTimeout";

/// The most bytes of arguments an `approval.requested` carries.
const MAX_ARGUMENTS: usize = 64 * 1024;

/// One call waiting for a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The run the call belongs to.
    pub run_id: String,
    pub call_id: String,
    /// `<server>.<tool>`, or the Keen / built-in name.
    pub tool: String,
    /// The call's arguments, secrets redacted.
    pub arguments: Value,
    /// [`agen_contract::run::call_digest`] of the tool and the whole arguments: a decision for
    /// another digest does not decide this call.
    pub digest: String,
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

    /// The decision as it is recorded (`approval.decided`). An approver that knows who decided
    /// (the fleet's) says so in `by`; the default leaves `by` empty and the model is told the
    /// reason as it is.
    async fn decide_recorded(&self, request: &ApprovalRequest) -> ApprovalDecided {
        let (approved, reason) = match self.decide(request).await {
            ApprovalDecision::Approved => (true, String::new()),
            ApprovalDecision::Denied(reason) => (false, reason),
        };
        ApprovalDecided {
            call_id: request.call_id.clone(),
            approved,
            reason,
            by: String::new(),
            digest: request.digest.clone(),
            arguments: None,
        }
    }

    /// How long a call waits in place before its run gives the instance slot back and is
    /// resumed once decided (`None`: it waits in place until decided or `approvalTimeout`).
    /// The fleet's approver suspends: a person may take hours.
    fn suspend_after(&self) -> Option<std::time::Duration> {
        None
    }
}

/// What the model is told of a denial: a person's reason is marked as one.
pub fn denial_text(d: &ApprovalDecided) -> String {
    if d.by.is_empty() || d.by == BY_TIMEOUT {
        d.reason.clone()
    } else if d.reason.is_empty() {
        "denied by a person (no reason given)".to_string()
    } else {
        format!("denied by a person: {}", d.reason)
    }
}

/// What the model is told first in the result of a call a person approved with edited
/// arguments.
pub(super) fn edited_note(arguments: &Value) -> String {
    format!("note: a person approved this call with edited arguments; it ran with {arguments} in place of the arguments you gave.")
}

/// A call's arguments as an approval shows them: a JSON object, secrets redacted, cut at
/// 64 KiB (a cut or non-object value is shown as `{"text": …}`).
fn approval_arguments(arguments: &Value, redactor: &Redactor) -> Value {
    let redacted = redactor.redact_json(arguments);
    let text = redacted.to_string();
    if text.len() <= MAX_ARGUMENTS {
        if redacted.is_object() {
            return redacted;
        }
        let mut m = Map::new();
        m.insert("text".into(), redacted);
        return Value::Object(m);
    }
    let mut cut = MAX_ARGUMENTS;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut m = Map::new();
    m.insert(
        "text".into(),
        Value::String(format!("{}… (cut at 64 KiB)", &text[..cut])),
    );
    Value::Object(m)
}

/// Denies every call with one reason (no one is there to approve).
pub struct NoApprover(pub String);

impl NoApprover {
    /// The default of a harness that was given no approver (fleet instances give theirs one
    /// that waits for the Hub).
    pub fn fleet() -> NoApprover {
        NoApprover("no one to approve: this harness was given no approver; move the tool from `ask` to `allow` in x-agen/config.json `permissions` if it may run unattended".into())
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
    /// The decision an earlier attempt recorded for this call (its id and its digest), if any.
    /// A decision of a log written before digests existed (empty) counts for its call id.
    fn recorded_decision(&self, call_id: &str, digest: &str) -> Option<ApprovalDecided> {
        self.req.replay.iter().rev().find_map(|ev| match ev {
            RunEventBody::ApprovalDecided(d)
                if d.call_id == call_id && (d.digest.is_empty() || d.digest == digest) =>
            {
                Some(d.clone())
            }
            _ => None,
        })
    }

    /// Asks the approver about an `ask` call: `Ok(None)` to send it as asked, `Ok(Some(args))`
    /// to send it with the arguments a person edited, `Err(refusal)` (recorded as
    /// `tool.failed` `denied`) when it may not be sent.
    pub(super) async fn approve(&self, call: &ToolCall) -> Result<Option<Value>, String> {
        let tool = self
            .h
            .gated_name(&call.name)
            .unwrap_or_else(|| call.name.clone());
        let digest = agen_contract::run::call_digest(&tool, &call.arguments);
        let decided = match self.recorded_decision(&call.id, &digest) {
            Some(d) => d,
            None => self.ask_approver(call, &tool, digest).await?,
        };
        if decided.approved {
            return Ok(decided.arguments);
        }
        let content = format!(
            "tool {} was not run: it needs approval and was denied: {}",
            call.name,
            denial_text(&decided)
        );
        let _ = self
            .emit(
                self.failed(call, &tool, &content, ToolFailure::Denied, 0),
                false,
            )
            .await;
        Err(content)
    }

    /// Records the request durably, waits for the approver (at most `approvalTimeout`) and
    /// records its decision. `Err` when the call may not go out and nothing is decided (the
    /// request could not be recorded, or the run was cancelled while waiting).
    async fn ask_approver(
        &self,
        call: &ToolCall,
        tool: &str,
        digest: String,
    ) -> Result<ApprovalDecided, String> {
        let request = ApprovalRequest {
            run_id: self.req.run_id.to_string(),
            call_id: call.id.clone(),
            tool: tool.to_string(),
            arguments: {
                let h = &self.h.bundle.harness;
                let shown = match h.store_tool_arguments {
                    StoreToolArguments::Full => call.arguments.clone(),
                    StoreToolArguments::Redacted => {
                        crate::redact::without_fields(&call.arguments, &h.sensitive_fields)
                    }
                };
                approval_arguments(&shown, &self.h.redactor)
            },
            digest,
        };
        let asked = RunEventBody::ApprovalRequested(ApprovalRequested {
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            arguments: request.arguments.clone(),
            digest: request.digest.clone(),
        });
        if let Err(e) = self.emit(asked, true).await {
            return Err(format!(
                "tool {} was not run: its approval request could not be recorded: {e}",
                call.name
            ));
        }
        self.activity(format!("waiting for approval of {tool}"))
            .await;
        let limit = self.h.bundle.harness.limits.approval_timeout;
        let timed_out = format!(
            "no one decided within limits.approvalTimeout ({}); the call was denied",
            format_duration(limit)
        );
        // A resumed wait keeps the deadline the first one was given.
        let timeout = match super::replay::wait_deadline(&self.req.replay, &call.id) {
            Some(deadline) => {
                Duration::from_millis((deadline - crate::artifacts::now_ms()).max(0) as u64)
            }
            None => limit,
        };
        let suspend_after = self.h.approver.suspend_after();
        let decided = tokio::select! {
            d = self.h.approver.decide_recorded(&request) => d,
            _ = tokio::time::sleep(timeout) => ApprovalDecided {
                call_id: request.call_id.clone(),
                approved: false,
                reason: timed_out,
                by: BY_TIMEOUT.into(),
                digest: request.digest.clone(),
                arguments: None,
            },
            _ = tokio::time::sleep(suspend_after.unwrap_or(timeout)), if suspend_after.is_some_and(|s| s < timeout) => {
                // Not decided yet: give the slot back; the Hub resumes the run once it is
                // (and denies it with `timed_out` at the deadline).
                let waited = suspend_after.unwrap_or_default();
                self.suspend(RunSuspended {
                    waiting_for: WaitingFor::Approval {
                        call_id: request.call_id.clone(),
                        tool: request.tool.clone(),
                    },
                    deadline_ms: crate::artifacts::now_ms() + (timeout.saturating_sub(waited)).as_millis() as i64,
                    on_deadline: timed_out,
                });
                return Err(format!(
                    "tool {} was not run yet: the run gave its slot back while it waits for approval",
                    call.name
                ));
            }
            _ = self.cancel.cancelled() => {
                return Err(format!(
                    "tool {} was not run: the run was cancelled while it waited for approval",
                    call.name
                ));
            }
        };
        let _ = self
            .emit(RunEventBody::ApprovalDecided(decided.clone()), true)
            .await;
        Ok(decided)
    }
}
