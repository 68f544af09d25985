//! The agent loop: builds the system prompt and the tool list once per instance, then for each
//! run asks the model, runs the tools it asks for (at the same time, or one at a time with
//! `parallelToolCalls: false`), feeds the results back, and stops when the model answers
//! without a tool call, calls `finish`, runs out of `maxTurns`, fails, or is cancelled.
//! Two dialects: native tool calling, and Keen's text protocol (`toolProtocol: keen`, built on
//! `crate::keen`: no `tools` are sent, results return as `<SYSTEM RESPONSE>` user prompts).
//! A run with `replay` events (a resumed attempt, native dialect) rebuilds its context from
//! them instead of asking answered turns again.
//!
//! Invariants: tool results go back to the model in the order the calls were asked, whatever
//! order they finished in; every tool call the model made gets exactly one tool message (so a
//! conversation history is always valid for the providers); `tool.started` of a
//! side-effecting call is emitted with `sync` before the call is sent, its
//! `tool.completed`/`tool.failed` with `sync` before the model sees the result; the `cancel`
//! token reaches the model request and every in-flight tool call.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_shared::bundle::{Bundle, ToolProtocol, AGENT_FILE};
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::{event, RunEventSink, RunOutcome, RunRequest, RunState, SinkError, ToolBackend};
use crate::artifacts::{self, ArtifactStore, MemoryArtifacts, NewArtifact};
use crate::mcp::{CallError, ToolInfo};
use crate::model::{
    provider_for, Message, ModelConfig, ModelError, ModelProvider, ModelReply, ModelRequest,
    ToolCall, ToolSpec,
};

pub const BUILTIN_FINISH: &str = "finish";
pub const BUILTIN_LOAD_SKILL: &str = "load_skill";
pub const BUILTIN_REPORT_PROGRESS: &str = "report_progress";
pub const BUILTIN_SAVE_ARTIFACT: &str = "save_artifact";
pub const BUILTIN_READ_ARTIFACT: &str = "read_artifact";

/// `task.progress` events are sent at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How the model calls tools: the seam where the Keen text protocol plugs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// The provider's native tool calling (`tools` in the request, `tool_calls` in the reply).
    Native,
    /// Keen's `<SYSTEM CALL>` text protocol (see `crate::keen`); no `tools` are sent.
    Keen,
}

/// Why a harness could not be built for a bundle.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{AGENT_FILE}: model: missing; set `model: openai/gpt-4.1-mini` (or anthropic/…) in the front matter, or pass --model to agen run")]
    NoModel,
    #[error("{0}")]
    ApiKey(String),
    #[error("{0}")]
    Keen(String),
    #[error("tool name {0} is used twice (an MCP tool clashes with another tool or a built-in); rename the server in mcp.json")]
    DuplicateTool(String),
}

/// The model client settings of `bundle`: its `model`, `baseUrl`, `apiKey` (with `${NAME}`
/// filled from `secrets`) and extra front-matter settings.
pub fn model_config(
    bundle: &Bundle,
    secrets: &BTreeMap<String, String>,
) -> Result<ModelConfig, HarnessError> {
    let model = bundle.agent.model.clone().ok_or(HarnessError::NoModel)?;
    let mut config = ModelConfig::new(model);
    config.base_url = bundle.agent.base_url.clone();
    config.api_key = bundle
        .api_key_with_secrets(secrets)
        .map_err(|e| HarnessError::ApiKey(e.to_string()))?;
    config.extra = bundle.agent.extra.clone();
    Ok(config)
}

/// One instance's agent loop (see the module doc). Cheap to share: runs borrow it.
pub struct Harness {
    bundle: Arc<Bundle>,
    tools: Arc<dyn ToolBackend>,
    provider: Arc<dyn ModelProvider>,
    dialect: Dialect,
    system_prompt: String,
    /// MCP tools by the name the model sees.
    mcp_tools: BTreeMap<String, ToolInfo>,
    /// Whether `report_progress` is offered (fleet only).
    progress: bool,
    /// Secret values, redacted from traced tool arguments.
    secret_values: Vec<String>,
    /// The bundle's Keen tools (`keen-tools.json`, flows) when the dialect is Keen.
    keen: Option<Arc<crate::keen::KeenBundle>>,
    /// Where `save_artifact` / `read_artifact` keep artifacts.
    artifacts: Arc<dyn ArtifactStore>,
}

impl Harness {
    /// Builds the harness for `bundle`: its model client (`apiKey` resolved from `secrets`),
    /// system prompt (agent.md body + preloaded skills) and tool list (`tools` + built-ins).
    pub fn new(
        bundle: Arc<Bundle>,
        tools: Arc<dyn ToolBackend>,
        secrets: &BTreeMap<String, String>,
        http: reqwest::Client,
    ) -> Result<Harness, HarnessError> {
        let config = model_config(&bundle, secrets)?;
        let provider: Arc<dyn ModelProvider> = Arc::from(provider_for(config, http));
        Ok(Harness::with_provider(bundle, tools, provider)?.with_secret_values(secrets))
    }

    /// Secret values to redact from traced tool arguments (`traceToolArguments`).
    pub fn with_secret_values(mut self, secrets: &BTreeMap<String, String>) -> Harness {
        self.secret_values = secrets.values().filter(|v| v.len() >= 4).cloned().collect();
        self
    }

    /// Like [`Harness::new`] with a ready model client.
    pub fn with_provider(
        bundle: Arc<Bundle>,
        tools: Arc<dyn ToolBackend>,
        provider: Arc<dyn ModelProvider>,
    ) -> Result<Harness, HarnessError> {
        let mut mcp_tools = BTreeMap::new();
        for t in tools.tools() {
            let name = t.model_name();
            if [
                BUILTIN_FINISH,
                BUILTIN_LOAD_SKILL,
                BUILTIN_REPORT_PROGRESS,
                BUILTIN_SAVE_ARTIFACT,
                BUILTIN_READ_ARTIFACT,
            ]
            .contains(&name.as_str())
                || mcp_tools.contains_key(&name)
            {
                return Err(HarnessError::DuplicateTool(name));
            }
            mcp_tools.insert(name, t);
        }
        let mut system_prompt = bundle.agent.system_prompt.trim_end().to_string();
        for name in &bundle.agent.preload_skills {
            if let Some(skill) = bundle.skill(name) {
                system_prompt.push_str(&format!(
                    "\n\n# Skill: {}\n\n{}",
                    skill.name,
                    skill.body.trim_end()
                ));
            }
        }
        let dialect = match bundle.harness.tool_protocol {
            ToolProtocol::Native => Dialect::Native,
            ToolProtocol::Keen => Dialect::Keen,
        };
        let keen = match dialect {
            Dialect::Native => None,
            Dialect::Keen => crate::keen::KeenBundle::load(&bundle.dir)
                .map_err(|e| HarnessError::Keen(e.to_string()))?
                .map(Arc::new),
        };
        Ok(Harness {
            bundle,
            tools,
            provider,
            dialect,
            system_prompt,
            mcp_tools,
            progress: false,
            secret_values: Vec::new(),
            keen,
            artifacts: Arc::new(MemoryArtifacts::default()),
        })
    }

