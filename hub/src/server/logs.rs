//! `AgenService.ReadLogs` and `NestService.SendLogs`: a reader names an instance or a
//! deployment; the Hub sends a `LogRequest` to the Nest of each of its instances and merges
//! their `SendLogs` answers into the reader's stream.
//!
//! Invariants: `ReadLogs` is authorized (`Read` on the namespace) before anything else and
//! reaches only instances of that namespace; an answer is accepted only for a pending request
//! and only from the Nest it was sent to ([`crate::logs::LogRequests::deliver`]).

use std::sync::Arc;

use agen_proto::v1 as pb;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Status, Streaming};

use super::auth::{authorize, until_revoked, Action};
use super::{convert, malformed};
use crate::core::Core;
use crate::error::HubError;
use crate::logs::{DeliverError, LogItem, LogRequests};
use crate::nodes::ToNest;
use crate::tokens::Tokens;

type LogStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::LogLine, Status>> + Send>>;

/// `ReadLogs`: the kept lines of every target instance, then (with `follow`) new ones.
pub fn read(
    core: &Arc<Core>,
    requests: &Arc<LogRequests>,
    tokens: Arc<Tokens>,
    request: Request<pb::ReadLogsRequest>,
) -> Result<LogStream, Status> {
    let r = request.get_ref();
    let who = authorize(&request, &r.namespace, Action::Read, &r.target)?;
    let r = request.into_inner();
    if !r.namespace.is_empty() {
        crate::limits::validate_name("namespace", &r.namespace)?;
    }
    crate::limits::check_id("target", &r.target)?;
    crate::limits::check_bytes("server", &r.server, 255)?;
    if r.target.is_empty() {
        return Err(HubError::invalid(
            "target: expected an instance id or a deployment name (see `agen ps`)",
        )
        .into());
    }
    let ns = crate::core::namespace_or_default(&r.namespace);
    let all = core.list_instances(&ns, "", false);
    let mut targets: Vec<_> = all
        .iter()
        .filter(|i| i.instance_id == r.target)
        .cloned()
        .collect();
    if targets.is_empty() {
        targets = all
            .iter()
            .filter(|i| i.deployment == r.target)
            .cloned()
            .collect();
    }
    if targets.is_empty() {
        return Err(HubError::not_found(format!(
            "no instance or deployment named {} in namespace {ns}; see `agen ps --namespace {ns}`",
            r.target
        ))
        .into());
    }
    if !r.nest.is_empty() {
        targets.retain(|i| i.nest_name == r.nest || i.nest_id == r.nest);
        if targets.is_empty() {
            return Err(HubError::not_found(format!(
                "{} has no instance on nest {}; see `agen ps --namespace {ns}`",
                r.target, r.nest
            ))
            .into());
        }
    }
    let single = targets.len() == 1;
    let (tx, mut rx) = mpsc::channel::<LogItem>(64);
    let mut sent = 0;
    let mut not_placed = Vec::new();
    for inst in &targets {
        if inst.nest_id.is_empty() {
            not_placed.push(inst.instance_id.clone());
            continue;
        }
        let id = requests.open(
            &inst.nest_id,
            &inst.nest_name,
            &inst.instance_id,
            tx.clone(),
        );
        let msg = ToNest::LogRequest {
            request_id: id.clone(),
            instance_id: inst.instance_id.clone(),
            server: r.server.clone(),
            since_ms: r.since_ms,
            tail: r.tail,
            follow: r.follow,
        };
        if core.send_to_nest(&inst.nest_id, msg) {
            sent += 1;
        } else {
            requests.cancel(&id);
            not_placed.push(inst.instance_id.clone());
        }
    }
    drop(tx);
    if sent == 0 {
        return Err(Status::unavailable(format!(
            "no nest holding {} is connected now (instances {}); try again when `agen ps` shows them running",
            r.target,
            not_placed.join(", ")
        )));
    }
    let (out_tx, out_rx) = mpsc::channel::<Result<pb::LogLine, Status>>(64);
    tokio::spawn(async move {
        while let Some(item) = rx.recv().await {
            let out = match item {
                LogItem::Line(line) => Ok(convert::log_line(line)),
                LogItem::Failed {
                    instance_id,
                    message,
                } if single => {
                    let _ = out_tx
                        .send(Err(Status::unavailable(format!(
                            "logs of instance {instance_id}: {message}"
                        ))))
                        .await;
                    return;
                }
                LogItem::Failed {
                    instance_id,
                    message,
                } => Ok(pb::LogLine {
                    instance_id,
                    level: "ERROR".into(),
                    text: format!("agen: cannot read these logs: {message}"),
                    ..Default::default()
                }),
            };
            if out_tx.send(out).await.is_err() {
                return;
            }
        }
    });
    let stream: LogStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(out_rx));
    Ok(until_revoked(tokens, who, stream))
}

/// `SendLogs`: one Nest's answer to one request, forwarded until it ends or the reader goes.
pub async fn answer(
    requests: &LogRequests,
    nest_id: Option<&str>,
    stream: &mut Streaming<pb::LogChunk>,
) -> Result<(), Status> {
    let first = malformed::next(stream)
        .await?
        .ok_or_else(|| HubError::invalid("send_logs: expected a first chunk naming request_id"))?;
    let answer = requests
        .deliver(&first.request_id, nest_id)
        .map_err(|e| match e {
            DeliverError::Unknown => Status::not_found(
                "send_logs: no log request with this id is waiting (it ended or timed out)",
            ),
            DeliverError::WrongNest => {
                Status::permission_denied("send_logs: this log request was sent to another nest")
            }
        })?;
    let mut chunk = first;
    loop {
        if !chunk.error.is_empty() {
            answer.failed(chunk.error).await;
            return Ok(());
        }
        for line in chunk.lines {
            if !answer.line(convert::log_line_rec(line)).await {
                return Ok(());
            }
        }
        let next = tokio::select! {
            n = malformed::next(stream) => n?,
            _ = answer.reader_gone() => return Ok(()),
        };
        match next {
            Some(c) => chunk = c,
            None => return Ok(()),
        }
    }
}
