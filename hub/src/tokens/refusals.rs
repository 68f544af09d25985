//! Refused calls in the audit log, rate-limited: a gRPC call without a valid token (missing,
//! unknown, expired, revoked), an A2A request answered 401 or 403. The first refusal of a kind
//! from a source address in a second is written at once; the ones after it in that second are
//! only counted, and written as one record (`suppressed` = how many) when the second is over.
//! So an attacker gets at most two records per address, kind and second, and the log still
//! says how many calls were refused.
//!
//! Invariants: the table of open windows holds at most [`MAX_SOURCES`] addresses (past that,
//! refusals from new addresses share one window under the unspecified address, so many
//! addresses cannot grow it either); every field that comes from the request is cut short; a
//! refusal is never flushed on its own (no fsync per refusal): [`RefusalAudit::run`] flushes
//! what it wrote once a tick.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use crate::model::now_ms;
use crate::store::Db;

use super::audit::{record_with, AuditDetail};

/// One record per address and kind per this long (the rest counted).
pub const WINDOW_MS: i64 = 1000;
/// Addresses with an open window at most; more share one.
pub const MAX_SOURCES: usize = 4096;
/// Longest call name kept (it comes from the request's path).
const MAX_CALL: usize = 128;

/// What was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A gRPC call without a valid token (`unauthenticated`).
    GrpcUnauthenticated,
    /// An A2A request answered 401 (`unauthenticated`).
    A2aUnauthorized,
    /// An A2A request answered 403 (`permission_denied`).
    A2aForbidden,
}

impl Kind {
    fn outcome(self) -> &'static str {
        match self {
            Kind::GrpcUnauthenticated | Kind::A2aUnauthorized => "unauthenticated",
            Kind::A2aForbidden => "permission_denied",
        }
    }
}

/// One refused call, as its record will say.
#[derive(Debug, Clone, Default)]
pub struct Refusal {
    /// The caller when its token was valid but not enough (a 403); empty otherwise.
    pub token_id: String,
    pub token_name: String,
    pub namespace: String,
    /// The RPC (`ListTasks`) or the A2A call (`A2A POST /a2a/NS/DEPLOYMENT`).
    pub call: String,
    pub target: String,
    /// Why it was refused.
    pub message: String,
}

struct Window {
    opened_ms: i64,
    /// Refusals after the first, not written yet.
    suppressed: u64,
    /// The latest of them (what the summary record says).
    last: Refusal,
    peer: String,
}

/// See the module doc. One per Hub.
pub struct RefusalAudit {
    db: Db,
    windows: Mutex<HashMap<(IpAddr, Kind), Window>>,
    /// Something was written since the last flush.
    dirty: std::sync::atomic::AtomicBool,
}

impl RefusalAudit {
    pub fn new(db: Db) -> RefusalAudit {
        RefusalAudit {
            db,
            windows: Mutex::new(HashMap::new()),
            dirty: Default::default(),
        }
    }

