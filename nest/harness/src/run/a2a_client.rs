//! A client of remote A2A agents: A2A v1.0, JSON-RPC binding, as PyPI `a2a-sdk` 1.3 speaks it
//! (`A2A-Version: 1.0` header, proto JSON field names, `TASK_STATE_*` / `ROLE_*` enums). It
//! fetches an agent card and finds its JSON-RPC interface, sends a message (`SendMessage`, never
//! blocking: the task comes back at once), polls a task (`GetTask`), finds the task a message
//! made (`ListTasks` of its context) and cancels one (`CancelTask`); [`reply_text`] is what the
//! calling model reads of a finished task.
//!
//! Invariants: every request and reply is a typed struct (no `json!`); the bearer token goes
//! only into the `Authorization` header of requests to the origin (scheme, host, port) of the
//! card the bundle names, over https (http only to the loopback), never into an error text;
//! an interface URL on another origin is called without it; redirects are not followed (the
//! client is built with none: a 3xx is an error naming its status); errors say what failed (unreachable, an HTTP status, a card that is not an A2A 1.x
//! card, a JSON-RPC error) and where, without the caller's name, which the caller adds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The protocol version this client speaks (the `A2A-Version` header).
pub const A2A_VERSION: &str = "1.0";

/// How long one HTTP request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Replies longer than this are not read.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// Why an A2A request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum A2aError {
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url} refused the token (HTTP {status}); check the delegate's token secret")]
    Unauthorized { url: String, status: u16 },
    #[error("{url} answered HTTP {status}: {body}")]
    Http {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the agent card at {url} is not an A2A 1.x card: {detail}")]
    BadCard { url: String, detail: String },
    #[error("{method} at {url}: the reply is not A2A JSON-RPC: {detail}")]
    BadReply {
        method: &'static str,
        url: String,
        detail: String,
    },
    #[error("{method} at {url} failed: JSON-RPC error {code}: {message}")]
    Rpc {
        method: &'static str,
        url: String,
        code: i64,
        message: String,
    },
}

impl A2aError {
    /// Whether asking again later may work (the agent is down or overloaded for a moment).
    pub fn is_transient(&self) -> bool {
        match self {
            A2aError::Unreachable { .. } => true,
            A2aError::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

// ---- wire types (proto JSON of a2a.proto v1.0; the data types are agen_contract::a2a) ----

pub use agen_contract::a2a::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};

/// The parts of an agent card this client reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub supported_interfaces: Vec<AgentInterface>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub protocol_binding: String,
    #[serde(default)]
    pub protocol_version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Answer with the task as soon as it exists, without waiting for it to end.
    pub return_immediately: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_output_modes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    pub message: Message,
    pub configuration: SendMessageConfiguration,
}

/// `SendMessage`'s answer: a task, or (an agent that answers at once) a message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageResponse {
    #[serde(default)]
    pub task: Option<Task>,
    #[serde(default)]
    pub message: Option<Message>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskIdRequest {
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    pub context_id: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    #[serde(default)]
    pub tasks: Vec<Task>,
}

#[derive(Debug, Serialize)]
struct JsonRpcRequest<'a, P> {
    jsonrpc: &'static str,
    id: String,
    method: &'a str,
    params: P,
}

#[derive(Debug, Deserialize)]
struct JsonRpcResponse<R> {
    #[serde(default = "Option::default")]
    result: Option<R>,
    #[serde(default)]
    error: Option<JsonRpcError>,
}

#[derive(Debug, Deserialize)]
struct JsonRpcError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

// ---- the client ----

/// An A2A client over one HTTP client (rustls).
#[derive(Clone)]
pub struct A2aClient {
    http: reqwest::Client,
    /// The origin of the card the bundle names: the only one the token goes to.
    card_origin: Option<(String, String, u16)>,
}

/// `(scheme, host, port)` of an http(s) URL, lowercased, the port defaulted by scheme.
fn origin(url: &str) -> Option<(String, String, u16)> {
    let u = reqwest::Url::parse(url).ok()?;
    let scheme = u.scheme().to_ascii_lowercase();
    if scheme != "https" && scheme != "http" {
        return None;
    }
    Some((
        scheme,
        u.host_str()?.to_ascii_lowercase(),
        u.port_or_known_default()?,
    ))
}

