//! A follower's port (several Hubs on PostgreSQL): until it leads, a Hub listens on the same
//! port with the same TLS and serves the whole client API by forwarding each gRPC call
//! (`AgenService`, streams such as `WatchTask` included, and a Nest's first `Join`, which
//! carries its join token) unchanged to the leader's advertised URL, over TLS trusting the
//! shared CA: the leader authenticates the caller's token and authorizes as it would a direct
//! call. Nest calls (`Connect` and the rest, which the leader knows a Nest by its client
//! certificate for) are answered `UNAVAILABLE` with the leader's URL in the `agen-leader`
//! metadata (the leader hint): the Nest goes there. HTTP (A2A, the console) is redirected
//! (307) to the leader. Health answers here, with the role headers ([`crate::role`]).
//!
//! Invariants: a forwarded call is forwarded once (`agen-forwarded-by`; a follower that gets
//! a forwarded call, or sees itself named leader, answers `UNAVAILABLE`); a follower never
//! writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::role::{Role, LEADER_HEADER};

/// Header a follower adds to the calls it forwards.
const FORWARDED: &str = "agen-forwarded-by";

/// The follower's forwarding.
pub struct Forward {
    role: Arc<Role>,
    /// This Hub's advertised URL.
    own_url: String,
    /// The shared CA (PEM), which the leader's certificate is checked with; `None`: plaintext.
    ca_pem: Option<String>,
    /// The channel to the leader, by its URL.
    channel: Mutex<Option<(String, Channel)>>,
}

impl Forward {
    pub fn new(role: Arc<Role>, own_url: String, ca_pem: Option<String>) -> Arc<Forward> {
        Arc::new(Forward {
            role,
            own_url,
            ca_pem,
            channel: Mutex::new(None),
        })
    }

    /// The leader's URL when it is another Hub's.
    fn leader(&self) -> Option<String> {
        let now = self.role.now();
        (!now.leader_url.is_empty() && now.leader_url != self.own_url).then_some(now.leader_url)
    }

    fn channel_to(&self, url: &str) -> Result<Channel, String> {
        let mut slot = self.channel.lock().map_err(|e| e.to_string())?;
        if let Some((u, c)) = slot.as_ref() {
            if u == url {
                return Ok(c.clone());
            }
        }
        let mut ep = Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("the leader's URL {url}: {e}"))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(20));
        if let Some(ca) = &self.ca_pem {
            ep = ep
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
                .map_err(|e| format!("TLS to the leader at {url}: {e}"))?;
        }
        let c = ep.connect_lazy();
        *slot = Some((url.to_owned(), c.clone()));
        Ok(c)
    }

    /// `UNAVAILABLE` with the leader hint (when a leader is known).
    fn unavailable(&self, why: &str) -> Response {
        let leader = self.leader();
        let msg = match &leader {
            Some(u) => format!("{why}; the leader is at {u}"),
            None => format!("{why}; no Hub leads right now (retry shortly)"),
        };
        let mut status = tonic::Status::unavailable(msg);
        if let Some(u) = leader.and_then(|u| u.parse().ok()) {
            status.metadata_mut().insert(LEADER_HEADER, u);
        }
        status.into_http::<Body>()
    }

    /// Serves one request of the follower's port (every path but health).
    pub async fn handle(self: Arc<Self>, mut req: http::Request<Body>) -> Response {
        let grpc = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("application/grpc"));
        if !grpc {
            return match self.leader() {
                Some(u) => {
                    let path = req
                        .uri()
                        .path_and_query()
                        .map(|p| p.as_str())
                        .unwrap_or("/");
                    let to = format!("{}{path}", u.trim_end_matches('/'));
                    (
                        http::StatusCode::TEMPORARY_REDIRECT,
                        [(http::header::LOCATION, to)],
                        "this Hub follows; the leader serves this\n",
                    )
                        .into_response()
                }
                None => (
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "this Hub follows and no Hub leads right now; retry shortly\n",
                )
                    .into_response(),
            };
        }
        let path = req.uri().path().to_owned();
        if path.starts_with("/agen.v1.NestService/") {
            // A Nest's first Join carries its join token and is forwarded; a renewal by its
            // certificate, and every other Nest call, is the leader's to answer.
            let by_cert =
                req.extensions()
                    .get::<tonic::transport::server::TlsConnectInfo<
                        tonic::transport::server::TcpConnectInfo,
                    >>()
                    .and_then(|i| i.peer_certs())
                    .is_some_and(|c| !c.is_empty());
            if path != "/agen.v1.NestService/Join" || by_cert {
                return self.unavailable("this Hub follows: Nests connect to the leader");
            }
        }
        if req.headers().contains_key(FORWARDED) {
            return self.unavailable("this Hub follows and was sent a forwarded call");
        }
        let Some(leader) = self.leader() else {
            return self.unavailable("this Hub follows");
        };
        let channel = match self.channel_to(&leader) {
            Ok(c) => c,
            Err(e) => return self.unavailable(&format!("this Hub follows: {e}")),
        };
        if let Ok(v) = http::HeaderValue::from_str(&self.own_url) {
            req.headers_mut().insert(FORWARDED, v);
        }
        let req = req.map(tonic::body::Body::new);
        match tower::ServiceExt::oneshot(channel, req).await {
            Ok(r) => r.map(Body::new),
            Err(e) => {
                tracing::debug!(%leader, "forwarding a call to the leader failed: {e}");
                self.unavailable(&format!(
                    "this Hub follows and cannot reach the leader: {e}"
                ))
            }
        }
    }
}

