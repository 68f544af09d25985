//! The instance supervisor: the instances this Nest runs, their processes, their Unix-socket
//! connections and their reports.
//!
//! An instance proves who it is with its spawn's secret and pid (see [`identity`]); a hello that
//! fails is refused and logged and never replaces the live connection.
//!
//! For each placement it fetches the bundle (see `bundles`), spawns `agen instance` in its own
//! process group (see [`process`]), records the group in `children.json` (see [`children`]),
//! restarts the process with exponential back-off when it dies, and on stop kills the whole
//! group (SIGTERM, SIGKILL after a grace). It serves the Nest socket: an instance says hello,
//! gets its placement (with its secrets resolved here), reports its status and streams run
//! events, which go to the [`Outbox`] of the Hub link; run assignments, cancels and acks go the
//! other way.
//!
//! Invariants: an instance id is placed at most once while it lives here (a repeated
//! `PlaceInstance`, e.g. after a reconnect, is a no-op), so nothing is duplicated; every
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
pub mod identity;
pub mod process;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_proto::v1::{
    ActiveRun, AssignRun, InstanceReport, InstanceState, PlaceInstance, ServerProblem,
};
use agen_shared::bundle::{referenced_secrets, Bundle, SecretSource};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bundles::BundleCache;
use crate::config::NestOptions;
use crate::outbox::Outbox;
use crate::socket::{self, HostState, Placement, RunOrder, ToInstance, ToNest};
use agen_shared::run::{RunEventBody, RunInterrupted};
use backoff::Backoff;
use children::{ChildRecord, Children};

/// How long an instance gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Restart back-off bounds.
const RESTART_BASE: Duration = Duration::from_millis(500);
const RESTART_CAP: Duration = Duration::from_secs(30);
/// An instance that ran this long before dying restarts without back-off history.
const STABLE_AFTER: Duration = Duration::from_secs(60);
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
    changed: Notify,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    next_conn: AtomicU64,
    /// Each instance's and tool server's stderr, kept for `agen logs`.
    logs: crate::logs::LogStore,
}

