//! The A2A server: every deployment is an agent of A2A v1.0 (JSON-RPC binding, as PyPI
//! `a2a-sdk` 1.3 speaks it), on the Hub's own port and certificate.
//!
//! - `GET /a2a/<namespace>/<deployment>/.well-known/agent-card.json`: the public agent card
//!   ([`card`]), readable without a token unless `--a2a-public-cards=false`.
//! - `POST /a2a/<namespace>/<deployment>`: JSON-RPC `SendMessage`, `SendStreamingMessage` (SSE),
//!   `GetTask`, `ListTasks` ([`list`]), `CancelTask`, `SubscribeToTask` (SSE),
//!   `GetExtendedAgentCard` ([`methods`], [`stream`]).
//! - With `--a2a-domain D`, the same at an origin of the deployment's own: a request whose host
//!   is `<deployment>.<namespace>.D` gets the card at `/.well-known/agent-card.json` and the
//!   JSON-RPC endpoint at `/`.
//!
//! Every JSON-RPC request carries `Authorization: Bearer <Hub API token>` and is refused (401
//! unknown or missing, with `WWW-Authenticate: Bearer`; 403 not allowed) unless the token may
//! submit tasks in that namespace, the rule of `SubmitTask`; `SendMessage`,
//! `SendStreamingMessage` and `CancelTask` are audited like their gRPC twins. A request body is
//! at most [`body_limit`] bytes (the task input limit plus [`ENVELOPE_BYTES`] for the JSON
//! around it); larger ones get 413. The bearer is checked before a byte of the body is read (a
//! refused request's body is never read), and the body must arrive within `--body-timeout` (408
//! otherwise). The body is read by JSON-RPC 2.0 ([`types::RpcRequest`]):
//! -32700 not JSON, -32600 not a request object, -32601 no such method, -32602 bad params, a
//! notification (no `id`) is performed and answered 204 with no body.
//!
//! Invariants: the A2A task id is the Agen task id and the A2A `contextId` is the Agen
//! conversation key; every change goes through the Hub's core methods (the same code path as
//! `SubmitTask`, `CancelTask`), never through its state lock; nothing here knows protobuf.

mod card;
mod list;
mod methods;
mod stream;
pub mod types;
mod view;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use crate::config::A2aOptions;
use crate::core::Core;
use crate::error::HubError;
use crate::tokens::{Need, Principal, Role, Tokens};
use types::{
    codes, AgentCard, ListTasksRequest, RpcError, RpcRequest, RpcResponse,
    SendMessageConfiguration, SendMessageRequest, PROTOCOL_VERSION,
};

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
    opts: A2aOptions,
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
    let opts = core.opts.a2a.clone();
    let by_host = opts.domain.is_some();
    let state = Arc::new(A2a {
        core,
        tokens,
        public_url: public_url.trim_end_matches('/').to_string(),
        opts,
        cards: card::Cards::default(),
        gate,
        body_limit: limit,
    });
    let mut r = axum::Router::new()
        .route(
            "/a2a/{namespace}/{deployment}/.well-known/agent-card.json",
            get(path_card),
        )
        .route("/a2a/{namespace}/{deployment}", post(path_rpc));
    if by_host {
        r = r
            .route("/.well-known/agent-card.json", get(host_card))
            .route("/", post(host_rpc));
    }
    r.with_state(state)
}

/// The deployment a request is for, and the interface URL it reached it at.
struct Target {
    namespace: String,
    deployment: String,
    url: String,
}

