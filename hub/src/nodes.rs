//! Nest liveness and links: the sending half of each connected Nest's stream, when each Nest
//! was last heard from (a monotonic clock that starts afresh at Hub boot), and the messages the
//! Hub sends to Nests in domain form ([`ToNest`]; `server/nest.rs` turns them into protobuf).
//!
//! Invariants: a Nest has at most one live link; a link is identified by a connection id so
//! that the end of an old stream never removes a newer one; a Nest is lost only after
//! `nest_ttl` + one heartbeat interval of silence, counted from Hub boot at the earliest, or
//! `nest_disconnect_grace` after its stream closed (unless it reconnected); a message sent
//! with [`Liveness::send_durable`] (a run assignment) is held until a store flush that covers
//! the writes before it has finished ([`Liveness::release`]), and any later message to the
//! same Nest queues behind it, so a Nest never hears of a run the store does not know.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// A message for one Nest.
#[derive(Debug, Clone, PartialEq)]
pub enum ToNest {
    Registered {
        nest_id: String,
        heartbeat_interval_ms: u32,
        stop_instances: Vec<String>,
        disconnect_grace_ms: u32,
    },
    Place {
        instance_id: String,
        namespace: String,
        deployment: String,
        bundle_digest: String,
        generation: u64,
        concurrency: u32,
        /// Values of the bundle's `platform` secrets (`Debug` shows names only).
        platform_secrets: crate::secrets::SecretValues,
    },
    Stop {
        instance_id: String,
        reason: String,
    },
    AssignRun(Box<RunAssignment>),
    CancelRun {
        run_id: String,
        instance_id: String,
        reason: String,
    },
    /// Keeps the Nest's self-fence timer from firing (see `HubPing` in nest.proto).
    Ping,
    Ack {
        run_id: String,
        attempt: u32,
        acked_seq: u64,
        fenced: bool,
    },
}

/// Everything an instance needs to execute one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunAssignment {
    pub run_id: String,
    pub attempt: u32,
    pub task_id: String,
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub conversation_id: String,
    pub conversation_key: String,
    pub root_run_id: String,
    pub bundle_digest: String,
    pub history_json: String,
    pub replay_json: String,
}

pub type NestTx = mpsc::UnboundedSender<ToNest>;

struct Link {
    conn_id: u64,
    tx: NestTx,
}

/// Links and liveness clocks of every Nest.
pub struct Liveness {
    links: HashMap<String, Link>,
    last_seen: HashMap<String, Instant>,
    /// When the stream of a Nest closed (cleared when it reconnects).
    disconnected_at: HashMap<String, Instant>,
    next_conn: u64,
    /// Messages waiting for a store flush, with the ticket each was held under.
    held: VecDeque<(u64, String, ToNest)>,
    next_ticket: u64,
}

impl Liveness {
    /// Clocks of `known` Nests start now (Hub boot): none is lost before a full ttl passes.
    pub fn new(known: impl IntoIterator<Item = String>) -> Liveness {
        let now = Instant::now();
        Liveness {
            links: HashMap::new(),
            last_seen: known.into_iter().map(|id| (id, now)).collect(),
            disconnected_at: HashMap::new(),
            next_conn: 1,
            held: VecDeque::new(),
            next_ticket: 0,
        }
    }

    /// Installs a new link for `nest_id` (replacing an older one) and returns its id.
    pub fn connect(&mut self, nest_id: &str, tx: NestTx) -> u64 {
        self.next_conn += 1;
        let conn_id = self.next_conn;
        self.links.insert(nest_id.to_string(), Link { conn_id, tx });
        self.last_seen.insert(nest_id.to_string(), Instant::now());
        self.disconnected_at.remove(nest_id);
        conn_id
    }

    /// Removes the link if it is still connection `conn_id`; returns whether it did.
    pub fn disconnect(&mut self, nest_id: &str, conn_id: u64) -> bool {
        if self.links.get(nest_id).map(|l| l.conn_id) == Some(conn_id) {
            self.links.remove(nest_id);
            self.disconnected_at
                .insert(nest_id.to_string(), Instant::now());
            return true;
        }
        false
    }

