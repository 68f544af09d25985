//! The embedded agent: `agen::Agent` (the harness in this process) built from the Python
//! layer's typed spec, with Python tools as `HostTool`s and an optional Python approver for
//! `ask` calls. A Python callback runs on tokio's blocking pool with the GIL taken there, so a
//! slow tool never stalls the runtime; the Python side turns a tool's exception into an error
//! result (`(False, message)`) before it reaches here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen::{
    ApprovalDecision, ApprovalRequest, Approver, CancellationToken, HostTool, HostToolSpec,
    Outcome, RunItem, RunItems, RunOptions, RunStream, ToolContext, ToolError,
};
use futures::StreamExt;
use pyo3::prelude::*;
use serde_json::{json, Value};

use crate::{block, error, rt, to_json};

/// How an agent is defined, as the Python `Agent` gives it.
#[derive(serde::Deserialize)]
struct AgentSpec {
    /// A bundle folder; else the agent is built in code from the fields below.
    #[serde(default)]
    bundle: Option<PathBuf>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    base_url: Option<String>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    run_log: Option<PathBuf>,
    #[serde(default)]
    artifacts_dir: Option<PathBuf>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    max_turns: Option<u32>,
    #[serde(default)]
    tool_timeout_s: Option<f64>,
    #[serde(default)]
    mcp_servers: BTreeMap<String, Value>,
    #[serde(default)]
    agen_bin: Option<PathBuf>,
}

/// A Python tool as the Python layer describes it.
#[derive(serde::Deserialize)]
struct ToolSpec {
    name: String,
    description: String,
    input_schema: Value,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    idempotent: bool,
}

/// A Python callable as a host tool: called with `(arguments_json, context_json)`, it answers
/// `(ok, text)`.
struct PyTool {
    spec: HostToolSpec,
    call: Arc<Py<PyAny>>,
}

#[async_trait::async_trait]
impl HostTool for PyTool {
    fn spec(&self) -> HostToolSpec {
        self.spec.clone()
    }

    async fn call(&self, arguments: Value, cx: ToolContext) -> Result<String, ToolError> {
        let call = self.call.clone();
        let context = json!({
            "call_id": cx.call_id,
            "run_id": cx.meta.run_id,
            "task_id": cx.meta.task_id,
            "meta": Value::Object(cx.meta_map()),
        });
        let args = arguments.to_string();
        let answer = tokio::task::spawn_blocking(move || {
            Python::with_gil(|py| {
                call.call1(py, (args, context.to_string()))
                    .and_then(|r| r.extract::<(bool, String)>(py))
                    .map_err(|e| e.to_string())
            })
        })
        .await
        .map_err(|e| ToolError::new(format!("the Python tool's thread ended: {e}")))?;
        match answer {
            Ok((true, text)) => Ok(text),
            Ok((false, text)) | Err(text) => Err(ToolError::new(text)),
        }
    }
}

/// A Python callable that decides `ask` calls: called with the request as JSON, it answers
/// `(approved, reason)`.
struct PyApprover(Arc<Py<PyAny>>);

#[async_trait::async_trait]
impl Approver for PyApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let call = self.0.clone();
        let req = json!({
            "run_id": request.run_id,
            "call_id": request.call_id,
            "tool": request.tool,
            "arguments": request.arguments,
        })
        .to_string();
        let answer = tokio::task::spawn_blocking(move || {
            Python::with_gil(|py| {
                call.call1(py, (req,))
                    .and_then(|r| r.extract::<(bool, String)>(py))
                    .map_err(|e| e.to_string())
            })
        })
        .await;
        match answer {
            Ok(Ok((true, _))) => ApprovalDecision::Approved,
            Ok(Ok((false, reason))) => ApprovalDecision::Denied(reason),
            Ok(Err(e)) => ApprovalDecision::Denied(format!("the approval callback failed: {e}")),
            Err(e) => {
                ApprovalDecision::Denied(format!("the approval callback's thread ended: {e}"))
            }
        }
    }
}

/// An agent inside this Python process.
#[pyclass(frozen, module = "agen._native")]
pub struct Agent {
    agent: agen::Agent,
}

