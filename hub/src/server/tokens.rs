//! The token, audit and Nest-identity RPCs of `AgenService` (`CreateToken`, `ListTokens`,
//! `RevokeToken`, `RotateToken`, `ListAudit`, `RevokeNest`, `ForgetNest`) and their protobuf
//! conversions. `agen.rs` delegates to these, one line each.

use std::sync::Arc;

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{self, Action};
use crate::core::Core;
use crate::error::HubError;
use crate::tokens::audit::{AuditFilter, AuditRec};
use crate::tokens::nests::{NestIdentities, NestIdentityRec};
use crate::tokens::{Need, NewToken, Principal, Role, TokenKind, TokenRec, Tokens};

/// Everything the access RPCs need.
pub struct AccessApi {
    pub core: Arc<Core>,
    pub tokens: Arc<Tokens>,
    pub nests: Arc<NestIdentities>,
    /// sha256 hex of the Hub's CA certificate (join tokens carry it).
    /// The CA a join token pins (the current one, after a rotation too).
    pub tls: Arc<crate::tls_live::LiveTls>,
}

fn token_info(t: &TokenRec) -> pb::TokenInfo {
    pb::TokenInfo {
        id: t.id.clone(),
        name: t.name.clone(),
        kind: t.kind.as_str().into(),
        namespace: t.namespace.clone(),
        role: t.role.map(|r| r.as_str().to_string()).unwrap_or_default(),
        created_at_ms: t.created_at_ms,
        expires_at_ms: t.expires_at_ms,
        last_used_at_ms: t.last_used_at_ms,
        revoked_at_ms: t.revoked_at_ms,
        max_uses: t.max_uses,
        uses: t.uses,
        created_by: t.created_by.clone(),
    }
}

fn audit_entry(a: &AuditRec) -> pb::AuditEntry {
    pb::AuditEntry {
        at_ms: a.at_ms,
        token_id: a.token_id.clone(),
        token_name: a.token_name.clone(),
        namespace: a.namespace.clone(),
        call: a.call.clone(),
        target: a.target.clone(),
        outcome: a.outcome.clone(),
        message: a.message.clone(),
        decision: a.detail.decision.clone(),
        task_id: a.detail.task_id.clone(),
        call_id: a.detail.call_id.clone(),
        tool: a.detail.tool.clone(),
        reason: a.detail.reason.clone(),
        peer: a.detail.peer.clone(),
        suppressed: a.detail.suppressed,
    }
}

fn nest_identity(n: &NestIdentityRec) -> pb::NestIdentity {
    pb::NestIdentity {
        nest_id: n.nest_id.clone(),
        name: n.name.clone(),
        key_sha256: n.key_sha256.clone(),
        joined_at_ms: n.joined_at_ms,
        revoked_at_ms: n.revoked_at_ms,
    }
}

fn kind_of(s: &str) -> Result<TokenKind, Status> {
    match s {
        "" | "api" => Ok(TokenKind::Api),
        "join" => Ok(TokenKind::Join),
        other => Err(HubError::invalid(format!(
            "kind: `{other}` is not a token kind; expected api or join"
        ))
        .into()),
    }
}

impl AccessApi {
    /// A bundle may delegate into another namespace only if its deployer may submit there.
    pub async fn check_delegates(
        &self,
        principal: &Principal,
        namespace: &str,
        digest: &str,
    ) -> Result<(), Status> {
        check_delegates(&self.core, principal, namespace, digest, "CreateDeployment").await
    }
}

/// A bundle may delegate into another namespace only if the one who deploys it (`rpc`:
/// CreateDeployment, RollbackDeployment) may submit there.
pub async fn check_delegates(
    core: &Core,
    principal: &Principal,
    namespace: &str,
    digest: &str,
    rpc: &str,
) -> Result<(), Status> {
    if *principal == Principal::ClusterAdmin {
        return Ok(());
    }
    let Some(bytes) = core.bundle_bytes(digest)? else {
        // CreateDeployment says that the bundle is missing.
        return Ok(());
    };
    let delegates = tokio::task::spawn_blocking(move || {
        crate::core::delegates::bundle_delegation(&bytes).map(|d| d.delegates)
    })
    .await
    .map_err(|e| HubError::Internal(format!("bundle check panicked: {e}")))??;
    let namespace = crate::core::namespace_or_default(namespace);
    for d in delegates {
        let Some(ns) = d.namespace.filter(|ns| *ns != namespace) else {
            continue;
        };
        principal.allows(
            Need::Role(Role::Submitter),
            &ns,
            &format!(
                "{rpc}: x-agen/config.json delegates to deployment `{}`",
                d.deployment
            ),
        )?;
    }
    Ok(())
}

