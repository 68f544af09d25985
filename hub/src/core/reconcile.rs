//! The reconcile loop: every tick it checks liveness, forgets stale instances, plans each
//! deployment's replicas (the pure `scheduler` decides placement), places pending instances,
//! dispatches queued tasks, and heals a store that failed.

use std::sync::Arc;
use std::time::Instant;

use crate::core::{short_id, Core, State};
use crate::error::Result;
use crate::nodes::ToNest;
use crate::scheduler;
use crate::scheduler::{InstView, NestView};
use crate::store::Table;

use crate::model::*;

/// An instance healthy for this long clears its replica slot's failure count.
const STABLE_MS: i64 = 30_000;
/// Stopped and lost instances are forgotten this long after they ended (or after
/// `--hide-ended-after`, when that is longer); they are hidden from lists before that.
const ENDED_RETENTION_MS: i64 = 24 * 3_600_000;
/// A stopping instance the Nest never confirms is forgotten after this long.
const STOPPING_RETENTION_MS: i64 = 60_000;

/// How far past its tick the reconcile loop's sleep may end before the Hub counts itself as
/// having been paused ([`crate::nodes::Liveness::restart_all_clocks`]).
const PAUSED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// A reconcile loop that has not finished a pass for this long is stalled: health says
/// NOT_SERVING (the loop places instances and dispatches tasks; a Hub without it serves
/// nothing useful).
pub const RECONCILE_STALL_MS: i64 = 15_000;

/// The Hub's gRPC health: serving while the store writes and the reconcile loop turns.
pub fn serving(store_ok: bool, reconciled_at_ms: i64, now_ms: i64) -> bool {
    store_ok && now_ms - reconciled_at_ms < RECONCILE_STALL_MS
}

impl Core {
    /// While the store cannot write: health says NOT_SERVING, and once a second the store
    /// is reopened in place; when that works the state is reloaded from what is durable
    /// (nothing acknowledged is lost; what was not acknowledged may be) and serving resumes.
    pub(in crate::core) async fn heal_store(self: &Arc<Self>, last_try: &mut Option<Instant>) {
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
    pub(in crate::core) fn reload(&self) -> Result<usize> {
        let deployments: Vec<DeploymentRec> = self.db.list_json(Table::Deployments, b"")?;
        let nests: Vec<NestRec> = self.db.list_json(Table::Nests, b"")?;
        let instances: Vec<InstanceRec> = self.db.list_json(Table::Instances, b"")?;
        let mut tasks: Vec<TaskRec> = self.db.list_json(Table::Tasks, b"")?;
        for t in tasks.iter_mut().filter(|t| !t.state.is_terminal()) {
            super::catch_up_from_events(&self.db, t)?;
        }
        let mut st = self.lock();
        let dropped = st.live.drop_held();
        // No Nest is lost for the time the store could not write: one that could not register
        // meanwhile gets a full ttl from now, as at boot.
        st.live.restart_clocks();
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
        st.tasks = tasks.into_iter().collect();
        Ok(dropped)
    }

    /// Runs until `shutdown`: liveness, placement, task dispatch, store healing.
    pub async fn run_reconciler(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let tick = std::time::Duration::from_millis(250);
        let mut last_heal: Option<Instant> = None;
        // Pets while reconcile and the store flush both go round (systemd's WatchdogSec), and
        // while the store cannot write, as long as this loop goes round healing it.
        let watchdog = agen_shared::systemd::Watchdog::from_env();
        let mut told: Option<String> = None;
        loop {
            self.heal_store(&mut last_heal).await;
            let status = if let Some(why) = self.db.broken() {
                // Nothing is decided while the store cannot record it (no Nest is lost, no
                // task dispatched or expired); the loop goes round, healing, and says so: the
                // watchdog hears that the process is alive, `STATUS=` that the store is not.
                watchdog.pet();
                format!("not serving: {why}")
            } else {
                match self.reconcile() {
                    Ok(()) => self
                        .reconciled_at_ms
                        .store(now_ms(), std::sync::atomic::Ordering::Relaxed),
                    Err(e) => tracing::error!(error = %e, "reconcile failed; retrying"),
                }
                match self.commit().await {
                    Ok(()) => watchdog.pet(),
                    // A write that broke the store is healed above, and petted meanwhile.
                    Err(e) if self.db.broken().is_some() => {
                        watchdog.pet();
                        tracing::error!(error = %e, "store flush failed")
                    }
                    Err(e) => tracing::error!(error = %e, "store flush failed"),
                }
                let ready = self
                    .lock()
                    .nests
                    .values()
                    .filter(|n| n.state == NestState::Ready)
                    .count();
                format!("serving; {ready} nests ready")
            };
            if told.as_deref() != Some(status.as_str()) {
                agen_shared::systemd::status(&status);
                told = Some(status);
            }
            let slept_at = Instant::now();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(tick) => {}
            }
            // A sleep that overshot its tick by seconds means the Hub itself stood still
            // (SIGSTOP, a frozen VM): the Nests it did not hear from meanwhile are not lost
            // for that, and get a fresh ttl before the next liveness check.
            let slept = slept_at.elapsed();
            if slept > tick + PAUSED_AFTER {
                tracing::warn!(paused = ?slept, "the hub did not run for a while; every nest gets a fresh ttl to be heard from");
                self.lock().live.restart_all_clocks();
            }
        }
    }

