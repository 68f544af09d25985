//! Approvals of `ask` calls at the Hub: what each task's runs asked (`approval.requested`),
//! what people decided (`DecideApproval`), and `--always` (later calls of the same tool in the
//! task are approved without asking). One record per task in [`Table::Approvals`].
//!
//! Invariants: a decision is in the store before it leaves for the Nest (sent with
//! `send_durable`), so a decided call stays decided across a Hub restart; a call is decided at
//! most once (deciding one that is not pending is `FAILED_PRECONDITION` and changes nothing);
//! a request for a call the Hub already decided is answered at once and does not make the task
//! wait. A call is its id (issued by the run's harness from the call's place in the
//! conversation, never the model's id) and its digest (the tool and the whole arguments,
//! `agen_contract::run::call_digest`): a request with a known id but another digest is a new call
//! and is asked again; every decision sent to a Nest carries the digest it decides.

use agen_contract::run::{ApprovalDecided, ApprovalRequested};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::model::{now_ms, TaskRec, TaskState};
use crate::nodes::ToNest;
use crate::store::Table;

/// The approvals of one task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskApprovals {
    #[serde(default)]
    pub calls: Vec<ApprovalRec>,
    /// Tools approved with `--always` for the rest of the task.
    #[serde(default)]
    pub always: Vec<String>,
}

/// One asked call and, once decided, its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRec {
    pub call_id: String,
    pub tool: String,
    #[serde(default)]
    pub arguments: Value,
    pub asked_at_ms: i64,
    #[serde(default)]
    pub decision: Option<DecisionRec>,
    /// The call's digest (tool + whole arguments); empty for a record written before digests.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// The run and attempt that asked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run_id: String,
    #[serde(default)]
    pub attempt: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRec {
    pub approved: bool,
    #[serde(default)]
    pub reason: String,
    pub by: String,
    pub at_ms: i64,
    /// The arguments a person approved the call with in place of the asked ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

/// A pending approval, as `ListApprovals` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingApproval {
    pub task_id: String,
    pub deployment: String,
    pub call: ApprovalRec,
}

/// What `DecideApproval` asks.
#[derive(Debug, Clone)]
pub struct Decide<'a> {
    pub namespace: &'a str,
    pub task_id: &'a str,
    /// Empty: the task's only pending call.
    pub call_id: &'a str,
    pub approved: bool,
    pub reason: &'a str,
    pub always: bool,
    /// The deciding token's name.
    pub by: &'a str,
    /// Approve with these arguments (a JSON object) in place of the asked ones.
    pub arguments: Option<Value>,
}

impl Core {
    fn approvals_of(&self, task_id: &str) -> Result<TaskApprovals> {
        Ok(self
            .db
            .get_json(Table::Approvals, task_id)?
            .unwrap_or_default())
    }

    /// The task's calls that wait for a decision.
    pub fn pending_approvals(&self, task_id: &str) -> Result<Vec<ApprovalRec>> {
        let mut calls = self.approvals_of(task_id)?.calls;
        calls.retain(|c| c.decision.is_none());
        Ok(calls)
    }

    /// The decision the Hub holds for a call, if any.
    pub(in crate::core) fn decision_of(
        &self,
        task_id: &str,
        call_id: &str,
    ) -> Result<Option<DecisionRec>> {
        Ok(self
            .approvals_of(task_id)?
            .calls
            .into_iter()
            .rev()
            .find(|c| c.call_id == call_id)
            .and_then(|c| c.decision))
    }

    /// Sends a decision to the Nest of the task's current run (held until the store has it).
    /// A suspended run has none: it gets the decision when it resumes and asks again.
    fn send_decision(&self, st: &mut State, task: &TaskRec, call: &ApprovalRec, d: &DecisionRec) {
        if task.suspended.is_some() {
            return;
        }
        let nest_id = st
            .instances
            .get(&task.instance_id)
            .map(|i| i.nest_id.clone())
            .unwrap_or_else(|| task.lease.nest_id.clone());
        if nest_id.is_empty() || task.run_id.is_empty() {
            return;
        }
        st.live.send_durable(
            &nest_id,
            ToNest::ApprovalDecided {
                run_id: task.run_id.clone(),
                instance_id: task.instance_id.clone(),
                call_id: call.call_id.clone(),
                approved: d.approved,
                reason: d.reason.clone(),
                by: d.by.clone(),
                digest: call.digest.clone(),
                arguments: d.arguments.clone(),
            },
        );
    }

