//! `agen.v1.AgenService`: the user/automation API. Validates requests, calls the core, converts.

use std::pin::Pin;
use std::sync::Arc;

use agen_proto::v1 as pb;
use agen_proto::v1::agen_service_server::AgenService;
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{authorize, list_scope, Action};
use super::triggers::Change;
use super::{convert, malformed};
use crate::core::tasks::TaskSpec;
use crate::core::DeploymentSpec;
use crate::error::HubError;
use crate::limits::{self, check_id};

use super::agen_api::check_namespace;
pub use super::agen_api::AgenApi;

impl AgenApi {
    /// A deployment with its A2A agent card URL.
    fn with_card(&self, d: pb::Deployment) -> pb::Deployment {
        super::ops::with_card(&self.public_url, d)
    }
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The namespace and task id every per-task request carries.
fn check_task_ref(ns: &str, task_id: &str) -> Result<(), HubError> {
    check_namespace(ns)?;
    check_id("task_id", task_id)
}

/// Checks an uploaded archive: unpacks it into a temporary folder and loads the bundle.
/// Returns the agent's name and the secrets it declares with `source: platform`.
fn validate_bundle(bytes: &[u8]) -> Result<(String, Vec<String>), HubError> {
    let tmp = tempfile::tempdir().map_err(HubError::io(
        std::env::temp_dir(),
        "cannot create a temporary folder",
    ))?;
    let dir = tmp.path().join("bundle");
    agen_shared::bundle::unpack(bytes, &dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    let bundle = agen_shared::bundle::Bundle::load(&dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    let platform = crate::secrets::platform_secret_names(&bundle);
    Ok((bundle.agent.name, platform))
}

#[tonic::async_trait]
impl AgenService for AgenApi {
    async fn upload_bundle(
        &self,
        request: Request<Streaming<pb::BundleChunk>>,
    ) -> Result<Response<pb::UploadBundleResponse>, Status> {
        authorize(&request, "", Action::Upload, "")?;
        let mut stream = request.into_inner();
        let max = agen_shared::bundle::MAX_BUNDLE_BYTES;
        let first = malformed::next(&mut stream).await?.ok_or_else(|| {
            HubError::invalid("upload: expected at least one chunk carrying digest and total_size")
        })?;
        let digest = first.digest.clone();
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(HubError::invalid(format!(
                "digest: `{}` is not a bundle digest; expected sha256:<64 hex digits> in the first chunk",
                limits::prefix(&digest)
            ))
            .into());
        }
        if first.total_size as usize > max {
            return Err(HubError::invalid(format!(
                "total_size: {} bytes is over the {} MiB bundle limit; remove large files from the bundle",
                first.total_size,
                max / (1024 * 1024)
            ))
            .into());
        }
        if let Some(meta) = self.core.bundle_meta(&digest)? {
            return Ok(Response::new(pb::UploadBundleResponse {
                digest,
                size: meta.size,
                already_present: true,
            }));
        }
        let mut data = first.data;
        while let Some(chunk) = malformed::next(&mut stream).await? {
            if data.len() + chunk.data.len() > first.total_size as usize {
                return Err(HubError::invalid(format!(
                    "upload: more bytes than total_size {} announced in the first chunk",
                    first.total_size
                ))
                .into());
            }
            data.extend_from_slice(&chunk.data);
        }
        if data.len() as u64 != first.total_size {
            return Err(HubError::invalid(format!(
                "upload: received {} bytes but total_size says {}",
                data.len(),
                first.total_size
            ))
            .into());
        }
        let actual = agen_shared::bundle::digest(&data);
        if actual != digest {
            return Err(HubError::invalid(format!(
                "digest: upload has {actual}, not the announced {digest}"
            ))
            .into());
        }
        let bytes = Arc::new(data);
        let checked = bytes.clone();
        let (agent_name, platform_secrets) =
            tokio::task::spawn_blocking(move || validate_bundle(&checked))
                .await
                .map_err(|e| HubError::Internal(format!("bundle validation panicked: {e}")))??;
        self.core.remember_bundle_secrets(&digest, platform_secrets);
        let already_present = self.core.put_bundle(&digest, &bytes, &agent_name)?;
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::info!(%digest, size = bytes.len(), agent = %agent_name, "bundle stored");
        Ok(Response::new(pb::UploadBundleResponse {
            digest,
            size: bytes.len() as u64,
            already_present,
        }))
    }

    async fn create_deployment(
        &self,
        request: Request<pb::CreateDeploymentRequest>,
    ) -> Result<Response<pb::Deployment>, Status> {
        let r = request.get_ref();
        let who = authorize(&request, &r.namespace, Action::Deploy, &r.name)?;
        (self.access)
            .check_delegates(&who, &r.namespace, &r.bundle_digest)
            .await?;
        let by = super::lifecycle::caller(&request, &who);
        let mut r = request.into_inner();
        check_namespace(&r.namespace)?;
        limits::validate_name("name", &r.name)?;
        check_id("bundle_digest", &r.bundle_digest)?;
        let hook = super::triggers::deployment_webhook(&self.core, &mut r)?;
        let selector = r.selector.into_iter().collect();
        self.core.opts.limits.check_labels("selector", &selector)?;
        let spec = DeploymentSpec {
            namespace: r.namespace,
            name: r.name,
            bundle_digest: r.bundle_digest,
            replicas: r.replicas,
            selector,
            concurrency: r.concurrency,
            resources: convert::resource_spec(r.resources.as_ref()),
        };
        let rec = self.core.deploy_as(spec, &by, "deploy").await?;
        (self
            .core
            .set_deployment_webhook(&rec.namespace, &rec.name, hook))
        .await?;
        let (view, _) = self.core.get_deployment(&rec.namespace, &rec.name)?;
        Ok(Response::new(convert::deployment(&view)))
    }

    async fn get_deployment(
        &self,
        request: Request<pb::GetDeploymentRequest>,
    ) -> Result<Response<pb::GetDeploymentResponse>, Status> {
        authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
        let r = request.into_inner();
        check_namespace(&r.namespace)?;
        let (view, instances) = self.core.get_deployment(&r.namespace, &r.name)?;
        Ok(Response::new(pb::GetDeploymentResponse {
            deployment: Some(self.with_card(convert::deployment(&view))),
            instances: instances
                .iter()
                .map(|i| convert::instance(i, self.core.active_runs(&i.instance_id)))
                .collect(),
        }))
    }

    async fn list_deployments(
        &self,
        request: Request<pb::ListDeploymentsRequest>,
    ) -> Result<Response<pb::ListDeploymentsResponse>, Status> {
        let r = request.get_ref();
        let (namespace, all) = list_scope(&request, &r.namespace, r.all_namespaces)?;
        Ok(Response::new(super::ops::deployments(
            &self.core,
            &self.public_url,
            &namespace,
            all,
        )))
    }

    async fn delete_deployment(
        &self,
        request: Request<pb::DeleteDeploymentRequest>,
    ) -> Result<Response<pb::DeleteDeploymentResponse>, Status> {
        let who = authorize(
            &request,
            &request.get_ref().namespace,
            Action::Deploy,
            &request.get_ref().name,
        )?;
        let by = super::lifecycle::caller(&request, &who);
        let r = request.into_inner();
        check_namespace(&r.namespace)?;
        self.core
            .remove_deployment(&r.namespace, &r.name, &by)
            .await?;
        Ok(Response::new(pb::DeleteDeploymentResponse {}))
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        let r = request.get_ref();
        let (namespace, all) = list_scope(&request, &r.namespace, r.all_namespaces)?;
        let list = self.core.list_instances(&namespace, &r.deployment, all);
        let now = crate::model::now_ms();
        Ok(Response::new(pb::ListInstancesResponse {
            instances: list
                .iter()
                .filter(|i| r.include_ended || !self.core.instance_hidden(i, now))
                .map(|i| convert::instance(i, self.core.active_runs(&i.instance_id)))
                .collect(),
        }))
    }

    async fn list_nests(
        &self,
        request: Request<pb::ListNestsRequest>,
    ) -> Result<Response<pb::ListNestsResponse>, Status> {
        authorize(&request, "", Action::ClusterRead, "")?;
        let include_ended = request.get_ref().include_ended;
        Ok(Response::new(super::ops::nests(
            &self.core,
            &self.access,
            include_ended,
        )))
    }

    async fn submit_task(
        &self,
        request: Request<pb::SubmitTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        authorize(
            &request,
            &request.get_ref().namespace,
            Action::Submit,
            &request.get_ref().deployment,
        )?;
        // The caller's trace: the field, else the W3C `traceparent` metadata header.
        let header = request
            .metadata()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let r = request.into_inner();
        // Every field is checked before anything is stored: nothing is half-applied.
        let lim = &self.core.opts.limits;
        let traceparent = if r.traceparent.is_empty() {
            // An invalid header is ignored (W3C: a vendor must not fail the request on it).
            match crate::trace::parse_traceparent(&header) {
                Some(_) => header.trim().to_string(),
                None => String::new(),
            }
        } else if crate::trace::parse_traceparent(&r.traceparent).is_some() {
            r.traceparent.trim().to_string()
        } else {
            return Err(HubError::invalid(format!(
                "traceparent: expected a W3C traceparent such as 00-<32 hex trace id>-<16 hex span id>-01, got {:?}",
                crate::limits::cut(&r.traceparent, 80)
            ))
            .into());
        };
        check_namespace(&r.namespace)?;
        limits::validate_name("deployment", &r.deployment)?;
        lim.check_input(&r.input)?;
        let labels = r.labels.into_iter().collect();
        lim.check_labels("labels", &labels)?;
        lim.check_conversation_key(&r.conversation_key)?;
        limits::check_bytes(
            "client_request_id",
            &r.client_request_id,
            crate::core::tasks::MAX_CLIENT_REQUEST_ID_BYTES,
        )?;
        let tool_overrides = convert::tool_overrides(r.tool_overrides.unwrap_or_default())?;
        let webhooks =
            super::triggers::submit_webhooks(&self.core, &r.namespace, &r.deployment, r.webhooks)?;
        let double_texting = convert::double_texting(&r.double_texting)?;
        if r.timeout_ms > crate::core::deadlines::MAX_TIMEOUT_MS {
            return Err(HubError::invalid(format!(
                "timeout_ms: {} is over the limit of {} (a year)",
                r.timeout_ms,
                crate::core::deadlines::MAX_TIMEOUT_MS
            ))
            .into());
        }
        let task = self
            .core
            .submit_task(TaskSpec {
                namespace: r.namespace,
                deployment: r.deployment,
                input: r.input,
                labels,
                conversation_key: r.conversation_key,
                client_request_id: r.client_request_id,
                parent: None,
                tool_overrides,
                traceparent,
                budget: crate::core::tasks::SpecBudget {
                    timeout_ms: r.timeout_ms,
                    max_tokens: r.max_tokens,
                },
                webhooks,
                double_texting,
                output_schema: convert::output_schema(r.output_schema_json)?,
            })
            .await?;
        Ok(Response::new(convert::task(&task)))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
        let r = request.into_inner();
        check_task_ref(&r.namespace, &r.task_id)?;
        let task = self.core.get_task(&r.namespace, &r.task_id)?;
        Ok(Response::new(super::approvals::with_pending(
            &self.core,
            convert::task(&task),
        )))
    }

    async fn query_task(
        &self,
        request: Request<pb::QueryTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
        let r = request.into_inner();
        check_task_ref(&r.namespace, &r.task_id)?;
        let task = self.core.get_task(&r.namespace, &r.task_id)?;
        Ok(Response::new(super::approvals::with_pending(
            &self.core,
            convert::task(&task),
        )))
    }

    type WatchTaskStream = Stream_<pb::TaskEvent>;

    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let who = authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
        let r = request.into_inner();
        check_task_ref(&r.namespace, &r.task_id)?;
        let core = self.core.clone();
        let permit = core
            .streams
            .open(crate::core::streams::StreamKind::WatchTask, &who)?;
        // Subscribe before reading the stored events, so nothing falls between the two.
        let task = core.get_task(&r.namespace, &r.task_id)?;
        let live = core.subscribe_task(&task.task_id);
        // Read again after subscribing: an event between the two reads is in `stored` or
        // reaches `live`.
        let task = core.get_task(&r.namespace, &r.task_id)?;
        let stored = core.task_events(&task.task_id, r.from_seq)?;
        let deltas = crate::core::deltas::DeltaFollower::new(
            &core,
            &task.task_id,
            r.deltas && !task.state.is_terminal(),
        );
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::TaskEvent, Status>>(64);
        tokio::spawn(super::watch_deltas::pump(
            core, task, stored, live, deltas, r.from_seq, tx,
        ));
        let events = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        let tokens = self.access.tokens.clone();
        Ok(Response::new(super::auth::until_revoked(
            tokens,
            who,
            events,
            Some(permit),
        )))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        authorize(
            &request,
            &request.get_ref().namespace,
            Action::Submit,
            &request.get_ref().task_id,
        )?;
        let r = request.into_inner();
        check_task_ref(&r.namespace, &r.task_id)?;
        limits::check_bytes("reason", &r.reason, limits::MAX_REASON_BYTES)?;
        let task = self
            .core
            .cancel_task(&r.namespace, &r.task_id, &r.reason)
            .await?;
        Ok(Response::new(convert::task(&task)))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        super::task_lists::list(&self.core, request).map(Response::new)
    }

    type WatchTasksStream = Stream_<pb::ListTasksResponse>;

    async fn watch_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<Self::WatchTasksStream>, Status> {
        super::task_lists::watch(self, request).map(Response::new)
    }

    async fn get_trace(
        &self,
        request: Request<pb::GetTraceRequest>,
    ) -> Result<Response<pb::Trace>, Status> {
        let principal = authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
        let r = request.into_inner();
        check_task_ref(&r.namespace, &r.task_id)?;
        let may_read = |ns: &str| {
            principal
                .allows(
                    crate::tokens::Need::Role(crate::tokens::Role::Viewer),
                    ns,
                    "GetTrace",
                )
                .is_ok()
        };
        let (task, spans) = self.core.trace_for(&r.namespace, &r.task_id, &may_read)?;
        Ok(Response::new(pb::Trace {
            task_id: task.task_id.clone(),
            trace_id: crate::trace::trace_id(&task),
            spans: spans.iter().map(convert::span).collect(),
        }))
    }

    async fn list_artifacts(
        &self,
        request: Request<pb::ListArtifactsRequest>,
    ) -> Result<Response<pb::ListArtifactsResponse>, Status> {
        super::artifacts::list(&self.core, request).await
    }

    type GetArtifactStream = Stream_<pb::ArtifactChunk>;

    async fn get_artifact(
        &self,
        request: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        super::artifacts::get(&self.core, request).await
    }

    async fn set_secret(
        &self,
        request: Request<pb::SetSecretRequest>,
    ) -> Result<Response<pb::SetSecretResponse>, Status> {
        super::secrets::set(&self.core, request).await
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        super::secrets::list(&self.core, request).await
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        super::secrets::delete(&self.core, request).await
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        self.access.create_token(request).await
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        self.access.list_tokens(request).await
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        self.access.revoke_token(request).await
    }

    async fn rename_token(
        &self,
        request: Request<pb::RenameTokenRequest>,
    ) -> Result<Response<pb::TokenInfo>, Status> {
        self.access.rename_token(request).await
    }

    async fn rotate_token(
        &self,
        request: Request<pb::RotateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        self.access.rotate_token(request).await
    }

    async fn list_audit(
        &self,
        request: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        self.access.list_audit(request).await
    }

    async fn revoke_nest(
        &self,
        request: Request<pb::RevokeNestRequest>,
    ) -> Result<Response<pb::NestIdentity>, Status> {
        self.access.revoke_nest(request).await
    }

    async fn forget_nest(
        &self,
        request: Request<pb::ForgetNestRequest>,
    ) -> Result<Response<pb::NestIdentity>, Status> {
        self.access.forget_nest(request).await
    }

    async fn scale_deployment(
        &self,
        request: Request<pb::ScaleDeploymentRequest>,
    ) -> Result<Response<pb::Deployment>, Status> {
        super::lifecycle::scale(&self.core, request).await
    }

    async fn list_deployment_history(
        &self,
        request: Request<pb::ListDeploymentHistoryRequest>,
    ) -> Result<Response<pb::ListDeploymentHistoryResponse>, Status> {
        super::lifecycle::history(&self.core, request)
    }

    async fn rollback_deployment(
        &self,
        request: Request<pb::RollbackDeploymentRequest>,
    ) -> Result<Response<pb::Deployment>, Status> {
        super::lifecycle::rollback(&self.core, request).await
    }

    async fn cordon_nest(
        &self,
        request: Request<pb::NestRequest>,
    ) -> Result<Response<pb::Nest>, Status> {
        super::lifecycle::cordon(&self.core, request).await
    }

    async fn uncordon_nest(
        &self,
        request: Request<pb::NestRequest>,
    ) -> Result<Response<pb::Nest>, Status> {
        super::lifecycle::uncordon(&self.core, request).await
    }

    async fn drain_nest(
        &self,
        request: Request<pb::NestRequest>,
    ) -> Result<Response<pb::Nest>, Status> {
        super::lifecycle::drain(&self.core, request).await
    }

    type ReadLogsStream = Stream_<pb::LogLine>;

    async fn read_logs(
        &self,
        request: Request<pb::ReadLogsRequest>,
    ) -> Result<Response<Self::ReadLogsStream>, Status> {
        let tokens = self.access.tokens.clone();
        super::logs::read(&self.core, &self.logs, tokens, request)
            .await
            .map(Response::new)
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        super::approvals::list(&self.core, request).await
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        super::approvals::decide(&self.core, request).await
    }

    type WatchNestsStream = Stream_<pb::ListNestsResponse>;

    async fn watch_nests(
        &self,
        request: Request<pb::ListNestsRequest>,
    ) -> Result<Response<Self::WatchNestsStream>, Status> {
        super::ops::watch_nests(self, request)
    }

    type WatchDeploymentsStream = Stream_<pb::ListDeploymentsResponse>;

    async fn watch_deployments(
        &self,
        request: Request<pb::ListDeploymentsRequest>,
    ) -> Result<Response<Self::WatchDeploymentsStream>, Status> {
        super::ops::watch_deployments(self, request)
    }

    type SnapshotStoreStream = Stream_<pb::SnapshotChunk>;

    async fn snapshot_store(
        &self,
        request: Request<pb::SnapshotStoreRequest>,
    ) -> Result<Response<Self::SnapshotStoreStream>, Status> {
        super::ops::snapshot_store(&self.core, request).await
    }

    async fn verify_store(
        &self,
        request: Request<pb::VerifyStoreRequest>,
    ) -> Result<Response<pb::VerifyStoreResponse>, Status> {
        super::ops::verify_store(&self.core, request).await
    }

    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        super::triggers::create(&self.core, request).await
    }

    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        super::triggers::list(&self.core, request).await
    }

    async fn pause_schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        super::triggers::change(&self.core, request, Change::Pause).await
    }

    async fn resume_schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        super::triggers::change(&self.core, request, Change::Resume).await
    }

    async fn delete_schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        super::triggers::change(&self.core, request, Change::Delete).await
    }

    async fn run_schedule(
        &self,
        request: Request<pb::ScheduleRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        super::triggers::run_now(&self.core, request).await
    }

    async fn list_task_webhooks(
        &self,
        request: Request<pb::ListTaskWebhooksRequest>,
    ) -> Result<Response<pb::ListTaskWebhooksResponse>, Status> {
        super::triggers::task_webhooks(&self.core, request).await
    }
}
