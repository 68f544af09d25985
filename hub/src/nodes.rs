//! Nest liveness and links: the sending half of each connected Nest's stream, when each Nest
//! was last heard from (a monotonic clock that starts afresh at Hub boot), and the messages the
//! Hub sends to Nests in domain form ([`ToNest`]; `server/nest.rs` turns them into protobuf).
//!
//! Invariants: a Nest has at most one live link; a link is identified by a connection id so
//! that the end of an old stream never removes a newer one; a Nest is lost only after
//! `nest_ttl` + one heartbeat interval of silence, counted from Hub boot at the earliest, or
//! `nest_disconnect_grace` after its stream closed (unless it reconnected), or at once when it
//! stops reading its stream, and never for the time the Hub's store could not write (the
//! clocks restart when it heals, [`Liveness::restart_clocks`]) or the Hub itself was paused
//! ([`Liveness::restart_all_clocks`]): what the Hub queues for one Nest is bounded (bytes and messages,
//! [`nest_queue`]); a send that would pass the bound ends the link instead of buffering, and the
//! Nest is reported by [`Liveness::take_overflowed`] (its runs are handed over). A message sent
//! with [`Liveness::send_durable`] (a run assignment) is held until a store flush that covers
//! the writes before it has finished ([`Liveness::release`]), and any later message to the
//! same Nest queues behind it, so a Nest never hears of a run the store does not know.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The most messages queued for one Nest (besides the byte budget).
pub const MAX_QUEUED_MESSAGES: usize = 4096;

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
        /// What the instance may use (the Nest enforces it).
        resources: agen_shared::bundle::ResourceSpec,
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
        /// Stop at the next safe point instead (double texting `interrupt`).
        interrupt: bool,
    },
    /// A decision about an `ask` call of a run on the Nest.
    ApprovalDecided {
        run_id: String,
        instance_id: String,
        call_id: String,
        approved: bool,
        reason: String,
        by: String,
        /// The digest of the call decided (`ApprovalRequested::digest`).
        digest: String,
        /// Edited arguments the call was approved with (a JSON object).
        arguments: Option<serde_json::Value>,
    },
    /// Tells the Nest its Hub is there, so its nest lease does not run out (see `HubPing` in
    /// nest.proto), and which CA signs Nest certificates now (its sha256; empty on a plaintext
    /// Hub): a Nest whose certificate or trust is older renews (after `agen hub rotate-ca`).
    Ping {
        ca_sha256: String,
    },
    Ack {
        run_id: String,
        attempt: u32,
        acked_seq: u64,
        fenced: bool,
    },
    /// Asks for an instance's kept logs; answered over `SendLogs` ([`crate::logs`]).
    LogRequest {
        request_id: String,
        instance_id: String,
        server: String,
        since_ms: i64,
        tail: u32,
        follow: bool,
        /// The reader's namespace: the Nest serves only logs kept for an instance of it.
        namespace: String,
        /// The Hub no longer lists the instance: a Nest without its logs says `not_kept`.
        search: bool,
    },
}

/// Everything an instance needs to execute one run: the contract's order, which
/// `agen_proto::convert` puts on the wire.
pub use agen_contract::run::AssignedRun as RunAssignment;

impl ToNest {
    /// About how many bytes this message takes on the wire.
    pub fn approx_bytes(&self) -> usize {
        let strings = |v: &[&str]| v.iter().map(|s| s.len()).sum::<usize>();
        256 + match self {
            ToNest::Ping { .. } => 0,
            ToNest::Registered { stop_instances, .. } => {
                stop_instances.iter().map(|s| s.len() + 4).sum()
            }
            ToNest::Place {
                platform_secrets, ..
            } => platform_secrets
                .0
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum(),
            ToNest::Stop { reason, .. } | ToNest::CancelRun { reason, .. } => reason.len(),
            ToNest::ApprovalDecided {
                reason,
                by,
                arguments,
                ..
            } => reason.len() + by.len() + arguments.as_ref().map_or(0, |a| a.to_string().len()),
            ToNest::AssignRun(a) => {
                strings(&[&a.input, &a.conversation_key])
                    + a.labels
                        .iter()
                        .map(|(k, v)| k.len() + v.len() + 8)
                        .sum::<usize>()
            }
            ToNest::Ack { run_id, .. } => run_id.len(),
            ToNest::LogRequest {
                instance_id,
                server,
                ..
            } => instance_id.len() + server.len(),
        }
    }
}

