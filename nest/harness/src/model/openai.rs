//! The OpenAI-compatible Chat Completions client (`POST {baseUrl}/chat/completions`): OpenAI,
//! vLLM, llama.cpp server, Ollama and anything else that speaks the API, with native `tools`
//! and `tool_calls`.
//!
//! Invariants: no `tools` (nor `parallel_tool_calls`) field is sent when the request offers no
//! tools; the `Authorization` header is sent only when an API key is configured; a
//! `content_filter` finish or a `refusal` is a [`ModelError::Refused`].

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::{
    parse_arguments, post_json, Message, ModelConfig, ModelError, ModelProvider, ModelReply,
    ModelRequest, ToolCall, Usage,
};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const PROVIDER: &str = "openai";

pub struct OpenAiProvider {
    config: ModelConfig,
    url: String,
    http: reqwest::Client,
}

impl OpenAiProvider {
    pub fn new(config: ModelConfig, http: reqwest::Client) -> OpenAiProvider {
        let base = config
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let url = format!("{}/chat/completions", base.trim_end_matches('/'));
        OpenAiProvider { config, url, http }
    }

    /// The request body for `req` (public for tests and the fake model's docs).
    pub fn body(&self, req: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(req.messages.len() + 1);
        if !req.system.is_empty() {
            messages.push(json!({"role": "system", "content": req.system}));
        }
        for m in &req.messages {
            messages.push(match m {
                Message::System { content } => json!({"role": "system", "content": content}),
                Message::User { content } => json!({"role": "user", "content": content}),
                Message::Assistant { content, tool_calls } => {
                    let mut o = Map::new();
                    o.insert("role".into(), json!("assistant"));
                    o.insert("content".into(), if content.is_empty() && !tool_calls.is_empty() { Value::Null } else { json!(content) });
                    if !tool_calls.is_empty() {
                        let calls: Vec<Value> = tool_calls
                            .iter()
                            .map(|c| {
                                let args = match &c.arguments {
                                    Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                };
                                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
                            })
                            .collect();
                        o.insert("tool_calls".into(), Value::Array(calls));
                    }
                    Value::Object(o)
                }
                Message::Tool { call_id, content, .. } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
            });
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.config.model.model));
        body.insert("messages".into(), Value::Array(messages));
        if !req.tools.is_empty() {
            let tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            body.insert("parallel_tool_calls".into(), json!(req.parallel_tool_calls));
        }
        if let Some(t) = self.config.extra.get("temperature") {
            body.insert("temperature".into(), t.clone());
        }
        if let Some(n) = self.config.extra.get("maxTokens") {
            body.insert("max_tokens".into(), n.clone());
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
    ) -> Result<ModelReply, ModelError> {
        let mut headers = Vec::new();
        if let Some(key) = self.config.api_key.as_deref().filter(|k| !k.is_empty()) {
            headers.push(("authorization", format!("Bearer {key}")));
        }
        let v = post_json(
            &self.http,
            PROVIDER,
            &self.url,
            &headers,
            &self.body(req),
            &self.config.retry,
            cancel,
        )
        .await?;
        self.parse_reply(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolSpec;
    use agen_shared::bundle::ModelRef;

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
            messages: vec![Message::user("hi")],
            ..Default::default()
        };
        assert_eq!(
            p.body(&req),
            json!({"model": "gpt-4.1-mini", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
        );
        req.tools.push(ToolSpec {
            name: "t_x".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        });
        req.parallel_tool_calls = true;
        let b = p.body(&req);
        assert_eq!(
            b["tools"][0],
            json!({"type": "function", "function": {"name": "t_x", "description": "d", "parameters": {"type": "object"}}})
        );
        assert_eq!(b["parallel_tool_calls"], json!(true));
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
