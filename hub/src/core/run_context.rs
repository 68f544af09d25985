//! Run context: the conversation history and the events of a run's earlier attempts (its
//! replay), which a run starts from. `assign` no longer carries them: the Nest holding the
//! run's lease fetches them over `FetchRunContext` (see `server/run_context.rs`), so that a long
//! history never travels inside the Nest stream.
//!
//! Invariants: only the lease holder (its Nest by certificate, its instance, the task's run id
//! and current attempt, a lease not revoked) gets a run's context; what the check needs is
//! taken under the state lock, which is released before the store is read (no store reads
//! under the lock); the replay holds only events of attempts before the asking one.

use serde::Serialize;
use serde_json::Value;

use crate::core::Core;
use crate::error::{HubError, Result};
use crate::model::{ConversationRec, TaskState};
use crate::store::Table;

/// The run asking for its context, as its Nest names it.
#[derive(Debug, Clone)]
pub struct ContextAsk {
    pub task_id: String,
    pub run_id: String,
    pub attempt: u32,
    pub instance_id: String,
    /// The calling Nest by certificate; `None` on a plaintext Hub.
    pub nest_id: Option<String>,
}

/// A run's context as JSON text, in the form the Nest reads (`agen_contract::run::wire`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunContext {
    /// The conversation's messages so far: a JSON array of model messages.
    pub history_json: Vec<u8>,
    /// The earlier attempts' events: a JSON array of [`ReplayRecord`] (empty text on a
    /// first attempt).
    pub replay_json: Vec<u8>,
}

/// One replayed event, as `agen_contract::run::wire::replay` reads it.
#[derive(Debug, Serialize)]
struct ReplayRecord<'a> {
    attempt: u32,
    seq: u64,
    at_ms: i64,
    kind: &'a str,
    json: Value,
}

impl Core {
    /// The context of the run `ask` holds the lease of: checked under the lock, read from the
    /// store after it is released.
    pub async fn run_context(&self, ask: &ContextAsk) -> Result<RunContext> {
        let conversation_id = {
            let st = self.lock();
            let Some(task) = st.tasks.get(&ask.task_id) else {
                return Err(HubError::PermissionDenied(format!(
                    "run context: task {} is unknown to the hub; only the nest holding a run's lease may fetch its context",
                    ask.task_id
                )));
            };
            let refusal = if task.run_id.is_empty() || task.run_id != ask.run_id {
                Some(format!(
                    "run {} is not the run of task {}",
                    ask.run_id, task.task_id
                ))
            } else if task.attempt != ask.attempt {
                Some(format!(
                    "attempt {} of run {} is not the one the hub issued ({})",
                    ask.attempt, ask.run_id, task.attempt
                ))
            } else if task.lease.revoked
                || !matches!(task.state, TaskState::Running | TaskState::Waiting)
            {
                Some(format!(
                    "attempt {} of run {} holds no lease now (the task is {:?})",
                    ask.attempt, ask.run_id, task.state
                ))
            } else if task.lease.instance_id != ask.instance_id
                || ask
                    .nest_id
                    .as_ref()
                    .is_some_and(|n| *n != task.lease.nest_id)
            {
                Some(format!(
                    "run {} attempt {} was assigned to instance {} on nest {}, not to instance {} on nest {}",
                    ask.run_id,
                    ask.attempt,
                    task.lease.instance_id,
                    task.lease.nest_id,
                    ask.instance_id,
                    ask.nest_id.as_deref().unwrap_or("-")
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                return Err(HubError::PermissionDenied(format!(
                    "run context: {why}; only the nest holding a run's lease may fetch its context"
                )));
            }
            task.conversation_id.clone()
        };
        let db = self.db.clone();
        let (run_id, attempt) = (ask.run_id.clone(), ask.attempt);
        tokio::task::spawn_blocking(move || {
            let history: ConversationRec = if conversation_id.is_empty() {
                ConversationRec::default()
            } else {
                db.get_json(Table::Conversations, &conversation_id)?
                    .unwrap_or_default()
            };
            let history_json = serde_json::to_vec(&history.messages)
                .map_err(|e| HubError::Internal(format!("run context: history: {e}")))?;
            let replay_json = if attempt > 1 {
                let events = db.run_events(&run_id)?;
                let records: Vec<ReplayRecord<'_>> = events
                    .iter()
                    .filter(|e| e.attempt < attempt)
                    .map(|e| ReplayRecord {
                        attempt: e.attempt,
                        seq: e.seq,
                        at_ms: e.at_ms,
                        kind: &e.kind,
                        json: serde_json::from_str(&e.json)
                            .unwrap_or_else(|_| Value::String(e.json.clone())),
                    })
                    .collect();
                serde_json::to_vec(&records)
                    .map_err(|e| HubError::Internal(format!("run context: replay: {e}")))?
            } else {
                Vec::new()
            };
            Ok(RunContext {
                history_json,
                replay_json,
            })
        })
        .await
        .map_err(|e| HubError::Internal(format!("run context read panicked: {e}")))?
    }
}
