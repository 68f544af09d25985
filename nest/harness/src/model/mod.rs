//! Model providers: the provider-neutral message model, the [`ModelProvider`] trait and its
//! real HTTP clients (OpenAI-compatible Chat Completions in [`openai`], Anthropic Messages in
//! [`anthropic`], both streamed over SSE by `sse`), the bounded retry policy they share, (the scripted fake model that tests and
//! demos serve over the same HTTP APIs is the `agen-fake-model` crate).
//!
//! Invariants: a provider retries only what may succeed on a second try (429, 5xx, connect and
//! timeout errors) and at most [`RetryPolicy::max_tries`] times; a 4xx such as 401 is never
//! retried; every failure is a [`ModelError`] whose message names the provider, the endpoint
//! and the fix, and never contains the API key. [`Message`] serialises to the JSON kept in
//! conversation histories and run logs (`{"role": "assistant", "content": ..., "tool_calls": [...]}`).

pub mod anthropic;
pub mod openai;
mod sse;

pub use sse::{Deltas, ModelDelta};

use std::time::Duration;

use agen_shared::bundle::{ModelRef, Provider};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use agen_contract::run::{Message, ToolCall, Usage};

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

/// One model request.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    pub system: String,
    /// Shared with the run's context: a turn's request does not copy the conversation.
    pub messages: std::sync::Arc<Vec<Message>>,
    /// Empty: no tools are sent (the request has no `tools` field at all). Shared: a run offers
    /// the same tools every turn.
    pub tools: std::sync::Arc<[ToolSpec]>,
    /// Whether the model may ask for several tools in one turn.
    pub parallel_tool_calls: bool,
    /// A JSON schema the final answer must match (`outputSchema`): a provider with native
    /// structured output sends it (OpenAI `response_format` `json_schema`); the harness
    /// validates every final answer either way.
    pub output_schema: Option<Value>,
}

/// The model's answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelReply {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// The provider's own reason (`stop`, `tool_calls`, `end_turn`, `length`, …).
    pub stop_reason: Option<String>,
    pub usage: Option<Usage>,
    /// The provider's id of the answer (`id`), when it sent one.
    pub id: Option<String>,
    /// The model that answered (`model`), when the provider said.
    pub model: Option<String>,
}

impl ModelReply {
    /// The assistant message this reply adds to the conversation.
    pub fn message(&self) -> Message {
        Message::Assistant {
            content: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
        }
    }
}

/// Why a model turn produced no answer. Never retried by the harness as a tool recall: it
/// becomes the run's own response with `response_type: "error"`.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    /// The provider answered with an error status (after retries, when retryable).
    #[error("model provider {provider} at {url} answered {status}{}: {message}", tries_note(*.tries))]
    Status {
        provider: &'static str,
        url: String,
        status: u16,
        message: String,
        tries: u32,
    },
    /// The provider could not be reached (after retries).
    #[error("model provider {provider} at {url} could not be reached{}: {message}; check baseUrl in x-agen/agent.md and that the server is up", tries_note(*.tries))]
    Connect {
        provider: &'static str,
        url: String,
        message: String,
        tries: u32,
    },
    /// The provider answered 200 with something that is not a usable reply.
    #[error("model provider {provider} at {url} sent an invalid response: {message}")]
    InvalidResponse {
        provider: &'static str,
        url: String,
        message: String,
    },
    /// The provider refused to answer (content filter, safety stop).
    #[error("model provider {provider} refused to answer: {message}")]
    Refused {
        provider: &'static str,
        message: String,
    },
    /// The agent's model settings are unusable.
    #[error("{0}")]
    Config(String),
    #[error("the model request was cancelled")]
    Cancelled,
}

fn tries_note(tries: u32) -> String {
    if tries > 1 {
        format!(" after {tries} tries")
    } else {
        String::new()
    }
}

/// A model provider: one request in, one reply out.
#[async_trait::async_trait]
pub trait ModelProvider: Send + Sync {
    /// `openai/gpt-4.1-mini`, for logs and events.
    fn describe(&self) -> String;
    /// Sends one request (with retries on transient failures), streamed: each piece of the
    /// answer's text goes to `deltas` as it arrives (a [`ModelDelta::Reset`] before a retry
    /// that follows handed-out text); returns when the model has answered, the retries are
    /// spent, or `cancel` fires.
    async fn complete(
        &self,
        req: &ModelRequest,
        cancel: &CancellationToken,
        deltas: Deltas<'_>,
    ) -> Result<ModelReply, ModelError>;
}

