//! A command server's stderr: every line, with the instance's secret values redacted first,
//! goes to `tracing` with the server's name; the first lines (the "head", for "why did it not start") and the last lines (the "tail", for "why did
//! it die") are kept, bounded in lines and bytes. Invariant: no line is logged or kept before
//! it went through the [`Redactor`] (these lines reach `agen ps`, the Nest's log and the Hub).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;

use crate::redact::Redactor;

/// Lines kept at the head and at the tail.
const KEEP_LINES: usize = 20;
/// Bytes kept at the head and at the tail.
const KEEP_BYTES: usize = 4096;
/// One stored line is cut to this many bytes.
const MAX_LINE: usize = 1000;

#[derive(Default)]
struct Log {
    head: Vec<String>,
    head_bytes: usize,
    tail: VecDeque<String>,
    tail_bytes: usize,
    total: usize,
}

/// The captured stderr of one server process.
pub(crate) struct StderrCapture {
    log: Arc<Mutex<Log>>,
    reader: Option<JoinHandle<()>>,
}

impl StderrCapture {
    /// Starts reading `stream` until it closes.
    pub(crate) fn start(
        server: &str,
        stream: impl AsyncRead + Unpin + Send + 'static,
        redactor: Redactor,
    ) -> StderrCapture {
        let log = Arc::new(Mutex::new(Log::default()));
        let server = server.to_string();
        let sink = log.clone();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match lines.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf);
                        let line = redactor.redact(line.trim_end_matches(['\n', '\r']));
                        tracing::info!(target: "agen::mcp::server", server = %server, "{line}");
                        push(&sink, &line);
                    }
                }
            }
        });
        StderrCapture {
            log,
            reader: Some(reader),
        }
    }

    /// An empty capture (url servers have no stderr).
    pub(crate) fn none() -> StderrCapture {
        StderrCapture {
            log: Arc::new(Mutex::new(Log::default())),
            reader: None,
        }
    }

    /// Waits up to `limit` for the stream to close, so that the last lines are in.
    pub(crate) async fn drain(&mut self, limit: Duration) {
        if let Some(reader) = self.reader.as_mut() {
            if tokio::time::timeout(limit, reader).await.is_ok() {
                self.reader = None;
            }
        }
    }

    /// The first lines, plus the last line when more followed (a Python traceback ends with
    /// the useful line). Empty when the server wrote nothing.
    pub(crate) fn head(&self) -> String {
        let log = lock(&self.log);
        let mut out = log.head.join("\n");
        let shown = log.head.len();
        if log.total > shown {
            let more = log.total - shown;
            if let Some(last) = log.tail.back() {
                out.push_str(&format!("\n… ({more} more lines) …\n{last}"));
            }
        }
        out
    }

    /// The last lines. Empty when the server wrote nothing.
    pub(crate) fn tail(&self) -> String {
        let log = lock(&self.log);
        log.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for StderrCapture {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

fn lock(log: &Mutex<Log>) -> std::sync::MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn push(log: &Mutex<Log>, line: &str) {
    let line = cut(line, MAX_LINE);
    let mut log = lock(log);
    log.total += 1;
    if log.head.len() < KEEP_LINES && log.head_bytes + line.len() <= KEEP_BYTES {
        log.head_bytes += line.len();
        log.head.push(line.clone());
    }
    log.tail_bytes += line.len();
    log.tail.push_back(line);
    while log.tail.len() > KEEP_LINES || (log.tail_bytes > KEEP_BYTES && log.tail.len() > 1) {
        if let Some(old) = log.tail.pop_front() {
            log.tail_bytes -= old.len();
        }
    }
}

fn cut(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn capture(text: &str) -> StderrCapture {
        let mut c = StderrCapture::start(
            "t",
            std::io::Cursor::new(text.as_bytes().to_vec()),
            Redactor::new(["hunter2-secret"]),
        );
        c.drain(Duration::from_secs(5)).await;
        c
    }

    #[tokio::test]
    async fn short_output_is_kept_whole() {
        let c = capture("one\ntwo\n").await;
        assert_eq!(c.head(), "one\ntwo");
        assert_eq!(c.tail(), "one\ntwo");
    }

    #[tokio::test]
    async fn long_output_keeps_first_lines_and_the_last_one() {
        let text: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let c = capture(&text).await;
        let head = c.head();
        assert!(head.starts_with("line 1\nline 2\n"), "{head}");
        assert!(head.ends_with("… (10 more lines) …\nline 30"), "{head}");
        assert!(c.tail().starts_with("line 11\n"), "{}", c.tail());
    }

    #[tokio::test]
    async fn secret_values_are_redacted_before_they_are_kept() {
        let c = capture("connecting with hunter2-secret\n{\"pw\": \"hunter2-secret\"}\n").await;
        assert_eq!(
            c.head(),
            "connecting with [redacted]\n{\"pw\": \"[redacted]\"}"
        );
    }

    #[tokio::test]
    async fn nothing_written_gives_empty_head() {
        assert_eq!(capture("").await.head(), "");
    }
}
