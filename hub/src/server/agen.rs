//! `agen.v1.AgenService`: the user/automation API. Validates requests, calls the core, converts.

use std::pin::Pin;
use std::sync::Arc;

use agen_proto::v1 as pb;
use agen_proto::v1::agen_service_server::AgenService;
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::error::HubError;
use crate::fleet::{Core, DeploymentSpec};
use crate::model::TaskState;
use crate::tasks::{TaskFilter, TaskSpec};

pub struct AgenApi {
    pub core: Arc<Core>,
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn active_runs(core: &Core, instance_id: &str) -> u32 {
    let st = core.lock();
    st.tasks
        .values()
        .filter(|t| {
            t.instance_id == instance_id
                && matches!(t.state, TaskState::Running | TaskState::Waiting)
        })
        .count() as u32
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
        let mut stream = request.into_inner();
        let max = agen_shared::bundle::MAX_BUNDLE_BYTES;
        let first = stream.message().await?.ok_or_else(|| {
            HubError::invalid("upload: expected at least one chunk carrying digest and total_size")
        })?;
        let digest = first.digest.clone();
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(HubError::invalid(format!(
                "digest: `{digest}` is not a bundle digest; expected sha256:<64 hex digits> in the first chunk"
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
        while let Some(chunk) = stream.message().await? {
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
        let who = super::lifecycle::caller(&request);
        let r = request.into_inner();
        let spec = DeploymentSpec {
            namespace: r.namespace,
            name: r.name,
            bundle_digest: r.bundle_digest,
            replicas: r.replicas,
            selector: r.selector.into_iter().collect(),
            concurrency: r.concurrency,
        };
        let rec = self.core.deploy_as(spec, &who, "deploy").await?;
        let (view, _) = self.core.get_deployment(&rec.namespace, &rec.name)?;
        Ok(Response::new(convert::deployment(&view)))
    }

    async fn get_deployment(
        &self,
        request: Request<pb::GetDeploymentRequest>,
    ) -> Result<Response<pb::GetDeploymentResponse>, Status> {
        let r = request.into_inner();
        let (view, instances) = self.core.get_deployment(&r.namespace, &r.name)?;
        Ok(Response::new(pb::GetDeploymentResponse {
            deployment: Some(convert::deployment(&view)),
            instances: instances
                .iter()
                .map(|i| convert::instance(i, active_runs(&self.core, &i.instance_id)))
                .collect(),
        }))
    }

    async fn list_deployments(
        &self,
        request: Request<pb::ListDeploymentsRequest>,
    ) -> Result<Response<pb::ListDeploymentsResponse>, Status> {
        let r = request.into_inner();
        let list = self.core.list_deployments(&r.namespace, r.all_namespaces);
        Ok(Response::new(pb::ListDeploymentsResponse {
            deployments: list.iter().map(convert::deployment).collect(),
        }))
    }

    async fn delete_deployment(
        &self,
        request: Request<pb::DeleteDeploymentRequest>,
    ) -> Result<Response<pb::DeleteDeploymentResponse>, Status> {
        let who = super::lifecycle::caller(&request);
        let r = request.into_inner();
        self.core
            .remove_deployment(&r.namespace, &r.name, &who)
            .await?;
        Ok(Response::new(pb::DeleteDeploymentResponse {}))
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        let r = request.into_inner();
        let list = self
            .core
            .list_instances(&r.namespace, &r.deployment, r.all_namespaces);
        Ok(Response::new(pb::ListInstancesResponse {
            instances: list
                .iter()
                .map(|i| convert::instance(i, active_runs(&self.core, &i.instance_id)))
                .collect(),
        }))
    }

    async fn list_nests(
        &self,
        _request: Request<pb::ListNestsRequest>,
    ) -> Result<Response<pb::ListNestsResponse>, Status> {
        let nests = self.core.list_nests();
        Ok(Response::new(pb::ListNestsResponse {
            nests: nests
                .iter()
                .map(|(n, count)| convert::nest(n, *count))
                .collect(),
        }))
    }

    async fn submit_task(
        &self,
        request: Request<pb::SubmitTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let r = request.into_inner();
        let task = self
            .core
            .submit_task(TaskSpec {
                namespace: r.namespace,
                deployment: r.deployment,
                input: r.input,
                labels: r.labels.into_iter().collect(),
                conversation_key: r.conversation_key,
                client_request_id: r.client_request_id,
            })
            .await?;
        Ok(Response::new(convert::task(&task)))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let r = request.into_inner();
        Ok(Response::new(convert::task(
            &self.core.get_task(&r.namespace, &r.task_id)?,
        )))
    }

    async fn query_task(
        &self,
        request: Request<pb::QueryTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let r = request.into_inner();
        Ok(Response::new(convert::task(
            &self.core.get_task(&r.namespace, &r.task_id)?,
        )))
    }

    type WatchTaskStream = Stream_<pb::TaskEvent>;

    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let r = request.into_inner();
        let core = self.core.clone();
        // Subscribe before reading the stored events, so nothing falls between the two.
        let mut live = core.subscribe();
        let task = core.get_task(&r.namespace, &r.task_id)?;
        let stored = core.task_events(&task.task_id, r.from_seq)?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::TaskEvent, Status>>(64);
        tokio::spawn(async move {
            let mut last = r.from_seq.saturating_sub(1);
            for e in &stored {
                // Replayed events carry the task as it was after each of them.
                if tx.send(Ok(convert::task_event(e, &task))).await.is_err() {
                    return;
                }
                last = e.seq;
            }
            let is_end = |kind: &str, state: TaskState| kind == "task.state" && state.is_terminal();
            if task.state.is_terminal() {
                // Finished already: send whatever was stored after the snapshot, then end.
                let Ok(rest) = core.task_events(&task.task_id, last + 1) else {
                    return;
                };
                for e in rest {
                    if tx.send(Ok(convert::task_event(&e, &task))).await.is_err() {
                        return;
                    }
                }
                return;
            }
            loop {
                let next = tokio::select! {
                    n = live.recv() => n,
                    _ = core.stopping.cancelled() => return,
                };
                match next {
                    Ok(u) if u.task_id == task.task_id => {
                        if u.event.seq <= last {
                            continue;
                        }
                        last = u.event.seq;
                        let end = is_end(&u.event.kind, u.task.state);
                        if tx
                            .send(Ok(convert::task_event(&u.event, &u.task)))
                            .await
                            .is_err()
                            || end
                        {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Fell behind: catch up from the store.
                        let Ok(missed) = core.task_events(&task.task_id, last + 1) else {
                            return;
                        };
                        let Ok(now) = core.get_task(&task.namespace, &task.task_id) else {
                            return;
                        };
                        for e in missed {
                            last = e.seq;
                            if tx.send(Ok(convert::task_event(&e, &now))).await.is_err() {
                                return;
                            }
                        }
                        if now.state.is_terminal() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let r = request.into_inner();
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
        let r = request.into_inner();
        let tasks = self.core.list_tasks(&TaskFilter {
            namespace: r.namespace,
            deployment: r.deployment,
            state: convert::task_state_filter(r.task_state, r.state),
            conversation_key: r.conversation_key,
            limit: r.limit,
        })?;
        Ok(Response::new(pb::ListTasksResponse {
            tasks: tasks.iter().map(convert::task).collect(),
        }))
    }

    async fn get_trace(
        &self,
        request: Request<pb::GetTraceRequest>,
    ) -> Result<Response<pb::Trace>, Status> {
        let r = request.into_inner();
        let (task, spans) = self.core.trace(&r.namespace, &r.task_id)?;
        Ok(Response::new(pb::Trace {
            task_id: task.task_id.clone(),
            trace_id: task.run_id.clone(),
            spans: spans.iter().map(convert::span).collect(),
        }))
    }

    async fn list_artifacts(
        &self,
        request: Request<pb::ListArtifactsRequest>,
    ) -> Result<Response<pb::ListArtifactsResponse>, Status> {
        let r = request.into_inner();
        let list = self.core.list_artifacts(&r.namespace, &r.task_id)?;
        Ok(Response::new(pb::ListArtifactsResponse {
            artifacts: list.iter().map(convert::artifact).collect(),
        }))
    }

    type GetArtifactStream = Stream_<pb::ArtifactChunk>;

    async fn get_artifact(
        &self,
        request: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::GetArtifactStream>, Status> {
        let r = request.into_inner();
        if r.artifact_id.is_empty() {
            return Err(HubError::invalid(
                "artifact_id: expected an artifact id such as sha256:<hex>",
            )
            .into());
        }
        let (rec, bytes) = self.core.artifact(&r.namespace, &r.artifact_id)?;
        let chunks = convert::artifact_chunks(&rec, &bytes);
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn set_secret(
        &self,
        request: Request<pb::SetSecretRequest>,
    ) -> Result<Response<pb::SetSecretResponse>, Status> {
        let r = request.into_inner();
        let (meta, replaced) = self
            .core
            .set_secret(&r.namespace, &r.name, &r.value)
            .await?;
        Ok(Response::new(pb::SetSecretResponse {
            secret: Some(convert::secret(&meta)),
            replaced,
        }))
    }

    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let r = request.into_inner();
        let secrets = self.core.list_secrets(&r.namespace)?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: secrets.iter().map(convert::secret).collect(),
        }))
    }

    async fn delete_secret(
        &self,
        request: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        let r = request.into_inner();
        self.core.delete_secret(&r.namespace, &r.name).await?;
        Ok(Response::new(pb::DeleteSecretResponse {}))
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
}
