//! [`RunEventBody`]: one variant per run-event kind, with typed fields, and its wire form
//! (kind + JSON object).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Message, Usage};

/// Kind names, as they appear on the wire and in the store.
pub mod kind {
    pub const MODEL_REQUESTED: &str = "model.requested";
    pub const MODEL_ANSWERED: &str = "model.answered";
    pub const TOOL_STARTED: &str = "tool.started";
    pub const TOOL_COMPLETED: &str = "tool.completed";
    pub const TOOL_FAILED: &str = "tool.failed";
    pub const ACTIVITY: &str = "activity";
    pub const TASK_PROGRESS: &str = "task.progress";
    pub const PROGRESS_LATEST: &str = "progress.latest";
    pub const ARTIFACT_SAVED: &str = "artifact.saved";
    pub const RUN_FINISHED: &str = "run.finished";
    pub const RUN_INTERRUPTED: &str = "run.interrupted";
    pub const APPROVAL_REQUESTED: &str = "approval.requested";
    pub const APPROVAL_DECIDED: &str = "approval.decided";
    pub const REMOTE_TASK_STARTED: &str = "remote_task.started";
    pub const RUN_SUSPENDED: &str = "run.suspended";
}

/// What happened, one variant per kind.
///
/// Serialised as `{"kind": …, "json": {fields}}`, the shape run logs have always had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "json")]
pub enum RunEventBody {
    /// A model request is about to be sent.
    #[serde(rename = "model.requested")]
    ModelRequested(ModelRequested),
    /// The turn's delta (the new assistant message), never the whole context.
    #[serde(rename = "model.answered")]
    ModelAnswered(ModelAnswered),
    /// A tool call is about to be sent; for a side-effecting tool this is durable first.
    #[serde(rename = "tool.started")]
    ToolStarted(ToolStarted),
    #[serde(rename = "tool.completed")]
    ToolCompleted(ToolCompleted),
    #[serde(rename = "tool.failed")]
    ToolFailed(ToolFailed),
    /// What the run is doing now.
    #[serde(rename = "activity")]
    Activity(Activity),
    /// A `report_progress` call (at most one event per 10 s).
    #[serde(rename = "task.progress")]
    TaskProgress(Progress),
    /// A `report_progress` held back from `task.progress` (it came within 10 s of the last):
    /// the task shows it at once; the latest still goes out as `task.progress` when due.
    #[serde(rename = "progress.latest")]
    ProgressLatest(Progress),
    /// `save_artifact` stored an artifact (or found the same bytes already stored).
    #[serde(rename = "artifact.saved")]
    ArtifactSaved(ArtifactSaved),
    /// Always the last event of a run.
    #[serde(rename = "run.finished")]
    RunFinished(RunFinished),
    /// Sent by the Nest (not the harness) when the instance died mid-run, was stopped, or is
    /// not on the Nest; the Hub re-dispatches the run with a new attempt. Replay ignores it.
    #[serde(rename = "run.interrupted")]
    RunInterrupted(RunInterrupted),
    /// An `ask` call waits for a person (durable before the run waits).
    #[serde(rename = "approval.requested")]
    ApprovalRequested(ApprovalRequested),
    /// A person (or the approval timeout, or `--always`) decided an `ask` call.
    #[serde(rename = "approval.decided")]
    ApprovalDecided(ApprovalDecided),
    /// A `call_agent` to a remote A2A agent made a task there (durable before it is waited
    /// for): a resume polls that task instead of sending the message again.
    #[serde(rename = "remote_task.started")]
    RemoteTaskStarted(RemoteTaskStarted),
    /// The run gave its instance slot back: it waits for a person's decision or a child task
    /// without holding an instance, and this attempt ends here (no `run.finished`). The Hub
    /// resumes the run with a new attempt once what it waits for is there (or its deadline
    /// passes); the resume replays this log. Replay ignores it.
    #[serde(rename = "run.suspended")]
    RunSuspended(RunSuspended),
    /// A kind this version does not know (a newer peer's, or a diagnostic such as `log`):
    /// stored and shown, ignored by replay and by the task's state.
    #[serde(untagged)]
    Unknown(UnknownEvent),
}

