//! Artifacts at the Hub: blobs saved by agents (`save_artifact`, relayed by Nests over
//! `NestService/PutArtifact`), stored content-addressed per namespace in the store, listed
//! and read by people (`ListArtifacts`, `GetArtifact`) and by agents (`ReadArtifact`).
//!
//! Invariants: an artifact's key is `(namespace, sha256:<hex> of its bytes)`, checked against
//! the bytes before anything is stored, so the same bytes in one namespace are stored once and
//! saving them again spends no quota; no artifact is larger than [`MAX_ARTIFACT_BYTES`], no
//! namespace holds more than `limits.artifact_namespace_bytes` and all of them together no more
//! than `limits.artifact_total_bytes` (checked under [`Core::artifact_usage`], so concurrent
//! saves cannot pass a quota together); an artifact is durable (flushed) before its save is
//! answered. A Nest saves only for a task it runs now and only into that task's namespace, and
//! reads only in a namespace where it runs a task now ([`Core::check_nest_artifact_put`],
//! [`Core::check_nest_artifact_read`]), so no namespace comes into being by an artifact.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::core::{namespace_or_default, Core};
use crate::error::{HubError, Result};
use crate::model::TaskState;
use crate::store::Table;

/// At most this many bytes per artifact (25 MB).
pub const MAX_ARTIFACT_BYTES: u64 = 25 * 1000 * 1000;

/// Artifact bytes stored, per namespace and in all; `None` until first counted from the store.
pub(crate) type UsageLock = tokio::sync::Mutex<Option<Usage>>;

#[derive(Debug, Default)]
pub(crate) struct Usage {
    by_namespace: std::collections::HashMap<String, u64>,
    total: u64,
}

