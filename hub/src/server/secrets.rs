//! `SetSecret`, `ListSecrets` and `DeleteSecret` on AgenService: the secret store (Deploy in
//! the namespace); values are never returned.

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{authorize, Action};
use super::convert;
use crate::core::Core;
use crate::error::HubError;
use crate::limits;

fn check_namespace(ns: &str) -> Result<(), HubError> {
    if ns.is_empty() {
        return Ok(());
    }
    limits::validate_name("namespace", ns)
}

pub async fn set(
    core: &Core,
    request: Request<pb::SetSecretRequest>,
) -> Result<Response<pb::SetSecretResponse>, Status> {
    authorize(
        &request,
        &request.get_ref().namespace,
        Action::Deploy,
        &request.get_ref().name,
    )?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    if r.value.len() > limits::MAX_SECRET_VALUE_BYTES {
        return Err(
            limits::over_limit("value", r.value.len(), limits::MAX_SECRET_VALUE_BYTES).into(),
        );
    }
    let (meta, replaced) = core.set_secret(&r.namespace, &r.name, &r.value).await?;
    Ok(Response::new(pb::SetSecretResponse {
        secret: Some(convert::secret(&meta)),
        replaced,
    }))
}

pub async fn list(
    core: &Core,
    request: Request<pb::ListSecretsRequest>,
) -> Result<Response<pb::ListSecretsResponse>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Deploy, "")?;
    let r = request.into_inner();
    let secrets = core.list_secrets(&r.namespace)?;
    Ok(Response::new(pb::ListSecretsResponse {
        secrets: secrets.iter().map(convert::secret).collect(),
    }))
}

pub async fn delete(
    core: &Core,
    request: Request<pb::DeleteSecretRequest>,
) -> Result<Response<pb::DeleteSecretResponse>, Status> {
    authorize(
        &request,
        &request.get_ref().namespace,
        Action::Deploy,
        &request.get_ref().name,
    )?;
    let r = request.into_inner();
    core.delete_secret(&r.namespace, &r.name).await?;
    Ok(Response::new(pb::DeleteSecretResponse {}))
}