/// `approval.requested`: the call waits for a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    pub call_id: String,
    /// `<server>.<tool>`, or the Keen / built-in name.
    pub tool: String,
    /// The call's arguments as a JSON object, secrets redacted, cut at 64 KiB.
    #[serde(default)]
    pub arguments: Value,
    /// What the decision is bound to besides the call id: [`call_digest`] of the tool and its
    /// whole arguments. Empty in logs written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
}

/// `approval.decided`: what was decided about a call, and by whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecided {
    pub call_id: String,
    pub approved: bool,
    #[serde(default)]
    pub reason: String,
    /// The deciding token's name, or what decided (`approvalTimeout`).
    #[serde(default)]
    pub by: String,
    /// The [`ApprovalRequested::digest`] of the call this decides: a decision decides only
    /// the call with this digest. Empty in logs written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// A person approved the call with these arguments (a JSON object) in place of the ones
    /// asked (`agen approve --args FILE`): the call is sent with them, and the model is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

/// The digest an approval is bound to: sha256 (hex) of the tool name, a NUL and the arguments'
/// JSON text, so a call that differs in its tool or any argument is a different call.
pub fn call_digest(tool: &str, arguments: &Value) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(tool.as_bytes());
    h.update([0u8]);
    h.update(arguments.to_string().as_bytes());
    format!("{:x}", h.finalize())
}

/// `remote_task.started`: the remote A2A task a delegate call is waiting for. Never the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteTaskStarted {
    pub call_id: String,
    /// The delegate's name in `x-agen/config.json`.
    pub agent: String,
    /// The A2A task id the remote agent gave.
    pub task_id: String,
    /// The JSON-RPC endpoint from the agent's card, where the task is polled.
    pub endpoint: String,
}

/// An event of a kind this version does not read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnknownEvent {
    pub kind: String,
    #[serde(default)]
    pub json: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRequested {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// A Keen flow's agent node, not a turn of the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flow_agent: bool,
    /// What the run is doing while it waits (for example "waiting for the model (openai
    /// gpt-4o)"); without it, "waiting for the model". Carried here rather than in an
    /// `activity` event of its own, which would be one more event per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelAnswered {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flow_agent: bool,
    /// The new assistant message; `None` in a log that lost it (replay asks again).
    #[serde(default, deserialize_with = "lenient")]
    pub message: Option<Message>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The provider's id of this answer (`chatcmpl-…`, `msg_…`), when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
    /// The model that answered, as the provider named it, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_model: Option<String>,
    /// The provider's error, when the turn failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a Keen-dialect call was dispatched, when it was not an MCP tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeenToolKind {
    Script,
    Flow,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolStarted {
    pub call_id: String,
    /// `<server>.<tool>`, a built-in's name, or a Keen tool's registered name.
    pub tool: String,
    /// The name the model used (`<server>_<tool>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// An absent flag reads as side-effecting: the safe side for a resume.
    #[serde(default = "yes")]
    pub side_effect: bool,
    /// Only with `traceToolArguments`: secrets redacted, each argument cut to 4 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// On the wire as `kind` inside the fields (the event's own kind is outside them).
    #[serde(default, rename = "kind", skip_serializing_if = "Option::is_none")]
    pub keen_kind: Option<KeenToolKind>,
    /// W3C span id of this call (16 hex), as sent in `_meta.traceparent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
}

/// The exact Keen result a call's record stands for, so a resume gives the model the same text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeenResult {
    ScriptError,
    FlowError,
    TechnicalError,
    NoResponse,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCompleted {
    pub call_id: String,
    pub tool: String,
    #[serde(default)]
    pub result: String,
    #[serde(default)]
    pub is_error: bool,
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keen_result: Option<KeenResult>,
}

/// Why a tool call produced no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailure {
    Timeout,
    Cancelled,
    Failed,
    UnknownTool,
    BadArguments,
    Limit,
    EffectUnknown,
    /// The bundle's permissions (or the task's overrides) deny the tool; it was never sent.
    Denied,
    /// A reason this version does not know.
    #[serde(other)]
    Other,
}

