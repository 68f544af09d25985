//! The instance supervisor: the instances this Nest runs, their processes, their Unix-socket
//! connections and their reports.
//!
//! An instance proves who it is with its spawn's secret and pid (see [`identity`]); a hello that
//! fails is refused and logged and never replaces the live connection.
//!
//! For each placement it fetches the bundle (see `bundles`), gives the instance its uid and run
//! dir (see `separation`), spawns `agen instance` in its own process group (see [`process`]), records the group in `children.json` (see [`children`]),
//! restarts the process with exponential back-off when it dies, and on stop kills the whole
//! group (SIGTERM, SIGKILL after a grace). It serves the Nest socket: an instance says hello,
//! gets its placement (with its secrets resolved here), reports its status and streams run
//! events, which go to the [`Outbox`] (the Hub link sends them); run assignments, cancels and
//! acks go the other way. It speaks the Nest's domain types (`crate::model`), never protobuf,
//! and reports through a channel: every change of an instance's report (and its final report
//! when it is gone) goes to the [`Reports`] receiver its creator holds (the Hub link, which
//! sends what queued up between two sends as one report per instance); the link also reads
//! [`Supervisor::snapshot`] for `Register` and heartbeats.
//!
//! Invariants: an instance id is placed at most once while it lives here (a repeated
//! placement, e.g. after a reconnect, is a no-op), so nothing is duplicated; every
//! spawned group is in `children.json` until it was killed; a stopped or shut-down instance is
//! never restarted; runs assigned while an instance is (re)starting wait for its connection;
//! a run its instance can no longer finish (the process died, the instance was stopped or is
//! not here) ends with one `run.interrupted` event (with its `cause`), so the Hub resumes it;
//! a run event is relayed only from the instance the run was handed to, for that attempt
//! (anything else is answered `fenced` and dropped); every report lists the runs handed to the
//! instance with their attempts (`run_attempts`), which the Hub reconciles with its leases;
//! [`Supervisor::fence_all`] (the Hub has been silent too long) cancels every run at once and
//! relays nothing more of them.

pub mod backoff;
pub mod children;
mod connection;
pub mod identity;
mod lifecycle;
pub mod process;
mod resources;
mod runs;

pub use lifecycle::build_placement;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bundles::BundleCache;
use crate::config::NestOptions;
use crate::model::{InstanceReport, LogRequest, PlaceOrder, RunAttempt};
use crate::outbox::Outbox;
use crate::socket::ToInstance;
use children::Children;

/// How long an instance gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Restart back-off bounds.
const RESTART_BASE: Duration = Duration::from_millis(500);
const RESTART_CAP: Duration = Duration::from_secs(30);
/// An instance that ran this long before dying restarts without back-off history.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How often a pending instance (no free uid) tries again.
const UID_RETRY: Duration = Duration::from_secs(2);
/// Consecutive crashes after which the instance is reported unhealthy (the Hub replaces it).
const UNHEALTHY_AFTER_CRASHES: u32 = 3;
/// How long an instance may take to say hello after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The supervisor (see the module doc). Shared as `Arc<Supervisor>`.
pub struct Supervisor {
    opts: Arc<NestOptions>,
    children: Arc<Children>,
    bundles: Arc<BundleCache>,
    outbox: Arc<Outbox>,
    state: Mutex<State>,
    /// Where changed reports go (see [`Reports`]).
    reports: mpsc::UnboundedSender<InstanceReport>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    next_conn: AtomicU64,
    /// Each instance's and tool server's stderr, kept for `agen logs`.
    logs: crate::logs::LogStore,
    /// Who instances run as, and their uids and run dirs.
    separation: Arc<crate::separation::Separation>,
    /// Each separated instance's network namespace and egress rule (or why not).
    network: Arc<crate::netns::Network>,
    /// How instances' resources are limited (set by the daemon; unset: not limited).
    cgroups: std::sync::OnceLock<Arc<crate::cgroup::Cgroups>>,
    /// The last CPU reading of each instance and tool server, for CPU % (see `resources`).
    cpu_seen: Mutex<HashMap<String, (std::time::Instant, f64)>>,
}

#[derive(Default)]
struct State {
    instances: BTreeMap<String, Entry>,
    /// Runs handed to instances, by run id.
    runs: HashMap<String, RunTrack>,
    /// A newer attempt of a run whose older attempt still ends on the same instance: handed
    /// over once that one is done (an instance runs one attempt of a run at a time).
    deferred: HashMap<String, ToInstance>,
}

/// A run in flight on one of this Nest's instances.
struct RunTrack {
    instance: String,
    attempt: u32,
    task_id: String,
    /// The highest event seq the instance sent for it.
    last_seq: u64,
}