    /// How long ago the stream of `nest_id` closed, when it is closed and has not reconnected
    /// (`None` for a Nest that was never connected since Hub boot).
    pub fn disconnected_for(&self, nest_id: &str) -> Option<Duration> {
        if self.links.contains_key(nest_id) {
            return None;
        }
        self.disconnected_at.get(nest_id).map(|t| t.elapsed())
    }

    /// Whether `conn_id` is the live link of `nest_id`.
    pub fn is_current(&self, nest_id: &str, conn_id: u64) -> bool {
        self.links.get(nest_id).map(|l| l.conn_id) == Some(conn_id)
    }

    pub fn seen(&mut self, nest_id: &str) {
        self.last_seen.insert(nest_id.to_string(), Instant::now());
    }

    pub fn is_connected(&self, nest_id: &str) -> bool {
        self.links.contains_key(nest_id)
    }

    /// How long `nest_id` has been silent (zero when never tracked).
    pub fn silent_for(&self, nest_id: &str) -> Duration {
        self.last_seen
            .get(nest_id)
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    /// Sends to a connected Nest (behind any message held for it); returns false when it is
    /// not connected.
    pub fn send(&mut self, nest_id: &str, msg: ToNest) -> bool {
        if self.held.iter().any(|(_, n, _)| n == nest_id) {
            if !self.links.contains_key(nest_id) {
                return false;
            }
            let ticket = self.next_ticket;
            self.held.push_back((ticket, nest_id.to_string(), msg));
            return true;
        }
        self.send_now(nest_id, msg)
    }

    fn send_now(&self, nest_id: &str, msg: ToNest) -> bool {
        match self.links.get(nest_id) {
            Some(link) => link.tx.send(msg).is_ok(),
            None => false,
        }
    }

    /// Holds `msg` until [`Liveness::release`] is called with a mark taken after it: the
    /// caller's store writes before this call are then durable.
    pub fn send_durable(&mut self, nest_id: &str, msg: ToNest) {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.held.push_back((ticket, nest_id.to_string(), msg));
    }

    /// The ticket a flush started now covers.
    pub fn mark(&self) -> u64 {
        self.next_ticket
    }

    /// Sends every held message whose ticket is at most `upto` (a flush covering them ended).
    /// A message for a Nest that is no longer connected is dropped: reconciliation notices the
    /// run that never arrived.
    pub fn release(&mut self, upto: u64) {
        while self.held.front().is_some_and(|(t, _, _)| *t <= upto) {
            if let Some((_, nest_id, msg)) = self.held.pop_front() {
                self.send_now(&nest_id, msg);
            }
        }
    }

    /// Forgets every held message (the store was reopened: what they announce may be gone).
    pub fn drop_held(&mut self) -> usize {
        let n = self.held.len();
        self.held.clear();
        n
    }

    /// Number of messages waiting for a flush.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Drops the link of a lost Nest (its stream ends).
    pub fn drop_link(&mut self, nest_id: &str) {
        self.links.remove(nest_id);
        self.disconnected_at.remove(nest_id);
    }

    /// Every connected Nest.
    pub fn connected(&self) -> Vec<String> {
        self.links.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(id: &str) -> ToNest {
        ToNest::Stop {
            instance_id: id.into(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_held_message_leaves_only_after_a_flush_that_covers_it_and_later_ones_queue_behind() {
        let mut live = Liveness::new([]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        live.connect("n1", tx);
        live.send_durable("n1", stop("assign"));
        live.send("n1", stop("after"));
        let upto = live.mark();
        live.send_durable("n1", stop("later"));
        assert!(rx.try_recv().is_err(), "nothing leaves before the flush");
        live.release(upto);
        assert_eq!(rx.try_recv().ok(), Some(stop("assign")));
        assert_eq!(rx.try_recv().ok(), Some(stop("after")));
        assert!(
            rx.try_recv().is_err(),
            "a write after the mark waits for the next flush"
        );
        live.release(live.mark());
        assert_eq!(rx.try_recv().ok(), Some(stop("later")));
        assert_eq!(live.held(), 0);
    }
}
