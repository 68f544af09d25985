//! The Hub's core: one `Core` (the state behind one lock, the store, the secret store) and its
//! behaviour split by concern into the modules below. `server/` calls `Core` methods and never
//! touches the lock; only the modules of `core` do.
//!
//! Modules: [`bundles`] (stored bundles and what is read from them once), [`deployments`]
//! (desired state and instances), [`nests`] (register, heartbeat, reports, liveness: where a
//! Nest is declared lost), [`platform_secrets`] (the secret store as placements see it),
//! [`reconcile`] (the loop that keeps every deployment at its replica count), [`run_context`]
//! (the history and replay a run starts from, fetched by its Nest), [`tasks`]
//! (submit, dispatch, run events, outcomes, queries), [`deadlines`] (task timeouts and token
//! budgets: the deadline timer).
//!
//! Invariants: every change is written to the store before it is visible to callers; the
//! state lock is never held across an `.await`; after a Hub boot nothing is placed until every
//! previously known Nest has re-registered or a full ttl has passed (the reconcile window);
//! replacing an unhealthy instance always creates a new instance id; a placement carries the
//! values of exactly the `platform` secrets its bundle declares, from its own namespace; a
//! rollover does not stop an instance of the old bundle version while a run of that version
//! is running or queued to resume (it drains; a run resumes only on its own version).

pub mod approvals;
pub mod artifacts;
pub mod backups;
pub mod bundles;
mod commit;
pub mod cordon;
pub mod deadlines;
pub mod delegates;
pub mod deltas;
pub mod deployments;
pub mod leases;
pub mod lifecycle;
pub mod nests;
mod overrides;
pub mod platform_secrets;
pub mod reconcile;
mod respread;
pub mod retention;
pub mod run_context;
pub mod schedules;
pub mod streams;
mod suspend;
mod task_table;
pub mod tasks;
pub mod webhooks;

pub use deployments::DeploymentSpec;
pub use deployments::DeploymentView;
pub use deployments::MAX_REPLICAS;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{broadcast, Notify};

use crate::config::HubOptions;
use crate::error::Result;
use crate::model::TaskUpdate;
use crate::nodes::Liveness;
use crate::secrets::{SecretKey, SecretStore};
use crate::store::{Db, Table};

use crate::model::*;

