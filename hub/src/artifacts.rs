//! Artifacts at the Hub: blobs saved by agents (`save_artifact`, relayed by Nests over
//! `NestService/PutArtifact`), stored content-addressed per namespace in the store, listed
//! and read by people (`ListArtifacts`, `GetArtifact`) and by agents (`ReadArtifact`).
//!
//! Invariants: an artifact's key is `(namespace, sha256:<hex> of its bytes)`, checked against
//! the bytes before anything is stored, so the same bytes in one namespace are stored once and
//! saving them again spends no quota; no artifact is larger than [`MAX_ARTIFACT_BYTES`] and no
//! namespace holds more than [`MAX_NAMESPACE_BYTES`] (checked under one lock, so concurrent
//! saves cannot pass it together); an artifact is durable (flushed) before its save is answered.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{HubError, Result};
use crate::fleet::{namespace_or_default, Core};
use crate::store::Table;

/// At most this many bytes per artifact (25 MB).
pub const MAX_ARTIFACT_BYTES: u64 = 25 * 1000 * 1000;
/// At most this many bytes of artifacts per namespace (500 MB).
pub const MAX_NAMESPACE_BYTES: u64 = 500 * 1000 * 1000;

/// Serialises saves so the quota check and the write are one step.
static SAVE_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A stored artifact's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRec {
    pub namespace: String,
    /// `sha256:<hex>` of the bytes.
    pub id: String,
    pub name: String,
    pub media_type: String,
    pub size: u64,
    /// The task that saved it (the first one, in the namespace listing).
    pub task_id: String,
    pub created_at_ms: i64,
}

fn key(parts: &[&str]) -> Vec<u8> {
    parts.join("\0").into_bytes()
}

fn check_id(id: &str) -> Result<()> {
    let ok = id.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(HubError::invalid(format!(
            "artifact_id: expected sha256:<64 lowercase hex digits>, got {id:?}"
        )))
    }
}

impl Core {
    /// Stores `bytes` as artifact `rec` (its `id` must be the bytes' digest), or finds the same
    /// bytes already stored in the namespace (then only the task index grows). Returns what is
    /// stored.
    pub async fn put_artifact(&self, rec: ArtifactRec, bytes: Vec<u8>) -> Result<ArtifactRec> {
        self.put_artifact_within(rec, bytes, MAX_NAMESPACE_BYTES)
            .await
    }