/// Why a message could not be queued for a Nest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The stream is gone.
    Closed,
    /// The Nest is not reading: the bound was reached and the link is ended.
    Overflow,
}

/// The sending half of a Nest's queue: bounded by bytes and messages.
#[derive(Debug, Clone)]
pub struct NestTx {
    tx: mpsc::Sender<ToNest>,
    queued: Arc<AtomicUsize>,
    budget: usize,
    overflow: CancellationToken,
    cut_why: CutWhy,
}

/// Why the Hub cut a link that did not overflow (told to the Nest as the stream's status).
type CutWhy = Arc<std::sync::Mutex<Option<String>>>;

/// The receiving half, read by the Nest's outbound stream.
#[derive(Debug)]
pub struct NestRx {
    rx: mpsc::Receiver<ToNest>,
    queued: Arc<AtomicUsize>,
    /// Cancelled when the queue overflowed or the Hub cut the link: the stream ends and the
    /// link is closed.
    pub overflow: CancellationToken,
    cut_why: CutWhy,
}

/// A queue for one Nest holding at most `budget_bytes` (one message of any size always fits
/// an empty queue) and [`MAX_QUEUED_MESSAGES`] messages.
pub fn nest_queue(budget_bytes: usize) -> (NestTx, NestRx) {
    let (tx, rx) = mpsc::channel(MAX_QUEUED_MESSAGES);
    let queued = Arc::new(AtomicUsize::new(0));
    let overflow = CancellationToken::new();
    let cut_why = CutWhy::default();
    (
        NestTx {
            tx,
            queued: queued.clone(),
            budget: budget_bytes,
            overflow: overflow.clone(),
            cut_why: cut_why.clone(),
        },
        NestRx {
            rx,
            queued,
            overflow,
            cut_why,
        },
    )
}

impl NestTx {
    /// Queues `msg`, or ends the link when the Nest has stopped reading.
    pub fn send(&self, msg: ToNest) -> Result<(), SendError> {
        if self.overflow.is_cancelled() {
            return Err(SendError::Overflow);
        }
        let size = msg.approx_bytes();
        let before = self.queued.fetch_add(size, Ordering::SeqCst);
        if before > 0 && before + size > self.budget {
            self.queued.fetch_sub(size, Ordering::SeqCst);
            self.overflow.cancel();
            return Err(SendError::Overflow);
        }
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.queued.fetch_sub(size, Ordering::SeqCst);
                match e {
                    mpsc::error::TrySendError::Full(_) => {
                        self.overflow.cancel();
                        Err(SendError::Overflow)
                    }
                    mpsc::error::TrySendError::Closed(_) => Err(SendError::Closed),
                }
            }
        }
    }

    /// Ends the link (both halves of the stream), telling the Nest `why`.
    pub fn cut(&self, why: &str) {
        if let Ok(mut w) = self.cut_why.lock() {
            w.get_or_insert_with(|| why.to_string());
        }
        self.overflow.cancel();
    }

    /// Bytes queued and not yet taken by the stream.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

impl NestRx {
    /// Why the Hub cut the link, when it did (else an ended link overflowed).
    pub fn cut_why(&self) -> Option<String> {
        self.cut_why.lock().ok().and_then(|w| w.clone())
    }

    /// The next message for the stream; `None` when the queue is closed or overflowed.
    pub async fn recv(&mut self) -> Option<ToNest> {
        let msg = tokio::select! {
            biased;
            _ = self.overflow.cancelled() => return None,
            m = self.rx.recv() => m?,
        };
        self.queued.fetch_sub(msg.approx_bytes(), Ordering::SeqCst);
        Some(msg)
    }

