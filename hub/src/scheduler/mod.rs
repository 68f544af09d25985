//! Placement decisions, pure: no IO, no clocks (times are passed in), unit-tested.
//!
//! - [`pick_nest`]: a ready Nest whose labels include every selector pair and that has capacity
//!   left (an instance count, and the CPU and memory the instance reserves free of what its
//!   other instances reserve), spreading replicas (fewest instances of this deployment, then
//!   fewest in total).
//! - [`plan`]: what to create and stop for one deployment (replica count, roll-over to a new
//!   generation, unhealthy instances).
//! - [`backoff`]: replacement back-off 1s, 2s, 4s … capped at 60s, counted per replica slot
//!   ([`slots`]: one instance's crashes never delay the replacement of another).
//! - [`dispatch::choose`]: which instance runs a queued task now.
//! - [`spread::pick_move`]: which instance moves when replicas are unevenly spread.

pub mod dispatch;
pub mod slots;
pub mod spread;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::InstanceState;

/// What the scheduler needs to know about a Nest.
#[derive(Debug, Clone, PartialEq)]
pub struct NestView {
    pub nest_id: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    /// Connected and heartbeating.
    pub ready: bool,
    /// Instances placed on it (every deployment).
    pub total: u32,
    /// Instances of the deployment being placed.
    pub of_deployment: u32,
    /// What it advertises and what its instances reserve; `None`: a Nest that advertises
    /// nothing (older), checked by instance count only.
    pub resources: Option<NestResources>,
}

/// A Nest's CPU (thousandths) and memory (bytes): advertised and reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NestResources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub reserved_cpu_millis: u64,
    pub reserved_memory_bytes: u64,
}

/// What one instance reserves: thousandths of a CPU, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Need {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl NestResources {
    fn holds(&self, need: Need) -> bool {
        need.cpu_millis <= self.cpu_millis && need.memory_bytes <= self.memory_bytes
    }

    /// Whether one more instance needing `need` fits beside what is reserved.
    pub fn fits(&self, need: Need) -> bool {
        self.reserved_cpu_millis.saturating_add(need.cpu_millis) <= self.cpu_millis
            && self.reserved_memory_bytes.saturating_add(need.memory_bytes) <= self.memory_bytes
    }
}

/// Why nothing could be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoPlacement {
    NoNests,
    NoMatch,
    NoCapacity,
    /// No matching Nest is that big, even empty: the largest one's (cpu, memory).
    TooBig {
        need: Need,
        largest: Need,
    },
    /// Matching Nests are big enough but have too little free.
    NoRoom {
        need: Need,
    },
}

impl NoPlacement {
    /// A line for `agen ps`.
    pub fn describe(&self, selector: &BTreeMap<String, String>) -> String {
        match self {
            NoPlacement::NoNests => "waiting for a ready nest (none connected)".into(),
            NoPlacement::NoMatch => format!(
                "no ready nest matches selector {}",
                format_selector(selector)
            ),
            NoPlacement::NoCapacity => "every matching nest is at capacity".into(),
            NoPlacement::TooBig { need, largest } => format!(
                "no nest is big enough: the instance reserves {} and the largest matching nest has {}; lower `resources` in x-agen/config.json (or agen deploy --cpu/--memory) or add a bigger nest",
                describe_need(*need),
                describe_need(*largest)
            ),
            NoPlacement::NoRoom { need } => format!(
                "every matching nest has less than {} free (reserved by its other instances); scale something down or add a nest",
                describe_need(*need)
            ),
        }
    }
}

fn describe_need(n: Need) -> String {
    use agen_shared::bundle::resources::{format_bytes, format_cpu};
    format!(
        "cpu {}, memory {}",
        format_cpu(u32::try_from(n.cpu_millis).unwrap_or(u32::MAX)),
        format_bytes(n.memory_bytes)
    )
}

