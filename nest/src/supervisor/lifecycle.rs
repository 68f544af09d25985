//! An instance's life here: placed (bundle fetched, process spawned and restarted with back-off),
//! stopped (its whole process group), forgotten; the Nest's shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agen_shared::bundle::{referenced_secrets, Bundle, SecretSource};
use tokio_util::sync::CancellationToken;

use crate::config::NestOptions;
use crate::model::{InstanceReport, InstanceState, PlaceOrder};
use crate::socket::{self, Placement};
use backoff::Backoff;
use children::ChildRecord;

use super::*;

impl Supervisor {
    /// Starts the instance `p` (fetching its bundle first). A no-op for an id already here.
    pub fn place(self: &Arc<Self>, p: PlaceOrder) {
        let id = p.instance_id.clone();
        let stop = self.shutdown.child_token();
        {
            let mut st = self.lock();
            if st.instances.contains_key(&id) {
                tracing::debug!(instance = %id, "already running; placement ignored");
                return;
            }
            let at_capacity = st.instances.len() >= self.opts.capacity as usize;
            let mut report =
                InstanceReport::new(&p, InstanceState::Starting, "fetching bundle".into());
            if at_capacity {
                report.state = InstanceState::Unhealthy;
                report.message = format!(
                    "nest {} is at capacity ({} instances)",
                    self.opts.name, self.opts.capacity
                );
            }
            st.instances.insert(
                id.clone(),
                Entry {
                    place: p.clone(),
                    cgroup: None,
                    oom_seen: 0,
                    oom_wake: Arc::default(),
                    bundle_dir: None,
                    report,
                    conn: None,
                    queued: Vec::new(),
                    cred: None,
                    stop: stop.clone(),
                },
            );
            self.report(&st, &id);
            if at_capacity {
                tracing::warn!(instance = %id, "placement refused: nest at capacity");
                drop(st);
                // Kept (unhealthy) until the Hub stops it, then forgotten like any other.
                let me = self.clone();
                self.tracker.spawn(async move {
                    stop.cancelled().await;
                    me.forget(&id);
                });
                return;
            }
        }
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
            e.report.state = InstanceState::Stopping;
            e.report.healthy = false;
            e.report.message = if reason.is_empty() {
                "stopping".into()
            } else {
                reason.to_string()
            };
            self.report(&st, id);
            e_stop(st.instances.get(id))
        };
        tracing::info!(instance = %id, reason, "stopping instance");
        if let Some(t) = token {
            t.cancel();
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
    pub(super) async fn run_instance(
        self: Arc<Self>,
        id: String,
        digest: String,
        stop: CancellationToken,
    ) {
        let bundle_dir = tokio::select! {
            r = self.bundles.ensure(&digest) => r,
            _ = stop.cancelled() => { self.forget(&id); return; }
        };
        let bundle_dir = match bundle_dir {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(instance = %id, "{e}");
                self.update(&id, |r| {
                    r.state = InstanceState::Unhealthy;
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
        // Its uids and its run dir (a copy of the bundle it owns, a HOME and a TMPDIR, and
        // each command server's own). No uid free: pending until one is.
        let run_as = loop {
            let (sep, dir, iid) = (self.separation.clone(), bundle_dir.clone(), id.clone());
            let got = tokio::task::spawn_blocking(move || {
                let plan = match Bundle::load(&dir) {
                    Ok(b) => crate::separation::server_plan(&b),
                    Err(_) => Vec::new(),
                };
                let uids = sep.acquire(&iid, plan.len())?;
                uids.map(|u| {
                    sep.prepare_run_dir(&iid, &u, &dir, &plan)
                        .map(|d| (u.instance, d))
                })
                .transpose()
            })
            .await;
            match got {
                Ok(Err(e @ crate::separation::SeparationError::Exhausted { .. })) => {
                    let msg = format!("pending: {e}");
                    tracing::warn!(instance = %id, "{msg}");
                    self.update(&id, |r| {
                        r.state = InstanceState::Pending;
                        r.healthy = false;
                        r.message = msg;
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(UID_RETRY) => continue,
                        _ = stop.cancelled() => {
                            self.release_uid(&id).await;
                            self.logs.close_instance(&id);
                            self.forget(&id);
                            return;
                        }
                    }
                }
                other => {
                    break other
                        .map_err(|e| e.to_string())
                        .and_then(|r| r.map_err(|e| e.to_string()))
                }
            }
        };
        let run_as = match run_as {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("cannot give the instance its own uid: {e}");
                return self.fail_start(&id, &stop, msg).await;
            }
        };
        // Its own network (separated instances of a Nest that can): made once, deleted when the
        // instance is gone (dropped at the end of this function).
        let netns = match (&run_as, self.network.is_on()) {
            (Some(_), true) => match self.make_netns(&id, &bundle_dir).await {
                Ok(n) => Some(n),
                Err(e) => {
                    let msg = format!("cannot give the instance its own network namespace: {e}");
                    return self.fail_start(&id, &stop, msg).await;
                }
            },
            _ => None,
        };
        let expected_uid = run_as
            .as_ref()
            .map_or_else(|| nix::unistd::geteuid().as_raw(), |(who, _)| who.uid);
        if let Some((who, _)) = &run_as {
            tracing::info!(instance = %id, uid = who.uid, gid = who.gid, "instance runs under its own uid");
        }
        // Its resource group (limits for it and every tool server it starts), or why not.
        let cgroup = match self.make_cgroup(&id, expected_uid).await {
            Ok(c) => c,
            Err(e) => {
                let msg = format!("cannot limit the instance's resources: {e}");
                return self.fail_start(&id, &stop, msg).await;
            }
        };
        let mut backoff = Backoff::new(RESTART_BASE, RESTART_CAP);
        let socket_path = self.opts.socket_path();
        let mut first_start = true;
        loop {
            if stop.is_cancelled() {
                break;
            }
            self.update(&id, |r| {
                r.state = InstanceState::Starting;
                r.healthy = false;
                if r.restarts == 0 {
                    r.message = "starting".into();
                }
            });
            // Each restart gets the verified bundle again, not what a previous start changed.
            if let (Some((who, dirs)), false) = (&run_as, first_start) {
                let (sep, who, dirs, dir) = (
                    self.separation.clone(),
                    *who,
                    dirs.clone(),
                    bundle_dir.clone(),
                );
                let fresh = tokio::task::spawn_blocking(move || {
                    sep.fresh_bundle(&dirs, who, &dir)
                        .map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                if let Err(e) = fresh {
                    let delay = backoff.next_delay();
                    let msg = format!(
                        "cannot renew the instance's bundle copy: {e}; retrying in {}s",
                        delay.as_secs()
                    );
                    tracing::warn!(instance = %id, "{msg}");
                    self.update(&id, |r| {
                        r.state = InstanceState::Unhealthy;
                        r.message = msg;
                    });
                    tokio::select! { _ = tokio::time::sleep(delay) => continue, _ = stop.cancelled() => break }
                }
            }
            first_start = false;
            let boot = socket::Bootstrap {
                socket: socket_path.clone(),
                instance_id: id.clone(),
                bundle_dir: run_as
                    .as_ref()
                    .map_or_else(|| bundle_dir.clone(), |(_, d)| d.bundle.clone()),
                secret: socket::SpawnSecret::generate(),
                seats: run_as
                    .as_ref()
                    .map(|(_, d)| d.seats.clone())
                    .unwrap_or_default(),
            };
            // Spawned right here, on an async worker thread (see `process`).
            let mut child = match process::spawn_instance(
                &self.opts.agen_bin,
                &boot,
                &self.opts.env,
                run_as
                    .as_ref()
                    .map(|(who, dirs)| process::RunAs { id: *who, dirs }),
                self.logs.clone(),
                netns.as_ref().map(|n| n.handle()),
                cgroup.as_deref(),
            ) {
                Ok(c) => {
                    // Recorded before any await: the instance cannot say hello before this.
                    let pid = c.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                    if let Some(e) = self.lock().instances.get_mut(&id) {
                        e.cred = Some(identity::SpawnCred {
                            secret: boot.secret.clone(),
                            pid,
                            uid: expected_uid,
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
                        r.state = InstanceState::Unhealthy;
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
            let ooms_before = cgroup.as_ref().map_or(0, |c| c.oom_kills());
            let oom_wake = self
                .lock()
                .instances
                .get(&id)
                .map(|e| e.oom_wake.clone())
                .unwrap_or_default();
            let mut oom = false;
            let status = tokio::select! {
                s = child.wait() => Some(s),
                _ = stop.cancelled() => None,
                () = super::resources::oom_kill(cgroup.as_deref(), ooms_before, &oom_wake) => {
                    oom = true;
                    // A process of the instance (a tool server, say) hit the memory limit:
                    // the whole instance goes, and its runs resume like after any crash.
                    process::signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                    if let Some(cg) = cgroup.clone() {
                        let _ = tokio::task::spawn_blocking(move || cg.kill_all()).await;
                    }
                    Some(child.wait().await)
                }
            };
            // Attributed here whichever way it went (the watch, a crash, or a stop the Hub sent
            // because the instance reported its tool server dead).
            let oom = self.take_oom(&id) || oom;
            // That spawn's credential dies with it.
            if let Some(e) = self.lock().instances.get_mut(&id) {
                e.cred = None;
            }
            match status {
                None => {
                    if oom {
                        self.note_oom_stop(&id);
                    }
                    let graceful = process::stop_group(&mut child, pgid, STOP_GRACE).await;
                    self.reap_tool_servers(&id);
                    self.separation.kill_servers(&id);
                    self.children.remove(&id);
                    tracing::info!(instance = %id, graceful, "instance stopped");
                    break;
                }
                Some(status) => {
                    // Tool servers left in the group go with it.
                    process::signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
                    if let Some(cg) = cgroup.clone() {
                        let _ = tokio::task::spawn_blocking(move || cg.kill_all()).await;
                    }
                    self.reap_tool_servers(&id);
                    self.separation.kill_servers(&id);
                    self.children.remove(&id);
                    if stop.is_cancelled() {
                        if oom {
                            self.note_oom_stop(&id);
                        }
                        break;
                    }
                    if started.elapsed() >= STABLE_AFTER {
                        backoff.reset();
                    }
                    let how = match status {
                        _ if oom => format!("was {}", self.oom_words(&id)),
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
                        };
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
        drop(netns);
        // A kill during the stop grace is counted before the group (and its counter) goes.
        if self.take_oom(&id) {
            self.note_oom_stop(&id);
        }
        self.remove_cgroup(cgroup).await;
        self.release_uid(&id).await;
        self.logs.close_instance(&id);
        self.forget(&id);
    }

    /// Makes the network namespace of instance `id` for the bundle in `dir` (see `netns`).
    async fn make_netns(
        &self,
        id: &str,
        dir: &std::path::Path,
    ) -> Result<crate::netns::InstanceNet, String> {
        let owner = self
            .logs
            .owner(id)
            .map(|o| (o.namespace, o.deployment))
            .unwrap_or_default();
        let (net, logs, id, dir) = (
            self.network.clone(),
            self.logs.clone(),
            id.to_string(),
            dir.to_path_buf(),
        );
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let bundle = Bundle::load(&dir).map_err(|e| e.to_string())?;
            net.create(&id, owner, &bundle, logs, rt)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// The instance is gone: whatever still runs under its uid is killed, the uid freed and
    /// its run dir removed (see `separation`).
    /// An instance that cannot start for `msg` (its uid, network or resource group): shown
    /// unhealthy with the reason until it is stopped, then its uids, logs and entry go.
    async fn fail_start(&self, id: &str, stop: &CancellationToken, msg: String) {
        tracing::warn!(instance = %id, "{msg}");
        self.update(id, |r| {
            r.state = InstanceState::Unhealthy;
            r.healthy = false;
            r.message = msg;
        });
        stop.cancelled().await;
        self.release_uid(id).await;
        self.logs.close_instance(id);
        self.forget(id);
    }

    async fn release_uid(&self, id: &str) {
        let (sep, id) = (self.separation.clone(), id.to_string());
        let _ = tokio::task::spawn_blocking(move || sep.release(&id)).await;
    }

    /// Removes an instance after it stopped, keeping its final report for the Hub.
    pub(super) fn forget(&self, id: &str) {
        let mut st = self.lock();
        if let Some(mut e) = st.instances.remove(id) {
            e.report.state = InstanceState::Stopping;
            e.report.healthy = false;
            e.report.active_runs.clear();
            // Its last report: the newest for the id, so the link sends it, not an older one.
            let _ = self.reports.send(e.report);
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
    }

    /// Kills the recorded tool-server groups of an instance that exited (a clean exit already
    /// stopped them; this catches an instance that died without cleaning up).
    pub(super) fn reap_tool_servers(&self, id: &str) {
        let prefix = format!("{id}/");
        for (key, rec) in self.children.list() {
            if key.starts_with(&prefix) {
                process::signal_group(rec.pgid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        self.children.remove_prefix(&prefix);
    }
}

pub(super) fn e_stop(e: Option<&Entry>) -> Option<CancellationToken> {
    e.map(|e| e.stop.clone())
}

pub(super) fn describe_exit(s: std::process::ExitStatus) -> String {
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
    p: &PlaceOrder,
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
