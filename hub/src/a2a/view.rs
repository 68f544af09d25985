//! An Agen task as an A2A task: its state (queued → SUBMITTED, running → WORKING, waiting for
//! an approval → INPUT_REQUIRED, succeeded → COMPLETED, failed → FAILED, cancelled →
//! CANCELED), a status message (progress, the approval it waits for, the result or the error),
//! its history (its input and its answer, then each message sent to it while it ran and the
//! answer to that: such a message runs as the next task of its context, labelled
//! [`CONTINUES_LABEL`]), and the artifacts it saved with their content.

use base64::Engine;

use super::types::*;
use crate::core::Core;
use crate::error::Result;
use crate::model::{TaskRec, TaskState as AgenState};

/// The label of a task started by a message sent to an earlier task that had not ended (its
/// `taskId`): that task's id.
pub const CONTINUES_LABEL: &str = "a2a.continues";

/// What of a task a view shows.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// At most this many history messages, the newest (`None`: all).
    pub history_length: Option<usize>,
    pub artifacts: bool,
}

impl Shape {
    /// Everything.
    pub const FULL: Shape = Shape {
        history_length: None,
        artifacts: true,
    };
}

/// Largest artifact whose content is put in the A2A artifact; a larger one is named with its
/// size and the command that fetches it.
pub const MAX_INLINE_ARTIFACT: u64 = 8 * 1024 * 1024;

/// The A2A state of an Agen task state.
pub fn state(s: AgenState) -> TaskState {
    match s {
        AgenState::Queued => TaskState::Submitted,
        AgenState::Running => TaskState::Working,
        AgenState::Waiting => TaskState::InputRequired,
        AgenState::Succeeded => TaskState::Completed,
        AgenState::Failed => TaskState::Failed,
        AgenState::Cancelled => TaskState::Canceled,
    }
}

/// The A2A context of a task: its conversation key (the task id when it has none).
pub fn context_id(t: &TaskRec) -> String {
    if t.conversation_key.is_empty() {
        t.task_id.clone()
    } else {
        t.conversation_key.clone()
    }
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn agent_text(t: &TaskRec, id: &str, text: String) -> Message {
    Message {
        message_id: format!("{}:{id}", t.task_id),
        context_id: Some(context_id(t)),
        task_id: Some(t.task_id.clone()),
        role: Role::Agent,
        parts: vec![Part {
            text: Some(text),
            ..Part::default()
        }],
    }
}

/// The status of a task: its A2A state and what it says now.
pub fn status(t: &TaskRec) -> TaskStatus {
    let text = match t.state {
        AgenState::Succeeded => t.outcome.as_ref().map(|o| o.result.clone()),
        AgenState::Failed => t.outcome.as_ref().map(|o| o.error.clone()),
        AgenState::Cancelled => Some(if t.cancel_reason.is_empty() {
            "cancelled".to_string()
        } else {
            t.cancel_reason.clone()
        }),
        AgenState::Waiting => Some(format!(
            "{}; approve or deny it with `agen approve {}` / `agen deny {}` (a message cannot answer it)",
            if t.activity.is_empty() { "waiting for an approval" } else { &t.activity },
            t.task_id,
            t.task_id
        )),
        AgenState::Running => match &t.progress {
            Some(p) if !p.step.is_empty() || !p.note.is_empty() => Some(progress_text(p)),
            _ => (!t.activity.is_empty()).then(|| t.activity.clone()),
        },
        AgenState::Queued => None,
    };
    TaskStatus {
        state: state(t.state),
        message: text
            .filter(|s| !s.is_empty())
            .map(|s| agent_text(t, "status", s)),
        timestamp: rfc3339(t.updated_at_ms),
    }
}

fn progress_text(p: &crate::model::ProgressRec) -> String {
    let mut s = p.step.clone();
    if let (Some(done), Some(total)) = (p.done, p.total) {
        s.push_str(&format!(" ({done}/{total})"));
    }
    if !p.note.is_empty() {
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&p.note);
    }
    s
}

/// The task's input as the user message that started it.
fn input_message(t: &TaskRec) -> Message {
    Message {
        message_id: t
            .client_request_id
            .strip_prefix(super::REQUEST_ID_PREFIX)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}:input", t.task_id)),
        context_id: Some(context_id(t)),
        task_id: Some(t.task_id.clone()),
        role: Role::User,
        parts: vec![Part {
            text: Some(t.input.clone()),
            ..Part::default()
        }],
    }
}