    /// Where artifacts go: the Nest (fleet), local files (`agen run`); in memory by default.
    pub fn with_artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Harness {
        self.artifacts = artifacts;
        self
    }

    /// Offers `report_progress` (fleet runs only; standalone has no platform to report to).
    pub fn with_progress(mut self, on: bool) -> Harness {
        self.progress = on;
        self
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The system prompt every run starts with.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// `openai/gpt-4.1-mini`.
    pub fn model(&self) -> String {
        self.provider.describe()
    }

    /// The tools offered to the model, MCP tools first (sorted), then built-ins.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self
            .mcp_tools
            .iter()
            .map(|(name, t)| ToolSpec {
                name: name.clone(),
                description: t.description.clone(),
                parameters: object_schema(&t.input_schema),
            })
            .collect();
        specs.push(ToolSpec {
            name: BUILTIN_FINISH.into(),
            description: "End the run with your final answer. Call it when the task is done; `result` is what the user gets.".into(),
            parameters: json!({"type": "object", "properties": {"result": {"type": "string", "description": "the final answer"}}, "required": ["result"]}),
        });
        specs.push(ToolSpec {
            name: BUILTIN_SAVE_ARTIFACT.into(),
            description: "Save a long result (a report, a large file's contents) as an artifact so it does not crowd your context; returns its id (sha256:<hex> of the content). Saving the same content again returns the same id. Limits: 25 MB per artifact, 500 MB per namespace.".into(),
            parameters: json!({"type": "object", "properties": {
                "name": {"type": "string", "description": "a short name, e.g. weekly-report"},
                "content": {"type": "string", "description": "the content to save"},
                "mediaType": {"type": "string", "description": "e.g. text/markdown (default text/plain)"}
            }, "required": ["name", "content"]}),
        });
        specs.push(ToolSpec {
            name: BUILTIN_READ_ARTIFACT.into(),
            description: "Read a saved artifact: up to 4000 characters by default; page through a longer one with offset and length (the reply says the next offset).".into(),
            parameters: json!({"type": "object", "properties": {
                "id": {"type": "string", "description": "the id save_artifact returned (sha256:<hex>)"},
                "offset": {"type": "integer", "description": "the first character to read (default 0)"},
                "length": {"type": "integer", "description": "how many characters (default 4000)"}
            }, "required": ["id"]}),
        });
        if !self.bundle.skills.is_empty() {
            let list: Vec<String> = self
                .bundle
                .skills
                .iter()
                .map(|s| format!("- {} — {}", s.name, s.description))
                .collect();
            let names: Vec<&str> = self.bundle.skills.iter().map(|s| s.name.as_str()).collect();
            specs.push(ToolSpec {
                name: BUILTIN_LOAD_SKILL.into(),
                description: format!("Load a skill: returns its instructions. Available skills:\n{}", list.join("\n")),
                parameters: json!({"type": "object", "properties": {"name": {"type": "string", "enum": names, "description": "the skill's name"}}, "required": ["name"]}),
            });
        }
        if self.progress {
            specs.push(ToolSpec {
                name: BUILTIN_REPORT_PROGRESS.into(),
                description: "Report progress on a long task so whoever watches it sees more than \"running\". It does not end the run.".into(),
                parameters: json!({"type": "object", "properties": {
                    "step": {"type": "string", "description": "what you are doing now"},
                    "done": {"type": "integer", "description": "steps done"},
                    "total": {"type": "integer", "description": "steps in all"},
                    "note": {"type": "string"},
                    "artifacts": {"type": "array", "items": {"type": "string"}, "description": "artifact ids"}
                }, "required": ["step"]}),
            });
        }
        specs
    }

    /// Runs one run to its end (see the module doc). Never panics on model or tool failures:
    /// they become the outcome.
    pub async fn run(
        &self,
        req: RunRequest,
        sink: Arc<dyn RunEventSink>,
        cancel: CancellationToken,
    ) -> RunOutcome {
        let run = Run::new(self, &req, sink, cancel);
        let (state, result, response_type) = match self.dialect {
            Dialect::Native => run.native_loop().await,
            Dialect::Keen => run.keen_loop().await,
        };
        run.finish(state, result, response_type).await
    }
}

