//! Answers one `LogRequest` of the Hub: the kept lines (filtered by `since_ms`, the last
//! `tail`) when this Nest keeps the instance's logs for the request's namespace (else
//! `not_kept`, saying nothing of other namespaces), then, when following, each new line as it is written, all over one
//! `NestService.SendLogs` call (never the Connect stream). Ends when the Hub ends the call
//! (its reader went away) or the Nest stops.

use std::path::Path;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{read_from, rotated, LogStore, Source, StoredLine};
use crate::hub_client::HubClient;
use crate::model::{LogChunk, LogLine, LogRequest};

/// Lines per `LogChunk`.
const LINES_PER_CHUNK: usize = 256;

/// Serves `req` in the background over a `SendLogs` call made with `client`.
pub fn answer(store: LogStore, client: HubClient, req: LogRequest, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let (tx, rx) = mpsc::channel::<LogChunk>(8);
        let request_id = req.request_id.clone();
        let producer = tokio::spawn(produce(store, req, tx, shutdown));
        let mut client = client;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        if let Err(e) = client.send_logs(stream).await {
            tracing::debug!(request = %request_id, "log request ended: {}", e.message);
        }
        producer.abort();
    });
}

async fn produce(
    store: LogStore,
    req: LogRequest,
    tx: mpsc::Sender<LogChunk>,
    shutdown: CancellationToken,
) {
    let chunk = |lines: Vec<LogLine>, error: String| LogChunk {
        request_id: req.request_id.clone(),
        lines,
        error,
        not_kept: false,
    };
    if !serves(&store, &req) {
        let mut refused = chunk(
            Vec::new(),
            if req.namespace.is_empty() {
                format!("this nest keeps no logs of instance {}", req.instance_id)
            } else {
                format!(
                    "this nest keeps no logs of instance {} in namespace {}",
                    req.instance_id, req.namespace
                )
            },
        );
        refused.not_kept = true;
        let _ = tx.send(refused).await;
        return;
    }
    let source = if req.server.is_empty() {
        Source::Instance
    } else {
        Source::Server(req.server.clone())
    };
    let to_line = |l: StoredLine| LogLine {
        instance_id: req.instance_id.clone(),
        server: req.server.clone(),
        at_ms: l.at_ms,
        level: l.level,
        text: l.text,
    };
    // Subscribe before reading, so that nothing written in between is missed.
    let mut written = store.subscribe();
    let path = store.path(&req.instance_id, &source);
    let (kept, mut offset) = match kept_lines(&path) {
        Ok(k) => k,
        Err(e) => {
            let _ = tx
                .send(chunk(
                    Vec::new(),
                    format!("cannot read {}: {e}", path.display()),
                ))
                .await;
            return;
        }
    };
    let mut kept: Vec<StoredLine> = kept
        .into_iter()
        .filter(|l| l.at_ms >= req.since_ms)
        .collect();
    if req.tail > 0 && kept.len() > req.tail as usize {
        kept.drain(..kept.len() - req.tail as usize);
    }
    // The first chunk always goes, so that the Hub knows the request is answered.
    let mut first = true;
    let mut batch: Vec<LogLine> = Vec::new();
    for line in kept {
        batch.push(to_line(line));
        if batch.len() == LINES_PER_CHUNK {
            if tx
                .send(chunk(std::mem::take(&mut batch), String::new()))
                .await
                .is_err()
            {
                return;
            }
            first = false;
        }
    }
    if (first || !batch.is_empty())
        && tx
            .send(chunk(std::mem::take(&mut batch), String::new()))
            .await
            .is_err()
    {
        return;
    }
    if !req.follow {
        return;
    }
    loop {
        tokio::select! {
            changed = written.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
            _ = shutdown.cancelled() => return,
        }
        let mut new = Vec::new();
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len < offset {
            // Rotated: the rest of the old file, then the new one from its start.
            if let Ok((rest, _)) = read_from(&rotated(&path), offset) {
                new.extend(rest);
            }
            offset = 0;
        }
        match read_from(&path, offset) {
            Ok((lines, next)) => {
                new.extend(lines);
                offset = next;
            }
            Err(_) => continue,
        }
        if new.is_empty() {
            continue;
        }
        for part in new.chunks(LINES_PER_CHUNK) {
            let lines = part.iter().cloned().map(to_line).collect();
            if tx.send(chunk(lines, String::new())).await.is_err() {
                return;
            }
        }
    }
}

/// Whether this Nest serves `req`: it keeps logs of the instance, recorded for the request's
/// namespace. Logs kept before owners were recorded are served only while the Hub lists the
/// instance (not to a search, which cannot prove their namespace).
fn serves(store: &LogStore, req: &LogRequest) -> bool {
    if !store.knows(&req.instance_id) {
        return false;
    }
    match store.owner(&req.instance_id) {
        Some(owner) => req.namespace.is_empty() || owner.namespace == req.namespace,
        None => !req.search,
    }
}

/// The rotated file's lines, then the current file's; and the offset reached in the current.
fn kept_lines(path: &Path) -> std::io::Result<(Vec<StoredLine>, u64)> {
    let (mut lines, _) = read_from(&rotated(path), 0)?;
    let (current, offset) = read_from(path, 0)?;
    lines.extend(current);
    Ok((lines, offset))
}