impl A2aClient {
    /// A client for the agent whose card is at `card_url`, on an HTTP client that follows no
    /// redirects.
    pub fn for_card(card_url: &str) -> Result<A2aClient, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(A2aClient {
            http,
            card_origin: origin(card_url),
        })
    }

    /// `token` when `url` is on the card's origin over https (or http to the loopback).
    fn token_for<'a>(&self, url: &str, token: Option<&'a str>) -> Option<&'a str> {
        let o = origin(url)?;
        let secure = o.0 == "https"
            || o.1 == "localhost"
            || o.1
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        (secure && self.card_origin.as_ref() == Some(&o))
            .then_some(token)
            .flatten()
    }

    /// Fetches the card at `card_url` and returns the URL of its JSON-RPC interface.
    pub async fn endpoint(&self, card_url: &str, token: Option<&str>) -> Result<String, A2aError> {
        let req = self.http.get(card_url).header("A2A-Version", A2A_VERSION);
        let body = self
            .send(card_url, with_token(req, self.token_for(card_url, token)))
            .await?;
        let card: AgentCard = serde_json::from_slice(&body).map_err(|e| A2aError::BadCard {
            url: card_url.to_string(),
            detail: format!("not a card's JSON: {e}"),
        })?;
        jsonrpc_interface(&card).ok_or_else(|| {
            let found: Vec<String> = card
                .supported_interfaces
                .iter()
                .map(|i| format!("{} {} at {}", i.protocol_binding, i.protocol_version, i.url))
                .collect();
            A2aError::BadCard {
                url: card_url.to_string(),
                detail: if found.is_empty() {
                    "it lists no supportedInterfaces".to_string()
                } else {
                    format!(
                        "it has no JSONRPC interface of A2A 1.x (it lists: {})",
                        found.join("; ")
                    )
                },
            }
        })
    }

    /// `SendMessage` of `text` as a user message with id `message_id` (and `context_id`, when
    /// not empty); answers as soon as the remote task exists.
    pub async fn send_message(
        &self,
        endpoint: &str,
        token: Option<&str>,
        message_id: &str,
        context_id: &str,
        text: &str,
    ) -> Result<SendMessageResponse, A2aError> {
        let params = SendMessageRequest {
            message: Message {
                message_id: message_id.to_string(),
                context_id: (!context_id.is_empty()).then(|| context_id.to_string()),
                task_id: None,
                role: Role::User,
                parts: vec![Part {
                    text: Some(text.to_string()),
                    ..Part::default()
                }],
            },
            configuration: SendMessageConfiguration {
                return_immediately: true,
                accepted_output_modes: vec!["text/plain".into(), "application/json".into()],
            },
        };
        let reply: SendMessageResponse = self.call(endpoint, token, "SendMessage", &params).await?;
        if reply.task.is_none() && reply.message.is_none() {
            return Err(A2aError::BadReply {
                method: "SendMessage",
                url: endpoint.to_string(),
                detail: "it holds neither a task nor a message".into(),
            });
        }
        Ok(reply)
    }

    /// `GetTask`.
    pub async fn get_task(
        &self,
        endpoint: &str,
        token: Option<&str>,
        id: &str,
    ) -> Result<Task, A2aError> {
        let params = TaskIdRequest { id: id.to_string() };
        self.call(endpoint, token, "GetTask", &params).await
    }

    /// The task of context `context_id` that message `message_id` made, if the agent has one
    /// (`ListTasks`, first page: a context made for one call holds one task).
    pub async fn find_task(
        &self,
        endpoint: &str,
        token: Option<&str>,
        context_id: &str,
        message_id: &str,
    ) -> Result<Option<Task>, A2aError> {
        let params = ListTasksRequest {
            context_id: context_id.to_string(),
        };
        let page: ListTasksResponse = self.call(endpoint, token, "ListTasks", &params).await?;
        Ok(page
            .tasks
            .into_iter()
            .find(|t| t.history.iter().any(|m| m.message_id == message_id)))
    }

    /// `CancelTask`.
    pub async fn cancel_task(
        &self,
        endpoint: &str,
        token: Option<&str>,
        id: &str,
    ) -> Result<Task, A2aError> {
        let params = TaskIdRequest { id: id.to_string() };
        self.call(endpoint, token, "CancelTask", &params).await
    }

    async fn call<P: Serialize, R: serde::de::DeserializeOwned>(
        &self,
        endpoint: &str,
        token: Option<&str>,
        method: &'static str,
        params: &P,
    ) -> Result<R, A2aError> {
        let body = JsonRpcRequest {
            jsonrpc: "2.0",
            id: uuid::Uuid::new_v4().to_string(),
            method,
            params,
        };
        let req = self
            .http
            .post(endpoint)
            .header("A2A-Version", A2A_VERSION)
            .json(&body);
        let bytes = self
            .send(endpoint, with_token(req, self.token_for(endpoint, token)))
            .await?;
        let bad = |detail: String| A2aError::BadReply {
            method,
            url: endpoint.to_string(),
            detail,
        };
        let reply: JsonRpcResponse<R> =
            serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if let Some(e) = reply.error {
            return Err(A2aError::Rpc {
                method,
                url: endpoint.to_string(),
                code: e.code,
                message: e.message,
            });
        }
        reply
            .result
            .ok_or_else(|| bad("it has neither `result` nor `error`".into()))
    }

    async fn send(&self, url: &str, req: reqwest::RequestBuilder) -> Result<Vec<u8>, A2aError> {
        let resp =
            req.timeout(REQUEST_TIMEOUT)
                .send()
                .await
                .map_err(|e| A2aError::Unreachable {
                    url: url.to_string(),
                    detail: error_chain(&e),
                })?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(A2aError::Unauthorized {
                url: url.to_string(),
                status: status.as_u16(),
            });
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_REPLY_BYTES as u64)
        {
            return Err(A2aError::Http {
                url: url.to_string(),
                status: status.as_u16(),
                body: format!("the reply is over {MAX_REPLY_BYTES} bytes"),
            });
        }
        let bytes = resp.bytes().await.map_err(|e| A2aError::Unreachable {
            url: url.to_string(),
            detail: format!("the reply broke off: {}", error_chain(&e)),
        })?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).to_string();
            return Err(A2aError::Http {
                url: url.to_string(),
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(bytes.to_vec())
    }
}