    /// One reconcile pass (no IO other than store writes and queued Nest messages).
    pub fn reconcile(&self) -> Result<()> {
        let mut st = self.lock();
        let now = now_ms();
        self.check_liveness(&mut st)?;
        self.forget_stale(&mut st, now)?;
        self.move_drained(&mut st, now, false)?;
        let window = st.boot.elapsed() < self.opts.lost_after() && !st.awaiting.is_empty();
        if !window {
            self.plan_deployments(&mut st, now)?;
            self.place_pending(&mut st, now)?;
        }
        self.expire_deadlines(&mut st, now)?;
        self.dispatch_tasks(&mut st, now)?;
        Ok(())
    }

    fn hide_ended_after_ms(&self) -> i64 {
        i64::try_from(self.opts.hide_ended_after.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether lists leave `i` out unless asked for ended ones: stopped or lost for longer
    /// than `--hide-ended-after`.
    pub fn instance_hidden(&self, i: &InstanceRec, now: i64) -> bool {
        matches!(i.state, InstanceState::Lost | InstanceState::Stopped)
            && now.saturating_sub(i.updated_at_ms) > self.hide_ended_after_ms()
    }

    /// Whether lists leave `n` out unless asked for ended ones: lost (heard from last) longer
    /// ago than `--hide-ended-after`. Its record, key binding and any revocation are kept.
    pub fn nest_hidden(&self, n: &NestRec, now: i64) -> bool {
        n.state == NestState::Lost
            && now.saturating_sub(n.last_heartbeat_ms) > self.hide_ended_after_ms()
    }

    pub(in crate::core) fn forget_stale(&self, st: &mut State, now: i64) -> Result<()> {
        let stale: Vec<String> = st
            .instances
            .values()
            .filter(|i| match i.state {
                InstanceState::Lost | InstanceState::Stopped => {
                    now - i.updated_at_ms > ENDED_RETENTION_MS.max(self.hide_ended_after_ms())
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

    pub(in crate::core) fn plan_deployments(&self, st: &mut State, now: i64) -> Result<()> {
        let deployments: Vec<DeploymentRec> = st.deployments.values().cloned().collect();
        for d in deployments {
            self.stop_idle_resume_instances(st, &d)?;
            let mine: Vec<&InstanceRec> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .filter(|i| !i.for_resume)
                .collect();
            // A slot whose instance ran healthy long enough is no longer failing.
            let settled: Vec<String> = mine
                .iter()
                .filter(|i| {
                    i.slot_failures > 0
                        && scheduler::slots::settled(
                            i.slot_failures,
                            i.healthy_since_ms,
                            now,
                            STABLE_MS,
                        ) == 0
                })
                .map(|i| i.instance_id.clone())
                .collect();
            let views: Vec<InstView> = mine
                .iter()
                .map(|i| InstView {
                    instance_id: i.instance_id.clone(),
                    generation: i.generation,
                    state: i.state,
                    healthy: i.healthy,
                    created_at_ms: i.created_at_ms,
                    leaving: i.leaving_since_ms > 0,
                })
                .collect();
            let plan = scheduler::plan(d.replicas, d.generation, &views);
            for id in settled {
                if let Some(mut rec) = st.instances.get(&id).cloned() {
                    rec.slot_failures = 0;
                    self.save_instance(st, rec)?;
                }
            }
            let mut vacancies = Vec::new();
            for id in &plan.replace {
                let (reason, slot_failures) = st
                    .instances
                    .get(id)
                    .map(|i| (i.message.clone(), i.slot_failures))
                    .unwrap_or_default();
                let reason = if reason.is_empty() {
                    "instance unhealthy".to_string()
                } else {
                    reason
                };
                let vacancy = scheduler::slots::Vacancy::after_failure(slot_failures, &reason, now);
                tracing::warn!(deployment = %d.key(), instance = %id, slot_failures = vacancy.failures, "replacing unhealthy instance: {reason}");
                self.stop_instance(st, id, &format!("unhealthy: {reason}"))?;
                vacancies.push(vacancy);
            }
            for id in &plan.stop {
                if Self::drains(st, &d, id) {
                    self.note_draining(st, id, now)?;
                    continue;
                }
                if Self::leaves_later(st, id, now) {
                    continue;
                }
                let leaving = st.instances.get(id).is_some_and(|i| i.leaving_since_ms > 0);
                let reason = if leaving {
                    "moved to another nest to spread replicas"
                } else {
                    "scaled down or rolled over"
                };
                self.stop_instance(st, id, reason)?;
            }
            if plan == scheduler::Plan::default() {
                self.respread(st, &d, now)?;
            }
            for slot in scheduler::slots::fill(vacancies, plan.create) {
                let message = match &slot {
                    Some(v) if v.not_before_ms > now => format!(
                        "replacement back-off {}s: {}",
                        scheduler::backoff(v.failures).as_secs(),
                        v.reason
                    ),
                    _ => "waiting for placement".to_string(),
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
                    resources: Vec::new(),
                    not_before_ms: slot.as_ref().map_or(0, |v| v.not_before_ms),
                    healthy_since_ms: 0,
                    replacement: slot.is_some(),
                    leaving_since_ms: 0,
                    for_resume: false,
                    slot_failures: slot.as_ref().map_or(0, |v| v.failures),
                    oom_kills: 0,
                    usage: Usage::default(),
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
    pub(in crate::core) fn drains(st: &State, d: &DeploymentRec, id: &str) -> bool {
        let Some(i) = st.instances.get(id) else {
            return false;
        };
        if i.bundle_digest == d.bundle_digest
            || !matches!(i.state, InstanceState::Running | InstanceState::Starting)
        {
            return false;
        }
        st.tasks.live().any(|t| {
            t.namespace == d.namespace
                && t.deployment == d.name
                && t.bundle_digest == i.bundle_digest
        })
    }

    /// Stops the instances placed to resume an old version's runs once none is left.
    fn stop_idle_resume_instances(&self, st: &mut State, d: &DeploymentRec) -> Result<()> {
        let idle: Vec<String> = st
            .instances
            .values()
            .filter(|i| i.for_resume && i.namespace == d.namespace && i.deployment == d.name)
            .filter(|i| {
                !matches!(
                    i.state,
                    InstanceState::Stopping | InstanceState::Stopped | InstanceState::Lost
                )
            })
            .filter(|i| {
                !st.tasks.live().any(|t| {
                    t.namespace == d.namespace
                        && t.deployment == d.name
                        && t.bundle_digest == i.bundle_digest
                })
            })
            .map(|i| i.instance_id.clone())
            .collect();
        for id in idle {
            self.stop_instance(st, &id, "no run of its version is left to resume")?;
        }
        Ok(())
    }

    /// Says on an old-version instance that it stays only for its version's runs.
    fn note_draining(&self, st: &mut State, id: &str, now: i64) -> Result<()> {
        let Some(mut inst) = st.instances.get(id).cloned() else {
            return Ok(());
        };
        if inst.message.starts_with(agen_contract::run::DRAINING_NOTE) {
            return Ok(());
        }
        inst.message = agen_contract::run::DRAINING_NOTE.to_string();
        inst.updated_at_ms = now;
        self.save_instance(st, inst)
    }

    /// What Nest `n` advertises and what its placed instances reserve (`None`: it advertises
    /// nothing, as a Nest older than per-instance resources). Placement and re-spread both
    /// read it.
    pub(in crate::core) fn nest_resources(
        st: &State,
        n: &NestRec,
    ) -> Option<scheduler::NestResources> {
        if n.cpu_millis == 0 || n.memory_bytes == 0 {
            return None;
        }
        let (mut rcpu, mut rmem) = (0u64, 0u64);
        for i in st.instances.values().filter(|i| {
            i.nest_id == n.nest_id
                && !matches!(i.state, InstanceState::Lost | InstanceState::Pending)
        }) {
            let (c, m) = st
                .deployments
                .get(&deployment_key(&i.namespace, &i.deployment))
                .map(|d| d.resources)
                .unwrap_or_default()
                .reservation();
            rcpu += u64::from(c);
            rmem += m;
        }
        Some(scheduler::NestResources {
            cpu_millis: u64::from(n.cpu_millis),
            memory_bytes: n.memory_bytes,
            reserved_cpu_millis: rcpu,
            reserved_memory_bytes: rmem,
        })
    }

    pub(in crate::core) fn place_pending(&self, st: &mut State, now: i64) -> Result<()> {
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
                    let resources = Self::nest_resources(st, n);
                    NestView {
                        nest_id: n.nest_id.clone(),
                        labels: n.labels.clone(),
                        // `--max-instances-per-nest` caps what the Nest declares.
                        capacity: n.capacity.min(self.opts.limits.max_instances_per_nest),
                        ready: n.state == NestState::Ready
                            && !n.cordoned
                            && !n.draining(now)
                            && st.live.is_connected(&n.nest_id),
                        total,
                        of_deployment,
                        resources,
                    }
                })
                .collect();
            let (cpu, mem) = d.resources.reservation();
            let need = scheduler::Need {
                cpu_millis: u64::from(cpu),
                memory_bytes: mem,
            };
            match scheduler::pick_nest(&views, &d.selector, need) {
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
                            resources: d.resources,
                        },
                    );
                    self.save_instance(st, inst)?;
                }
                Err(why) => {
                    let mut message = why.describe(&d.selector);
                    if why == scheduler::NoPlacement::NoCapacity {
                        message = format!(
                            "{message} (its declared capacity, or the hub's limit of {} instances per nest: agen hub --max-instances-per-nest); add a nest or raise the limit",
                            self.opts.limits.max_instances_per_nest
                        );
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_store_and_the_reconcile_loop() {
        let now = 100_000;
        let table = [
            (true, now - 250, true),
            (true, now - RECONCILE_STALL_MS + 1, true),
            (true, now - RECONCILE_STALL_MS, false),
            (false, now - 250, false),
            (false, now - RECONCILE_STALL_MS, false),
        ];
        for (store_ok, at, want) in table {
            assert_eq!(serving(store_ok, at, now), want, "{store_ok} {at}");
        }
    }
}
