//! The A2A server: every deployment is an agent of A2A v1.0 (JSON-RPC binding, as PyPI
//! `a2a-sdk` 1.3 speaks it), on the Hub's own port and certificate.
//!
//! - `GET /a2a/<namespace>/<deployment>/.well-known/agent-card.json`: the agent card ([`card`]).
//! - `POST /a2a/<namespace>/<deployment>`: JSON-RPC `SendMessage`, `SendStreamingMessage` (SSE),
//!   `GetTask`, `CancelTask`, `SubscribeToTask` (SSE) ([`methods`], [`stream`]).
//!
//! Every request carries `Authorization: Bearer <Hub API token>` and is refused (401 unknown or
//! missing, 403 not allowed) unless the token may submit tasks in that namespace, the rule of
//! `SubmitTask`; `SendMessage`, `SendStreamingMessage` and `CancelTask` are audited like their
//! gRPC twins. A request body is at most [`body_limit`] bytes (the task input limit plus
//! [`ENVELOPE_BYTES`] for the JSON around it); larger ones get 413. The bearer is checked before
//! a byte of the body is read (a refused request's body is never read), and the body must
//! arrive within `--body-timeout` (408 otherwise).
//!
//! Invariants: the A2A task id is the Agen task id and the A2A `contextId` is the Agen
//! conversation key; every change goes through the Hub's core methods (the same code path as
//! `SubmitTask`, `CancelTask`), never through its state lock; nothing here knows protobuf.

mod card;
mod methods;
mod stream;
pub mod types;
mod view;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use crate::core::Core;
use crate::error::HubError;
use crate::tokens::{Need, Principal, Role, Tokens};
use types::{codes, RpcError, RpcRequest, RpcResponse};

/// What a client request id made from an A2A `messageId` starts with.
pub const REQUEST_ID_PREFIX: &str = "a2a:";
/// Room for the JSON-RPC envelope around a task's input in a request body.
pub const ENVELOPE_BYTES: usize = 64 * 1024;

/// The largest request body: the input limit (escaped JSON may double it) plus the envelope.
pub fn body_limit(limits: &crate::limits::Limits) -> usize {
    limits.input_bytes.saturating_mul(2) + ENVELOPE_BYTES
}

/// The path of a deployment's agent card below the Hub's URL.
pub fn card_path(namespace: &str, deployment: &str) -> String {
    format!(
        "/a2a/{}/{deployment}/.well-known/agent-card.json",
        crate::core::namespace_or_default(namespace)
    )
}

/// The A2A server's shared state.
pub struct A2a {
    core: Arc<Core>,
    tokens: Arc<Tokens>,
    /// The URL clients reach the Hub at (`--public-url`, else the listen address), no
    /// trailing slash.
    public_url: String,
    cards: card::Cards,
    /// Told when a connection's request passed the token check.
    gate: Arc<crate::conn_gate::ConnGate>,
    /// The largest request body ([`body_limit`]).
    body_limit: usize,
}

/// The A2A routes, to be merged with the gRPC routes on the Hub's port.
pub fn router(
    core: Arc<Core>,
    tokens: Arc<Tokens>,
    public_url: &str,
    gate: Arc<crate::conn_gate::ConnGate>,
) -> axum::Router {
    let limit = body_limit(&core.opts.limits);
    let state = Arc::new(A2a {
        core,
        tokens,
        public_url: public_url.trim_end_matches('/').to_string(),
        cards: card::Cards::default(),
        gate,
        body_limit: limit,
    });
    axum::Router::new()
        .route(
            "/a2a/{namespace}/{deployment}/.well-known/agent-card.json",
            get(agent_card),
        )
        .route("/a2a/{namespace}/{deployment}", post(rpc))
        .with_state(state)
}

/// A refused request: HTTP status and why.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = axum::Json(RpcResponse::err(
            Value::Null,
            RpcError {
                code: codes::INVALID_REQUEST,
                message: self.1,
            },
        ));
        let mut r = (self.0, body).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