fn with_token(req: reqwest::RequestBuilder, token: Option<&str>) -> reqwest::RequestBuilder {
    match token {
        Some(t) => req.bearer_auth(t),
        None => req,
    }
}

/// An error and its causes, e.g. "error sending request: connection refused".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// The card's JSON-RPC interface of A2A 1.x (an empty version counts as 1.0).
fn jsonrpc_interface(card: &AgentCard) -> Option<String> {
    card.supported_interfaces
        .iter()
        .find(|i| {
            i.protocol_binding.eq_ignore_ascii_case("JSONRPC")
                && (i.protocol_version.is_empty() || i.protocol_version.starts_with("1."))
                && (i.url.starts_with("https://") || i.url.starts_with("http://"))
        })
        .map(|i| i.url.clone())
}

/// The text of `parts`: text parts as they are; other parts named (data as JSON).
fn parts_text(parts: &[Part]) -> String {
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        if let Some(t) = &p.text {
            out.push(t.clone());
        } else if let Some(d) = &p.data {
            out.push(d.to_string());
        } else if let Some(u) = &p.url {
            out.push(format!("(file {u})"));
        } else if p.raw.is_some() {
            let name = p
                .filename
                .as_deref()
                .filter(|f| !f.is_empty())
                .unwrap_or("unnamed");
            let media_type = p.media_type.as_deref().unwrap_or_default();
            out.push(format!("(bytes {name} {media_type})"));
        }
    }
    out.join("\n")
}

/// What the calling model reads of a message.
pub fn message_text(m: &Message) -> String {
    parts_text(&m.parts)
}

