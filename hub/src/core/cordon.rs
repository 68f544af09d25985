//! Node lifecycle: cordon (no new placements on a Nest), uncordon, and drain (cordon, then
//! move its instances to other Nests now: each is stopped, its runs go back to the queue and
//! are handed over, and the reconcile loop places a replacement elsewhere).
//!
//! Invariant: a cordoned Nest gets no placement until it is uncordoned, across its
//! re-registrations and Hub restarts (the flag is in its stored record).

use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::model::{InstanceState, NestRec};
use crate::store::Table;

impl Core {
    /// The id of the Nest named `nest` (name or id).
    fn nest_id_of(st: &State, nest: &str) -> Result<String> {
        if st.nests.contains_key(nest) {
            return Ok(nest.to_string());
        }
        let named: Vec<&NestRec> = st.nests.values().filter(|n| n.name == nest).collect();
        match named.as_slice() {
            [one] => Ok(one.nest_id.clone()),
            [] => Err(HubError::not_found(format!(
                "nest {nest} not found; list them with agen nests"
            ))),
            _ => Err(HubError::invalid(format!(
                "nest: {} nests are named {nest}; name one by its id (agen nests shows them)",
                named.len()
            ))),
        }
    }

    fn set_cordoned(&self, st: &mut State, id: &str, cordoned: bool) -> Result<NestRec> {
        let mut n = st
            .nests
            .get(id)
            .cloned()
            .ok_or_else(|| HubError::not_found(format!("nest {id} not found")))?;
        // Uncordoning ends a drain too.
        let drain_over = !cordoned && n.draining_until_ms != 0;
        if n.cordoned != cordoned || drain_over {
            n.cordoned = cordoned;
            if drain_over {
                n.draining_until_ms = 0;
            }
            self.db.put_json(Table::Nests, id, &n)?;
            st.nests.insert(id.to_string(), n.clone());
        }
        Ok(n)
    }

    /// No new placements on `nest`; what runs there keeps running.
    pub async fn cordon_nest(&self, nest: &str) -> Result<NestRec> {
        let n = {
            let mut st = self.lock();
            let id = Self::nest_id_of(&st, nest)?;
            self.set_cordoned(&mut st, &id, true)?
        };
        self.db.flush().await?;
        tracing::info!(nest = %n.name, nest_id = %n.nest_id, "nest cordoned");
        Ok(n)
    }

    /// Placements on `nest` again.
    pub async fn uncordon_nest(&self, nest: &str) -> Result<NestRec> {
        let n = {
            let mut st = self.lock();
            let id = Self::nest_id_of(&st, nest)?;
            self.set_cordoned(&mut st, &id, false)?
        };
        self.db.flush().await?;
        tracing::info!(nest = %n.name, nest_id = %n.nest_id, "nest uncordoned");
        self.poke();
        Ok(n)
    }

    /// A Nest's own settings (`NestSettings`, after each registration and SIGHUP): its
    /// labels replace the ones it registered with; its configured `cordon` cordons or
    /// uncordons it when it differs from the one last sent (so a cordon set through the API
    /// stays until the file changes).
    pub async fn nest_settings(
        &self,
        nest_id: &str,
        conn_id: u64,
        labels: std::collections::BTreeMap<String, String>,
        cordon: bool,
    ) -> Result<()> {
        let changed = {
            let mut st = self.lock();
            if !st.live.is_current(nest_id, conn_id) {
                return Ok(());
            }
            let Some(mut n) = st.nests.get(nest_id).cloned() else {
                return Ok(());
            };
            let mut changed = Vec::new();
            if n.labels != labels {
                changed.push(format!("labels {}", describe_labels(&labels)));
                n.labels = labels;
            }
            if n.config_cordon != cordon {
                n.config_cordon = cordon;
                if n.cordoned != cordon {
                    changed.push(if cordon { "cordoned" } else { "uncordoned" }.to_string());
                    n.cordoned = cordon;
                    if !cordon {
                        // Uncordoning ends a drain too, as through the API.
                        n.draining_until_ms = 0;
                    }
                }
            }
            let name = n.name.clone();
            self.save_nest(&mut st, n)?;
            (!changed.is_empty()).then(|| (name, changed.join(", ")))
        };
        if let Some((name, what)) = changed {
            self.db.flush().await?;
            tracing::info!(nest = %name, nest_id, "nest settings from its configuration: {what}");
            self.poke();
        }
        Ok(())
    }

    /// Cordons `nest` and moves its instances away: now (their runs are handed over), or,
    /// with a deadline, each once it has no run left and the rest at the deadline (meanwhile
    /// no new run goes to the Nest). Returns the Nest and how many instances were moved now.
    pub async fn drain_nest(&self, nest: &str, deadline_ms: u64) -> Result<(NestRec, usize)> {
        let (n, moved) = {
            let mut st = self.lock();
            let id = Self::nest_id_of(&st, nest)?;
            let mut n = self.set_cordoned(&mut st, &id, true)?;
            let now = crate::model::now_ms();
            let deadline = i64::try_from(deadline_ms.min(24 * 3_600_000)).unwrap_or(0);
            n.draining_until_ms = if deadline > 0 { now + deadline } else { now };
            self.save_nest(&mut st, n.clone())?;
            let moved = self.move_drained(&mut st, now, true)?;
            (n, moved)
        };
        self.db.flush().await?;
        tracing::info!(nest = %n.name, nest_id = %n.nest_id, moved, deadline_ms, "nest drained");
        self.poke();
        Ok((n, moved))
    }

    /// Moves the instances of draining Nests away: each one with no run left, and every one
    /// once its Nest's drain deadline passed (their runs are handed over). Returns how many
    /// were stopped. `all_due`: also those whose deadline is now.
    pub(in crate::core) fn move_drained(
        &self,
        st: &mut State,
        now: i64,
        all_due: bool,
    ) -> Result<usize> {
        let due: Vec<(String, String)> = st
            .instances
            .values()
            .filter(|i| {
                matches!(
                    i.state,
                    InstanceState::Starting | InstanceState::Running | InstanceState::Unhealthy
                )
            })
            .filter_map(|i| {
                let n = st.nests.get(&i.nest_id)?;
                if n.draining_until_ms == 0 {
                    return None;
                }
                let past = n.draining_until_ms < now || (all_due && n.draining_until_ms <= now);
                let idle = Self::active_runs_of(st, &i.instance_id) == 0;
                (past || idle).then(|| (i.instance_id.clone(), n.name.clone()))
            })
            .collect();
        for (i, name) in &due {
            self.stop_instance(st, i, &format!("nest {name} drained"))?;
        }
        Ok(due.len())
    }
}

/// `{a=1, b=2}`.
fn describe_labels(labels: &std::collections::BTreeMap<String, String>) -> String {
    let parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", parts.join(", "))
}