impl A2a {
    /// The target of `/a2a/<namespace>/<deployment>`.
    fn path_target(&self, namespace: &str, deployment: &str) -> Result<Target, Refusal> {
        // Names first: nothing longer or stranger than a name is echoed back.
        crate::limits::validate_name("namespace", namespace)
            .and_then(|()| crate::limits::validate_name("deployment", deployment))
            .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("{e} (in the URL path)")))?;
        Ok(Target {
            namespace: namespace.to_string(),
            deployment: deployment.to_string(),
            url: format!(
                "{}/a2a/{}/{deployment}",
                self.public_url,
                crate::core::namespace_or_default(namespace)
            ),
        })
    }

    /// The target of a request to `<deployment>.<namespace>.<--a2a-domain>`.
    fn host_target(&self, uri: &Uri, headers: &HeaderMap) -> Result<Target, Refusal> {
        let not_here = || {
            Refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "no agent at this host; deployments are served at <deployment>.<namespace>.{}",
                    self.opts.domain.as_deref().unwrap_or_default()
                ),
            )
        };
        let domain = self.opts.domain.as_deref().ok_or_else(not_here)?;
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                headers
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .ok_or_else(not_here)?
            .to_ascii_lowercase();
        let host = authority
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(authority.as_str(), |(h, _)| h);
        let (deployment, namespace) = host
            .strip_suffix(&domain.to_ascii_lowercase())
            .and_then(|r| r.strip_suffix('.'))
            .and_then(|r| r.split_once('.'))
            .ok_or_else(not_here)?;
        if crate::limits::validate_name("namespace", namespace).is_err()
            || crate::limits::validate_name("deployment", deployment).is_err()
        {
            return Err(not_here());
        }
        let scheme = if self.public_url.starts_with("http://") {
            "http"
        } else {
            "https"
        };
        Ok(Target {
            namespace: namespace.to_string(),
            deployment: deployment.to_string(),
            url: format!("{scheme}://{authority}/"),
        })
    }
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
    /// The caller, when its bearer may submit tasks in the target's namespace (the `SubmitTask`
    /// rule). A refusal (401, 403) goes to the audit log, rate-limited (`tokens::refusals`).
    fn authorize(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::SocketAddr>,
        target: &Target,
        call: &str,
    ) -> Result<Principal, Refusal> {
        use crate::tokens::refusals::{Kind, Refusal as Refused};
        let mut caller = None;
        let checked = self.check_bearer(headers, peer, &target.namespace, &mut caller);
        if let Err(Refusal(status, message)) = &checked {
            let kind = if *status == StatusCode::FORBIDDEN {
                Kind::A2aForbidden
            } else {
                Kind::A2aUnauthorized
            };
            let (token_id, token_name) = caller
                .as_ref()
                .map(|p: &Principal| (p.token_id().to_string(), p.token_name().to_string()))
                .unwrap_or_default();
            self.core.refusals.note(
                peer,
                kind,
                Refused {
                    token_id,
                    token_name,
                    namespace: crate::core::namespace_or_default(&target.namespace),
                    call: call.to_string(),
                    target: target.deployment.clone(),
                    message: message.clone(),
                },
            );
        }
        checked
    }

    /// [`A2a::authorize`] before its audit: `caller` is set once the token resolved.
    fn check_bearer(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::SocketAddr>,
        namespace: &str,
        caller: &mut Option<Principal>,
    ) -> Result<Principal, Refusal> {
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
        *caller = Some(principal.clone());
        let namespace = crate::core::namespace_or_default(namespace);
        principal
            .allows(Need::Role(Role::Submitter), &namespace, "A2A")
            .map_err(|e| refusal(e, "the token"))?;
        Ok(principal)
    }

    /// The card of `target` as the well-known path serves it.
    async fn well_known_card(
        &self,
        target: &Target,
        headers: &HeaderMap,
        peer: Option<std::net::SocketAddr>,
    ) -> Response {
        if !self.opts.public_cards {
            if let Err(r) = self.authorize(headers, peer, target, "A2A agent card") {
                return r.into_response();
            }
        }
        let detail = if self.opts.card_details {
            card::Detail::Extended
        } else {
            card::Detail::Public
        };
        match self.card(target, detail).await {
            Ok(card) => axum::Json(card).into_response(),
            Err(e) => {
                let (status, message) = match e {
                    HubError::NotFound(m) => (StatusCode::NOT_FOUND, m),
                    HubError::InvalidArgument(m) => (StatusCode::BAD_REQUEST, m),
                    e => {
                        tracing::error!(error = %e, namespace = %target.namespace, deployment = %target.deployment, "cannot build the agent card");
                        (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                    }
                };
                Refusal(status, message).into_response()
            }
        }
    }

    async fn card(&self, t: &Target, detail: card::Detail) -> crate::error::Result<AgentCard> {
        self.cards
            .card(
                &self.core,
                &t.namespace,
                &t.deployment,
                t.url.clone(),
                detail,
            )
            .await
    }

    /// Writes the audit record of a mutating A2A call, with the HTTP peer address like a gRPC
    /// call's.
    async fn audit(
        &self,
        peer: &str,
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
        if let Err(e) = crate::tokens::audit::record_with(
            db,
            principal.token_id(),
            principal.token_name(),
            &crate::core::namespace_or_default(namespace),
            call,
            target,
            outcome,
            &message,
            crate::tokens::audit::AuditDetail {
                peer: peer.to_string(),
                ..Default::default()
            },
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

async fn path_card(
    State(a): State<Arc<A2a>>,
    Path((namespace, deployment)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    let peer = peer_of(request.extensions());
    match a.path_target(&namespace, &deployment) {
        Ok(t) => a.well_known_card(&t, request.headers(), peer).await,
        Err(r) => r.into_response(),
    }
}

async fn host_card(State(a): State<Arc<A2a>>, request: axum::extract::Request) -> Response {
    let peer = peer_of(request.extensions());
    match a.host_target(request.uri(), request.headers()) {
        Ok(t) => a.well_known_card(&t, request.headers(), peer).await,
        Err(r) => r.into_response(),
    }
}

async fn path_rpc(
    State(a): State<Arc<A2a>>,
    Path((namespace, deployment)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    match a.path_target(&namespace, &deployment) {
        Ok(t) => rpc(a, t, request).await,
        Err(r) => r.into_response(),
    }
}

async fn host_rpc(State(a): State<Arc<A2a>>, request: axum::extract::Request) -> Response {
    match a.host_target(request.uri(), request.headers()) {
        Ok(t) => rpc(a, t, request).await,
        Err(r) => r.into_response(),
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

/// The A2A versions this server speaks (`A2A-Version`, major.minor; absent: not checked).
fn version_error(headers: &HeaderMap) -> Option<RpcError> {
    let v = headers.get("a2a-version")?.to_str().unwrap_or("?").trim();
    if v.is_empty() || v == "1" || v.starts_with("1.") {
        return None;
    }
    Some(RpcError {
        code: codes::VERSION_NOT_SUPPORTED,
        message: format!(
            "A2A-Version {:?} is not served; this agent speaks A2A {PROTOCOL_VERSION}",
            crate::limits::cut(v, 20)
        ),
    })
}

/// A deployment's JSON-RPC endpoint.
async fn rpc(a: Arc<A2a>, target: Target, request: axum::extract::Request) -> Response {
    let peer = peer_of(request.extensions());
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    // The bearer first: a refused request's body is never read.
    let principal = match a.authorize(&headers, peer, &target, "A2A JSON-RPC") {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let body = match read_body(&a, body).await {
        Ok(body) => body,
        Err(r) => return r.into_response(),
    };
    let req = match RpcRequest::parse(&body) {
        Ok(r) => r,
        Err((id, e)) => return answer::<()>(id, Err(e)),
    };
    let Some(id) = req.id.clone() else {
        // A notification: performed, never answered (JSON-RPC 2.0 §4.1).
        let streamed = matches!(
            req.method.as_str(),
            "SendStreamingMessage" | "SubscribeToTask"
        );
        if !streamed {
            let call = call(&a, target, principal, &headers, peer, None);
            let _ = dispatch(call, req, Value::Null).await;
        } else if req.method == "SendStreamingMessage" {
            let call = call(&a, target, principal, &headers, peer, None);
            if let Ok(p) = params::<SendMessageRequest>(&req.method, req.params) {
                let _ = call
                    .send_message(SendMessageRequest {
                        configuration: Some(SendMessageConfiguration {
                            return_immediately: true,
                            ..p.configuration.unwrap_or_default()
                        }),
                        ..p
                    })
                    .await;
            }
        }
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Some(e) = version_error(&headers) {
        return answer::<()>(id, Err(e));
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
    let call = call(&a, target, principal, &headers, peer, stream_permit);
    dispatch(call, req, id).await
}

/// Reads a request's body: at most [`A2a::body_limit`] bytes (413), within `--body-timeout`
/// (408).
async fn read_body(a: &A2a, body: axum::body::Body) -> Result<axum::body::Bytes, Refusal> {
    let timeout = a.core.opts.limits.conn.body_timeout;
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, a.body_limit)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|s| s.to_string().contains("length limit exceeded"))
                || e.to_string().contains("length limit exceeded");
            Err(if over {
                Refusal(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "request: the body is over the limit of {} bytes (twice --max-input-bytes plus 64 KiB)",
                        a.body_limit
                    ),
                )
            } else {
                Refusal(
                    StatusCode::BAD_REQUEST,
                    format!("request: cannot read the body: {e}"),
                )
            })
        }
        Err(_) => Err(Refusal(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "request: the body did not arrive within {} (--body-timeout)",
                agen_shared::duration::format_duration(timeout)
            ),
        )),
    }
}

fn call(
    a: &Arc<A2a>,
    target: Target,
    principal: Principal,
    headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
    stream_permit: Option<Arc<crate::core::streams::StreamPermit>>,
) -> methods::Call {
    methods::Call {
        a: a.clone(),
        peer: peer.map(|p| p.to_string()).unwrap_or_default(),
        secret: a.tokens.secret_of(&principal),
        _stream_permit: stream_permit,
        principal,
        namespace: target.namespace,
        deployment: target.deployment,
        interface_url: target.url,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    }
}

/// Runs one method call and answers it.
async fn dispatch(call: methods::Call, req: RpcRequest, id: Value) -> Response {
    match req.method.as_str() {
        "SendMessage" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.send_message(p).await),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "SendStreamingMessage" => match params(&req.method, req.params) {
            Ok(p) => match call.send_streaming(p, id.clone()).await {
                Ok(sse) => sse.into_response(),
                Err(e) => stream::failed(&id, e).into_response(),
            },
            Err(e) => stream::failed(&id, e).into_response(),
        },
        "GetTask" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.get_task(p)),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "ListTasks" => match params::<ListTasksRequest>(&req.method, req.params.or(Some(Value::Object(Default::default())))) {
            Ok(p) => answer(id, call.list_tasks(p)),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "CancelTask" => match params(&req.method, req.params) {
            Ok(p) => answer(id, call.cancel_task(p).await),
            Err(e) => answer::<()>(id, Err(e)),
        },
        "SubscribeToTask" => match params(&req.method, req.params) {
            Ok(p) => match call.subscribe(p, id.clone()) {
                Ok(sse) => sse.into_response(),
                Err(e) => stream::failed(&id, e).into_response(),
            },
            Err(e) => stream::failed(&id, e).into_response(),
        },
        "GetExtendedAgentCard" => {
            let target = Target {
                namespace: call.namespace.clone(),
                deployment: call.deployment.clone(),
                url: call.interface_url.clone(),
            };
            let card = call
                .a
                .card(&target, card::Detail::Extended)
                .await
                .map_err(|e| rpc_error(e, codes::INVALID_PARAMS));
            answer(id, card)
        }
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
        other => answer::<()>(
            id,
            Err(RpcError {
                code: codes::METHOD_NOT_FOUND,
                message: format!(
                    "method {:?} is not an A2A method; expected SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask or GetExtendedAgentCard",
                    crate::limits::cut(other, 60)
                ),
            }),
        ),
    }
}