/// What the calling model reads of a task: its status message, then each artifact's parts.
pub fn reply_text(task: &Task) -> String {
    let mut out = task
        .status
        .message
        .as_ref()
        .map(message_text)
        .unwrap_or_default();
    for a in &task.artifacts {
        let text = parts_text(&a.parts);
        if text.is_empty() {
            continue;
        }
        let name = if a.name.is_empty() {
            &a.artifact_id
        } else {
            &a.name
        };
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!("artifact {name}:\n{text}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_token_goes_only_to_the_cards_origin_over_https_or_the_loopback() {
        let check = |card: &str, url: &str, sent: bool| {
            let c = A2aClient::for_card(card).expect("client");
            assert_eq!(
                c.token_for(url, Some("t")).is_some(),
                sent,
                "{card} -> {url}"
            );
        };
        check(
            "https://a.test/.well-known/agent-card.json",
            "https://a.test/a2a",
            true,
        );
        check(
            "https://a.test/.well-known/agent-card.json",
            "https://A.test:443/x",
            true,
        );
        check(
            "https://a.test/.well-known/agent-card.json",
            "https://b.test/a2a",
            false,
        );
        check(
            "https://a.test/.well-known/agent-card.json",
            "https://a.test:8443/a2a",
            false,
        );
        check(
            "https://a.test/.well-known/agent-card.json",
            "http://a.test/a2a",
            false,
        );
        check("http://127.0.0.1:7/card", "http://127.0.0.1:7/a2a", true);
        check("http://localhost:7/card", "http://localhost:7/a2a", true);
        check("http://[::1]:7/card", "http://[::1]:7/a2a", true);
        check("http://10.0.0.1:7/card", "http://10.0.0.1:7/a2a", false);
        check("http://127.0.0.1:7/card", "http://127.0.0.1:8/a2a", false);
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed_and_carries_no_token() {
        use std::io::{Read, Write};
        // The card answers 302 to a second server, which must never be asked.
        let second = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let to = second.local_addr().expect("addr");
        second.set_nonblocking(true).expect("nonblocking");
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let card = format!(
            "http://{}/.well-known/agent-card.json",
            first.local_addr().expect("addr")
        );
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = first.accept() {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = write!(
                    c,
                    "HTTP/1.1 302 Found\r\nlocation: http://{to}/card\r\ncontent-length: 0\r\n\r\n"
                );
            }
        });
        let client = A2aClient::for_card(&card).expect("client");
        let err = client
            .endpoint(&card, Some("secret"))
            .await
            .expect_err("302");
        assert!(matches!(err, A2aError::Http { status: 302, .. }), "{err}");
        assert!(second.accept().is_err(), "the redirect was followed");
    }

    #[test]
    fn requests_have_the_proto_json_shape_a2a_sdk_reads() {
        let body = JsonRpcRequest {
            jsonrpc: "2.0",
            id: "1".into(),
            method: "SendMessage",
            params: SendMessageRequest {
                message: Message {
                    message_id: "run-1:0".into(),
                    context_id: None,
                    task_id: None,
                    role: Role::User,
                    parts: vec![Part {
                        text: Some("hi".into()),
                        ..Part::default()
                    }],
                },
                configuration: SendMessageConfiguration {
                    return_immediately: true,
                    accepted_output_modes: vec![],
                },
            },
        };
        assert_eq!(
            serde_json::to_string(&body).ok(),
            Some(r#"{"jsonrpc":"2.0","id":"1","method":"SendMessage","params":{"message":{"messageId":"run-1:0","role":"ROLE_USER","parts":[{"text":"hi"}]},"configuration":{"returnImmediately":true}}}"#.to_string())
        );
    }

    #[test]
    fn a_finished_task_reads_as_its_status_message_and_artifacts() {
        let raw = r#"{"id":"t1","contextId":"c1","status":{"state":"TASK_STATE_COMPLETED","message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"remote says: hello"}]},"timestamp":"2026-12-01T16:07:17Z"},
            "artifacts":[{"artifactId":"a1","name":"answer.txt","parts":[{"text":"artifact: hello"},{"data":{"n":1}}]}],"history":[],"somethingNew":1}"#;
        let task: Task = serde_json::from_str(raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(task.status.state, TaskState::Completed);
        assert!(task.status.state.is_terminal());
        assert_eq!(
            reply_text(&task),
            "remote says: hello\n\nartifact answer.txt:\nartifact: hello\n{\"n\":1}"
        );
        let odd: TaskStatus = serde_json::from_str(r#"{"state":"TASK_STATE_SOMETHING_NEW"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(odd.state, TaskState::Unspecified);
    }

    #[test]
    fn the_card_gives_its_jsonrpc_interface_of_version_one() {
        let card: AgentCard = serde_json::from_str(
            r#"{"name":"x","supportedInterfaces":[{"url":"https://h/grpc","protocolBinding":"GRPC","protocolVersion":"1.0"},
                {"url":"https://h/old","protocolBinding":"JSONRPC","protocolVersion":"0.3"},
                {"url":"https://h/rpc","protocolBinding":"JSONRPC","protocolVersion":"1.0"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jsonrpc_interface(&card), Some("https://h/rpc".to_string()));
        let none: AgentCard = serde_json::from_str(r#"{"name":"x","url":"https://h/"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(jsonrpc_interface(&none), None);
    }
}
