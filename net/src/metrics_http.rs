//! The `/metrics` endpoint of a daemon (`--metrics-listen ADDR`): plain HTTP/1.1, `GET
//! /metrics` answers the Prometheus text a `render` function makes at that moment (with the
//! process metrics of [`process_metrics`] added; OpenMetrics, or the classic text format when
//! the request's `Accept` asks for it), `GET
//! /healthz` 200 while the process serves, `GET /readyz` 200 or 503 as the daemon's readiness
//! says; anything else is 404. One request per connection, bounded in size and time, so a slow
//! or hostile scraper holds nothing.
//!
//! [`Access`]: with a token (`--metrics-token-file`), `/metrics` needs `Authorization: Bearer
//! <token>` (401 otherwise); `/healthz` and `/readyz` never do. With refused uids (a separating
//! Nest's `--run-uids`: its instances and tool servers), a connection from a process of this
//! host whose socket belongs to one of them is answered 403 whatever it asks (the owner as
//! [`crate::peer_uid`] finds it; a loopback peer whose socket cannot be found is refused too).

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::peer_uid::{self, Peer};

/// The media type of the text exposition format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The media type of the classic Prometheus text format (what `promtool check metrics` reads).
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// A request head longer than this is refused.
const MAX_HEAD: usize = 8 * 1024;
/// A connection that has not sent its request head by then is closed.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What makes the body of one scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;
/// Whether the daemon is ready to serve (`/readyz`).
pub type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

/// Who may read what (see the module doc).
#[derive(Clone, Default)]
pub struct Access {
    /// The bearer token `/metrics` needs; `None`: unauthenticated.
    pub token: Option<Arc<str>>,
    /// Local processes of these uids are refused every path.
    pub refused_uids: Vec<RangeInclusive<u32>>,
    /// `/readyz`: 200 when it says so, else 503; `None`: ready while serving.
    pub ready: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

/// Serves `listener` until `stop` resolves, `/metrics` to anyone.
pub async fn serve(
    listener: TcpListener,
    render: Render,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    serve_with(listener, render, Access::default(), stop).await
}

/// [`serve`] with `/readyz` answered by `ready`.
pub async fn serve_with_ready(
    listener: TcpListener,
    render: Render,
    ready: Ready,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let access = Access {
        ready: Some(ready),
        ..Access::default()
    };
    serve_with(listener, render, access, stop).await
}

/// Serves `listener` until `stop` resolves, as `access` says.
pub async fn serve_with(
    listener: TcpListener,
    render: Render,
    access: Access,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let access = Arc::new(access);
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = &mut stop => return,
        };
        match conn {
            Ok((stream, peer)) => {
                let (render, access) = (render.clone(), access.clone());
                tokio::spawn(async move {
                    let _ =
                        tokio::time::timeout(READ_TIMEOUT, answer(stream, peer, render, access))
                            .await;
                });
            }
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(
    mut stream: TcpStream,
    peer: SocketAddr,
    render: Render,
    access: Arc<Access>,
) -> std::io::Result<()> {
    let local = stream.local_addr()?;
    let refused = Arc::new(access.refused_uids.clone());
    if let Peer::Refused(owner) = peer_uid::check_async(peer, local, refused).await {
        tracing::warn!(%peer, uid = ?owner, "metrics listener: refused a local process of an instance or tool server uid");
        return respond(
            &mut stream,
            "403 Forbidden",
            "text/plain",
            "instances and their tool servers may not read this daemon's endpoints\n",
        )
        .await;
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "",
            )
            .await;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" {
        return respond(&mut stream, "404 Not Found", "text/plain", NOT_FOUND).await;
    }
    match path {
        "/healthz" => respond(&mut stream, "200 OK", "text/plain", "ok\n").await,
        "/readyz" => {
            if access.ready.as_ref().is_none_or(|r| r()) {
                respond(&mut stream, "200 OK", "text/plain", "ready\n").await
            } else {
                respond(
                    &mut stream,
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready\n",
                )
                .await
            }
        }
        "/metrics" | "/" => {
            if let Some(token) = &access.token {
                let given = lines.find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case("authorization")
                        .then(|| v.trim().to_string())
                });
                let ok = given
                    .as_deref()
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .is_some_and(|t| same(t.trim().as_bytes(), token.as_bytes()));
                if !ok {
                    return respond_with(
                        &mut stream,
                        "401 Unauthorized",
                        "www-authenticate: Bearer\r\n",
                        "text/plain",
                        "/metrics needs Authorization: Bearer <the token of --metrics-token-file>\n",
                    )
                    .await;
                }
            }
            let body = with_process_metrics(render());
            if wants_classic_text(&head) {
                let body = classic_text(&body);
                respond(&mut stream, "200 OK", CLASSIC_CONTENT_TYPE, &body).await
            } else {
                respond(&mut stream, "200 OK", CONTENT_TYPE, &body).await
            }
        }
        _ => respond(&mut stream, "404 Not Found", "text/plain", NOT_FOUND).await,
    }
}

