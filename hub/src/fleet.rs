//! The Hub's core state and the fleet part of it: deployments, bundles, Nests, instances, and
//! the reconcile loop that keeps every deployment at its replica count (placement through the
//! pure `scheduler`, liveness through `nodes`). Task queueing and dispatch are in `tasks`.
//!
//! Invariants: every change is written to the store before it is visible to callers; the
//! state lock is never held across an `.await`; after a Hub boot nothing is placed until every
//! previously known Nest has re-registered or a full ttl has passed (the reconcile window);
//! replacing an unhealthy instance always creates a new instance id; a placement carries the
//! values of exactly the `platform` secrets its bundle declares, from its own namespace; a
//! rollover does not stop an instance of the old bundle version while a run of that version
//! is running or queued to resume (it drains; a run resumes only on its own version).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{broadcast, Notify};

use crate::config::HubOptions;
use crate::error::{HubError, Result};
use crate::leases::Requeue;
use crate::model::*;
use crate::nodes::{Liveness, NestTx, ToNest};
use crate::scheduler::{self, InstView, NestView};
use crate::secrets::{self, SecretKey, SecretMeta, SecretStore, SecretValues};
use crate::store::{Db, Table};
use crate::tasks::TaskUpdate;

/// Longest replica count a deployment may ask for.
pub const MAX_REPLICAS: u32 = 1000;
/// An instance healthy for this long resets its deployment's failure count.
const STABLE_MS: i64 = 30_000;
/// Lost instances stay visible this long.
const LOST_RETENTION_MS: i64 = 10 * 60_000;
/// A stopping instance the Nest never confirms is forgotten after this long.
const STOPPING_RETENTION_MS: i64 = 60_000;

/// A deployment's desired state, as asked by a client.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSpec {
    pub namespace: String,
    pub name: String,
    pub bundle_digest: String,
    pub replicas: u32,
    pub selector: BTreeMap<String, String>,
    pub concurrency: u32,
}

/// A deployment with its ready replica count.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentView {
    pub rec: DeploymentRec,
    pub ready_replicas: u32,
}

pub(crate) struct State {
    pub deployments: BTreeMap<String, DeploymentRec>,
    pub nests: BTreeMap<String, NestRec>,
    pub instances: BTreeMap<String, InstanceRec>,
    pub tasks: HashMap<String, TaskRec>,
    pub live: Liveness,
    pub boot: Instant,
    /// Nests known (not lost) at boot that have not re-registered yet.
    pub awaiting: HashSet<String>,
}

/// The Hub's state and behaviour, shared by the gRPC services and the reconcile loop.
pub struct Core {
    pub opts: HubOptions,
    pub(crate) db: Db,
    state: Mutex<State>,
    pub(crate) wake: Notify,
    pub(crate) updates: broadcast::Sender<TaskUpdate>,
    /// Cancelled when the Hub stops: long-lived streams (watchers) end.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// Whether the store can write (gRPC health follows it).
    pub(crate) store_ok: tokio::sync::watch::Sender<bool>,
    /// Values of `platform` secrets, sealed.
    secrets: SecretStore,
    /// The `platform` secrets each bundle declares, by digest (read from the bundle once).
    bundle_secrets: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// `limits.maxAttempts` of each bundle, by digest (read from the bundle once).
    bundle_max_attempts: Mutex<HashMap<String, u32>>,
    /// `permissions` of each bundle's `x-agen/config.json`, by digest (read once).
    pub(crate) bundle_permissions: Mutex<HashMap<String, agen_shared::bundle::Permissions>>,
    /// Artifact bytes stored per namespace and in all, counted once from the store; holding it
    /// makes a quota check and its write one step.
    pub(crate) artifact_usage: crate::artifacts::UsageLock,
}

pub(crate) use crate::limits::validate_name;

pub(crate) fn namespace_or_default(ns: &str) -> String {
    if ns.is_empty() {
        "default".to_string()
    } else {
        ns.to_string()
    }
}

fn short_id() -> String {
    hex::encode(rand::random::<[u8; 4]>())
}

