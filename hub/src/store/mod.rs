//! Durable state behind a small [`Store`] trait (the local store, [`SledStore`], or PostgreSQL,
//! [`PgStore`]), plus
//! [`Db`], the typed layer the rest of the Hub uses (JSON records by table and key).
//!
//! Invariants: everything the Hub must not forget (deployments, bundles, Nests, instances,
//! tasks, task events, run events, conversations, the request-id index, sealed secrets, hashed
//! tokens, the audit log, Nest identities, run leases) is written here before
//! it is acknowledged to anyone; run events are appended only if absent, and only for the
//! attempt the Hub issued last for their run (any other attempt is refused: fenced).

pub mod copy;
mod disk_sync;
mod event_log;
mod group_commit;
pub mod integrity;
mod log_scan;
pub mod pg;
pub mod sealed;
mod sled_store;
pub mod snapshot;
mod space;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use pg::PgStore;
pub use sled_store::SledStore;

/// Makes the entries of `dir` (files created or renamed in it) durable.
pub fn sync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    disk_sync::sync_folder(dir)
}

use crate::model::RunEventRec;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("hub store {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("hub store ({table}): {reason}")]
    Op { table: &'static str, reason: String },
    #[error("hub store ({table}): record {key} is corrupt: {reason}")]
    Corrupt {
        table: &'static str,
        key: String,
        reason: String,
    },
    #[error("hub snapshot: {0}")]
    Snapshot(String),
    /// A running Hub holds the store (its lock): a check from the files must go through it.
    #[error("hub store {0}: a running Hub holds this store: check it through the Hub (agen hub verify reaches it by its client config, --hub and --token), or stop it first")]
    Held(String),
    /// The store lost records it acknowledged: it refuses to serve (see [`integrity`]).
    #[error("{}", .0.refusal())]
    Damaged(Box<integrity::Report>),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The tables of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Deployments,
    BundleMeta,
    BundleData,
    Nests,
    Instances,
    Tasks,
    TaskEvents,
    RunEvents,
    RunAttempts,
    Conversations,
    RequestIds,
    Counters,
    /// Secret values, sealed (`secrets`): `namespace \0 name`.
    Secrets,
    /// Artifact metadata (`artifacts`): `namespace \0 id`.
    ArtifactMeta,
    /// Artifact bytes, content-addressed per namespace: `namespace \0 id`.
    ArtifactData,
    /// Which tasks saved which artifact: `namespace \0 task \0 id`.
    ArtifactTasks,
    /// API and join tokens by id; secrets only as sha256 (`tokens`).
    Tokens,
    /// The audit log: `at_ms(be) seq(be)` → one mutating call.
    Audit,
    /// Nest identities: `id \0 <nest id>` → the key it is bound to; `retired \0 <key sha256>`
    /// → a key forgotten with its Nest (its certificate is refused for good).
    NestIdentities,
    /// Every generation of every deployment: `namespace/name \0 generation(be)`.
    DeploymentHistory,
    /// The approvals of a task (`approvals`): task id → asked and decided `ask` calls.
    Approvals,
    /// Web console sessions (`console_sessions`): sha256 of the session id → its token and
    /// expiry (`server/console/session.rs`).
    ConsoleSessions,
    /// Schedules (`core/schedules.rs`): `namespace \0 id`.
    Schedules,
    /// Webhook targets and deliveries of a task (`core/webhooks.rs`): task id.
    Webhooks,
    /// The webhook a deployment names (`core/webhooks.rs`): `namespace \0 name`.
    DeploymentWebhooks,
}

impl Table {
    /// Every table (a snapshot holds them all).
    pub const ALL: [Table; 25] = [
        Table::Deployments,
        Table::BundleMeta,
        Table::BundleData,
        Table::Nests,
        Table::Instances,
        Table::Tasks,
        Table::TaskEvents,
        Table::RunEvents,
        Table::RunAttempts,
        Table::Conversations,
        Table::RequestIds,
        Table::Counters,
        Table::Secrets,
        Table::ArtifactMeta,
        Table::ArtifactData,
        Table::ArtifactTasks,
        Table::Tokens,
        Table::Audit,
        Table::NestIdentities,
        Table::DeploymentHistory,
        Table::Approvals,
        Table::ConsoleSessions,
        Table::Schedules,
        Table::Webhooks,
        Table::DeploymentWebhooks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Table::Deployments => "deployments",
            Table::BundleMeta => "bundle_meta",
            Table::BundleData => "bundle_data",
            Table::Nests => "nests",
            Table::Instances => "instances",
            Table::Tasks => "tasks",
            Table::TaskEvents => "task_events",
            Table::RunEvents => "run_events",
            Table::RunAttempts => "run_attempts",
            Table::Conversations => "conversations",
            Table::RequestIds => "request_ids",
            Table::Counters => "counters",
            Table::Secrets => "secrets",
            Table::ArtifactMeta => "artifact_meta",
            Table::ArtifactData => "artifact_data",
            Table::ArtifactTasks => "artifact_tasks",
            Table::Tokens => "tokens",
            Table::Audit => "audit",
            Table::NestIdentities => "nest_identities",
            Table::DeploymentHistory => "deployment_history",
            Table::Approvals => "approvals",
            Table::ConsoleSessions => "console_sessions",
            Table::Schedules => "schedules",
            Table::Webhooks => "webhooks",
            Table::DeploymentWebhooks => "deployment_webhooks",
        }
    }
}

