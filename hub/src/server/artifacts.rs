//! `ListArtifacts` and `GetArtifact` on AgenService: a task's saved artifacts (Read in the
//! namespace); an artifact's bytes go out in chunks.

use std::pin::Pin;

use agen_proto::v1 as pb;
use futures::Stream;
use tonic::{Request, Response, Status};

use super::auth::{authorize, Action};
use super::convert;
use crate::core::Core;
use crate::error::HubError;
use crate::limits::{self, check_id};

fn check_namespace(ns: &str) -> Result<(), HubError> {
    if ns.is_empty() {
        return Ok(());
    }
    limits::validate_name("namespace", ns)
}

pub async fn list(
    core: &Core,
    request: Request<pb::ListArtifactsRequest>,
) -> Result<Response<pb::ListArtifactsResponse>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    check_id("task_id", &r.task_id)?;
    let list = core.list_artifacts(&r.namespace, &r.task_id)?;
    Ok(Response::new(pb::ListArtifactsResponse {
        artifacts: list.iter().map(convert::artifact).collect(),
    }))
}

type Chunks = Pin<Box<dyn Stream<Item = Result<pb::ArtifactChunk, Status>> + Send + 'static>>;

pub async fn get(
    core: &Core,
    request: Request<pb::GetArtifactRequest>,
) -> Result<Response<Chunks>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let r = request.into_inner();
    if r.artifact_id.is_empty() {
        return Err(
            HubError::invalid("artifact_id: expected an artifact id such as sha256:<hex>").into(),
        );
    }
    check_namespace(&r.namespace)?;
    check_id("artifact_id", &r.artifact_id)?;
    let (rec, bytes) = core.artifact(&r.namespace, &r.artifact_id)?;
    let chunks = convert::artifact_chunks(&rec, &bytes);
    Ok(Response::new(Box::pin(futures::stream::iter(
        chunks.into_iter().map(Ok),
    ))))
}
