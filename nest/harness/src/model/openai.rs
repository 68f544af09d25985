//! The OpenAI-compatible Chat Completions client (`POST {baseUrl}/chat/completions`): OpenAI,
//! vLLM, llama.cpp server, Ollama and anything else that speaks the API, with native `tools`
//! and `tool_calls`.
//!
//! Invariants: no `tools` (nor `parallel_tool_calls`) field is sent when the request offers no
//! tools; the `Authorization` header is sent only when an API key is configured; a
//! `content_filter` finish or a `refusal` is a [`ModelError::Refused`].

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::sse::{post_stream, stream_error, StreamCall, StreamReader};
use super::{
    parse_arguments, Deltas, Message, ModelConfig, ModelError, ModelProvider, ModelReply,
    ModelRequest, ToolCall, ToolSpec, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const PROVIDER: &str = "openai";
/// Tool sets whose `tools` JSON a provider keeps (one per run in flight on an instance).
const TOOL_SETS_KEPT: usize = 64;

pub struct OpenAiProvider {
    config: ModelConfig,
    url: String,
    http: reqwest::Client,
    /// The `tools` JSON of the tool sets asked with lately, newest first. A run offers the
    /// same `Arc<[ToolSpec]>` every turn, so its schemas are serialized once per run instead
    /// of once per turn; the entry holds the set, so its address is not reused while kept.
    tools_json: Mutex<VecDeque<KeptTools>>,
}

/// A tool set and its `tools` JSON.
type KeptTools = (Arc<[ToolSpec]>, Arc<RawValue>);

impl OpenAiProvider {
    pub fn new(config: ModelConfig, http: reqwest::Client) -> OpenAiProvider {
        let base = config
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let url = format!("{}/chat/completions", base.trim_end_matches('/'));
        OpenAiProvider {
            config,
            url,
            http,
            tools_json: Mutex::new(VecDeque::new()),
        }
    }

    /// The request's `tools` as JSON text, serialized once per tool set (`None`: no tools).
    fn tools_json(&self, tools: &Arc<[ToolSpec]>) -> Option<Arc<RawValue>> {
        if tools.is_empty() {
            return None;
        }
        let mut kept = self.tools_json.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, json)) = kept.iter().find(|(set, _)| Arc::ptr_eq(set, tools)) {
            return Some(json.clone());
        }
        let chat_tools: Vec<ChatTool> = tools
            .iter()
            .map(|t| ChatTool {
                kind: "function",
                function: ChatFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect();
        // Serializing borrowed strings and JSON values cannot fail.
        let json: Arc<RawValue> = serde_json::value::to_raw_value(&chat_tools).ok()?.into();
        kept.push_front((tools.clone(), json.clone()));
        kept.truncate(TOOL_SETS_KEPT);
        Some(json)
    }

    /// The request body for `req`, as JSON (for tests and the fake model's docs).
    pub fn body(&self, req: &ModelRequest) -> Value {
        serde_json::to_value(self.request(req)).unwrap_or(Value::Null)
    }

    /// The request for `req`: borrowed from it (a long conversation is serialized, never
    /// copied, on every turn).
    fn request<'a>(&'a self, req: &'a ModelRequest) -> ChatRequest<'a> {
        let system = (!req.system.is_empty()).then_some(ChatMessage::System {
            content: &req.system,
        });
        let messages = system
            .into_iter()
            .chain(req.messages.iter().map(|m| {
                match m {
                    Message::System { content } => ChatMessage::System { content },
                    Message::User { content } => ChatMessage::User { content },
                    Message::Assistant {
                        content,
                        tool_calls,
                    } => ChatMessage::Assistant {
                        content: (!content.is_empty() || tool_calls.is_empty())
                            .then_some(content.as_str()),
                        tool_calls: tool_calls
                            .iter()
                            .map(|c| ChatToolCall {
                                id: &c.id,
                                kind: "function",
                                function: ChatFunctionCall {
                                    name: &c.name,
                                    arguments: match &c.arguments {
                                        Value::String(s) => Cow::Borrowed(s.as_str()),
                                        other => Cow::Owned(other.to_string()),
                                    },
                                },
                            })
                            .collect(),
                    },
                    Message::Tool {
                        call_id, content, ..
                    } => ChatMessage::Tool {
                        tool_call_id: call_id,
                        content,
                    },
                }
            }))
            .collect();
        let offers_tools = !req.tools.is_empty();
        ChatRequest {
            model: &self.config.model.model,
            messages,
            tools: self.tools_json(&req.tools),
            parallel_tool_calls: offers_tools.then_some(req.parallel_tool_calls),
            temperature: self.config.extra.get("temperature"),
            max_tokens: self.config.extra.get("maxTokens"),
            stream: None,
            stream_options: None,
            response_format: req.output_schema.as_ref().map(|schema| ResponseFormat {
                kind: "json_schema",
                json_schema: JsonSchemaFormat {
                    name: "output",
                    schema,
                    // Not strict: a strict schema must close every object and list every
                    // property as required; the harness validates the answer either way.
                    strict: false,
                },
            }),
        }
    }

    fn invalid(&self, message: impl Into<String>) -> ModelError {
        ModelError::InvalidResponse {
            provider: PROVIDER,
            url: self.url.clone(),
            message: message.into(),
        }
    }

    /// Reads a Chat Completions response.
    pub fn parse_reply(&self, v: &Value) -> Result<ModelReply, ModelError> {
        let choice = v
            .pointer("/choices/0")
            .ok_or_else(|| self.invalid("no `choices[0]` in the response"))?;
        let finish = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        let msg = choice
            .get("message")
            .ok_or_else(|| self.invalid("no `choices[0].message` in the response"))?;
        if let Some(refusal) = msg
            .get("refusal")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            return Err(ModelError::Refused {
                provider: PROVIDER,
                message: refusal.to_string(),
            });
        }
        if finish.as_deref() == Some("content_filter") {
            return Err(ModelError::Refused {
                provider: PROVIDER,
                message: "the answer was stopped by the provider's content filter".into(),
            });
        }
        let text = match msg.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // Some servers send content parts.
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            Some(other) => {
                return Err(self.invalid(format!(
                    "`choices[0].message.content` is {other}, expected a string"
                )))
            }
        };
        let mut tool_calls = Vec::new();
        if let Some(calls) = msg.get("tool_calls").filter(|c| !c.is_null()) {
            let calls = calls
                .as_array()
                .ok_or_else(|| self.invalid("`tool_calls` is not an array"))?;
            for (i, c) in calls.iter().enumerate() {
                let f = c
                    .get("function")
                    .ok_or_else(|| self.invalid(format!("`tool_calls[{i}]` has no `function`")))?;
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                    self.invalid(format!("`tool_calls[{i}].function.name` is missing"))
                })?;
                let arguments = match f.get("arguments") {
                    None | Some(Value::Null) => Value::Object(Default::default()),
                    Some(Value::String(s)) => parse_arguments(s),
                    Some(other) => other.clone(),
                };
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("call_{}", uuid::Uuid::new_v4().simple()));
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_string(),
                    arguments,
                });
            }
        }
        let usage = v.get("usage").map(|u| Usage {
            input_tokens: u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
            output_tokens: u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        });
        Ok(ModelReply {
            text,
            tool_calls,
            stop_reason: finish,
            usage,
            id: v.get("id").and_then(Value::as_str).map(str::to_string),
            model: v.get("model").and_then(Value::as_str).map(str::to_string),
        })
    }
}

