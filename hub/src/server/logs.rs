//! `AgenService.ReadLogs` and `NestService.SendLogs`: a reader names an instance or a
//! deployment; the Hub sends a `LogRequest` to the Nest of each of its instances and merges
//! their `SendLogs` answers into the reader's stream.
//!
//! An instance id the Hub no longer lists (removed, replaced) is searched for on every
//! connected Nest, which serves it only when it kept it for the reader's namespace.
//!
//! Invariants: `ReadLogs` is authorized (`Read` on the namespace) before anything else and
//! reaches only instances of that namespace (a search carries the namespace; the Nest checks
//! the owner it recorded); an answer is accepted only for a pending request
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

/// How many instances' logs a Nest keeps (`agen_nest::logs::MAX_INSTANCE_DIRS`), for messages.
const MAX_KEPT_INSTANCES: usize = 64;

type LogStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::LogLine, Status>> + Send>>;

/// `ReadLogs`: the kept lines of every target instance, then (with `follow`) new ones. An id
/// the Hub no longer lists (a removed or replaced instance) is searched for on every connected
/// Nest ([`search`]).
pub async fn read(
    core: &Arc<Core>,
    requests: &Arc<LogRequests>,
    tokens: Arc<Tokens>,
    request: Request<pb::ReadLogsRequest>,
) -> Result<LogStream, Status> {
    let r = request.get_ref();
    let who = authorize(&request, &r.namespace, Action::Read, &r.target)?;
    let r = request.into_inner();
    let permit = if r.follow {
        Some(
            core.streams
                .open(crate::core::streams::StreamKind::LogsFollow, &who)?,
        )
    } else {
        None
    };
    if !r.namespace.is_empty() {
        crate::limits::validate_name("namespace", &r.namespace)?;
    }
    crate::limits::check_id("target", &r.target)?;
    crate::limits::check_bytes("server", &r.server, 255)?;
    crate::limits::check_bytes("nest", &r.nest, 255)?;
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
    let (tx, mut rx) = mpsc::channel::<LogItem>(64);
    // Searching: the Nest that has the instance's logs (the others' "not kept" are dropped).
    let mut found_on = None;
    let mut first = Vec::new();
    if targets.is_empty() {
        let (items, nest) = search(core, requests, &r, &ns, tx, &mut rx).await?;
        first = items;
        found_on = Some(nest);
    } else {
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
        let mut sent = 0;
        let mut not_placed = Vec::new();
        for inst in &targets {
            if inst.nest_id.is_empty() {
                not_placed.push(inst.instance_id.clone());
                continue;
            }
            let msg = |request_id: String| ToNest::LogRequest {
                request_id,
                instance_id: inst.instance_id.clone(),
                server: r.server.clone(),
                since_ms: r.since_ms,
                tail: r.tail,
                follow: r.follow,
                namespace: ns.clone(),
                search: false,
            };
            let on = (
                inst.nest_id.as_str(),
                inst.nest_name.as_str(),
                inst.instance_id.as_str(),
            );
            if ask(core, requests, on, &tx, msg) {
                sent += 1;
            } else {
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
    }
    let single = targets.len() <= 1;
    let (out_tx, out_rx) = mpsc::channel::<Result<pb::LogLine, Status>>(64);
    tokio::spawn(async move {
        let mut items = first.into_iter();
        loop {
            let item = match items.next() {
                Some(i) => i,
                None => match rx.recv().await {
                    Some(i) => i,
                    None => return,
                },
            };
            let out = match item {
                LogItem::Line(line) => Ok(convert::log_line(line)),
                LogItem::Found { .. } => continue,
                // Another searched Nest: only the one that has the logs matters.
                LogItem::Failed { nest, .. } if found_on.as_ref().is_some_and(|f| *f != nest) => {
                    continue
                }
                LogItem::Failed {
                    instance_id,
                    message,
                    ..
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
                    ..
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
    Ok(until_revoked(tokens, who, stream, permit))
}

/// Opens a request for `instance_id` on `nest_id` and queues `msg` (given the request id) on
/// the Nest's stream; `false` (the request forgotten) when the Nest is not connected.
fn ask(
    core: &Core,
    requests: &Arc<LogRequests>,
    (nest_id, nest_name, instance_id): (&str, &str, &str),
    tx: &mpsc::Sender<LogItem>,
    msg: impl FnOnce(String) -> ToNest,
) -> bool {
    let id = requests.open(nest_id, nest_name, instance_id, tx.clone());
    if core.send_to_nest(nest_id, msg(id.clone())) {
        true
    } else {
        requests.cancel(&id);
        false
    }
}

/// Asks every connected Nest (or the one `r.nest` names) for the kept logs of the instance
/// `r.target`, which the Hub no longer lists, and waits until one has them: the items it sent
/// so far and its name. When none has them, NOT_FOUND naming the Nests searched and the ones
/// that could not be (not connected).
async fn search(
    core: &Arc<Core>,
    requests: &Arc<LogRequests>,
    r: &pb::ReadLogsRequest,
    ns: &str,
    tx: mpsc::Sender<LogItem>,
    rx: &mut mpsc::Receiver<LogItem>,
) -> Result<(Vec<LogItem>, String), Status> {
    let mut asked = Vec::new();
    let mut not_connected = Vec::new();
    for (n, _) in core.list_nests() {
        if !r.nest.is_empty() && n.name != r.nest && n.nest_id != r.nest {
            continue;
        }
        let msg = |request_id: String| ToNest::LogRequest {
            request_id,
            instance_id: r.target.clone(),
            server: r.server.clone(),
            since_ms: r.since_ms,
            tail: r.tail,
            follow: r.follow,
            namespace: ns.to_string(),
            search: true,
        };
        if ask(core, requests, (&n.nest_id, &n.name, &r.target), &tx, msg) {
            asked.push(n.name);
        } else {
            not_connected.push(n.name);
        }
    }
    drop(tx);
    let mut left = asked.len();
    let mut problems = Vec::new();
    let mut early = Vec::new();
    while left > 0 {
        match rx.recv().await {
            Some(LogItem::Found { nest, .. }) => return Ok((early, nest)),
            Some(LogItem::Failed {
                nest,
                message,
                not_kept,
                ..
            }) => {
                left -= 1;
                if !not_kept {
                    problems.push(format!("nest {nest}: {message}"));
                }
            }
            Some(line) => early.push(line),
            None => break,
        }
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let on = if r.nest.is_empty() {
        String::new()
    } else {
        format!(" on nest {}", r.nest)
    };
    let mut msg = format!(
        "no instance or deployment named {} in namespace {ns}{on}: the Hub does not list it, and no Nest keeps logs of an instance {} there (searched: {}",
        r.target,
        r.target,
        list(&asked)
    );
    if !not_connected.is_empty() {
        msg.push_str(&format!(
            "; not connected, not searched: {}",
            list(&not_connected)
        ));
    }
    msg.push_str(&format!(
        "). A Nest keeps the logs of its last {} instances; see `agen ps --namespace {ns}` for the current ones",
        MAX_KEPT_INSTANCES
    ));
    if !problems.is_empty() {
        return Err(Status::unavailable(format!(
            "{msg}; {}",
            problems.join("; ")
        )));
    }
    Err(HubError::not_found(msg).into())
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
    let mut found = false;
    loop {
        if !chunk.error.is_empty() {
            answer.failed(chunk.error, chunk.not_kept).await;
            return Ok(());
        }
        if !found {
            found = true;
            if !answer.found().await {
                return Ok(());
            }
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