/// The two quotas a save is checked against.
#[derive(Debug, Clone, Copy)]
struct Quotas {
    namespace: u64,
    total: u64,
}

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
        let quotas = Quotas {
            namespace: self.opts.limits.artifact_namespace_bytes,
            total: self.opts.limits.artifact_total_bytes,
        };
        self.put_artifact_within(rec, bytes, quotas).await
    }

    /// Refuses a Nest's save unless it runs `task_id` now (the current, unrevoked attempt was
    /// sent to it) and the task is in `namespace`. `nest_id` is `None` only on a plaintext
    /// loopback Hub, where Nests have no certificate: any Nest running the task may save.
    pub fn check_nest_artifact_put(
        &self,
        nest_id: Option<&str>,
        namespace: &str,
        task_id: &str,
    ) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        let runs_it = st.tasks.get(task_id).is_some_and(|t| {
            t.namespace == namespace
                && t.state == TaskState::Running
                && !t.lease.revoked
                && nest_id.is_none_or(|n| t.lease.nest_id == n)
        });
        if runs_it {
            Ok(())
        } else {
            Err(HubError::PermissionDenied(format!(
                "artifact for task `{}` in namespace {namespace}: this nest does not run that task now; a nest saves artifacts only for the runs the hub assigned it",
                crate::limits::prefix(task_id)
            )))
        }
    }

    /// Refuses a Nest's read unless it runs a task of `namespace` now (see
    /// [`Core::check_nest_artifact_put`] for `None`).
    pub fn check_nest_artifact_read(&self, nest_id: Option<&str>, namespace: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        let runs_there = st.tasks.live().any(|t| {
            t.namespace == namespace
                && t.state == TaskState::Running
                && !t.lease.revoked
                && nest_id.is_none_or(|n| t.lease.nest_id == n)
        });
        if runs_there {
            Ok(())
        } else {
            Err(HubError::PermissionDenied(format!(
                "artifacts of namespace {}: this nest runs no task there now; a nest reads artifacts only for the runs the hub assigned it",
                crate::limits::prefix(&namespace)
            )))
        }
    }

    /// [`Core::put_artifact`] with the quotas as a parameter (tests use small ones).
    async fn put_artifact_within(
        &self,
        mut rec: ArtifactRec,
        bytes: Vec<u8>,
        quotas: Quotas,
    ) -> Result<ArtifactRec> {
        rec.namespace = namespace_or_default(&rec.namespace);
        crate::core::validate_name("namespace", &rec.namespace)?;
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
        let mut usage = self.artifact_usage.lock().await;
        if usage.is_none() {
            *usage = Some(self.count_artifact_bytes()?);
        }
        let Some(usage) = usage.as_mut() else {
            return Err(HubError::Internal("artifact usage was not counted".into()));
        };
        let meta_key = key(&[&rec.namespace, &rec.id]);
        let stored = match self
            .db
            .get_json::<ArtifactRec>(Table::ArtifactMeta, &String::from_utf8_lossy(&meta_key))?
        {
            Some(existing) => existing,
            None => {
                let used = usage.by_namespace.get(&rec.namespace).copied().unwrap_or(0);
                if used.saturating_add(rec.size) > quotas.namespace {
                    return Err(HubError::ResourceExhausted(format!(
                        "namespace {} already holds {used} bytes of artifacts; {} more would pass the limit of {} MB per namespace; save less or clean up old artifacts",
                        rec.namespace, rec.size, quotas.namespace / 1_000_000
                    )));
                }
                if usage.total.saturating_add(rec.size) > quotas.total {
                    return Err(HubError::ResourceExhausted(format!(
                        "the hub already holds {} bytes of artifacts in all namespaces; {} more would pass its limit of {} MB (agen hub --max-artifact-total-bytes); save less or clean up old artifacts",
                        usage.total, rec.size, quotas.total / 1_000_000
                    )));
                }
                self.db.raw().put(Table::ArtifactData, &meta_key, &bytes)?;
                self.db.put_json(
                    Table::ArtifactMeta,
                    &String::from_utf8_lossy(&meta_key),
                    &rec,
                )?;
                *usage.by_namespace.entry(rec.namespace.clone()).or_default() += rec.size;
                usage.total += rec.size;
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

    /// Bytes of artifacts stored, per namespace and in all, counted from the store.
    fn count_artifact_bytes(&self) -> Result<Usage> {
        let mut usage = Usage::default();
        for a in self.db.list_json::<ArtifactRec>(Table::ArtifactMeta, b"")? {
            *usage.by_namespace.entry(a.namespace).or_default() += a.size;
            usage.total += a.size;
        }
        Ok(usage)
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

    fn core(dir: &std::path::Path) -> Arc<Core> {
        crate::core::test_core(dir)
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
        let quotas = Quotas {
            namespace: 1_000_000,
            total: 1_500_000,
        };
        core.put_artifact_within(rec("default", "a"), vec![1; 600_000], quotas)
            .await
            .unwrap();
        core.put_artifact_within(rec("default", "a2"), vec![1; 600_000], quotas)
            .await
            .unwrap();
        let err = core
            .put_artifact_within(rec("default", "b"), vec![2; 600_000], quotas)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "namespace default already holds 600000 bytes of artifacts; 600000 more would pass the limit of 1 MB per namespace; save less or clean up old artifacts"
        );
        core.put_artifact_within(rec("other", "b"), vec![2; 600_000], quotas)
            .await
            .unwrap();

        // All namespaces together: 1.2 MB stored, 0.6 MB more would pass 1.5 MB.
        let err = core
            .put_artifact_within(rec("third", "c"), vec![3; 600_000], quotas)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the hub already holds 1200000 bytes of artifacts in all namespaces; 600000 more would pass its limit of 1 MB (agen hub --max-artifact-total-bytes); save less or clean up old artifacts"
        );
        // A Hub that starts again counts what is stored.
        drop(core);
        let core = super::tests::core(dir.path());
        let err = core
            .put_artifact_within(rec("third", "c"), vec![3; 600_000], quotas)
            .await
            .unwrap_err();
        assert!(matches!(err, HubError::ResourceExhausted(_)), "{err}");
    }
}
