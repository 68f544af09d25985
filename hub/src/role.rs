//! Whether this Hub leads (several Hubs on PostgreSQL), as every surface shows it: the gRPC
//! health answers carry it in their metadata (`agen-hub-role: leader|follower`,
//! `agen-hub-epoch`, `agen-leader`: the leader's advertised URL), the follower's answers to
//! Nest calls name the leader the same way, and `/metrics` has `agen_hub_is_leader`.
//!
//! Invariant: one writer (the Hub's start: follower, then leader at an epoch; the lease keeper
//! when deposed); readers take a copy.

use std::sync::{Arc, RwLock};

/// Metadata key of the leader's advertised URL (on health answers and on a follower's
/// refusal of a Nest call: the leader hint).
pub const LEADER_HEADER: &str = "agen-leader";
/// Metadata key of the role (`leader` or `follower`).
pub const ROLE_HEADER: &str = "agen-hub-role";
/// Metadata key of the epoch of the lease the leader holds (the leader's, on a follower).
pub const EPOCH_HEADER: &str = "agen-hub-epoch";

/// The role now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleNow {
    /// This Hub holds the leader lease (a Hub alone on its store always leads).
    pub leader: bool,
    /// The lease's epoch (0: a Hub alone, or no leader known yet).
    pub epoch: u64,
    /// The leader's advertised URL (empty: none known yet).
    pub leader_url: String,
    /// The database answered the last lease read (a follower that cannot reach it is not
    /// serving).
    pub db_ok: bool,
}

/// The role, shared.
#[derive(Debug, Default)]
pub struct Role(RwLock<RoleNow>);

impl Role {
    pub fn new(now: RoleNow) -> Arc<Role> {
        Arc::new(Role(RwLock::new(now)))
    }

    pub fn now(&self) -> RoleNow {
        self.0.read().map(|r| r.clone()).unwrap_or_default()
    }

    pub fn set(&self, now: RoleNow) {
        if let Ok(mut r) = self.0.write() {
            *r = now;
        }
    }

    /// The headers health answers carry.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let now = self.now();
        let mut out = vec![(
            ROLE_HEADER,
            if now.leader { "leader" } else { "follower" }.to_owned(),
        )];
        if now.epoch > 0 {
            out.push((EPOCH_HEADER, now.epoch.to_string()));
        }
        if !now.leader_url.is_empty() {
            out.push((LEADER_HEADER, now.leader_url));
        }
        out
    }
}

/// The health service at its gRPC path in `router`, each answer carrying the role headers.
pub fn health_route<S>(router: axum::Router, health: S, role: Arc<Role>) -> axum::Router
where
    S: tower::Service<
            http::Request<axum::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let svc = tower::ServiceExt::map_response(health, move |mut r: http::Response<_>| {
        for (k, v) in role.headers() {
            if let Ok(v) = http::HeaderValue::from_str(&v) {
                r.headers_mut().insert(k, v);
            }
        }
        r
    });
    router.route_service("/grpc.health.v1.Health/{*rest}", svc)
}