impl Core {
    /// Loads every record from the store; Nests start disconnected with fresh liveness clocks.
    pub fn open(opts: HubOptions, db: Db, secret_key: SecretKey) -> Result<Arc<Core>> {
        let deployments: Vec<DeploymentRec> = db.list_json(Table::Deployments, b"")?;
        let mut nests: Vec<NestRec> = db.list_json(Table::Nests, b"")?;
        let instances: Vec<InstanceRec> = db.list_json(Table::Instances, b"")?;
        let tasks: Vec<TaskRec> = db.list_json(Table::Tasks, b"")?;
        let mut awaiting = HashSet::new();
        for n in nests.iter_mut() {
            if n.state != NestState::Lost {
                n.state = NestState::Disconnected;
                awaiting.insert(n.nest_id.clone());
            }
        }
        let live = Liveness::new(awaiting.iter().cloned());
        let (updates, _) = broadcast::channel(4096);
        tracing::info!(
            deployments = deployments.len(),
            nests = nests.len(),
            instances = instances.len(),
            tasks = tasks.len(),
            "hub state loaded"
        );
        Ok(Arc::new(Core {
            opts,
            state: Mutex::new(State {
                deployments: deployments.into_iter().map(|d| (d.key(), d)).collect(),
                nests: nests.into_iter().map(|n| (n.nest_id.clone(), n)).collect(),
                instances: instances
                    .into_iter()
                    .map(|i| (i.instance_id.clone(), i))
                    .collect(),
                tasks: tasks.into_iter().map(|t| (t.task_id.clone(), t)).collect(),
                live,
                boot: Instant::now(),
                awaiting,
            }),
            wake: Notify::new(),
            updates,
            stopping: tokio_util::sync::CancellationToken::new(),
            store_ok: tokio::sync::watch::Sender::new(true),
            secrets: SecretStore::new(db.clone(), secret_key),
            artifact_usage: Default::default(),
            bundle_permissions: Default::default(),
            db,
            bundle_secrets: Mutex::new(HashMap::new()),
            bundle_max_attempts: Mutex::new(HashMap::new()),
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough state: keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the reconcile loop to run now.
    pub fn poke(&self) {
        self.wake.notify_one();
    }

    /// Makes every earlier store write durable (group commit), then sends the Nest messages
    /// that waited for it (run assignments: a Nest never hears of a run the store could
    /// forget).
    pub(crate) async fn commit(&self) -> Result<()> {
        let upto = self.lock().live.mark();
        self.db.flush().await?;
        self.lock().live.release(upto);
        Ok(())
    }

    pub(crate) fn save_instance(&self, st: &mut State, rec: InstanceRec) -> Result<()> {
        self.db.put_json(Table::Instances, &rec.instance_id, &rec)?;
        st.instances.insert(rec.instance_id.clone(), rec);
        Ok(())
    }

    fn delete_instance(&self, st: &mut State, id: &str) -> Result<()> {
        self.db.remove(Table::Instances, id)?;
        st.instances.remove(id);
        Ok(())
    }

    fn save_deployment(&self, st: &mut State, rec: DeploymentRec) -> Result<()> {
        self.db.put_json(Table::Deployments, &rec.key(), &rec)?;
        st.deployments.insert(rec.key(), rec);
        Ok(())
    }

    fn save_nest(&self, st: &mut State, rec: NestRec) -> Result<()> {
        self.db.put_json(Table::Nests, &rec.nest_id, &rec)?;
        st.nests.insert(rec.nest_id.clone(), rec);
        Ok(())
    }

    // ---------- bundles ----------

    /// Stores a validated bundle; returns whether it was already present.
    pub fn put_bundle(&self, digest: &str, bytes: &[u8], agent_name: &str) -> Result<bool> {
        if self
            .db
            .get_json::<BundleMeta>(Table::BundleMeta, digest)?
            .is_some()
        {
            return Ok(true);
        }
        self.db
            .raw()
            .put(Table::BundleData, digest.as_bytes(), bytes)?;
        let meta = BundleMeta {
            digest: digest.to_string(),
            size: bytes.len() as u64,
            agent_name: agent_name.to_string(),
            uploaded_at_ms: now_ms(),
        };
        self.db.put_json(Table::BundleMeta, digest, &meta)?;
        Ok(false)
    }

    pub fn bundle_meta(&self, digest: &str) -> Result<Option<BundleMeta>> {
        Ok(self.db.get_json(Table::BundleMeta, digest)?)
    }

    pub fn bundle_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.db.raw().get(Table::BundleData, digest.as_bytes())?)
    }

    // ---------- deployments ----------

    /// Creates a deployment or updates it (a new generation when anything changed).
    pub async fn create_deployment(&self, spec: DeploymentSpec) -> Result<DeploymentRec> {
        let namespace = namespace_or_default(&spec.namespace);
        validate_name("namespace", &namespace)?;
        validate_name("name", &spec.name)?;
        if spec.replicas > MAX_REPLICAS {
            return Err(HubError::invalid(format!(
                "replicas: {} is too many; expected 0 to {MAX_REPLICAS}",
                spec.replicas
            )));
        }
        if spec.concurrency > 1000 {
            return Err(HubError::invalid(format!(
                "concurrency: {} is too many; expected 0 (default 1) to 1000",
                spec.concurrency
            )));
        }
        for (k, v) in &spec.selector {
            if k.is_empty() {
                return Err(HubError::invalid(format!(
                    "selector: empty label name (value `{v}`); expected k=v pairs"
                )));
            }
        }
        if spec.bundle_digest.is_empty() {
            return Err(HubError::invalid(
                "bundle_digest: expected the sha256:<hex> digest of an uploaded bundle",
            ));
        }
        let meta = self.bundle_meta(&spec.bundle_digest)?.ok_or_else(|| {
            HubError::FailedPrecondition(format!(
                "bundle {} is not uploaded; upload it with UploadBundle (agen deploy does) before creating the deployment",
                spec.bundle_digest
            ))
        })?;
        let concurrency = spec.concurrency.max(1);
        let now = now_ms();
        let rec = {
            let mut st = self.lock();
            let key = deployment_key(&namespace, &spec.name);
            let rec = match st.deployments.get(&key) {
                Some(old) => {
                    let changed = old.bundle_digest != spec.bundle_digest
                        || old.replicas != spec.replicas
                        || old.selector != spec.selector
                        || old.concurrency != concurrency;
                    if !changed {
                        return Ok(old.clone());
                    }
                    let mut rec = old.clone();
                    if old.bundle_digest != spec.bundle_digest {
                        rec.failures = 0;
                        rec.backoff_until_ms = 0;
                        rec.last_failure.clear();
                    }
                    rec.bundle_digest = spec.bundle_digest.clone();
                    rec.replicas = spec.replicas;
                    rec.selector = spec.selector.clone();
                    rec.concurrency = concurrency;
                    rec.generation += 1;
                    rec.updated_at_ms = now;
                    rec.agent_name = meta.agent_name.clone();
                    rec
                }
                None => DeploymentRec {
                    namespace: namespace.clone(),
                    name: spec.name.clone(),
                    bundle_digest: spec.bundle_digest.clone(),
                    replicas: spec.replicas,
                    selector: spec.selector.clone(),
                    concurrency,
                    generation: 1,
                    created_at_ms: now,
                    updated_at_ms: now,
                    agent_name: meta.agent_name.clone(),
                    failures: 0,
                    backoff_until_ms: 0,
                    last_failure: String::new(),
                },
            };
            if let Some(old) = st.deployments.get(&key).cloned() {
                self.carry_over_instances(&mut st, &old, &rec)?;
            }
            self.save_deployment(&mut st, rec.clone())?;
            rec
        };
        self.commit().await?;
        tracing::info!(deployment = %rec.key(), generation = rec.generation, digest = %rec.bundle_digest, "deployment saved");
        self.poke();
        Ok(rec)
    }

    /// A new generation that changes neither the bundle nor the concurrency does not need new
    /// instances: those of the old generation whose Nest still matches the selector move to the
    /// new one (so scaling never restarts anything).
    fn carry_over_instances(
        &self,
        st: &mut State,
        old: &DeploymentRec,
        new: &DeploymentRec,
    ) -> Result<()> {
        if old.bundle_digest != new.bundle_digest || old.concurrency != new.concurrency {
            return Ok(());
        }
        let ids: Vec<String> = st
            .instances
            .values()
            .filter(|i| {
                i.namespace == new.namespace
                    && i.deployment == new.name
                    && i.generation == old.generation
            })
            .filter(|i| {
                i.state == InstanceState::Pending
                    || st
                        .nests
                        .get(&i.nest_id)
                        .is_some_and(|n| scheduler::matches(&new.selector, &n.labels))
            })
            .map(|i| i.instance_id.clone())
            .collect();
        for id in ids {
            if let Some(mut rec) = st.instances.get(&id).cloned() {
                rec.generation = new.generation;
                self.save_instance(st, rec)?;
            }
        }
        Ok(())
    }

    fn ready_replicas(st: &State, d: &DeploymentRec) -> u32 {
        st.instances
            .values()
            .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
            .filter(|i| {
                i.state == InstanceState::Running && i.healthy && i.generation == d.generation
            })
            .count() as u32
    }

    pub fn get_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(DeploymentView, Vec<InstanceRec>)> {
        let namespace = namespace_or_default(namespace);
        validate_name("name", name)?;
        let st = self.lock();
        let d = st
            .deployments
            .get(&deployment_key(&namespace, name))
            .ok_or_else(|| {
                HubError::not_found(format!("deployment {namespace}/{name} not found"))
            })?;
        let instances = st
            .instances
            .values()
            .filter(|i| i.namespace == namespace && i.deployment == name)
            .cloned()
            .collect();
        Ok((
            DeploymentView {
                ready_replicas: Self::ready_replicas(&st, d),
                rec: d.clone(),
            },
            instances,
        ))
    }

    pub fn list_deployments(&self, namespace: &str, all: bool) -> Vec<DeploymentView> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        st.deployments
            .values()
            .filter(|d| all || d.namespace == namespace)
            .map(|d| DeploymentView {
                ready_replicas: Self::ready_replicas(&st, d),
                rec: d.clone(),
            })
            .collect()
    }

    /// Deletes a deployment: its instances are stopped and its queued tasks fail.
    pub async fn delete_deployment(&self, namespace: &str, name: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        validate_name("name", name)?;
        {
            let mut st = self.lock();
            let key = deployment_key(&namespace, name);
            if !st.deployments.contains_key(&key) {
                return Err(HubError::not_found(format!(
                    "deployment {namespace}/{name} not found"
                )));
            }
            self.db.remove(Table::Deployments, &key)?;
            st.deployments.remove(&key);
            let ids: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.namespace == namespace && i.deployment == name)
                .map(|i| i.instance_id.clone())
                .collect();
            for id in ids {
                self.stop_instance(&mut st, &id, "deployment deleted")?;
            }
            self.fail_tasks_of_deployment(&mut st, &namespace, name)?;
        }
        self.commit().await?;
        tracing::info!(deployment = %format!("{namespace}/{name}"), "deployment deleted");
        self.poke();
        Ok(())
    }

