//! The Anthropic Messages client (`POST {baseUrl}/v1/messages`, `x-api-key`,
//! `anthropic-version: 2023-06-01`): the system prompt travels apart from the messages, tool
//! calls are `tool_use` blocks and their results `tool_result` blocks in a user message.
//!
//! Invariants: messages alternate user/assistant (consecutive messages of one role, such as
//! several tool results followed by a user prompt, are merged into one message of blocks);
//! `max_tokens` is always sent (`maxTokens` in the front matter, default 4096); a `refusal`
//! stop is a [`ModelError::Refused`].

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::sse::{post_stream, stream_error, StreamCall, StreamReader};
use super::{
    max_tokens, parse_arguments, Deltas, Message, ModelConfig, ModelError, ModelProvider,
    ModelReply, ModelRequest, ToolCall, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";
const PROVIDER: &str = "anthropic";

pub struct AnthropicProvider {
    config: ModelConfig,
    url: String,
    http: reqwest::Client,
}

impl AnthropicProvider {
    pub fn new(config: ModelConfig, http: reqwest::Client) -> AnthropicProvider {
        let base = config
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let base = base.trim_end_matches('/');
        // `baseUrl: https://host/v1` and `baseUrl: https://host` both work.
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        AnthropicProvider { config, url, http }
    }

    /// The request body for `req`.
    pub fn body(&self, req: &ModelRequest) -> Value {
        let mut messages: Vec<(String, Vec<Value>)> = Vec::new();
        let mut system = req.system.clone();
        for m in req.messages.iter() {
            let (role, blocks) = match m {
                Message::System { content } => {
                    if !system.is_empty() {
                        system.push_str("\n\n");
                    }
                    system.push_str(content);
                    continue;
                }
                Message::User { content } => {
                    ("user", vec![json!({"type": "text", "text": content})])
                }
                Message::Assistant {
                    content,
                    tool_calls,
                } => {
                    let mut blocks = Vec::new();
                    if !content.is_empty() {
                        blocks.push(json!({"type": "text", "text": content}));
                    }
                    for c in tool_calls {
                        let input = if c.arguments.is_object() {
                            c.arguments.clone()
                        } else {
                            json!({"_raw": c.arguments})
                        };
                        blocks.push(
                            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                        );
                    }
                    if blocks.is_empty() {
                        blocks.push(json!({"type": "text", "text": "(no answer)"}));
                    }
                    ("assistant", blocks)
                }
                Message::Tool {
                    call_id,
                    content,
                    is_error,
                    ..
                } => {
                    let mut b =
                        json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
                    if *is_error {
                        b["is_error"] = json!(true);
                    }
                    ("user", vec![b])
                }
            };
            match messages.last_mut() {
                Some((r, existing)) if r == role => existing.extend(blocks),
                _ => messages.push((role.to_string(), blocks)),
            }
        }
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let mut body = Map::new();
        body.insert("model".into(), json!(self.config.model.model));
        body.insert(
            "max_tokens".into(),
            json!(max_tokens(&self.config.extra, 4096)),
        );
        if !system.is_empty() {
            body.insert("system".into(), json!(system));
        }
        body.insert("messages".into(), Value::Array(messages));
        if !req.tools.is_empty() {
            let tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            body.insert(
                "tool_choice".into(),
                json!({"type": "auto", "disable_parallel_tool_use": !req.parallel_tool_calls}),
            );
        }
        if let Some(t) = self.config.extra.get("temperature") {
            body.insert("temperature".into(), t.clone());
        }
        Value::Object(body)
    }

    fn invalid(&self, message: impl Into<String>) -> ModelError {
        ModelError::InvalidResponse {
            provider: PROVIDER,
            url: self.url.clone(),
            message: message.into(),
        }
    }

    /// Reads a Messages response.
    pub fn parse_reply(&self, v: &Value) -> Result<ModelReply, ModelError> {
        let stop = v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_string);
        if stop.as_deref() == Some("refusal") {
            return Err(ModelError::Refused {
                provider: PROVIDER,
                message: "the model declined to answer (stop_reason refusal)".into(),
            });
        }
        let blocks = v
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| self.invalid("no `content` array in the response"))?;
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => {
                    text.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default())
                }
                Some("tool_use") => {
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| self.invalid(format!("`content[{i}].name` is missing")))?;
                    let id = b
                        .get("id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("toolu_{}", uuid::Uuid::new_v4().simple()));
                    let arguments = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    tool_calls.push(ToolCall {
                        id,
                        name: name.to_string(),
                        arguments,
                    });
                }
                _ => {} // thinking and other blocks are not part of the answer
            }
        }
        let usage = v.get("usage").map(|u| Usage {
            input_tokens: u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
            output_tokens: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
        });
        Ok(ModelReply {
            text,
            tool_calls,
            stop_reason: stop,
            usage,
            id: v.get("id").and_then(Value::as_str).map(str::to_string),
            model: v.get("model").and_then(Value::as_str).map(str::to_string),
        })
    }
}

#[async_trait::async_trait]
impl ModelProvider for AnthropicProvider {
    fn describe(&self) -> String {
        self.config.model.to_string()
    }

    async fn complete(
        &self,
        req: &ModelRequest,
        cancel: &CancellationToken,
        deltas: Deltas<'_>,
    ) -> Result<ModelReply, ModelError> {
        let mut headers = vec![("anthropic-version", API_VERSION.to_string())];
        if let Some(key) = self.config.api_key.as_deref().filter(|k| !k.is_empty()) {
            headers.push(("x-api-key", key.to_string()));
        }
        let mut body = self.body(req);
        if let Value::Object(map) = &mut body {
            map.insert("stream".into(), Value::Bool(true));
        }
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
            &move || Box::new(EventReader::new(url.clone())),
            &|v| self.parse_reply(v),
        )
        .await
    }
}

