//! Nest liveness and links: the sending half of each connected Nest's stream, when each Nest
//! was last heard from (a monotonic clock that starts afresh at Hub boot), and the messages the
//! Hub sends to Nests in domain form ([`ToNest`]; `server/nest.rs` turns them into protobuf).
//!
//! Invariants: a Nest has at most one live link; a link is identified by a connection id so
//! that the end of an old stream never removes a newer one; a Nest is lost only after
//! `nest_ttl` + one heartbeat interval of silence, counted from Hub boot at the earliest.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// A message for one Nest.
#[derive(Debug, Clone, PartialEq)]
pub enum ToNest {
    Registered {
        nest_id: String,
        heartbeat_interval_ms: u32,
        stop_instances: Vec<String>,
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
    next_conn: u64,
}

impl Liveness {
    /// Clocks of `known` Nests start now (Hub boot): none is lost before a full ttl passes.
    pub fn new(known: impl IntoIterator<Item = String>) -> Liveness {
        let now = Instant::now();
        Liveness {
            links: HashMap::new(),
            last_seen: known.into_iter().map(|id| (id, now)).collect(),
            next_conn: 1,
        }
    }

    /// Installs a new link for `nest_id` (replacing an older one) and returns its id.
    pub fn connect(&mut self, nest_id: &str, tx: NestTx) -> u64 {
        self.next_conn += 1;
        let conn_id = self.next_conn;
        self.links.insert(nest_id.to_string(), Link { conn_id, tx });
        self.last_seen.insert(nest_id.to_string(), Instant::now());
        conn_id
    }

    /// Removes the link if it is still connection `conn_id`; returns whether it did.
    pub fn disconnect(&mut self, nest_id: &str, conn_id: u64) -> bool {
        if self.links.get(nest_id).map(|l| l.conn_id) == Some(conn_id) {
            self.links.remove(nest_id);
            return true;
        }
        false
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

    /// Sends to a connected Nest; returns false when it is not connected.
    pub fn send(&self, nest_id: &str, msg: ToNest) -> bool {
        match self.links.get(nest_id) {
            Some(link) => link.tx.send(msg).is_ok(),
            None => false,
        }
    }

    /// Drops the link of a lost Nest (its stream ends).
    pub fn drop_link(&mut self, nest_id: &str) {
        self.links.remove(nest_id);
    }
}