impl ToolFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolFailure::Timeout => "timeout",
            ToolFailure::Cancelled => "cancelled",
            ToolFailure::Failed => "failed",
            ToolFailure::UnknownTool => "unknown_tool",
            ToolFailure::BadArguments => "bad_arguments",
            ToolFailure::Limit => "limit",
            ToolFailure::EffectUnknown => "effect_unknown",
            ToolFailure::Denied => "denied",
            ToolFailure::Other => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolFailed {
    pub call_id: String,
    pub tool: String,
    /// What the model was told.
    #[serde(default)]
    pub error: String,
    #[serde(default = "failed")]
    pub reason: ToolFailure,
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keen_result: Option<KeenResult>,
    /// For a Keen technical error: the text the model was shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keen_text: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Activity {
    #[serde(default)]
    pub activity: String,
}

/// A progress report, as `report_progress` takes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    #[serde(default)]
    pub step: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub done: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub total: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub note: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "lenient_vec"
    )]
    pub artifacts: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArtifactSaved {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub media_type: String,
    #[serde(default)]
    pub size: u64,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }
}

/// What a run's result text is: the answer, or what went wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponseType {
    #[default]
    Text,
    Error,
    /// The answer is JSON that matched the run's output schema (`outputSchema`).
    Json,
    /// Anything else in an old log reads as an error.
    #[serde(other)]
    Unknown,
}

impl ResponseType {
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseType::Text => "text",
            ResponseType::Json => "json",
            ResponseType::Error | ResponseType::Unknown => "error",
        }
    }
}

/// `run.suspended`: what the run waits for, and what happens at its deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSuspended {
    pub waiting_for: WaitingFor,
    /// When the wait ends anyway (unix ms): an approval is denied with `on_deadline` as the
    /// reason (`by` `approvalTimeout`); a child task is cancelled with it. The Hub keeps the
    /// earliest deadline a wait was given, so a resume never extends it.
    pub deadline_ms: i64,
    /// The reason given at the deadline.
    #[serde(default)]
    pub on_deadline: String,
}

/// What a suspended run waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WaitingFor {
    /// A decision about its `ask` call `call_id`.
    Approval { call_id: String, tool: String },
    /// The end of its child task (a `call_agent`).
    Child { call_id: String, task_id: String },
}

