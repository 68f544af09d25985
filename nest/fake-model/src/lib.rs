//! The scripted fake model — for tests and demos, NOT a real model. It serves the OpenAI
//! Chat Completions API (`POST /v1/chat/completions`) and the Anthropic Messages API
//! (`POST /v1/messages`) over real HTTP, so the real provider clients are the code that talks
//! to it, and answers from a script instead of thinking.
//!
//! # Script (JSON)
//! Either an array of steps or `{"steps": [...], "record": "requests.jsonl"}`. The step for a
//! request is chosen by the number of assistant turns already in the request (the first
//! request of a conversation gets step 0, the request after one tool round step 1, …), so
//! concurrent conversations each follow the script; past the end, the last step repeats.
//! A step is an object with any of:
//! - `"reply": "text"` — answer with this text (also sent alongside `tool_calls`);
//! - `"reply_template": "The time is {{last_tool_result}}"` — `{{last_tool_result}}` (the last
//!   tool result's text), `{{last_user}}` (the last user message) and `{{turn}}` are filled in;
//! - `"echo_history": true` — answer `user messages: a | b | c`, every user message seen;
//! - `"tool_calls": [{"name": "time_get_current_time", "arguments": {...}, "id"?: "..."}]`;
//! - `"status": 401, "body": "bad key"` — answer with this HTTP error (`"times": N` limits it to
//!   the first N requests that reach this step, after which `"then": {step}` answers, or the
//!   rest of this step); `"retry_after": seconds` adds a `retry-after` header;
//! - `"delay_ms": N` — wait this long first (combines with the above);
//! - `"chunk_chars": N`, `"chunk_delay_ms": M` — how a streamed answer (a request with
//!   `"stream": true`, as Agen's providers send) is cut: pieces of N characters (default 8,
//!   or longer so an answer is at most 1024 pieces), M ms apart (default 0), see `sse`;
//! - `"usage": {"input_tokens": N, "output_tokens": M}` — the token usage the answer reports
//!   (default 0 and 0), as `usage.prompt_tokens`/`completion_tokens` on the OpenAI API.
//!
//! Every request is recorded as `{"path", "headers", "body"}` (in memory, see
//! [`FakeModel::requests`], and appended to the `record` JSONL file when set), so tests can
//! assert what the model was sent; [`FakeModel::start_unrecorded`] keeps none in memory (a
//! load test's thousands of ever longer conversations would otherwise grow without bound).
//!
//! Invariants: never a fixed port (callers pass `127.0.0.1:0` and read [`FakeModel::addr`]);
//! the server stops when the [`FakeModel`] is dropped.

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

mod sse;

/// A script that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("{path}: cannot read the fake model script: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: invalid fake model script: {message}; expected an array of steps or {{\"steps\": [...]}}")]
    Invalid { path: String, message: String },
}

/// A parsed script.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Script {
    pub steps: Vec<Step>,
    /// Append every request to this JSONL file.
    #[serde(default)]
    pub record: Option<PathBuf>,
}

/// One scripted answer (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default)]
    pub reply: Option<String>,
    #[serde(default)]
    pub reply_template: Option<String>,
    #[serde(default)]
    pub echo_history: bool,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub times: Option<u32>,
    #[serde(default)]
    pub then: Option<Box<Step>>,
    #[serde(default)]
    pub retry_after: Option<u64>,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub usage: Option<ScriptedUsage>,
    #[serde(default)]
    pub chunk_chars: Option<usize>,
    #[serde(default)]
    pub chunk_delay_ms: Option<u64>,
}

/// The token usage a scripted answer reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
}

/// A tool call the script makes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: Value,
    #[serde(default)]
    pub id: Option<String>,
}

fn empty_object() -> Value {
    json!({})
}

