//! Authentication and authorization at the gRPC edge. [`ApiAuth`] (an interceptor) resolves the
//! `AgenService` bearer to a [`Principal`] carried in the request's extensions; what each RPC
//! needs is its row of the table in `auth_table.rs` (a call without a row is refused by
//! [`ApiAuth`] before any handler runs); every handler then makes one [`authorize`] call naming
//! its namespace and [`Action`], which must be one its row allows; [`Audited`] (a tower
//! service around the whole `AgenService`) writes one audit record per mutating call with the
//! call's outcome; [`until_revoked`] ends a server stream the moment its token is revoked or
//! expires. `NestService` bearers (join tokens) are read with [`bearer`] and checked by the
//! Nest handlers. Health and reflection are served without any of this.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tonic::{Request, Status};

use crate::error::HubError;
use crate::store::Db;
use crate::tokens::{Need, Principal, Tokens};

/// The bearer token of a request, if any.
pub fn bearer<T>(req: &Request<T>) -> Option<String> {
    let header = req.metadata().get("authorization")?.to_str().ok()?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// Resolves the bearer of every `AgenService` call to a [`Principal`] (or refuses it).
#[derive(Clone)]
pub struct ApiAuth {
    pub tokens: Arc<Tokens>,
    /// Told when a connection's request passed the token check.
    pub gate: Arc<crate::conn_gate::ConnGate>,
}

impl ApiAuth {
    pub fn check(&self, mut req: Request<()>) -> Result<Request<()>, Status> {
        // An RPC is served only once the table says what it needs: refused before any handler.
        if let Some(CallName(call)) = req.extensions().get::<CallName>() {
            if super::auth_table::rule(call).is_none() {
                tracing::error!(%call, "refused: no row in the authorization table");
                return Err(Status::permission_denied(format!(
                    "{call}: this Hub has no authorization rule for it (hub/src/server/auth_table.rs), so it serves it to no one"
                )));
            }
        }
        // A web console request: the console resolved its session to this principal (an
        // extension, so it can only come from inside the Hub, never from the wire).
        if let Some(ConsolePrincipal(principal)) = req.extensions().get::<ConsolePrincipal>() {
            let principal = principal.clone();
            req.extensions_mut().insert(principal);
            return Ok(req);
        }
        let Some(token) = bearer(&req) else {
            return Err(Status::unauthenticated(
                "missing `authorization: Bearer <token>`; pass --token / AGEN_TOKEN (agen hub writes the admin token into the client config and <data-dir>/admin-token)",
            ));
        };
        let principal = self.tokens.resolve(&token).map_err(Status::from)?;
        self.gate.authenticated(req.remote_addr());
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

impl tonic::service::Interceptor for ApiAuth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(req)
    }
}

/// The principal of a web console session, put on the console's in-process `AgenService`
/// calls in place of a bearer (`server/console/`): the same table, handlers and audit apply.
#[derive(Debug, Clone)]
pub struct ConsolePrincipal(pub Principal);

pub use super::auth_table::Action;

/// What [`authorize`] leaves for [`Audited`] to record once the call has an outcome.
#[derive(Debug, Clone)]
struct AuditNote {
    principal: Principal,
    namespace: String,
    target: String,
    /// What the record says of a call that succeeded (its `message`), set by the handler.
    detail: String,
}

/// Shared between [`Audited`] and the handler of one call.
#[derive(Clone, Default)]
struct AuditSlot(Arc<Mutex<SlotState>>);

#[derive(Default)]
struct SlotState {
    /// Whether the handler called [`authorize`] (or [`list_scope`]).
    checked: bool,
    /// What to record, for mutating calls.
    note: Option<AuditNote>,
    /// What the handler adds to the record (an approval's decision, the call, the reason).
    detail: crate::tokens::audit::AuditDetail,
}

/// Lets a handler add what its call decided to the call's audit record, after it has taken
/// its request apart (see [`audit_detail`]).
#[derive(Clone)]
pub struct AuditDetailSlot(Option<AuditSlot>);

impl AuditDetailSlot {
    /// Sets what the record says beyond who called what (the peer is filled in by [`Audited`]).
    pub fn set(&self, detail: crate::tokens::audit::AuditDetail) {
        if let Some(slot) = &self.0 {
            if let Ok(mut s) = slot.0.lock() {
                s.detail = detail;
            }
        }
    }
}

/// The handle through which a handler adds detail to its call's audit record.
pub fn audit_detail<T>(req: &Request<T>) -> AuditDetailSlot {
    AuditDetailSlot(req.extensions().get::<AuditSlot>().cloned())
}

/// The remote address of the connection a request came on (TLS or plaintext).
fn peer_of(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|i| i.get_ref().remote_addr())
        .or_else(|| extensions.get::<TcpConnectInfo>()?.remote_addr())
}

/// The caller of a request (set by [`ApiAuth`]).
pub fn principal<T>(req: &Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the request carries no authenticated token"))
}