    /// Stops an instance: a pending one is simply forgotten, a placed one is asked to stop.
    pub(crate) fn stop_instance(&self, st: &mut State, id: &str, reason: &str) -> Result<()> {
        let Some(mut rec) = st.instances.get(id).cloned() else {
            return Ok(());
        };
        match rec.state {
            InstanceState::Pending | InstanceState::Lost | InstanceState::Stopped => {
                self.delete_instance(st, id)
            }
            InstanceState::Stopping => Ok(()),
            _ => {
                st.live.send(
                    &rec.nest_id,
                    ToNest::Stop {
                        instance_id: id.to_string(),
                        reason: reason.to_string(),
                    },
                );
                rec.state = InstanceState::Stopping;
                rec.healthy = false;
                rec.message = reason.to_string();
                rec.updated_at_ms = now_ms();
                self.save_instance(st, rec)?;
                // Replacing an unhealthy instance (a tool server died) is its own failure;
                // any other stop is the Hub's choice and costs the run no attempt.
                let cause = if reason.starts_with("unhealthy") {
                    Requeue::InstanceFailed
                } else {
                    Requeue::NotCounted
                };
                self.requeue_tasks_of(st, id, &format!("instance {id} stopped: {reason}"), cause)
            }
        }
    }

    // ---------- instances and nests ----------