impl Script {
    /// Parses a script; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Script, ScriptError> {
        let invalid = |message: String| ScriptError::Invalid {
            path: origin.to_string(),
            message,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        match v {
            Value::Array(_) => Ok(Script {
                steps: serde_json::from_value(v).map_err(|e| invalid(e.to_string()))?,
                record: None,
            }),
            Value::Object(_) => serde_json::from_value(v).map_err(|e| invalid(e.to_string())),
            other => Err(invalid(format!("got {other}"))),
        }
    }

    /// Reads and parses a script file; a relative `record` is relative to the script's folder.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: origin.clone(),
            source,
        })?;
        let mut script = Script::parse(&text, &origin)?;
        if let (Some(rec), Some(parent)) = (&script.record, path.parent()) {
            if rec.is_relative() {
                script.record = Some(parent.join(rec));
            }
        }
        Ok(script)
    }

    /// A script of steps.
    pub fn steps(steps: Vec<Step>) -> Script {
        Script {
            steps,
            record: None,
        }
    }
}

impl Step {
    pub fn reply(text: impl Into<String>) -> Step {
        Step {
            reply: Some(text.into()),
            ..Default::default()
        }
    }
    pub fn template(text: impl Into<String>) -> Step {
        Step {
            reply_template: Some(text.into()),
            ..Default::default()
        }
    }
    pub fn call(name: impl Into<String>, arguments: Value) -> Step {
        Step {
            tool_calls: vec![ScriptedCall {
                name: name.into(),
                arguments,
                id: None,
            }],
            ..Default::default()
        }
    }
    pub fn calls(calls: Vec<(&str, Value)>) -> Step {
        Step {
            tool_calls: calls
                .into_iter()
                .map(|(n, a)| ScriptedCall {
                    name: n.to_string(),
                    arguments: a,
                    id: None,
                })
                .collect(),
            ..Default::default()
        }
    }
    /// This step, reporting `input` prompt tokens and `output` completion tokens.
    pub fn with_usage(self, input: u64, output: u64) -> Step {
        Step {
            usage: Some(ScriptedUsage {
                input_tokens: input,
                output_tokens: output,
            }),
            ..self
        }
    }
    pub fn status(status: u16, body: impl Into<String>) -> Step {
        Step {
            status: Some(status),
            body: Some(body.into()),
            ..Default::default()
        }
    }
}

/// Characters per piece of a streamed answer unless the step says otherwise.
const DEFAULT_CHUNK_CHARS: usize = 8;

/// Which API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
}

struct Shared {
    script: Script,
    /// How many error answers each step index has given.
    errors_given: Mutex<HashMap<usize, u32>>,
    requests: Mutex<Vec<Value>>,
    /// Whether requests are kept in `requests`.
    keep_requests: bool,
    seq: std::sync::atomic::AtomicU64,
}

/// A running fake model server.
pub struct FakeModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl FakeModel {
    /// Binds `listen` (port 0 allowed) and serves `script` until dropped.
    pub async fn start(script: Script, listen: SocketAddr) -> std::io::Result<FakeModel> {
        FakeModel::serve(script, listen, true).await
    }

    /// As [`FakeModel::start`], but [`FakeModel::requests`] stays empty (the `record` file, if
    /// the script names one, is still written).
    pub async fn start_unrecorded(
        script: Script,
        listen: SocketAddr,
    ) -> std::io::Result<FakeModel> {
        FakeModel::serve(script, listen, false).await
    }