    /// A run asked about a call: answered at once when the Hub holds a decision (or the tool
    /// is approved `--always`); otherwise the task waits for a person.
    pub(crate) fn approval_requested(
        &self,
        st: &mut State,
        task: &mut TaskRec,
        asked: &ApprovalRequested,
    ) -> Result<()> {
        let mut rec = self.approvals_of(&task.task_id)?;
        // The same call: its id and its digest (a record from before digests matches by id).
        let known = rec.calls.iter().rposition(|c| {
            c.call_id == asked.call_id && (c.digest.is_empty() || c.digest == asked.digest)
        });
        if rec.calls.iter().any(|c| c.call_id == asked.call_id) && known.is_none() {
            tracing::warn!(task = %task.task_id, call = %asked.call_id, tool = %asked.tool, "a run asked about a call id the task already has with other arguments: asked again as a new call");
        }
        let decided = known.and_then(|i| rec.calls[i].decision.clone());
        if let (Some(d), Some(i)) = (decided, known) {
            let call = rec.calls[i].clone();
            self.send_decision(st, task, &call, &d);
            return Ok(());
        }
        let always = rec.always.contains(&asked.tool);
        let decision = always.then(|| DecisionRec {
            approved: true,
            reason: format!(
                "{} is approved for the rest of this task (--always)",
                asked.tool
            ),
            by: "always".into(),
            at_ms: now_ms(),
            arguments: None,
        });
        let i = match known {
            Some(i) => {
                rec.calls[i].decision = decision.clone();
                i
            }
            None => {
                rec.calls.push(ApprovalRec {
                    call_id: asked.call_id.clone(),
                    tool: asked.tool.clone(),
                    arguments: asked.arguments.clone(),
                    asked_at_ms: now_ms(),
                    decision: decision.clone(),
                    digest: asked.digest.clone(),
                    run_id: task.run_id.clone(),
                    attempt: task.attempt,
                });
                rec.calls.len() - 1
            }
        };
        let call = rec.calls[i].clone();
        self.db.put_json(Table::Approvals, &task.task_id, &rec)?;
        match decision {
            Some(d) => self.send_decision(st, task, &call, &d),
            None => {
                task.state = TaskState::Waiting;
                task.activity = format!("waiting for approval of {}", asked.tool);
            }
        }
        Ok(())
    }

    /// The run recorded a decision: the task runs again. A decision the Hub did not make
    /// (`approvalTimeout`) is recorded too, so the call is no longer pending.
    pub(crate) fn approval_decided(
        &self,
        task: &mut TaskRec,
        decided: &ApprovalDecided,
    ) -> Result<()> {
        let mut rec = self.approvals_of(&task.task_id)?;
        if let Some(c) = rec.calls.iter_mut().find(|c| {
            c.call_id == decided.call_id
                && c.decision.is_none()
                && (c.digest.is_empty() || decided.digest.is_empty() || c.digest == decided.digest)
        }) {
            c.decision = Some(DecisionRec {
                approved: decided.approved,
                reason: decided.reason.clone(),
                by: decided.by.clone(),
                at_ms: now_ms(),
                arguments: decided.arguments.clone(),
            });
            self.db.put_json(Table::Approvals, &task.task_id, &rec)?;
        }
        if task.state == TaskState::Waiting {
            task.state = TaskState::Running;
        }
        task.activity = if decided.approved {
            "approved: running the call".into()
        } else {
            "denied: telling the model".into()
        };
        Ok(())
    }