#[derive(Default)]
struct State {
    instances: BTreeMap<String, Entry>,
    /// Runs handed to instances, by run id.
    runs: HashMap<String, RunTrack>,
    /// A newer attempt of a run whose older attempt still ends on the same instance: handed
    /// over once that one is done (an instance runs one attempt of a run at a time).
    deferred: HashMap<String, ToInstance>,
    /// Instances whose report changed since the link last looked.
    changed: BTreeSet<String>,
    /// Final reports of instances that are gone, not yet sent.
    gone: BTreeMap<String, InstanceReport>,
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
    place: PlaceInstance,
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
        shutdown: CancellationToken,
    ) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            children,
            bundles,
            outbox,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            tracker: TaskTracker::new(),
            shutdown,
            next_conn: AtomicU64::new(1),
            logs: crate::logs::LogStore::new(opts.data_dir.join("logs")),
            opts,
        })
    }

    /// The kept logs of this Nest's instances.
    pub fn logs(&self) -> &crate::logs::LogStore {
        &self.logs
    }

    /// Answers a `LogRequest` of the Hub over `SendLogs` (in the background).
    pub fn answer_logs(&self, req: agen_proto::v1::LogRequest) {
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
            st.changed.insert(id.to_string());
            drop(st);
            self.changed.notify_one();
        }
    }

    /// Reports of every instance this Nest runs.
    pub fn snapshot(&self) -> Vec<InstanceReport> {
        let st = self.lock();
        st.instances
            .values()
            .map(|e| with_runs(&st, e.report.clone()))
            .collect()
    }

    /// Signalled when [`Supervisor::take_changed`] has something.
    pub fn changed_notify(&self) -> &Notify {
        &self.changed
    }

    /// Reports that changed since the last call (final reports of instances that are gone too).
    pub fn take_changed(&self) -> Vec<InstanceReport> {
        let mut st = self.lock();
        let ids = std::mem::take(&mut st.changed);
        let mut out: Vec<InstanceReport> = ids
            .iter()
            .filter_map(|id| {
                st.instances
                    .get(id)
                    .map(|e| with_runs(&st, e.report.clone()))
            })
            .collect();
        out.extend(std::mem::take(&mut st.gone).into_values());
        out
    }

    /// Number of instances.
    pub fn len(&self) -> usize {
        self.lock().instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts the instance `p` (fetching its bundle first). A no-op for an id already here.
    pub fn place(self: &Arc<Self>, p: PlaceInstance) {
        let id = p.instance_id.clone();
        let stop = self.shutdown.child_token();
        {
            let mut st = self.lock();
            if st.instances.contains_key(&id) {
                tracing::debug!(instance = %id, "already running; placement ignored");
                return;
            }
            let at_capacity = st.instances.len() >= self.opts.capacity as usize;
            let mut report = InstanceReport {
                instance_id: id.clone(),
                namespace: p.namespace.clone(),
                deployment: p.deployment.clone(),
                bundle_digest: p.bundle_digest.clone(),
                generation: p.generation,
                state: InstanceState::Starting as i32,
                message: "fetching bundle".into(),
                ..Default::default()
            };
            if at_capacity {
                report.state = InstanceState::Unhealthy as i32;
                report.message = format!(
                    "nest {} is at capacity ({} instances)",
                    self.opts.name, self.opts.capacity
                );
            }
            st.instances.insert(
                id.clone(),
                Entry {
                    place: p.clone(),
                    bundle_dir: None,
                    report,
                    conn: None,
                    queued: Vec::new(),
                    cred: None,
                    stop: stop.clone(),
                },
            );
            st.changed.insert(id.clone());
            if at_capacity {
                tracing::warn!(instance = %id, "placement refused: nest at capacity");
                drop(st);
                self.changed.notify_one();
                // Kept (unhealthy) until the Hub stops it, then forgotten like any other.
                let me = self.clone();
                self.tracker.spawn(async move {
                    stop.cancelled().await;
                    me.forget(&id);
                });
                return;
            }
        }
        self.changed.notify_one();
        tracing::info!(instance = %id, namespace = %p.namespace, deployment = %p.deployment, digest = %p.bundle_digest, "placing instance");
        let me = self.clone();
        self.tracker
            .spawn(async move { me.run_instance(id, p.bundle_digest, stop).await });
    }

    /// Stops the instance `id` (kills its process group) and forgets it.
    pub fn stop(&self, id: &str, reason: &str) {
        let token = {
            let mut st = self.lock();
            let Some(e) = st.instances.get_mut(id) else {
                return;
            };
            e.report.state = InstanceState::Stopping as i32;
            e.report.healthy = false;
            e.report.message = if reason.is_empty() {
                "stopping".into()
            } else {
                reason.to_string()
            };
            st.changed.insert(id.to_string());
            e_stop(st.instances.get(id))
        };
        tracing::info!(instance = %id, reason, "stopping instance");
        self.changed.notify_one();
        if let Some(t) = token {
            t.cancel();
        }
    }

    /// Forwards a run assignment to its instance (queued while the instance is not connected).
    /// A newer attempt of a run this Nest still holds replaces the older one: the older one
    /// is cancelled and relays nothing more; on the same instance the newer one is handed over
    /// once the older one is done.
    pub fn assign(&self, a: AssignRun) {
        let id = a.instance_id.clone();
        let run_id = a.run_id.clone();
        let track = RunTrack {
            instance: id.clone(),
            attempt: a.attempt,
            task_id: a.task_id.clone(),
            last_seq: 0,
        };
        let msg = ToInstance::Run(RunOrder::from(a));
        let mut st = self.lock();
        if !st.instances.contains_key(&id) {
            drop(st);
            let why = format!("instance {id} is not running on nest {}", self.opts.name);
            tracing::warn!(run = %run_id, "{why}; the run fails");
            self.interrupt_run(&run_id, &track, "not_here", &why);
            return;
        }
        let older = st
            .runs
            .get(&run_id)
            .map(|t| (t.instance.clone(), t.attempt));
        if let Some((_, attempt)) = &older {
            if *attempt >= track.attempt {
                tracing::debug!(run = %run_id, attempt = track.attempt, "an attempt this old or older is already here; assignment ignored");
                return;
            }
        }
        st.runs.insert(run_id.clone(), track);
        if let Some((old_instance, old_attempt)) = older {
            tracing::info!(run = %run_id, old_attempt, "a newer attempt replaces the one still here");
            if let Some(e) = st.instances.get_mut(&old_instance) {
                fence_on(
                    e,
                    &run_id,
                    old_attempt,
                    "a newer attempt of the run was assigned",
                );
            }
            if old_instance == id {
                st.deferred.insert(run_id, msg);
                st.changed.insert(id);
                return;
            }
        }
        if let Some(e) = st.instances.get_mut(&id) {
            e.report.active_runs.push(run_id.clone());
            send_or_queue(e, msg);
        }
        st.changed.insert(id);
    }

    /// The Hub has been silent too long: every run here is cancelled at once and relays
    /// nothing more, and each ends with a `run.interrupted` (cause `nest_fenced`) that the
    /// Hub receives when the link is back (if it has not re-dispatched the run already).
    /// Returns how many runs were fenced.
    pub fn fence_all(&self, why: &str) -> usize {
        let runs: Vec<(String, RunTrack)> = {
            let mut st = self.lock();
            let runs: Vec<(String, RunTrack)> = st.runs.drain().collect();
            st.deferred.clear();
            for (run_id, t) in &runs {
                if let Some(e) = st.instances.get_mut(&t.instance) {
                    fence_on(e, run_id, t.attempt, why);
                    e.report.active_runs.retain(|r| r != run_id);
                }
            }
            let ids: Vec<String> = runs.iter().map(|(_, t)| t.instance.clone()).collect();
            st.changed.extend(ids);
            runs
        };
        for (run_id, track) in &runs {
            self.interrupt_run(run_id, track, "nest_fenced", why);
        }
        if !runs.is_empty() {
            tracing::warn!(runs = runs.len(), "{why}: cancelled every run here");
            self.changed.notify_one();
        }
        runs.len()
    }

    /// Cancels a run (the instance cancels its token: model request and tool calls stop).
    pub fn cancel(&self, run_id: &str, instance_id: &str, reason: &str) {
        let mut st = self.lock();
        let id = st
            .runs
            .get(run_id)
            .map(|t| t.instance.clone())
            .unwrap_or_else(|| instance_id.to_string());
        if let Some(e) = st.instances.get_mut(&id) {
            send_or_queue(
                e,
                ToInstance::Cancel {
                    run_id: run_id.to_string(),
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// Relays the Hub's decision about an `ask` call to the instance running the run (queued
    /// while the instance is not connected).
    pub fn deliver_approval(
        &self,
        run_id: &str,
        instance_id: &str,
        decided: agen_shared::run::ApprovalDecided,
    ) {
        let mut st = self.lock();
        let id = st
            .runs
            .get(run_id)
            .map(|t| t.instance.clone())
            .unwrap_or_else(|| instance_id.to_string());
        if let Some(e) = st.instances.get_mut(&id) {
            send_or_queue(
                e,
                ToInstance::ApprovalDecided {
                    run_id: run_id.to_string(),
                    decided,
                },
            );
        }
    }

    /// Relays the Hub's ack of a run's events to the instance running it.
    pub fn deliver_ack(&self, run_id: &str, attempt: u32, acked_seq: u64, fenced: bool) {
        let st = self.lock();
        let Some(e) = st
            .runs
            .get(run_id)
            .and_then(|t| st.instances.get(&t.instance))
        else {
            return;
        };
        if let Some((_, tx)) = &e.conn {
            let _ = tx.send(ToInstance::Ack {
                run_id: run_id.to_string(),
                attempt,
                acked_seq,
                fenced,
            });
        }
    }

    /// Stops every instance and waits for them (at most `grace` + a margin). Returns whether
    /// everything stopped in time.
    pub async fn shutdown(&self, grace: Duration) -> bool {
        self.shutdown.cancel();
        self.tracker.close();
        let done = tokio::time::timeout(grace + Duration::from_secs(2), self.tracker.wait())
            .await
            .is_ok();
        // Belt and braces: whatever is still recorded goes now.
        for (_, rec) in self.children.list() {
            process::signal_group(rec.pgid, nix::sys::signal::Signal::SIGKILL);
        }
        done
    }

    /// One instance's life: bundle, then spawn / wait / restart until stopped.
    async fn run_instance(self: Arc<Self>, id: String, digest: String, stop: CancellationToken) {
        let bundle_dir = tokio::select! {
            r = self.bundles.ensure(&digest) => r,
            _ = stop.cancelled() => { self.forget(&id); return; }
        };
        let bundle_dir = match bundle_dir {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(instance = %id, "{e}");
                self.update(&id, |r| {
                    r.state = InstanceState::Unhealthy as i32;
                    r.healthy = false;
                    r.message = e.to_string();
                });
                stop.cancelled().await;
                self.forget(&id);
                return;
            }
        };
        let place = self.lock().instances.get_mut(&id).map(|e| {
            e.bundle_dir = Some(bundle_dir.clone());
            e.place.clone()
        });
        // The instance's secrets, so that its log lines are redacted of them.
        let (opts, dir) = (self.opts.clone(), bundle_dir.clone());
        let owner = place.as_ref().map(|p| crate::logs::LogOwner {
            namespace: p.namespace.clone(),
            deployment: p.deployment.clone(),
        });
        let secrets = match place {
            Some(p) => {
                tokio::task::spawn_blocking(move || build_placement(&p, &dir, &opts).secrets)
                    .await
                    .unwrap_or_default()
            }
            None => BTreeMap::new(),
        };
        self.logs.start_instance(
            &id,
            &owner.unwrap_or_default(),
            agen_harness::redact::Redactor::of_secrets(&secrets),
        );
        let mut backoff = Backoff::new(RESTART_BASE, RESTART_CAP);
        let socket_path = self.opts.socket_path();
        loop {
            if stop.is_cancelled() {
                break;
            }
            self.update(&id, |r| {
                r.state = InstanceState::Starting as i32;
                r.healthy = false;
                if r.restarts == 0 {
                    r.message = "starting".into();
                }
            });
            let boot = socket::Bootstrap {
                socket: socket_path.clone(),
                instance_id: id.clone(),
                bundle_dir: bundle_dir.clone(),
                secret: socket::SpawnSecret::generate(),
            };
            // Spawned right here, on an async worker thread (see `process`).
            let mut child = match process::spawn_instance(
                &self.opts.agen_bin,
                &boot,
                &self.opts.env,
                self.logs.clone(),
            ) {
                Ok(c) => {
                    // Recorded before any await: the instance cannot say hello before this.
                    let pid = c.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                    if let Some(e) = self.lock().instances.get_mut(&id) {
                        e.cred = Some(identity::SpawnCred {
                            secret: boot.secret.clone(),
                            pid,
                            used: false,
                        });
                    }
                    c
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    let msg = format!(
                        "cannot start {} instance: {e}; retrying in {}s",
                        self.opts.agen_bin.display(),
                        delay.as_secs()
                    );
                    tracing::warn!(instance = %id, "{msg}");
                    self.update(&id, |r| {
                        r.state = InstanceState::Unhealthy as i32;
                        r.message = msg;
                    });
                    tokio::select! { _ = tokio::time::sleep(delay) => continue, _ = stop.cancelled() => break }
                }
            };
            let pid = child.id().unwrap_or(0);
            let pgid = i32::try_from(pid).unwrap_or(0);
            self.children.record(
                &id,
                ChildRecord {
                    what: format!("instance {id}"),
                    pgid,
                },
            );
            self.update(&id, |r| r.pid = pid);
            tracing::info!(instance = %id, pid, "instance process started");
            let started = Instant::now();
            let status = tokio::select! {
                s = child.wait() => Some(s),
                _ = stop.cancelled() => None,
            };
            // That spawn's credential dies with it.
            if let Some(e) = self.lock().instances.get_mut(&id) {
                e.cred = None;
            }
            match status {
                None => {
                    let graceful = process::stop_group(&mut child, pgid, STOP_GRACE).await;
                    self.reap_tool_servers(&id);
                    self.children.remove(&id);
                    tracing::info!(instance = %id, graceful, "instance stopped");
                    break;
                }
                Some(status) => {
                    // Tool servers left in the group go with it.
                    process::signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                    self.reap_tool_servers(&id);
                    self.children.remove(&id);
                    if stop.is_cancelled() {
                        break;
                    }
                    if started.elapsed() >= STABLE_AFTER {
                        backoff.reset();
                    }
                    let how = match status {
                        Ok(s) => describe_exit(s),
                        Err(e) => format!("could not be waited for: {e}"),
                    };
                    let delay = backoff.next_delay();
                    let crashes = backoff.attempts();
                    let msg = format!(
                        "instance process {how}; restarting in {:.1}s",
                        delay.as_secs_f64()
                    );
                    tracing::warn!(instance = %id, "{msg}");
                    let lost_runs = self.drop_runs_of(&id);
                    for (run_id, track) in &lost_runs {
                        self.interrupt_run(
                            run_id,
                            track,
                            "instance_died",
                            &format!("the instance process {how} during the run"),
                        );
                    }
                    self.update(&id, |r| {
                        r.restarts += 1;
                        r.healthy = false;
                        r.tools_loaded = 0;
                        r.active_runs.clear();
                        r.state = if crashes >= UNHEALTHY_AFTER_CRASHES {
                            InstanceState::Unhealthy
                        } else {
                            InstanceState::Starting
                        } as i32;
                        r.message = msg;
                    });
                    if !lost_runs.is_empty() {
                        let ids: Vec<&String> = lost_runs.iter().map(|(r, _)| r).collect();
                        tracing::warn!(instance = %id, runs = ?ids, "runs interrupted by the instance exit");
                    }
                    tokio::select! { _ = tokio::time::sleep(delay) => {}, _ = stop.cancelled() => break }
                }
            }
        }
        self.logs.close_instance(&id);
        self.forget(&id);
    }

    /// Removes an instance after it stopped, keeping its final report for the Hub.
    fn forget(&self, id: &str) {
        let mut st = self.lock();
        if let Some(mut e) = st.instances.remove(id) {
            e.report.state = InstanceState::Stopping as i32;
            e.report.healthy = false;
            e.report.active_runs.clear();
            st.changed.remove(id);
            st.gone.insert(id.to_string(), e.report);
        }
        let lost: Vec<(String, RunTrack)> = {
            let ids: Vec<String> = st
                .runs
                .iter()
                .filter(|(_, t)| t.instance == id)
                .map(|(r, _)| r.clone())
                .collect();
            ids.into_iter()
                .filter_map(|r| st.runs.remove(&r).map(|t| (r, t)))
                .collect()
        };
        drop(st);
        for (run_id, track) in &lost {
            self.interrupt_run(
                run_id,
                track,
                "instance_stopped",
                &format!("instance {id} was stopped during the run"),
            );
        }
        self.children.remove(id);
        self.changed.notify_one();
    }

    /// Kills the recorded tool-server groups of an instance that exited (a clean exit already
    /// stopped them; this catches an instance that died without cleaning up).
    fn reap_tool_servers(&self, id: &str) {
        let prefix = format!("{id}/");
        for (key, rec) in self.children.list() {
            if key.starts_with(&prefix) {
                process::signal_group(rec.pgid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        self.children.remove_prefix(&prefix);
    }

    fn drop_runs_of(&self, id: &str) -> Vec<(String, RunTrack)> {
        let mut st = self.lock();
        let ids: Vec<String> = st
            .runs
            .iter()
            .filter(|(_, t)| t.instance == id)
            .map(|(r, _)| r.clone())
            .collect();
        for r in &ids {
            st.deferred.remove(r);
        }
        ids.into_iter()
            .filter_map(|r| st.runs.remove(&r).map(|t| (r, t)))
            .collect()
    }

    /// Reports a run its instance can no longer finish (the process died, the instance was
    /// stopped, or it is not here): a final `run.interrupted` (`{reason}`) after the last event
    /// the instance sent. The Hub re-dispatches the run (same run id, attempt + 1, its events
    /// to replay, at most 3 attempts), so the task resumes instead of failing or hanging.
    fn interrupt_run(&self, run_id: &str, track: &RunTrack, cause: &str, why: &str) {
        let event = agen_proto::v1::RunEvent {
            run_id: run_id.to_string(),
            attempt: track.attempt,
            seq: track.last_seq + 1,
            task_id: track.task_id.clone(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            kind: agen_shared::run::kind::RUN_INTERRUPTED.into(),
            json: RunEventBody::RunInterrupted(RunInterrupted {
                reason: why.to_string(),
                cause: cause.to_string(),
            })
            .to_json_string(),
            sync: true,
        };
        self.outbox.push(&track.instance, event);
    }

    /// Accepts instance connections on the Nest socket until shutdown.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.shutdown.cancelled() => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    let me = self.clone();
                    self.tracker
                        .spawn(async move { me.connection(stream).await });
                }
                Err(e) => {
                    tracing::warn!("nest socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn connection(self: Arc<Self>, stream: UnixStream) {
        // The kernel's word for who is on the other end, not the pid the hello claims.
        let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
        let (mut reader, mut writer) = socket::split::<ToNest, ToInstance>(stream);
        let hello = tokio::time::timeout(HELLO_TIMEOUT, reader.next()).await;
        let (id, pid, secret) = match hello {
            Ok(Ok(Some(ToNest::Hello {
                instance_id,
                pid,
                secret,
            }))) => (instance_id, pid, secret),
            Ok(Ok(Some(other))) => {
                tracing::warn!("nest socket: expected hello first, got {other:?}");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!("{e}");
                return;
            }
            Ok(Ok(None)) | Err(_) => return,
        };
        let found = {
            let mut st = self.lock();
            match st.instances.get_mut(&id) {
                None => Err(identity::HelloRefusal::NotPlaced { id: id.clone() }),
                Some(e) => identity::check(&id, e.cred.as_mut(), &secret, peer_pid)
                    .map(|()| (e.place.clone(), e.bundle_dir.clone())),
            }
        };
        let (place, bundle_dir) = match found {
            Ok((place, Some(dir))) => (place, dir),
            Ok((_, None)) => {
                // Cannot happen (an instance is spawned only once its bundle is here).
                return;
            }
            Err(refusal) => {
                tracing::warn!(instance = %id, claimed_pid = pid, "nest socket: {refusal}");
                let _ = writer
                    .send(&ToInstance::Refused {
                        reason: refusal.to_string(),
                    })
                    .await;
                return;
            }
        };
        let opts = self.opts.clone();
        let placement =
            tokio::task::spawn_blocking(move || build_placement(&place, &bundle_dir, &opts)).await;
        let Ok(placement) = placement else { return };
        if writer
            .send(&ToInstance::Placement(placement))
            .await
            .is_err()
        {
            return;
        }
        let conn_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut st = self.lock();
            let Some(e) = st.instances.get_mut(&id) else {
                return;
            };
            for m in e.queued.drain(..) {
                let _ = tx.send(m);
            }
            e.conn = Some((conn_id, tx));
        }
        tracing::debug!(instance = %id, pid, "instance connected");
        loop {
            tokio::select! {
                m = reader.next() => match m {
                    Ok(Some(msg)) => self.on_message(&id, msg),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(instance = %id, "{e}");
                        break;
                    }
                },
                out = rx.recv() => match out {
                    Some(m) => if let Err(e) = writer.send(&m).await {
                        tracing::warn!(instance = %id, "{e}");
                        break;
                    },
                    None => break,
                },
                // Closing the socket makes the instance exit by itself.
                _ = self.shutdown.cancelled() => break,
            }
        }
        let mut st = self.lock();
        if let Some(e) = st.instances.get_mut(&id) {
            if matches!(e.conn, Some((c, _)) if c == conn_id) {
                e.conn = None;
            }
        }
    }

    fn on_message(&self, id: &str, msg: ToNest) {
        match msg {
            ToNest::Hello { .. } => {}
            ToNest::Status(s) => self.update(id, |r| {
                if r.state == InstanceState::Stopping as i32 {
                    return;
                }
                r.state = match s.state {
                    HostState::Starting => InstanceState::Starting,
                    HostState::Running => InstanceState::Running,
                    HostState::Unhealthy => InstanceState::Unhealthy,
                } as i32;
                r.healthy = s.state == HostState::Running;
                r.tools_loaded = s.tools_loaded;
                r.servers_not_connected = s
                    .servers_not_connected
                    .into_iter()
                    .map(|(server, reason)| ServerProblem { server, reason })
                    .collect();
                r.tools = s.tools;
                r.message = s.message;
                r.active_runs = s.active_runs;
                for (server, pid) in &s.server_pids {
                    if let Ok(pgid) = i32::try_from(*pid) {
                        self.children.record(
                            &format!("{id}/{server}"),
                            ChildRecord {
                                what: format!("tool server {server} of instance {id}"),
                                pgid,
                            },
                        );
                    }
                }
            }),
            ToNest::Event(e) => {
                {
                    let mut st = self.lock();
                    match st
                        .runs
                        .get_mut(&e.run_id)
                        .filter(|t| t.instance == id && t.attempt == e.attempt)
                    {
                        Some(t) => t.last_seq = t.last_seq.max(e.seq),
                        None => {
                            // Not a run this instance holds (fenced, replaced, or never
                            // handed to it): dropped, and the instance is told to stop.
                            tracing::debug!(instance = %id, run = %e.run_id, attempt = e.attempt, "dropping an event of a run the instance does not hold");
                            if let Some(entry) = st.instances.get(id) {
                                if let Some((_, tx)) = &entry.conn {
                                    let _ = tx.send(ToInstance::Ack {
                                        run_id: e.run_id.clone(),
                                        attempt: e.attempt,
                                        acked_seq: 0,
                                        fenced: true,
                                    });
                                }
                            }
                            return;
                        }
                    }
                }
                self.outbox.push(id, e.into());
            }
            msg @ (ToNest::PutArtifact { .. } | ToNest::ReadArtifact { .. }) => {
                // Artifacts go over their own RPCs (see `artifact_relay`), in the namespace
                // of the instance's placement.
                let target = {
                    let st = self.lock();
                    st.instances.get(id).and_then(|e| {
                        e.conn
                            .as_ref()
                            .map(|(_, tx)| (e.place.namespace.clone(), tx.clone()))
                    })
                };
                if let Some((namespace, tx)) = target {
                    crate::artifact_relay::relay(self.bundles.clone(), namespace, tx, msg);
                }
            }
            ToNest::Child(call) => {
                // Only for a run this instance holds, at this attempt.
                let target = {
                    let st = self.lock();
                    let holds = st
                        .runs
                        .get(&call.run_id)
                        .is_some_and(|t| t.instance == id && t.attempt == call.attempt);
                    st.instances
                        .get(id)
                        .and_then(|e| e.conn.as_ref().map(|(_, tx)| tx.clone()))
                        .map(|tx| (holds, tx))
                };
                match target {
                    Some((true, tx)) => {
                        crate::child_relay::relay(self.bundles.clone(), id.to_string(), tx, call)
                    }
                    Some((false, tx)) => {
                        let _ = tx.send(ToInstance::ChildReply(crate::socket::ChildReply {
                            req: call.req,
                            error: Some(format!(
                                "run {} attempt {} is not held by this instance",
                                call.run_id, call.attempt
                            )),
                            ..Default::default()
                        }));
                    }
                    None => {}
                }
            }
            ToNest::RunDone { run_id, attempt } => {
                let mut st = self.lock();
                if st
                    .runs
                    .get(&run_id)
                    .is_some_and(|t| t.instance == id && t.attempt == attempt)
                {
                    st.runs.remove(&run_id);
                }
                if let Some(e) = st.instances.get_mut(id) {
                    e.report.active_runs.retain(|r| *r != run_id);
                }
                let newer = st
                    .runs
                    .get(&run_id)
                    .is_some_and(|t| t.instance == id && t.attempt > attempt);
                if newer {
                    if let Some(msg) = st.deferred.remove(&run_id) {
                        if let Some(e) = st.instances.get_mut(id) {
                            e.report.active_runs.push(run_id.clone());
                            send_or_queue(e, msg);
                        }
                    }
                }
                st.changed.insert(id.to_string());
                drop(st);
                self.changed.notify_one();
            }
        }
    }
}

/// A report with the runs handed to its instance (and their attempts).
fn with_runs(st: &State, mut report: InstanceReport) -> InstanceReport {
    report.run_attempts = st
        .runs
        .iter()
        .filter(|(_, t)| t.instance == report.instance_id)
        .map(|(run_id, t)| ActiveRun {
            run_id: run_id.clone(),
            attempt: t.attempt,
        })
        .collect();
    report.run_attempts.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    report
}

/// Tells the instance of `e` to stop an attempt at once: cancelled, and fenced so that it
/// waits for no ack.
fn fence_on(e: &mut Entry, run_id: &str, attempt: u32, why: &str) {
    send_or_queue(
        e,
        ToInstance::Cancel {
            run_id: run_id.to_string(),
            reason: why.to_string(),
        },
    );
    if let Some((_, tx)) = &e.conn {
        let _ = tx.send(ToInstance::Ack {
            run_id: run_id.to_string(),
            attempt,
            acked_seq: 0,
            fenced: true,
        });
    }
}

fn e_stop(e: Option<&Entry>) -> Option<CancellationToken> {
    e.map(|e| e.stop.clone())
}

fn send_or_queue(e: &mut Entry, msg: ToInstance) {
    match &e.conn {
        Some((_, tx)) => {
            if let Err(mpsc::error::SendError(msg)) = tx.send(msg) {
                e.queued.push(msg);
            }
        }
        None => e.queued.push(msg),
    }
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "exited".into(),
    }
}

/// The placement an instance gets: its deployment and its secrets, resolved here (`env` from
/// the Nest's environment, `platform` from the Hub's placement). A secret the bundle uses
/// that has no value is listed in `missing_secrets`, naming it and the fix.
pub fn build_placement(
    p: &PlaceInstance,
    bundle_dir: &std::path::Path,
    opts: &NestOptions,
) -> Placement {
    let mut secrets = BTreeMap::new();
    let mut missing = Vec::new();
    if let Ok(bundle) = Bundle::load(bundle_dir) {
        let used: BTreeMap<String, String> =
            referenced_secrets(&bundle).into_iter().rev().collect();
        for (name, source) in bundle.secrets.iter() {
            let (value, why) = match source {
                SecretSource::Platform => (
                    p.platform_secrets.get(name).cloned(),
                    format!("the hub's secret store has no secret {name} in namespace {ns}; set it with `agen secrets set {name} --namespace {ns}` (value on stdin)", ns = p.namespace),
                ),
                SecretSource::Env { var } => (
                    opts.env_var(var).map(str::to_string),
                    format!("environment variable {var} is not set on nest {}; set it in the nest's environment", opts.name),
                ),
            };
            match value {
                Some(v) => {
                    secrets.insert(name.clone(), v);
                }
                None => {
                    if let Some(place) = used.get(name) {
                        missing.push(format!("secret {name} used in {place} has no value: {why}"));
                    }
                }
            }
        }
    }
    Placement {
        instance_id: p.instance_id.clone(),
        namespace: p.namespace.clone(),
        deployment: p.deployment.clone(),
        bundle_digest: p.bundle_digest.clone(),
        generation: p.generation,
        concurrency: p.concurrency.max(1),
        secrets,
        missing_secrets: missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A supervisor on a fresh data dir whose "agen" is `bin`, with one bundle already cached.
    fn supervisor(dir: &std::path::Path, bin: &str, capacity: u32) -> (Arc<Supervisor>, String) {
        let mut opts = NestOptions::new("http://127.0.0.1:9", "t");
        opts.capacity = capacity;
        opts.data_dir = dir.to_path_buf();
        opts.agen_bin = PathBuf::from(bin);
        opts.name = "n1".into();
        let opts = Arc::new(opts);
        let digest = format!("sha256:{}", "a".repeat(64));
        std::fs::create_dir_all(opts.bundles_dir().join("a".repeat(64))).expect("cached bundle");
        let client = Arc::new(crate::hub_client::ClientSlot::default());
        let bundles = Arc::new(BundleCache::new(opts.clone(), client));
        let children = Arc::new(Children::open(&opts.children_file()));
        let sup = Supervisor::new(
            opts,
            children,
            bundles,
            Arc::new(Outbox::default()),
            CancellationToken::new(),
        );
        (sup, digest)
    }

    async fn wait_for(
        sup: &Supervisor,
        what: &str,
        f: impl Fn(&[InstanceReport]) -> bool,
    ) -> Vec<InstanceReport> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let snap = sup.snapshot();
            if f(&snap) {
                return snap;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {snap:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashing_instance_is_restarted_with_back_off_then_reported_unhealthy_and_stops_cleanly(
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sup, digest) = supervisor(dir.path(), "/bin/false", 4);
        let place = PlaceInstance {
            instance_id: "i1".into(),
            namespace: "ns".into(),
            deployment: "d".into(),
            bundle_digest: digest,
            ..Default::default()
        };
        sup.place(place.clone());
        sup.place(place); // a repeated placement is a no-op
        let snap = wait_for(&sup, "three restarts", |s| {
            s.len() == 1 && s[0].restarts >= UNHEALTHY_AFTER_CRASHES
        })
        .await;
        let r = &snap[0];
        assert_eq!(r.state, InstanceState::Unhealthy as i32, "{r:?}");
        assert!(
            r.message
                .starts_with("instance process exited with status 1; restarting in"),
            "{}",
            r.message
        );

        // Stopping it (even mid back-off) forgets it and reports it one last time.
        sup.stop("i1", "replaced by the hub");
        wait_for(&sup, "the instance to be forgotten", |s| s.is_empty()).await;
        let gone = sup.take_changed();
        let last = gone
            .iter()
            .rev()
            .find(|r| r.instance_id == "i1")
            .expect("a final report");
        assert_eq!(
            (last.state, last.healthy),
            (InstanceState::Stopping as i32, false)
        );
        assert!(
            sup.children.list().is_empty(),
            "nothing left in children.json"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_placement_beyond_capacity_is_reported_unhealthy_until_the_hub_stops_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sup, digest) = supervisor(dir.path(), "/bin/false", 1);
        for id in ["i1", "i2"] {
            sup.place(PlaceInstance {
                instance_id: id.into(),
                bundle_digest: digest.clone(),
                ..Default::default()
            });
        }
        let snap = sup.snapshot();
        let i2 = snap
            .iter()
            .find(|r| r.instance_id == "i2")
            .expect("i2 is reported");
        assert_eq!(i2.state, InstanceState::Unhealthy as i32);
        assert_eq!(i2.message, "nest n1 is at capacity (1 instances)");
        sup.stop("i2", "replaced");
        wait_for(&sup, "i2 to be forgotten", |s| {
            s.iter().all(|r| r.instance_id != "i2")
        })
        .await;
        sup.stop("i1", "done");
        wait_for(&sup, "i1 to be forgotten", |s| s.is_empty()).await;
    }

    #[tokio::test]
    async fn a_run_for_an_instance_that_is_not_here_is_reported_interrupted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sup, _) = supervisor(dir.path(), "/bin/false", 4);
        sup.assign(AssignRun {
            run_id: "r1".into(),
            attempt: 2,
            task_id: "t1".into(),
            instance_id: "nope".into(),
            ..Default::default()
        });
        let batch = sup.outbox.take_batch(10);
        assert_eq!(batch.len(), 1);
        let ev = &batch[0].events[0];
        assert_eq!(
            (
                ev.run_id.as_str(),
                ev.attempt,
                ev.seq,
                ev.kind.as_str(),
                ev.sync
            ),
            ("r1", 2, 1, "run.interrupted", true)
        );
        let json: serde_json::Value = serde_json::from_str(&ev.json).expect("json");
        assert_eq!(json["reason"], "instance nope is not running on nest n1");
    }

    #[test]
    fn secrets_are_resolved_from_the_nest_env_and_the_hub_and_missing_ones_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = dir.path();
        std::fs::create_dir_all(b.join("x-agen")).expect("mkdir");
        std::fs::write(b.join("x-agen/agent.md"), "---\nname: t\n---\nhi\n").expect("write");
        std::fs::write(
            b.join("x-agen/secrets.json"),
            r#"{"FROM_ENV": {"source": "env", "var": "NEST_VAR"}, "FROM_HUB": {"source": "platform"}, "UNSET": {"source": "env", "var": "NOPE"}, "UNUSED": {"source": "platform"}}"#,
        )
        .expect("write");
        std::fs::write(
            b.join("mcp.json"),
            r#"{"mcpServers": {"s": {"command": "x", "env": {"A": "${FROM_ENV}", "B": "${FROM_HUB}", "C": "${UNSET}"}}}}"#,
        )
        .expect("write");
        let mut opts = NestOptions::new("http://127.0.0.1:1", "t");
        opts.name = "n1".into();
        opts.env = vec![("NEST_VAR".into(), "from-env".into())];
        let p = PlaceInstance {
            instance_id: "i".into(),
            namespace: "default".into(),
            deployment: "d".into(),
            platform_secrets: [("FROM_HUB".to_string(), "from-hub".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let got = build_placement(&p, b, &opts);
        assert_eq!(
            got.secrets,
            BTreeMap::from([
                ("FROM_ENV".to_string(), "from-env".to_string()),
                ("FROM_HUB".to_string(), "from-hub".to_string())
            ])
        );
        assert_eq!(
            got.missing_secrets,
            vec!["secret UNSET used in mcp.json mcpServers.s.env.C has no value: environment variable NOPE is not set on nest n1; set it in the nest's environment".to_string()]
        );
        assert_eq!(got.concurrency, 1);
    }

    /// Says hello as `id` with `secret` on a fresh connection to the Nest socket.
    async fn hello(
        path: &std::path::Path,
        id: &str,
        secret: socket::SpawnSecret,
    ) -> (
        socket::Reader<ToInstance>,
        socket::Writer<ToNest>,
        Option<ToInstance>,
    ) {
        let stream = UnixStream::connect(path).await.expect("connect");
        let (mut r, mut w) = socket::split::<ToInstance, ToNest>(stream);
        w.send(&ToNest::Hello {
            instance_id: id.into(),
            pid: 1,
            secret,
        })
        .await
        .expect("send hello");
        let first = tokio::time::timeout(Duration::from_secs(10), r.next())
            .await
            .expect("an answer in time")
            .expect("a readable answer");
        (r, w, first)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_hello_for_a_live_instance_is_refused_and_the_first_connection_keeps_working()
    {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        // An "agen" that starts and never connects: the test plays the instance.
        let bin = dir.path().join("fake-agen");
        std::fs::write(&bin, "#!/bin/sh\nexec sleep 300\n").expect("write script");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let (sup, digest) = supervisor(dir.path(), bin.to_str().expect("utf-8"), 4);
        let path = sup.opts.socket_path();
        let listener = socket::listen(&path).expect("listen");
        tokio::spawn(sup.clone().serve(listener));
        sup.place(PlaceInstance {
            instance_id: "i1".into(),
            namespace: "ns".into(),
            deployment: "d".into(),
            bundle_digest: digest,
            ..Default::default()
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let secret = loop {
            let cred = sup
                .lock()
                .instances
                .get_mut("i1")
                .and_then(|e| e.cred.as_mut())
                .map(|c| {
                    // The spawned pid stands for this test process, which plays the instance.
                    c.pid = i32::try_from(std::process::id()).expect("pid fits");
                    c.secret.clone()
                });
            if let Some(s) = cred {
                break s;
            }
            assert!(Instant::now() < deadline, "the instance was never spawned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };

        let (mut real, _real_w, first) = hello(&path, "i1", secret.clone()).await;
        assert!(
            matches!(first, Some(ToInstance::Placement(ref p)) if p.instance_id == "i1"),
            "{first:?}"
        );
        // A replay of the very same hello (right secret, right pid) and a guessed secret.
        for (secret, expected) in [
            (secret.clone(), "already said hello"),
            (socket::SpawnSecret::generate(), "wrong spawn secret"),
        ] {
            let (_, _, answer) = hello(&path, "i1", secret).await;
            match answer {
                Some(ToInstance::Refused { reason }) => {
                    assert!(reason.contains(expected), "{reason}")
                }
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        // The real connection is still the instance's: a run reaches it.
        sup.assign(AssignRun {
            run_id: "r1".into(),
            attempt: 1,
            task_id: "t1".into(),
            instance_id: "i1".into(),
            ..Default::default()
        });
        let got = tokio::time::timeout(Duration::from_secs(10), real.next())
            .await
            .expect("the run in time")
            .expect("readable");
        assert!(
            matches!(got, Some(ToInstance::Run(ref o)) if o.run.run_id.as_str() == "r1"),
            "{got:?}"
        );
        sup.stop("i1", "done");
        wait_for(&sup, "i1 to be forgotten", |s| s.is_empty()).await;
    }
}
