//! The web console, served under `/ui/` on the Hub's own port: the page and its assets
//! (embedded in the binary, [`assets`]), and the JSON API under `/ui/api/` that the page calls
//! ([`api`], live updates as server-sent events in [`live`]).
//!
//! Sign-in exchanges an API token (any role, the admin token too) for a session ([`session`]):
//! a cookie `HttpOnly; Secure; SameSite=Strict` and a CSRF token that every mutating request
//! sends back in `X-CSRF-Token` (403 and an audit record otherwise).
//!
//! Invariant: the console has no authorization of its own. Every API call is an in-process
//! call of the Hub's `AgenService` stack ([`super::ApiStack`]: the audit record, the token
//! check, the handlers with their one `authorize` call), made as the session's principal; the
//! namespace and role rules, the stream caps and the audit log are the gRPC API's own.
//! Every response carries a strict Content-Security-Policy (scripts, styles and connections to
//! the Hub's own origin only); the page renders every string as text.

mod api;
mod assets;
mod live;
pub(crate) mod session;
mod view;

use std::sync::Arc;

use agen_proto::v1::agen_service_client::AgenServiceClient;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;

use super::auth::ConsolePrincipal;
use super::ApiStack;
use crate::core::Core;
use crate::tokens::Tokens;
use session::Session;

/// The console's Content-Security-Policy: nothing but the Hub's own scripts, styles, images
/// and connections; no inline script or style, no frames, no forms elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Largest request body the console API reads (a sign-in, a decision, a scale).
const BODY_LIMIT: usize = 64 * 1024;

/// The console's shared state.
pub(crate) struct Console {
    core: Arc<Core>,
    tokens: Arc<Tokens>,
    gate: Arc<crate::conn_gate::ConnGate>,
    api: ApiStack,
}

