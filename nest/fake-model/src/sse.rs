//! The fake model's streamed answers (a request with `"stream": true`): the reply's text in
//! pieces of `chunk_chars` characters (default 8), `chunk_delay_ms` apart (default 0), as
//! OpenAI `chat.completion.chunk` events ending in `[DONE]`, or as Anthropic Messages events
//! (`message_start` … `message_stop`); tool calls follow the text whole, usage comes last.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::{Api, ScriptedCall, ScriptedUsage};

/// What one streamed answer is made of.
pub(crate) struct Streamed<'a> {
    pub api: Api,
    pub n: u64,
    pub model: Value,
    pub text: Option<String>,
    pub calls: &'a [ScriptedCall],
    pub ids: &'a [String],
    pub usage: ScriptedUsage,
    pub chunk_chars: usize,
    pub chunk_delay: Duration,
}

/// The text in pieces of `size` characters.
pub(crate) fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

pub(crate) fn response(s: Streamed<'_>) -> Response {
    let text = s.text.clone().unwrap_or_default();
    let parts = pieces(&text, s.chunk_chars);
    let mut events: Vec<(bool, String)> = Vec::new();
    let mut push = |delayed: bool, name: Option<&str>, v: Value| {
        let line = match name {
            Some(n) => format!("event: {n}\ndata: {v}\n\n"),
            None => format!("data: {v}\n\n"),
        };
        events.push((delayed, line));
    };
    match s.api {
        Api::OpenAi => {
            let id = format!("chatcmpl-fake-{}", s.n);
            let chunk = |delta: Value, finish: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": s.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            push(
                false,
                None,
                chunk(json!({"role": "assistant"}), Value::Null),
            );
            for p in &parts {
                push(true, None, chunk(json!({"content": p}), Value::Null));
            }
            for (i, (c, id)) in s.calls.iter().zip(s.ids).enumerate() {
                push(
                    false,
                    None,
                    chunk(
                        json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments.to_string()}}]}),
                        Value::Null,
                    ),
                );
            }
            let finish = if s.calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            push(false, None, chunk(json!({}), json!(finish)));
            let (i, o) = (s.usage.input_tokens, s.usage.output_tokens);
            push(
                false,
                None,
                json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": s.model, "choices": [],
                    "usage": {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}}),
            );
            events.push((false, "data: [DONE]\n\n".to_string()));
        }
        Api::Anthropic => {
            push(
                false,
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": format!("msg_fake_{}", s.n), "type": "message",
                    "role": "assistant", "model": s.model, "content": [], "stop_reason": null,
                    "usage": {"input_tokens": s.usage.input_tokens, "output_tokens": 0}}}),
            );
            let mut index = 0;
            if !text.is_empty() {
                push(
                    false,
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                );
                for p in &parts {
                    push(
                        true,
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}),
                    );
                }
                push(
                    false,
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                );
                index = 1;
            }
            for (c, id) in s.calls.iter().zip(s.ids) {
                push(
                    false,
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": c.name, "input": {}}}),
                );
                push(
                    false,
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": c.arguments.to_string()}}),
                );
                push(
                    false,
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": index}),
                );
                index += 1;
            }
            let stop = if s.calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            };
            push(
                false,
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": {"output_tokens": s.usage.output_tokens}}),
            );
            push(false, Some("message_stop"), json!({"type": "message_stop"}));
        }
    }
    let delay = s.chunk_delay;
    let mut first = true;
    let stream = futures::stream::iter(events).then(move |(delayed, line)| {
        // The first piece comes at once (the time to the first token is the step's `delay_ms`).
        let wait = if delayed && !first {
            delay
        } else {
            Duration::ZERO
        };
        first &= !delayed;
        async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Ok::<_, Infallible>(Bytes::from(line))
        }
    });
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

use futures::StreamExt as _;