const NOT_FOUND: &str = "only GET /metrics, /healthz and /readyz are served here\n";

/// Compares in time that does not depend on where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    respond_with(stream, status, "", ctype, body).await
}

async fn respond_with(
    stream: &mut TcpStream,
    status: &str,
    extra: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\n{extra}content-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Whether the request asks for the classic text format: an `Accept` header that names no
/// OpenMetrics (`curl -H 'Accept: text/plain' …/metrics | promtool check metrics`). No
/// `Accept`, or one that offers OpenMetrics (as Prometheus does), gets OpenMetrics.
fn wants_classic_text(head: &[u8]) -> bool {
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    head.lines()
        .filter_map(|l| l.strip_prefix("accept:"))
        .any(|v| !v.contains("application/openmetrics-text") && !v.contains("*/*"))
}

/// OpenMetrics text as the classic Prometheus text format: a counter's `HELP` and `TYPE` name
/// its `_total` samples, and the `# UNIT` and `# EOF` lines go.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// `body` (OpenMetrics text ending in `# EOF`) with [`process_metrics`] before its end.
fn with_process_metrics(body: String) -> String {
    let extra = process_metrics();
    match body.strip_suffix("# EOF\n") {
        Some(head) => format!("{head}{extra}# EOF\n"),
        None => format!("{body}{extra}"),
    }
}

/// The standard process metrics of this process, read from `/proc/self` (Linux): CPU seconds,
/// resident memory, open file descriptors and their limit, start time. What cannot be read is
/// left out.
pub fn process_metrics() -> String {
    let mut out = String::new();
    let mut add = |name: &str, kind: &str, help: &str, sample: &str, v: f64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{sample} {v}\n"
        ));
    };
    // sysconf values that are the same on every Linux this runs on.
    const TICKS: f64 = 100.0;
    let page = 4096.0;
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the command (which may hold spaces) start after the last `)`.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let num = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        // Field numbers of proc(5) minus 3 (pid, comm and state come before index 0).
        if let (Some(utime), Some(stime)) = (num(11), num(12)) {
            add(
                "process_cpu_seconds",
                "counter",
                "Total user and system CPU time spent in seconds",
                "process_cpu_seconds_total",
                (utime + stime) / TICKS,
            );
        }
        if let Some(rss) = num(21) {
            add(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes",
                "process_resident_memory_bytes",
                rss * page,
            );
        }
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        if let (Some(start), Some(boot)) = (num(19), boot) {
            add(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since the unix epoch in seconds",
                "process_start_time_seconds",
                boot + start / TICKS,
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        add(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors",
            "process_open_fds",
            fds.count() as f64,
        );
    }
    if let Ok(limits) = std::fs::read_to_string("/proc/self/limits") {
        let max = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(max) = max {
            add(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors",
                "process_max_fds",
                max,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_metrics_are_read_and_go_before_the_end_marker() {
        let text = process_metrics();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} in {text}");
        }
        let body = with_process_metrics("# HELP a b\n# TYPE a gauge\na 1\n# EOF\n".into());
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert_eq!(body.matches("# EOF").count(), 1);
    }

    #[test]
    fn the_classic_format_names_counters_by_their_samples_and_has_no_eof() {
        let om = "# HELP t Tasks.\n# TYPE t counter\nt_total{s=\"a\"} 1\n# HELP g G.\n# TYPE g gauge\n# UNIT g seconds\ng 2\n# EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP t_total Tasks.\n# TYPE t_total counter\nt_total{s=\"a\"} 1\n# HELP g G.\n# TYPE g gauge\ng 2\n"
        );
        let ask = |accept: &str| {
            wants_classic_text(format!("GET /metrics HTTP/1.1\r\n{accept}\r\n\r\n").as_bytes())
        };
        assert!(ask("Accept: text/plain"));
        assert!(!ask(
            "accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        ));
        assert!(!ask("Accept: */*"));
        assert!(!ask("host: x"));
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