pub fn format_selector(selector: &BTreeMap<String, String>) -> String {
    if selector.is_empty() {
        return "{}".into();
    }
    let pairs: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// Whether `labels` carries every pair of `selector`.
pub fn matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The Nest to place one more instance on.
pub fn pick_nest<'a>(
    nests: &'a [NestView],
    selector: &BTreeMap<String, String>,
    need: Need,
) -> Result<&'a NestView, NoPlacement> {
    let ready: Vec<&NestView> = nests.iter().filter(|n| n.ready).collect();
    if ready.is_empty() {
        return Err(NoPlacement::NoNests);
    }
    let matching: Vec<&NestView> = ready
        .into_iter()
        .filter(|n| matches(selector, &n.labels))
        .collect();
    if matching.is_empty() {
        return Err(NoPlacement::NoMatch);
    }
    if !matching
        .iter()
        .any(|n| n.resources.is_none_or(|r| r.holds(need)))
    {
        let largest = matching
            .iter()
            .filter_map(|n| n.resources)
            .map(|r| Need {
                cpu_millis: r.cpu_millis,
                memory_bytes: r.memory_bytes,
            })
            .max_by_key(|l| (l.memory_bytes, l.cpu_millis))
            .unwrap_or_default();
        return Err(NoPlacement::TooBig { need, largest });
    }
    let counted: Vec<&NestView> = matching
        .into_iter()
        .filter(|n| n.total < n.capacity)
        .collect();
    if counted.is_empty() {
        return Err(NoPlacement::NoCapacity);
    }
    counted
        .into_iter()
        .filter(|n| n.resources.is_none_or(|r| r.fits(need)))
        .min_by(|a, b| {
            (a.of_deployment, a.total, &a.nest_id).cmp(&(b.of_deployment, b.total, &b.nest_id))
        })
        .ok_or(NoPlacement::NoRoom { need })
}

/// Replacement back-off after `failures` consecutive failures: 1s, 2s, 4s … 60s.
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let secs = 1u64 << (failures - 1).min(6);
    Duration::from_secs(secs.min(60))
}

/// What the scheduler needs to know about an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstView {
    pub instance_id: String,
    pub generation: u64,
    pub state: InstanceState,
    pub healthy: bool,
    pub created_at_ms: i64,
    /// Being moved to another Nest: kept like an old generation until its replacement runs.
    pub leaving: bool,
}

/// Actions for one deployment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// New instances of the current generation to create.
    pub create: u32,
    /// Instances to stop because they are unhealthy (each needs a replacement with back-off).
    pub replace: Vec<String>,
    /// Instances to stop because they are surplus or of an older generation.
    pub stop: Vec<String>,
}

/// Plans one deployment: keep `replicas` instances of `generation`; stop unhealthy ones; keep
/// old-generation instances only until enough new ones run.
pub fn plan(replicas: u32, generation: u64, instances: &[InstView]) -> Plan {
    let mut out = Plan::default();
    let mut current: Vec<&InstView> = Vec::new();
    let mut old: Vec<&InstView> = Vec::new();
    for i in instances {
        match i.state {
            InstanceState::Lost | InstanceState::Stopping | InstanceState::Stopped => {}
            InstanceState::Unhealthy => out.replace.push(i.instance_id.clone()),
            _ if i.generation == generation && !i.leaving => current.push(i),
            // An old-generation placement that never started is of no use.
            InstanceState::Pending => out.stop.push(i.instance_id.clone()),
            _ => old.push(i),
        }
    }
    let rank = |i: &InstView| match i.state {
        InstanceState::Pending => 0,
        InstanceState::Starting => 1,
        _ => 2,
    };
    let replicas_n = replicas as usize;
    if current.len() > replicas_n {
        // Stop pending first, then starting, then the newest.
        current.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then(b.created_at_ms.cmp(&a.created_at_ms))
        });
        let surplus = current.len() - replicas_n;
        out.stop
            .extend(current.drain(..surplus).map(|i| i.instance_id.clone()));
    } else {
        out.create = (replicas_n - current.len()) as u32;
    }
    let running_current = current
        .iter()
        .filter(|i| i.state == InstanceState::Running && i.healthy)
        .count();
    let keep_old = replicas_n.saturating_sub(running_current);
    if old.len() > keep_old {
        old.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then(a.created_at_ms.cmp(&b.created_at_ms))
        });
        let surplus = old.len() - keep_old;
        out.stop
            .extend(old.drain(..surplus).map(|i| i.instance_id.clone()));
    }
    out
}

#[cfg(test)]
mod tests;
