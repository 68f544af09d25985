//! Nests: register (a new link replaces the old), heartbeat and instance reports, disconnects,
//! and liveness: this is where a Nest is declared lost and its instances with it.

use std::collections::HashSet;

use crate::core::leases::Requeue;
use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::nodes::{NestTx, ToNest};

use crate::model::*;

/// The most MCP resources the Hub keeps per instance (a Nest's report is cut to these).
pub const MAX_INSTANCE_RESOURCES: usize = 100;

impl Core {
    /// Sends a message on a Nest's live link; false when the Nest is not connected.
    pub fn send_to_nest(&self, nest_id: &str, msg: ToNest) -> bool {
        self.lock().live.send(nest_id, msg)
    }

    /// Sends messages on a Nest's live link in order (acknowledgements of stored run events).
    pub fn send_all_to_nest(&self, nest_id: &str, msgs: impl IntoIterator<Item = ToNest>) {
        let mut st = self.lock();
        for msg in msgs {
            st.live.send(nest_id, msg);
        }
    }

    /// Whether `conn_id` is still the Nest's current link (an older link stops pinging).
    pub fn link_is_current(&self, nest_id: &str, conn_id: u64) -> bool {
        self.lock().live.is_current(nest_id, conn_id)
    }

    /// Whether the Nest has a live link to this Hub right now.
    pub fn nest_connected(&self, nest_id: &str) -> bool {
        self.lock().live.is_connected(nest_id)
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

    /// What the instances placed on each Nest reserve: (thousandths of a CPU, bytes) by Nest id.
    pub fn nest_reservations(&self) -> std::collections::HashMap<String, (u64, u64)> {
        let st = self.lock();
        let mut out = std::collections::HashMap::new();
        for i in st.instances.values().filter(|i| {
            !i.nest_id.is_empty()
                && !matches!(i.state, InstanceState::Lost | InstanceState::Pending)
        }) {
            let (c, m) = st
                .deployments
                .get(&deployment_key(&i.namespace, &i.deployment))
                .map(|d| d.resources)
                .unwrap_or_default()
                .reservation();
            let e: &mut (u64, u64) = out.entry(i.nest_id.clone()).or_default();
            e.0 += u64::from(c);
            e.1 += m;
        }
        out
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
            if !st.live.is_connected(&reg.nest_id) {
                // `--max-nests`: a Nest already connected may register again (a new stream).
                let r = (self.opts.limits).check_nests(&reg.nest_id, st.live.connected_count());
                self.limit_refusals.count("nests", r)?;
            }
            let now = now_ms();
            let registered_at_ms = st
                .nests
                .get(&reg.nest_id)
                .map(|n| n.registered_at_ms)
                .unwrap_or(now);
            let name = Self::nest_name_for(&st, &reg)?;
            let cordoned = st.nests.get(&reg.nest_id).is_some_and(|n| n.cordoned);
            // A drain ends with a new registration, unless the Nest is cordoned (`agen nests
            // drain` goes on across reconnects).
            let draining_until_ms = st
                .nests
                .get(&reg.nest_id)
                .filter(|n| n.cordoned)
                .map_or(0, |n| n.draining_until_ms);
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
                config_cordon: st.nests.get(&reg.nest_id).is_some_and(|n| n.config_cordon),
                separation: reg.separation.clone(),
                network: reg.network.clone(),
                draining_until_ms,
                commit: reg.commit.clone(),
                protocol_version: reg.protocol_version.clone(),
                cpu_millis: reg.cpu_millis,
                memory_bytes: reg.memory_bytes,
                resources: reg.resources.clone(),
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
                    self.delete_instance(&mut st, &id)?;
                } else {
                    self.end_stopped(&mut st, &id)?;
                }
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

    /// Run events of `nest_id` could not be stored. While the store cannot write (a full
    /// disk) the link stays up, so that its pings keep the Nest's runs going and the Nest is
    /// not lost for the Hub's disk, and its link is cut once the store heals, so that it
    /// resends what was not acknowledged; returns whether it is so (otherwise the caller ends
    /// the link at once).
    pub fn keep_link_while_store_broken(&self, nest_id: &str) -> bool {
        // Under the lock: a heal's reload (which cuts the links) is either before it, and the
        // store is no longer broken, or after it, and cuts this link too.
        let mut st = self.lock();
        if self.db.broken().is_none() {
            return false;
        }
        st.live.unstored(nest_id);
        true
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
                self.end_stopped(&mut st, &id)?;
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

    pub(in crate::core) fn apply_instance_report(
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
        if matches!(rec.state, InstanceState::Stopping | InstanceState::Stopped) {
            // Only an OOM kill counted as it stopped is taken (with its message): it says why.
            if r.oom_kills > rec.oom_kills {
                rec.oom_kills = r.oom_kills;
                rec.message = r.message.clone();
                rec.updated_at_ms = now_ms();
                self.save_instance(st, rec)?;
            }
            return Ok(());
        }
        let before = rec.clone();
        apply_report(&mut rec, r);
        if rec != before {
            self.save_instance(st, rec)?;
        }
        // Usage changes with every report: kept in memory, never stored.
        if let Some(i) = st.instances.get_mut(&r.instance_id) {
            i.usage = r.usage.clone();
        }
        Ok(())
    }

    /// Marks an instance lost; its running tasks are re-queued.
    pub(in crate::core) fn mark_lost(&self, st: &mut State, id: &str, why: &str) -> Result<()> {
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

    pub(in crate::core) fn check_liveness(&self, st: &mut State) -> Result<()> {
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

    /// A stopping instance its Nest no longer runs: forgotten, unless it was killed by its
    /// memory limit; then it is kept as stopped (with the Nest's message saying so) for the
    /// ended-instance retention, so `agen ps --all` shows why it went.
    fn end_stopped(&self, st: &mut State, id: &str) -> Result<()> {
        match st.instances.get(id).cloned() {
            Some(mut rec) if rec.oom_kills > 0 => {
                if rec.state != InstanceState::Stopped {
                    rec.state = InstanceState::Stopped;
                    rec.healthy = false;
                    rec.healthy_since_ms = 0;
                    rec.updated_at_ms = now_ms();
                    self.save_instance(st, rec)?;
                }
                Ok(())
            }
            _ => self.delete_instance(st, id),
        }
    }

    /// Marks a Nest lost: its link ends, its instances are lost and their runs re-queued.
    pub(in crate::core) fn lose_nest(
        &self,
        st: &mut State,
        nest_id: &str,
        why: &str,
    ) -> Result<()> {
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
    rec.resources = r.resources.clone();
    rec.oom_kills = rec.oom_kills.max(r.oom_kills);
    rec.updated_at_ms = now;
}