    async fn serve(
        script: Script,
        listen: SocketAddr,
        keep_requests: bool,
    ) -> std::io::Result<FakeModel> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script,
            errors_given: Mutex::new(HashMap::new()),
            requests: Mutex::new(Vec::new()),
            keep_requests,
            seq: Default::default(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .route("/health", get(|| async { "ok" }))
            .route(
                "/v1/models",
                get(|| async {
                    Json(json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}))
                }),
            )
            // Real providers take requests far over axum's 2 MB default (long histories).
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!("fake model server stopped: {e}");
            }
        });
        Ok(FakeModel { addr, shared, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`: the `baseUrl` for an `openai/...` model.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://ADDR`: the `baseUrl` for an `anthropic/...` model.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far: `{"path", "headers", "body"}`.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.shared.requests).clone()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// `agen fake-model --script FILE [--listen ADDR] [--port-file FILE]`: serves until SIGINT or
/// SIGTERM.
pub async fn serve_cli(
    script: PathBuf,
    listen: SocketAddr,
    port_file: Option<PathBuf>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let script = Script::load(&script)?;
    let fake = FakeModel::start(script, listen)
        .await
        .with_context(|| format!("while binding the fake model to {listen}"))?;
    if let Some(pf) = &port_file {
        let tmp = pf.with_extension("tmp");
        std::fs::write(&tmp, fake.addr().port().to_string())
            .with_context(|| format!("while writing {}", tmp.display()))?;
        std::fs::rename(&tmp, pf).with_context(|| format!("while writing {}", pf.display()))?;
    }
    eprintln!(
        "scripted fake model (not a real model) listening on http://{}",
        fake.addr()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("while installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(fake);
    Ok(())
}

/// What the script needs to know about a request, whichever API it came in on.
#[derive(Debug, Default)]
struct Seen {
    assistant_turns: usize,
    user_texts: Vec<String>,
    last_tool_result: Option<String>,
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                _ => p.get("text").and_then(Value::as_str).map(str::to_string),
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn seen(api: Api, body: &Value) -> Seen {
    let mut s = Seen::default();
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return s;
    };
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let content = m.get("content").cloned().unwrap_or(Value::Null);
        match (api, role) {
            (_, "assistant") => s.assistant_turns += 1,
            (Api::OpenAi, "tool") => s.last_tool_result = Some(text_of(&content)),
            (Api::OpenAi, "user") => s.user_texts.push(text_of(&content)),
            (Api::Anthropic, "user") => match &content {
                Value::Array(blocks) => {
                    let mut texts = Vec::new();
                    for b in blocks {
                        match b.get("type").and_then(Value::as_str) {
                            Some("tool_result") => {
                                s.last_tool_result =
                                    Some(text_of(b.get("content").unwrap_or(&Value::Null)))
                            }
                            Some("text") => texts.push(
                                b.get("text")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                            ),
                            _ => {}
                        }
                    }
                    if !texts.is_empty() {
                        s.user_texts.push(texts.join(""));
                    }
                }
                other => s.user_texts.push(text_of(other)),
            },
            _ => {}
        }
    }
    s
}

/// The scripted answer: an error or a reply.
enum Answer {
    Error {
        status: u16,
        body: String,
        retry_after: Option<u64>,
    },
    Reply {
        text: Option<String>,
        calls: Vec<ScriptedCall>,
        usage: ScriptedUsage,
        /// How a streamed answer is cut: characters per piece, ms between pieces.
        chunks: (usize, u64),
    },
}

fn answer(shared: &Shared, seen: &Seen) -> (Answer, Option<u64>) {
    let steps = &shared.script.steps;
    let Some(last) = steps.len().checked_sub(1) else {
        return (
            Answer::Reply {
                text: Some("(the fake model's script has no steps)".into()),
                calls: Vec::new(),
                usage: ScriptedUsage::default(),
                chunks: (DEFAULT_CHUNK_CHARS, 0),
            },
            None,
        );
    };
    let index = seen.assistant_turns.min(last);
    let mut step = &steps[index];
    let delay = step.delay_ms;
    if let Some(status) = step.status {
        let mut given = lock(&shared.errors_given);
        let n = given.entry(index).or_insert(0);
        if step.times.is_none_or(|t| *n < t) {
            *n += 1;
            let body = step
                .body
                .clone()
                .unwrap_or_else(|| format!("scripted error {status}"));
            return (
                Answer::Error {
                    status,
                    body,
                    retry_after: step.retry_after,
                },
                delay,
            );
        }
        if let Some(then) = &step.then {
            step = then;
        }
    }
    let text = if step.echo_history {
        Some(format!("user messages: {}", seen.user_texts.join(" | ")))
    } else if let Some(t) = &step.reply_template {
        Some(
            t.replace(
                "{{last_tool_result}}",
                seen.last_tool_result.as_deref().unwrap_or(""),
            )
            .replace(
                "{{last_user}}",
                seen.user_texts.last().map(String::as_str).unwrap_or(""),
            )
            .replace("{{turn}}", &index.to_string()),
        )
    } else {
        step.reply.clone()
    };
    // Unset: 8-character pieces, but never more than 1024 of them (a long answer in
    // 8-character pieces would be mostly SSE framing).
    let chars = text.as_deref().map_or(0, |t| t.chars().count());
    let chunk_chars = step
        .chunk_chars
        .unwrap_or(DEFAULT_CHUNK_CHARS.max(chars.div_ceil(1024)));
    (
        Answer::Reply {
            text,
            calls: step.tool_calls.clone(),
            usage: step.usage.unwrap_or_default(),
            chunks: (chunk_chars, step.chunk_delay_ms.unwrap_or(0)),
        },
        delay.or(step.delay_ms),
    )
}

fn record(shared: &Shared, path: &str, headers: &HeaderMap, body: &Value) {
    if !shared.keep_requests && shared.script.record.is_none() {
        return;
    }
    let mut h = serde_json::Map::new();
    for name in [
        "authorization",
        "x-api-key",
        "anthropic-version",
        "content-type",
    ] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            h.insert(name.to_string(), json!(v));
        }
    }
    let entry = json!({"path": path, "headers": h, "body": body});
    if let Some(file) = &shared.script.record {
        let line = format!("{entry}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            tracing::warn!("fake model: cannot append to {}: {e}", file.display());
        }
    }
    if shared.keep_requests {
        lock(&shared.requests).push(entry);
    }
}

