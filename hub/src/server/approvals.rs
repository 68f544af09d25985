//! `ListApprovals` and `DecideApproval` on AgenService: protobuf in and out, authorization
//! (Read to list, Submit to decide), and `by` as the token's name.

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{audit_message, authorize, Action};
use crate::core::approvals::{ApprovalRec, Decide};
use crate::core::Core;
use crate::limits;

fn check_namespace(ns: &str) -> Result<(), Status> {
    if ns.is_empty() {
        return Ok(());
    }
    limits::validate_name("namespace", ns).map_err(Status::from)
}

/// Fills in a task's pending approvals when it is waiting (read only then).
pub fn with_pending(core: &Core, mut t: pb::Task) -> pb::Task {
    if t.state == pb::TaskState::Waiting as i32 {
        match core.pending_approvals(&t.task_id) {
            Ok(calls) => {
                t.pending_approvals = calls
                    .iter()
                    .map(|c| approval(&t.task_id, &t.deployment, c))
                    .collect()
            }
            Err(e) => tracing::warn!(task = %t.task_id, "pending approvals unreadable: {e}"),
        }
    }
    t
}

/// [`with_pending`] for the task of a `WatchTask` event.
pub fn event_with_pending(core: &Core, mut e: pb::TaskEvent) -> pb::TaskEvent {
    e.task = e.task.map(|t| with_pending(core, t));
    e
}

fn approval(task_id: &str, deployment: &str, c: &ApprovalRec) -> pb::Approval {
    pb::Approval {
        task_id: task_id.to_string(),
        deployment: deployment.to_string(),
        call_id: c.call_id.clone(),
        tool: c.tool.clone(),
        arguments_json: c.arguments.to_string(),
        asked_at_ms: c.asked_at_ms,
    }
}

pub async fn list(
    core: &Core,
    request: Request<pb::ListApprovalsRequest>,
) -> Result<Response<pb::ListApprovalsResponse>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    if !r.deployment.is_empty() {
        limits::validate_name("deployment", &r.deployment)?;
    }
    let approvals = core
        .list_approvals(&r.namespace, &r.deployment)?
        .iter()
        .map(|p| approval(&p.task_id, &p.deployment, &p.call))
        .collect();
    Ok(Response::new(pb::ListApprovalsResponse { approvals }))
}

pub async fn decide(
    core: &Core,
    request: Request<pb::DecideApprovalRequest>,
) -> Result<Response<pb::DecideApprovalResponse>, Status> {
    // The audit record says the decision and what it was about, refused decisions included.
    let audit = super::auth::audit_detail(&request);
    let detail = {
        let r = request.get_ref();
        let decision = match (r.approved, r.always) {
            (true, true) => "approve always",
            (true, false) => "approve",
            (false, _) => "deny",
        };
        let (task_id, reason) = (r.task_id.clone(), r.reason.clone());
        move |call_id: &str, tool: &str| crate::tokens::audit::AuditDetail {
            decision: decision.into(),
            task_id: task_id.clone(),
            call_id: call_id.into(),
            tool: tool.into(),
            reason: reason.clone(),
            ..Default::default()
        }
    };
    audit.set(detail(&request.get_ref().call_id, ""));
    let who = {
        let r = request.get_ref();
        let who = authorize(&request, &r.namespace, Action::Submit, &r.task_id)?;
        if !r.arguments_json.is_empty() {
            // The audit record of the decision says the call was edited, and how.
            let call = if r.call_id.is_empty() {
                "the pending call"
            } else {
                &r.call_id
            };
            let arguments: String = r.arguments_json.chars().take(400).collect();
            audit_message(
                &request,
                format!("{call} approved with edited arguments {arguments}"),
            );
        }
        who
    };
    // The token's name alone (issue 13): not the CLI's `agen-client` user@host, not the id.
    let by = who.token_name().to_string();
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    limits::check_id("task_id", &r.task_id)?;
    limits::check_bytes("call_id", &r.call_id, limits::MAX_REASON_BYTES)?;
    limits::check_bytes("reason", &r.reason, limits::MAX_REASON_BYTES)?;
    let arguments = edited_arguments(&r.arguments_json)?;
    if arguments.is_some() && !r.approved {
        return Err(Status::invalid_argument(
            "arguments_json: edited arguments go with an approval, not a denial",
        ));
    }
    let task = core.get_task(&r.namespace, &r.task_id)?;
    if let Ok(calls) = core.pending_approvals(&task.task_id) {
        // No call id: the task's only pending call (what the decision will name).
        let named = match r.call_id.as_str() {
            "" if calls.len() == 1 => calls.first(),
            id => calls.iter().find(|c| c.call_id == id),
        };
        if let Some(c) = named {
            audit.set(detail(&c.call_id, &c.tool));
        }
    }
    let call = core
        .decide_approval(Decide {
            namespace: &r.namespace,
            task_id: &r.task_id,
            call_id: &r.call_id,
            approved: r.approved,
            reason: &r.reason,
            always: r.always,
            by: &by,
            arguments,
        })
        .await?;
    audit.set(detail(&call.call_id, &call.tool));
    let (approved, reason, by) = call
        .decision
        .as_ref()
        .map(|d| (d.approved, d.reason.clone(), d.by.clone()))
        .unwrap_or((r.approved, r.reason.clone(), by));
    let arguments_json = call
        .decision
        .as_ref()
        .and_then(|d| d.arguments.as_ref())
        .map(|a| a.to_string())
        .unwrap_or_default();
    Ok(Response::new(pb::DecideApprovalResponse {
        approval: Some(approval(&task.task_id, &task.deployment, &call)),
        approved,
        reason,
        by,
        arguments_json,
    }))
}

/// `arguments_json` of a decision: empty, or a JSON object of at most 64 KiB.
fn edited_arguments(text: &str) -> Result<Option<serde_json::Value>, Status> {
    if text.is_empty() {
        return Ok(None);
    }
    limits::check_bytes("arguments_json", text, limits::MAX_APPROVAL_ARGUMENTS_BYTES)?;
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) if v.is_object() => Ok(Some(v)),
        Ok(_) => Err(Status::invalid_argument(
            "arguments_json: expected a JSON object of the tool's arguments, such as {\"command\": \"ls\"}",
        )),
        Err(e) => Err(Status::invalid_argument(format!(
            "arguments_json: not valid JSON ({e}); expected a JSON object of the tool's arguments"
        ))),
    }
}