    /// Records (or counts) `refusal` of `kind` from `peer` (see the module doc).
    pub fn note(&self, peer: Option<SocketAddr>, kind: Kind, mut refusal: Refusal) {
        refusal.call = cut(&refusal.call, MAX_CALL);
        let now = now_ms();
        let ip = peer.map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |p| p.ip());
        let peer_text = peer.map(|p| p.to_string()).unwrap_or_default();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let ended = self.take_ended(&mut windows, now);
        let key = if windows.len() >= MAX_SOURCES && !windows.contains_key(&(ip, kind)) {
            (IpAddr::V6(Ipv6Addr::UNSPECIFIED), kind)
        } else {
            (ip, kind)
        };
        let write_now = match windows.get_mut(&key) {
            Some(w) => {
                w.suppressed += 1;
                w.last = refusal.clone();
                w.peer = peer_text.clone();
                false
            }
            None => {
                windows.insert(
                    key,
                    Window {
                        opened_ms: now,
                        suppressed: 0,
                        last: refusal.clone(),
                        peer: peer_text.clone(),
                    },
                );
                true
            }
        };
        drop(windows);
        for (kind, w) in ended {
            self.write(kind, &w.last, &w.peer, w.suppressed);
        }
        if write_now {
            self.write(kind, &refusal, &peer_text, 0);
        }
    }

    /// Windows older than [`WINDOW_MS`], removed; the ones with refusals to report returned.
    fn take_ended(
        &self,
        windows: &mut HashMap<(IpAddr, Kind), Window>,
        now: i64,
    ) -> Vec<(Kind, Window)> {
        let old: Vec<(IpAddr, Kind)> = windows
            .iter()
            .filter(|(_, w)| now - w.opened_ms >= WINDOW_MS)
            .map(|(k, _)| *k)
            .collect();
        old.into_iter()
            .filter_map(|k| windows.remove(&k).map(|w| (k.1, w)))
            .filter(|(_, w)| w.suppressed > 0)
            .collect()
    }

    /// Writes the summaries of the windows that ended by `now`.
    pub fn write_ended(&self, now: i64) {
        let ended = {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            self.take_ended(&mut windows, now)
        };
        for (kind, w) in ended {
            self.write(kind, &w.last, &w.peer, w.suppressed);
        }
    }

    fn write(&self, kind: Kind, r: &Refusal, peer: &str, suppressed: u64) {
        let written = record_with(
            &self.db,
            &r.token_id,
            &r.token_name,
            &r.namespace,
            &r.call,
            &r.target,
            kind.outcome(),
            &r.message,
            AuditDetail {
                peer: peer.to_string(),
                suppressed,
                ..AuditDetail::default()
            },
        );
        match written {
            Ok(_) => self.dirty.store(true, std::sync::atomic::Ordering::Relaxed),
            Err(e) => tracing::error!(error = %e, "cannot write the audit record of a refusal"),
        }
    }

    /// Writes ended windows and flushes what was written, four times a second, until `stop`.
    pub async fn run(self: std::sync::Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            self.write_ended(now_ms());
            if self.dirty.swap(false, std::sync::atomic::Ordering::Relaxed) {
                if let Err(e) = self.db.flush().await {
                    tracing::error!(error = %e, "cannot make the audit records of refusals durable");
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }
}

fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::audit::{list, AuditFilter};

    #[test]
    fn a_burst_from_one_address_is_one_record_now_and_one_with_the_count_later() {
        let dir = tempfile::tempdir().expect("tmp");
        let db = Db::new(std::sync::Arc::new(
            crate::store::SledStore::open(&dir.path().join("db")).expect("store"),
        ));
        let audit = RefusalAudit::new(db.clone());
        let a: SocketAddr = "10.0.0.1:5000".parse().expect("addr");
        let b: SocketAddr = "10.0.0.2:5000".parse().expect("addr");
        let refusal = |call: &str| Refusal {
            call: call.into(),
            message: "the bearer token is not a token of this hub".into(),
            ..Refusal::default()
        };
        for i in 0..500 {
            audit.note(
                Some(a),
                Kind::GrpcUnauthenticated,
                refusal(&format!("C{i}")),
            );
        }
        audit.note(Some(b), Kind::GrpcUnauthenticated, refusal("ListTasks"));
        audit.note(Some(a), Kind::A2aForbidden, refusal("A2A"));
        let recs = list(&db, &AuditFilter::default()).expect("list");
        assert_eq!(recs.len(), 3, "{recs:?}");
        audit.write_ended(now_ms() + WINDOW_MS);
        let recs = list(&db, &AuditFilter::default()).expect("list");
        assert_eq!(recs.len(), 4, "{recs:?}");
        let summary = recs.last().expect("summary");
        assert_eq!(
            (summary.detail.suppressed, summary.detail.peer.as_str()),
            (499, "10.0.0.1:5000")
        );
        assert_eq!(summary.call, "C499");
        assert_eq!(summary.outcome, "unauthenticated");
        // Nothing left to report.
        audit.write_ended(now_ms() + 2 * WINDOW_MS);
        assert_eq!(list(&db, &AuditFilter::default()).expect("list").len(), 4);
    }
}