    pub fn list_instances(&self, namespace: &str, deployment: &str, all: bool) -> Vec<InstanceRec> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        st.instances
            .values()
            .filter(|i| all || i.namespace == namespace)
            .filter(|i| deployment.is_empty() || i.deployment == deployment)
            .cloned()
            .collect()
    }

    /// Every Nest with the number of instances placed on it.
    pub fn list_nests(&self) -> Vec<(NestRec, u32)> {
        let st = self.lock();
        st.nests
            .values()
            .map(|n| {
                let count = st
                    .instances
                    .values()
                    .filter(|i| {
                        i.nest_id == n.nest_id
                            && !matches!(i.state, InstanceState::Lost | InstanceState::Pending)
                    })
                    .count() as u32;
                (n.clone(), count)
            })
            .collect()
    }

    /// A Nest (re)registers: re-adopt what it still runs, stop what is unknown or unwanted.
    /// Returns the connection id of its new link; `Registered` is already queued on `tx`.
    pub async fn register(&self, reg: Registration, tx: NestTx) -> Result<u64> {
        if reg.nest_id.is_empty() {
            return Err(HubError::invalid(
                "register.nest_id: expected the nest's stable id, got an empty string",
            ));
        }
        let conn_id = {
            let mut st = self.lock();
            let now = now_ms();
            let registered_at_ms = st
                .nests
                .get(&reg.nest_id)
                .map(|n| n.registered_at_ms)
                .unwrap_or(now);
            let name = Self::nest_name_for(&st, &reg)?;
            let cordoned = st.nests.get(&reg.nest_id).is_some_and(|n| n.cordoned);
            let nest = NestRec {
                nest_id: reg.nest_id.clone(),
                name,
                labels: reg.labels.clone(),
                capacity: if reg.capacity == 0 { 32 } else { reg.capacity },
                version: reg.version.clone(),
                state: NestState::Ready,
                last_heartbeat_ms: now,
                registered_at_ms,
                cordoned,
            };
            let nest_name = nest.name.clone();
            self.save_nest(&mut st, nest)?;
            let conn_id = st.live.connect(&reg.nest_id, tx.clone());
            st.awaiting.remove(&reg.nest_id);

            let mut stop = Vec::new();
            let reported: HashSet<&str> = reg
                .instances
                .iter()
                .map(|r| r.instance_id.as_str())
                .collect();
            for r in &reg.instances {
                let adopt = st.instances.get(&r.instance_id).is_some_and(|i| {
                    !matches!(i.state, InstanceState::Lost | InstanceState::Stopping)
                        && (i.nest_id.is_empty() || i.nest_id == reg.nest_id)
                        && st
                            .deployments
                            .contains_key(&deployment_key(&i.namespace, &i.deployment))
                });
                if adopt {
                    if let Some(mut rec) = st.instances.get(&r.instance_id).cloned() {
                        rec.nest_id = reg.nest_id.clone();
                        rec.nest_name = nest_name.clone();
                        apply_report(&mut rec, r);
                        self.save_instance(&mut st, rec)?;
                    }
                } else {
                    stop.push(r.instance_id.clone());
                    if let Some(i) = st.instances.get(&r.instance_id) {
                        if i.state == InstanceState::Lost {
                            self.delete_instance(&mut st, &r.instance_id)?;
                        }
                    }
                }
            }
            // What the Hub placed on this Nest that it no longer runs is gone.
            let gone: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.nest_id == reg.nest_id && !reported.contains(i.instance_id.as_str()))
                .filter(|i| !matches!(i.state, InstanceState::Pending | InstanceState::Lost))
                .map(|i| i.instance_id.clone())
                .collect();
            for id in gone {
                let is_stopping = st.instances.get(&id).is_some_and(|i| {
                    matches!(i.state, InstanceState::Stopping | InstanceState::Stopped)
                });
                if !is_stopping {
                    // Its runs go back to the queue; the record itself is debris (the Nest
                    // restarted without it), so the reconcile loop replaces it instead of
                    // showing it as lost.
                    self.mark_lost(
                        &mut st,
                        &id,
                        &format!("nest {nest_name} re-registered without it"),
                    )?;
                }
                self.delete_instance(&mut st, &id)?;
            }
            tracing::info!(nest = %nest_name, nest_id = %reg.nest_id, adopted = reg.instances.len() - stop.len(), stopped = stop.len(), "nest registered");
            let _ = tx.send(ToNest::Registered {
                nest_id: reg.nest_id.clone(),
                heartbeat_interval_ms: self
                    .opts
                    .heartbeat_interval
                    .as_millis()
                    .min(u32::MAX as u128) as u32,
                stop_instances: stop,
                disconnect_grace_ms: self
                    .opts
                    .nest_disconnect_grace
                    .as_millis()
                    .min(u32::MAX as u128) as u32,
            });
            // After `Registered`, so that a cancel reaches a registered Nest.
            self.reconcile_runs(&mut st, &reg.nest_id, &reg.instances, now)?;
            conn_id
        };
        self.commit().await?;
        self.poke();
        Ok(conn_id)
    }

    /// Ends every Nest stream (Hub shutdown).
    pub fn close_links(&self) {
        self.stopping.cancel();
        let mut st = self.lock();
        let ids: Vec<String> = st.nests.keys().cloned().collect();
        for id in ids {
            st.live.drop_link(&id);
        }
    }

    /// A Nest's stream ended.
    pub fn disconnect(&self, nest_id: &str, conn_id: u64) {
        let mut st = self.lock();
        if st.live.disconnect(nest_id, conn_id) {
            if let Some(mut n) = st.nests.get(nest_id).cloned() {
                if n.state == NestState::Ready {
                    n.state = NestState::Disconnected;
                    if let Err(e) = self.save_nest(&mut st, n) {
                        tracing::warn!(error = %e, "cannot record nest disconnect");
                    }
                }
            }
            tracing::info!(nest_id, "nest disconnected");
        }
    }

    /// A heartbeat (with the instances it carries).
    pub fn heartbeat(&self, nest_id: &str, conn_id: u64, reports: &[InstanceReport]) -> Result<()> {
        {
            let mut st = self.lock();
            if !st.live.is_current(nest_id, conn_id) {
                return Ok(());
            }
            st.live.seen(nest_id);
            if let Some(mut n) = st.nests.get(nest_id).cloned() {
                n.last_heartbeat_ms = now_ms();
                n.state = NestState::Ready;
                // Heartbeats are frequent: keep them in memory, persist only state changes.
                st.nests.insert(n.nest_id.clone(), n);
            }
            for r in reports {
                self.apply_instance_report(&mut st, nest_id, r)?;
            }
            // A heartbeat lists every instance the Nest runs: stopped ones are gone.
            let reported: HashSet<&str> = reports.iter().map(|r| r.instance_id.as_str()).collect();
            let gone: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.nest_id == nest_id && i.state == InstanceState::Stopping)
                .filter(|i| !reported.contains(i.instance_id.as_str()))
                .map(|i| i.instance_id.clone())
                .collect();
            for id in gone {
                self.delete_instance(&mut st, &id)?;
            }
            self.reconcile_runs(&mut st, nest_id, reports, now_ms())?;
        }
        if !reports.is_empty() {
            self.poke();
        }
        Ok(())
    }

    /// One `InstanceReport`.
    pub fn instance_report(
        &self,
        nest_id: &str,
        conn_id: u64,
        report: &InstanceReport,
    ) -> Result<()> {
        {
            let mut st = self.lock();
            if !st.live.is_current(nest_id, conn_id) {
                return Ok(());
            }
            st.live.seen(nest_id);
            self.apply_instance_report(&mut st, nest_id, report)?;
        }
        self.poke();
        Ok(())
    }

    fn apply_instance_report(
        &self,
        st: &mut State,
        nest_id: &str,
        r: &InstanceReport,
    ) -> Result<()> {
        let Some(mut rec) = st.instances.get(&r.instance_id).cloned() else {
            st.live.send(
                nest_id,
                ToNest::Stop {
                    instance_id: r.instance_id.clone(),
                    reason: "unknown to the hub".into(),
                },
            );
            return Ok(());
        };
        if rec.nest_id != nest_id || matches!(rec.state, InstanceState::Lost) {
            st.live.send(
                nest_id,
                ToNest::Stop {
                    instance_id: r.instance_id.clone(),
                    reason: "replaced by the hub".into(),
                },
            );
            return Ok(());
        }
        if rec.state == InstanceState::Stopping {
            return Ok(());
        }
        let before = rec.clone();
        apply_report(&mut rec, r);
        if rec != before {
            self.save_instance(st, rec)?;
        }
        Ok(())
    }

    /// Marks an instance lost; its running tasks are re-queued.
    fn mark_lost(&self, st: &mut State, id: &str, why: &str) -> Result<()> {
        if let Some(mut rec) = st.instances.get(id).cloned() {
            rec.state = InstanceState::Lost;
            rec.healthy = false;
            rec.healthy_since_ms = 0;
            rec.message = why.to_string();
            rec.updated_at_ms = now_ms();
            self.save_instance(st, rec)?;
            self.requeue_tasks_of(
                st,
                id,
                &format!("instance {id} lost: {why}"),
                Requeue::InstanceFailed,
            )?;
        }
        Ok(())
    }

    // ---------- secrets ----------

    /// Records the `platform` secrets a bundle declares (upload does this; placement reads the
    /// bundle when a Hub restart emptied the cache).
    pub fn remember_bundle_secrets(&self, digest: &str, names: Vec<String>) {
        self.bundle_secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), Arc::new(names));
    }

    /// The `platform` secrets the bundle `digest` declares.
    fn declared_platform_secrets(&self, digest: &str) -> Result<Arc<Vec<String>>> {
        if let Some(names) = self
            .bundle_secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
        {
            return Ok(names.clone());
        }
        self.load_stored_bundle(digest)?;
        self.declared_platform_secrets(digest)
    }

    /// Reads a stored bundle once and caches what the Hub needs of it (its `platform` secrets
    /// and `limits.maxAttempts`).
    pub(crate) fn load_stored_bundle(&self, digest: &str) -> Result<()> {
        let bytes = self.bundle_bytes(digest)?.ok_or_else(|| {
            HubError::FailedPrecondition(format!(
                "bundle {digest} is not stored on the hub; deploy it again"
            ))
        })?;
        let tmp = tempfile::tempdir().map_err(HubError::io(
            std::env::temp_dir(),
            "cannot create a temporary folder",
        ))?;
        let dir = tmp.path().join("bundle");
        let bundle = agen_shared::bundle::unpack(&bytes, &dir)
            .and_then(|()| agen_shared::bundle::Bundle::load(&dir))
            .map_err(|e| HubError::Internal(format!("stored bundle {digest}: {e}")))?;
        let names = secrets::platform_secret_names(&bundle);
        self.remember_bundle_secrets(digest, names);
        self.bundle_max_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.harness.limits.max_attempts);
        self.bundle_permissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.config.permissions.clone());
        Ok(())
    }

    /// `limits.maxAttempts` of the bundle `digest` (the default when it cannot be read).
    pub(crate) fn max_attempts(&self, digest: &str) -> u32 {
        let cached = self
            .bundle_max_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .copied();
        if let Some(n) = cached {
            return n;
        }
        if let Err(e) = self.load_stored_bundle(digest) {
            tracing::warn!(%digest, error = %e, "cannot read limits.maxAttempts; using the default");
            return crate::leases::DEFAULT_MAX_ATTEMPTS;
        }
        self.max_attempts(digest)
    }

    /// The values an instance's placement carries: its bundle's `platform` secrets that are set
    /// in its namespace.
    fn placement_secrets(&self, inst: &InstanceRec) -> Result<SecretValues> {
        let names = self.declared_platform_secrets(&inst.bundle_digest)?;
        self.secrets.values(&inst.namespace, names.iter())
    }

    /// Stores a secret (sealed), then promptly replaces the instances that are not healthy in
    /// deployments of its namespace whose bundle declares it (they started without it), with
    /// their replacement back-off cleared. Returns its metadata and whether it replaced one.
    pub async fn set_secret(
        &self,
        namespace: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(SecretMeta, bool)> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        secrets::validate_secret_name("name", name)?;
        let value = secrets::validate_secret_value("value", value)?;
        let (meta, replaced) = self.secrets.set(&namespace, name, &value, now_ms())?;
        self.commit().await?;
        tracing::info!(namespace = %namespace, secret = %name, replaced, "secret set");
        self.restart_waiting_for(&namespace, name)?;
        self.poke();
        Ok((meta, replaced))
    }

    /// Replaces the not-healthy instances of deployments in `namespace` that declare `name`.
    fn restart_waiting_for(&self, namespace: &str, name: &str) -> Result<()> {
        let digests: HashSet<String> = {
            let st = self.lock();
            st.deployments
                .values()
                .filter(|d| d.namespace == namespace)
                .map(|d| d.bundle_digest.clone())
                .collect()
        };
        let mut declaring = HashSet::new();
        for digest in digests {
            match self.declared_platform_secrets(&digest) {
                Ok(names) if names.iter().any(|n| n == name) => {
                    declaring.insert(digest);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%digest, error = %e, "cannot read the secrets a bundle declares")
                }
            }
        }
        if declaring.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        let now = now_ms();
        let deployments: Vec<DeploymentRec> = st
            .deployments
            .values()
            .filter(|d| d.namespace == namespace && declaring.contains(&d.bundle_digest))
            .cloned()
            .collect();
        for mut d in deployments {
            let ids: Vec<(String, InstanceState)> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .filter(|i| !i.healthy)
                .map(|i| (i.instance_id.clone(), i.state))
                .collect();
            if !ids.is_empty() {
                tracing::info!(deployment = %d.key(), secret = %name, instances = ids.len(), "secret set: replacing the instances that started without it now");
            }
            for (id, state) in ids {
                match state {
                    InstanceState::Pending => {
                        if let Some(mut rec) = st.instances.get(&id).cloned() {
                            if rec.not_before_ms > now {
                                rec.not_before_ms = 0;
                                rec.message = format!("secret {name} set; waiting for placement");
                                rec.updated_at_ms = now;
                                self.save_instance(&mut st, rec)?;
                            }
                        }
                    }
                    InstanceState::Starting | InstanceState::Running | InstanceState::Unhealthy => {
                        self.stop_instance(&mut st, &id, &format!("secret {name} set; replacing"))?;
                    }
                    InstanceState::Stopping | InstanceState::Stopped | InstanceState::Lost => {}
                }
            }
            if d.failures > 0 || d.backoff_until_ms > now {
                d.failures = 0;
                d.backoff_until_ms = 0;
                self.save_deployment(&mut st, d)?;
            }
        }
        Ok(())
    }

    /// The secrets of a namespace (names and times, never values).
    pub fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretMeta>> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        self.secrets.list(&namespace)
    }

    /// Deletes a secret. Running instances keep the value they were started with.
    pub async fn delete_secret(&self, namespace: &str, name: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        secrets::validate_secret_name("name", name)?;
        if !self.secrets.delete(&namespace, name)? {
            return Err(HubError::not_found(format!(
                "secret {name} not found in namespace {namespace}; list them with agen secrets ls"
            )));
        }
        self.commit().await?;
        tracing::info!(namespace = %namespace, secret = %name, "secret deleted");
        Ok(())
    }

    // ---------- reconcile ----------

    /// While the store cannot write: health says NOT_SERVING, and once a second the store
    /// is reopened in place; when that works the state is reloaded from what is durable
    /// (nothing acknowledged is lost; what was not acknowledged may be) and serving resumes.
    async fn heal_store(self: &Arc<Self>, last_try: &mut Option<Instant>) {
        let Some(why) = self.db.broken() else {
            return;
        };
        self.store_ok
            .send_if_modified(|ok| std::mem::replace(ok, false));
        if last_try.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return;
        }
        *last_try = Some(Instant::now());
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || db.heal()).await {
            Ok(Ok(true)) => match self.reload() {
                Ok(dropped) => {
                    tracing::info!(was = %why, dropped_messages = dropped, "hub store recovered: it writes again; state reloaded, serving");
                    self.store_ok
                        .send_if_modified(|ok| !std::mem::replace(ok, true));
                }
                Err(e) => {
                    tracing::error!(error = %e, "hub store reopened but the state cannot be reloaded")
                }
            },
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "hub store still cannot write; retrying in 1s")
            }
            Err(e) => tracing::error!(error = %e, "hub store heal task failed"),
        }
    }

    /// Replaces the in-memory records with the durable ones (after the store was reopened).
    /// Returns how many held Nest messages were dropped (their writes may not be durable).
    fn reload(&self) -> Result<usize> {
        let deployments: Vec<DeploymentRec> = self.db.list_json(Table::Deployments, b"")?;
        let nests: Vec<NestRec> = self.db.list_json(Table::Nests, b"")?;
        let instances: Vec<InstanceRec> = self.db.list_json(Table::Instances, b"")?;
        let tasks: Vec<TaskRec> = self.db.list_json(Table::Tasks, b"")?;
        let mut st = self.lock();
        let dropped = st.live.drop_held();
        st.deployments = deployments.into_iter().map(|d| (d.key(), d)).collect();
        st.nests = nests
            .into_iter()
            .map(|mut n| {
                if st.live.is_connected(&n.nest_id) {
                    n.state = NestState::Ready;
                }
                (n.nest_id.clone(), n)
            })
            .collect();
        st.instances = instances
            .into_iter()
            .map(|i| (i.instance_id.clone(), i))
            .collect();
        st.tasks = tasks.into_iter().map(|t| (t.task_id.clone(), t)).collect();
        Ok(dropped)
    }

    /// Runs until `shutdown`: liveness, placement, task dispatch, store healing.
    pub async fn run_reconciler(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let tick = std::time::Duration::from_millis(250);
        let mut last_heal: Option<Instant> = None;
        loop {
            self.heal_store(&mut last_heal).await;
            if let Err(e) = self.reconcile() {
                tracing::error!(error = %e, "reconcile failed; retrying");
            }
            if let Err(e) = self.commit().await {
                tracing::error!(error = %e, "store flush failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(tick) => {}
            }
        }
    }

    /// One reconcile pass (no IO other than store writes and queued Nest messages).
    pub fn reconcile(&self) -> Result<()> {
        let mut st = self.lock();
        let now = now_ms();
        self.check_liveness(&mut st)?;
        self.forget_stale(&mut st, now)?;
        let window = st.boot.elapsed() < self.opts.lost_after() && !st.awaiting.is_empty();
        if !window {
            self.plan_deployments(&mut st, now)?;
            self.place_pending(&mut st, now)?;
        }
        self.dispatch_tasks(&mut st, now)?;
        Ok(())
    }

    fn check_liveness(&self, st: &mut State) -> Result<()> {
        let lost_after = self.opts.lost_after();
        let grace = self.opts.nest_disconnect_grace;
        let candidates: Vec<(String, bool)> = st
            .nests
            .values()
            .filter(|n| n.state != NestState::Lost)
            .filter_map(|n| {
                let closed = st
                    .live
                    .disconnected_for(&n.nest_id)
                    .is_some_and(|d| d > grace);
                (closed || st.live.silent_for(&n.nest_id) > lost_after)
                    .then(|| (n.nest_id.clone(), closed))
            })
            .collect();
        for (nest_id, closed) in candidates {
            let Some(n) = st.nests.get(&nest_id) else {
                continue;
            };
            let why = if closed {
                format!(
                    "nest {} lost: its stream closed and it did not reconnect within {}s",
                    n.name,
                    grace.as_secs_f32()
                )
            } else {
                format!(
                    "nest {} lost: no heartbeat for {}s",
                    n.name,
                    lost_after.as_secs_f32().round()
                )
            };
            self.lose_nest(st, &nest_id, &why)?;
        }
        // A Nest that stopped reading its stream was disconnected by its bounded queue: it is
        // lost now, and its runs are handed over, rather than buffered for.
        for (nest_id, reason) in st.live.take_overflowed() {
            let Some(n) = st.nests.get(&nest_id) else {
                continue;
            };
            let why = format!("nest {} disconnected: {reason}", n.name);
            self.lose_nest(st, &nest_id, &why)?;
        }
        Ok(())
    }

    /// Marks a Nest lost: its link ends, its instances are lost and their runs re-queued.
    fn lose_nest(&self, st: &mut State, nest_id: &str, why: &str) -> Result<()> {
        {
            let Some(mut n) = st.nests.get(nest_id).cloned() else {
                return Ok(());
            };
            tracing::warn!(nest = %n.name, nest_id = %nest_id, "{why}");
            n.state = NestState::Lost;
            self.save_nest(st, n)?;
            st.live.drop_link(nest_id);
            st.awaiting.remove(nest_id);
            let ids: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.nest_id == nest_id)
                .filter(|i| {
                    !matches!(
                        i.state,
                        InstanceState::Lost | InstanceState::Pending | InstanceState::Stopped
                    )
                })
                .map(|i| i.instance_id.clone())
                .collect();
            for id in ids {
                let stopping = st
                    .instances
                    .get(&id)
                    .is_some_and(|i| i.state == InstanceState::Stopping);
                if stopping {
                    self.delete_instance(st, &id)?;
                } else {
                    self.mark_lost(st, &id, why)?;
                }
            }
        }
        Ok(())
    }

    fn forget_stale(&self, st: &mut State, now: i64) -> Result<()> {
        let stale: Vec<String> = st
            .instances
            .values()
            .filter(|i| match i.state {
                InstanceState::Lost | InstanceState::Stopped => {
                    now - i.updated_at_ms > LOST_RETENTION_MS
                }
                InstanceState::Stopping => now - i.updated_at_ms > STOPPING_RETENTION_MS,
                _ => false,
            })
            .map(|i| i.instance_id.clone())
            .collect();
        for id in stale {
            self.delete_instance(st, &id)?;
        }
        Ok(())
    }

    fn plan_deployments(&self, st: &mut State, now: i64) -> Result<()> {
        let deployments: Vec<DeploymentRec> = st.deployments.values().cloned().collect();
        for mut d in deployments {
            let mine: Vec<&InstanceRec> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .collect();
            let stable = mine.iter().any(|i| {
                i.generation == d.generation
                    && i.healthy_since_ms > 0
                    && now - i.healthy_since_ms >= STABLE_MS
            });
            let views: Vec<InstView> = mine
                .iter()
                .map(|i| InstView {
                    instance_id: i.instance_id.clone(),
                    generation: i.generation,
                    state: i.state,
                    healthy: i.healthy,
                    created_at_ms: i.created_at_ms,
                })
                .collect();
            let plan = scheduler::plan(d.replicas, d.generation, &views);
            let mut changed = false;
            if stable && d.failures > 0 {
                d.failures = 0;
                d.last_failure.clear();
                changed = true;
            }
            for id in &plan.replace {
                let reason = st
                    .instances
                    .get(id)
                    .map(|i| i.message.clone())
                    .unwrap_or_default();
                let reason = if reason.is_empty() {
                    "instance unhealthy".to_string()
                } else {
                    reason
                };
                d.failures += 1;
                let wait = scheduler::backoff(d.failures);
                d.backoff_until_ms = now + wait.as_millis() as i64;
                d.last_failure = reason.clone();
                changed = true;
                tracing::warn!(deployment = %d.key(), instance = %id, failures = d.failures, "replacing unhealthy instance: {reason}");
                self.stop_instance(st, id, &format!("unhealthy: {reason}"))?;
            }
            for id in &plan.stop {
                if Self::drains(st, &d, id) {
                    continue;
                }
                self.stop_instance(st, id, "scaled down or rolled over")?;
            }
            if changed {
                self.save_deployment(st, d.clone())?;
            }
            for _ in 0..plan.create {
                let replacement = d.failures > 0;
                let message = if replacement && d.backoff_until_ms > now {
                    format!(
                        "replacement back-off {}s: {}",
                        scheduler::backoff(d.failures).as_secs(),
                        d.last_failure
                    )
                } else {
                    "waiting for placement".to_string()
                };
                let rec = InstanceRec {
                    instance_id: format!("{}-{}", d.name, short_id()),
                    namespace: d.namespace.clone(),
                    deployment: d.name.clone(),
                    nest_id: String::new(),
                    nest_name: String::new(),
                    state: InstanceState::Pending,
                    healthy: false,
                    tools_loaded: 0,
                    servers_not_connected: Vec::new(),
                    bundle_digest: d.bundle_digest.clone(),
                    generation: d.generation,
                    message,
                    restarts: 0,
                    created_at_ms: now,
                    updated_at_ms: now,
                    tools: Vec::new(),
                    not_before_ms: if replacement { d.backoff_until_ms } else { 0 },
                    healthy_since_ms: 0,
                    replacement,
                };
                self.save_instance(st, rec)?;
            }
        }
        Ok(())
    }

    /// Whether an instance of a bundle version its deployment moved away from keeps running
    /// for now: a run that started on that version (running, or queued to resume after an
    /// interruption) can only finish on it, so a rollover stops the instance once no such run
    /// is left.
    fn drains(st: &State, d: &DeploymentRec, id: &str) -> bool {
        let Some(i) = st.instances.get(id) else {
            return false;
        };
        if i.bundle_digest == d.bundle_digest
            || !matches!(i.state, InstanceState::Running | InstanceState::Starting)
        {
            return false;
        }
        st.tasks.values().any(|t| {
            !t.state.is_terminal()
                && t.namespace == d.namespace
                && t.deployment == d.name
                && t.bundle_digest == i.bundle_digest
        })
    }

    fn place_pending(&self, st: &mut State, now: i64) -> Result<()> {
        let mut pending: Vec<InstanceRec> = st
            .instances
            .values()
            .filter(|i| i.state == InstanceState::Pending)
            .cloned()
            .collect();
        pending.sort_by_key(|i| i.created_at_ms);
        for mut inst in pending {
            let Some(d) = st
                .deployments
                .get(&deployment_key(&inst.namespace, &inst.deployment))
                .cloned()
            else {
                self.delete_instance(st, &inst.instance_id)?;
                continue;
            };
            if inst.not_before_ms > now {
                continue;
            }
            let views: Vec<NestView> = st
                .nests
                .values()
                .map(|n| {
                    let placed = st.instances.values().filter(|i| {
                        i.nest_id == n.nest_id
                            && !matches!(i.state, InstanceState::Lost | InstanceState::Pending)
                    });
                    let (mut total, mut of_deployment) = (0, 0);
                    for i in placed {
                        total += 1;
                        if i.namespace == d.namespace && i.deployment == d.name {
                            of_deployment += 1;
                        }
                    }
                    NestView {
                        nest_id: n.nest_id.clone(),
                        labels: n.labels.clone(),
                        capacity: n.capacity,
                        ready: n.state == NestState::Ready
                            && !n.cordoned
                            && st.live.is_connected(&n.nest_id),
                        total,
                        of_deployment,
                    }
                })
                .collect();
            match scheduler::pick_nest(&views, &d.selector) {
                Ok(nest) => {
                    let nest_id = nest.nest_id.clone();
                    let nest_name = st
                        .nests
                        .get(&nest_id)
                        .map(|n| n.name.clone())
                        .unwrap_or_default();
                    inst.nest_id = nest_id.clone();
                    inst.nest_name = nest_name.clone();
                    inst.state = InstanceState::Starting;
                    inst.message = format!("placed on nest {nest_name}");
                    inst.updated_at_ms = now;
                    let platform_secrets = match self.placement_secrets(&inst) {
                        Ok(v) => v,
                        Err(e) => {
                            let message = format!("cannot place: {e}");
                            tracing::error!(instance = %inst.instance_id, "{message}");
                            let mut inst =
                                st.instances.get(&inst.instance_id).cloned().unwrap_or(inst);
                            if inst.message != message {
                                inst.message = message;
                                inst.updated_at_ms = now;
                                self.save_instance(st, inst)?;
                            }
                            continue;
                        }
                    };
                    tracing::info!(instance = %inst.instance_id, nest = %nest_name, secrets = ?platform_secrets, "placing instance");
                    st.live.send(
                        &nest_id,
                        ToNest::Place {
                            instance_id: inst.instance_id.clone(),
                            namespace: inst.namespace.clone(),
                            deployment: inst.deployment.clone(),
                            bundle_digest: inst.bundle_digest.clone(),
                            generation: inst.generation,
                            concurrency: d.concurrency,
                            platform_secrets,
                        },
                    );
                    self.save_instance(st, inst)?;
                }
                Err(why) => {
                    let message = why.describe(&d.selector);
                    if inst.message != message {
                        inst.message = message;
                        inst.updated_at_ms = now;
                        self.save_instance(st, inst)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Copies what a Nest reports onto the Hub's record.
fn apply_report(rec: &mut InstanceRec, r: &InstanceReport) {
    let now = now_ms();
    if let Some(state) = r.state {
        if !matches!(state, InstanceState::Pending | InstanceState::Lost) {
            rec.state = state;
        }
    }
    rec.healthy = r.healthy && rec.state == InstanceState::Running;
    if rec.healthy {
        if rec.healthy_since_ms == 0 {
            rec.healthy_since_ms = now;
        }
    } else {
        rec.healthy_since_ms = 0;
    }
    rec.tools_loaded = r.tools_loaded;
    rec.servers_not_connected = r.servers_not_connected.clone();
    rec.message = r.message.clone();
    rec.restarts = r.restarts;
    rec.tools = r.tools.clone();
    rec.updated_at_ms = now;
}

#[cfg(test)]
mod tests {
    /// A placement after a Hub restart (no bundle cache): the bundle is read from the store
    /// and exactly its declared `platform` secrets of its own namespace are sent.
    #[test]
    fn a_placement_carries_only_the_declared_platform_secrets_of_its_namespace() {
        use super::*;
        use crate::store::SledStore;

        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(bundle.join("x-agen")).expect("mkdir");
        std::fs::write(
            bundle.join("x-agen/agent.md"),
            "---\nname: t\nmodel: openai/gpt-4.1-mini\n---\nhi\n",
        )
        .expect("agent.md");
        std::fs::write(
            bundle.join("x-agen/secrets.json"),
            r#"{"DB": {"source": "platform"}, "UNSET": {"source": "platform"}, "FROM_ENV": {"source": "env", "var": "X"}}"#,
        )
        .expect("secrets.json");
        let bytes = agen_shared::bundle::pack(&bundle).expect("pack");
        let digest = agen_shared::bundle::digest(&bytes);

        let store = SledStore::open(&dir.path().join("db")).expect("sled");
        let key = SecretKey::load_or_create(&dir.path().join("secret.key")).expect("key");
        let core = Core::open(HubOptions::default(), Db::new(Arc::new(store)), key).expect("core");
        core.put_bundle(&digest, &bytes, "t").expect("bundle");
        for (ns, name, value) in [
            ("default", "DB", "db-of-default"),
            ("other", "DB", "db-of-other"),
            ("default", "FROM_ENV", "not-a-platform-secret"),
            ("default", "UNDECLARED", "never-sent"),
        ] {
            core.secrets.set(ns, name, value, 1).expect("set");
        }
        let inst = InstanceRec {
            instance_id: "t-1".into(),
            namespace: "default".into(),
            deployment: "t".into(),
            nest_id: String::new(),
            nest_name: String::new(),
            state: InstanceState::Pending,
            healthy: false,
            tools_loaded: 0,
            servers_not_connected: Vec::new(),
            bundle_digest: digest,
            generation: 1,
            message: String::new(),
            restarts: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            tools: Vec::new(),
            not_before_ms: 0,
            healthy_since_ms: 0,
            replacement: false,
        };
        let values = core.placement_secrets(&inst).expect("values");
        assert_eq!(
            values.0.into_iter().collect::<Vec<_>>(),
            vec![("DB".to_string(), "db-of-default".to_string())]
        );
    }
}
