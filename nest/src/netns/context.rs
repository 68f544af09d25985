//! What the egress proxy ([`super::proxy`]) and the DNS responder ([`super::dns`]) of one
//! instance share: its policy, the names it resolved by address, and how a refusal is logged
//! and counted.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use super::decide::Policy;
use super::Network;

/// How many addresses an instance's name memory keeps (cleared when full).
const MAX_REMEMBERED: usize = 4096;

/// What the proxy of one instance knows.
pub struct Context {
    pub instance: String,
    pub policy: Arc<Policy>,
    pub names: Arc<Names>,
    pub network: Arc<Network>,
    pub logs: crate::logs::LogStore,
    pub owner: (String, String),
    /// The proxy's own address in the namespace (a direct connection to it is refused).
    pub own: SocketAddr,
}

impl Context {
    /// Logs (for the Nest and the instance's `agen logs`) and counts a refusal of `host` by
    /// `rule`; `how` says how it was answered, when not by the connection itself. Returns the
    /// text the client may be shown.
    pub fn refused(&self, host: &str, rule: &str, how: Option<&str>) -> String {
        let text = format!("egress refused: {host} ({rule})");
        tracing::warn!(instance = %self.instance, host, rule, how, "egress refused");
        let logged = match how {
            Some(how) => format!("{text}: {how}"),
            None => text.clone(),
        };
        self.logs.append(
            &self.instance,
            &crate::logs::Source::Instance,
            "WARN",
            &logged,
        );
        self.network.count_refused(&self.owner.0, &self.owner.1);
        text
    }
}

/// address → the names the instance resolved to it.
#[derive(Default)]
pub struct Names(Mutex<HashMap<IpAddr, Vec<String>>>);

impl Names {
    pub fn of(&self, ip: IpAddr) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            .cloned()
            .unwrap_or_default()
    }

    pub fn remember(&self, name: &str, ips: &[Ipv4Addr]) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_REMEMBERED {
            m.clear();
        }
        for ip in ips {
            let names = m.entry(IpAddr::V4(*ip)).or_default();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
}