impl A2a {
    /// The caller, when its bearer may submit tasks in `namespace` (the `SubmitTask` rule).
    fn authorize(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::SocketAddr>,
        namespace: &str,
        deployment: &str,
    ) -> Result<Principal, Refusal> {
        // Names first: nothing longer or stranger than a name is echoed back.
        crate::limits::validate_name("namespace", namespace)
            .and_then(|()| crate::limits::validate_name("deployment", deployment))
            .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("{e} (in the URL path)")))?;
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| {
                h.strip_prefix("Bearer ")
                    .or_else(|| h.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty());
        let Some(token) = token else {
            return Err(Refusal(
                StatusCode::UNAUTHORIZED,
                "missing `Authorization: Bearer <token>`; send a Hub API token that may submit tasks in this namespace (agen tokens create --namespace NS --role submitter)".into(),
            ));
        };
        let principal = self
            .tokens
            .resolve(token)
            .map_err(|e| refusal(e, "the token"))?;
        self.gate.authenticated(peer);
        let namespace = crate::core::namespace_or_default(namespace);
        principal
            .allows(Need::Role(Role::Submitter), &namespace, "A2A")
            .map_err(|e| refusal(e, "the token"))?;
        Ok(principal)
    }

    /// The interface URL of a deployment.
    fn interface_url(&self, namespace: &str, deployment: &str) -> String {
        format!(
            "{}/a2a/{}/{deployment}",
            self.public_url,
            crate::core::namespace_or_default(namespace)
        )
    }

    /// Writes the audit record of a mutating A2A call.
    async fn audit(
        &self,
        principal: &Principal,
        namespace: &str,
        call: &str,
        target: &str,
        outcome: &Result<(), RpcError>,
    ) {
        let (outcome, message) = match outcome {
            Ok(()) => ("ok", String::new()),
            Err(e) => ("refused", e.message.clone()),
        };
        let db = &self.core.db;
        if let Err(e) = crate::tokens::audit::record(
            db,
            principal.token_id(),
            principal.token_name(),
            &crate::core::namespace_or_default(namespace),
            call,
            target,
            outcome,
            &message,
        ) {
            tracing::error!(error = %e, %call, "cannot write the audit record");
        } else if let Err(e) = db.flush().await {
            tracing::error!(error = %e, %call, "cannot make the audit record durable");
        }
    }
}

fn refusal(e: HubError, what: &str) -> Refusal {
    match e {
        HubError::Unauthenticated(m) => Refusal(StatusCode::UNAUTHORIZED, m),
        HubError::PermissionDenied(m) => Refusal(StatusCode::FORBIDDEN, m),
        other => {
            tracing::error!(error = %other, "cannot check {what}");
            Refusal(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot check {what}: {other}"),
            )
        }
    }
}

/// The JSON-RPC error for a Hub error; `not_found` is the code a missing thing gets.
fn rpc_error(e: HubError, not_found: i32) -> RpcError {
    let message = crate::limits::cut(&e.to_string(), crate::limits::MAX_STATUS_MESSAGE_BYTES);
    let code = match e {
        HubError::NotFound(_) => not_found,
        HubError::InvalidArgument(_)
        | HubError::AlreadyExists(_)
        | HubError::ResourceExhausted(_)
        | HubError::Config(_) => codes::INVALID_PARAMS,
        HubError::FailedPrecondition(_) => codes::UNSUPPORTED_OPERATION,
        HubError::Unauthenticated(_) | HubError::PermissionDenied(_) => codes::INVALID_REQUEST,
        HubError::Io { .. }
        | HubError::Tls(_)
        | HubError::Store(_)
        | HubError::Serve(_)
        | HubError::Internal(_) => {
            tracing::error!(error = %message, "internal error serving A2A");
            codes::INTERNAL
        }
    };
    RpcError { code, message }
}

/// The remote address of the connection a request came on (TLS or plaintext).
fn peer_of(extensions: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| extensions.get::<TcpConnectInfo>()?.remote_addr())
}