/// The artifacts a task saved, with their content.
pub fn artifacts(core: &Core, t: &TaskRec) -> Result<Vec<Artifact>> {
    let mut out = Vec::new();
    for rec in core.list_artifacts(&t.namespace, &t.task_id)? {
        let part = if rec.size > MAX_INLINE_ARTIFACT {
            Part {
                text: Some(format!(
                    "{} bytes, over the {MAX_INLINE_ARTIFACT} bytes sent inline; fetch it with `agen artifacts get {} -n {}`",
                    rec.size, rec.id, t.namespace
                )),
                filename: Some(rec.name.clone()),
                media_type: Some("text/plain".into()),
                ..Part::default()
            }
        } else {
            let (_, bytes) = core.artifact(&t.namespace, &rec.id)?;
            let textual = rec.media_type.starts_with("text/")
                || rec.media_type == "application/json"
                || rec.media_type.ends_with("+json");
            match String::from_utf8(bytes) {
                Ok(text) if textual => Part {
                    text: Some(text),
                    filename: Some(rec.name.clone()),
                    media_type: Some(rec.media_type.clone()),
                    ..Part::default()
                },
                Ok(text) => Part {
                    raw: Some(base64::engine::general_purpose::STANDARD.encode(text.as_bytes())),
                    filename: Some(rec.name.clone()),
                    media_type: Some(rec.media_type.clone()),
                    ..Part::default()
                },
                Err(e) => Part {
                    raw: Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
                    filename: Some(rec.name.clone()),
                    media_type: Some(rec.media_type.clone()),
                    ..Part::default()
                },
            }
        };
        out.push(Artifact {
            artifact_id: rec.id.clone(),
            name: rec.name.clone(),
            description: None,
            parts: vec![part],
        });
    }
    Ok(out)
}

/// The whole A2A task.
pub fn task(core: &Core, t: &TaskRec) -> Result<Task> {
    shaped(core, t, Shape::FULL)
}

/// The A2A task, as much of it as `shape` says.
pub fn shaped(core: &Core, t: &TaskRec, shape: Shape) -> Result<Task> {
    let mut history = history(core, t);
    if let Some(n) = shape.history_length {
        history.drain(..history.len().saturating_sub(n));
    }
    Ok(Task {
        id: t.task_id.clone(),
        context_id: context_id(t),
        status: status(t),
        artifacts: if shape.artifacts {
            artifacts(core, t)?
        } else {
            Vec::new()
        },
        history,
    })
}

/// The task's input and its answer, then each message sent to it while it ran and the answer
/// to that (the run of the message), oldest first.
fn history(core: &Core, t: &TaskRec) -> Vec<Message> {
    let mut history = vec![input_message(t)];
    history.extend(answer(t, &t.task_id));
    for next in core.labelled_in_conversation(
        &t.namespace,
        &t.conversation_id,
        CONTINUES_LABEL,
        &t.task_id,
    ) {
        let mut m = input_message(&next);
        m.task_id = Some(t.task_id.clone());
        history.push(m);
        history.extend(answer(&next, &t.task_id));
    }
    history
}

/// The answer of ended task `t` as an agent message of task `in_task`.
fn answer(t: &TaskRec, in_task: &str) -> Option<Message> {
    if !t.state.is_terminal() {
        return None;
    }
    let mut m = status(t).message?;
    m.message_id = format!("{}:answer", t.task_id);
    m.task_id = Some(in_task.to_string());
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agen_state_has_its_a2a_state() {
        let table = [
            (AgenState::Queued, "TASK_STATE_SUBMITTED"),
            (AgenState::Running, "TASK_STATE_WORKING"),
            (AgenState::Waiting, "TASK_STATE_INPUT_REQUIRED"),
            (AgenState::Succeeded, "TASK_STATE_COMPLETED"),
            (AgenState::Failed, "TASK_STATE_FAILED"),
            (AgenState::Cancelled, "TASK_STATE_CANCELED"),
        ];
        for (agen, a2a) in table {
            assert_eq!(
                serde_json::to_value(state(agen)).expect("serializes"),
                serde_json::Value::String(a2a.into())
            );
        }
    }
}