#[async_trait::async_trait]
impl ModelProvider for OpenAiProvider {
    fn describe(&self) -> String {
        self.config.model.to_string()
    }

    async fn complete(
        &self,
        req: &ModelRequest,
        cancel: &CancellationToken,
        deltas: Deltas<'_>,
    ) -> Result<ModelReply, ModelError> {
        let mut headers = Vec::new();
        if let Some(key) = self.config.api_key.as_deref().filter(|k| !k.is_empty()) {
            headers.push(("authorization", format!("Bearer {key}")));
        }
        let mut body = self.request(req);
        body.stream = Some(true);
        body.stream_options = Some(StreamOptions {
            include_usage: true,
        });
        let call = StreamCall {
            http: &self.http,
            provider: PROVIDER,
            url: &self.url,
            headers: &headers,
            policy: &self.config.retry,
            cancel,
            deltas,
        };
        let url = self.url.clone();
        post_stream(
            &call,
            &body,
            &move || Box::new(ChunkReader::new(url.clone())),
            &|v| self.parse_reply(v),
        )
        .await
    }
}

/// Reads a streamed Chat Completions answer (`chat.completion.chunk` events, then `[DONE]`).
#[derive(Default)]
struct ChunkReader {
    url: String,
    text: String,
    refusal: String,
    finish: Option<String>,
    /// Tool calls by their `index`: id, name, the argument text so far.
    calls: std::collections::BTreeMap<u64, (String, String, String)>,
    usage: Option<Value>,
    /// The chunks' `id` and `model` (the same on every chunk).
    id: Option<Value>,
    model: Option<Value>,
    done: bool,
}