fn agent_error(e: agen::AgentError) -> PyErr {
    let code = match e {
        agen::AgentError::Bundle(_) | agen::AgentError::Invalid(_) | agen::AgentError::NoRunLog => {
            agen_cli::exit::code::USAGE
        }
        agen::AgentError::UnknownRun { .. } => agen_cli::exit::code::NOT_FOUND,
        _ => agen_cli::exit::code::FAILED,
    };
    error(code, e.to_string())
}

fn outcome_json(o: &Outcome) -> String {
    to_json(&json!({
        "run_id": o.run_id,
        "state": o.state,
        "result": o.result,
        "response_type": o.response_type,
        "usage": o.usage,
        "artifacts": o.artifacts,
        "messages": o.messages,
    }))
}

#[pymethods]
impl Agent {
    /// Builds the agent: validates the definition as `agen deploy` does and starts its MCP
    /// servers. `tools` are `(spec_json, callable)` pairs.
    #[new]
    #[pyo3(signature = (spec, tools, approver=None))]
    fn new(
        py: Python<'_>,
        spec: String,
        tools: Vec<(String, Py<PyAny>)>,
        approver: Option<Py<PyAny>>,
    ) -> PyResult<Agent> {
        let s: AgentSpec = serde_json::from_str(&spec)
            .map_err(|e| error(agen_cli::exit::code::USAGE, format!("agent spec: {e}")))?;
        let mut b = match &s.bundle {
            Some(dir) => agen::Agent::from_bundle(dir.clone()),
            None => agen::Agent::builder(),
        };
        if let Some(v) = s.name {
            b = b.name(v);
        }
        if let Some(v) = s.model {
            b = b.model(v);
        }
        if let Some(v) = s.system {
            b = b.system_prompt(v);
        }
        if let Some(v) = s.base_url {
            b = b.base_url(v);
        }
        if let Some(v) = s.api_key {
            b = b.api_key(v);
        }
        if let Some(v) = s.run_log {
            b = b.run_log(v);
        }
        if let Some(v) = s.artifacts_dir {
            b = b.artifacts_dir(v);
        }
        for p in s.allow {
            b = b.allow(p);
        }
        for p in s.ask {
            b = b.ask(p);
        }
        for p in s.deny {
            b = b.deny(p);
        }
        if let Some(v) = s.max_turns {
            b = b.max_turns(v);
        }
        if let Some(v) = s
            .tool_timeout_s
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
        {
            b = b.tool_timeout(v);
        }
        for (name, server) in s.mcp_servers {
            b = b.mcp_server(name, server);
        }
        if let Some(v) = s.agen_bin {
            b = b.agen_bin(v);
        }
        for (spec, call) in tools {
            let t: ToolSpec = serde_json::from_str(&spec)
                .map_err(|e| error(agen_cli::exit::code::USAGE, format!("tool spec: {e}")))?;
            b = b.tool(PyTool {
                spec: HostToolSpec {
                    name: t.name,
                    description: t.description,
                    input_schema: t.input_schema,
                    read_only: t.read_only,
                    idempotent: t.idempotent,
                },
                call: Arc::new(call),
            });
        }
        if let Some(a) = approver {
            b = b.approver(Arc::new(PyApprover(Arc::new(a))));
        }
        let agent = block(py, b.build())?.map_err(agent_error)?;
        Ok(Agent { agent })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> String {
        self.agent.name().to_owned()
    }

    /// The tools the model is offered.
    fn tool_names(&self) -> Vec<String> {
        self.agent.tool_names()
    }

    /// Starts a run of `input` (`run_id`: its run-log folder; `conversation`: continue that
    /// conversation); read its events with `Run.next` (with `deltas`, the model's answer as it
    /// streams too).
    #[pyo3(signature = (input, run_id=None, conversation=None, labels=BTreeMap::new(), deltas=false))]
    fn start(
        &self,
        input: String,
        run_id: Option<String>,
        conversation: Option<String>,
        labels: BTreeMap<String, String>,
        deltas: bool,
    ) -> PyResult<Run> {
        let cancel = CancellationToken::new();
        let mut o = RunOptions::new().cancel(cancel.clone());
        if let Some(id) = run_id {
            o = o.run_id(id);
        }
        if let Some(k) = conversation {
            o = o.conversation(k);
        }
        for (k, v) in labels {
            o = o.label(k, v);
        }
        let _in_runtime = rt().enter();
        let stream = self.agent.stream_with(input, o).map_err(agent_error)?;
        Ok(Run::new(stream, Some(cancel), deltas))
    }

    /// Resumes run `run_id` from the run log (after a crash): recorded model turns and tool
    /// results are reused, a completed side-effecting call is never made again.
    fn resume(&self, run_id: String) -> PyResult<Run> {
        let _in_runtime = rt().enter();
        let stream = self.agent.resume_stream(&run_id).map_err(agent_error)?;
        Ok(Run::new(stream, None, false))
    }

    /// The runs of the run log that have not finished (a crash interrupted them).
    fn unfinished_runs(&self) -> PyResult<Vec<String>> {
        self.agent.unfinished_runs().map_err(agent_error)
    }

    /// Artifact `artifact_id`'s bytes.
    fn read_artifact<'py>(
        &self,
        py: Python<'py>,
        artifact_id: String,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let agent = self.agent.clone();
        let data = block(py, async move { agent.read_artifact(&artifact_id).await })?
            .map_err(agent_error)?;
        Ok(pyo3::types::PyBytes::new(py, &data))
    }