    /// [`Core::put_artifact`] with the namespace quota as a parameter (tests use a small one).
    async fn put_artifact_within(
        &self,
        mut rec: ArtifactRec,
        bytes: Vec<u8>,
        quota: u64,
    ) -> Result<ArtifactRec> {
        rec.namespace = namespace_or_default(&rec.namespace);
        crate::fleet::validate_name("namespace", &rec.namespace)?;
        if rec.name.trim().is_empty() {
            return Err(HubError::invalid(
                "artifact name: expected a short name, got an empty string",
            ));
        }
        if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
            return Err(HubError::ResourceExhausted(format!(
                "artifact {} is {} bytes, more than the limit of 25 MB per artifact; save it in smaller parts",
                rec.name,
                bytes.len()
            )));
        }
        let id = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
        if !rec.id.is_empty() && rec.id != id {
            return Err(HubError::invalid(format!(
                "artifact {}: the content's digest is {id}, not {} as announced; the upload was damaged, send it again",
                rec.name, rec.id
            )));
        }
        rec.id = id;
        rec.size = bytes.len() as u64;
        rec.created_at_ms = chrono::Utc::now().timestamp_millis();
        if rec.media_type.is_empty() {
            rec.media_type = "application/octet-stream".into();
        }
        let _guard = SAVE_LOCK.lock().await;
        let meta_key = key(&[&rec.namespace, &rec.id]);
        let stored = match self
            .db
            .get_json::<ArtifactRec>(Table::ArtifactMeta, &String::from_utf8_lossy(&meta_key))?
        {
            Some(existing) => existing,
            None => {
                let used = self.artifact_bytes_used(&rec.namespace)?;
                if used.saturating_add(rec.size) > quota {
                    return Err(HubError::ResourceExhausted(format!(
                        "namespace {} already holds {used} bytes of artifacts; {} more would pass the limit of {} MB per namespace; save less or clean up old artifacts",
                        rec.namespace, rec.size, quota / 1_000_000
                    )));
                }
                self.db.raw().put(Table::ArtifactData, &meta_key, &bytes)?;
                self.db.put_json(
                    Table::ArtifactMeta,
                    &String::from_utf8_lossy(&meta_key),
                    &rec,
                )?;
                rec.clone()
            }
        };
        if !rec.task_id.is_empty() {
            let task_key = key(&[&rec.namespace, &rec.task_id, &rec.id]);
            let for_task = ArtifactRec {
                task_id: rec.task_id.clone(),
                created_at_ms: rec.created_at_ms,
                name: rec.name.clone(),
                media_type: rec.media_type.clone(),
                ..stored.clone()
            };
            let bytes =
                serde_json::to_vec(&for_task).map_err(|e| HubError::Internal(e.to_string()))?;
            self.db
                .raw()
                .insert_if_absent(Table::ArtifactTasks, &task_key, &bytes)?;
        }
        self.db.flush().await?;
        Ok(stored)
    }

    /// Bytes of artifacts stored in `namespace`.
    pub(crate) fn artifact_bytes_used(&self, namespace: &str) -> Result<u64> {
        let mut prefix = namespace.as_bytes().to_vec();
        prefix.push(0);
        Ok(self
            .db
            .list_json::<ArtifactRec>(Table::ArtifactMeta, &prefix)?
            .iter()
            .map(|a| a.size)
            .sum())
    }

    /// The artifacts of `namespace`, or those `task_id` saved, oldest first.
    pub fn list_artifacts(&self, namespace: &str, task_id: &str) -> Result<Vec<ArtifactRec>> {
        let namespace = namespace_or_default(namespace);
        let mut list: Vec<ArtifactRec> = if task_id.is_empty() {
            let mut prefix = namespace.as_bytes().to_vec();
            prefix.push(0);
            self.db.list_json(Table::ArtifactMeta, &prefix)?
        } else {
            self.get_task(&namespace, task_id)?;
            let mut prefix = key(&[&namespace, task_id]);
            prefix.push(0);
            self.db.list_json(Table::ArtifactTasks, &prefix)?
        };
        list.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(list)
    }

    /// One artifact of `namespace` and its bytes.
    pub fn artifact(&self, namespace: &str, id: &str) -> Result<(ArtifactRec, Vec<u8>)> {
        let namespace = namespace_or_default(namespace);
        check_id(id)?;
        let k = key(&[&namespace, id]);
        let not_found = || {
            HubError::not_found(format!(
                "artifact {id} not found in namespace {namespace}; list them with agen artifacts ls"
            ))
        };
        let rec = self
            .db
            .get_json::<ArtifactRec>(Table::ArtifactMeta, &String::from_utf8_lossy(&k))?
            .ok_or_else(not_found)?;
        let bytes = self
            .db
            .raw()
            .get(Table::ArtifactData, &k)?
            .ok_or_else(not_found)?;
        Ok((rec, bytes))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use pretty_assertions::assert_eq;

    use super::*;
    use crate::config::HubOptions;
    use crate::secrets::SecretKey;
    use crate::store::{Db, SledStore};

    fn core(dir: &std::path::Path) -> Arc<Core> {
        let store = SledStore::open(&dir.join("db")).unwrap();
        let key = SecretKey::load_or_create(&dir.join("secret.key")).unwrap();
        Core::open(HubOptions::default(), Db::new(Arc::new(store)), key).unwrap()
    }

    fn rec(ns: &str, name: &str) -> ArtifactRec {
        ArtifactRec {
            namespace: ns.into(),
            id: String::new(),
            name: name.into(),
            media_type: "text/plain".into(),
            size: 0,
            task_id: String::new(),
            created_at_ms: 0,
        }
    }

    #[tokio::test]
    async fn the_same_bytes_are_stored_once_per_namespace_and_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path());
        let a = core
            .put_artifact(rec("default", "a"), b"hello".to_vec())
            .await
            .unwrap();
        assert_eq!(a.id, agen_shared::bundle::digest(b"hello"));
        let again = core
            .put_artifact(rec("default", "b"), b"hello".to_vec())
            .await
            .unwrap();
        assert_eq!(again, a, "the first save's record is kept");
        core.put_artifact(rec("other", "a"), b"hello".to_vec())
            .await
            .unwrap();
        assert_eq!(core.list_artifacts("default", "").unwrap(), vec![a.clone()]);
        assert_eq!(core.artifact("default", &a.id).unwrap().1, b"hello");
        let missing = agen_shared::bundle::digest(b"nope");
        let err = core.artifact("default", &missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("artifact {missing} not found in namespace default; list them with agen artifacts ls")
        );
        assert!(matches!(
            core.artifact("default", "../x"),
            Err(HubError::InvalidArgument(_))
        ));
    }

    #[tokio::test]
    async fn a_damaged_upload_and_the_limits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path());
        let mut wrong = rec("default", "a");
        wrong.id = agen_shared::bundle::digest(b"other bytes");
        assert!(matches!(
            core.put_artifact(wrong, b"hello".to_vec()).await,
            Err(HubError::InvalidArgument(_))
        ));
        let big = vec![0u8; MAX_ARTIFACT_BYTES as usize + 1];
        assert!(matches!(
            core.put_artifact(rec("default", "big"), big).await,
            Err(HubError::ResourceExhausted(_))
        ));

        // The namespace quota counts distinct bytes only.
        core.put_artifact_within(rec("default", "a"), vec![1; 600_000], 1_000_000)
            .await
            .unwrap();
        core.put_artifact_within(rec("default", "a2"), vec![1; 600_000], 1_000_000)
            .await
            .unwrap();
        let err = core
            .put_artifact_within(rec("default", "b"), vec![2; 600_000], 1_000_000)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "namespace default already holds 600000 bytes of artifacts; 600000 more would pass the limit of 1 MB per namespace; save less or clean up old artifacts"
        );
        core.put_artifact_within(rec("other", "b"), vec![2; 600_000], 1_000_000)
            .await
            .unwrap();
    }
}