struct Entry {
    place: PlaceOrder,
    /// Its resource group while it lives (see `cgroup`).
    cgroup: Option<Arc<crate::cgroup::InstanceCgroup>>,
    /// The group's OOM-kill counter as last attributed (see `resources::take_oom`).
    oom_seen: u64,
    /// Wakes the OOM watch at once (a tool server was reported killed by SIGKILL).
    oom_wake: Arc<tokio::sync::Notify>,
    bundle_dir: Option<PathBuf>,
    report: InstanceReport,
    /// The live socket connection (its id and its outgoing queue).
    conn: Option<(u64, mpsc::UnboundedSender<ToInstance>)>,
    /// Messages for the instance while it has no connection (run assignments).
    queued: Vec<ToInstance>,
    /// The credential of the current spawn (none between spawns).
    cred: Option<identity::SpawnCred>,
    stop: CancellationToken,
}

impl Supervisor {
    pub fn new(
        opts: Arc<NestOptions>,
        children: Arc<Children>,
        bundles: Arc<BundleCache>,
        outbox: Arc<Outbox>,
        separation: Arc<crate::separation::Separation>,
        network: Arc<crate::netns::Network>,
        shutdown: CancellationToken,
    ) -> (Arc<Supervisor>, Reports) {
        let (reports, rx) = mpsc::unbounded_channel();
        let sup = Arc::new(Supervisor {
            children,
            bundles,
            outbox,
            state: Mutex::new(State::default()),
            reports,
            tracker: TaskTracker::new(),
            shutdown,
            next_conn: AtomicU64::new(1),
            logs: crate::logs::LogStore::new(opts.data_dir.join("logs")),
            separation,
            network,
            cgroups: std::sync::OnceLock::new(),
            cpu_seen: Mutex::new(HashMap::new()),
            opts,
        });
        (sup, Reports(rx))
    }

    /// Who this Nest's instances run as.
    pub fn separation(&self) -> &crate::separation::Separation {
        &self.separation
    }

    /// This Nest's network isolation.
    pub fn network(&self) -> &crate::netns::Network {
        &self.network
    }

    /// The kept logs of this Nest's instances.
    pub fn logs(&self) -> &crate::logs::LogStore {
        &self.logs
    }

    /// Answers a `LogRequest` of the Hub over `SendLogs` (in the background).
    pub fn answer_logs(&self, req: LogRequest) {
        let (logs, bundles, stop) = (
            self.logs.clone(),
            self.bundles.clone(),
            self.shutdown.clone(),
        );
        tokio::spawn(async move {
            match bundles.hub_client().await {
                Ok(client) => crate::logs::serve::answer(logs, client, req, stop),
                Err(e) => tracing::warn!("cannot answer a log request: {e}"),
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to the report of `id` (if it still exists) and marks it changed.
    fn update(&self, id: &str, f: impl FnOnce(&mut InstanceReport)) {
        let mut st = self.lock();
        if let Some(e) = st.instances.get_mut(id) {
            f(&mut e.report);
            self.report(&st, id);
        }
    }

    /// Sends the report of `id` as it is now (with its runs) to the link.
    fn report(&self, st: &State, id: &str) {
        if let Some(e) = st.instances.get(id) {
            let _ = self.reports.send(with_runs(st, e.report.clone()));
        }
    }

    /// Reports of every instance this Nest runs.
    pub fn snapshot(&self) -> Vec<InstanceReport> {
        let mut out: Vec<InstanceReport> = {
            let st = self.lock();
            st.instances
                .values()
                .map(|e| with_runs(&st, e.report.clone()))
                .collect()
        };
        self.fill_usage(&mut out);
        out
    }

    /// Runs handed to this Nest's instances that have not ended.
    pub fn active_runs(&self) -> usize {
        self.lock().runs.len()
    }

    /// Number of instances.
    pub fn len(&self) -> usize {
        self.lock().instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The receiving end of the supervisor's reports: each change of an instance's report, in
/// order, and the final report of an instance that is gone.
pub struct Reports(mpsc::UnboundedReceiver<InstanceReport>);

impl Reports {
    /// The next report, or `None` once the supervisor is gone.
    pub async fn recv(&mut self) -> Option<InstanceReport> {
        self.0.recv().await
    }

    /// `first` and every report queued behind it, the newest of each instance only, in the
    /// order of those newest reports (changes between two sends go as one report).
    pub fn coalesce(&mut self, first: InstanceReport) -> Vec<InstanceReport> {
        let mut all = vec![first];
        while let Ok(r) = self.0.try_recv() {
            all.push(r);
        }
        let mut out: Vec<InstanceReport> = Vec::with_capacity(all.len());
        for r in all.into_iter().rev() {
            if !out.iter().any(|o| o.instance_id == r.instance_id) {
                out.push(r);
            }
        }
        out.reverse();
        out
    }

    /// Forgets every queued report (a `Register` about to carry the snapshot covers them).
    pub fn clear(&mut self) {
        while self.0.try_recv().is_ok() {}
    }
}

/// A report with the runs handed to its instance (and their attempts).
fn with_runs(st: &State, mut report: InstanceReport) -> InstanceReport {
    report.run_attempts = st
        .runs
        .iter()
        .filter(|(_, t)| t.instance == report.instance_id)
        .map(|(run_id, t)| RunAttempt {
            run_id: run_id.clone(),
            attempt: t.attempt,
        })
        .collect();
    report.run_attempts.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    report
}

#[cfg(test)]
mod tests;
