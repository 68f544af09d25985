//! Streamed model answers: the request with `stream: true`, read as Server-Sent Events while
//! they arrive, each text piece handed to the caller's [`Deltas`] at once, the pieces
//! assembled into the same response JSON a non-streamed answer has, so each provider's one
//! `parse_reply` reads both. A server that ignores `stream` and answers plain JSON is read as
//! before (its whole text is one delta).
//!
//! Invariants: retries follow the same [`RetryPolicy`] as before; a retry after text was
//! handed out first hands out [`ModelDelta::Reset`], so the text after the last reset is the
//! text of the reply returned; a stream that ends before its end marker is a connection
//! failure (retried), never a short answer.

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{error_chain, error_message, Attempt, ModelError, ModelReply, RetryPolicy};

/// One piece of a streamed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelDelta<'a> {
    /// The next text of the answer.
    Text(&'a str),
    /// Drop the text handed out so far for this turn: the answer starts again (a retry).
    Reset,
}

/// Where a provider hands the pieces of an answer as they arrive.
pub type Deltas<'a> = &'a (dyn Fn(ModelDelta<'_>) + Send + Sync);

/// A provider's reader of one streamed answer.
pub(crate) trait StreamReader: Send {
    /// One SSE event (`event` is empty when the server named none); returns the text it adds.
    fn event(&mut self, event: &str, data: &str) -> Result<Option<String>, ModelError>;
    /// Whether the stream's end marker was read.
    fn complete(&self) -> bool;
    /// The whole answer as the provider's non-streamed response JSON.
    fn finish(self: Box<Self>) -> Value;
}

/// What a streamed request needs besides its body.
pub(crate) struct StreamCall<'a> {
    pub http: &'a reqwest::Client,
    pub provider: &'static str,
    pub url: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub policy: &'a RetryPolicy,
    pub cancel: &'a CancellationToken,
    pub deltas: Deltas<'a>,
}

/// Responses larger than this are refused as invalid (a stream: its text, framing aside).
const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// A stream's bytes on the wire (SSE framing of small pieces costs several times the text).
const MAX_STREAM_BYTES: usize = 16 * MAX_RESPONSE_BYTES;

/// Posts `body` (which asks for a stream) with retries; returns the parsed reply.
pub(crate) async fn post_stream(
    call: &StreamCall<'_>,
    body: &(impl serde::Serialize + Sync),
    new_reader: &(dyn Fn() -> Box<dyn StreamReader> + Sync),
    parse: &(dyn Fn(&Value) -> Result<ModelReply, ModelError> + Sync),
) -> Result<ModelReply, ModelError> {
    let max_tries = call.policy.max_tries.max(1);
    let mut tries = 0;
    let mut handed_out = false;
    loop {
        tries += 1;
        if handed_out {
            (call.deltas)(ModelDelta::Reset);
            handed_out = false;
        }
        let attempt = tokio::select! {
            _ = call.cancel.cancelled() => return Err(ModelError::Cancelled),
            a = stream_once(call, body, tries, new_reader, &mut handed_out) => a,
        };
        let (error, retry_after) = match attempt {
            Attempt::Done(v) => {
                let reply = parse(&v)?;
                if !handed_out && !reply.text.is_empty() {
                    (call.deltas)(ModelDelta::Text(&reply.text));
                }
                return Ok(reply);
            }
            Attempt::Fatal(e) => return Err(e),
            Attempt::Retry { error, retry_after } => (error, retry_after),
        };
        if tries >= max_tries {
            return Err(error);
        }
        let wait = call.policy.delay(tries + 1, retry_after);
        tracing::warn!(
            provider = call.provider,
            url = call.url,
            try_number = tries,
            wait_ms = wait.as_millis() as u64,
            "model request failed, retrying: {error}"
        );
        tokio::select! {
            _ = call.cancel.cancelled() => return Err(ModelError::Cancelled),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One try. `Done` carries the whole answer as the provider's response JSON; for a streamed
/// one, `handed_out` says whether text went to the caller.
async fn stream_once(
    call: &StreamCall<'_>,
    body: &(impl serde::Serialize + Sync),
    tries: u32,
    new_reader: &(dyn Fn() -> Box<dyn StreamReader> + Sync),
    handed_out: &mut bool,
) -> Attempt {
    let connect = |message: String| Attempt::Retry {
        error: ModelError::Connect {
            provider: call.provider,
            url: call.url.to_string(),
            message,
            tries,
        },
        retry_after: None,
    };
    let invalid = |message: String| {
        Attempt::Fatal(ModelError::InvalidResponse {
            provider: call.provider,
            url: call.url.to_string(),
            message,
        })
    };
    let mut rb = call.http.post(call.url).json(body);
    for (k, v) in call.headers {
        rb = rb.header(*k, v);
    }
    let mut resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return connect(error_chain(&e)),
    };
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let is_sse = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !status.is_success() || !is_sse {
        let bytes = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return connect(format!("reading the response: {}", error_chain(&e))),
        };
        if bytes.len() > MAX_RESPONSE_BYTES {
            return invalid(format!(
                "the response is {} bytes, more than the {MAX_RESPONSE_BYTES} allowed",
                bytes.len()
            ));
        }
        if status.is_success() {
            return match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => Attempt::Done(v),
                Err(e) => invalid(format!("not JSON: {e}")),
            };
        }
        let error = ModelError::Status {
            provider: call.provider,
            url: call.url.to_string(),
            status: status.as_u16(),
            message: error_message(&bytes, status.as_u16()),
            tries,
        };
        return if status.as_u16() == 429 || status.is_server_error() {
            Attempt::Retry { error, retry_after }
        } else {
            Attempt::Fatal(error)
        };
    }
    let mut reader = new_reader();
    let mut events = EventSplitter::default();
    let mut total = 0usize;
    let mut text_bytes = 0usize;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return connect(format!("reading the stream: {}", error_chain(&e))),
        };
        total += chunk.len();
        if total > MAX_STREAM_BYTES {
            return invalid(format!(
                "the stream is more than the {MAX_STREAM_BYTES} bytes allowed"
            ));
        }
        for (event, data) in events.push(&chunk) {
            match reader.event(&event, &data) {
                Ok(Some(text)) if !text.is_empty() => {
                    text_bytes += text.len();
                    if text_bytes > MAX_RESPONSE_BYTES {
                        return invalid(format!(
                            "the streamed answer is more than the {MAX_RESPONSE_BYTES} bytes allowed"
                        ));
                    }
                    *handed_out = true;
                    (call.deltas)(ModelDelta::Text(&text));
                }
                Ok(_) => {}
                Err(e) => return Attempt::Fatal(e),
            }
        }
    }
    if !reader.complete() {
        return connect("the stream ended before the answer was complete".to_string());
    }
    Attempt::Done(reader.finish())
}

