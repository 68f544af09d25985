//! The deployment-lifecycle RPCs of `AgenService` (scale, history, rollback) and who a caller
//! is, for the history: the token's identity plus the `agen-client` user@host the CLI sends.

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{authorize, Action};
use super::convert;
use crate::core::lifecycle::RevisionRec;
use crate::core::Core;
use crate::tokens::Principal;

/// Longest client-supplied user@host kept in the history.
const MAX_CLIENT_ID: usize = 128;

/// Who makes a change, for the history: the token's name (`admin` for the cluster admin token)
/// plus the `agen-client: user@host` the CLI sends, when it sent one.
pub fn caller<T>(req: &Request<T>, principal: &Principal) -> String {
    let client: Option<String> = req
        .metadata()
        .get("agen-client")
        .and_then(|v| v.to_str().ok())
        .map(|s| {
            s.chars()
                .filter(|c| !c.is_control())
                .take(MAX_CLIENT_ID)
                .collect()
        })
        .filter(|s: &String| !s.trim().is_empty());
    let name = principal.token_name();
    match client {
        Some(c) => format!("{name} ({c})"),
        None => name.to_string(),
    }
}

fn revision(r: &RevisionRec, current: u64) -> pb::DeploymentRevision {
    pb::DeploymentRevision {
        generation: r.generation,
        bundle_digest: r.bundle_digest.clone(),
        replicas: r.replicas,
        selector: r.selector.clone().into_iter().collect(),
        concurrency: r.concurrency,
        created_at_ms: r.created_at_ms,
        deployed_by: r.deployed_by.clone(),
        change: r.change.clone(),
        agent_name: r.agent_name.clone(),
        current: r.generation == current && r.change != crate::core::lifecycle::REMOVED,
    }
}

fn view(core: &Core, namespace: &str, name: &str) -> Result<pb::Deployment, Status> {
    let (view, _) = core.get_deployment(namespace, name)?;
    Ok(convert::deployment(&view))
}

pub async fn scale(
    core: &Core,
    request: Request<pb::ScaleDeploymentRequest>,
) -> Result<Response<pb::Deployment>, Status> {
    let r = request.get_ref();
    let principal = authorize(&request, &r.namespace, Action::Deploy, &r.name)?;
    let who = caller(&request, &principal);
    let r = request.into_inner();
    let rec = core
        .scale_deployment(&r.namespace, &r.name, r.replicas, &who)
        .await?;
    Ok(Response::new(view(core, &rec.namespace, &rec.name)?))
}

pub fn history(
    core: &Core,
    request: Request<pb::ListDeploymentHistoryRequest>,
) -> Result<Response<pb::ListDeploymentHistoryResponse>, Status> {
    let r = request.get_ref();
    authorize(&request, &r.namespace, Action::Read, &r.name)?;
    let r = request.into_inner();
    let list = core.deployment_history(&r.namespace, &r.name)?;
    let current = list.iter().map(|r| r.generation).max().unwrap_or(0);
    Ok(Response::new(pb::ListDeploymentHistoryResponse {
        revisions: list.iter().map(|r| revision(r, current)).collect(),
    }))
}

pub async fn rollback(
    core: &Core,
    request: Request<pb::RollbackDeploymentRequest>,
) -> Result<Response<pb::Deployment>, Status> {
    let r = request.get_ref();
    let principal = authorize(&request, &r.namespace, Action::Deploy, &r.name)?;
    let who = caller(&request, &principal);
    let r = request.into_inner();
    // The caller deploys the old bundle now: it must pass today's checks for the caller (a
    // generation someone else made may delegate into a namespace this caller cannot submit to).
    let target = core.rollback_target(&r.namespace, &r.name, r.to_generation)?;
    super::tokens::check_delegates(
        core,
        &principal,
        &r.namespace,
        &target.bundle_digest,
        "RollbackDeployment",
    )
    .await?;
    let rec = core
        .rollback_deployment(&r.namespace, &r.name, r.to_generation, &who)
        .await?;
    Ok(Response::new(view(core, &rec.namespace, &rec.name)?))
}

/// The Nest as `ListNests` shows it (with its instance count).
fn nest_view(core: &Core, nest_id: &str) -> Result<pb::Nest, Status> {
    core.list_nests()
        .iter()
        .find(|(n, _)| n.nest_id == nest_id)
        .map(|(n, count)| convert::nest(n, *count))
        .ok_or_else(|| Status::not_found(format!("nest {nest_id} not found")))
}

pub async fn cordon(
    core: &Core,
    request: Request<pb::NestRequest>,
) -> Result<Response<pb::Nest>, Status> {
    authorize(&request, "", Action::ClusterWrite, &request.get_ref().nest)?;
    let n = core.cordon_nest(&request.into_inner().nest).await?;
    Ok(Response::new(nest_view(core, &n.nest_id)?))
}

pub async fn uncordon(
    core: &Core,
    request: Request<pb::NestRequest>,
) -> Result<Response<pb::Nest>, Status> {
    authorize(&request, "", Action::ClusterWrite, &request.get_ref().nest)?;
    let n = core.uncordon_nest(&request.into_inner().nest).await?;
    Ok(Response::new(nest_view(core, &n.nest_id)?))
}

pub async fn drain(
    core: &Core,
    request: Request<pb::NestRequest>,
) -> Result<Response<pb::Nest>, Status> {
    authorize(&request, "", Action::ClusterWrite, &request.get_ref().nest)?;
    let r = request.into_inner();
    let (n, _) = core.drain_nest(&r.nest, r.deadline_ms).await?;
    Ok(Response::new(nest_view(core, &n.nest_id)?))
}
