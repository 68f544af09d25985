//! The supervisor's side of per-instance resources: an instance's group made before its first
//! spawn and removed when it is gone, the OOM watch while it runs, and the usage (CPU %,
//! memory) of each instance and tool server filled into snapshots (`Register`, heartbeats,
//! metrics).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cgroup::{Cgroups, InstanceCgroup};
use crate::model::{InstanceReport, UsageSample};

use super::Supervisor;

/// How often a running instance's group is checked for OOM kills.
const OOM_POLL: Duration = Duration::from_millis(200);

impl Supervisor {
    /// Sets how instances' resources are limited (once, by the daemon, before placements).
    pub fn set_cgroups(&self, cgroups: Arc<Cgroups>) {
        let _ = self.cgroups.set(cgroups);
    }

    /// How this Nest limits resources (`None`: not set up, as in unit tests).
    pub fn cgroups(&self) -> Option<&Arc<Cgroups>> {
        self.cgroups.get()
    }

    /// Makes the group of instance `id` with its placement's limits (`Ok(None)` when the Nest
    /// limits nothing).
    pub(super) async fn make_cgroup(
        &self,
        id: &str,
        uid: u32,
    ) -> Result<Option<Arc<InstanceCgroup>>, String> {
        let Some(cg) = self.cgroups.get().cloned() else {
            return Ok(None);
        };
        let Some(limits) = self.lock().instances.get(id).map(|e| e.place.resources) else {
            return Ok(None);
        };
        let iid = id.to_string();
        let made = tokio::task::spawn_blocking(move || {
            let made = cg.create(&iid, &limits)?;
            if uid != 0 {
                made.allow_join(uid)?;
            }
            Ok::<_, String>(made)
        })
        .await
        .map_err(|e| e.to_string())??;
        let made = Arc::new(made);
        if let Some(e) = self.lock().instances.get_mut(id) {
            e.cgroup = Some(made.clone());
        }
        tracing::info!(instance = %id, resources = %limits.describe(), "instance resource group made");
        Ok(Some(made))
    }

    /// Removes the group of instance `id` (every process left in it is killed first).
    pub(super) async fn remove_cgroup(&self, cg: Option<Arc<InstanceCgroup>>) {
        if let Some(cg) = cg {
            let _ = tokio::task::spawn_blocking(move || cg.remove()).await;
        }
    }

    /// Attributes the OOM kills of instance `id`'s group not yet counted: when its counter
    /// (`memory.events` / `memory.oom_control` `oom_kill`) rose since the last call, the
    /// instance's count goes up by one and this returns true. Called when an instance reports
    /// a tool server killed by SIGKILL, when the instance process is gone (crashed or stopped)
    /// and before its group is removed, so an OOM is attributed whichever of those comes first
    /// (the poll in [`oom_kill`] is only the fallback).
    pub(super) fn take_oom(&self, id: &str) -> bool {
        let Some(cg) = self.lock().instances.get(id).and_then(|e| e.cgroup.clone()) else {
            return false;
        };
        let now = cg.oom_kills();
        let mut st = self.lock();
        let Some(e) = st.instances.get_mut(id) else {
            return false;
        };
        if now <= e.oom_seen {
            return false;
        }
        e.oom_seen = now;
        e.report.oom_kills += 1;
        true
    }

    /// "killed by its memory limit (300Mi, OOM)" for instance `id`.
    pub(super) fn oom_words(&self, id: &str) -> String {
        let limit = self
            .lock()
            .instances
            .get(id)
            .and_then(|e| e.place.resources.memory_bytes)
            .map(agen_shared::bundle::resources::format_bytes)
            .unwrap_or_default();
        format!("killed by its memory limit ({limit}, OOM)")
    }

