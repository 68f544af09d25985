//! What a simulated Nest holds, shared by its session ([`super::nest`]) and its runs
//! ([`super::runs`]): its instances, where each run's acks go, and the wait for an ack.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agen_nest::model::{PlaceOrder, RunAttempt};
use tokio::sync::{watch, Semaphore};

use super::stats::Stats;

/// What every simulated Nest shares.
pub struct Shared {
    pub stats: Stats,
    /// Instances each Nest offers.
    pub capacity: u32,
    /// How long a simulated run takes, model turns and its tool call included.
    pub run_time: Duration,
    /// Sessions that got `Registered` (every Nest's first, and each return).
    pub registrations: AtomicUsize,
    /// Joins (CA fetch + `Join`) in flight at once.
    pub join_permits: Semaphore,
}

/// An instance the Hub placed on a simulated Nest.
pub struct SimInstance {
    pub order: PlaceOrder,
    /// The runs handed to it, with their task ids.
    pub runs: Vec<(RunAttempt, String)>,
}

/// A run's acks: the highest acked seq, and whether its attempt was fenced.
pub type AckRx = watch::Receiver<(u64, bool)>;

/// Where the acks of each `(run_id, attempt)` go.
type AckMap = HashMap<(String, u32), watch::Sender<(u64, bool)>>;

/// What a simulated Nest holds, shared by its session and its runs.
#[derive(Default)]
pub struct NestState {
    instances: Mutex<BTreeMap<String, SimInstance>>,
    acks: Mutex<AckMap>,
    pub registered: AtomicBool,
}

impl NestState {
    pub fn instances(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SimInstance>> {
        self.instances.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn acks(&self) -> std::sync::MutexGuard<'_, AckMap> {
        self.acks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts listening for the acks of `(run_id, attempt)`.
    pub fn watch_acks(&self, run_id: &str, attempt: u32) -> AckRx {
        let (tx, rx) = watch::channel((0, false));
        self.acks().insert((run_id.to_string(), attempt), tx);
        rx
    }

    /// The run is over on this Nest: the instance no longer lists it, its acks go nowhere.
    pub fn run_ended(&self, instance_id: &str, run_id: &str, attempt: u32) {
        self.acks().remove(&(run_id.to_string(), attempt));
        if let Some(i) = self.instances().get_mut(instance_id) {
            i.runs
                .retain(|(r, _)| !(r.run_id == run_id && r.attempt == attempt));
        }
    }

    /// Runs held by this Nest's instances now.
    pub fn active_runs(&self) -> usize {
        self.instances().values().map(|i| i.runs.len()).sum()
    }

    /// The tasks (and attempts) of the runs held now.
    pub fn active_tasks(&self) -> Vec<(String, u32)> {
        self.instances()
            .values()
            .flat_map(|i| i.runs.iter().map(|(r, t)| (t.clone(), r.attempt)))
            .collect()
    }

    pub fn instance_count(&self) -> usize {
        self.instances().len()
    }
}

/// How long to wait for a run's ack at most before the run gives up.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until `seq` is acked (true) or the attempt is fenced or the wait times out (false).
pub async fn acked(rx: &mut AckRx, seq: u64) -> bool {
    let deadline = Instant::now() + ACK_TIMEOUT;
    loop {
        let (acked, fenced) = *rx.borrow_and_update();
        if fenced {
            return false;
        }
        if acked >= seq {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => return false,
        }
    }
}
