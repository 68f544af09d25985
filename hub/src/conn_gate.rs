//! Who may hold a connection to the Hub's port before proving who they are. Every accepted TCP
//! connection takes a slot ([`ConnGate::admit`]): it counts against the total
//! ([`ConnLimits::max_connections`]) and, until it is authenticated, against its source
//! address ([`ConnLimits::max_unauthenticated_per_address`]) and all unauthenticated
//! connections ([`ConnLimits::max_unauthenticated`]). A connection is authenticated when its
//! TLS handshake presented a client certificate of the Hub's CA (a Nest), or when a request on
//! it passed a token check ([`ConnGate::authenticated`], called by the gRPC `ApiAuth` and the
//! A2A edge). One not authenticated within [`ConnLimits::unauthenticated_timeout`] is cut
//! (`listener::Cut`), so a silent or slow client holds no slot past it.
//!
//! A connection from a local process of an instance or tool-server uid (the Hub's
//! `--refuse-uids`, a Nest's `--run-uids` on this host) is refused too ([`ConnGate::check_owner`],
//! by the owner of its socket, as the metrics listener does: `agen_net::peer_uid`). Every
//! refusal is counted by [`Reason`] (`agen_hub_connections_refused_total{reason}`).
//!
//! Invariants: a refused connection is closed before its handshake (no TLS state, no buffer);
//! an authenticated connection counts only against the total, so a fleet of Nests behind one
//! address is never refused for its address; a slot is given back exactly once, when the
//! connection ends.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The connection limits (`agen hub` flags; rows of the limits table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Longest a TLS handshake may take (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// Longest a connection may stay open without authenticating (`--unauthenticated-timeout`).
    pub unauthenticated_timeout: Duration,
    /// Longest an authenticated A2A request body may take to arrive (`--body-timeout`).
    pub body_timeout: Duration,
    /// Unauthenticated connections from one source address (`--max-unauthenticated-per-address`).
    pub max_unauthenticated_per_address: usize,
    /// Unauthenticated connections in all (`--max-unauthenticated`).
    pub max_unauthenticated: usize,
    /// Connections in all, authenticated or not (`--max-connections`).
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            handshake_timeout: Duration::from_secs(10),
            unauthenticated_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_unauthenticated_per_address: 64,
            max_unauthenticated: 1024,
            max_connections: 16_384,
        }
    }
}

/// The largest message of a call that comes before authentication (`NestService.Join`,
/// health, reflection) and of any `NestService` call on a connection without a Nest
/// certificate.
pub const PRE_AUTH_MESSAGE_BYTES: usize = 64 * 1024;

/// Why a connection was refused or cut: the `reason` label of
/// `agen_hub_connections_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `--max-connections` were open.
    MaxConnections,
    /// `--max-unauthenticated` connections had not authenticated yet.
    MaxUnauthenticated,
    /// `--max-unauthenticated-per-address` from its address had not authenticated yet.
    MaxUnauthenticatedPerAddress,
    /// A local process of an instance or tool-server uid (`--refuse-uids`).
    InstanceUid,
    /// Its TLS handshake took longer than `--handshake-timeout`.
    HandshakeTimeout,
    /// It did not authenticate within `--unauthenticated-timeout` (cut).
    UnauthenticatedTimeout,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::MaxConnections,
        Reason::MaxUnauthenticated,
        Reason::MaxUnauthenticatedPerAddress,
        Reason::InstanceUid,
        Reason::HandshakeTimeout,
        Reason::UnauthenticatedTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MaxConnections => "max_connections",
            Reason::MaxUnauthenticated => "max_unauthenticated",
            Reason::MaxUnauthenticatedPerAddress => "max_unauthenticated_per_address",
            Reason::InstanceUid => "instance_uid",
            Reason::HandshakeTimeout => "handshake_timeout",
            Reason::UnauthenticatedTimeout => "unauthenticated_timeout",
        }
    }
}

/// See the module doc. One per Hub.
pub struct ConnGate {
    limits: ConnLimits,
    /// Local processes of these uids are refused (`--refuse-uids`).
    refused_uids: Arc<Vec<RangeInclusive<u32>>>,
    inner: Mutex<Inner>,
    /// Refusals by [`Reason`] (in the order of [`Reason::ALL`]).
    refused: [AtomicU64; 6],
    last_warned_ms: AtomicI64,
}

