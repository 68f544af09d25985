//! Caps on open server streams: each kind ([`StreamKind`]) has a cap per token
//! ([`StreamLimits::per_token`]) and a total ([`StreamLimits::total`]); opening one more is
//! refused (`RESOURCE_EXHAUSTED`, A2A: HTTP 429) and counted ([`StreamCaps::snapshot`] feeds
//! `agen_hub_streams_open` and `agen_hub_streams_refused_total`). The cluster admin token has
//! no per-token cap (it counts against the total).
//!
//! Invariant: a permit is given back exactly once, when the stream it was taken for ends
//! (dropped with the stream's task), so a closed stream never holds a place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::{HubError, Result};
use crate::tokens::Principal;

/// The stream limits live with the other input limits (`limits.rs`), which this module's caps
/// enforce.
pub use crate::limits::StreamLimits;

/// The kinds of long-lived streams the Hub serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    WatchTask,
    WatchDeployments,
    WatchNests,
    LogsFollow,
    A2aSse,
}

impl StreamKind {
    pub const ALL: [StreamKind; 5] = [
        StreamKind::WatchTask,
        StreamKind::WatchDeployments,
        StreamKind::WatchNests,
        StreamKind::LogsFollow,
        StreamKind::A2aSse,
    ];

    /// The metric label and the name in refusals.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::WatchTask => "watch_task",
            StreamKind::WatchDeployments => "watch_deployments",
            StreamKind::WatchNests => "watch_nests",
            StreamKind::LogsFollow => "logs_follow",
            StreamKind::A2aSse => "a2a_sse",
        }
    }
}

#[derive(Default)]
struct Counts {
    open: HashMap<(StreamKind, String), usize>,
    total: HashMap<StreamKind, usize>,
    refused: HashMap<StreamKind, u64>,
}

/// See the module doc.
pub struct StreamCaps {
    limits: StreamLimits,
    counts: Arc<Mutex<Counts>>,
}

/// One open stream's place; given back when dropped.
pub struct StreamPermit {
    counts: Arc<Mutex<Counts>>,
    kind: StreamKind,
    token: String,
}

fn lock(m: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StreamCaps {
    pub fn new(limits: StreamLimits) -> StreamCaps {
        StreamCaps {
            limits,
            counts: Arc::default(),
        }
    }

    /// A place for one more stream of `kind` opened by `who`, or `RESOURCE_EXHAUSTED` naming
    /// the cap and its flag.
    pub fn open(&self, kind: StreamKind, who: &Principal) -> Result<StreamPermit> {
        let token = who.token_id().to_string();
        let mut c = lock(&self.counts);
        let total = c.total.get(&kind).copied().unwrap_or(0);
        let mine = c.open.get(&(kind, token.clone())).copied().unwrap_or(0);
        let why = if total >= self.limits.total {
            Some(format!(
                "{} streams: {total} are open, the limit of the hub (--max-streams); close some and retry",
                kind.as_str()
            ))
        } else if *who != Principal::ClusterAdmin && mine >= self.limits.per_token {
            Some(format!(
                "{} streams: token {} has {mine} open, the limit per token (--max-streams-per-token); close some and retry",
                kind.as_str(),
                who.token_name()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            *c.refused.entry(kind).or_default() += 1;
            return Err(HubError::ResourceExhausted(why));
        }
        *c.total.entry(kind).or_default() += 1;
        *c.open.entry((kind, token.clone())).or_default() += 1;
        Ok(StreamPermit {
            counts: self.counts.clone(),
            kind,
            token,
        })
    }

    /// `(kind, open, refused so far)` for every kind.
    pub fn snapshot(&self) -> Vec<(StreamKind, usize, u64)> {
        let c = lock(&self.counts);
        StreamKind::ALL
            .iter()
            .map(|k| {
                (
                    *k,
                    c.total.get(k).copied().unwrap_or(0),
                    c.refused.get(k).copied().unwrap_or(0),
                )
            })
            .collect()
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        if let Some(n) = c.total.get_mut(&self.kind) {
            *n = n.saturating_sub(1);
        }
        let key = (self.kind, std::mem::take(&mut self.token));
        if let Some(n) = c.open.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.open.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::Role;

    fn viewer(id: &str) -> Principal {
        Principal::Api {
            id: id.into(),
            name: id.into(),
            namespace: "default".into(),
            role: Role::Viewer,
        }
    }

    #[test]
    fn streams_are_capped_per_token_and_in_total_and_counted() {
        let caps = StreamCaps::new(StreamLimits {
            per_token: 2,
            total: 3,
        });
        let a1 = caps.open(StreamKind::WatchTask, &viewer("a")).expect("a1");
        let _a2 = caps.open(StreamKind::WatchTask, &viewer("a")).expect("a2");
        let e = caps
            .open(StreamKind::WatchTask, &viewer("a"))
            .err()
            .expect("a3");
        assert!(e.to_string().contains("--max-streams-per-token"), "{e}");
        // Another kind has its own count.
        let _l = caps
            .open(StreamKind::LogsFollow, &viewer("a"))
            .expect("logs");
        let _b1 = caps.open(StreamKind::WatchTask, &viewer("b")).expect("b1");
        let e = caps
            .open(StreamKind::WatchTask, &Principal::ClusterAdmin)
            .err()
            .expect("total");
        assert!(e.to_string().contains("--max-streams)"), "{e}");
        drop(a1);
        let _a3 = caps
            .open(StreamKind::WatchTask, &viewer("a"))
            .expect("a place given back");
        let snap = caps.snapshot();
        assert_eq!(snap[0], (StreamKind::WatchTask, 3, 2));
    }
}