/// The one authorization check of an `AgenService` handler: may the caller do `action` in
/// `namespace` (empty = `default`)? Mutating calls are noted for the audit log, refused ones
/// included; `target` names what the call is about (a deployment, a task, a token id).
pub fn authorize<T>(
    req: &Request<T>,
    namespace: &str,
    action: Action,
    target: &str,
) -> Result<Principal, Status> {
    let principal = principal(req)?;
    if let Some(method) = call_name(req) {
        // The table decides; a handler asking for anything else is a bug and fails closed.
        if !super::auth_table::rule(&method).is_some_and(|rule| rule.allows(action)) {
            return Err(Status::internal(format!(
                "{method}: the handler asks for {action:?}, which its row of the authorization table (hub/src/server/auth_table.rs) does not allow"
            )));
        }
    }
    let namespace = crate::core::namespace_or_default(namespace);
    let namespace = match action.need() {
        Need::Role(_) => namespace,
        Need::AnyNamespace(_) | Need::Cluster => String::new(),
    };
    if let Some(slot) = req.extensions().get::<AuditSlot>() {
        if let Ok(mut s) = slot.0.lock() {
            s.checked = true;
            if action.mutating() {
                s.note = Some(AuditNote {
                    principal: principal.clone(),
                    namespace: namespace.clone(),
                    target: target.to_string(),
                    detail: String::new(),
                });
            }
        }
    }
    principal
        .allows(
            action.need(),
            &namespace,
            call_name(req).as_deref().unwrap_or("this call"),
        )
        .map_err(Status::from)?;
    Ok(principal)
}

/// Adds `detail` to the audit record of this (authorized, mutating) call: its `message` when
/// the call succeeds (a failure records its error instead).
pub fn audit_message<T>(req: &Request<T>, detail: String) {
    if let Some(slot) = req.extensions().get::<AuditSlot>() {
        if let Ok(mut s) = slot.0.lock() {
            if let Some(note) = s.note.as_mut() {
                note.detail = detail;
            }
        }
    }
}

/// Like [`authorize`] for list calls that may span namespaces: the cluster admin gets what it
/// asked for; a namespace token asking for every namespace gets its own namespace only.
/// Returns `(namespace, all_namespaces)` to list with.
pub fn list_scope<T>(
    req: &Request<T>,
    namespace: &str,
    all_namespaces: bool,
) -> Result<(String, bool), Status> {
    match principal(req)? {
        Principal::ClusterAdmin => {
            authorize(req, namespace, Action::Read, "")?;
            Ok((namespace.to_string(), all_namespaces))
        }
        Principal::Api { namespace: own, .. } => {
            let ns = if all_namespaces {
                own.as_str()
            } else {
                namespace
            };
            authorize(req, ns, Action::Read, "")?;
            Ok((ns.to_string(), false))
        }
    }
}

/// The RPC name of a request (`SubmitTask`), from the `:path` tonic keeps in the extensions.
fn call_name<T>(req: &Request<T>) -> Option<String> {
    req.extensions().get::<CallName>().map(|c| c.0.clone())
}

#[derive(Debug, Clone)]
struct CallName(String);

/// Records an audit entry for every mutating `AgenService` call once its outcome is known.
#[derive(Clone)]
pub struct Audited<S> {
    pub inner: S,
    pub db: Db,
    /// Where calls refused for their token are recorded, rate-limited.
    pub refusals: Arc<crate::tokens::refusals::RefusalAudit>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Audited<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S, B, RB> tonic::codegen::Service<http::Request<B>> for Audited<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let slot = AuditSlot::default();
        let call = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let peer_addr = peer_of(req.extensions());
        let peer = peer_addr.map(|a| a.to_string()).unwrap_or_default();
        let refusals = self.refusals.clone();
        req.extensions_mut().insert(slot.clone());
        req.extensions_mut().insert(CallName(call.clone()));
        // Take the service that was made ready; leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let db = self.db.clone();
        Box::pin(async move {
            let response = inner.call(req).await?;
            let (checked, note, detail) = match slot.0.lock() {
                Ok(mut s) => (s.checked, s.note.take(), std::mem::take(&mut s.detail)),
                Err(_) => (true, None, Default::default()),
            };
            let (outcome, mut message) = outcome(response.headers());
            if !checked && outcome == "unauthenticated" {
                tracing::warn!(%call, reason = %message, %peer, "refused a call without a valid token");
                refusals.note(
                    peer_addr,
                    crate::tokens::refusals::Kind::GrpcUnauthenticated,
                    crate::tokens::refusals::Refusal {
                        call: call.clone(),
                        message: message.clone(),
                        ..Default::default()
                    },
                );
            }
            if !checked && outcome == "ok" {
                // A safety net for new RPCs: the check is the handler's first line.
                tracing::error!(%call, "served without an authorization check: every AgenService handler must call server::auth::authorize first");
            }
            if let Some(note) = note {
                if outcome == "ok" && message.is_empty() {
                    message = note.detail.clone();
                }
                if let Err(e) = crate::tokens::audit::record_with(
                    &db,
                    note.principal.token_id(),
                    note.principal.token_name(),
                    &note.namespace,
                    &call,
                    &note.target,
                    &outcome,
                    &message,
                    crate::tokens::audit::AuditDetail { peer, ..detail },
                ) {
                    tracing::error!(error = %e, %call, "cannot write the audit record");
                } else if let Err(e) = db.flush().await {
                    tracing::error!(error = %e, %call, "cannot make the audit record durable");
                }
            }
            Ok(response)
        })
    }
}