#[derive(Default)]
struct Inner {
    total: usize,
    unauthenticated: usize,
    by_address: HashMap<IpAddr, usize>,
    open: HashMap<SocketAddr, Arc<AtomicBool>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// A connection's slot; given back when dropped.
pub struct Slot {
    gate: Arc<ConnGate>,
    peer: SocketAddr,
    authenticated: Arc<AtomicBool>,
}

impl ConnGate {
    pub fn new(limits: ConnLimits) -> Arc<ConnGate> {
        ConnGate::refusing_uids(limits, Vec::new())
    }

    /// A gate that also refuses local processes of `uids` ([`ConnGate::check_owner`]).
    pub fn refusing_uids(limits: ConnLimits, uids: Vec<RangeInclusive<u32>>) -> Arc<ConnGate> {
        Arc::new(ConnGate {
            limits,
            refused_uids: Arc::new(uids),
            inner: Mutex::new(Inner::default()),
            refused: Default::default(),
            last_warned_ms: AtomicI64::new(0),
        })
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections refused or cut since the Hub started, every reason.
    pub fn refused(&self) -> u64 {
        self.refused.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Connections refused or cut since the Hub started, by reason (every reason, 0 included).
    pub fn refused_by_reason(&self) -> Vec<(Reason, u64)> {
        Reason::ALL
            .iter()
            .zip(&self.refused)
            .map(|(r, c)| (*r, c.load(Ordering::Relaxed)))
            .collect()
    }

    /// Counts one refusal.
    pub fn count(&self, reason: Reason) {
        if let Some(i) = Reason::ALL.iter().position(|r| *r == reason) {
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Refuses (and counts) a connection from `peer` to `local` made by a local process of a
    /// refused uid; reads `/proc` off the async threads.
    pub async fn check_owner(&self, peer: SocketAddr, local: SocketAddr) -> Result<(), Refused> {
        use agen_net::peer_uid::{check_async, Peer};
        match check_async(peer, local, self.refused_uids.clone()).await {
            Peer::Allowed => Ok(()),
            Peer::Refused(uid) => {
                let why = match uid {
                    Some(uid) => format!("a local process of uid {uid}, an instance or tool-server uid (--refuse-uids)"),
                    None => "a loopback peer whose socket owner cannot be read (--refuse-uids)".to_string(),
                };
                self.count(Reason::InstanceUid);
                self.warn_refused(peer, &why);
                Err(Refused(why))
            }
        }
    }

    /// A slot for a new connection from `peer`, or why not.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Slot, Refused> {
        let l = &self.limits;
        let mut inner = self.lock();
        let from_address = inner.by_address.get(&peer.ip()).copied().unwrap_or(0);
        let why = if inner.total >= l.max_connections {
            Some((
                Reason::MaxConnections,
                format!(
                    "{} connections are open, the limit (--max-connections)",
                    inner.total
                ),
            ))
        } else if inner.unauthenticated >= l.max_unauthenticated {
            Some((
                Reason::MaxUnauthenticated,
                format!(
                    "{} connections have not authenticated yet, the limit (--max-unauthenticated)",
                    inner.unauthenticated
                ),
            ))
        } else if from_address >= l.max_unauthenticated_per_address {
            Some((
                Reason::MaxUnauthenticatedPerAddress,
                format!(
                    "{from_address} connections from {} have not authenticated yet, the limit (--max-unauthenticated-per-address)",
                    peer.ip()
                ),
            ))
        } else {
            None
        };
        if let Some((reason, why)) = why {
            drop(inner);
            self.count(reason);
            self.warn_refused(peer, &why);
            return Err(Refused(why));
        }
        inner.total += 1;
        inner.unauthenticated += 1;
        *inner.by_address.entry(peer.ip()).or_default() += 1;
        let authenticated = Arc::new(AtomicBool::new(false));
        inner.open.insert(peer, authenticated.clone());
        Ok(Slot {
            gate: self.clone(),
            peer,
            authenticated,
        })
    }

    /// At most one warning a second: a flood must not flood the log too.
    fn warn_refused(&self, peer: SocketAddr, why: &str) {
        let now = crate::model::now_ms();
        let last = self.last_warned_ms.load(Ordering::Relaxed);
        if now - last >= 1000
            && self
                .last_warned_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(%peer, refused_so_far = self.refused(), "connection refused: {why}");
        }
    }

    /// A request on the connection from `peer` passed a token check: it no longer counts as
    /// unauthenticated. Unknown peers (a plaintext Hub, a closed connection) are ignored.
    pub fn authenticated(&self, peer: Option<SocketAddr>) {
        let Some(peer) = peer else { return };
        let mut inner = self.lock();
        let Some(flag) = inner.open.get(&peer).cloned() else {
            return;
        };
        if !flag.swap(true, Ordering::SeqCst) {
            release_unauthenticated(&mut inner, peer.ip());
        }
    }
}

fn release_unauthenticated(inner: &mut Inner, ip: IpAddr) {
    inner.unauthenticated = inner.unauthenticated.saturating_sub(1);
    if let Some(n) = inner.by_address.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            inner.by_address.remove(&ip);
        }
    }
}

impl Slot {
    /// The connection proved who it is (a Nest certificate).
    pub fn mark_authenticated(&self) {
        self.gate.authenticated(Some(self.peer));
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::SeqCst)
    }