impl WaitingFor {
    /// The call that waits.
    pub fn call_id(&self) -> &str {
        match self {
            WaitingFor::Approval { call_id, .. } | WaitingFor::Child { call_id, .. } => call_id,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFinished {
    pub state: RunState,
    #[serde(default)]
    pub result: String,
    #[serde(default)]
    pub response_type: ResponseType,
    /// This run's new conversation messages; added by the instance to the final event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInterrupted {
    #[serde(default)]
    pub reason: String,
    /// Why, for the Hub's attempt accounting (`instance_failed`, `nest_fenced`, …; see the
    /// Hub's leases).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cause: String,
}

fn yes() -> bool {
    true
}

fn failed() -> ToolFailure {
    ToolFailure::Failed
}

/// Reads a field as `None` when it has the wrong shape (old logs, model-given progress).
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

fn lenient_vec<'de, D>(d: D) -> Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let v = Value::deserialize(d)?;
    Ok(match v {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    })
}

/// A body that could not be read as its kind.
#[derive(Debug, thiserror::Error)]
#[error("run event {kind}: {detail}")]
pub struct BodyError {
    pub kind: String,
    pub detail: String,
}

impl RunEventBody {
    /// What its task is doing once this event happened (the task's `activity`), for the
    /// events that say: an `activity` event, a model request ("waiting for the model" unless
    /// it names its own), a model answer ("thinking") and a tool's start ("calling TOOL").
    /// `None` for every other event, which leaves the activity as it was.
    pub fn activity(&self) -> Option<std::borrow::Cow<'_, str>> {
        use std::borrow::Cow;
        match self {
            RunEventBody::Activity(a) => Some(Cow::Borrowed(&a.activity)),
            RunEventBody::ModelRequested(m) => Some(Cow::Borrowed(
                m.activity.as_deref().unwrap_or("waiting for the model"),
            )),
            RunEventBody::ModelAnswered(_) => Some(Cow::Borrowed("thinking")),
            RunEventBody::ToolStarted(t) => Some(Cow::Owned(format!("calling {}", t.tool))),
            _ => None,
        }
    }

    /// The wire kind.
    pub fn kind(&self) -> &str {
        match self {
            RunEventBody::ModelRequested(_) => kind::MODEL_REQUESTED,
            RunEventBody::ModelAnswered(_) => kind::MODEL_ANSWERED,
            RunEventBody::ToolStarted(_) => kind::TOOL_STARTED,
            RunEventBody::ToolCompleted(_) => kind::TOOL_COMPLETED,
            RunEventBody::ToolFailed(_) => kind::TOOL_FAILED,
            RunEventBody::Activity(_) => kind::ACTIVITY,
            RunEventBody::TaskProgress(_) => kind::TASK_PROGRESS,
            RunEventBody::ProgressLatest(_) => kind::PROGRESS_LATEST,
            RunEventBody::ArtifactSaved(_) => kind::ARTIFACT_SAVED,
            RunEventBody::RunFinished(_) => kind::RUN_FINISHED,
            RunEventBody::RunInterrupted(_) => kind::RUN_INTERRUPTED,
            RunEventBody::ApprovalRequested(_) => kind::APPROVAL_REQUESTED,
            RunEventBody::ApprovalDecided(_) => kind::APPROVAL_DECIDED,
            RunEventBody::RemoteTaskStarted(_) => kind::REMOTE_TASK_STARTED,
            RunEventBody::RunSuspended(_) => kind::RUN_SUSPENDED,
            RunEventBody::Unknown(u) => &u.kind,
        }
    }

    /// The wire fields (the `json` part).
    pub fn to_json(&self) -> Value {
        if let RunEventBody::Unknown(u) = self {
            return u.json.clone();
        }
        match serde_json::to_value(self) {
            Ok(Value::Object(mut m)) => m.remove("json").unwrap_or(Value::Object(Map::new())),
            _ => Value::Object(Map::new()),
        }
    }

    /// The wire fields as JSON text: the same text as [`RunEventBody::to_json`]'s, written
    /// straight from the fields (no `Value` tree on the way: every relayed event costs one).
    pub fn to_json_string(&self) -> String {
        fn text<T: Serialize>(fields: &T) -> String {
            serde_json::to_string(fields).unwrap_or_else(|_| "{}".to_string())
        }
        match self {
            RunEventBody::ModelRequested(b) => text(b),
            RunEventBody::ModelAnswered(b) => text(b),
            RunEventBody::ToolStarted(b) => text(b),
            RunEventBody::ToolCompleted(b) => text(b),
            RunEventBody::ToolFailed(b) => text(b),
            RunEventBody::Activity(b) => text(b),
            RunEventBody::TaskProgress(b) => text(b),
            RunEventBody::ProgressLatest(b) => text(b),
            RunEventBody::ArtifactSaved(b) => text(b),
            RunEventBody::RunFinished(b) => text(b),
            RunEventBody::RunInterrupted(b) => text(b),
            RunEventBody::ApprovalRequested(b) => text(b),
            RunEventBody::ApprovalDecided(b) => text(b),
            RunEventBody::RemoteTaskStarted(b) => text(b),
            RunEventBody::RunSuspended(b) => text(b),
            RunEventBody::Unknown(u) => u.json.to_string(),
        }
    }

    /// Reads a body from its wire parts. An unknown kind is kept as [`RunEventBody::Unknown`];
    /// a known kind whose fields do not fit is an error naming the kind.
    pub fn from_parts(kind: &str, json: Value) -> Result<RunEventBody, BodyError> {
        let known = KNOWN.contains(&kind);
        let json = match json {
            Value::Null if known => Value::Object(Map::new()),
            other => other,
        };
        let mut m = Map::new();
        m.insert("kind".into(), Value::String(kind.to_string()));
        m.insert("json".into(), json);
        let body: RunEventBody =
            serde_json::from_value(Value::Object(m)).map_err(|e| BodyError {
                kind: kind.to_string(),
                detail: e.to_string(),
            })?;
        if known && matches!(body, RunEventBody::Unknown(_)) {
            return Err(BodyError {
                kind: kind.to_string(),
                detail: format!(
                    "its fields are not those of {kind} (see agen_contract::run::RunEventBody)"
                ),
            });
        }
        Ok(body)
    }

    /// [`RunEventBody::from_parts`] from JSON text. A known kind is read straight from the
    /// text into its fields (one pass: every run event crosses this on the Hub's hot path);
    /// when that fails, the general path reads it again and gives the error.
    pub fn from_wire(kind: &str, json: &str) -> Result<RunEventBody, BodyError> {
        if let Some(body) = RunEventBody::from_known_text(kind, json) {
            return Ok(body);
        }
        let value = if json.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(json).map_err(|e| BodyError {
                kind: kind.to_string(),
                detail: format!("not JSON: {e}"),
            })?
        };
        RunEventBody::from_parts(kind, value)
    }
}

