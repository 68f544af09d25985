//! Double texting: a submit to a conversation that already has a task queued, running or
//! waiting. The mode is the submit's own (`SubmitTaskRequest.double_texting`), else the
//! bundle's `doubleTexting` in `x-agen/config.json`, else `enqueue`:
//! - `reject`: the submit fails (FAILED_PRECONDITION naming the task in the way);
//! - `enqueue`: the new task runs after the others, in order (dispatch runs one task of a
//!   conversation at a time);
//! - `interrupt`: each running task is asked to stop at its next safe point (`CancelRun` with
//!   `interrupt`: the harness stops before its next model turn or during a model request,
//!   never inside a tool call) and ends `cancelled` with reason `interrupted`; its messages join
//!   the conversation, so the new input continues it;
//! - `rollback`: each task in flight is cancelled (`rolled_back`): its run's messages do not
//!   join the conversation, only a note (an assistant message) naming every side-effecting
//!   call it completed, so the model does not unknowingly repeat one.

use agen_contract::run::{kind, Message, RunEventBody};
use agen_shared::bundle::DoubleTexting;

use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::model::{deployment_key, now_ms, TaskRec, TaskState};
use crate::nodes::ToNest;

use super::TaskSpec;

/// The cancel reason of an interrupted task.
pub const INTERRUPTED: &str = "interrupted";

impl Core {
    /// The submit's mode: its own, else its deployment's bundle's, else enqueue.
    pub(crate) fn double_texting_mode(&self, namespace: &str, spec: &TaskSpec) -> DoubleTexting {
        if let Some(m) = spec.double_texting {
            return m;
        }
        let digest = self
            .lock()
            .deployments
            .get(&deployment_key(namespace, &spec.deployment))
            .map(|d| d.bundle_digest.clone());
        let Some(digest) = digest else {
            return DoubleTexting::default();
        };
        let cached = || {
            self.bundle_double_texting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&digest)
                .copied()
        };
        if let Some(m) = cached() {
            return m;
        }
        if let Err(e) = self.load_stored_bundle(&digest) {
            tracing::warn!(%digest, error = %e, "cannot read the bundle's doubleTexting");
        }
        cached().unwrap_or_default()
    }

    /// Applies `mode` to the tasks in flight of conversation `conversation_id` (before the new
    /// task is stored, under the state lock).
    pub(crate) fn double_text(
        &self,
        st: &mut State,
        conversation_id: &str,
        key: &str,
        mode: DoubleTexting,
    ) -> Result<()> {
        let in_flight: Vec<TaskRec> = st
            .tasks
            .live()
            .filter(|t| t.conversation_id == conversation_id && !t.state.is_terminal())
            .cloned()
            .collect();
        match mode {
            DoubleTexting::Enqueue => Ok(()),
            DoubleTexting::Reject => match in_flight.first() {
                None => Ok(()),
                Some(t) => Err(HubError::FailedPrecondition(format!(
                    "conversation {key:?} has task {} {} (double texting: reject); wait for it (agen wait {}) or submit with double_texting enqueue, interrupt or rollback",
                    t.task_id,
                    t.state.as_str(),
                    t.task_id
                ))),
            },
            DoubleTexting::Interrupt => {
                for mut t in in_flight {
                    if t.state != TaskState::Running
                        || t.suspended.is_some()
                        || t.cancel_requested_at_ms > 0
                    {
                        continue;
                    }
                    t.cancel_requested_at_ms = now_ms();
                    t.cancel_reason = INTERRUPTED.to_string();
                    t.activity = "interrupted: stopping at the next safe point".into();
                    let nest_id = st
                        .instances
                        .get(&t.instance_id)
                        .map(|i| i.nest_id.clone())
                        .unwrap_or_default();
                    st.live.send(
                        &nest_id,
                        ToNest::CancelRun {
                            run_id: t.run_id.clone(),
                            instance_id: t.instance_id.clone(),
                            reason: INTERRUPTED.to_string(),
                            interrupt: true,
                        },
                    );
                    self.save_task(st, t)?;
                }
                Ok(())
            }
            DoubleTexting::Rollback => {
                for mut t in in_flight {
                    t.rolled_back = true;
                    let id = t.task_id.clone();
                    self.save_task(st, t)?;
                    self.cancel_tree(st, &id, "rolled back by a newer message")?;
                }
                Ok(())
            }
        }
    }

    /// The note a rolled-back run leaves in its conversation: each side-effecting call it
    /// completed (name, arguments, result), from its run events and its messages; `None` when
    /// it completed none.
    pub(crate) fn rollback_note(&self, task: &TaskRec, messages: &[Message]) -> Option<Message> {
        let events = self.db.run_events(&task.run_id).ok()?;
        let mut side_effects = std::collections::HashSet::new();
        let mut completed = std::collections::HashSet::new();
        for e in &events {
            let Ok(body) = serde_json::from_str(&e.json)
                .map_err(|_| ())
                .and_then(|v| RunEventBody::from_parts(&e.kind, v).map_err(|_| ()))
            else {
                continue;
            };
            match body {
                RunEventBody::ToolStarted(s) if s.side_effect => {
                    side_effects.insert(s.call_id);
                }
                RunEventBody::ToolCompleted(c) if e.kind == kind::TOOL_COMPLETED && !c.is_error => {
                    completed.insert(c.call_id);
                }
                _ => {}
            }
        }
        let mut lines = Vec::new();
        for m in messages {
            let Message::Assistant { tool_calls, .. } = m else {
                continue;
            };
            for call in tool_calls {
                if !side_effects.contains(&call.id) || !completed.contains(&call.id) {
                    continue;
                }
                let result = messages.iter().find_map(|r| match r {
                    Message::Tool {
                        call_id, content, ..
                    } if *call_id == call.id => Some(content.as_str()),
                    _ => None,
                });
                lines.push(format!(
                    "- {} {} -> {}",
                    call.name,
                    call.arguments,
                    crate::limits::cut(result.unwrap_or(""), 2048)
                ));
            }
        }
        if lines.is_empty() {
            return None;
        }
        Some(Message::Assistant {
            content: format!(
                "Note: an earlier request in this conversation was rolled back (its messages were removed), but these side-effecting calls had already completed and were not undone; do not repeat them unless asked:\n{}",
                lines.join("\n")
            ),
            tool_calls: Vec::new(),
        })
    }
}
