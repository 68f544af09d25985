//! Deployment and node lifecycle on top of `fleet`: every generation is recorded as a
//! revision (bundle digest, replicas, selector, concurrency, time, who, what made it), scaling
//! without a bundle, rollback (a new generation from an old revision), removal (recorded as
//! a last row; the history stays until the task retention); and a Nest that leaves on purpose (its instances end as stopped, not lost).
//!
//! Invariants: a revision is written before the call that made its generation returns; a
//! rollback never reuses a generation number (it makes a new one); scaling changes only the
//! replica count, so it never restarts an instance (`fleet` carries instances over).

use serde::{Deserialize, Serialize};

use crate::core::leases::Requeue;
use crate::core::State;
use crate::core::{namespace_or_default, validate_name, Core, DeploymentSpec};
use crate::error::{HubError, Result};
use crate::model::{deployment_key, now_ms, DeploymentRec, InstanceState, NestState, Registration};
use crate::store::Table;

/// One generation of a deployment as it was made (store table `deployment_history`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevisionRec {
    pub namespace: String,
    pub name: String,
    pub generation: u64,
    pub bundle_digest: String,
    pub replicas: u32,
    pub selector: std::collections::BTreeMap<String, String>,
    pub concurrency: u32,
    pub agent_name: String,
    pub created_at_ms: i64,
    /// The caller's identity (see `server`), e.g. `admin (alice@build-1)`.
    pub deployed_by: String,
    /// `deploy`, `scale`, `rollback to generation N`.
    pub change: String,
}

/// The `change` of the history row that records a removal (`agen rm`).
pub const REMOVED: &str = "removed";

/// `namespace/name \0` — the prefix of a deployment's revisions.
fn history_prefix(namespace: &str, name: &str) -> Vec<u8> {
    let mut k = deployment_key(namespace, name).into_bytes();
    k.push(0);
    k
}

/// `namespace/name \0 generation(be)`: sorts oldest first.
fn revision_key(namespace: &str, name: &str, generation: u64) -> Vec<u8> {
    let mut k = history_prefix(namespace, name);
    k.extend_from_slice(&generation.to_be_bytes());
    k
}

impl Core {
    /// Creates or rolls a deployment (as `create_deployment`) and records the generation it
    /// made, if it made one.
    pub async fn deploy_as(
        &self,
        spec: DeploymentSpec,
        who: &str,
        change: &str,
    ) -> Result<DeploymentRec> {
        let before = self.current_generation(&spec.namespace, &spec.name);
        let rec = self.create_deployment(spec).await?;
        if before != Some(rec.generation) {
            self.record_revision(&rec, who, change)?;
            self.db.flush().await?;
        }
        Ok(rec)
    }

    fn current_generation(&self, namespace: &str, name: &str) -> Option<u64> {
        let key = deployment_key(&namespace_or_default(namespace), name);
        self.lock().deployments.get(&key).map(|d| d.generation)
    }

    fn deployment_rec(&self, namespace: &str, name: &str) -> Result<DeploymentRec> {
        let namespace = namespace_or_default(namespace);
        validate_name("name", name)?;
        self.lock()
            .deployments
            .get(&deployment_key(&namespace, name))
            .cloned()
            .ok_or_else(|| {
                HubError::not_found(format!(
                    "deployment {namespace}/{name} not found; list them with agen ps"
                ))
            })
    }

    fn record_revision(&self, d: &DeploymentRec, who: &str, change: &str) -> Result<()> {
        let rev = RevisionRec {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            generation: d.generation,
            bundle_digest: d.bundle_digest.clone(),
            replicas: d.replicas,
            selector: d.selector.clone(),
            concurrency: d.concurrency,
            agent_name: d.agent_name.clone(),
            created_at_ms: now_ms(),
            deployed_by: who.to_string(),
            change: change.to_string(),
        };
        let bytes = serde_json::to_vec(&rev).map_err(|e| HubError::Internal(e.to_string()))?;
        self.db.raw().put(
            Table::DeploymentHistory,
            &revision_key(&d.namespace, &d.name, d.generation),
            &bytes,
        )?;
        Ok(())
    }