impl ChunkReader {
    fn new(url: String) -> ChunkReader {
        ChunkReader {
            url,
            ..Default::default()
        }
    }
}

impl StreamReader for ChunkReader {
    fn event(&mut self, _event: &str, data: &str) -> Result<Option<String>, ModelError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::InvalidResponse {
            provider: PROVIDER,
            url: self.url.clone(),
            message: format!("a stream event is not JSON: {e}"),
        })?;
        if let Some(e) = stream_error(PROVIDER, &self.url, &v) {
            return Err(e);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        for (key, slot) in [("id", &mut self.id), ("model", &mut self.model)] {
            if let Some(x) = v.get(key).filter(|x| x.is_string()) {
                *slot = Some(x.clone());
            }
        }
        let Some(choice) = v.pointer("/choices/0") else {
            return Ok(None);
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(None);
        };
        if let Some(r) = delta.get("refusal").and_then(Value::as_str) {
            self.refusal.push_str(r);
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (i, c) in calls.iter().enumerate() {
                let index = c.get("index").and_then(Value::as_u64).unwrap_or(i as u64);
                let entry = self.calls.entry(index).or_default();
                if let Some(id) = c.get("id").and_then(Value::as_str) {
                    entry.0 = id.to_string();
                }
                if let Some(f) = c.get("function") {
                    if let Some(name) = f.get("name").and_then(Value::as_str) {
                        entry.1.push_str(name);
                    }
                    if let Some(args) = f.get("arguments").and_then(Value::as_str) {
                        entry.2.push_str(args);
                    }
                }
            }
        }
        let text = delta
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string);
        if let Some(t) = &text {
            self.text.push_str(t);
        }
        Ok(text)
    }

    fn complete(&self) -> bool {
        self.done || self.finish.is_some()
    }

    fn finish(self: Box<Self>) -> Value {
        let calls: Vec<Value> = self
            .calls
            .into_values()
            .map(|(id, name, arguments)| {
                serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let mut message = serde_json::json!({"role": "assistant", "content": self.text});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        if !self.refusal.is_empty() {
            message["refusal"] = Value::String(self.refusal);
        }
        let mut v = serde_json::json!({"choices": [{"index": 0, "message": message, "finish_reason": self.finish}]});
        if let Some(u) = self.usage {
            v["usage"] = u;
        }
        for (key, x) in [("id", self.id), ("model", self.model)] {
            if let Some(x) = x {
                v[key] = x;
            }
        }
        v
    }
}

/// A Chat Completions request, borrowed from the [`ModelRequest`] it is made of.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    /// The tools' JSON, kept per tool set ([`OpenAiProvider::tools_json`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Arc<RawValue>>,
    /// Only with tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<&'a Value>,
    /// Set by [`OpenAiProvider::complete`] (the answer is streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    /// Native structured output: the answer is asked to match `outputSchema`.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<ResponseFormat<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    /// The last chunk carries the turn's token usage.
    include_usage: bool,
}

/// `response_format: {"type": "json_schema", "json_schema": {...}}`.
#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'static str,
    schema: &'a Value,
    strict: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// `null` when the turn is only tool calls.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct ChatToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunctionCall<'a>,
}

#[derive(Serialize)]
struct ChatFunctionCall<'a> {
    name: &'a str,
    /// A JSON text, as the API wants it.
    arguments: Cow<'a, str>,
}

