//! The `/metrics` endpoint of a daemon (`--metrics-listen ADDR`): plain HTTP/1.1, `GET
//! /metrics` answers the Prometheus text a `render` function makes at that moment; anything
//! else is 404. One request per connection, bounded in size and time, so a slow or hostile
//! scraper holds nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The media type of the text exposition format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A request head longer than this is refused.
const MAX_HEAD: usize = 8 * 1024;
/// A connection that has not sent its request head by then is closed.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What makes the body of one scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `listener` until `stop` resolves.
pub async fn serve(
    listener: TcpListener,
    render: Render,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = &mut stop => return,
        };
        match conn {
            Ok((stream, _)) => {
                let render = render.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT, answer(stream, render)).await;
                });
            }
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, render: Render) -> std::io::Result<()> {
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
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    if method == "GET" && (path == "/metrics" || path == "/") {
        let body = render();
        respond(&mut stream, "200 OK", CONTENT_TYPE, &body).await
    } else {
        respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "only GET /metrics is served here\n",
        )
        .await
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