/// The follower's routes: health (with the role headers) and the forwarding of everything else.
pub fn router(
    forward: Arc<Forward>,
    role: Arc<Role>,
    stop: tokio_util::sync::CancellationToken,
) -> axum::Router {
    let (reporter, health) = tonic_health::server::health_reporter();
    // The client API is served (forwarded) here; Nests are the leader's.
    let status_of = |ok: bool| {
        if ok {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        }
    };
    let watched = role.clone();
    tokio::spawn(async move {
        let mut was = None;
        loop {
            let ok = watched.now().db_ok;
            if was != Some(ok) {
                for service in ["", "agen.v1.AgenService"] {
                    reporter.set_service_status(service, status_of(ok)).await;
                }
                reporter
                    .set_service_status(
                        "agen.v1.NestService",
                        tonic_health::ServingStatus::NotServing,
                    )
                    .await;
                was = Some(ok);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
    let router = crate::role::health_route(axum::Router::new(), health, role);
    router.fallback(move |req: http::Request<Body>| forward.clone().handle(req))
}

/// Serves `routes` (the follower's) on the connections `incoming` yields until `until` is
/// cancelled, then gives the rest of `incoming` back (the leader's server takes it on; calls
/// in flight on the follower's connections finish there).
pub fn serve_until<IO>(
    incoming: tokio_stream::wrappers::ReceiverStream<std::io::Result<IO>>,
    routes: axum::Router,
    until: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<tokio_stream::wrappers::ReceiverStream<std::io::Result<IO>>>
where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IO::ConnectInfo: Clone + Send + Sync + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_routes(tonic::service::Routes::from(routes));
    let stop = until.clone();
    tokio::spawn(async move {
        let served = server
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                stop.cancelled_owned(),
            )
            .await;
        if let Err(e) = served {
            tracing::warn!("the follower's server stopped: {e}");
        }
    });
    tokio::spawn(async move {
        let mut incoming = incoming;
        loop {
            tokio::select! {
                biased;
                _ = until.cancelled() => return incoming,
                conn = tokio_stream::StreamExt::next(&mut incoming) => match conn {
                    Some(c) => {
                        if tx.send(c).await.is_err() {
                            return incoming;
                        }
                    }
                    None => return incoming,
                },
            }
        }
    })
}
