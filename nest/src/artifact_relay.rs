//! The Nest's artifact relay: an instance's `save_artifact` / `read_artifact` (socket messages
//! `PutArtifact` / `ReadArtifact`) become the Hub's `NestService/PutArtifact` (chunked upload
//! by digest) and `NestService/ReadArtifact` (chunked download), never the `Connect` stream, so
//! a big artifact can never delay a heartbeat or a run event.
//!
//! Invariants: the namespace is always the instance's placement namespace (an instance cannot
//! reach another namespace's artifacts); every request is answered with exactly one
//! `ArtifactReply` (the Hub's message on failure, which names the limit or the missing id).

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::bundles::BundleCache;
use crate::model::NewArtifact;
use crate::socket::{ToInstance, ToNest};
use agen_harness::artifacts::{artifact_id, ArtifactMeta, MAX_ARTIFACT_BYTES};

/// Serves one artifact request of an instance in `namespace` in the background; the answer
/// goes to `reply` (the instance's connection).
pub fn relay(
    bundles: Arc<BundleCache>,
    namespace: String,
    reply: mpsc::UnboundedSender<ToInstance>,
    msg: ToNest,
) {
    tokio::spawn(async move {
        let answer = match msg {
            ToNest::PutArtifact {
                req,
                task_id,
                name,
                media_type,
                content,
            } => {
                let result = put(
                    &bundles,
                    &namespace,
                    &task_id,
                    &name,
                    &media_type,
                    content.into_bytes(),
                )
                .await;
                match result {
                    Ok(meta) => ToInstance::ArtifactReply {
                        req,
                        artifact: Some(meta),
                        content: None,
                        error: None,
                    },
                    Err(e) => failed(req, &namespace, e),
                }
            }
            ToNest::ReadArtifact { req, id } => match read(&bundles, &namespace, &id).await {
                Ok(bytes) => ToInstance::ArtifactReply {
                    req,
                    artifact: None,
                    content: Some(String::from_utf8_lossy(&bytes).into_owned()),
                    error: None,
                },
                Err(e) => failed(req, &namespace, e),
            },
            _ => return,
        };
        let _ = reply.send(answer);
    });
}

fn failed(req: u64, namespace: &str, error: String) -> ToInstance {
    tracing::info!(namespace, "artifact request failed: {error}");
    ToInstance::ArtifactReply {
        req,
        artifact: None,
        content: None,
        error: Some(error),
    }
}

/// Uploads one artifact to the Hub in chunks (the first carries its metadata).
pub async fn put(
    bundles: &BundleCache,
    namespace: &str,
    task_id: &str,
    name: &str,
    media_type: &str,
    content: Vec<u8>,
) -> Result<ArtifactMeta, String> {
    let mut client = bundles.hub_client().await.map_err(|e| e.to_string())?;
    let artifact = NewArtifact {
        artifact_id: artifact_id(&content),
        name: name.to_string(),
        media_type: media_type.to_string(),
        task_id: task_id.to_string(),
        namespace: namespace.to_string(),
    };
    client
        .put_artifact(artifact, content)
        .await
        .map_err(|e| format!("the hub did not store artifact {name}: {}", e.message))
}

/// Downloads one artifact from the Hub.
pub async fn read(bundles: &BundleCache, namespace: &str, id: &str) -> Result<Vec<u8>, String> {
    let mut client = bundles.hub_client().await.map_err(|e| e.to_string())?;
    let mut stream = client
        .read_artifact(namespace, id)
        .await
        .map_err(|e| e.message)?;
    let mut bytes = Vec::new();
    while let Some(data) = stream
        .next()
        .await
        .map_err(|e| format!("reading artifact {id} was interrupted: {}", e.message))?
    {
        if (bytes.len() + data.len()) as u64 > MAX_ARTIFACT_BYTES {
            return Err(format!("artifact {id} is larger than the 25 MB limit"));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes)
}