/// What of a request an unrecorded model reads: the messages' roles, each content left as
/// text until it is needed (the tool schemas and most of a long conversation are skipped, not
/// built into values: under `agen bench` this fixture shares the CPU with what it measures).
#[derive(Deserialize)]
struct Skimmed<'a> {
    #[serde(default)]
    model: Option<Value>,
    #[serde(borrow)]
    messages: Vec<SkimmedMessage<'a>>,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize)]
struct SkimmedMessage<'a> {
    #[serde(default, borrow)]
    role: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Option<&'a serde_json::value::RawValue>,
}

impl Skimmed<'_> {
    /// The same [`Seen`] as [`seen`] reads from the whole request.
    fn seen(&self, api: Api) -> Seen {
        let content = |m: &SkimmedMessage| -> Value {
            m.content
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
                .unwrap_or(Value::Null)
        };
        let mut s = Seen::default();
        let mut last_tool = None;
        for m in &self.messages {
            match (api, m.role.as_deref().unwrap_or_default()) {
                (_, "assistant") => s.assistant_turns += 1,
                (Api::OpenAi, "tool") => last_tool = Some(m),
                (Api::OpenAi, "user") => s.user_texts.push(text_of(&content(m))),
                _ => {}
            }
        }
        s.last_tool_result = last_tool.map(|m| text_of(&content(m)));
        s
    }
}

