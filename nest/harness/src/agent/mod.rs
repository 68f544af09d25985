//! The embedded agent: [`Agent`], an agent inside your own program, on the same harness as a
//! fleet instance and `agen run` (same bundle validation, tool gate, effect ledger, replay).
//!
//! Public API (re-exported by the `agen` crate): [`Agent::from_bundle`] / [`Agent::builder`]
//! ([`AgentBuilder`]), host tools ([`Tool`], or any [`crate::run::HostTool`]), runs
//! ([`Agent::run`] → [`Outcome`], [`Agent::run_stream`] → [`RunStream`] of typed run events,
//! [`RunStream::with_deltas`] → [`RunItems`] with the model's answer as it streams,
//! [`RunOptions`] for a cancellation token and labels, [`Agent::conversation`]), the local run
//! log ([`AgentBuilder::run_log`], [`Agent::resume`], [`Agent::unfinished_runs`]) and artifacts
//! ([`AgentBuilder::artifacts_dir`], [`Agent::read_artifact`]).
//!
//! Files by concern: `builder` (definitions, validation, start), `tool` (closure tools and
//! derived schemas), `delegate` (an agent as another agent's tool), `stream` (the run's sink and stream), `log` (run folders, conversations).
//!
//! Invariants: an embedded run is a [`Harness::run`] like any other (no second loop here); with
//! a run log, a run's assignment and every event are in its folder before they matter to the
//! ledger, so a run a crash interrupted resumes with the fleet's guarantees (a completed
//! side-effecting call is never sent again, an interrupted one is reported `effect_unknown`).
//! No gRPC, no Hub and no Nest here.

mod builder;
mod delegate;
mod log;
mod stream;
mod tool;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agen_contract::run::{ArtifactSaved, RunFinished, Usage};
use agen_shared::bundle::BundleError;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use builder::AgentBuilder;
pub use stream::{RunItem, RunItems, RunStream};
pub use tool::{schema_of, Tool, ToolBuilder};

use crate::artifacts::ArtifactStore;
use crate::mcp::ToolHost;
use crate::run::{
    Harness, HarnessError, Message, ResponseType, RunAssignment, RunEventBody, RunState,
};
use stream::{Tally, Tee};

/// The namespace embedded runs report in `_meta` (`agen/namespace`) and keep artifacts under.
pub const EMBEDDED_NAMESPACE: &str = "embedded";

/// Why an agent could not be built or a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The definition is not valid: the same message `agen deploy` gives.
    #[error("{0}")]
    Bundle(#[from] BundleError),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Harness(#[from] HarnessError),
    #[error("while {what} {}: {source}", path.display())]
    Io {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("run log {0}")]
    RunLog(String),
    #[error(
        "this agent keeps no run log; build it with AgentBuilder::run_log(dir) to resume runs"
    )]
    NoRunLog,
    #[error("run {run_id} is not in the run log {}; Agent::unfinished_runs lists the runs there", dir.display())]
    UnknownRun { run_id: String, dir: PathBuf },
    #[error("{0}")]
    Run(String),
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub run_id: String,
    pub state: RunState,
    /// The final answer, or what went wrong.
    pub result: String,
    pub response_type: ResponseType,
    /// Tokens over every model turn of the run (all attempts).
    pub usage: Usage,
    /// The artifacts the run saved (read them with [`Agent::read_artifact`]).
    pub artifacts: Vec<ArtifactSaved>,
    /// The messages the run added to its conversation.
    pub messages: Vec<Message>,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.state == RunState::Succeeded
    }
}

/// Settings of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    cancel: Option<CancellationToken>,
    conversation: Option<String>,
    labels: BTreeMap<String, String>,
    run_id: Option<String>,
    /// The root of the delegation tree, when this run is another agent's delegate call.
    root_run_id: Option<String>,
}

impl RunOptions {
    pub fn new() -> RunOptions {
        RunOptions::default()
    }

    /// Cancelling `token` stops the run: a tool call in flight is stopped (its future
    /// dropped, an MCP call gets a cancel notification) and the run ends `cancelled`.
    pub fn cancel(mut self, token: CancellationToken) -> RunOptions {
        self.cancel = Some(token);
        self
    }

    /// Continues conversation `key` (see [`Agent::conversation`]).
    pub fn conversation(mut self, key: impl Into<String>) -> RunOptions {
        self.conversation = Some(key.into());
        self
    }

    /// A label, passed to tools in `_meta` (`agen/labels`).
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> RunOptions {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The run's id (default: a fresh UUIDv7); the name of its run-log folder.
    pub fn run_id(mut self, id: impl Into<String>) -> RunOptions {
        self.run_id = Some(id.into());
        self
    }
}

/// An agent inside this program. Cheap to clone; runs may go on concurrently.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    harness: Harness,
    host: ToolHost,
    name: String,
    namespace: String,
    run_log: Option<PathBuf>,
    artifacts: Arc<dyn ArtifactStore>,
    /// Conversation histories when there is no run log.
    conversations: Mutex<HashMap<String, Vec<Message>>>,
}