impl RunEventBody {
    /// A known kind's fields read directly from their text; `None` for an unknown kind or
    /// text that does not fit (the general path then decides, with its error).
    fn from_known_text(kind: &str, json: &str) -> Option<RunEventBody> {
        fn read<T: serde::de::DeserializeOwned>(text: &str) -> Option<T> {
            serde_json::from_str(text).ok()
        }
        let trimmed = json.trim();
        let text = if trimmed.is_empty() || trimmed == "null" {
            "{}"
        } else {
            json
        };
        Some(match kind {
            kind::MODEL_REQUESTED => RunEventBody::ModelRequested(read(text)?),
            kind::MODEL_ANSWERED => RunEventBody::ModelAnswered(read(text)?),
            kind::TOOL_STARTED => RunEventBody::ToolStarted(read(text)?),
            kind::TOOL_COMPLETED => RunEventBody::ToolCompleted(read(text)?),
            kind::TOOL_FAILED => RunEventBody::ToolFailed(read(text)?),
            kind::ACTIVITY => RunEventBody::Activity(read(text)?),
            kind::TASK_PROGRESS => RunEventBody::TaskProgress(read(text)?),
            kind::PROGRESS_LATEST => RunEventBody::ProgressLatest(read(text)?),
            kind::ARTIFACT_SAVED => RunEventBody::ArtifactSaved(read(text)?),
            kind::RUN_FINISHED => RunEventBody::RunFinished(read(text)?),
            kind::RUN_INTERRUPTED => RunEventBody::RunInterrupted(read(text)?),
            kind::APPROVAL_REQUESTED => RunEventBody::ApprovalRequested(read(text)?),
            kind::APPROVAL_DECIDED => RunEventBody::ApprovalDecided(read(text)?),
            kind::REMOTE_TASK_STARTED => RunEventBody::RemoteTaskStarted(read(text)?),
            kind::RUN_SUSPENDED => RunEventBody::RunSuspended(read(text)?),
            _ => return None,
        })
    }
}

const KNOWN: &[&str] = &[
    kind::MODEL_REQUESTED,
    kind::MODEL_ANSWERED,
    kind::TOOL_STARTED,
    kind::TOOL_COMPLETED,
    kind::TOOL_FAILED,
    kind::ACTIVITY,
    kind::TASK_PROGRESS,
    kind::PROGRESS_LATEST,
    kind::ARTIFACT_SAVED,
    kind::RUN_FINISHED,
    kind::RUN_INTERRUPTED,
    kind::APPROVAL_REQUESTED,
    kind::APPROVAL_DECIDED,
    kind::REMOTE_TASK_STARTED,
    kind::RUN_SUSPENDED,
];

/// A stored body that must be readable: a wrong-shaped known kind reads as `Unknown` so that
/// one bad event never makes a whole log unreadable.
impl RunEventBody {
    pub fn from_wire_lossy(kind: &str, json: &str) -> RunEventBody {
        RunEventBody::from_wire(kind, json).unwrap_or_else(|_| {
            RunEventBody::Unknown(UnknownEvent {
                kind: kind.to_string(),
                json: serde_json::from_str(json).unwrap_or(Value::Null),
            })
        })
    }
}