pub(crate) struct State {
    pub deployments: BTreeMap<String, DeploymentRec>,
    pub nests: BTreeMap<String, NestRec>,
    pub instances: BTreeMap<String, InstanceRec>,
    pub tasks: task_table::TaskTable,
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
    /// Every task event with the task after it, one shared copy for every subscriber.
    pub(crate) updates: broadcast::Sender<Arc<TaskUpdate>>,
    /// The channels of watched tasks (`tasks::watchers`): a watcher hears its task alone.
    pub(crate) watchers: tasks::watchers::Watchers,
    /// Streamed model answers per task (`deltas`): never stored.
    pub(crate) deltas: deltas::Deltas,
    /// Cancelled when the Hub stops: long-lived streams (watchers) end.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// Whether the store can write (gRPC health follows it).
    pub(crate) store_ok: tokio::sync::watch::Sender<bool>,
    /// When the reconcile loop last finished a pass (unix ms; gRPC health follows it too).
    pub(crate) reconciled_at_ms: std::sync::atomic::AtomicI64,
    /// Values of `platform` secrets, sealed.
    secrets: SecretStore,
    /// The `platform` secrets each bundle declares, by digest (read from the bundle once).
    bundle_secrets: Mutex<HashMap<String, Arc<Vec<String>>>>,
    /// `limits.maxAttempts` of each bundle, by digest (read from the bundle once).
    bundle_max_attempts: Mutex<HashMap<String, u32>>,
    /// `limits.taskTimeout` and `limits.maxTokens` of each bundle, by digest (read once).
    pub(crate) bundle_budgets: Mutex<HashMap<String, deadlines::BundleBudget>>,
    /// `permissions` of each bundle's `x-agen/config.json`, by digest (read once).
    pub(crate) bundle_permissions: Mutex<HashMap<String, agen_shared::bundle::Permissions>>,
    /// `doubleTexting` of each bundle's `x-agen/config.json`, by digest (read once).
    pub(crate) bundle_double_texting: Mutex<HashMap<String, agen_shared::bundle::DoubleTexting>>,
    /// `resources` of each bundle read (see `bundles`).
    pub(crate) bundle_resources: Mutex<HashMap<String, agen_shared::bundle::ResourceSpec>>,
    /// Delegates and `maxDelegationDepth` of each bundle, by digest (read once).
    pub(crate) bundle_delegation: Mutex<HashMap<String, Arc<delegates::Delegation>>>,
    /// Artifact bytes stored per namespace and in all, counted once from the store; holding it
    /// makes a quota check and its write one step.
    pub(crate) artifact_usage: crate::core::artifacts::UsageLock,
    /// Whether a lazy flush for run events nobody waits for is scheduled ([`commit`]).
    lazy_flush: commit::LazyFlush,
    /// Every attempt issued is above this ([`backups::attempt_floor`] of the store's epoch).
    attempt_floor: u32,
    /// Open server streams per kind and token, and their caps.
    pub streams: streams::StreamCaps,
    /// Refusals by `--max-nests` and `--max-queued-tasks` (for `/metrics`).
    pub limit_refusals: crate::limits::Refusals,
    /// The schedules' lock ([`schedules`]).
    pub(crate) schedules: schedules::Schedules,
    /// The webhooks' loop ([`webhooks`]).
    pub(crate) webhooks: webhooks::Webhooks,
    /// The task and audit retentions in force (reloadable; [`retention`]).
    pub retention: Arc<retention::LiveRetention>,
    /// Refused calls in the audit log, rate-limited (`tokens::refusals`).
    pub refusals: Arc<crate::tokens::refusals::RefusalAudit>,
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
    /// Why the store is broken (its first failed write), or `None` (`/readyz`).
    pub fn store_broken(&self) -> Option<String> {
        self.db.broken()
    }

