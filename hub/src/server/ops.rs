//! The operations RPCs of `AgenService`: `WatchNests` and `WatchDeployments` (the list now,
//! then again whenever it changes) and `SnapshotStore` (a consistent copy of the Hub's state,
//! cluster admin only), plus the list bodies they share with `ListNests`/`ListDeployments`.

use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agen_proto::v1 as pb;
use futures::Stream;
use tonic::{Request, Response, Status};

use super::agen_api::AgenApi;
use super::auth::{authorize, list_scope, Action};
use super::convert;
use super::tokens::AccessApi;
use crate::core::Core;
use crate::error::HubError;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// How often a watch looks for a change.
const WATCH_TICK: Duration = Duration::from_millis(250);
/// Bytes per `SnapshotChunk`.
const CHUNK: usize = 64 * 1024;

/// The body of `ListNests`: every Nest, without those hidden unless `include_ended`.
pub fn nests(core: &Core, access: &AccessApi, include_ended: bool) -> pb::ListNestsResponse {
    let now = crate::model::now_ms();
    let reserved = core.nest_reservations();
    pb::ListNestsResponse {
        nests: core
            .list_nests()
            .iter()
            .filter(|(n, _)| include_ended || !core.nest_hidden(n, now))
            .map(|(n, count)| pb::Nest {
                revoked: access.nests.is_revoked(&n.nest_id),
                reserved_cpu_millis: reserved
                    .get(&n.nest_id)
                    .map_or(0, |r| u32::try_from(r.0).unwrap_or(u32::MAX)),
                reserved_memory_bytes: reserved.get(&n.nest_id).map_or(0, |r| r.1),
                ..convert::nest(n, *count)
            })
            .collect(),
    }
}

/// The body of `ListDeployments` for an authorized scope (`public_url`: the Hub's, for the
/// agent card URLs).
pub fn deployments(
    core: &Core,
    public_url: &str,
    namespace: &str,
    all: bool,
) -> pb::ListDeploymentsResponse {
    pb::ListDeploymentsResponse {
        deployments: core
            .list_deployments(namespace, all)
            .iter()
            .map(|d| with_card(public_url, convert::deployment(d)))
            .collect(),
    }
}

/// A deployment with its A2A agent card URL.
pub fn with_card(public_url: &str, mut d: pb::Deployment) -> pb::Deployment {
    d.a2a_card_url = format!(
        "{}{}",
        public_url.trim_end_matches('/'),
        crate::a2a::card_path(&d.namespace, &d.name)
    );
    d
}

/// Sends `list()` now and again whenever it differs from what was sent last, until the Hub
/// stops or the client goes away; ended with the caller's token when it is revoked.
fn watch<T>(
    api: &AgenApi,
    principal: crate::tokens::Principal,
    kind: crate::core::streams::StreamKind,
    list: impl Fn() -> T + Send + 'static,
) -> Result<Stream_<T>, Status>
where
    T: PartialEq + Clone + Send + 'static,
{
    let permit = api.core.streams.open(kind, &principal)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<T, Status>>(4);
    let stopping = api.core.stopping.clone();
    tokio::spawn(async move {
        let mut last: Option<T> = None;
        loop {
            let now = list();
            if last.as_ref() != Some(&now) {
                if tx.send(Ok(now.clone())).await.is_err() {
                    return;
                }
                last = Some(now);
            }
            tokio::select! {
                _ = stopping.cancelled() => return,
                _ = tx.closed() => return,
                _ = tokio::time::sleep(WATCH_TICK) => {}
            }
        }
    });
    let stream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(super::auth::until_revoked(
        api.access.tokens.clone(),
        principal,
        stream,
        Some(permit),
    ))
}

pub fn watch_nests(
    api: &AgenApi,
    request: Request<pb::ListNestsRequest>,
) -> Result<Response<Stream_<pb::ListNestsResponse>>, Status> {
    let principal = authorize(&request, "", Action::ClusterRead, "")?;
    let include_ended = request.get_ref().include_ended;
    let (core, access) = (api.core.clone(), api.access.clone());
    Ok(Response::new(watch(
        api,
        principal,
        crate::core::streams::StreamKind::WatchNests,
        move || nests(&core, &access, include_ended),
    )?))
}

pub fn watch_deployments(
    api: &AgenApi,
    request: Request<pb::ListDeploymentsRequest>,
) -> Result<Response<Stream_<pb::ListDeploymentsResponse>>, Status> {
    let r = request.get_ref();
    let (namespace, all) = list_scope(&request, &r.namespace, r.all_namespaces)?;
    let principal = super::auth::principal(&request)?;
    let (core, url) = (api.core.clone(), api.public_url.clone());
    Ok(Response::new(watch(
        api,
        principal,
        crate::core::streams::StreamKind::WatchDeployments,
        move || deployments(&core, &url, &namespace, all),
    )?))
}

/// Checks the running Hub's store (admin only): the report for people and as JSON.
pub async fn verify_store(
    core: &Arc<Core>,
    request: Request<pb::VerifyStoreRequest>,
) -> Result<Response<pb::VerifyStoreResponse>, Status> {
    authorize(&request, "", Action::ClusterWrite, "verify the store")?;
    let report = core.verify_store().await?;
    let report_json = serde_json::to_string(&report)
        .map_err(|e| HubError::Internal(format!("cannot encode the verify report: {e}")))?;
    if !report.intact() {
        tracing::error!("{}", report.refusal());
    }
    Ok(Response::new(pb::VerifyStoreResponse {
        intact: report.intact(),
        report: report.render(),
        report_json,
    }))
}

/// Writes the snapshot into a private temporary file in the data dir while the state lock is
/// held (no state change lands half in it), then streams the file.
pub async fn snapshot_store(
    core: &Arc<Core>,
    request: Request<pb::SnapshotStoreRequest>,
) -> Result<Response<Stream_<pb::SnapshotChunk>>, Status> {
    authorize(&request, "", Action::ClusterWrite, "snapshot")?;
    let core = core.clone();
    let file = tokio::task::spawn_blocking(move || -> Result<std::fs::File, HubError> {
        let dir = core.opts.data_dir.clone();
        let mut tmp = tempfile::Builder::new()
            .prefix(".snapshot-")
            .tempfile_in(&dir)
            .map_err(HubError::io(&dir, "cannot create a snapshot file"))?;
        let counts = core.write_snapshot(tmp.as_file_mut())?;
        tracing::info!(
            files = counts.files,
            records = counts.records,
            "store snapshot written"
        );
        // Unlinked now; the open handle still reads it.
        let (f, path) = tmp.into_parts();
        drop(path);
        Ok(f)
    })
    .await
    .map_err(|e| HubError::Internal(format!("the snapshot task failed: {e}")))??;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::SnapshotChunk, Status>>(4);
    tokio::task::spawn_blocking(move || {
        use std::io::Seek;
        let mut f = file;
        if let Err(e) = f.rewind() {
            let _ = tx.blocking_send(Err(Status::internal(format!(
                "cannot read the snapshot: {e}"
            ))));
            return;
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            match f.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    let chunk = pb::SnapshotChunk {
                        data: buf[..n].to_vec(),
                    };
                    if tx.blocking_send(Ok(chunk)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(Status::internal(format!(
                        "cannot read the snapshot: {e}"
                    ))));
                    return;
                }
            }
        }
    });
    Ok(Response::new(Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )))
}