    /// Stops the agent's MCP servers.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let agent = self.agent.clone();
        block(py, async move { agent.shutdown().await })
    }
}

/// A run in progress: its events, then its outcome.
#[pyclass(frozen, module = "agen._native")]
pub struct Run {
    run_id: String,
    stream: Mutex<Option<RunItems>>,
    /// Cancels the run without waiting for the stream's lock (held while `next` waits).
    cancel: Option<CancellationToken>,
    /// Whether `next` gives the streamed pieces too.
    deltas: bool,
}

impl Run {
    fn new(stream: RunStream, cancel: Option<CancellationToken>, deltas: bool) -> Run {
        Run {
            run_id: stream.run_id().to_owned(),
            stream: Mutex::new(Some(stream.with_deltas())),
            cancel,
            deltas,
        }
    }

    fn take(&self) -> PyResult<RunItems> {
        self.stream
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .ok_or_else(|| error(1, "this run's outcome was already taken"))
    }
}

#[pymethods]
impl Run {
    /// The run's id (its folder in the run log).
    #[getter]
    fn run_id(&self) -> String {
        self.run_id.clone()
    }

    /// The next run event as JSON (`{"kind", "json"}`), or `None` after the last; a streamed
    /// piece (asked for with `deltas`) is `{"kind": "model.delta" | "delta.reset", "json":
    /// {attempt, turn, text}}`.
    fn next(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut guard = self
            .stream
            .lock()
            .map_err(|_| error(1, "the run was poisoned by a panic"))?;
        let Some(stream) = guard.as_mut() else {
            return Ok(None);
        };
        let deltas = self.deltas;
        let item = block(py, async move {
            loop {
                match stream.next().await {
                    Some(RunItem::Delta(_)) if !deltas => continue,
                    other => return other,
                }
            }
        })?;
        Ok(item.map(|i| match i {
            RunItem::Event(e) => to_json(&e),
            RunItem::Delta(d) => to_json(&json!({"kind": d.kind(), "json": d})),
        }))
    }

    /// Waits for the run's end and returns its outcome as JSON.
    fn outcome(&self, py: Python<'_>) -> PyResult<String> {
        let stream = self.take()?;
        let o = block(py, stream.outcome())?.map_err(agent_error)?;
        Ok(outcome_json(&o))
    }

    /// Cancels the run: the tool call in flight is stopped, the run ends `cancelled`.
    fn cancel(&self) {
        if let Some(c) = &self.cancel {
            c.cancel();
            return;
        }
        if let Ok(s) = self.stream.lock() {
            if let Some(s) = s.as_ref() {
                s.cancel();
            }
        }
    }
}