/// One row of [`Store::insert_pairs_in_order`]: a key and value, and the entry of the other
/// table written just before it (if any).
pub struct PairRow {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub before: Option<(Vec<u8>, Vec<u8>)>,
}

/// Raw key/value storage by table.
pub trait Store: Send + Sync + 'static {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<()>;
    fn remove(&self, table: Table, key: &[u8]) -> Result<()>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Writes only if `key` is absent; returns whether it wrote.
    fn insert_if_absent(&self, table: Table, key: &[u8], value: &[u8]) -> Result<bool>;
    /// Writes every row in order, its `before` entry (in `also`) just before its `key` (in
    /// `table`), as plain writes: not one atomic write (which would cost a log write of its
    /// own), but in the store's order, so after a crash the store holds a prefix of them and a
    /// stored `key` has its `before` entry. Fails, writing nothing, when a row's `key` is
    /// present when it starts; a write error midway leaves the rows before it written.
    fn insert_pairs_in_order(&self, table: Table, also: Table, rows: &[PairRow]) -> Result<()>;
    /// The entry with the greatest key that starts with `prefix`.
    fn last(&self, table: Table, prefix: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Atomically increments a counter and returns the new value.
    fn increment(&self, counter: &str) -> Result<u64>;
    /// Makes every earlier write durable (one flush covers many writes: group commit).
    /// Returns whether it synced anything (`false`: every earlier write was durable already).
    fn flush(&self) -> BoxFuture<'_, Result<bool>>;
    /// Why the store cannot write now (`None` while it can).
    fn broken(&self) -> Option<String>;
    /// Closes the store for good (the Hub stopped): later calls fail, its files are released.
    fn close(&self);
    /// Rewrites the store's files without what removed or replaced records left behind, when
    /// that is worth it; returns whether it did. Writes go on meanwhile. A failure leaves the
    /// store as it was and working (it does not break the store).
    fn compact(&self) -> Result<bool>;
    /// Checks that the store still holds everything it acknowledged, while it runs (see
    /// [`integrity`]); reads only.
    fn verify(&self) -> Result<integrity::Report> {
        Err(StoreError::Op {
            table: "all",
            reason: "this store cannot be verified".into(),
        })
    }
    /// Tries to make a broken store write again (reopening it in place). `Ok(true)` when it
    /// healed now, `Ok(false)` when it was not broken; an error says why it still cannot.
    fn heal(&self) -> Result<bool>;
}

/// The counter of store epochs: a restore from a snapshot starts the next one.
pub const EPOCH_COUNTER: &str = "store_epoch";
/// Set (to the new epoch) by a restore until the Hub that opens the store has re-queued the
/// runs that were in flight at the snapshot.
pub const RESTORED_COUNTER: &str = "restored_pending";

