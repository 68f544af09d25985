//! The Hub's `NestService` calls beside the `Connect` stream, as typed methods of
//! [`HubClient`]: the Nest's domain types in and out, protobuf only inside (through
//! [`super::convert`]). `Connect` itself is the Hub link's, which speaks its messages.

use agen_harness::artifacts::ArtifactMeta;
use agen_harness::run::{ChildEnd, ChildRequest};
use agen_proto::v1 as pb;
use futures::stream::{BoxStream, Stream, StreamExt};

use super::{convert, HubClient};
use crate::model::{ContextChunk, LogChunk, NewArtifact, RunLease};

/// Bytes per `PutArtifact` chunk.
const ARTIFACT_CHUNK: usize = 1024 * 1024;

/// A call the Hub answered with an error, or that did not reach it. Shown as
/// `<code>: <message>` (`Unavailable: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CallError {
    /// The gRPC code's name (`Unavailable`, `PermissionDenied`, …).
    pub code: String,
    /// The Hub's message (or the transport's).
    pub message: String,
    refusal: bool,
}

impl CallError {
    /// Whether the Hub refused (asking again gets the same answer): permission denied, not
    /// found, invalid argument, unauthenticated, unimplemented.
    pub fn is_refusal(&self) -> bool {
        self.refusal
    }
}

impl From<tonic::Status> for CallError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        CallError {
            code: format!("{:?}", s.code()),
            message: s.message().to_string(),
            refusal: matches!(
                s.code(),
                Code::PermissionDenied
                    | Code::NotFound
                    | Code::InvalidArgument
                    | Code::Unauthenticated
                    | Code::Unimplemented
            ),
        }
    }
}

/// The parts of a streamed answer, in order.
pub struct Chunks<T>(BoxStream<'static, Result<T, CallError>>);

impl<T> Chunks<T> {
    fn of<P: Send + 'static>(s: tonic::Streaming<P>, f: fn(P) -> T) -> Chunks<T>
    where
        T: Send + 'static,
    {
        Chunks(s.map(move |r| r.map(f).map_err(CallError::from)).boxed())
    }

    /// The next part, `None` after the last.
    pub async fn next(&mut self) -> Result<Option<T>, CallError> {
        self.0.next().await.transpose()
    }
}

impl HubClient {
    /// Opens the `Connect` stream (the Hub link's alone).
    pub async fn connect(
        &mut self,
        outbound: impl Stream<Item = pb::NestMessage> + Send + 'static,
    ) -> Result<tonic::Streaming<pb::HubMessage>, tonic::Status> {
        Ok(self.0.connect(outbound).await?.into_inner())
    }

    /// A bundle's archive by digest, in parts.
    pub async fn fetch_bundle(&mut self, digest: &str) -> Result<Chunks<Vec<u8>>, CallError> {
        let s = self
            .0
            .fetch_bundle(pb::FetchBundleRequest {
                digest: digest.to_string(),
            })
            .await?
            .into_inner();
        Ok(Chunks::of(s, |c| c.data))
    }

    /// Stores an artifact at the Hub (chunked; the first chunk carries its metadata) and
    /// returns what the Hub stored.
    pub async fn put_artifact(
        &mut self,
        artifact: NewArtifact,
        content: Vec<u8>,
    ) -> Result<ArtifactMeta, CallError> {
        let first = convert::new_artifact(artifact, content.len() as u64);
        let mut chunks: Vec<pb::ArtifactChunk> = content
            .chunks(ARTIFACT_CHUNK)
            .map(|c| pb::ArtifactChunk {
                artifact: None,
                data: c.to_vec(),
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(pb::ArtifactChunk::default());
        }
        if let Some(c) = chunks.first_mut() {
            c.artifact = Some(first);
        }
        let saved = self
            .0
            .put_artifact(futures::stream::iter(chunks))
            .await?
            .into_inner();
        Ok(convert::artifact_meta(saved))
    }

    /// An artifact's content in `namespace`, in parts.
    pub async fn read_artifact(
        &mut self,
        namespace: &str,
        id: &str,
    ) -> Result<Chunks<Vec<u8>>, CallError> {
        let s = self
            .0
            .read_artifact(pb::GetArtifactRequest {
                namespace: namespace.to_string(),
                artifact_id: id.to_string(),
            })
            .await?
            .into_inner();
        Ok(Chunks::of(s, |c| c.data))
    }

    /// Starts the child task of a delegate call of `parent` (or finds the one its
    /// idempotency key made); returns the child's task id.
    pub async fn start_child(
        &mut self,
        parent: &RunLease,
        child: ChildRequest,
    ) -> Result<String, CallError> {
        let r = self
            .0
            .start_child(convert::start_child(parent, child))
            .await?
            .into_inner();
        Ok(r.task_id)
    }

    /// Waits at most `wait_ms` for a child of `parent` to end: its end, or `None` while it runs.
    pub async fn wait_child(
        &mut self,
        parent: &RunLease,
        child_task_id: String,
        wait_ms: u64,
    ) -> Result<Option<ChildEnd>, CallError> {
        let r = self
            .0
            .wait_child(pb::WaitChildRequest {
                parent: Some(convert::child_parent(parent)),
                child_task_id,
                wait_ms,
            })
            .await?
            .into_inner();
        Ok(convert::child_end(r))
    }

    /// Cancels a child of `parent`.
    pub async fn cancel_child(
        &mut self,
        parent: &RunLease,
        child_task_id: String,
        reason: String,
    ) -> Result<(), CallError> {
        self.0
            .cancel_child(pb::CancelChildRequest {
                parent: Some(convert::child_parent(parent)),
                child_task_id,
                reason,
            })
            .await?;
        Ok(())
    }

    /// Sends the answer to a log request, part by part, until `chunks` ends or the Hub ends
    /// the call.
    pub async fn send_logs(
        &mut self,
        chunks: impl Stream<Item = LogChunk> + Send + 'static,
    ) -> Result<(), CallError> {
        self.0.send_logs(chunks.map(convert::log_chunk)).await?;
        Ok(())
    }

    /// A run's context (history and replay), in parts; only the holder of `lease` gets it.
    pub async fn fetch_run_context(
        &mut self,
        lease: &RunLease,
    ) -> Result<Chunks<ContextChunk>, CallError> {
        let s = self
            .0
            .fetch_run_context(convert::context_request(lease))
            .await?
            .into_inner();
        Ok(Chunks::of(s, convert::context_chunk))
    }
}