    /// The next message if one is queued now (tests).
    #[cfg(test)]
    pub fn try_recv(&mut self) -> Option<ToNest> {
        let msg = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(msg.approx_bytes(), Ordering::SeqCst);
        Some(msg)
    }
}

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
    /// Nests whose queue overflowed (link ended), with why, for the core to hand over.
    overflowed: Vec<(String, String)>,
    /// Nests that sent run events the store could not write (a full disk): their links stay
    /// up, and are cut once the store heals so that they resend ([`Liveness::drop_held`]).
    unstored: std::collections::BTreeSet<String>,
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
            overflowed: Vec::new(),
            unstored: Default::default(),
        }
    }

    /// Run events of `nest_id` were not stored (the store cannot write): it must resend them
    /// once the store heals.
    pub fn unstored(&mut self, nest_id: &str) {
        self.unstored.insert(nest_id.to_string());
    }

    /// The clocks of every Nest without a live link start again now, as at boot (the store
    /// healed: a Nest that could not register while it was broken is not lost for it).
    pub fn restart_clocks(&mut self) {
        let now = Instant::now();
        let silent: Vec<String> = self
            .last_seen
            .keys()
            .chain(self.disconnected_at.keys())
            .filter(|id| !self.links.contains_key(*id))
            .cloned()
            .collect();
        for id in silent {
            self.last_seen.insert(id.clone(), now);
            self.disconnected_at.remove(&id);
        }
    }

    /// Every clock starts again now, connected Nests' too (the Hub itself was paused: the
    /// silence it saw on waking is its own, not the Nests').
    pub fn restart_all_clocks(&mut self) {
        let now = Instant::now();
        for t in self.last_seen.values_mut() {
            *t = now;
        }
        for t in self.disconnected_at.values_mut() {
            *t = now;
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

    /// How many Nests have a live link.
    pub fn connected_count(&self) -> usize {
        self.links.len()
    }

    pub fn is_connected(&self, nest_id: &str) -> bool {
        self.links.contains_key(nest_id)
    }

    /// How long `nest_id` has been silent (zero when never tracked).
    /// How long since `nest_id` was last heard from, if it was since this Hub started.
    pub fn heard_from(&self, nest_id: &str) -> Option<Duration> {
        self.last_seen.get(nest_id).map(|t| t.elapsed())
    }

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

    /// Sends at once. A Nest that stopped reading (its queue is full) loses its link here and
    /// is reported by [`Liveness::take_overflowed`].
    fn send_now(&mut self, nest_id: &str, msg: ToNest) -> bool {
        let Some(link) = self.links.get(nest_id) else {
            return false;
        };
        match link.tx.send(msg) {
            Ok(()) => true,
            Err(SendError::Closed) => false,
            Err(SendError::Overflow) => {
                let why = format!(
                    "it stopped reading its stream ({} bytes queued, the limit is {}; --nest-queue-bytes)",
                    link.tx.queued_bytes(),
                    link.tx.budget
                );
                tracing::warn!(nest_id, "disconnecting a nest: {why}");
                self.links.remove(nest_id);
                self.overflowed.push((nest_id.to_string(), why));
                false
            }
        }
    }

    /// Nests disconnected because they stopped reading, since the last call.
    pub fn take_overflowed(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.overflowed)
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

    /// Forgets every held message (the store was reopened: what they announce may be gone)
    /// and cuts the links of their Nests and of the Nests whose run events were not stored
    /// ([`Liveness::unstored`]): each reconnects and resends the run events not acknowledged. Returns how many messages were dropped.
    pub fn drop_held(&mut self) -> usize {
        let n = self.held.len();
        let mut nests: std::collections::BTreeSet<String> =
            self.held.drain(..).map(|(_, nest, _)| nest).collect();
        nests.append(&mut self.unstored);
        for nest_id in nests {
            if let Some(link) = self.links.remove(&nest_id) {
                link.tx.cut("the hub store was reopened after a write error; reconnect and resend what was not acknowledged");
                self.disconnected_at.insert(nest_id, Instant::now());
            }
        }
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

    fn stop(reason_bytes: usize) -> ToNest {
        ToNest::Stop {
            instance_id: "i".into(),
            reason: "r".repeat(reason_bytes),
        }
    }

    fn stop_named(id: &str) -> ToNest {
        ToNest::Stop {
            instance_id: id.into(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_held_message_leaves_only_after_a_flush_that_covers_it_and_later_ones_queue_behind() {
        let mut live = Liveness::new([]);
        let (tx, mut rx) = nest_queue(1 << 20);
        live.connect("n1", tx);
        live.send_durable("n1", stop_named("assign"));
        live.send("n1", stop_named("after"));
        let upto = live.mark();
        live.send_durable("n1", stop_named("later"));
        assert!(rx.try_recv().is_none(), "nothing leaves before the flush");
        live.release(upto);
        assert_eq!(rx.try_recv(), Some(stop_named("assign")));
        assert_eq!(rx.try_recv(), Some(stop_named("after")));
        assert!(
            rx.try_recv().is_none(),
            "a write after the mark waits for the next flush"
        );
        live.release(live.mark());
        assert_eq!(rx.try_recv(), Some(stop_named("later")));
        assert_eq!(live.held(), 0);
    }

    #[test]
    fn a_paused_hub_restarts_every_clock_so_that_no_nest_is_lost_for_its_own_pause() {
        let mut live = Liveness::new(["away".to_string()]);
        let (tx, _rx) = nest_queue(1 << 20);
        live.connect("linked", tx.clone());
        live.connect("closed", tx);
        live.disconnect("closed", live.links["closed"].conn_id);
        std::thread::sleep(Duration::from_millis(30));
        live.restart_all_clocks();
        for id in ["away", "linked", "closed"] {
            assert!(live.silent_for(id) < Duration::from_millis(30), "{id}");
        }
        assert!(live.disconnected_for("closed").unwrap() < Duration::from_millis(30));
        assert!(live.is_connected("linked"), "links stay as they are");
    }

    #[tokio::test]
    async fn dropping_held_messages_cuts_the_links_they_were_for_so_those_nests_resend() {
        let mut live = Liveness::new([]);
        let (held_tx, mut held_rx) = nest_queue(1 << 20);
        let (other_tx, mut other_rx) = nest_queue(1 << 20);
        live.connect("held", held_tx);
        live.connect("other", other_tx);
        live.send_durable("held", stop_named("ack"));
        assert_eq!(live.drop_held(), 1);
        assert!(!live.is_connected("held"), "its link is cut");
        assert!(held_rx.recv().await.is_none(), "its stream ends");
        let why = held_rx.cut_why().expect("a cut says why");
        assert!(why.contains("resend"), "{why}");
        assert!(
            live.take_overflowed().is_empty(),
            "a cut is not an overflow: its runs stay"
        );
        assert!(
            live.is_connected("other"),
            "a nest with nothing held keeps its link"
        );
        assert!(live.send("other", stop_named("x")));
        assert_eq!(other_rx.recv().await, Some(stop_named("x")));
    }

    #[tokio::test]
    async fn a_nest_that_stops_reading_loses_its_link_instead_of_filling_the_hub() {
        let (tx, mut rx) = nest_queue(10_000);
        let mut live = Liveness::new([]);
        live.connect("n1", tx);
        // One message of any size fits an empty queue; reading makes room again.
        assert!(live.send("n1", stop(50_000)));
        assert!(rx.recv().await.is_some());
        let mut sent = 0;
        while live.send("n1", stop(1000)) {
            sent += 1;
            assert!(sent < 100, "the queue is bounded");
        }
        // 1256 bytes each: 7 fit in 10 000.
        assert_eq!(sent, 7);
        assert!(!live.is_connected("n1"));
        let overflowed = live.take_overflowed();
        assert_eq!(overflowed.len(), 1);
        assert_eq!(overflowed[0].0, "n1");
        assert!(
            overflowed[0].1.contains("stopped reading"),
            "{overflowed:?}"
        );
        assert!(live.take_overflowed().is_empty());
        // The stream ends without handing out what was queued.
        assert!(rx.recv().await.is_none());
        assert!(rx.overflow.is_cancelled());
    }
}
