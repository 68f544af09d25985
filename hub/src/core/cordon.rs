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
        if n.cordoned != cordoned {
            n.cordoned = cordoned;
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

    /// Cordons `nest` and moves its instances away now (their runs are handed over).
    /// Returns the Nest and how many instances were moved.
    pub async fn drain_nest(&self, nest: &str) -> Result<(NestRec, usize)> {
        let (n, moved) = {
            let mut st = self.lock();
            let id = Self::nest_id_of(&st, nest)?;
            let n = self.set_cordoned(&mut st, &id, true)?;
            let ids: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.nest_id == id)
                .filter(|i| {
                    matches!(
                        i.state,
                        InstanceState::Starting | InstanceState::Running | InstanceState::Unhealthy
                    )
                })
                .map(|i| i.instance_id.clone())
                .collect();
            let reason = format!("nest {} drained", n.name);
            for i in &ids {
                self.stop_instance(&mut st, i, &reason)?;
            }
            (n, ids.len())
        };
        self.db.flush().await?;
        tracing::info!(nest = %n.name, nest_id = %n.nest_id, moved, "nest drained");
        self.poke();
        Ok((n, moved))
    }
}