async fn respond(
    shared: Arc<Shared>,
    api: Api,
    path: &str,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Response {
    let recorded = shared.keep_requests || shared.script.record.is_some();
    // An unrecorded OpenAI request that has the usual shape is only skimmed; everything
    // else is read whole, as before.
    let skimmed = match (recorded, api) {
        (false, Api::OpenAi) => serde_json::from_slice::<Skimmed>(&bytes).ok(),
        _ => None,
    };
    let (seen, model, stream) = match skimmed {
        Some(request) => (request.seen(api), request.model, request.stream),
        None => {
            let body: Value = match serde_json::from_slice(&bytes) {
                Ok(body) => body,
                Err(e) => {
                    let why = format!("the request body is not JSON: {e}");
                    return error_response(api, 400, why, None);
                }
            };
            record(&shared, path, &headers, &body);
            if !body.get("messages").is_some_and(Value::is_array) {
                let why = "the request has no `messages` array".to_string();
                return error_response(api, 400, why, None);
            }
            let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
            (seen(api, &body), body.get("model").cloned(), stream)
        }
    };
    let (ans, delay) = answer(&shared, &seen);
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let n = shared.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    let model = model.unwrap_or(json!("fake"));
    match ans {
        Answer::Error {
            status,
            body,
            retry_after,
        } => error_response(api, status, body, retry_after),
        Answer::Reply {
            text,
            calls,
            usage,
            chunks,
        } => {
            let ids: Vec<String> = calls
                .iter()
                .enumerate()
                .map(|(i, c)| c.id.clone().unwrap_or_else(|| format!("call_{n}_{i}")))
                .collect();
            if stream {
                return sse::response(sse::Streamed {
                    api,
                    n,
                    model,
                    text,
                    calls: &calls,
                    ids: &ids,
                    usage,
                    chunk_chars: chunks.0,
                    chunk_delay: Duration::from_millis(chunks.1),
                });
            }
            let v = match api {
                Api::OpenAi => {
                    let mut message = json!({"role": "assistant", "content": text});
                    if !calls.is_empty() {
                        message["tool_calls"] = Value::Array(
                            calls
                                .iter()
                                .zip(&ids)
                                .map(|(c, id)| json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                                .collect(),
                        );
                    }
                    let finish = if calls.is_empty() {
                        "stop"
                    } else {
                        "tool_calls"
                    };
                    json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion", "created": 0, "model": model,
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens, "total_tokens": usage.input_tokens + usage.output_tokens}})
                }
                Api::Anthropic => {
                    let mut content = Vec::new();
                    if let Some(t) = text.filter(|t| !t.is_empty()) {
                        content.push(json!({"type": "text", "text": t}));
                    }
                    for (c, id) in calls.iter().zip(&ids) {
                        content.push(json!({"type": "tool_use", "id": id, "name": c.name, "input": c.arguments}));
                    }
                    let stop = if calls.is_empty() {
                        "end_turn"
                    } else {
                        "tool_use"
                    };
                    json!({"id": format!("msg_fake_{n}"), "type": "message", "role": "assistant", "model": model, "content": content,
                        "stop_reason": stop, "stop_sequence": null, "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}})
                }
            };
            Json(v).into_response()
        }
    }
}

fn error_response(api: Api, status: u16, message: String, retry_after: Option<u64>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match api {
        Api::OpenAi => json!({"error": {"message": message, "type": "fake_error", "code": status}}),
        Api::Anthropic => {
            json!({"type": "error", "error": {"type": "fake_error", "message": message}})
        }
    };
    let mut resp = (code, Json(body)).into_response();
    if let Some(s) = retry_after {
        if let Ok(v) = axum::http::HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

async fn openai(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    respond(shared, Api::OpenAi, "/v1/chat/completions", headers, body).await
}

async fn anthropic(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    respond(shared, Api::Anthropic, "/v1/messages", headers, body).await
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_parse_in_both_forms() {
        let a = Script::parse(r#"[{"reply": "hi"}]"#, "s.json").unwrap();
        assert_eq!(a, Script::steps(vec![Step::reply("hi")]));
        let b = Script::parse(
            r#"{"steps": [{"tool_calls": [{"name": "t_x"}]}], "record": "r.jsonl"}"#,
            "s.json",
        )
        .unwrap();
        assert_eq!(b.steps, vec![Step::call("t_x", json!({}))]);
        assert_eq!(b.record, Some(PathBuf::from("r.jsonl")));
        let bad = Script::parse(r#"[{"replly": "hi"}]"#, "s.json")
            .unwrap_err()
            .to_string();
        assert!(
            bad.starts_with("s.json: invalid fake model script: unknown field `replly`"),
            "{bad}"
        );
    }

    #[test]
    fn steps_are_chosen_by_assistant_turns() {
        let shared = Shared {
            script: Script::steps(vec![
                Step::call("t_x", json!({})),
                Step::template("got {{last_tool_result}}"),
            ]),
            errors_given: Default::default(),
            requests: Default::default(),
            keep_requests: true,
            seq: Default::default(),
        };
        let first = seen(
            Api::OpenAi,
            &json!({"messages": [{"role": "user", "content": "q"}]}),
        );
        assert!(
            matches!(answer(&shared, &first).0, Answer::Reply { text: None, ref calls, .. } if calls.len() == 1)
        );
        let second = seen(
            Api::OpenAi,
            &json!({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null}, {"role": "tool", "tool_call_id": "c", "content": "42"}]}),
        );
        assert!(
            matches!(answer(&shared, &second).0, Answer::Reply { text: Some(ref t), .. } if t == "got 42")
        );
    }

    #[tokio::test]
    async fn a_recorded_model_keeps_what_it_was_sent_and_an_unrecorded_one_keeps_nothing() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let script = || Script::steps(vec![Step::reply("hi")]);
        let recorded = FakeModel::start(script(), loopback).await.expect("start");
        let unrecorded = FakeModel::start_unrecorded(script(), loopback)
            .await
            .expect("start");
        let client = reqwest::Client::new();
        for model in [&recorded, &unrecorded] {
            let answer: Value = client
                .post(format!("{}/chat/completions", model.openai_base_url()))
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}))
                .send()
                .await
                .expect("send")
                .json()
                .await
                .expect("json");
            assert_eq!(answer["choices"][0]["message"]["content"], json!("hi"));
        }
        let kept = recorded.requests();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0]["body"]["messages"][0]["content"], json!("hello"));
        assert!(unrecorded.requests().is_empty());
    }

    #[tokio::test]
    async fn an_unrecorded_model_skims_a_request_and_answers_as_a_recorded_one_does() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let script = || {
            Script::steps(vec![
                Step::call("ws_read", json!({"path": "a"})),
                Step::template("turn {{turn}}: {{last_tool_result}} for {{last_user}}"),
                Step {
                    echo_history: true,
                    ..Step::default()
                },
            ])
        };
        let recorded = FakeModel::start(script(), loopback).await.expect("start");
        let unrecorded = FakeModel::start_unrecorded(script(), loopback)
            .await
            .expect("start");
        let user =
            |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}]});
        let assistant = json!({"role": "assistant", "content": null, "tool_calls": []});
        let tool = |text: &str| json!({"role": "tool", "tool_call_id": "c", "content": text});
        let requests = [
            json!({"model": "m", "tools": [{"type": "function"}], "messages": [user("hi")]}),
            json!({"messages": [user("hi"), assistant.clone(), tool("one"), tool("two \"2\"")]}),
            json!({"model": "m", "messages": [user("a"), assistant.clone(), user("b"), assistant, {"role": 7}]}),
            json!({"model": "m", "messages": "not a list"}),
        ];
        let client = reqwest::Client::new();
        let mut skimmed = Vec::new();
        for request in &requests {
            let mut answers = Vec::new();
            for model in [&recorded, &unrecorded] {
                let response = client
                    .post(format!("{}/chat/completions", model.openai_base_url()))
                    .json(request)
                    .send()
                    .await
                    .expect("send");
                let status = response.status();
                let mut answer: Value = response.json().await.expect("json");
                if let Some(o) = answer.as_object_mut() {
                    o.remove("id");
                }
                if let Some(calls) = answer.pointer_mut("/choices/0/message/tool_calls/0") {
                    calls["id"] = json!("-");
                }
                answers.push((status, answer));
            }
            assert_eq!(answers[0], answers[1], "request {request}");
            skimmed.push(answers.remove(1));
        }
        let content = |n: usize| skimmed[n].1["choices"][0]["message"]["content"].clone();
        assert_eq!(content(1), json!("turn 1: two \"2\" for hi"));
        assert_eq!(content(2), json!("user messages: a | b"));
        assert_eq!(skimmed[3].0, reqwest::StatusCode::BAD_REQUEST);
    }
}
