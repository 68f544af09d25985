//! `agen.v1.NestService`: one `Connect` stream per Nest (register first, then heartbeats,
//! instance reports and run events in; placements, stops, runs and acks out) and
//! `FetchBundle` (bundles by digest, in chunks, never inside the stream), `PutArtifact` /
//! `ReadArtifact` (agents' artifacts, relayed by the Nest, also in chunks), and `Join`, which
//! signs a Nest's CSR with the Hub's CA.
//!
//! Invariants: on a TLS Hub every call but `Join` needs a client certificate the CA verified,
//! and a Nest is who its certificate says (`Register.nest_id` must match it); a plaintext
//! (loopback) Hub has no certificates and trusts the join token alone.

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
    /// The Hub's TLS material (signs Nest certificates); `None` on a plaintext Hub.
    pub tls: Option<Arc<agen_shared::tls::HubTls>>,
}

impl NestApi {
    /// The nest id named by the caller's verified client certificate; `None` on a plaintext Hub
    /// (no certificates there).
    fn cert_nest_id<T>(&self, request: &Request<T>) -> Result<Option<String>, Status> {
        if self.tls.is_none() {
            return Ok(None);
        }
        let certs = request.peer_certs();
        let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
            return Err(Status::unauthenticated(
                "nest calls need the certificate from Join; restart the nest to re-join",
            ));
        };
        agen_shared::tls::nest_id_of_cert(leaf.as_ref())
            .map(Some)
            .map_err(|e| Status::unauthenticated(e.to_string()))
    }
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl NestService for NestApi {
    type ConnectStream = Stream_<pb::HubMessage>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::NestMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let cert_id = self.cert_nest_id(&request)?;
        let mut incoming = request.into_inner();
        let first = incoming
            .message()
            .await?
            .ok_or_else(|| HubError::invalid("connect: the stream ended before Register"))?;
        let Some(pb::nest_message::Msg::Register(register)) = first.msg else {
            return Err(HubError::invalid("connect: the first message must be Register").into());
        };
        if let Some(cert_id) = cert_id {
            if register.nest_id != cert_id {
                return Err(Status::permission_denied(format!(
                    "connect: Register names nest `{}` but the client certificate was issued to nest `{cert_id}`; a nest registers only as itself",
                    register.nest_id
                )));
            }
        }
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
                    Some(pb::nest_message::Msg::Leaving(l)) => {
                        if let Err(e) = core.nest_leaving(&nest_id, conn_id, &l.reason).await {
                            tracing::error!(nest_id = %nest_id, error = %e, "cannot record a nest leaving");
                        }
                        break;
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
        self.cert_nest_id(&request)?;
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
        self.cert_nest_id(&request)?;
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
        self.cert_nest_id(&request)?;
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

    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::JoinResponse>, Status> {
        let Some(tls) = self.tls.as_ref() else {
            return Err(Status::failed_precondition(
                "join: a plaintext hub issues no certificates; connect with the join token alone",
            ));
        };
        let r = request.into_inner();
        let cert_pem = tls
            .sign_nest_csr(&r.csr_pem, &r.nest_id)
            .map_err(|e| HubError::invalid(format!("join: {e}")))?;
        tracing::info!(nest_id = %r.nest_id, name = %r.name, "issued a nest certificate");
        Ok(Response::new(pb::JoinResponse {
            cert_pem,
            ca_pem: tls.ca_pem.clone(),
        }))
    }
}