/// The console's routes, merged into the Hub's router.
pub(crate) fn router(
    core: Arc<Core>,
    tokens: Arc<Tokens>,
    gate: Arc<crate::conn_gate::ConnGate>,
    api: ApiStack,
) -> axum::Router {
    let state = Arc::new(Console {
        core,
        tokens,
        gate,
        api,
    });
    axum::Router::new()
        .route("/ui", get(assets::to_index))
        .route("/ui/", get(assets::index))
        .route("/ui/assets/{file}", get(assets::file))
        .route(
            "/ui/api/session",
            get(api::me).post(api::sign_in).delete(api::sign_out),
        )
        .route("/ui/api/fleet", get(api::fleet))
        .route("/ui/api/tasks", get(api::tasks))
        .route("/ui/api/tasks/{namespace}/{task}", get(api::task))
        .route("/ui/api/tasks/{namespace}/{task}/trace", get(api::trace))
        .route("/ui/api/tasks/{namespace}/{task}/logs", get(api::logs))
        .route("/ui/api/tasks/{namespace}/{task}/cancel", post(api::cancel))
        .route("/ui/api/tasks/{namespace}/{task}/live", get(live::task))
        .route(
            "/ui/api/artifacts/{namespace}/{artifact}",
            get(api::artifact),
        )
        .route("/ui/api/approvals", get(api::approvals))
        .route("/ui/api/approvals/decide", post(api::decide))
        .route(
            "/ui/api/deployments/{namespace}/{name}",
            get(api::deployment),
        )
        .route(
            "/ui/api/deployments/{namespace}/{name}/scale",
            post(api::scale),
        )
        .route(
            "/ui/api/deployments/{namespace}/{name}/rollback",
            post(api::rollback),
        )
        .route("/ui/api/audit", get(api::audit))
        .route("/ui/api/live/fleet", get(live::fleet))
        .route("/ui/api/live/tasks", get(live::tasks))
        .route("/ui/api/live/approvals", get(live::approvals))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// The headers every console response carries.
async fn security_headers(req: Request, next: Next) -> Response {
    let api = req.uri().path().starts_with("/ui/api/");
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    if api {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

/// A refused or failed console request: its HTTP status and why, as `{"error": "…"}`.
#[derive(Debug)]
pub(crate) struct ApiErr(StatusCode, String);

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        (self.0, Json(view::ApiError { error: self.1 })).into_response()
    }
}

impl From<tonic::Status> for ApiErr {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let code = match s.code() {
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiErr(code, s.message().to_string())
    }
}

impl From<crate::error::HubError> for ApiErr {
    fn from(e: crate::error::HubError) -> Self {
        ApiErr::from(tonic::Status::from(e))
    }
}

impl Console {
    /// The live session of the request's cookie (401 without one). A connection that shows
    /// one counts as authenticated from then on.
    fn session(
        &self,
        headers: &HeaderMap,
        ext: &axum::http::Extensions,
    ) -> Result<Session, ApiErr> {
        let id = cookie(headers, session::COOKIE).unwrap_or_default();
        let s = session::resume(&self.core.db, &self.tokens, &id)?;
        self.gate.authenticated(peer_of(ext));
        Ok(s)
    }

    /// Refuses a mutating request whose `X-CSRF-Token` is not `s`'s (403 and an audit record).
    async fn check_csrf(
        &self,
        s: &Session,
        headers: &HeaderMap,
        call: &str,
        target: &str,
    ) -> Result<(), ApiErr> {
        let sent = headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if session::csrf_ok(s, sent) {
            return Ok(());
        }
        let why = "missing or wrong X-CSRF-Token: the console sends the token of its session; reload the page";
        let db = &self.core.db;
        if let Err(e) = crate::tokens::audit::record(
            db,
            s.principal.token_id(),
            s.principal.token_name(),
            "",
            &format!("Console.{call}"),
            target,
            "permission_denied",
            why,
        ) {
            tracing::error!(error = %e, %call, "cannot write the audit record");
        } else if let Err(e) = db.flush().await {
            tracing::error!(error = %e, %call, "cannot make the audit record durable");
        }
        Err(ApiErr(StatusCode::FORBIDDEN, why.into()))
    }
}

/// The shape every console handler shares: the request's live session (an extractor: 401
/// without one), then `AgenService` calls made as its principal through the Hub's own stack
/// ([`Caller::api`] with [`Caller::req`]); a mutating handler first passes
/// [`Caller::mutating`].
pub(crate) struct Caller {
    console: Arc<Console>,
    session: Session,
    headers: HeaderMap,
}

impl axum::extract::FromRequestParts<Arc<Console>> for Caller {
    type Rejection = ApiErr;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        console: &Arc<Console>,
    ) -> Result<Self, ApiErr> {
        let session = console.session(&parts.headers, &parts.extensions)?;
        Ok(Caller {
            console: console.clone(),
            session,
            headers: parts.headers.clone(),
        })
    }
}

impl Caller {
    /// A client of the Hub's own `AgenService` stack.
    fn api(&self) -> AgenServiceClient<ApiStack> {
        AgenServiceClient::new(self.console.api.clone())
            .max_decoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::limits::MAX_MESSAGE_BYTES)
    }

    /// `msg` as a call made by the session's principal.
    fn req<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.extensions_mut()
            .insert(ConsolePrincipal(self.session.principal.clone()));
        r
    }

    /// For a mutating request (`call` on `target`, as its audit record names them): its
    /// `X-CSRF-Token` must be the session's (403 and an audit record otherwise).
    async fn mutating(&self, call: &str, target: &str) -> Result<(), ApiErr> {
        self.console
            .check_csrf(&self.session, &self.headers, call, target)
            .await
    }

    fn session(&self) -> &Session {
        &self.session
    }

    fn principal(&self) -> &crate::tokens::Principal {
        &self.session.principal
    }

    /// A header of the request, as text.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A cookie's value from the `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

fn peer_of(extensions: &axum::http::Extensions) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| extensions.get::<TcpConnectInfo>()?.remote_addr())
}

type Shared = State<Arc<Console>>;