/// A JSON Schema the providers accept for a tool's parameters: an object schema.
fn object_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("object") => {
            schema.clone()
        }
        Value::Object(o) if !o.contains_key("type") => {
            let mut o = o.clone();
            o.insert("type".into(), json!("object"));
            o.entry("properties").or_insert_with(|| json!({}));
            Value::Object(o)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// What the model is told about an interrupted side-effecting call that is not sent again.
fn effect_unknown_message(tool: &str) -> String {
    format!(
        "effect_unknown: the call to {tool} was interrupted before its result was recorded; it may or may not have taken effect. Check before calling it again."
    )
}

/// The log of earlier attempts of a Keen-dialect run, read for a resume.
#[derive(Default)]
struct KeenReplay {
    /// Answered model turns by turn number.
    turns: HashMap<u32, Message>,
    /// Recorded call results by call id (`keen_<turn>`), as the model saw them.
    results: HashMap<String, crate::keen::ToolResult>,
    /// Calls whose start was recorded, with their `side_effect` flag.
    started: HashMap<String, bool>,
    /// The run's recorded end, when the log already holds one.
    finished: Option<(RunState, String, &'static str)>,
}

impl KeenReplay {
    fn from_events(events: &[super::RunEventRecord]) -> KeenReplay {
        use crate::keen::ToolResult;
        let mut out = KeenReplay::default();
        let text = |j: &Value, key: &str| {
            j.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        for ev in events {
            let j = &ev.json;
            let call_id = text(j, "call_id");
            let keen_result = j.get("keen_result").and_then(Value::as_str);
            match ev.kind.as_str() {
                event::RUN_FINISHED => {
                    let state = match j.get("state").and_then(Value::as_str) {
                        Some("succeeded") => RunState::Succeeded,
                        Some("cancelled") => RunState::Cancelled,
                        _ => RunState::Failed,
                    };
                    let response_type = if text(j, "response_type") == "text" {
                        "text"
                    } else {
                        "error"
                    };
                    out.finished = Some((state, text(j, "result"), response_type));
                }
                event::MODEL_ANSWERED => {
                    let turn = j
                        .get("turn")
                        .and_then(Value::as_u64)
                        .and_then(|t| u32::try_from(t).ok());
                    let message = j
                        .get("message")
                        .cloned()
                        .and_then(|m| serde_json::from_value::<Message>(m).ok());
                    if let (Some(turn), Some(message)) = (turn, message) {
                        out.turns.insert(turn, message);
                    }
                }
                event::TOOL_STARTED => {
                    let side_effect = j
                        .get("side_effect")
                        .and_then(Value::as_bool)
                        .unwrap_or(true);
                    out.started.insert(call_id, side_effect);
                }
                event::TOOL_COMPLETED => {
                    let body = text(j, "result");
                    let is_error = j.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                    let r = match (keen_result, is_error) {
                        (Some("flow_error"), _) => ToolResult::FlowError(body),
                        (_, true) => ToolResult::ScriptError(body),
                        (_, false) => ToolResult::Answer(body),
                    };
                    out.results.insert(call_id, r);
                }
                // A call cut off by a cancel or a crash has no real result.
                event::TOOL_FAILED
                    if j.get("reason").and_then(Value::as_str) != Some("cancelled") =>
                {
                    let r = match keen_result {
                        Some("technical_error") => ToolResult::TechnicalError(text(j, "keen_text")),
                        Some("no_response") => ToolResult::NoResponse(text(j, "error")),
                        // A native call's failure: what the model was told.
                        _ if text(j, "reason") == "timeout" => {
                            ToolResult::TechnicalError(text(j, "error"))
                        }
                        _ => ToolResult::ScriptError(text(j, "error")),
                    };
                    out.results.insert(call_id, r);
                }
                _ => {}
            }
        }
        out
    }
}

/// The result of one tool call, as the model will see it.
struct CallResult {
    content: String,
    is_error: bool,
    /// The tool could not be reached or did not answer (timeout, cancel, server gone).
    unreachable: bool,
    /// `finish` was called with this result.
    finish: Option<String>,
}

/// The state of one run.
struct Run<'h> {
    h: &'h Harness,
    req: &'h RunRequest,
    sink: Arc<dyn RunEventSink>,
    /// Fires on the caller's cancel and when the sink says this attempt is fenced off.
    cancel: CancellationToken,
    caller_cancel: CancellationToken,
    fenced: std::sync::atomic::AtomicBool,
    /// Set when a side-effecting result could not be made durable: the run stops.
    log_lost: Mutex<Option<String>>,
    trace_id: String,
    context: Mutex<Vec<Message>>,
    /// This run's new messages (the outcome's `messages`).
    new_messages: Mutex<Vec<Message>>,
    tool_calls: std::sync::atomic::AtomicU32,
    /// When the last `task.progress` went out, and the latest report held back since then.
    last_progress: Mutex<(Option<Instant>, Option<Value>)>,
    /// What the next model turn is doing, when it is more than "waiting for the model"
    /// (Keen: "reading the result of <tool>").
    next_turn_activity: Mutex<Option<String>>,
}

impl<'h> Run<'h> {
    fn new(
        h: &'h Harness,
        req: &'h RunRequest,
        sink: Arc<dyn RunEventSink>,
        caller_cancel: CancellationToken,
    ) -> Run<'h> {
        let mut context = Vec::with_capacity(req.history.len() + 1);
        for (i, m) in req.history.iter().enumerate() {
            match serde_json::from_value::<Message>(m.clone()) {
                Ok(m) => context.push(m),
                Err(e) => {
                    tracing::warn!(run_id = %req.run_id, "conversation history message {i} is not a message, skipped: {e}")
                }
            }
        }
        let user = Message::user(req.input.clone());
        context.push(user.clone());
        Run {
            h,
            req,
            sink,
            cancel: caller_cancel.child_token(),
            caller_cancel,
            fenced: Default::default(),
            log_lost: Mutex::new(None),
            trace_id: uuid::Uuid::new_v4().simple().to_string(),
            context: Mutex::new(context),
            new_messages: Mutex::new(vec![user]),
            tool_calls: Default::default(),
            last_progress: Mutex::new((None, None)),
            next_turn_activity: Mutex::new(None),
        }
    }

    fn push(&self, m: Message) {
        lock(&self.context).push(m.clone());
        lock(&self.new_messages).push(m);
    }

    /// Emits one event. A fenced attempt cancels the run; a failure of a `sync` event is
    /// returned (the caller must not go on as if it were durable); other failures are logged.
    async fn emit(&self, kind: &str, json: Value, sync: bool) -> Result<(), SinkError> {
        match self.sink.emit(kind, json, sync).await {
            Ok(()) => Ok(()),
            Err(SinkError::Fenced) => {
                self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
                self.cancel.cancel();
                Err(SinkError::Fenced)
            }
            Err(e) => {
                tracing::warn!(run_id = %self.req.run_id, kind, "run event not appended: {e}");
                if sync {
                    Err(e)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Sends the latest held-back progress report when it is due, or at once with `force`
    /// (the run is ending), so the task always ends up with the latest report.
    async fn flush_progress(&self, force: bool) {
        let pending = {
            let mut p = lock(&self.last_progress);
            if p.1.is_some() && (force || p.0.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY)) {
                p.0 = Some(Instant::now());
                p.1.take()
            } else {
                None
            }
        };
        if let Some(args) = pending {
            let _ = self.emit(event::TASK_PROGRESS, args, false).await;
        }
    }

    async fn activity(&self, text: String) {
        let _ = self
            .emit(event::ACTIVITY, json!({"activity": text}), false)
            .await;
    }

    fn cancelled_outcome(&self) -> (RunState, String, &'static str) {
        if self.fenced.load(std::sync::atomic::Ordering::SeqCst) {
            (
                RunState::Failed,
                "this run attempt was superseded by a newer attempt".into(),
                "error",
            )
        } else if let Some(why) = lock(&self.log_lost).clone() {
            (RunState::Failed, why, "error")
        } else {
            (RunState::Cancelled, "the run was cancelled".into(), "error")
        }
    }

    /// Asks the model one turn: `model.requested`, the request, `model.answered`; the reply's
    /// assistant message is added to the context. `Err` is the run's end (error or cancel).
    async fn ask(
        &self,
        turn: u32,
        system: &str,
        tools: &[ToolSpec],
    ) -> Result<ModelReply, (RunState, String, &'static str)> {
        if self.cancel.is_cancelled() {
            return Err(self.cancelled_outcome());
        }
        self.flush_progress(false).await;
        let _ = self
            .emit(event::MODEL_REQUESTED, json!({"turn": turn}), false)
            .await;
        let activity = lock(&self.next_turn_activity)
            .take()
            .unwrap_or_else(|| format!("waiting for the model ({})", self.h.provider.describe()));
        self.activity(activity).await;
        let request = ModelRequest {
            system: system.to_string(),
            messages: lock(&self.context).clone(),
            tools: tools.to_vec(),
            parallel_tool_calls: self.h.bundle.harness.parallel_tool_calls,
        };
        let reply = match self.h.provider.complete(&request, &self.cancel).await {
            Ok(r) => r,
            Err(ModelError::Cancelled) => return Err(self.cancelled_outcome()),
            Err(e) => {
                tracing::warn!(run_id = %self.req.run_id, "model error ends the run: {e}");
                return Err((RunState::Failed, e.to_string(), "error"));
            }
        };
        let message = reply.message();
        self.push(message.clone());
        let mut logged = message.to_json();
        artifacts::elide_saved_content(&mut logged);
        let _ = self
            .emit(
                event::MODEL_ANSWERED,
                json!({"turn": turn, "message": logged, "usage": reply.usage, "stop_reason": reply.stop_reason}),
                false,
            )
            .await;
        Ok(reply)
    }

    fn max_turns_outcome(&self) -> (RunState, String, &'static str) {
        let max_turns = self.h.bundle.harness.limits.max_turns.max(1);
        (
            RunState::Failed,
            format!(
                "the run stopped after {max_turns} model turns without a final answer (limits.maxTurns in x-agen/harness.json); raise the limit or make the task smaller"
            ),
            "error",
        )
    }

    async fn native_loop(&self) -> (RunState, String, &'static str) {
        let tools = self.h.tool_specs();
        let max_turns = self.h.bundle.harness.limits.max_turns.max(1);
        let first_turn = match self.replay_native().await {
            Ok(t) => t,
            Err(end) => return end,
        };
        for turn in first_turn..=max_turns {
            let reply = match self.ask(turn, &self.h.system_prompt, &tools).await {
                Ok(r) => r,
                Err(end) => return end,
            };
            if reply.tool_calls.is_empty() {
                return (RunState::Succeeded, reply.text, "text");
            }
            let results = self.run_calls(&reply.tool_calls).await;
            let mut finish = None;
            for (call, r) in reply.tool_calls.iter().zip(results) {
                if finish.is_none() {
                    finish = r.finish.clone();
                }
                self.push(Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: r.content,
                    is_error: r.is_error,
                });
            }
            if self.cancel.is_cancelled() {
                return self.cancelled_outcome();
            }
            if let Some(result) = finish {
                return (RunState::Succeeded, result, "text");
            }
        }
        self.max_turns_outcome()
    }

    /// Rebuilds the context from the events of earlier attempts (DESIGN.md "Durability"):
    /// answered turns are not asked again, recorded results are reused, an interrupted
    /// side-effecting call is reported to the model as `effect_unknown`, and an interrupted
    /// read-only or idempotent call (or one never sent) is run again. Returns the next turn, or
    /// the run's end when the log already holds it.
    async fn replay_native(&self) -> Result<u32, (RunState, String, &'static str)> {
        if self.req.replay.is_empty() {
            return Ok(1);
        }
        let mut turns: Vec<(u32, Message)> = Vec::new();
        let mut results: HashMap<String, (String, bool)> = HashMap::new();
        let mut started: HashMap<String, bool> = HashMap::new();
        for ev in &self.req.replay {
            let j = &ev.json;
            let call_id = j
                .get("call_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            match ev.kind.as_str() {
                event::RUN_FINISHED => {
                    let state = match j.get("state").and_then(Value::as_str) {
                        Some("succeeded") => RunState::Succeeded,
                        Some("cancelled") => RunState::Cancelled,
                        _ => RunState::Failed,
                    };
                    let response_type =
                        if j.get("response_type").and_then(Value::as_str) == Some("text") {
                            "text"
                        } else {
                            "error"
                        };
                    let result = j
                        .get("result")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    return Err((state, result, response_type));
                }
                event::MODEL_ANSWERED => {
                    let turn = j
                        .get("turn")
                        .and_then(Value::as_u64)
                        .and_then(|t| u32::try_from(t).ok());
                    let message = j
                        .get("message")
                        .cloned()
                        .and_then(|m| serde_json::from_value::<Message>(m).ok());
                    if let (Some(turn), Some(message)) = (turn, message) {
                        turns.push((turn, message));
                    }
                }
                event::TOOL_STARTED => {
                    started.insert(
                        call_id,
                        j.get("side_effect")
                            .and_then(Value::as_bool)
                            .unwrap_or(true),
                    );
                }
                event::TOOL_COMPLETED => {
                    let text = j
                        .get("result")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    results.insert(
                        call_id,
                        (
                            text,
                            j.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                        ),
                    );
                }
                // A call cut off by a cancel or a crash has no real result.
                event::TOOL_FAILED
                    if j.get("reason").and_then(Value::as_str) != Some("cancelled") =>
                {
                    let text = j
                        .get("error")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    results.insert(call_id, (text, true));
                }
                _ => {}
            }
        }
        let Some(last_turn) = turns.last().map(|(t, _)| *t) else {
            return Ok(1);
        };
        self.activity(format!(
            "resuming at turn {} (attempt {})",
            last_turn + 1,
            self.req.attempt
        ))
        .await;
        for (_, message) in turns {
            let calls = match &message {
                Message::Assistant { tool_calls, .. } => tool_calls.clone(),
                _ => Vec::new(),
            };
            let answer = match &message {
                Message::Assistant {
                    content,
                    tool_calls,
                } if tool_calls.is_empty() => Some(content.clone()),
                _ => None,
            };
            self.push(message);
            if let Some(text) = answer {
                return Err((RunState::Succeeded, text, "text"));
            }
            let mut finish = None;
            for call in &calls {
                let (content, is_error) = if let Some((text, is_error)) = results.get(&call.id) {
                    (text.clone(), *is_error)
                } else if started.get(&call.id).copied().unwrap_or(false)
                    && !self.retry_safe(&call.name)
                {
                    let content = effect_unknown_message(&call.name);
                    let _ = self
                        .emit(event::TOOL_FAILED, json!({"call_id": call.id, "tool": call.name, "error": content, "reason": "effect_unknown", "duration_ms": 0}), true)
                        .await;
                    (content, true)
                } else {
                    let r = self.run_call(call).await;
                    if finish.is_none() {
                        finish = r.finish.clone();
                    }
                    (r.content, r.is_error)
                };
                self.push(Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content,
                    is_error,
                });
            }
            if let Some(result) = finish {
                return Err((RunState::Succeeded, result, "text"));
            }
        }
        Ok(last_turn + 1)
    }

    /// Whether an interrupted call to this model-facing tool may simply be sent again: a
    /// read-only or idempotent MCP tool (server hints, overridden by `x-agen/config.json`).
    fn retry_safe(&self, model_name: &str) -> bool {
        let Some(tool) = self.h.mcp_tools.get(model_name) else {
            return true;
        };
        let over = self.h.bundle.config.tool_override(&tool.qualified_name());
        let side_effect = over.and_then(|o| o.side_effect).unwrap_or(!tool.read_only);
        let idempotent = over.and_then(|o| o.idempotent).unwrap_or(tool.idempotent);
        !side_effect || idempotent
    }

    /// The Keen text protocol: no native tools; the tools section is in the system prompt;
    /// each reply is parsed for one `<SYSTEM CALL>` block; results go back as user prompts.
    async fn keen_loop(&self) -> (RunState, String, &'static str) {
        use crate::keen::{
            parse_reply, recall_prompt, Decision, KeenRun, ToolResult, ToolTable, ToolTarget,
        };

        let keen = self.h.keen.as_deref();
        let mut table = ToolTable::from_bundle(keen);
        for spec in self.h.tool_specs() {
            table.add_native(
                &spec.name,
                &spec.description,
                &crate::keen::native_context_hint(&spec.parameters),
            );
        }
        let section = crate::keen::tools_section(&table.specs());
        let system = if section.is_empty() {
            self.h.system_prompt.clone()
        } else {
            format!("{}\n\n{section}", self.h.system_prompt)
        };
        let limits = &self.h.bundle.harness.limits;
        let script_limits = crate::keen::ScriptLimits {
            timeout: limits.script_timeout,
            memory_bytes: (limits.script_memory_mb as usize).saturating_mul(1024 * 1024),
            ..Default::default()
        };
        let mut ledger = KeenRun::new(limits.max_tool_calls);
        let max_turns = limits.max_turns.max(1);
        // A resumed run replays the log: answered turns go through the same decisions (so the
        // ledger of calls is rebuilt) without asking the model, recorded results are reused.
        let mut replay = KeenReplay::from_events(&self.req.replay);
        if let Some(end) = replay.finished.take() {
            return end;
        }
        if let Some(last) = replay.turns.keys().max() {
            self.activity(format!(
                "resuming at turn {} (attempt {})",
                last + 1,
                self.req.attempt
            ))
            .await;
        }
        for turn in 1..=max_turns {
            let reply_text = if let Some(message) = replay.turns.remove(&turn) {
                let text = match &message {
                    Message::Assistant { content, .. } => content.clone(),
                    _ => String::new(),
                };
                self.push(message);
                text
            } else {
                match self.ask(turn, &system, &[]).await {
                    Ok(r) => r.text,
                    Err(end) => return end,
                }
            };
            let dispatch = match ledger.decide(&parse_reply(&reply_text), &table) {
                Decision::Answer => return (RunState::Succeeded, reply_text, "text"),
                Decision::Stop { log } => {
                    tracing::warn!(run_id = %self.req.run_id, "{log}");
                    return (
                        RunState::Failed,
                        format!("the run reached its limit of {} tool calls (limits.maxToolCalls in x-agen/harness.json)", limits.max_tool_calls),
                        "error",
                    );
                }
                Decision::Recall { prompt, log } => {
                    tracing::info!(run_id = %self.req.run_id, "{log}");
                    self.push(Message::user(prompt));
                    continue;
                }
                Decision::Dispatch(d) => d,
            };
            let call_id = format!("keen_{turn}");
            let replayed = self.keen_replayed(&mut replay, &call_id, &dispatch).await;
            let result: ToolResult = match (replayed, &dispatch.target) {
                (Some(r), _) => r,
                (None, ToolTarget::Native { arguments }) => {
                    let call = ToolCall {
                        id: call_id,
                        name: dispatch.tool.clone(),
                        arguments: Value::Object(arguments.clone()),
                    };
                    let r = self.run_call(&call).await;
                    if let Some(result) = r.finish {
                        return (RunState::Succeeded, result, "text");
                    }
                    if r.unreachable {
                        ToolResult::TechnicalError(r.content)
                    } else if r.is_error {
                        ToolResult::ScriptError(r.content)
                    } else {
                        ToolResult::Answer(r.content)
                    }
                }
                (None, ToolTarget::Script { entry }) => {
                    let Some(keen) = keen else {
                        return (
                            RunState::Failed,
                            "keen script tool without keen-tools.json".into(),
                            "error",
                        );
                    };
                    let _ = self
                        .emit(event::TOOL_STARTED, json!({"call_id": call_id, "tool": dispatch.tool, "kind": "script", "side_effect": false}), false)
                        .await;
                    self.activity(format!("running script tool {}", dispatch.tool))
                        .await;
                    let started = Instant::now();
                    let outcome = crate::keen::run_script_tool(
                        &keen.script_root,
                        entry,
                        &dispatch.context,
                        &script_limits,
                    )
                    .await;
                    let result = ToolResult::from(outcome);
                    self.keen_tool_event(&call_id, &dispatch.tool, &result, started)
                        .await;
                    result
                }
                (
                    None,
                    ToolTarget::Flow {
                        controller,
                        start_node,
                    },
                ) => {
                    let Some(keen) = keen else {
                        return (
                            RunState::Failed,
                            "keen flow tool without keen-tools.json".into(),
                            "error",
                        );
                    };
                    let _ = self
                        .emit(event::TOOL_STARTED, json!({"call_id": call_id, "tool": dispatch.tool, "kind": "flow", "side_effect": false}), false)
                        .await;
                    self.activity(format!("running flow tool {}", dispatch.tool))
                        .await;
                    let started = Instant::now();
                    let agent = FlowModel { run: self };
                    // Each script node has its own limit; the flow as a whole gets the
                    // run's tool timeout, like any other tool call.
                    let tool_timeout = self.h.bundle.harness.limits.tool_timeout;
                    let result = match tokio::time::timeout(
                        tool_timeout,
                        crate::keen::run_flow(
                            keen,
                            controller,
                            start_node,
                            &dispatch.context,
                            &agent,
                            &script_limits,
                        ),
                    )
                    .await
                    {
                        Ok(outcome) => ToolResult::from(outcome),
                        Err(_) => ToolResult::NoResponse(format!(
                            "flow {} ran past the tool timeout of {tool_timeout:?}",
                            dispatch.tool
                        )),
                    };
                    self.keen_tool_event(&call_id, &dispatch.tool, &result, started)
                        .await;
                    result
                }
            };
            if self.cancel.is_cancelled() {
                return self.cancelled_outcome();
            }
            if !matches!(result, ToolResult::Answer(_)) {
                tracing::info!(run_id = %self.req.run_id, tool = %dispatch.tool, "keen: {}", result.log_detail());
            }
            self.push(Message::user(recall_prompt(
                &result,
                dispatch.attempts_left,
            )));
            *lock(&self.next_turn_activity) =
                Some(format!("reading the result of {}", dispatch.tool));
        }
        self.max_turns_outcome()
    }

    /// The result of a Keen call the log of an earlier attempt already settles: its recorded
    /// result, or `effect_unknown` for an interrupted side-effecting native call (not sent
    /// again). `None`: run the call (never started, or read-only, idempotent, script, flow).
    async fn keen_replayed(
        &self,
        replay: &mut KeenReplay,
        call_id: &str,
        dispatch: &crate::keen::ToolDispatch,
    ) -> Option<crate::keen::ToolResult> {
        if let Some(r) = replay.results.remove(call_id) {
            return Some(r);
        }
        let side_effect = replay.started.remove(call_id)?;
        let native = matches!(dispatch.target, crate::keen::ToolTarget::Native { .. });
        if !side_effect || !native || self.retry_safe(&dispatch.tool) {
            return None;
        }
        let content = effect_unknown_message(&dispatch.tool);
        let _ = self
            .emit(event::TOOL_FAILED, json!({"call_id": call_id, "tool": dispatch.tool, "error": content, "reason": "effect_unknown", "duration_ms": 0}), true)
            .await;
        Some(crate::keen::ToolResult::ScriptError(content))
    }

    async fn keen_tool_event(
        &self,
        call_id: &str,
        tool: &str,
        result: &crate::keen::ToolResult,
        started: Instant,
    ) {
        use crate::keen::ToolResult;
        let duration_ms = started.elapsed().as_millis() as u64;
        let (kind, payload) = match result {
            ToolResult::Answer(text) => (
                event::TOOL_COMPLETED,
                json!({"call_id": call_id, "tool": tool, "result": text, "is_error": false, "duration_ms": duration_ms}),
            ),
            ToolResult::ScriptError(text) => (
                event::TOOL_COMPLETED,
                json!({"call_id": call_id, "tool": tool, "result": text, "is_error": true, "keen_result": "script_error", "duration_ms": duration_ms}),
            ),
            ToolResult::FlowError(text) => (
                event::TOOL_COMPLETED,
                json!({"call_id": call_id, "tool": tool, "result": text, "is_error": true, "keen_result": "flow_error", "duration_ms": duration_ms}),
            ),
            ToolResult::TechnicalError(text) => (
                event::TOOL_FAILED,
                json!({"call_id": call_id, "tool": tool, "error": result.log_detail(), "reason": "failed", "keen_result": "technical_error", "keen_text": text, "duration_ms": duration_ms}),
            ),
            ToolResult::NoResponse(_) => (
                event::TOOL_FAILED,
                json!({"call_id": call_id, "tool": tool, "error": result.log_detail(), "reason": "failed", "keen_result": "no_response", "duration_ms": duration_ms}),
            ),
        };
        let _ = self.emit(kind, payload, false).await;
    }

    /// Runs one turn's calls, concurrently unless `parallelToolCalls` is false; results in
    /// the order asked.
    async fn run_calls(&self, calls: &[ToolCall]) -> Vec<CallResult> {
        if self.h.bundle.harness.parallel_tool_calls && calls.len() > 1 {
            futures::future::join_all(calls.iter().map(|c| self.run_call(c))).await
        } else {
            let mut out = Vec::with_capacity(calls.len());
            for c in calls {
                out.push(self.run_call(c).await);
            }
            out
        }
    }

    async fn run_call(&self, call: &ToolCall) -> CallResult {
        let err = |content: String| CallResult {
            content,
            is_error: true,
            unreachable: false,
            finish: None,
        };
        if self.cancel.is_cancelled() {
            return err(format!(
                "tool {} was not run: the run was cancelled",
                call.name
            ));
        }
        match call.name.as_str() {
            BUILTIN_FINISH => {
                let result = match call.arguments.get("result") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => match &call.arguments {
                        Value::String(s) => s.clone(),
                        _ => {
                            return err("finish needs `result`: the final answer as a string".into())
                        }
                    },
                };
                CallResult {
                    content: "finished".into(),
                    is_error: false,
                    unreachable: false,
                    finish: Some(result),
                }
            }
            BUILTIN_LOAD_SKILL if !self.h.bundle.skills.is_empty() => {
                let name = call
                    .arguments
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let available = || {
                    self.h
                        .bundle
                        .skills
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                match self.h.bundle.skill(name) {
                    Some(s) => {
                        self.activity(format!("loading skill {name}")).await;
                        CallResult {
                            content: s.body.clone(),
                            is_error: false,
                            unreachable: false,
                            finish: None,
                        }
                    }
                    None => err(format!(
                        "no skill named `{name}`; available skills: {}",
                        available()
                    )),
                }
            }
            BUILTIN_REPORT_PROGRESS if self.h.progress => self.report_progress(call).await,
            BUILTIN_SAVE_ARTIFACT => self.save_artifact(call).await,
            BUILTIN_READ_ARTIFACT => self.read_artifact(call).await,
            name => match self.h.mcp_tools.get(name) {
                Some(tool) => self.call_mcp(call, tool).await,
                None => {
                    let mut names: Vec<String> =
                        self.h.tool_specs().into_iter().map(|s| s.name).collect();
                    names.sort();
                    let content = format!(
                        "unknown tool `{name}`; the available tools are: {}",
                        names.join(", ")
                    );
                    let _ = self
                        .emit(event::TOOL_FAILED, json!({"call_id": call.id, "tool": name, "error": content, "reason": "unknown_tool", "duration_ms": 0}), false)
                        .await;
                    err(content)
                }
            },
        }
    }

    async fn report_progress(&self, call: &ToolCall) -> CallResult {
        let Some(step) = call.arguments.get("step").and_then(Value::as_str) else {
            return CallResult {
                content: "report_progress needs `step`: what you are doing now".into(),
                is_error: true,
                unreachable: false,
                finish: None,
            };
        };
        self.activity(step.to_string()).await;
        let send = {
            let mut p = lock(&self.last_progress);
            if p.0.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                *p = (Some(Instant::now()), None);
                true
            } else {
                // Held back; the latest report goes out later (see `flush_progress`).
                p.1 = Some(call.arguments.clone());
                false
            }
        };
        if send {
            let _ = self
                .emit(event::TASK_PROGRESS, call.arguments.clone(), false)
                .await;
        }
        CallResult {
            content: "progress recorded".into(),
            is_error: false,
            unreachable: false,
            finish: None,
        }
    }

    async fn call_mcp(&self, call: &ToolCall, tool: &ToolInfo) -> CallResult {
        let qualified = tool.qualified_name();
        let started_at = Instant::now();
        let side_effect = self
            .h
            .bundle
            .config
            .tool_override(&qualified)
            .and_then(|o| o.side_effect)
            .unwrap_or(!tool.read_only);
        let fail = |content: String| CallResult {
            content,
            is_error: true,
            unreachable: false,
            finish: None,
        };

        let arguments = match &call.arguments {
            Value::Object(o) => o.clone(),
            other => {
                let content = format!(
                    "the arguments of {} must be a JSON object, got: {other}",
                    call.name
                );
                let _ = self
                    .emit(event::TOOL_FAILED, json!({"call_id": call.id, "tool": qualified, "error": content, "reason": "bad_arguments", "duration_ms": 0}), false)
                    .await;
                return fail(content);
            }
        };
        let limit = self.h.bundle.harness.limits.max_tool_calls;
        let n = self
            .tool_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if n > limit {
            let content = format!("the run's limit of {limit} tool calls is spent (limits.maxToolCalls); {} was not called; answer with what you have", call.name);
            let _ = self
                .emit(event::TOOL_FAILED, json!({"call_id": call.id, "tool": qualified, "error": content, "reason": "limit", "duration_ms": 0}), false)
                .await;
            return fail(content);
        }

        let mut started = json!({"call_id": call.id, "tool": qualified, "model_name": call.name, "side_effect": side_effect});
        if self.h.bundle.harness.trace_tool_arguments {
            // Traces show arguments only when the bundle asks (they may hold personal data);
            // a resume reads them from the model.answered message instead.
            started["arguments"] = traced_arguments(&call.arguments, &self.h.secret_values);
        }
        if let Err(e) = self.emit(event::TOOL_STARTED, started, side_effect).await {
            // A side-effecting call is never sent before its start is durable.
            return fail(format!("tool {qualified} was not called: {e}"));
        }
        self.activity(format!("calling {qualified}")).await;

        let timeout = self.h.bundle.harness.limits.tool_timeout;
        let result = self
            .h
            .tools
            .call_tool(tool, arguments, self.meta(), timeout, self.cancel.clone())
            .await;
        let duration_ms = started_at.elapsed().as_millis() as u64;
        let (kind, payload, out) = match result {
            Ok(o) => {
                // A tool that echoes a secret (a header, a DSN) does not leak it into the run
                // log, the trace or the model's context.
                let text = redact_secrets(o.text, &self.h.secret_values);
                (
                    event::TOOL_COMPLETED,
                    json!({"call_id": call.id, "tool": qualified, "result": text, "is_error": o.is_error, "duration_ms": duration_ms}),
                    CallResult {
                        content: text,
                        is_error: o.is_error,
                        unreachable: false,
                        finish: None,
                    },
                )
            }
            Err(e) => {
                let (reason, content) = match &e {
                    CallError::Timeout(d) => (
                        "timeout",
                        format!(
                            "tool {qualified} timed out after {} and was cancelled",
                            agen_shared::duration::format_duration(*d)
                        ),
                    ),
                    CallError::Cancelled => (
                        "cancelled",
                        format!("tool {qualified} was cancelled with the run"),
                    ),
                    CallError::NotConnected(server) => (
                        "failed",
                        format!(
                            "tool {qualified} cannot run: its server {server} is not connected"
                        ),
                    ),
                    CallError::UnknownTool(_) => (
                        "unknown_tool",
                        format!("tool {qualified} is not available on its server"),
                    ),
                    CallError::Failed { message, .. } => {
                        ("failed", format!("tool {qualified} failed: {message}"))
                    }
                    other => ("failed", format!("tool {qualified} failed: {other}")),
                };
                let unreachable = matches!(reason, "timeout" | "cancelled")
                    || matches!(e, CallError::NotConnected(_));
                (
                    event::TOOL_FAILED,
                    json!({"call_id": call.id, "tool": qualified, "error": content, "reason": reason, "duration_ms": duration_ms}),
                    CallResult {
                        content,
                        is_error: true,
                        unreachable,
                        finish: None,
                    },
                )
            }
        };
        if let Err(e) = self.emit(kind, payload, side_effect).await {
            tracing::warn!(run_id = %self.req.run_id, tool = %qualified, "tool result not durable: {e}");
            // The model must not act on a side-effecting result the ledger does not hold.
            if !matches!(e, SinkError::Fenced) {
                *lock(&self.log_lost) = Some(format!(
                    "the run stopped: the result of {qualified} could not be recorded in the run log ({e})"
                ));
            }
            self.cancel.cancel();
        }
        out
    }

    /// `_meta` of an MCP call: the work it belongs to and a fresh span of this run's trace.
    fn meta(&self) -> Map<String, Value> {
        let r = self.req;
        let labels: Map<String, Value> = r
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let span: u64 = loop {
            let s = rand::random::<u64>();
            if s != 0 {
                break s;
            }
        };
        let mut m = Map::new();
        m.insert("agen/namespace".into(), json!(r.namespace));
        m.insert("agen/deployment".into(), json!(r.deployment));
        m.insert("agen/taskId".into(), json!(r.task_id));
        m.insert("agen/runId".into(), json!(r.run_id));
        m.insert(
            "agen/rootRunId".into(),
            json!(if r.root_run_id.is_empty() {
                &r.run_id
            } else {
                &r.root_run_id
            }),
        );
        m.insert("agen/conversationId".into(), json!(r.conversation_id));
        m.insert("agen/conversationKey".into(), json!(r.conversation_key));
        m.insert("agen/labels".into(), Value::Object(labels));
        m.insert(
            "traceparent".into(),
            json!(format!("00-{}-{span:016x}-01", self.trace_id)),
        );
        m
    }

    /// Emits `run.finished` and builds the outcome.
    async fn finish(self, state: RunState, result: String, response_type: &str) -> RunOutcome {
        self.flush_progress(true).await;
        // Every call the model made gets an answer, so the history stays valid.
        let mut answered: HashMap<String, ()> = HashMap::new();
        let mut pending = Vec::new();
        for m in lock(&self.new_messages).iter() {
            match m {
                Message::Assistant { tool_calls, .. } => {
                    pending.extend(tool_calls.iter().map(|c| (c.id.clone(), c.name.clone())))
                }
                Message::Tool { call_id, .. } => {
                    answered.insert(call_id.clone(), ());
                }
                _ => {}
            }
        }
        for (id, name) in pending {
            if !answered.contains_key(&id) {
                self.push(Message::Tool {
                    call_id: id,
                    name,
                    content: "not run: the run ended first".into(),
                    is_error: true,
                });
            }
        }
        let _ = self
            .emit(
                event::RUN_FINISHED,
                json!({"state": state.as_str(), "result": result, "response_type": response_type}),
                true,
            )
            .await;
        let _ = &self.caller_cancel;
        let messages = lock(&self.new_messages)
            .iter()
            .map(|m| {
                let mut j = m.to_json();
                artifacts::elide_saved_content(&mut j);
                j
            })
            .collect();
        RunOutcome {
            state,
            result,
            response_type: response_type.to_string(),
            messages,
        }
    }
}

/// The bundle's model as a Keen flow's `agent` nodes see it: one request with the agent's
/// system prompt and the node's prompt (plus the flow's context), logged like any model turn.
struct FlowModel<'r, 'h> {
    run: &'r Run<'h>,
}

#[async_trait::async_trait]
impl crate::keen::FlowAgent for FlowModel<'_, '_> {
    async fn ask(&self, prompt: &str, context: &str) -> Result<(String, String), String> {
        let text = if context.trim().is_empty() {
            prompt.to_string()
        } else {
            format!("{prompt}\n\n{context}")
        };
        let request = ModelRequest {
            system: self.run.h.system_prompt.clone(),
            messages: vec![Message::user(text)],
            tools: Vec::new(),
            parallel_tool_calls: false,
        };
        let _ = self
            .run
            .emit(event::MODEL_REQUESTED, json!({"flow_agent": true}), false)
            .await;
        match self
            .run
            .h
            .provider
            .complete(&request, &self.run.cancel)
            .await
        {
            Ok(reply) => {
                let _ = self
                    .run
                    .emit(event::MODEL_ANSWERED, json!({"flow_agent": true, "message": reply.message().to_json(), "usage": reply.usage}), false)
                    .await;
                Ok((reply.text, "text".to_string()))
            }
            Err(ModelError::Cancelled) => Err("the run was cancelled".to_string()),
            Err(e) => Ok((e.to_string(), "error".to_string())),
        }
    }
}

/// `text` with every secret value of the instance replaced by `[redacted]`. Values shorter than
/// 4 characters are left alone: they would redact ordinary words.
fn redact_secrets(text: String, secrets: &[String]) -> String {
    let mut text = text;
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        if text.contains(s.as_str()) {
            text = text.replace(s.as_str(), "[redacted]");
        }
    }
    text
}