    /// Every recorded generation of a deployment, oldest first. A generation made before
    /// history was kept is shown from the deployment itself (`deployed_by` unknown). A removed
    /// deployment's history is kept until the task retention (its last row says `removed`).
    pub fn deployment_history(&self, namespace: &str, name: &str) -> Result<Vec<RevisionRec>> {
        let d = match self.deployment_rec(namespace, name) {
            Ok(d) => d,
            Err(e) => {
                let list = self.recorded_history(&namespace_or_default(namespace), name)?;
                return if list.last().is_some_and(|r| r.change == REMOVED) {
                    Ok(list)
                } else {
                    Err(e)
                };
            }
        };
        let mut list = self.recorded_history(&d.namespace, &d.name)?;
        // Rows newer than the deployment were left by an older incarnation of it (made before
        // a removal was recorded as a row of its own): drop them.
        list.retain(|r| r.generation <= d.generation);
        if !list.iter().any(|r| r.generation == d.generation) {
            list.push(RevisionRec {
                namespace: d.namespace.clone(),
                name: d.name.clone(),
                generation: d.generation,
                bundle_digest: d.bundle_digest.clone(),
                replicas: d.replicas,
                selector: d.selector.clone(),
                concurrency: d.concurrency,
                agent_name: d.agent_name.clone(),
                created_at_ms: d.updated_at_ms,
                deployed_by: "unknown (made before history was kept)".into(),
                change: "deploy".into(),
            });
        }
        Ok(list)
    }

    fn recorded_history(&self, namespace: &str, name: &str) -> Result<Vec<RevisionRec>> {
        Ok(self
            .db
            .list_json(Table::DeploymentHistory, &history_prefix(namespace, name))?)
    }

    /// The newest generation recorded for `namespace/name` (0: none): a deployment created
    /// again after `agen rm` goes on from there, so its history reads as one story.
    pub(in crate::core) fn last_recorded_generation(&self, namespace: &str, name: &str) -> u64 {
        self.recorded_history(namespace, name)
            .unwrap_or_default()
            .iter()
            .map(|r| r.generation)
            .max()
            .unwrap_or(0)
    }