    /// Pending approvals of a namespace's live tasks (oldest first), optionally of one
    /// deployment.
    pub fn list_approvals(
        &self,
        namespace: &str,
        deployment: &str,
    ) -> Result<Vec<PendingApproval>> {
        let namespace = crate::core::namespace_or_default(namespace);
        let tasks: Vec<(String, String)> = {
            let st = self.lock();
            st.tasks
                .live()
                .filter(|t| t.namespace == namespace)
                .filter(|t| deployment.is_empty() || t.deployment == deployment)
                .map(|t| (t.task_id.clone(), t.deployment.clone()))
                .collect()
        };
        let mut out = Vec::new();
        for (task_id, deployment) in tasks {
            for call in self.approvals_of(&task_id)?.calls {
                if call.decision.is_none() {
                    out.push(PendingApproval {
                        task_id: task_id.clone(),
                        deployment: deployment.clone(),
                        call,
                    });
                }
            }
        }
        out.sort_by(|a, b| (a.call.asked_at_ms, &a.task_id).cmp(&(b.call.asked_at_ms, &b.task_id)));
        Ok(out)
    }

    /// Decides a pending call: stored first, then sent to the run's Nest.
    pub async fn decide_approval(&self, d: Decide<'_>) -> Result<ApprovalRec> {
        let task = self.get_task(d.namespace, d.task_id)?;
        let out = {
            let mut st = self.lock();
            let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
            let mut rec = self.approvals_of(&task.task_id)?;
            // A decided call says so whatever its task did since (it may have finished at once).
            let i = match pick(&task.task_id, &rec, d.call_id) {
                Ok(_) if task.state.is_terminal() => {
                    return Err(HubError::FailedPrecondition(format!(
                        "task {} is {}: it has no pending approval",
                        task.task_id,
                        task.state.as_str()
                    )))
                }
                picked => picked?,
            };
            if d.arguments.is_some() && !d.approved {
                return Err(HubError::InvalidArgument(
                    "arguments_json: edited arguments go with an approval, not a denial".into(),
                ));
            }
            let decision = DecisionRec {
                approved: d.approved,
                reason: d.reason.to_string(),
                by: d.by.to_string(),
                at_ms: now_ms(),
                arguments: d.arguments.clone(),
            };
            rec.calls[i].decision = Some(decision.clone());
            let call = rec.calls[i].clone();
            if d.always && d.approved && !rec.always.contains(&call.tool) {
                rec.always.push(call.tool.clone());
            }
            self.db.put_json(Table::Approvals, &task.task_id, &rec)?;
            // A suspended run is resumed (it asks again and is answered at once); a run
            // waiting in place gets the decision now.
            if !self.wake_decided(&mut st, &task.task_id, &call.call_id)? {
                self.send_decision(&mut st, &task, &call, &decision);
            }
            call
        };
        self.commit().await?;
        Ok(out)
    }
}

/// The pending call `call_id` names (or the only one, when it is empty).
fn pick(task_id: &str, rec: &TaskApprovals, call_id: &str) -> Result<usize> {
    let pending: Vec<usize> = (0..rec.calls.len())
        .filter(|&i| rec.calls[i].decision.is_none())
        .collect();
    if call_id.is_empty() {
        return match pending.as_slice() {
            [one] => Ok(*one),
            [] => Err(HubError::FailedPrecondition(format!(
                "task {task_id} has no pending approval"
            ))),
            many => Err(HubError::FailedPrecondition(format!(
                "task {task_id} has {} pending approvals; name one of the call ids: {}",
                many.len(),
                many.iter()
                    .map(|&i| rec.calls[i].call_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        };
    }
    // A pending record first: an id asked again with other arguments has a decided one too.
    let named = |i: &usize| rec.calls[*i].call_id == call_id;
    let found = pending
        .iter()
        .copied()
        .find(named)
        .or_else(|| (0..rec.calls.len()).find(named));
    match found {
        Some(i) if rec.calls[i].decision.is_none() => Ok(i),
        Some(_) => Err(HubError::FailedPrecondition(format!(
            "call {call_id} of task {task_id} is already decided; a decision cannot be changed"
        ))),
        None => Err(HubError::FailedPrecondition(format!(
            "task {task_id} has no pending approval for call {call_id}; see `agen approvals`"
        ))),
    }
}
