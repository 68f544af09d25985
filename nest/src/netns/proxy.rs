//! The Nest's side of an instance's namespace: the egress proxy every TCP connection leaving the
//! namespace is redirected to (it reads where the connection was going with `SO_ORIGINAL_DST`,
//! its name from the TLS SNI or HTTP Host of its first bytes, decides with the instance's
//! [`super::decide::Policy`], and dials from the Nest), and the relays that carry the bundle's
//! own endpoints on the Nest host's loopback (model `baseUrl`, `url` servers, A2A cards) into
//! the namespace's loopback on the same port.
//!
//! Invariants: the proxy dials the name it decided on (SNI/Host), resolved by the Nest, never an
//! address the instance chose for that name; a refusal is logged once for the instance (`agen
//! logs`), counted in `agen_egress_refused_total`, and answered with a 403 naming host and rule
//! for plain HTTP, a reset otherwise (a refused DNS question, [`super::dns`], NXDOMAIN).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::decide::{sniff, Sniffed, Verdict};

/// How long the proxy waits for a client's first bytes before it decides by address alone.
const SNIFF_WAIT: Duration = Duration::from_millis(400);
/// The most it reads before deciding.
const SNIFF_MAX: usize = 16 * 1024;
/// How long a dial out may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(15);

/// Accepts redirected connections until `stop`.
pub async fn serve(listener: TcpListener, cx: Arc<Context>, stop: CancellationToken) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.cancelled() => return,
        };
        let Ok((stream, _)) = conn else { continue };
        let (cx, stop) = (cx.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = handle(stream, &cx) => {},
                _ = stop.cancelled() => {},
            }
        });
    }
}

/// Where a redirected connection was going (`SO_ORIGINAL_DST`, IPv4).
#[allow(unsafe_code)]
fn original_dst(s: &TcpStream) -> Option<SocketAddr> {
    use std::os::fd::AsRawFd;
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` and `len` are valid for the kernel to write a sockaddr_in into.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let ip = std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(addr.sin_port)))
}

async fn handle(mut client: TcpStream, cx: &Context) {
    let Some(dst) = original_dst(&client) else {
        return;
    };
    if dst == cx.own {
        return;
    }
    let mut buf = Vec::with_capacity(2048);
    let deadline = tokio::time::Instant::now() + SNIFF_WAIT;
    let mut sniffed = Sniffed::NeedMore;
    while sniffed == Sniffed::NeedMore && buf.len() < SNIFF_MAX {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                buf.extend_from_slice(&chunk[..n]);
                sniffed = sniff(&buf);
            }
            // Nothing yet (a protocol where the server speaks first): by address.
            Err(_) => break,
        }
    }
    let (named, http) = match &sniffed {
        Sniffed::Tls(n) => (Some(n.clone()), false),
        Sniffed::Http(n) => (Some(n.clone()), true),
        _ => (None, false),
    };
    // The host it dials: the name it asked for, else the address.
    let (names, dial): (Vec<String>, Dial) = match &named {
        Some(n) => match n.parse::<IpAddr>() {
            Ok(ip) => (Vec::new(), Dial::Addr(SocketAddr::new(ip, dst.port()))),
            Err(_) => (vec![n.clone()], Dial::Name(n.clone(), dst.port())),
        },
        None => (cx.names.of(dst.ip()), Dial::Addr(dst)),
    };
    let target = match &dial {
        Dial::Name(n, p) => match resolve(n, *p).await {
            Some(a) => a,
            None => {
                return refuse(
                    client,
                    cx,
                    &format!("{n}:{p}"),
                    "the name does not resolve on the Nest",
                    http,
                )
                .await;
            }
        },
        Dial::Addr(a) => *a,
    };
    let shown = match &dial {
        Dial::Name(n, p) => format!("{n}:{p}"),
        Dial::Addr(a) => a.to_string(),
    };
    let protected = cx.network.is_protected(target);
    let mut verdict = cx
        .policy
        .decide(&names, Some(target.ip()), target.port(), protected);
    if matches!(verdict, Verdict::Refuse(_)) && names.is_empty() {
        // An address alone: allowed when a name the rule allows resolves to it.
        let mut by_rule = Vec::new();
        for p in &cx.policy.allow {
            if let Some(n) = p.exact_name() {
                if lookup(n).await.contains(&target.ip()) {
                    by_rule.push(n.to_string());
                }
            }
        }
        if !by_rule.is_empty() {
            verdict = cx
                .policy
                .decide(&by_rule, Some(target.ip()), target.port(), protected);
        }
    }
    match verdict {
        Verdict::Refuse(rule) => refuse(client, cx, &shown, &rule, http).await,
        Verdict::Allow(_) => {
            let mut up = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target)).await
            {
                Ok(Ok(up)) => up,
                failed => {
                    let why = failed.map_or_else(
                        |_| "timed out".to_string(),
                        |r| r.err().map(|e| e.to_string()).unwrap_or_default(),
                    );
                    tracing::info!(instance = %cx.instance, host = %shown, "egress allowed but the connection failed: {why}");
                    let _ = client.set_zero_linger();
                    return;
                }
            };
            if up.write_all(&buf).await.is_err() {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        }
    }
}

enum Dial {
    Name(String, u16),
    Addr(SocketAddr),
}

async fn lookup(name: &str) -> Vec<IpAddr> {
    tokio::net::lookup_host((name, 0))
        .await
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default()
}

async fn resolve(name: &str, port: u16) -> Option<SocketAddr> {
    let addrs = lookup(name).await;
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|ip| SocketAddr::new(*ip, port))
}

async fn refuse(mut client: TcpStream, cx: &Context, host: &str, rule: &str, http: bool) {
    let text = cx.refused(host, rule, None);
    if http {
        let body = format!("agen: {text}\n");
        let _ = client
            .write_all(
                format!(
                    "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        let _ = client.shutdown().await;
    } else {
        let _ = client.set_zero_linger();
    }
}

/// Carries connections to `listener` (in the namespace) to `to` on the Nest host, until `stop`.
pub async fn relay(listener: TcpListener, to: SocketAddr, stop: CancellationToken) {
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.cancelled() => return,
        };
        let Ok((mut inner, _)) = conn else { continue };
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(mut outer) = TcpStream::connect(to).await else {
                let _ = inner.set_zero_linger();
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inner, &mut outer) => {},
                _ = stop.cancelled() => {},
            }
        });
    }
}