/// The outcome of a unary call from its response headers: errors are trailers-only responses
/// (`grpc-status` in the headers); a success sends its status in the trailers.
fn outcome(headers: &http::HeaderMap) -> (String, String) {
    let code = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0);
    if code == 0 {
        return ("ok".into(), String::new());
    }
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(percent_decode)
        .unwrap_or_default();
    let name = format!("{:?}", tonic::Code::from_i32(code));
    (snake(&name), message)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Ends `stream` with `UNAUTHENTICATED` as soon as `principal`'s token is revoked or expires.
pub fn until_revoked<T: Send + 'static>(
    tokens: Arc<Tokens>,
    principal: Principal,
    stream: BoxStream<T>,
    permit: Option<crate::core::streams::StreamPermit>,
) -> BoxStream<T> {
    if principal == Principal::ClusterAdmin {
        // Held as long as the stream is.
        return Box::pin(stream.map(move |item| {
            let _held = &permit;
            item
        }));
    }
    // The secret the stream was opened with: a rotation ends it like a revocation.
    let secret = tokens.secret_of(&principal);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(16);
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let mut revocations = tokens.revocations();
        let expiry = tokens.expires_at_ms(&principal).map(|at| {
            let left = at - crate::model::now_ms();
            std::time::Duration::from_millis(left.max(0) as u64)
        });
        let expired = async move {
            match expiry {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            tokio::select! {
                // The caller went away: the stream (and its place among the open ones) ends
                // now, not at its next item.
                _ = tx.closed() => return,
                item = stream.next() => {
                    let Some(item) = item else { return };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
                changed = revocations.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Err(e) = tokens.still_valid_with(&principal, secret.as_deref()) {
                        let _ = tx.send(Err(Status::from(e))).await;
                        return;
                    }
                }
                _ = &mut expired => {
                    let e = tokens.still_valid(&principal).err().unwrap_or_else(|| {
                        HubError::Unauthenticated("the token expired".into())
                    });
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(method: &str, token: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        req.extensions_mut().insert(CallName(method.into()));
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req
    }

    #[test]
    fn an_rpc_without_a_row_in_the_table_is_refused_before_its_handler() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::new(Arc::new(
            crate::store::SledStore::open(&dir.path().join("db")).unwrap(),
        ));
        let auth = ApiAuth {
            tokens: Tokens::open(db, "the-admin").unwrap(),
            gate: crate::conn_gate::ConnGate::new(Default::default()),
        };
        // Even the cluster admin: nobody gets an RPC the table does not describe.
        let refused = auth
            .check(call("StealEverything", Some("the-admin")))
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert!(
            refused.message().contains("StealEverything"),
            "{}",
            refused.message()
        );
        let admitted = auth.check(call("GetTask", Some("the-admin"))).unwrap();
        assert_eq!(
            admitted.extensions().get::<Principal>(),
            Some(&Principal::ClusterAdmin)
        );
    }

    #[test]
    fn a_handler_asking_for_an_action_its_row_does_not_allow_fails_closed() {
        let mut req = call("GetTask", None);
        req.extensions_mut().insert(Principal::ClusterAdmin);
        assert!(authorize(&req, "default", Action::Read, "").is_ok());
        // The cluster admin may do anything, yet a GetTask handler asking to Deploy is refused.
        let e = authorize(&req, "default", Action::Deploy, "").unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(e.message().contains("auth_table.rs"), "{}", e.message());
    }

    #[test]
    fn the_outcome_of_a_call_is_read_from_its_response_headers() {
        let mut h = http::HeaderMap::new();
        assert_eq!(outcome(&h), ("ok".into(), String::new()));
        h.insert("grpc-status", http::HeaderValue::from_static("7"));
        h.insert(
            "grpc-message",
            http::HeaderValue::from_static("needs role submitter in namespace %60a%60"),
        );
        assert_eq!(
            outcome(&h),
            (
                "permission_denied".into(),
                "needs role submitter in namespace `a`".into()
            )
        );
        h.insert("grpc-status", http::HeaderValue::from_static("16"));
        assert_eq!(outcome(&h).0, "unauthenticated");
    }
}
