//! What the simulated fleet counts while it runs, shared by every simulated Nest and run: the
//! messages sent (heartbeats, instance reports, run events), the placements and assignments
//! received with when they arrived, the side effects each task executed (the ledger that says
//! "0 twice"), and the runs that finished.
//!
//! Invariant: counters only grow; a figure of a phase is the difference of two [`Counts`]
//! read before and after it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Counters and ledgers of one simulator run.
pub struct Stats {
    pub heartbeats: AtomicU64,
    pub reports: AtomicU64,
    pub events: AtomicU64,
    pub acks: AtomicU64,
    pub placements: AtomicU64,
    pub assigns: AtomicU64,
    /// Runs given up with `run.interrupted` (their context could not be fetched).
    pub interrupted: AtomicU64,
    /// Resumed attempts whose replay held a started side effect with no end: the call is
    /// reported `effect_unknown`, never made again.
    pub effect_unknown: AtomicU64,
    inner: Mutex<Ledgers>,
}

#[derive(Default)]
struct Ledgers {
    /// When each PlaceInstance arrived (after `since`).
    placed_at: Vec<Instant>,
    /// Task id → when its first attempt was assigned.
    first_assign: HashMap<String, Instant>,
    /// Task id → (attempt, Nest index, when) of every assignment.
    assigned: HashMap<String, Vec<(u32, usize, Instant)>>,
    /// Task id → times its side effect was executed.
    effects: HashMap<String, u32>,
    /// Task id → when its `run.finished` was acknowledged, and at which attempt.
    finished: HashMap<String, (Instant, u32)>,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub heartbeats: u64,
    pub reports: u64,
    pub events: u64,
    pub placements: u64,
    pub assigns: u64,
}

impl Counts {
    pub fn since(self, before: Counts) -> Counts {
        Counts {
            heartbeats: self.heartbeats - before.heartbeats,
            reports: self.reports - before.reports,
            events: self.events - before.events,
            placements: self.placements - before.placements,
            assigns: self.assigns - before.assigns,
        }
    }
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            heartbeats: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            events: AtomicU64::new(0),
            acks: AtomicU64::new(0),
            placements: AtomicU64::new(0),
            assigns: AtomicU64::new(0),
            interrupted: AtomicU64::new(0),
            effect_unknown: AtomicU64::new(0),
            inner: Mutex::new(Ledgers::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledgers> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn counts(&self) -> Counts {
        Counts {
            heartbeats: self.heartbeats.load(Ordering::Relaxed),
            reports: self.reports.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            placements: self.placements.load(Ordering::Relaxed),
            assigns: self.assigns.load(Ordering::Relaxed),
        }
    }

    pub fn placed(&self) {
        self.placements.fetch_add(1, Ordering::Relaxed);
        self.lock().placed_at.push(Instant::now());
    }

    /// When the `n`-th placement after `from` (counted in arrival order) arrived.
    pub fn nth_placement_after(&self, from: Instant, n: usize) -> Option<Instant> {
        let l = self.lock();
        l.placed_at
            .iter()
            .filter(|t| **t >= from)
            .nth(n.checked_sub(1)?)
            .copied()
    }

    /// The last placement that arrived at or after `from`.
    pub fn last_placement_after(&self, from: Instant) -> Option<Instant> {
        let l = self.lock();
        l.placed_at.iter().filter(|t| **t >= from).max().copied()
    }

    pub fn assigned(&self, task_id: &str, attempt: u32, nest: usize) {
        self.assigns.fetch_add(1, Ordering::Relaxed);
        let mut l = self.lock();
        if attempt == 1 {
            l.first_assign
                .entry(task_id.to_string())
                .or_insert_with(Instant::now);
        }
        l.assigned
            .entry(task_id.to_string())
            .or_default()
            .push((attempt, nest, Instant::now()));
    }

    pub fn first_assign(&self, task_id: &str) -> Option<Instant> {
        self.lock().first_assign.get(task_id).copied()
    }

    /// The attempts of `task_id` assigned so far, with the Nest each went to and when.
    pub fn attempts(&self, task_id: &str) -> Vec<(u32, usize, Instant)> {
        self.lock()
            .assigned
            .get(task_id)
            .cloned()
            .unwrap_or_default()
    }

    pub fn executed(&self, task_id: &str) {
        *self.lock().effects.entry(task_id.to_string()).or_default() += 1;
    }

    /// Tasks whose side effect ran more than once.
    pub fn twice(&self) -> usize {
        self.lock().effects.values().filter(|n| **n > 1).count()
    }

    pub fn effects(&self) -> usize {
        self.lock().effects.len()
    }

    pub fn finished(&self, task_id: &str, attempt: u32) {
        self.lock()
            .finished
            .entry(task_id.to_string())
            .or_insert((Instant::now(), attempt));
    }

    pub fn finished_at(&self, task_id: &str) -> Option<(Instant, u32)> {
        self.lock().finished.get(task_id).copied()
    }
}

/// The `q`-quantile (0..=1) of `xs` (sorted here), nearest rank; `None` when empty.
pub fn quantile(xs: &mut [f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    Some(xs[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut xs, 0.5), Some(50.0));
        assert_eq!(quantile(&mut xs, 0.99), Some(99.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    #[test]
    fn a_task_executed_twice_is_counted() {
        let s = Stats::new();
        s.executed("a");
        s.executed("b");
        s.executed("a");
        assert_eq!((s.effects(), s.twice()), (2, 1));
    }
}