    /// Counts a refusal of this connection (its deadline passed).
    pub fn count(&self, reason: Reason) {
        self.gate.count(reason);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.gate.lock();
        inner.total = inner.total.saturating_sub(1);
        if let Some(flag) = inner.open.get(&self.peer) {
            if Arc::ptr_eq(flag, &self.authenticated) {
                inner.open.remove(&self.peer);
            }
        }
        if !self.authenticated.swap(true, Ordering::SeqCst) {
            release_unauthenticated(&mut inner, self.peer.ip());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ip: &str, port: u16) -> SocketAddr {
        SocketAddr::new(ip.parse().expect("ip"), port)
    }

    #[test]
    fn unauthenticated_connections_are_capped_per_address_and_authenticated_ones_only_in_total() {
        let gate = ConnGate::new(ConnLimits {
            max_unauthenticated_per_address: 2,
            max_unauthenticated: 3,
            max_connections: 6,
            ..ConnLimits::default()
        });
        let a1 = gate.admit(addr("10.0.0.1", 1)).expect("first");
        let a2 = gate.admit(addr("10.0.0.1", 2)).expect("second");
        let refused = gate
            .admit(addr("10.0.0.1", 3))
            .err()
            .expect("third refused");
        assert!(
            refused.0.contains("--max-unauthenticated-per-address"),
            "{refused:?}"
        );
        // Authenticated: the address has room again (a fleet behind one NAT address).
        a1.mark_authenticated();
        gate.authenticated(Some(addr("10.0.0.1", 2)));
        assert!(a2.is_authenticated());
        let a3 = gate
            .admit(addr("10.0.0.1", 3))
            .expect("room after authenticating");
        let b1 = gate.admit(addr("10.0.0.2", 1)).expect("other address");
        let _b2 = gate
            .admit(addr("10.0.0.3", 1))
            .expect("third unauthenticated in all");
        let refused = gate
            .admit(addr("10.0.0.4", 1))
            .err()
            .expect("total unauthenticated");
        assert!(refused.0.contains("--max-unauthenticated)"), "{refused:?}");
        drop(b1);
        let _c = gate.admit(addr("10.0.0.4", 1)).expect("a slot given back");
        a3.mark_authenticated();
        let _d = gate.admit(addr("10.0.0.6", 1)).expect("sixth in all");
        let refused = gate.admit(addr("10.0.0.5", 1)).err().expect("total");
        assert!(refused.0.contains("--max-connections"), "{refused:?}");
        drop((a1, a2, a3));
        assert_eq!(gate.refused(), 3);
        let by: Vec<u64> = gate.refused_by_reason().iter().map(|(_, n)| *n).collect();
        assert_eq!(by, [1, 1, 1, 0, 0, 0]);
        gate.count(Reason::HandshakeTimeout);
        assert_eq!(gate.refused_by_reason()[4], (Reason::HandshakeTimeout, 1));
        let inner = gate.lock();
        assert_eq!((inner.total, inner.unauthenticated), (3, 3));
    }
}