impl AccessApi {
    /// The action a change of token `rec` needs.
    fn authorize_change<T>(&self, req: &Request<T>, rec: &TokenRec) -> Result<Principal, Status> {
        match rec.kind {
            TokenKind::Join => auth::authorize(req, "", Action::ClusterWrite, &rec.id),
            TokenKind::Api => auth::authorize(req, &rec.namespace, Action::Administer, &rec.id),
        }
    }

    pub async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let r = request.get_ref();
        let kind = kind_of(&r.kind)?;
        let target = r.name.clone();
        let principal = match kind {
            TokenKind::Join => auth::authorize(&request, "", Action::ClusterWrite, &target)?,
            TokenKind::Api => auth::authorize(&request, &r.namespace, Action::Administer, &target)?,
        };
        let r = request.into_inner();
        let new = NewToken {
            kind: Some(kind),
            namespace: crate::core::namespace_or_default(&r.namespace),
            role: if r.role.is_empty() && kind == TokenKind::Join {
                None
            } else {
                Some(Role::parse(&r.role)?)
            },
            name: r.name,
            expires_in_ms: r.expires_in_ms,
            max_uses: r.max_uses,
        };
        let (rec, secret) = match kind {
            TokenKind::Join => {
                self.tokens
                    .create_join(&principal, &self.tls.hub().ca_sha256, new)?
            }
            TokenKind::Api => self.tokens.create(&principal, new)?,
        };
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::info!(token_id = %rec.id, name = %agen_shared::text::LogField(&rec.name), kind = rec.kind.as_str(), namespace = %rec.namespace, by = %agen_shared::text::LogField(principal.token_name()), "token created");
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(token_info(&rec)),
            secret,
        }))
    }

    pub async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let r = request.get_ref();
        let principal = auth::principal(&request)?;
        let only: Option<String> = match &principal {
            Principal::ClusterAdmin => {
                auth::authorize(&request, "", Action::ClusterRead, "")?;
                (!r.all_namespaces).then(|| crate::core::namespace_or_default(&r.namespace))
            }
            Principal::Api { namespace, .. } => {
                let ns = if r.all_namespaces {
                    namespace.clone()
                } else {
                    r.namespace.clone()
                };
                auth::authorize(&request, &ns, Action::Administer, "")?;
                Some(crate::core::namespace_or_default(&ns))
            }
        };
        let tokens = self
            .tokens
            .list()
            .into_iter()
            .filter(|t| match &only {
                None => true,
                Some(ns) => t.kind == TokenKind::Api && &t.namespace == ns,
            })
            .map(|t| token_info(&t))
            .collect();
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    pub async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        let rec = self.tokens.get(&request.get_ref().id)?;
        let principal = self.authorize_change(&request, &rec)?;
        let rec = self.tokens.revoke(&rec.id)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::info!(token_id = %rec.id, name = %agen_shared::text::LogField(&rec.name), by = %agen_shared::text::LogField(principal.token_name()), "token revoked");
        Ok(Response::new(token_info(&rec)))
    }

    pub async fn rename_token(
        &self,
        request: Request<pb::RenameTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        let rec = self.tokens.get(&request.get_ref().id)?;
        let principal = self.authorize_change(&request, &rec)?;
        let old = rec.name.clone();
        let rec = self.tokens.rename(&rec.id, &request.get_ref().name)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        auth::audit_message(&request, format!("renamed from {old:?}"));
        tracing::info!(token_id = %rec.id, old = %agen_shared::text::LogField(&old), name = %agen_shared::text::LogField(&rec.name), by = %agen_shared::text::LogField(principal.token_name()), "token renamed");
        Ok(Response::new(token_info(&rec)))
    }

    pub async fn rotate_token(
        &self,
        request: Request<pb::RotateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let rec = self.tokens.get(&request.get_ref().id)?;
        let principal = self.authorize_change(&request, &rec)?;
        let (rec, secret) = self.tokens.rotate(&rec.id)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::info!(token_id = %rec.id, name = %agen_shared::text::LogField(&rec.name), by = %agen_shared::text::LogField(principal.token_name()), "token rotated");
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(token_info(&rec)),
            secret,
        }))
    }

    pub async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        let r = request.get_ref();
        let namespace = match auth::principal(&request)? {
            Principal::ClusterAdmin => {
                auth::authorize(&request, "", Action::ClusterRead, "")?;
                (!r.all_namespaces).then(|| crate::core::namespace_or_default(&r.namespace))
            }
            Principal::Api { namespace, .. } => {
                let ns = if r.all_namespaces {
                    namespace
                } else {
                    r.namespace.clone()
                };
                auth::authorize(&request, &ns, Action::Administer, "")?;
                Some(crate::core::namespace_or_default(&ns))
            }
        };
        let entries = crate::tokens::audit::list(
            &self.core.db,
            &AuditFilter {
                namespace,
                since_ms: r.since_ms,
                limit: r.limit,
            },
        )?;
        Ok(Response::new(pb::ListAuditResponse {
            entries: entries.iter().map(audit_entry).collect(),
        }))
    }

    /// `(nest id, name)` of the Nest named `nest` (its name or its id).
    fn find_nest(&self, nest: &str) -> Result<(String, String), Status> {
        if nest.is_empty() {
            return Err(HubError::invalid("nest: expected a nest name or id").into());
        }
        let nests = self.core.list_nests();
        if let Some((n, _)) = nests.iter().find(|(n, _)| n.nest_id == nest) {
            return Ok((n.nest_id.clone(), n.name.clone()));
        }
        let by_name: Vec<_> = nests.iter().filter(|(n, _)| n.name == nest).collect();
        match by_name.as_slice() {
            [(n, _)] => Ok((n.nest_id.clone(), n.name.clone())),
            [] => match self.nests.get(nest) {
                Some(id) => Ok((id.nest_id, id.name)),
                None => Err(HubError::not_found(format!(
                    "nest `{nest}` not found by name or id; list them with `agen nests`"
                ))
                .into()),
            },
            many => Err(HubError::invalid(format!(
                "nest name `{nest}` is used by {} nests; name it by id ({})",
                many.len(),
                many.iter()
                    .map(|(n, _)| n.nest_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .into()),
        }
    }

    pub async fn revoke_nest(
        &self,
        request: Request<pb::RevokeNestRequest>,
    ) -> Result<Response<pb::NestIdentity>, Status> {
        let principal =
            auth::authorize(&request, "", Action::ClusterWrite, &request.get_ref().nest)?;
        let (id, name) = self.find_nest(&request.get_ref().nest)?;
        let rec = self.nests.revoke(&id, &name)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::warn!(nest_id = %id, nest = %agen_shared::text::LogField(&name), by = %agen_shared::text::LogField(principal.token_name()), "nest revoked: disconnected and refused from now on");
        Ok(Response::new(nest_identity(&rec)))
    }

    pub async fn forget_nest(
        &self,
        request: Request<pb::ForgetNestRequest>,
    ) -> Result<Response<pb::NestIdentity>, Status> {
        let principal =
            auth::authorize(&request, "", Action::ClusterWrite, &request.get_ref().nest)?;
        let (id, name) = self.find_nest(&request.get_ref().nest)?;
        let rec = self.nests.forget(&id, &name)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::warn!(nest_id = %id, nest = %agen_shared::text::LogField(&name), by = %agen_shared::text::LogField(principal.token_name()), "nest forgotten: its certificate is refused and its id may join again");
        Ok(Response::new(nest_identity(&rec)))
    }
}