    /// Removes the history of deployments removed more than `keep_ms` before `now_ms`.
    /// Returns how many rows went.
    pub(in crate::core) fn sweep_removed_history(
        &self,
        now_ms: i64,
        keep_ms: i64,
    ) -> Result<usize> {
        let raw = self.db.raw();
        let rows = raw.scan(Table::DeploymentHistory, b"")?;
        let mut removed: Vec<Vec<u8>> = Vec::new();
        for (k, v) in &rows {
            let Ok(r) = serde_json::from_slice::<RevisionRec>(v) else {
                continue;
            };
            if r.change == REMOVED && now_ms.saturating_sub(r.created_at_ms) > keep_ms {
                let prefix = history_prefix(&r.namespace, &r.name);
                let live = self
                    .lock()
                    .deployments
                    .contains_key(&deployment_key(&r.namespace, &r.name));
                if !live && k.starts_with(&prefix) {
                    removed.push(prefix);
                }
            }
        }
        let mut count = 0;
        for prefix in removed {
            for (k, _) in raw.scan(Table::DeploymentHistory, &prefix)? {
                raw.remove(Table::DeploymentHistory, &k)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// Sets the replica count; the bundle, selector and concurrency stay.
    pub async fn scale_deployment(
        &self,
        namespace: &str,
        name: &str,
        replicas: u32,
        who: &str,
    ) -> Result<DeploymentRec> {
        let d = self.deployment_rec(namespace, name)?;
        let spec = DeploymentSpec {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            bundle_digest: d.bundle_digest.clone(),
            replicas,
            selector: d.selector.clone(),
            concurrency: d.concurrency,
            resources: d.resources,
        };
        self.deploy_as(spec, who, "scale").await
    }

    /// The generation a rollback of `namespace/name` to `to` (0: the previous bundle) makes
    /// current again; the server checks that the caller may deploy its bundle first.
    pub fn rollback_target(&self, namespace: &str, name: &str, to: u64) -> Result<RevisionRec> {
        let d = self.deployment_rec(namespace, name)?;
        let history = self.deployment_history(namespace, name)?;
        let target = if to == 0 {
            history
                .iter()
                .rev()
                .filter(|r| r.change != REMOVED)
                .find(|r| r.generation < d.generation && r.bundle_digest != d.bundle_digest)
                .ok_or_else(|| {
                    HubError::FailedPrecondition(format!(
                        "deployment {}/{}: no earlier generation ran another bundle; see agen history {}",
                        d.namespace, d.name, d.name
                    ))
                })?
        } else {
            history.iter().filter(|r| r.change != REMOVED).find(|r| r.generation == to).ok_or_else(|| {
                HubError::not_found(format!(
                    "deployment {}/{}: generation {to} is not in its history (generations {}); see agen history {}",
                    d.namespace,
                    d.name,
                    history
                        .iter()
                        .map(|r| r.generation.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    d.name
                ))
            })?
        };
        Ok(target.clone())
    }

    /// Makes a new generation from generation `to` (0: the newest earlier generation that ran
    /// another bundle): its bundle, selector and concurrency, with today's replica count.
    pub async fn rollback_deployment(
        &self,
        namespace: &str,
        name: &str,
        to: u64,
        who: &str,
    ) -> Result<DeploymentRec> {
        let d = self.deployment_rec(namespace, name)?;
        let target = self.rollback_target(namespace, name, to)?;
        if self.bundle_meta(&target.bundle_digest)?.is_none() {
            return Err(HubError::FailedPrecondition(format!(
                "deployment {}/{}: the bundle {} of generation {} is no longer stored on the hub; deploy its folder again",
                d.namespace, d.name, target.bundle_digest, target.generation
            )));
        }
        let spec = DeploymentSpec {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            bundle_digest: target.bundle_digest.clone(),
            replicas: d.replicas,
            selector: target.selector.clone(),
            concurrency: target.concurrency,
            // That bundle's own `resources`.
            resources: Default::default(),
        };
        let change = format!("rollback to generation {}", target.generation);
        let rec = self.deploy_as(spec, who, &change).await?;
        tracing::info!(deployment = %rec.key(), generation = rec.generation, from = target.generation, %who, "rolled back");
        Ok(rec)
    }

    /// Deletes a deployment (as `delete_deployment`) and records its removal as the last row
    /// of its history, which stays until the task retention has passed.
    pub async fn remove_deployment(&self, namespace: &str, name: &str, who: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        let d = self.deployment_rec(&namespace, name)?;
        self.delete_deployment(&namespace, name).await?;
        let removed = DeploymentRec {
            generation: d.generation + 1,
            replicas: 0,
            ..d
        };
        self.record_revision(&removed, who, REMOVED)?;
        self.db.flush().await?;
        tracing::info!(deployment = %deployment_key(&namespace, name), %who, "deployment removed; its history stays until the task retention");
        Ok(())
    }

    /// A Nest says it is stopping on purpose: its instances end as `stopped` (their runs go
    /// back to the queue at once, to be handed over), the Nest shows as disconnected, and its
    /// link is closed (which ends its stream).
    /// A Nest told to stop drains: for at most `grace_ms` it gets no new runs and no
    /// placements while the runs it holds finish (then it leaves, or registers again).
    pub async fn nest_draining(&self, nest_id: &str, conn_id: u64, grace_ms: u64) -> Result<()> {
        {
            let mut st = self.lock();
            if !st.live.is_current(nest_id, conn_id) {
                return Ok(());
            }
            let Some(mut n) = st.nests.get(nest_id).cloned() else {
                return Ok(());
            };
            // Bounded: a Nest cannot keep itself out of dispatch longer than an hour.
            let grace = i64::try_from(grace_ms.min(3_600_000)).unwrap_or(3_600_000);
            n.draining_until_ms = now_ms() + grace;
            tracing::info!(nest = %n.name, nest_id, grace_ms, "nest draining: no new runs go to it while its runs finish");
            self.save_nest(&mut st, n)?;
        }
        self.db.flush().await?;
        self.poke();
        Ok(())
    }

    pub async fn nest_leaving(&self, nest_id: &str, conn_id: u64, reason: &str) -> Result<()> {
        {
            let mut st = self.lock();
            if !st.live.is_current(nest_id, conn_id) {
                return Ok(());
            }
            let now = now_ms();
            let name = st
                .nests
                .get(nest_id)
                .map(|n| n.name.clone())
                .unwrap_or_else(|| nest_id.to_string());
            let why = if reason.is_empty() {
                format!("nest {name} stopped")
            } else {
                format!("nest {name} stopped: {reason}")
            };
            let ids: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.nest_id == nest_id)
                .filter(|i| !matches!(i.state, InstanceState::Pending | InstanceState::Lost))
                .map(|i| i.instance_id.clone())
                .collect();
            for id in &ids {
                if let Some(mut rec) = st.instances.get(id).cloned() {
                    rec.state = InstanceState::Stopped;
                    rec.healthy = false;
                    rec.healthy_since_ms = 0;
                    rec.message = why.clone();
                    rec.updated_at_ms = now;
                    self.save_instance(&mut st, rec)?;
                    self.requeue_tasks_of(
                        &mut st,
                        id,
                        &format!("instance {id}: {why}"),
                        Requeue::NotCounted,
                    )?;
                }
            }
            if let Some(mut n) = st.nests.get(nest_id).cloned() {
                n.state = NestState::Disconnected;
                self.db.put_json(Table::Nests, nest_id, &n)?;
                st.nests.insert(nest_id.to_string(), n);
            }
            st.live.drop_link(nest_id);
            tracing::info!(nest = %name, nest_id, instances = ids.len(), "nest left gracefully");
        }
        self.db.flush().await?;
        self.poke();
        Ok(())
    }

    /// The name a registering Nest gets. A name given with `--name` is refused while another
    /// live (not lost) Nest holds it; a default name (the host name) falls back to
    /// `<host>-<hex>` when another live Nest holds it; a Nest keeps the name it has.
    pub(crate) fn nest_name_for(st: &State, reg: &Registration) -> Result<String> {
        if reg.name.is_empty() {
            return Ok(reg.nest_id.clone());
        }
        let holder = |name: &str| {
            st.nests
                .values()
                .find(|n| n.nest_id != reg.nest_id && n.name == name && n.state != NestState::Lost)
        };
        let refuse = |name: &str, other: &crate::model::NestRec| {
            HubError::FailedPrecondition(format!(
                "nest name `{name}` is held by the live nest {} (state {:?}); start this nest with another --name, or stop the other one first",
                other.nest_id, other.state
            ))
        };
        if reg.fallback_name.is_empty() {
            return match holder(&reg.name) {
                Some(other) => Err(refuse(&reg.name, other)),
                None => Ok(reg.name.clone()),
            };
        }
        if let Some(stored) = st.nests.get(&reg.nest_id) {
            let ours = stored.name == reg.name || stored.name == reg.fallback_name;
            if ours && holder(&stored.name).is_none() {
                return Ok(stored.name.clone());
            }
        }
        if holder(&reg.name).is_none() {
            return Ok(reg.name.clone());
        }
        match holder(&reg.fallback_name) {
            None => Ok(reg.fallback_name.clone()),
            Some(other) => Err(refuse(&reg.fallback_name, other)),
        }
    }
}
