//! `agen.v1.NestService`: one `Connect` stream per Nest (register first, then heartbeats,
//! instance reports and run events in; placements, stops, runs and acks out) and
//! `FetchBundle` (bundles by digest, in chunks, never inside the stream), `PutArtifact` /
//! `ReadArtifact` (agents' artifacts, relayed by the Nest, also in chunks).

use std::pin::Pin;
use std::sync::Arc;

use agen_proto::v1 as pb;
use agen_proto::v1::nest_service_server::NestService;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use crate::error::HubError;
use crate::fleet::Core;

/// Bundle bytes per `FetchBundle` chunk.
const CHUNK: usize = 1024 * 1024;

pub struct NestApi {
    pub core: Arc<Core>,
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl NestService for NestApi {
    type ConnectStream = Stream_<pb::HubMessage>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::NestMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut incoming = request.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| HubError::invalid("connect: the stream ended before Register"))?;
        let Some(pb::nest_message::Msg::Register(register)) = first.msg else {
            return Err(HubError::invalid("connect: the first message must be Register").into());
        };
        let reg = convert::registration(&register);
        let nest_id = reg.nest_id.clone();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let conn_id = self.core.register(reg, tx).await?;

        let core = self.core.clone();
        tokio::spawn(async move {
            loop {
                let msg = match incoming.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(nest_id = %nest_id, error = %e, "nest stream failed");
                        break;
                    }
                };
                let result = match msg.msg {
                    Some(pb::nest_message::Msg::Heartbeat(h)) => {
                        let reports: Vec<_> =
                            h.instances.iter().map(convert::instance_report).collect();
                        core.heartbeat(&nest_id, conn_id, &reports)
                    }
                    Some(pb::nest_message::Msg::Instance(r)) => {
                        core.instance_report(&nest_id, conn_id, &convert::instance_report(&r))
                    }
                    Some(pb::nest_message::Msg::RunEvents(batch)) => {
                        let events = batch.events.iter().map(convert::run_event).collect();
                        match core.run_events(events).await {
                            Ok(acks) => {
                                let st = core.lock();
                                for ack in acks {
                                    st.live.send(&nest_id, ack);
                                }
                                Ok(())
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Some(pb::nest_message::Msg::Register(_)) => {
                        tracing::warn!(nest_id = %nest_id, "ignoring a second Register on one stream; reconnect to re-register");
                        Ok(())
                    }
                    None => Ok(()),
                };
                if let Err(e) = result {
                    tracing::error!(nest_id = %nest_id, error = %e, "cannot handle a nest message");
                }
            }
            core.disconnect(&nest_id, conn_id);
        });

        let out = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
            .map(|m| Ok(convert::to_nest(m)));
        Ok(Response::new(Box::pin(out)))
    }

    async fn put_artifact(
        &self,
        request: Request<Streaming<pb::ArtifactChunk>>,
    ) -> Result<Response<pb::Artifact>, Status> {
        let mut stream = request.into_inner();
        let first = stream.message().await?.ok_or_else(|| {
            HubError::invalid("put_artifact: expected at least one chunk carrying the artifact")
        })?;
        let meta = first.artifact.clone().ok_or_else(|| {
            HubError::invalid("put_artifact: the first chunk must carry `artifact` (namespace, artifact_id, name, size)")
        })?;
        let max = crate::artifacts::MAX_ARTIFACT_BYTES;
        if meta.size > max {
            return Err(HubError::ResourceExhausted(format!(
                "artifact {} is {} bytes, more than the limit of 25 MB per artifact; save it in smaller parts",
                meta.name, meta.size
            ))
            .into());
        }
        let mut bytes = first.data;
        while let Some(chunk) = stream.message().await? {
            if (bytes.len() + chunk.data.len()) as u64 > max.min(meta.size) {
                return Err(HubError::invalid(format!(
                    "put_artifact: artifact {} sent more than its announced {} bytes (limit 25 MB)",
                    meta.name, meta.size
                ))
                .into());
            }
            bytes.extend_from_slice(&chunk.data);
        }
        if bytes.len() as u64 != meta.size {
            return Err(HubError::invalid(format!(
                "put_artifact: artifact {} announced {} bytes but sent {}; send it again",
                meta.name,
                meta.size,
                bytes.len()
            ))
            .into());
        }
        let rec = crate::artifacts::ArtifactRec {
            namespace: meta.namespace,
            id: meta.artifact_id,
            name: meta.name,
            media_type: meta.media_type,
            size: meta.size,
            task_id: meta.task_id,
            created_at_ms: 0,
        };
        let stored = self.core.put_artifact(rec, bytes).await?;
        Ok(Response::new(convert::artifact(&stored)))
    }

    type ReadArtifactStream = Stream_<pb::ArtifactChunk>;

    async fn read_artifact(
        &self,
        request: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::ReadArtifactStream>, Status> {
        let r = request.into_inner();
        let (rec, bytes) = self.core.artifact(&r.namespace, &r.artifact_id)?;
        let chunks = convert::artifact_chunks(&rec, &bytes);
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    type FetchBundleStream = Stream_<pb::BundleChunk>;

    async fn fetch_bundle(
        &self,
        request: Request<pb::FetchBundleRequest>,
    ) -> Result<Response<Self::FetchBundleStream>, Status> {
        let digest = request.into_inner().digest;
        if digest.is_empty() {
            return Err(HubError::invalid("digest: expected sha256:<hex> of a bundle").into());
        }
        let bytes = self
            .core
            .bundle_bytes(&digest)?
            .ok_or_else(|| HubError::not_found(format!("bundle {digest} not found on the hub")))?;
        let total = bytes.len() as u64;
        let mut chunks: Vec<pb::BundleChunk> = bytes
            .chunks(CHUNK)
            .map(|c| pb::BundleChunk {
                digest: String::new(),
                total_size: 0,
                data: c.to_vec(),
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(pb::BundleChunk::default());
        }
        if let Some(first) = chunks.first_mut() {
            first.digest = digest;
            first.total_size = total;
        }
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }
}