/// Reads a streamed Messages answer (`message_start`, content block starts, deltas and stops,
/// `message_delta`, `message_stop`).
#[derive(Default)]
struct EventReader {
    url: String,
    /// The content blocks by index, with a tool call's input JSON text so far.
    blocks: std::collections::BTreeMap<u64, (Value, String)>,
    stop: Option<String>,
    /// `message_start`'s message `id` and `model`.
    id: Option<Value>,
    model: Option<Value>,
    input_tokens: u64,
    output_tokens: u64,
    done: bool,
}

impl EventReader {
    fn new(url: String) -> EventReader {
        EventReader {
            url,
            ..Default::default()
        }
    }
}

impl StreamReader for EventReader {
    fn event(&mut self, _event: &str, data: &str) -> Result<Option<String>, ModelError> {
        let v: Value = serde_json::from_str(data).map_err(|e| ModelError::InvalidResponse {
            provider: PROVIDER,
            url: self.url.clone(),
            message: format!("a stream event is not JSON: {e}"),
        })?;
        if let Some(e) = stream_error(PROVIDER, &self.url, &v) {
            return Err(e);
        }
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let tokens =
            |u: Option<&Value>, key: &str| u.and_then(|u| u.get(key)).and_then(Value::as_u64);
        match v.get("type").and_then(Value::as_str).unwrap_or_default() {
            "message_start" => {
                let usage = v.pointer("/message/usage");
                self.id = v.pointer("/message/id").cloned();
                self.model = v.pointer("/message/model").cloned();
                self.input_tokens = tokens(usage, "input_tokens").unwrap_or(0);
                self.output_tokens = tokens(usage, "output_tokens").unwrap_or(0);
            }
            "content_block_start" => {
                let block = v.get("content_block").cloned().unwrap_or(Value::Null);
                let text = block
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.blocks.insert(index, (block, String::new()));
                return Ok(text);
            }
            "content_block_delta" => {
                let Some((block, json_text)) = self.blocks.get_mut(&index) else {
                    return Ok(None);
                };
                let delta = v.get("delta");
                match delta.and_then(|d| d.get("type")).and_then(Value::as_str) {
                    Some("text_delta") => {
                        let t = delta
                            .and_then(|d| d.get("text"))
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string();
                        let sofar = block.get("text").and_then(Value::as_str).unwrap_or("");
                        block["text"] = Value::String(format!("{sofar}{t}"));
                        return Ok(Some(t));
                    }
                    Some("input_json_delta") => {
                        if let Some(p) = delta
                            .and_then(|d| d.get("partial_json"))
                            .and_then(Value::as_str)
                        {
                            json_text.push_str(p);
                        }
                    }
                    _ => {} // thinking and signature deltas are not part of the answer
                }
            }
            "message_delta" => {
                if let Some(s) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop = Some(s.to_string());
                }
                if let Some(n) = tokens(v.get("usage"), "output_tokens") {
                    self.output_tokens = n;
                }
                if let Some(n) = tokens(v.get("usage"), "input_tokens") {
                    self.input_tokens = self.input_tokens.max(n);
                }
            }
            "message_stop" => self.done = true,
            _ => {} // ping, content_block_stop
        }
        Ok(None)
    }

    fn complete(&self) -> bool {
        self.done
    }

    fn finish(self: Box<Self>) -> Value {
        let content: Vec<Value> = self
            .blocks
            .into_values()
            .map(|(mut block, json_text)| {
                if block.get("type").and_then(Value::as_str) == Some("tool_use")
                    && !json_text.trim().is_empty()
                {
                    block["input"] = parse_arguments(&json_text);
                }
                block
            })
            .collect();
        json!({"content": content, "stop_reason": self.stop, "id": self.id, "model": self.model,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_shared::bundle::ModelRef;

    fn provider(base: &str) -> AnthropicProvider {
        let mut c = ModelConfig::new(ModelRef::parse("anthropic/claude-sonnet-4-5").unwrap());
        c.base_url = Some(base.into());
        AnthropicProvider::new(c, reqwest::Client::new())
    }

    #[test]
    fn url_accepts_base_with_or_without_v1() {
        assert_eq!(provider("http://h:1").url, "http://h:1/v1/messages");
        assert_eq!(provider("http://h:1/v1/").url, "http://h:1/v1/messages");
    }

    #[test]
    fn tool_results_and_prompts_merge_into_one_user_message() {
        let p = provider("http://h:1");
        let req = ModelRequest {
            system: "sys".into(),
            messages: vec![
                Message::user("time?"),
                Message::Assistant {
                    content: String::new(),
                    tool_calls: vec![ToolCall {
                        id: "t1".into(),
                        name: "time_now".into(),
                        arguments: json!({}),
                    }],
                },
                Message::Tool {
                    call_id: "t1".into(),
                    name: "time_now".into(),
                    content: "noon".into(),
                    is_error: false,
                },
                Message::user("and?"),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(
            p.body(&req),
            json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "system": "sys", "messages": [
                {"role": "user", "content": [{"type": "text", "text": "time?"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "time_now", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "noon"}, {"type": "text", "text": "and?"}]}
            ]})
        );
    }

    #[test]
    fn reply_blocks_are_parsed() {
        let p = provider("http://h:1");
        let r = p
            .parse_reply(&json!({"content": [{"type": "text", "text": "let me check"}, {"type": "tool_use", "id": "t1", "name": "x_y", "input": {"a": 1}}], "stop_reason": "tool_use"}))
            .unwrap();
        assert_eq!(r.text, "let me check");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "t1".into(),
                name: "x_y".into(),
                arguments: json!({"a": 1})
            }]
        );
    }
}
