//! The fleet [`ArtifactStore`] of an instance: `save_artifact` / `read_artifact` go to the Nest
//! over the socket ([`ToNest::PutArtifact`], [`ToNest::ReadArtifact`]); the Nest moves them to
//! and from the Hub over their own RPCs and answers [`ToInstance::ArtifactReply`].
//!
//! Invariants: the instance never names the namespace (the Nest uses the instance's placement);
//! every request gets exactly one answer or a timeout; an answer for an unknown request is
//! ignored. Artifacts are immutable (the id is the content's digest) and an instance has one
//! namespace, so recently saved or read contents are kept in a small cache (at most
//! [`CACHE_BYTES`]): paging through an artifact fetches it once.
//!
//! [`ToInstance::ArtifactReply`]: crate::socket::ToInstance::ArtifactReply

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::socket::ToNest;
use agen_harness::artifacts::{
    check_size, id_hex, ArtifactError, ArtifactMeta, ArtifactStore, NewArtifact,
};

/// The most artifact bytes an instance keeps cached.
pub const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// How long the Nest gets to store or fetch one artifact.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// What the Nest answered.
#[derive(Debug, Default)]
pub struct Reply {
    pub artifact: Option<ArtifactMeta>,
    pub content: Option<String>,
    pub error: Option<String>,
}

/// See the module doc. Shared by the instance's runs.
pub struct NestArtifacts {
    to_nest: mpsc::UnboundedSender<ToNest>,
    next: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    cache: Mutex<Cache>,
}