impl Agent {
    /// The agent's name (`name` in `x-agen/agent.md`, or the bundle folder's name).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// `openai/gpt-4.1-mini`.
    pub fn model(&self) -> String {
        self.inner.harness.model()
    }

    /// The system prompt every run starts with.
    pub fn system_prompt(&self) -> &str {
        self.inner.harness.system_prompt()
    }

    /// The names of the tools offered to the model: MCP tools, host tools, built-ins.
    pub fn tool_names(&self) -> Vec<String> {
        self.inner
            .harness
            .tool_specs()
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    /// MCP servers of the definition that did not start, with why.
    pub fn servers_not_connected(&self) -> Vec<(String, String)> {
        self.inner
            .host
            .status()
            .not_connected
            .into_iter()
            .map(|p| (p.server, p.reason))
            .collect()
    }

    /// Runs `prompt` to its end.
    pub async fn run(&self, prompt: impl Into<String>) -> Result<Outcome, AgentError> {
        self.run_with(prompt, RunOptions::default()).await
    }

    /// Runs `prompt` with `options` to its end.
    pub async fn run_with(
        &self,
        prompt: impl Into<String>,
        options: RunOptions,
    ) -> Result<Outcome, AgentError> {
        self.stream_with(prompt, options)?.outcome().await
    }

    /// Starts `prompt`; the stream yields its run events as they happen.
    pub fn run_stream(&self, prompt: impl Into<String>) -> Result<RunStream, AgentError> {
        self.stream_with(prompt, RunOptions::default())
    }

    /// Starts `prompt` with `options`; the stream yields its run events as they happen.
    pub fn stream_with(
        &self,
        prompt: impl Into<String>,
        options: RunOptions,
    ) -> Result<RunStream, AgentError> {
        let run_id = options
            .run_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let key = options.conversation.clone().unwrap_or_default();
        let history = match &options.conversation {
            Some(k) => self.history(k)?,
            None => Vec::new(),
        };
        let conversation_id = if key.is_empty() {
            run_id.clone()
        } else {
            format!(
                "conv-{}",
                &hex::encode(Sha256::digest(key.as_bytes()))[..16]
            )
        };
        let req = RunAssignment {
            trace_id: String::new(),
            run_id: run_id.clone().into(),
            attempt: 1,
            task_id: run_id.clone().into(),
            namespace: self.inner.namespace.clone(),
            deployment: self.inner.name.clone(),
            input: prompt.into(),
            labels: options.labels.clone(),
            conversation_id,
            conversation_key: key,
            root_run_id: options
                .root_run_id
                .clone()
                .unwrap_or_else(|| run_id.clone())
                .into(),
            // An embedded delegate (`Agent::as_tool`) is bounded by not calling itself, not by
            // the fleet's depth count.
            delegation_depth: 0,
            history,
            replay: Vec::new(),
            tool_overrides: Default::default(),
            max_tokens: None,
            output_schema: None,
        };
        let sink = match &self.inner.run_log {
            Some(dir) => {
                if log::run_dir(dir, &run_id)?.exists() {
                    return Err(AgentError::Invalid(format!(
                        "run {run_id} is already in the run log {}; resume it with Agent::resume or pick another run id",
                        dir.display()
                    )));
                }
                Some(log::open(dir, &req)?)
            }
            None => None,
        };
        // A token of the run's own: dropping its stream cancels this run, not the caller's token.
        let cancel = options.cancel.unwrap_or_default().child_token();
        Ok(self.start(req, sink, Tally::default(), cancel))
    }

    /// A conversation: its runs continue one message history (kept in the run log folder when
    /// the agent has one, else in memory).
    pub fn conversation(&self, key: impl Into<String>) -> Conversation {
        Conversation {
            agent: self.clone(),
            key: key.into(),
        }
    }

    /// Resumes run `run_id` from the run log (after a crash of the program): answered model
    /// turns are not asked again, recorded tool results are reused, a side-effecting call that
    /// was interrupted is reported to the model as `effect_unknown` and not sent again. A run
    /// the log shows finished returns its recorded outcome.
    pub async fn resume(&self, run_id: &str) -> Result<Outcome, AgentError> {
        self.resume_stream(run_id)?.outcome().await
    }

    /// [`Agent::resume`], with the new attempt's events as they happen.
    pub fn resume_stream(&self, run_id: &str) -> Result<RunStream, AgentError> {
        let dir = self.inner.run_log.as_ref().ok_or(AgentError::NoRunLog)?;
        let logged = log::read(dir, run_id)?;
        let mut tally = Tally::default();
        for (_, e) in &logged.events {
            tally.add(e);
        }
        if logged.finished() {
            return Ok(finished_stream(run_id, &logged.events, tally));
        }
        let mut req = logged.assignment.clone();
        req.attempt = logged.last_attempt() + 1;
        req.replay = logged.events.into_iter().map(|(_, e)| e).collect();
        let sink = log::open(dir, &req)?;
        Ok(self.start(req, Some(sink), tally, CancellationToken::new()))
    }

    /// The runs in the run log that have no end (a crash interrupted them), oldest first.
    pub fn unfinished_runs(&self) -> Result<Vec<String>, AgentError> {
        let dir = self.inner.run_log.as_ref().ok_or(AgentError::NoRunLog)?;
        let mut out = Vec::new();
        for id in log::run_ids(dir)? {
            match log::read(dir, &id) {
                Ok(l) if !l.finished() => out.push(id),
                Ok(_) => {}
                // A run going on in this program holds its log open.
                Err(e) => tracing::debug!(run_id = %id, "run log not read: {e}"),
            }
        }
        Ok(out)
    }

    /// The bytes of an artifact a run saved.
    pub async fn read_artifact(&self, id: &str) -> Result<Vec<u8>, AgentError> {
        self.inner
            .artifacts
            .read(&self.inner.namespace, id)
            .await
            .map_err(|e| AgentError::Run(format!("artifact {id}: {e}")))
    }

    /// Stops the agent's MCP servers (they are also stopped when the last clone is dropped).
    pub async fn shutdown(&self) {
        self.inner.host.shutdown().await;
    }

    fn history(&self, key: &str) -> Result<Vec<Message>, AgentError> {
        match &self.inner.run_log {
            Some(dir) => log::read_history(dir, key),
            None => Ok(crate::run::lock(&self.inner.conversations)
                .get(key)
                .cloned()
                .unwrap_or_default()),
        }
    }

    fn start(
        &self,
        req: RunAssignment,
        log: Option<crate::run_log::SledRunLog>,
        tally: Tally,
        cancel: CancellationToken,
    ) -> RunStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let tee = Arc::new(Tee {
            log: log.map(Arc::new),
            tx,
            tally: Mutex::new(tally),
            attempt: req.attempt,
        });
        let inner = self.inner.clone();
        let run_id = req.run_id.to_string();
        let key = req.conversation_key.clone();
        let run_cancel = cancel.clone();
        let task = tokio::spawn(async move {
            let run_id = req.run_id.to_string();
            let out = inner.harness.run(req, tee.clone(), run_cancel).await;
            if let Some(log) = &tee.log {
                if let Err(e) = log.flush().await {
                    tracing::warn!(run_id = %run_id, "run log flush failed: {e}");
                }
            }
            if !key.is_empty() {
                inner.append_history(&key, &out.messages)?;
            }
            let tally = crate::run::lock(&tee.tally).clone();
            Ok(Outcome {
                run_id,
                state: out.state,
                result: out.result,
                response_type: out.response_type,
                usage: tally.usage,
                artifacts: tally.artifacts,
                messages: out.messages,
            })
        });
        RunStream {
            run_id,
            rx,
            task: Some(task),
            cancel,
        }
    }
}