/// Tool arguments as traces record them: secret values replaced by `[redacted]`, cut at 4 KiB.
fn traced_arguments(arguments: &Value, secrets: &[String]) -> Value {
    const MAX: usize = 4096;
    let mut text = arguments.to_string();
    for s in secrets {
        text = text.replace(s.as_str(), "[redacted]");
    }
    if text.len() <= MAX {
        return serde_json::from_str(&text).unwrap_or(Value::String(text));
    }
    let mut cut = MAX;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!("{}… (cut at 4 KiB)", &text[..cut]))
}

/// The artifact built-ins (see `crate::artifacts`): never gated by config or permissions.
impl Run<'_> {
    async fn save_artifact(&self, call: &ToolCall) -> CallResult {
        let answer = |content: String, is_error: bool| CallResult {
            content,
            is_error,
            unreachable: false,
            finish: None,
        };
        let args = &call.arguments;
        let Some(name) = args
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
        else {
            return answer(
                "save_artifact needs `name`: a short name for the artifact, e.g. weekly-report"
                    .into(),
                true,
            );
        };
        let content = match args.get("content") {
            Some(Value::String(s)) => s.clone(),
            None if args.get("content_artifact").is_some() => {
                return self.saved_by_reference(call).await
            }
            Some(Value::Null) | None => {
                return answer(
                    "save_artifact needs `content`: the text to save".into(),
                    true,
                )
            }
            Some(other) => other.to_string(),
        };
        let media_type = args
            .get("mediaType")
            .or_else(|| args.get("media_type"))
            .and_then(Value::as_str)
            .filter(|m| !m.trim().is_empty())
            .unwrap_or(artifacts::DEFAULT_MEDIA_TYPE)
            .to_string();
        if let Err(e) = artifacts::check_size(name, content.len() as u64) {
            return answer(e.to_string(), true);
        }
        let _ = self
            .emit(
                event::TOOL_STARTED,
                json!({"call_id": call.id, "tool": BUILTIN_SAVE_ARTIFACT, "model_name": BUILTIN_SAVE_ARTIFACT, "side_effect": false}),
                false,
            )
            .await;
        self.activity(format!("saving artifact {name}")).await;
        let saved = self
            .h
            .artifacts
            .save(NewArtifact {
                namespace: self.req.namespace.clone(),
                task_id: self.req.task_id.clone(),
                run_id: self.req.run_id.clone(),
                name: name.to_string(),
                media_type,
                content: content.into_bytes(),
            })
            .await;
        match saved {
            Ok(meta) => {
                let _ = self
                    .emit(
                        event::ARTIFACT_SAVED,
                        json!({"id": meta.id, "name": name, "media_type": meta.media_type, "size": meta.size}),
                        false,
                    )
                    .await;
                // Recorded, so a resumed run reuses the id instead of saving again (its log
                // may hold the content by id only, see `elide_saved_content`).
                let _ = self
                    .emit(
                        event::TOOL_COMPLETED,
                        json!({"call_id": call.id, "tool": BUILTIN_SAVE_ARTIFACT, "result": meta.id, "is_error": false, "duration_ms": 0}),
                        false,
                    )
                    .await;
                answer(meta.id, false)
            }
            Err(e) => {
                let content = format!("save_artifact failed: {e}");
                let _ = self
                    .emit(
                        event::TOOL_FAILED,
                        json!({"call_id": call.id, "tool": BUILTIN_SAVE_ARTIFACT, "error": content, "reason": "failed", "duration_ms": 0}),
                        false,
                    )
                    .await;
                answer(content, true)
            }
        }
    }

    /// A `save_artifact` call whose content a resumed run's log holds by id only: the
    /// artifact is either stored already (its id is the answer) or the content is gone.
    async fn saved_by_reference(&self, call: &ToolCall) -> CallResult {
        let id = call
            .arguments
            .get("content_artifact")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let (content, is_error) = match self.h.artifacts.read(&self.req.namespace, id).await {
            Ok(_) => (id.to_string(), false),
            Err(_) => (
                "save_artifact was interrupted before its content was stored, and the run log keeps only its digest; call save_artifact again with the content".to_string(),
                true,
            ),
        };
        CallResult {
            content,
            is_error,
            unreachable: false,
            finish: None,
        }
    }

    async fn read_artifact(&self, call: &ToolCall) -> CallResult {
        let answer = |content: String, is_error: bool| CallResult {
            content,
            is_error,
            unreachable: false,
            finish: None,
        };
        let args = &call.arguments;
        let Some(id) = args.get("id").and_then(Value::as_str) else {
            return answer(
                "read_artifact needs `id`: the sha256:<hex> id save_artifact returned".into(),
                true,
            );
        };
        let number = |key: &str| -> Result<Option<usize>, String> {
            match args.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                    .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
                    .ok_or_else(|| {
                        format!(
                            "read_artifact: `{key}` must be a whole number of characters, got {v}"
                        )
                    }),
            }
        };
        let (offset, length) = match (number("offset"), number("length")) {
            (Ok(o), Ok(l)) => (o.unwrap_or(0), l),
            (Err(e), _) | (_, Err(e)) => return answer(e, true),
        };
        match self.h.artifacts.read(&self.req.namespace, id).await {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                answer(artifacts::page(id, &text, offset, length), false)
            }
            Err(e) => answer(format!("read_artifact failed: {e}"), true),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_never_carry_a_secret_value() {
        let secrets = vec!["postgres://app:pw@db/app".to_string(), "abc".to_string()];
        assert_eq!(
            redact_secrets(
                "connected to postgres://app:pw@db/app as abc".into(),
                &secrets
            ),
            "connected to [redacted] as abc"
        );
    }

    #[test]
    fn traced_arguments_are_redacted_and_capped() {
        let secrets = vec!["s3cr3t-token".to_string()];
        assert_eq!(
            traced_arguments(&json!({"auth": "Bearer s3cr3t-token", "n": 1}), &secrets),
            json!({"auth": "Bearer [redacted]", "n": 1})
        );
        let long = traced_arguments(&json!({"text": "é".repeat(5000)}), &secrets);
        let text = long.as_str().expect("cut arguments are a string");
        assert!(
            text.ends_with("… (cut at 4 KiB)") && text.len() < 4200,
            "{}",
            text.len()
        );
    }

    #[test]
    fn tool_schemas_are_object_schemas() {
        assert_eq!(
            object_schema(&json!({"type": "object", "properties": {}})),
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(
            object_schema(&json!({"properties": {"a": {}}})),
            json!({"properties": {"a": {}}, "type": "object"})
        );
        assert_eq!(
            object_schema(&Value::Null),
            json!({"type": "object", "properties": {}})
        );
    }
}