/// Splits an SSE byte stream into `(event, data)` pairs (data lines joined with `\n`).
#[derive(Default)]
struct EventSplitter {
    pending: Vec<u8>,
    event: String,
    data: Option<String>,
}

impl EventSplitter {
    fn push(&mut self, bytes: &[u8]) -> Vec<(String, String)> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    out.push((std::mem::take(&mut self.event), data));
                }
                self.event.clear();
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => self.event = value.to_string(),
                "data" => match &mut self.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => self.data = Some(value.to_string()),
                },
                _ => {} // comments (`: ping`), ids and retry hints
            }
        }
        out
    }
}

/// The message of an `error` object a provider sends inside a stream.
pub(crate) fn stream_error(provider: &'static str, url: &str, v: &Value) -> Option<ModelError> {
    let e = v.get("error").filter(|e| !e.is_null())?;
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string());
    Some(ModelError::InvalidResponse {
        provider,
        url: url.to_string(),
        message: format!("the stream reported an error: {message}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_lines() {
        let mut s = EventSplitter::default();
        assert!(s.push(b"event: a\r\ndata: {\"x\"").is_empty());
        assert_eq!(
            s.push(b":1}\r\n\r\n: ping\n\ndata: one\ndata: two\n\ndata: [DONE]\n\n"),
            vec![
                ("a".to_string(), "{\"x\":1}".to_string()),
                (String::new(), "one\ntwo".to_string()),
                (String::new(), "[DONE]".to_string()),
            ]
        );
    }
}