/// What appending a run event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Append {
    Appended,
    /// Already stored (a resend): harmless.
    Duplicate,
    /// A newer attempt of the run exists: the sender must stop.
    Fenced,
}

/// Typed access to a [`Store`], with group commit ([`Db::flush`]).
#[derive(Clone)]
pub struct Db {
    inner: std::sync::Arc<dyn Store>,
    commit: std::sync::Arc<group_commit::GroupCommit>,
}

impl Db {
    pub fn new(inner: std::sync::Arc<dyn Store>) -> Db {
        Db {
            inner,
            commit: Default::default(),
        }
    }

    /// Flushes the store has done (one fsync each), for metrics and benchmarks.
    pub fn flushes(&self) -> u64 {
        self.commit.flushes()
    }

    pub fn raw(&self) -> &dyn Store {
        self.inner.as_ref()
    }

    pub fn put_json<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| StoreError::Op {
            table: table.name(),
            reason: e.to_string(),
        })?;
        self.inner.put(table, key.as_bytes(), &bytes)
    }

    pub fn get_json<T: DeserializeOwned>(&self, table: Table, key: &str) -> Result<Option<T>> {
        match self.inner.get(table, key.as_bytes())? {
            None => Ok(None),
            Some(bytes) => decode(table, key.as_bytes(), &bytes).map(Some),
        }
    }

    pub fn remove(&self, table: Table, key: &str) -> Result<()> {
        self.inner.remove(table, key.as_bytes())
    }

    pub fn list_json<T: DeserializeOwned>(&self, table: Table, prefix: &[u8]) -> Result<Vec<T>> {
        self.inner
            .scan(table, prefix)?
            .into_iter()
            .map(|(k, v)| decode(table, &k, &v))
            .collect()
    }

    /// Makes every write done before this call durable. Callers that arrive while a flush is
    /// in flight share the next one (group commit: one fsync serves many runs).
    pub async fn flush(&self) -> Result<()> {
        self.commit.flush(self.inner.as_ref()).await
    }

    /// Why the store cannot write now (`None` while it can).
    pub fn broken(&self) -> Option<String> {
        self.inner.broken()
    }

    /// See [`Store::verify`].
    pub fn verify(&self) -> Result<integrity::Report> {
        self.inner.verify()
    }

    /// See [`Store::heal`].
    pub fn heal(&self) -> Result<bool> {
        self.inner.heal()
    }

    /// Closes the store for good (see [`Store::close`]).
    /// See [`Store::compact`].
    pub fn compact(&self) -> Result<bool> {
        self.inner.compact()
    }

    pub fn close(&self) {
        self.inner.close()
    }

    /// The store's epoch (0 until a restore; each restore starts the next one).
    pub fn store_epoch(&self) -> Result<u64> {
        self.counter(EPOCH_COUNTER)
    }

    /// The epoch a restore started, while the runs in flight at the snapshot are not yet
    /// re-queued (0: none pending).
    pub fn restore_pending(&self) -> Result<u64> {
        self.counter(RESTORED_COUNTER)
    }

    /// The runs in flight at the snapshot are re-queued: the restore is complete.
    pub fn clear_restore_pending(&self) -> Result<()> {
        self.inner
            .remove(Table::Counters, RESTORED_COUNTER.as_bytes())
    }

    fn counter(&self, name: &str) -> Result<u64> {
        Ok(self
            .inner
            .get(Table::Counters, name.as_bytes())?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0))
    }

    /// The newest attempt the Hub has started for `run_id` (0 when none).
    pub fn run_attempt(&self, run_id: &str) -> Result<u32> {
        Ok(self
            .inner
            .get(Table::RunAttempts, run_id.as_bytes())?
            .and_then(|b| b.try_into().ok().map(u32::from_be_bytes))
            .unwrap_or(0))
    }

    /// Records that `attempt` of `run_id` has started: older attempts are fenced from now on.
    pub fn set_run_attempt(&self, run_id: &str, attempt: u32) -> Result<()> {
        self.inner.put(
            Table::RunAttempts,
            run_id.as_bytes(),
            &attempt.to_be_bytes(),
        )
    }

    /// Appends a run event keyed (run_id, attempt, seq) if absent. Only the newest attempt the
    /// Hub issued ([`Db::set_run_attempt`], written before the run is sent) may append: an
    /// older one is fenced, and one above it (never issued) is refused the same way and never
    /// moves the fence.
    pub fn append_run_event(&self, ev: &RunEventRec) -> Result<Append> {
        if ev.attempt != self.run_attempt(&ev.run_id)? {
            return Ok(Append::Fenced);
        }
        let bytes = serde_json::to_vec(ev).map_err(|e| StoreError::Op {
            table: Table::RunEvents.name(),
            reason: e.to_string(),
        })?;
        if self.inner.insert_if_absent(
            Table::RunEvents,
            &run_event_key(&ev.run_id, ev.attempt, ev.seq),
            &bytes,
        )? {
            Ok(Append::Appended)
        } else {
            Ok(Append::Duplicate)
        }
    }

    /// Whether the run event `(run_id, attempt, seq)` is stored.
    pub fn has_run_event(&self, run_id: &str, attempt: u32, seq: u64) -> Result<bool> {
        Ok(self
            .inner
            .get(Table::RunEvents, &run_event_key(run_id, attempt, seq))?
            .is_some())
    }

    /// The hot path of run events: appends every event right after the task event that records
    /// it (`None`: stored already), as plain ordered writes ([`Store::insert_pairs_in_order`]:
    /// an atomic write sealed and wrote one of sled's log buffers per batch). After a crash
    /// the store holds a prefix of them: a stored run event has its task event, a run's events
    /// have no gap. The caller has checked that each is its run's current attempt (the lease)
    /// and not yet stored ([`Db::has_run_event`], under the lock every append takes); an event
    /// found stored meanwhile fails the whole write, which writes nothing.
    pub fn append_hot_run_events(
        &self,
        events: &[(RunEventRec, Option<crate::model::TaskEventRec>)],
    ) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let encode = |table: Table, e: serde_json::Error| StoreError::Op {
            table: table.name(),
            reason: e.to_string(),
        };
        let rows = events
            .iter()
            .map(|(ev, task_event)| {
                let before = match task_event {
                    Some(te) => Some((
                        task_event_key(&ev.task_id, te.seq),
                        serde_json::to_vec(te).map_err(|e| encode(Table::TaskEvents, e))?,
                    )),
                    None => None,
                };
                Ok(PairRow {
                    key: run_event_key(&ev.run_id, ev.attempt, ev.seq),
                    value: serde_json::to_vec(ev).map_err(|e| encode(Table::RunEvents, e))?,
                    before,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.inner
            .insert_pairs_in_order(Table::RunEvents, Table::TaskEvents, &rows)
    }

    /// The newest stored event of a task (`None` when it has none).
    pub fn last_task_event(&self, task_id: &str) -> Result<Option<crate::model::TaskEventRec>> {
        let mut prefix = task_id.as_bytes().to_vec();
        prefix.push(0);
        match self.inner.last(Table::TaskEvents, &prefix)? {
            Some((k, v)) => Ok(Some(decode(Table::TaskEvents, &k, &v)?)),
            None => Ok(None),
        }
    }

    /// Every stored event of `run_id`, by attempt then seq.
    pub fn run_events(&self, run_id: &str) -> Result<Vec<RunEventRec>> {
        let mut prefix = run_id.as_bytes().to_vec();
        prefix.push(0);
        self.list_json(Table::RunEvents, &prefix)
    }
}

fn decode<T: DeserializeOwned>(table: Table, key: &[u8], bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        table: table.name(),
        key: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
}

/// `run_id \0 attempt(be) seq(be)`: sorts by attempt then seq.
pub fn run_event_key(run_id: &str, attempt: u32, seq: u64) -> Vec<u8> {
    let mut k = run_id.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&attempt.to_be_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `task_id \0 seq(be)`.
pub fn task_event_key(task_id: &str, seq: u64) -> Vec<u8> {
    let mut k = task_id.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

#[cfg(test)]
mod tests;