    /// Loads every record from the store; Nests start disconnected with fresh liveness clocks.
    pub fn open(opts: HubOptions, db: Db, secret_key: SecretKey) -> Result<Arc<Core>> {
        let deployments: Vec<DeploymentRec> = db.list_json(Table::Deployments, b"")?;
        let mut nests: Vec<NestRec> = db.list_json(Table::Nests, b"")?;
        let instances: Vec<InstanceRec> = db.list_json(Table::Instances, b"")?;
        let mut tasks: Vec<TaskRec> = db.list_json(Table::Tasks, b"")?;
        for t in tasks.iter_mut().filter(|t| !t.state.is_terminal()) {
            catch_up_from_events(&db, t)?;
        }
        let mut awaiting = HashSet::new();
        for n in nests.iter_mut() {
            if n.state != NestState::Lost {
                n.state = NestState::Disconnected;
                awaiting.insert(n.nest_id.clone());
            }
        }
        let live = Liveness::new(awaiting.iter().cloned());
        let (updates, _) = broadcast::channel(4096);
        let attempt_floor = backups::attempt_floor(db.store_epoch()?);
        let opts_streams = opts.limits.streams;
        tracing::info!(
            deployments = deployments.len(),
            nests = nests.len(),
            instances = instances.len(),
            tasks = tasks.len(),
            "hub state loaded"
        );
        let retention = Arc::new(retention::LiveRetention::new(
            opts.task_retention,
            opts.audit_retention,
        ));
        Ok(Arc::new(Core {
            retention,
            opts,
            state: Mutex::new(State {
                deployments: deployments.into_iter().map(|d| (d.key(), d)).collect(),
                nests: nests.into_iter().map(|n| (n.nest_id.clone(), n)).collect(),
                instances: instances
                    .into_iter()
                    .map(|i| (i.instance_id.clone(), i))
                    .collect(),
                tasks: tasks.into_iter().collect(),
                live,
                boot: Instant::now(),
                awaiting,
            }),
            wake: Notify::new(),
            updates,
            watchers: Default::default(),
            deltas: Default::default(),
            stopping: tokio_util::sync::CancellationToken::new(),
            store_ok: tokio::sync::watch::Sender::new(true),
            reconciled_at_ms: std::sync::atomic::AtomicI64::new(crate::model::now_ms()),
            secrets: SecretStore::new(db.clone(), secret_key),
            refusals: Arc::new(crate::tokens::refusals::RefusalAudit::new(db.clone())),
            artifact_usage: Default::default(),
            lazy_flush: Default::default(),
            attempt_floor,
            streams: streams::StreamCaps::new(opts_streams),
            limit_refusals: Default::default(),
            schedules: Default::default(),
            webhooks: Default::default(),
            bundle_permissions: Default::default(),
            bundle_double_texting: Default::default(),
            bundle_resources: Default::default(),
            bundle_delegation: Default::default(),
            db,
            bundle_secrets: Mutex::new(HashMap::new()),
            bundle_max_attempts: Mutex::new(HashMap::new()),
            bundle_budgets: Mutex::new(HashMap::new()),
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

    /// Checks that the store still holds everything it acknowledged (`VerifyStore`); reads
    /// only, on a blocking thread (it reads the whole event log).
    pub async fn verify_store(&self) -> Result<crate::store::integrity::Report> {
        let db = self.db.clone();
        Ok(tokio::task::spawn_blocking(move || db.verify())
            .await
            .map_err(|e| {
                crate::error::HubError::Internal(format!("the verify task failed: {e}"))
            })??)
    }

    pub(crate) fn save_instance(&self, st: &mut State, rec: InstanceRec) -> Result<()> {
        self.db.put_json(Table::Instances, &rec.instance_id, &rec)?;
        st.instances.insert(rec.instance_id.clone(), rec);
        Ok(())
    }

    pub(in crate::core) fn delete_instance(&self, st: &mut State, id: &str) -> Result<()> {
        self.db.remove(Table::Instances, id)?;
        st.instances.remove(id);
        Ok(())
    }

    pub(in crate::core) fn save_deployment(
        &self,
        st: &mut State,
        rec: DeploymentRec,
    ) -> Result<()> {
        self.db.put_json(Table::Deployments, &rec.key(), &rec)?;
        st.deployments.insert(rec.key(), rec);
        Ok(())
    }

    pub(in crate::core) fn save_nest(&self, st: &mut State, rec: NestRec) -> Result<()> {
        self.db.put_json(Table::Nests, &rec.nest_id, &rec)?;
        st.nests.insert(rec.nest_id.clone(), rec);
        Ok(())
    }
}

/// Brings a task record up to its newest task event: hot run events (activity, model, tool,
/// progress) are written as task events only, so the stored record may lag behind them. It
/// also remembers which run event that task event records, so that a resend of a run event
/// whose task event was stored just before a crash does not record it twice.
pub(in crate::core) fn catch_up_from_events(db: &Db, task: &mut TaskRec) -> Result<()> {
    let Some(last) = db.last_task_event(&task.task_id)? else {
        return Ok(());
    };
    task.last_event_source = last.source.clone();
    if last.seq < task.next_event_seq {
        return Ok(());
    }
    if let Some(snap) = &last.snapshot {
        if snap.run_id == task.run_id && snap.attempt == task.attempt && snap.state == task.state {
            task.activity = snap.activity.clone();
            task.progress = snap.progress.clone();
            task.updated_at_ms = snap.updated_at_ms;
        }
    }
    task.next_event_seq = last.seq + 1;
    Ok(())
}

/// A core over a fresh store in `dir`, for unit tests.
#[cfg(test)]
pub(crate) fn test_core(dir: &std::path::Path) -> Arc<Core> {
    let store = crate::store::SledStore::open(&dir.join("db")).expect("sled");
    let key = SecretKey::load_or_create(&dir.join("secret.key")).expect("key");
    Core::open(HubOptions::default(), Db::new(Arc::new(store)), key).expect("core")
}
