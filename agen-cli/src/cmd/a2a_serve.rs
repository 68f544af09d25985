//! `agen a2a serve DEPLOYMENT --listen ADDR`: one deployment at an origin of its own, for local
//! clients that look for an agent at an origin root (`/.well-known/agent-card.json`, JSON-RPC
//! at `/`). A plain-HTTP listener on a loopback address that forwards each request to the Hub's
//! `/a2a/<namespace>/<deployment>` endpoints: the card (whose interface URL becomes this
//! origin, as the client named it in `Host`) and the JSON-RPC calls, bodies streamed both ways
//! (SSE included). The caller's own `Authorization` goes to the Hub untouched: the listener
//! adds no credential, so a client needs its own token as it would at the Hub.

use std::net::SocketAddr;
use std::sync::Arc;

use agen_proto::v1 as pb;
use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

use crate::client::{status_error, ClientArgs};

/// Request headers passed on to the Hub.
const FORWARDED: [HeaderName; 4] = [
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    header::ACCEPT,
    HeaderName::from_static("a2a-version"),
];
/// Response headers passed back to the client.
const RETURNED: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::WWW_AUTHENTICATE,
    header::CACHE_CONTROL,
];

struct Upstream {
    http: reqwest::Client,
    /// `<hub>/a2a/<namespace>/<deployment>`.
    base: String,
    /// This listener's address, for a card asked for without `Host`.
    listen: SocketAddr,
}

/// Runs the listener until SIGINT/SIGTERM.
pub async fn run(
    deployment: String,
    listen: SocketAddr,
    client: ClientArgs,
) -> anyhow::Result<i32> {
    if !listen.ip().is_loopback() {
        eprintln!(
            "error: --listen {listen}: `agen a2a serve` speaks plain HTTP and so listens only on a loopback address such as 127.0.0.1:{}; other machines reach the deployment at the Hub (agen a2a ls) or under `agen hub --a2a-domain`",
            listen.port()
        );
        return Ok(crate::exit::code::USAGE);
    }
    let mut hub = client.connect()?;
    // The deployment must exist (with this CLI's token); the clients bring their own.
    hub.client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: deployment.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?;
    let mut http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .pool_idle_timeout(std::time::Duration::from_secs(30));
    if let Some(ca) = &hub.ca_file {
        let pem = std::fs::read(ca)
            .with_context(|| format!("cannot read the Hub's CA file {}", ca.display()))?;
        http = http.add_root_certificate(
            reqwest::Certificate::from_pem(&pem)
                .with_context(|| format!("{} is not a PEM certificate", ca.display()))?,
        );
    }
    let upstream = Arc::new(Upstream {
        http: http.build().context("cannot make the HTTP client")?,
        base: format!(
            "{}/a2a/{}/{deployment}",
            hub.url.trim_end_matches('/'),
            hub.namespace
        ),
        listen,
    });
    let app = axum::Router::new()
        .route("/.well-known/agent-card.json", axum::routing::get(card))
        .route("/", axum::routing::post(rpc))
        .with_state(upstream);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener
        .local_addr()
        .context("the listener has no address")?;
    crate::outln!(
        "serving deployment {}/{deployment} as an A2A agent at http://{addr}/ (card: http://{addr}/.well-known/agent-card.json); Ctrl-C stops",
        hub.namespace
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    crate::cmd::cancel_on_signals(shutdown.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .context("the A2A listener failed")?;
    Ok(0)
}

fn forward(from: &HeaderMap, mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    for name in FORWARDED {
        for v in from.get_all(&name) {
            req = req.header(name.clone(), v.clone());
        }
    }
    req
}

fn bad_gateway(e: reqwest::Error) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        format!("cannot reach the Agen Hub: {e}"),
    )
        .into_response()
}

/// The Hub's answer as it is (status, the headers in [`RETURNED`], the body streamed).
fn relay(r: reqwest::Response) -> Response {
    let mut out = Response::builder().status(r.status().as_u16());
    for name in RETURNED {
        for v in r.headers().get_all(&name) {
            out = out.header(name.clone(), v.clone());
        }
    }
    let body = Body::from_stream(r.bytes_stream().map_err(std::io::Error::other));
    out.body(body)
        .unwrap_or_else(|e| (StatusCode::BAD_GATEWAY, e.to_string()).into_response())
}

/// The card, its interface URL this origin.
async fn card(State(u): State<Arc<Upstream>>, headers: HeaderMap) -> Response {
    let url = format!("{}/.well-known/agent-card.json", u.base);
    let r = match forward(&headers, u.http.get(&url)).send().await {
        Ok(r) => r,
        Err(e) => return bad_gateway(e),
    };
    if !r.status().is_success() {
        return relay(r);
    }
    let mut card: agen_contract::a2a::AgentCard = match r.json().await {
        Ok(c) => c,
        Err(e) => {
            return (
                StatusCode::BAD_GATEWAY,
                format!("the Hub's agent card at {url} is not a card: {e}"),
            )
                .into_response()
        }
    };
    // The origin the client asked (a name or address with a port, nothing else).
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .map_or_else(|| u.listen.to_string(), str::to_string);
    for i in &mut card.supported_interfaces {
        i.url = format!("http://{host}/");
    }
    axum::Json(card).into_response()
}

/// A JSON-RPC call, passed through.
async fn rpc(State(u): State<Arc<Upstream>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    match forward(&parts.headers, u.http.post(&u.base).body(body))
        .send()
        .await
    {
        Ok(r) => relay(r),
        Err(e) => bad_gateway(e),
    }
}