#[derive(Serialize)]
struct ChatTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolSpec;
    use agen_shared::bundle::ModelRef;
    use serde_json::json;

    fn provider() -> OpenAiProvider {
        let mut c = ModelConfig::new(ModelRef::parse("openai/gpt-4.1-mini").unwrap());
        c.base_url = Some("http://127.0.0.1:9/v1/".into());
        OpenAiProvider::new(c, reqwest::Client::new())
    }

    #[test]
    fn body_has_tools_only_when_offered() {
        let p = provider();
        assert_eq!(p.url, "http://127.0.0.1:9/v1/chat/completions");
        let mut req = ModelRequest {
            system: "be brief".into(),
            messages: vec![Message::user("hi")].into(),
            ..Default::default()
        };
        assert_eq!(
            p.body(&req),
            json!({"model": "gpt-4.1-mini", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
        );
        req.tools = vec![ToolSpec {
            name: "t_x".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }]
        .into();
        req.parallel_tool_calls = true;
        let b = p.body(&req);
        assert_eq!(
            b["tools"][0],
            json!({"type": "function", "function": {"name": "t_x", "description": "d", "parameters": {"type": "object"}}})
        );
        assert_eq!(b["parallel_tool_calls"], json!(true));
        // The set's JSON is kept: the same set again is the same text, another set its own.
        assert_eq!(p.body(&req), b);
        let first = p.tools_json(&req.tools).expect("tools");
        assert!(Arc::ptr_eq(
            &first,
            &p.tools_json(&req.tools).expect("tools")
        ));
        req.tools = vec![ToolSpec {
            name: "t_y".into(),
            description: "e".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }]
        .into();
        assert_eq!(p.body(&req)["tools"][0]["function"]["name"], json!("t_y"));
        assert_eq!(p.tools_json.lock().expect("lock").len(), 2);
    }

    #[test]
    fn a_tool_round_is_sent_as_an_assistant_turn_with_tool_calls_and_a_tool_message() {
        let p = provider();
        let req = ModelRequest {
            system: String::new(),
            messages: vec![
                Message::user("time?"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![
                        ToolCall {
                            id: "c1".into(),
                            name: "time_now".into(),
                            arguments: json!({"tz": "UTC"}),
                        },
                        ToolCall {
                            id: "c2".into(),
                            name: "time_now".into(),
                            arguments: json!("{\"tz\":\"CET\"}"),
                        },
                    ],
                },
                Message::Tool {
                    call_id: "c1".into(),
                    name: "time_now".into(),
                    content: "12:00".into(),
                    is_error: false,
                },
                Message::Assistant {
                    content: "noon".into(),
                    tool_calls: vec![],
                },
            ]
            .into(),
            tools: Default::default(),
            parallel_tool_calls: true,
            output_schema: None,
        };
        assert_eq!(
            p.body(&req),
            json!({"model": "gpt-4.1-mini", "messages": [
                {"role": "user", "content": "time?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "time_now", "arguments": "{\"tz\":\"UTC\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "time_now", "arguments": "{\"tz\":\"CET\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
                {"role": "assistant", "content": "noon"}
            ]}),
            "no tools offered: no `tools` and no `parallel_tool_calls`"
        );
    }

    #[test]
    fn reply_with_tool_calls_is_parsed() {
        let p = provider();
        let v = json!({"choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "time_now", "arguments": "{\"tz\":\"UTC\"}"}}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4}});
        let r = p.parse_reply(&v).unwrap();
        assert_eq!(r.text, "");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "c1".into(),
                name: "time_now".into(),
                arguments: json!({"tz": "UTC"})
            }]
        );
        assert_eq!(
            r.usage,
            Some(Usage {
                input_tokens: 3,
                output_tokens: 4
            })
        );
        assert!(matches!(
            p.parse_reply(&json!({"choices": []})),
            Err(ModelError::InvalidResponse { .. })
        ));
        assert!(matches!(
            p.parse_reply(&json!({"choices": [{"finish_reason": "content_filter", "message": {"content": ""}}]})),
            Err(ModelError::Refused { .. })
        ));
    }
}