/// Contents by id, oldest first out.
#[derive(Default)]
struct Cache {
    by_id: HashMap<String, std::sync::Arc<Vec<u8>>>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Cache {
    fn get(&self, id: &str) -> Option<std::sync::Arc<Vec<u8>>> {
        self.by_id.get(id).cloned()
    }

    fn put(&mut self, id: String, content: Vec<u8>) {
        if content.len() > CACHE_BYTES || self.by_id.contains_key(&id) {
            return;
        }
        self.bytes += content.len();
        self.order.push_back(id.clone());
        self.by_id.insert(id, std::sync::Arc::new(content));
        while self.bytes > CACHE_BYTES {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(c) = self.by_id.remove(&old) {
                self.bytes -= c.len();
            }
        }
    }
}

impl NestArtifacts {
    pub fn new(to_nest: mpsc::UnboundedSender<ToNest>) -> NestArtifacts {
        NestArtifacts {
            to_nest,
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            cache: Mutex::new(Cache::default()),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the Nest's answer to the request waiting for it.
    pub fn deliver(&self, req: u64, reply: Reply) {
        let waiting = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&req);
        match waiting {
            Some(tx) => {
                let _ = tx.send(reply);
            }
            None => tracing::debug!(req, "artifact reply for no pending request; ignored"),
        }
    }

    async fn ask(&self, make: impl FnOnce(u64) -> ToNest) -> Result<Reply, ArtifactError> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(req, tx);
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&req);
        };
        if self.to_nest.send(make(req)).is_err() {
            forget();
            return Err(ArtifactError::Unavailable(
                "the connection to the nest is closed".into(),
            ));
        }
        match tokio::time::timeout(REPLY_TIMEOUT, rx).await {
            Ok(Ok(reply)) => match reply.error {
                Some(e) => Err(ArtifactError::Invalid(e)),
                None => Ok(reply),
            },
            Ok(Err(_)) => Err(ArtifactError::Unavailable(
                "the nest dropped the request".into(),
            )),
            Err(_) => {
                forget();
                Err(ArtifactError::Unavailable(format!(
                    "the nest did not answer within {}s; try again later",
                    REPLY_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

#[async_trait::async_trait]
impl ArtifactStore for NestArtifacts {
    async fn save(&self, a: NewArtifact) -> Result<ArtifactMeta, ArtifactError> {
        check_size(&a.name, a.content.len() as u64)?;
        let content = String::from_utf8(a.content)
            .map_err(|_| ArtifactError::Invalid("artifact content must be UTF-8 text".into()))?;
        let cached = content.clone().into_bytes();
        let reply = self
            .ask(|req| ToNest::PutArtifact {
                req,
                task_id: a.task_id,
                name: a.name,
                media_type: a.media_type,
                content,
            })
            .await?;
        let meta = reply.artifact.ok_or_else(|| {
            ArtifactError::Unavailable("the nest answered without the saved artifact".into())
        })?;
        self.cache().put(meta.id.clone(), cached);
        Ok(meta)
    }

    async fn read(&self, _namespace: &str, id: &str) -> Result<Vec<u8>, ArtifactError> {
        id_hex(id)?;
        if let Some(content) = self.cache().get(id) {
            return Ok(content.as_ref().clone());
        }
        let reply = self
            .ask(|req| ToNest::ReadArtifact {
                req,
                id: id.to_string(),
            })
            .await?;
        let content = reply.content.unwrap_or_default().into_bytes();
        self.cache().put(id.to_string(), content.clone());
        Ok(content)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use pretty_assertions::assert_eq;

    /// A Nest stand-in: answers each artifact request on the channel with `answer`.
    fn nest(
        mut rx: mpsc::UnboundedReceiver<ToNest>,
        store: Arc<NestArtifacts>,
        answer: impl Fn(ToNest) -> Reply + Send + 'static,
    ) {
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let req = match &msg {
                    ToNest::PutArtifact { req, .. } | ToNest::ReadArtifact { req, .. } => *req,
                    _ => continue,
                };
                store.deliver(req, answer(msg));
            }
        });
    }

    #[test]
    fn the_cache_forgets_the_oldest_past_its_budget() {
        let mut c = Cache::default();
        let third = CACHE_BYTES / 3 + 1;
        for id in ["a", "b", "c"] {
            c.put(id.into(), vec![0; third]);
        }
        assert_eq!(
            (
                c.get("a").is_some(),
                c.get("b").is_some(),
                c.get("c").is_some(),
                c.bytes
            ),
            (false, true, true, 2 * third)
        );
    }

    #[tokio::test]
    async fn saves_and_reads_go_through_the_nest_and_its_errors_reach_the_model() {
        let (tx, rx) = mpsc::unbounded_channel();
        let store = Arc::new(NestArtifacts::new(tx));
        nest(rx, store.clone(), |msg| match msg {
            ToNest::PutArtifact {
                task_id,
                name,
                media_type,
                content,
                ..
            } => Reply {
                artifact: Some(ArtifactMeta {
                    id: agen_harness::artifacts::artifact_id(content.as_bytes()),
                    name,
                    media_type,
                    size: content.len() as u64,
                    task_id,
                    created_at_ms: 1,
                }),
                ..Reply::default()
            },
            ToNest::ReadArtifact { id, .. } => Reply {
                error: Some(format!("artifact {id} not found in namespace default")),
                ..Reply::default()
            },
            _ => Reply::default(),
        });
        let meta = store
            .save(NewArtifact {
                namespace: "ignored: the nest uses the placement".into(),
                task_id: "t".into(),
                run_id: "r".into(),
                name: "n".into(),
                media_type: "text/plain".into(),
                content: b"hi".to_vec(),
            })
            .await
            .expect("saved");
        assert_eq!(
            (meta.id.as_str(), meta.size, meta.task_id.as_str()),
            (agen_harness::artifacts::artifact_id(b"hi").as_str(), 2, "t")
        );
        assert_eq!(
            store.read("default", &meta.id).await,
            Ok(b"hi".to_vec()),
            "what was just saved is read from the cache, not the nest"
        );
        let missing = agen_harness::artifacts::artifact_id(b"x");
        assert_eq!(
            store.read("default", &missing).await,
            Err(ArtifactError::Invalid(format!(
                "artifact {missing} not found in namespace default"
            )))
        );
        assert_eq!(
            store.read("default", "nope").await,
            Err(ArtifactError::BadId("nope".into())),
            "a bad id never reaches the nest"
        );
    }
}