    /// A stopped instance's OOM kill (counted by [`Supervisor::take_oom`]) logged and made
    /// its message, so its last report (`agen ps --all`) says why it went.
    pub(super) fn note_oom_stop(&self, id: &str) {
        let msg = format!(
            "a process of the instance was {}; stopped",
            self.oom_words(id)
        );
        tracing::warn!(instance = %id, "{msg}");
        self.update(id, |r| r.message = msg);
    }

    /// The instance reported tool servers that died; one killed by SIGKILL may have met the
    /// memory limit: its OOM watch looks now rather than at its next poll.
    pub(super) fn server_killed(&self, id: &str, problems: &[crate::model::ServerProblem]) {
        if problems.iter().any(|p| p.reason.contains("SIGKILL")) {
            if let Some(e) = self.lock().instances.get(id) {
                e.oom_wake.notify_one();
            }
        }
    }

    /// Fills each report's usage: its group's reading (or its process group's under
    /// rlimits), each tool server's process group, and CPU % since the previous snapshot.
    pub(super) fn fill_usage(&self, reports: &mut [InstanceReport]) {
        let (groups, servers): (Vec<_>, Vec<_>) = {
            let st = self.lock();
            let groups = reports
                .iter()
                .map(|r| {
                    st.instances
                        .get(&r.instance_id)
                        .and_then(|e| e.cgroup.clone())
                })
                .collect();
            (groups, self.children.list())
        };
        let mut pgids: Vec<i32> = servers.iter().map(|(_, rec)| rec.pgid).collect();
        pgids.extend(reports.iter().filter_map(|r| i32::try_from(r.pid).ok()));
        let by_group = crate::cgroup::group_usage(&pgids);
        let now = Instant::now();
        let mut seen = self.cpu_seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut sample = |key: String, name: String, cpu: f64, mem: u64, pids: u32| {
            let pct = match seen.insert(key, (now, cpu)) {
                Some((t, before)) if now > t && cpu >= before => {
                    (cpu - before) / now.duration_since(t).as_secs_f64() * 100.0
                }
                _ => 0.0,
            };
            UsageSample {
                name,
                cpu_percent: (pct * 10.0).round() / 10.0,
                cpu_seconds: cpu,
                memory_bytes: mem,
                pids,
            }
        };
        let mut live = std::collections::HashSet::new();
        for (r, cg) in reports.iter_mut().zip(groups) {
            live.insert(r.instance_id.clone());
            let reading = cg.as_ref().and_then(|c| c.read());
            let own = match reading {
                Some(g) => Some((g.cpu_seconds, g.memory_bytes, g.pids)),
                None => i32::try_from(r.pid)
                    .ok()
                    .and_then(|p| by_group.get(&p))
                    .map(|s| (s.cpu_seconds, s.memory_bytes, s.pids)),
            };
            r.usage = own.map(|(c, m, p)| sample(r.instance_id.clone(), String::new(), c, m, p));
            let prefix = format!("{}/", r.instance_id);
            r.servers_usage = servers
                .iter()
                .filter_map(|(key, rec)| {
                    let name = key.strip_prefix(&prefix)?;
                    let s = by_group.get(&rec.pgid).copied().unwrap_or_default();
                    Some(sample(
                        key.clone(),
                        name.to_string(),
                        s.cpu_seconds,
                        s.memory_bytes,
                        s.pids,
                    ))
                })
                .collect();
        }
        seen.retain(|k, _| live.contains(k.split('/').next().unwrap_or("")));
    }
}

/// Resolves once the group's OOM-kill count rises above `base` (never without a group):
/// checked every [`OOM_POLL`] and whenever `wake` is notified.
pub(super) async fn oom_kill(cg: Option<&InstanceCgroup>, base: u64, wake: &tokio::sync::Notify) {
    let Some(cg) = cg else {
        return std::future::pending().await;
    };
    if !cg.is_group() {
        return std::future::pending().await;
    }
    loop {
        tokio::select! {
            () = tokio::time::sleep(OOM_POLL) => {}
            () = wake.notified() => {}
        }
        if cg.oom_kills() > base {
            return;
        }
    }
}