async fn agent_card(
    State(a): State<Arc<A2a>>,
    Path((namespace, deployment)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    let peer = peer_of(request.extensions());
    if let Err(r) = a.authorize(request.headers(), peer, &namespace, &deployment) {
        return r.into_response();
    }
    let url = a.interface_url(&namespace, &deployment);
    match a.cards.card(&a.core, &namespace, &deployment, url).await {
        Ok(card) => axum::Json(card).into_response(),
        Err(HubError::NotFound(m)) => Refusal(StatusCode::NOT_FOUND, m).into_response(),
        Err(HubError::InvalidArgument(m)) => Refusal(StatusCode::BAD_REQUEST, m).into_response(),
        Err(e) => {
            tracing::error!(error = %e, %namespace, %deployment, "cannot build the agent card");
            Refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

/// The parameters of a call, as the method's type.
fn params<T: serde::de::DeserializeOwned>(
    method: &str,
    params: Option<Value>,
) -> Result<T, RpcError> {
    serde_json::from_value(params.unwrap_or(Value::Null)).map_err(|e| RpcError {
        code: codes::INVALID_PARAMS,
        message: format!("{method}: params are not a valid {method} request: {e}"),
    })
}

fn answer<T: serde::Serialize>(id: Value, result: Result<T, RpcError>) -> Response {
    match result {
        Ok(r) => axum::Json(RpcResponse::ok(id, r)).into_response(),
        Err(e) => axum::Json(RpcResponse::err(id, e)).into_response(),
    }
}

/// A deployment's JSON-RPC endpoint.
async fn rpc(
    State(a): State<Arc<A2a>>,
    Path((namespace, deployment)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    let peer = peer_of(request.extensions());
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    // The bearer first: a refused request's body is never read.
    let principal = match a.authorize(&headers, peer, &namespace, &deployment) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let timeout = a.core.opts.limits.conn.body_timeout;
    let body = match tokio::time::timeout(timeout, axum::body::to_bytes(body, a.body_limit)).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.to_string().contains("length limit exceeded"))
                || e.to_string().contains("length limit exceeded");
            return if over {
                Refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request: the body is over the limit of {} bytes (twice --max-input-bytes plus 64 KiB)",
                        a.body_limit
                    ),
                )
                .into_response()
            } else {
                Refusal(
                    StatusCode::BAD_REQUEST,
                    format!("request: cannot read the body: {e}"),
                )
                .into_response()
            };
        }
        Err(_) => {
            return Refusal(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request: the body did not arrive within {} (--body-timeout)",
                    agen_shared::duration::format_duration(timeout)
                ),
            )
            .into_response()
        }
    };
    let req: RpcRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let code = if serde_json::from_slice::<Value>(&body).is_ok() {
                codes::INVALID_REQUEST
            } else {
                codes::PARSE_ERROR
            };
            return answer::<()>(
                Value::Null,
                Err(RpcError {
                    code,
                    message: format!("request: not a JSON-RPC 2.0 request: {e}"),
                }),
            );
        }
    };
    if req.jsonrpc != "2.0" {
        return answer::<()>(
            req.id,
            Err(RpcError {
                code: codes::INVALID_REQUEST,
                message: format!(
                    "jsonrpc: expected \"2.0\", got {:?}",
                    crate::limits::cut(&req.jsonrpc, 20)
                ),
            }),
        );
    }
    // Streams have their caps (per token and in all): 429 past them.
    let stream_permit = match req.method.as_str() {
        "SendStreamingMessage" | "SubscribeToTask" => match a
            .core
            .streams
            .open(crate::core::streams::StreamKind::A2aSse, &principal)
        {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => return Refusal(StatusCode::TOO_MANY_REQUESTS, e.to_string()).into_response(),
        },
        _ => None,
    };
    let call = methods::Call {
        a: a.clone(),
        secret: a.tokens.secret_of(&principal),
        _stream_permit: stream_permit,
        principal,
        namespace,
        deployment,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    };
    let id = req.id;
    match req.method.as_str() {
        "SendMessage" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.send_message(p).await),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "SendStreamingMessage" => match params(&req.method, req.params) {
            Ok(p) => match call.send_streaming(p, id.clone()).await {
                Ok(sse) => sse.into_response(),
                Err(e) => answer::<()>(id, Err(e)),
            },
            Err(e) => answer::<()>(id, Err(e)),
        },
        "GetTask" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.get_task(p)),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "CancelTask" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.cancel_task(p).await),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "SubscribeToTask" => match params(&req.method, req.params) {
            Ok(p) => match call.subscribe(p, id.clone()) {
                Ok(sse) => sse.into_response(),
                Err(e) => answer::<()>(id, Err(e)),
            },
            Err(e) => answer::<()>(id, Err(e)),
        },
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => answer::<()>(
            id,
            Err(RpcError {
                code: codes::PUSH_NOT_SUPPORTED,
                message: format!("{}: the Agen Hub sends no push notifications; stream with SendStreamingMessage or SubscribeToTask", req.method),
            }),
        ),
        "ListTasks" | "GetExtendedAgentCard" => answer::<()>(
            id,
            Err(RpcError {
                code: codes::UNSUPPORTED_OPERATION,
                message: format!("{}: not served by the Agen Hub; use GetTask with a task id (agen ps lists tasks)", req.method),
            }),
        ),
        other => answer::<()>(
            id,
            Err(RpcError {
                code: codes::METHOD_NOT_FOUND,
                message: format!(
                    "method {:?} is not an A2A method; expected SendMessage, SendStreamingMessage, GetTask, CancelTask or SubscribeToTask",
                    crate::limits::cut(other, 60)
                ),
            }),
        ),
    }
}