/// How transient failures are retried: `max_tries` attempts in all, waiting
/// `base_delay * 2^n` (capped at `max_delay`) between them, or what `retry-after` says
/// (capped at `max_retry_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_tries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_tries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before try number `next_try` (2, 3, …).
    pub fn delay(&self, next_try: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(d) = retry_after {
            return d.min(self.max_retry_after);
        }
        let exp = next_try.saturating_sub(2).min(16);
        self.base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay)
    }
}

/// What a provider client needs: the model, its endpoint and key (secrets already
/// substituted), extra settings from the front matter, and the retry policy.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub model: ModelRef,
    /// `None`: the provider's public endpoint.
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    /// `temperature`, `maxTokens`, … from the agent.md front matter.
    pub extra: serde_json::Map<String, Value>,
    pub retry: RetryPolicy,
}

impl ModelConfig {
    pub fn new(model: ModelRef) -> ModelConfig {
        ModelConfig {
            model,
            base_url: None,
            api_key: None,
            extra: Default::default(),
            retry: RetryPolicy::default(),
        }
    }
}

/// The client for `config.model.provider`.
pub fn provider_for(config: ModelConfig, http: reqwest::Client) -> Box<dyn ModelProvider> {
    match config.model.provider {
        Provider::OpenAi => Box::new(openai::OpenAiProvider::new(config, http)),
        Provider::Anthropic => Box::new(anthropic::AnthropicProvider::new(config, http)),
    }
}

/// One HTTP response classified for the retry loop.
pub(crate) enum Attempt {
    Done(Value),
    /// Worth another try (429, 5xx, connect/timeouts).
    Retry {
        error: ModelError,
        retry_after: Option<Duration>,
    },
    Fatal(ModelError),
}

/// The readable part of an error body: `error.message` (OpenAI and Anthropic both use it),
/// else the start of the body.
fn error_message(bytes: &[u8], status: u16) -> String {
    let hint = match status {
        401 | 403 => "; check apiKey in x-agen/agent.md and the secret it names",
        404 => "; check the model name and baseUrl in x-agen/agent.md",
        _ => "",
    };
    let text = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| {
            let s = String::from_utf8_lossy(bytes);
            let s = s.trim();
            if s.is_empty() {
                "(empty body)".to_string()
            } else {
                s.chars().take(500).collect()
            }
        });
    format!("{text}{hint}")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        let m = inner.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = inner.source();
    }
    s
}

/// Parses a tool call's argument text; text that is not JSON is kept as a string so the
/// harness can tell the model what was wrong.
pub(crate) fn parse_arguments(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// `maxTokens` from the front matter, or `default`.
pub(crate) fn max_tokens(extra: &serde_json::Map<String, Value>, default: u64) -> u64 {
    extra
        .get("maxTokens")
        .and_then(Value::as_u64)
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_honours_retry_after() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(2, None), Duration::from_millis(500));
        assert_eq!(p.delay(3, None), Duration::from_secs(1));
        assert_eq!(p.delay(4, None), Duration::from_secs(2));
        assert_eq!(p.delay(20, None), Duration::from_secs(8));
        assert_eq!(
            p.delay(2, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            p.delay(2, Some(Duration::from_secs(3600))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn messages_serialise_to_the_history_form() {
        let m = Message::Assistant {
            content: "checking".into(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "time_now".into(),
                arguments: serde_json::json!({}),
            }],
        };
        let v = m.to_json();
        assert_eq!(
            v,
            serde_json::json!({"role": "assistant", "content": "checking", "tool_calls": [{"id": "c1", "name": "time_now", "arguments": {}}]})
        );
        assert_eq!(serde_json::from_value::<Message>(v).unwrap(), m);
        let t: Message = serde_json::from_value(serde_json::json!({"role": "tool", "call_id": "c1", "name": "time_now", "content": "12:00"})).unwrap();
        assert_eq!(
            t,
            Message::Tool {
                call_id: "c1".into(),
                name: "time_now".into(),
                content: "12:00".into(),
                is_error: false
            }
        );
    }

    #[test]
    fn error_messages_come_from_the_body() {
        assert_eq!(
            error_message(br#"{"error": {"message": "bad key"}}"#, 401),
            "bad key; check apiKey in x-agen/agent.md and the secret it names"
        );
        assert_eq!(error_message(b"upstream down", 502), "upstream down");
        assert_eq!(error_message(b"", 500), "(empty body)");
    }
}
