//! Spreading replicas again when a Nest (re)joins: one instance at a time per deployment, a
//! replacement placed first and the leaving instance stopped only once that replacement runs
//! healthy and the leaving one has no active run (after [`HANDOVER_AFTER_MS`] its runs are
//! handed over as a drain does, costing them no attempt). The choice is the pure
//! [`scheduler::spread::pick_move`]; a target Nest must have the CPU and memory the
//! deployment's instances reserve free (as placement requires).

use crate::core::{Core, State};
use crate::error::Result;
use crate::model::*;
use crate::scheduler;
use crate::scheduler::spread::{SpreadInst, SpreadNest};

/// A leaving instance still busy this long after it was marked has its runs handed over.
pub(in crate::core) const HANDOVER_AFTER_MS: i64 = 60_000;

impl Core {
    /// Runs (running or waiting) assigned to instance `id` now.
    pub(in crate::core) fn active_runs_of(st: &State, id: &str) -> u32 {
        st.tasks
            .live()
            .filter(|t| matches!(t.state, TaskState::Running | TaskState::Waiting))
            .filter(|t| t.instance_id == id)
            .count() as u32
    }

    /// Whether a leaving instance that `plan` would stop keeps running for now (it has a run
    /// that may still finish where it is).
    pub(in crate::core) fn leaves_later(st: &State, id: &str, now: i64) -> bool {
        let Some(i) = st.instances.get(id) else {
            return false;
        };
        i.leaving_since_ms > 0
            && now - i.leaving_since_ms < HANDOVER_AFTER_MS
            && Self::active_runs_of(st, id) > 0
    }

    /// Marks at most one instance of `d` as leaving when its replicas are unevenly spread
    /// (the next plan places its replacement on the emptiest Nest).
    pub(in crate::core) fn respread(
        &self,
        st: &mut State,
        d: &DeploymentRec,
        now: i64,
    ) -> Result<()> {
        let (cpu, mem) = d.resources.reservation();
        let need = scheduler::Need {
            cpu_millis: u64::from(cpu),
            memory_bytes: mem,
        };
        let nests: Vec<SpreadNest<'_>> = st
            .nests
            .values()
            .map(|n| {
                let total = st
                    .instances
                    .values()
                    .filter(|i| {
                        i.nest_id == n.nest_id
                            && !matches!(i.state, InstanceState::Lost | InstanceState::Pending)
                    })
                    .count() as u32;
                SpreadNest {
                    nest_id: &n.nest_id,
                    placeable: n.state == NestState::Ready
                        && !n.cordoned
                        && st.live.is_connected(&n.nest_id)
                        && scheduler::matches(&d.selector, &n.labels)
                        && total < n.capacity.min(self.opts.limits.max_instances_per_nest)
                        // A Nest without the CPU or memory the instance reserves is no target
                        // (its replacement would wait there as pending).
                        && Self::nest_resources(st, n).is_none_or(|r| r.fits(need)),
                }
            })
            .collect();
        let instances: Vec<SpreadInst<'_>> = st
            .instances
            .values()
            .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
            .map(|i| SpreadInst {
                instance_id: &i.instance_id,
                nest_id: &i.nest_id,
                generation: i.generation,
                state: i.state,
                healthy: i.healthy,
                leaving: i.leaving_since_ms > 0,
                active_runs: Self::active_runs_of(st, &i.instance_id),
                created_at_ms: i.created_at_ms,
            })
            .collect();
        let Some(id) = scheduler::spread::pick_move(d.replicas, d.generation, &nests, &instances)
            .map(str::to_string)
        else {
            return Ok(());
        };
        let Some(mut rec) = st.instances.get(&id).cloned() else {
            return Ok(());
        };
        tracing::info!(deployment = %d.key(), instance = %id, nest = %rec.nest_name, "spreading replicas: moving one instance to a less crowded nest (its replacement is placed first)");
        rec.leaving_since_ms = now;
        rec.message = format!("moving off nest {} to spread replicas", rec.nest_name);
        rec.updated_at_ms = now;
        self.save_instance(st, rec)
    }
}