impl Inner {
    fn append_history(&self, key: &str, messages: &[Message]) -> Result<(), AgentError> {
        match &self.run_log {
            Some(dir) => {
                let mut h = log::read_history(dir, key)?;
                h.extend(messages.iter().cloned());
                log::write_history(dir, key, &h)
            }
            None => {
                crate::run::lock(&self.conversations)
                    .entry(key.to_string())
                    .or_default()
                    .extend(messages.iter().cloned());
                Ok(())
            }
        }
    }
}

/// The stream of a run the log shows finished: no new events, the recorded outcome.
fn finished_stream(run_id: &str, events: &[(u32, RunEventBody)], tally: Tally) -> RunStream {
    let (_tx, rx) = mpsc::unbounded_channel();
    let end: Option<RunFinished> = events.iter().rev().find_map(|(_, e)| match e {
        RunEventBody::RunFinished(f) => Some(f.clone()),
        _ => None,
    });
    let run_id = run_id.to_string();
    let id = run_id.clone();
    let task = tokio::spawn(async move {
        let f = end.ok_or_else(|| AgentError::RunLog(format!("run {id} has no end")))?;
        Ok(Outcome {
            run_id: id,
            state: f.state,
            result: f.result,
            response_type: f.response_type,
            usage: tally.usage,
            artifacts: tally.artifacts,
            messages: f.messages,
        })
    });
    RunStream {
        run_id,
        rx,
        task: Some(task),
        cancel: CancellationToken::new(),
    }
}

/// The runs of one conversation (see [`Agent::conversation`]).
#[derive(Clone)]
pub struct Conversation {
    agent: Agent,
    key: String,
}

impl Conversation {
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Runs `prompt` as the conversation's next message.
    pub async fn run(&self, prompt: impl Into<String>) -> Result<Outcome, AgentError> {
        self.run_with(prompt, RunOptions::default()).await
    }

    pub async fn run_with(
        &self,
        prompt: impl Into<String>,
        options: RunOptions,
    ) -> Result<Outcome, AgentError> {
        self.agent
            .run_with(prompt, options.conversation(self.key.clone()))
            .await
    }

    pub fn run_stream(&self, prompt: impl Into<String>) -> Result<RunStream, AgentError> {
        self.agent
            .stream_with(prompt, RunOptions::default().conversation(self.key.clone()))
    }

    /// The conversation's messages so far.
    pub fn history(&self) -> Result<Vec<Message>, AgentError> {
        self.agent.history(&self.key)
    }
}
