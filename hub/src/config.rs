//! Hub options ([`HubOptions`]) and their validation: where state lives, where to listen, TLS
//! or (loopback only) plaintext, the liveness timings of Nests and the table of input limits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{HubError, Result};

pub use agen_net::peer_uid::parse_range as parse_uid_range;

/// Default listen address of `agen hub`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";

/// How a Hub is started. `Default` is the `agen hub` default apart from `data_dir`.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// State (sled), TLS material, admin and join tokens.
    pub data_dir: PathBuf,
    /// Listen address; port 0 picks a free port (see [`crate::HubHandle::addr`]).
    pub listen: SocketAddr,
    /// Serve plaintext gRPC instead of TLS; only allowed on a loopback listen address.
    pub insecure_plaintext: bool,
    /// A Nest silent for this long (plus one heartbeat interval of grace) is lost.
    pub nest_ttl: Duration,
    /// How often Nests are asked to heartbeat.
    pub heartbeat_interval: Duration,
    /// More names (host names or IP addresses) for the server certificate, beside `localhost`,
    /// `127.0.0.1`, the listen address and, when listening on all addresses, this machine's
    /// host name and primary address.
    pub tls_names: Vec<String>,
    /// A Nest whose stream closed is lost after this long unless it reconnects (its runs
    /// resume elsewhere at once); a Nest that has not heard from the Hub for this minus one
    /// second cancels its runs by itself.
    pub nest_disconnect_grace: Duration,
    /// A dispatched run the Hub has not heard from within this long is re-dispatched.
    pub run_start_deadline: Duration,
    /// The table of input limits (see [`crate::limits`]).
    pub limits: crate::limits::Limits,
    /// Where to serve Prometheus metrics (`GET /metrics`); `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token `/metrics` needs (`--metrics-token-file`); `None`: unauthenticated.
    /// `/healthz` and `/readyz` never need one. Local processes of the Nests' default
    /// `--run-uids` range (instances, tool servers) are refused every path.
    pub metrics_token: Option<String>,
    /// Local processes of these uids (instances and tool servers of a Nest on this host: its
    /// `--run-uids`) are refused the Hub's port and its metrics listener (`--refuse-uids`,
    /// default the Nests' default range 61000-61999).
    pub refuse_uids: Vec<std::ops::RangeInclusive<u32>>,
    /// Where to export each finished task's trace over OTLP; `None`: not exported.
    pub otlp: Option<OtlpOptions>,
    /// The URL A2A clients reach the Hub at (`https://host:port`, the A2A interface URLs of the
    /// agent cards start with it); `None`: the listen address (the primary address when
    /// listening on all addresses).
    pub public_url: Option<String>,
    /// Finished tasks older than this (since they finished) are removed with their run logs,
    /// events and the artifacts no other task refers to (`--task-retention`, default 30 days).
    pub task_retention: Duration,
    /// Audit records older than this are removed by the retention sweep.
    pub audit_retention: Duration,
    /// How long the built-in join token (`<data-dir>/join-token`) is valid from its creation,
    /// or from the first start of a Hub that finds it without an expiry; zero = never expires.
    pub join_token_ttl: Duration,
    /// Stopped and lost instances and lost Nests are hidden from the lists this long after
    /// they ended (`--hide-ended-after`, default 1h); asking for them still shows them.
    pub hide_ended_after: Duration,
    /// Sealed snapshots written while serving (`--snapshot-every`); `None`: none.
    pub snapshots: Option<SnapshotSchedule>,
    /// How deployments are served as A2A agents.
    pub a2a: A2aOptions,
    /// The longest a web console session lasts (`--console-session-max`, default and most
    /// 12h); it ends sooner when its token is revoked, rotated or expires, or at sign-out.
    pub console_session_max: Duration,
    /// Internal addresses webhooks may reach (`--webhook-allow HOST[:PORT]`).
    pub webhook_allow: Vec<crate::webhooks::Allow>,
    /// Where the Hub's state lives: `None` the local store in `<data_dir>/db`, or a
    /// `postgres://` URL (`--store`, `AGEN_HUB_STORE`).
    pub store: Option<String>,
    /// Several Hubs on the PostgreSQL store (`--identity-key-file`, `--leader-lease`,
    /// `--advertise-url`); `None`: this Hub is alone on its store.
    pub ha: Option<crate::ha::HaOptions>,
    /// The `--nest-lease` the Nests run with (how long a Nest with no Hub keeps its runs):
    /// it must exceed the leader lease plus [`crate::ha::RECONNECT_TIME`], checked at start.
    pub nest_lease: Duration,
    /// Refuse Nests whose instances run without uid separation (`--require-uid-separation`).
    pub require_uid_separation: bool,
}

/// Default and largest [`HubOptions::console_session_max`]: 12 hours.
pub const MAX_CONSOLE_SESSION: Duration = Duration::from_secs(12 * 3600);

/// `--snapshot-every D --snapshot-keep N --snapshot-dir DIR --snapshot-key-file PATH`.
#[derive(Debug, Clone)]
pub struct SnapshotSchedule {
    pub every: Duration,
    /// The newest this many snapshots in `dir` are kept; older ones are removed.
    pub keep: usize,
    pub dir: PathBuf,
    /// The operator's snapshot key (`agen hub snapshot-key new`).
    pub key_file: PathBuf,
}

/// How the Hub serves deployments as A2A agents (`agen hub --a2a-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aOptions {
    /// Agent cards are readable without a token (`--a2a-public-cards`, default true); when
    /// false a card needs the same token as the JSON-RPC endpoint (401 otherwise).
    pub public_cards: bool,
    /// The public card also shows what only a token holder sees by default: the bundle digest
    /// as the version, the namespace and deployment (`--a2a-card-details`, default false).
    pub card_details: bool,
    /// Serve each deployment at an origin of its own, `<deployment>.<namespace>.<domain>`
    /// (`--a2a-domain`); `None`: only at `/a2a/<namespace>/<deployment>`.
    pub domain: Option<String>,
    /// How long a blocking `SendMessage` waits for its task to end or need input before it
    /// answers with the task as it is (`--a2a-send-wait`, default 5m).
    pub send_wait: Duration,
}

/// Default of [`A2aOptions::send_wait`]: 5 minutes.
pub const DEFAULT_A2A_SEND_WAIT: Duration = Duration::from_secs(300);

impl Default for A2aOptions {
    fn default() -> Self {
        A2aOptions {
            public_cards: true,
            card_details: false,
            domain: None,
            send_wait: DEFAULT_A2A_SEND_WAIT,
        }
    }
}

/// Default of [`HubOptions::task_retention`]: 30 days.
pub const DEFAULT_TASK_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// Default of [`HubOptions::audit_retention`]: 400 days.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(400 * 24 * 3600);
/// Default of [`HubOptions::join_token_ttl`]: 24 hours.
pub const DEFAULT_JOIN_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default of [`HubOptions::hide_ended_after`]: 1 hour.
pub const DEFAULT_HIDE_ENDED_AFTER: Duration = Duration::from_secs(3600);

/// How the Hub speaks OTLP (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `grpc` (the default): `TraceService/Export` over HTTP/2.
    Grpc,
    /// `http/protobuf`: `POST` of the protobuf body to `…/v1/traces`.
    HttpProtobuf,
}

/// Where and how finished tasks' traces are exported (see [`crate::otlp`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpOptions {
    /// gRPC: the collector's base URL; HTTP: the full URL of the traces resource.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`: `key=value,key2=value2`).
    pub headers: Vec<(String, String)>,
    /// A PEM file of the CA certificates an `https://` endpoint is verified with, instead of
    /// the system roots (`OTEL_EXPORTER_OTLP_{TRACES_,}CERTIFICATE`); `None`: the system roots.
    pub certificate: Option<PathBuf>,
}

impl OtlpOptions {
    /// The export settings from `--otlp-endpoint` (`flag`, which wins) and the standard
    /// `OTEL_EXPORTER_OTLP_{TRACES_,}{ENDPOINT,PROTOCOL,HEADERS}` variables read by `env`;
    /// `None` when no endpoint is set.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<OtlpOptions>> {
        let var = |k: &str| {
            env(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
        {
            None | Some("grpc") => OtlpProtocol::Grpc,
            Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            Some(other) => {
                return Err(HubError::Config(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL: expected grpc or http/protobuf, got {other:?}; unset it for grpc"
                )))
            }
        };
        // A signal-specific endpoint is used as given; a base one gets `/v1/traces` over HTTP.
        let (endpoint, base) = match (
            flag.map(str::trim).filter(|f| !f.is_empty()),
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ) {
            (Some(f), _) => (f.to_string(), true),
            (None, Some(t)) => (t, false),
            (None, None) => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(e) => (e, true),
                None => return Ok(None),
            },
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(HubError::Config(format!(
                "OTLP endpoint {endpoint:?}: expected an http:// or https:// URL such as http://127.0.0.1:4317"
            )));
        }
        let endpoint = if protocol == OtlpProtocol::HttpProtobuf && base {
            format!("{}/v1/traces", endpoint.trim_end_matches('/'))
        } else {
            endpoint
        };
        let mut headers = Vec::new();
        let raw = var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .unwrap_or_default();
        for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(HubError::Config(format!(
                    "OTEL_EXPORTER_OTLP_HEADERS: expected key=value pairs separated by commas, got {pair:?}"
                )));
            };
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let certificate = var("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
            .or_else(|| var("OTEL_EXPORTER_OTLP_CERTIFICATE"))
            .map(PathBuf::from);
        Ok(Some(OtlpOptions {
            endpoint,
            protocol,
            headers,
            certificate,
        }))
    }
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            data_dir: default_data_dir(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            insecure_plaintext: false,
            nest_ttl: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            tls_names: Vec::new(),
            nest_disconnect_grace: Duration::from_secs(3),
            nest_lease: crate::ha::DEFAULT_NEST_LEASE,
            require_uid_separation: false,
            run_start_deadline: Duration::from_secs(30),
            limits: crate::limits::Limits::default(),
            metrics_listen: None,
            metrics_token: None,
            refuse_uids: vec![crate::listener::REFUSED_UIDS],
            otlp: None,
            public_url: None,
            task_retention: DEFAULT_TASK_RETENTION,
            audit_retention: DEFAULT_AUDIT_RETENTION,
            join_token_ttl: DEFAULT_JOIN_TOKEN_TTL,
            hide_ended_after: DEFAULT_HIDE_ENDED_AFTER,
            snapshots: None,
            a2a: A2aOptions::default(),
            console_session_max: MAX_CONSOLE_SESSION,
            webhook_allow: Vec::new(),
            store: None,
            ha: None,
        }
    }
}

/// `$AGEN_DATA_DIR/hub`, else `$XDG_DATA_HOME/agen/hub`, else `~/.local/share/agen/hub`.
pub fn default_data_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("AGEN_DATA_DIR").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join("hub");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("agen").join("hub")
}

impl HubOptions {
    /// A Nest must keep its runs longer than a Hub takes to come back: the leader lease (a
    /// follower leads at most this long after the leader died; none for a Hub alone) plus the
    /// reconnect time. Else a failover or restart would stop every run.
    fn check_nest_lease(&self) -> Result<()> {
        let lease = self.ha.as_ref().map(|h| h.leader_lease);
        let needed = lease.unwrap_or_default() + crate::ha::RECONNECT_TIME;
        if self.nest_lease > needed {
            return Ok(());
        }
        let secs = |d: Duration| format!("{}s", d.as_secs_f64());
        let lease_part = match lease {
            Some(l) => format!("the leader lease (--leader-lease {}) plus ", secs(l)),
            None => String::new(),
        };
        Err(HubError::Config(format!(
            "--nest-lease {} does not exceed {lease_part}the Nests' reconnect time ({}): a Nest would stop its runs before a Hub could take them back; give --nest-lease more than {} (default 30s) here and to every `agen nest`{}",
            secs(self.nest_lease),
            secs(crate::ha::RECONNECT_TIME),
            secs(needed),
            if lease.is_some() { ", or a shorter --leader-lease" } else { "" }
        )))
    }

    /// Checks the options without touching the disk or the network.
    pub fn validate(&self) -> Result<()> {
        if let Some(url) = &self.store {
            if !crate::store::pg::is_url(url) {
                return Err(HubError::Config(format!(
                    "--store {}: not a store this Hub knows; give a postgres://user@host/db URL, or leave --store out for the local store in the data dir",
                    if url.len() > 40 { "(the value)" } else { url }
                )));
            }
            if self.snapshots.is_some() {
                return Err(HubError::Config(
                    "--snapshot-every works with the local store only: back up a PostgreSQL store with PostgreSQL's own tools (pg_dump, base backups)".into(),
                ));
            }
        }
        if let Some(ha) = &self.ha {
            if self.store.is_none() {
                return Err(HubError::Config(
                    "--identity-key-file is for several Hubs on one PostgreSQL store: give --store postgres://… too, or leave it out for a Hub alone".into(),
                ));
            }
            if ha.leader_lease < Duration::from_secs(1) {
                return Err(HubError::Config(
                    "--leader-lease must be at least 1s (the leader renews it every third of it)"
                        .into(),
                ));
            }
        }
        self.check_nest_lease()?;
        if let Some(s) = &self.snapshots {
            if s.every < Duration::from_secs(1) || s.keep == 0 {
                return Err(HubError::Config(
                    "--snapshot-every must be at least 1s and --snapshot-keep at least 1".into(),
                ));
            }
            crate::store::sealed::SnapshotKey::load(&s.key_file)
                .map_err(|e| HubError::Config(format!("--snapshot-key-file: {e}")))?;
        }
        if self.insecure_plaintext && !self.listen.ip().is_loopback() {
            return Err(HubError::Config(format!(
                "--insecure-plaintext is only allowed on a loopback listen address, not {}; listen on 127.0.0.1 or drop the flag to serve TLS",
                self.listen
            )));
        }
        if let Some(u) = &self.public_url {
            let rest = u
                .strip_prefix("https://")
                .or_else(|| u.strip_prefix("http://"));
            if !rest.is_some_and(|r| !r.is_empty() && !r.contains(['?', '#', ' '])) {
                return Err(HubError::Config(format!(
                    "--public-url {u:?}: expected the Hub's URL as clients reach it, such as https://hub.example.com:7070"
                )));
            }
        }
        if let Some(d) = &self.a2a.domain {
            let ok = !d.is_empty()
                && d.len() <= 200
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(HubError::Config(format!(
                    "--a2a-domain {d:?}: expected a DNS domain such as agents.example.com (deployments are served at <deployment>.<namespace>.<domain>)"
                )));
            }
        }
        if self.a2a.send_wait > Duration::from_secs(3600) {
            return Err(HubError::Config(format!(
                "--a2a-send-wait {:?} is too long; expected at most 1h (default 5m)",
                self.a2a.send_wait
            )));
        }
        if self.console_session_max < Duration::from_secs(60)
            || self.console_session_max > MAX_CONSOLE_SESSION
        {
            return Err(HubError::Config(format!(
                "--console-session-max {:?}: expected 1m to 12h (default 12h)",
                self.console_session_max
            )));
        }
        if self.task_retention < Duration::from_secs(1) {
            return Err(HubError::Config(format!(
                "--task-retention {:?} is too short; expected at least 1s (default 30d)",
                self.task_retention
            )));
        }
        if self.audit_retention < Duration::from_secs(1) {
            return Err(HubError::Config(format!(
                "--audit-retention {:?} is too short; expected at least 1s (default 400d)",
                self.audit_retention
            )));
        }
        if self.nest_ttl < Duration::from_millis(200) {
            return Err(HubError::Config(format!(
                "nest ttl {:?} is too short; expected at least 200ms (default 10s)",
                self.nest_ttl
            )));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval > self.nest_ttl {
            return Err(HubError::Config(format!(
                "heartbeat interval {:?} must be above zero and at most the nest ttl {:?}",
                self.heartbeat_interval, self.nest_ttl
            )));
        }
        if self.nest_disconnect_grace < Duration::from_millis(1500) {
            return Err(HubError::Config(format!(
                "nest disconnect grace {:?} is too short; expected at least 1.5s (default 3s): a Nest cancels its runs one second before it",
                self.nest_disconnect_grace
            )));
        }
        if self.run_start_deadline < Duration::from_secs(1) {
            return Err(HubError::Config(format!(
                "run start deadline {:?} is too short; expected at least 1s (default 30s)",
                self.run_start_deadline
            )));
        }
        self.limits.validate()
    }

    /// Every name the server certificate carries besides `localhost` and `127.0.0.1`.
    pub fn certificate_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        let ip = self.listen.ip();
        if ip.is_unspecified() {
            if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
                names.push(host.trim().to_string());
            }
            // The address of the default route (no packet is sent).
            let primary = std::net::UdpSocket::bind("0.0.0.0:0")
                .and_then(|s| s.connect("192.0.2.1:9").and_then(|()| s.local_addr()));
            if let Ok(addr) = primary {
                names.push(addr.ip().to_string());
            }
        } else {
            names.push(ip.to_string());
        }
        names.extend(self.tls_names.iter().cloned());
        names.retain(|n| !n.is_empty());
        names.dedup();
        names
    }

    /// A Nest silent for longer than this is lost.
    pub fn lost_after(&self) -> Duration {
        self.nest_ttl + self.heartbeat_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_public_url_is_an_http_or_https_url_with_a_host() {
        let check = |u: &str| {
            HubOptions {
                public_url: Some(u.into()),
                ..HubOptions::default()
            }
            .validate()
            .is_ok()
        };
        assert!(check("https://agents.example.com"));
        assert!(check("https://agents.example.com:8443/base"));
        assert!(check("http://127.0.0.1:7070"));
        for bad in [
            "agents.example.com",
            "https://",
            "ftp://x",
            "https://a b",
            "https://x?y",
        ] {
            assert!(!check(bad), "{bad} was accepted");
        }
    }

    #[test]
    fn an_a2a_domain_is_a_dns_domain_and_the_send_wait_at_most_an_hour() {
        let check = |domain: &str, wait: u64| {
            HubOptions {
                a2a: A2aOptions {
                    domain: Some(domain.into()),
                    send_wait: Duration::from_secs(wait),
                    ..A2aOptions::default()
                },
                ..HubOptions::default()
            }
            .validate()
            .is_ok()
        };
        assert!(check("agents.example.com", 0));
        assert!(check("localhost", 3600));
        assert!(!check("agents.example.com", 3601));
        for bad in [
            "",
            "agents..example.com",
            "*.example.com",
            "a b.com",
            "x.com:443",
        ] {
            assert!(!check(bad, 1), "{bad:?} was accepted");
        }
    }

    #[test]
    fn otlp_settings_follow_the_flag_then_the_standard_variables() {
        assert_eq!(OtlpOptions::resolve(None, env(&[])).unwrap(), None);
        let o = OtlpOptions::resolve(
            Some("http://c:4317"),
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.endpoint.as_str(), o.protocol),
            ("http://c:4317", OtlpProtocol::Grpc)
        );
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Bearer t, x-team=blue",
            ),
        ];
        let o = OtlpOptions::resolve(None, env(&vars)).unwrap().unwrap();
        assert_eq!(o.endpoint, "http://c:4318/v1/traces");
        assert_eq!(o.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(
            o.headers,
            vec![
                ("authorization".to_string(), "Bearer t".to_string()),
                ("x-team".to_string(), "blue".to_string())
            ]
        );
        let o = OtlpOptions::resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.endpoint, "http://c:4318/custom");
        assert!(OtlpOptions::resolve(Some("c:4317"), env(&[])).is_err());
        let o = OtlpOptions::resolve(
            Some("https://c:4317"),
            env(&[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/base-ca.pem"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    "/etc/traces-ca.pem",
                ),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.endpoint.as_str(), o.protocol, o.certificate),
            (
                "https://c:4317",
                OtlpProtocol::Grpc,
                Some(PathBuf::from("/etc/traces-ca.pem"))
            )
        );
        assert!(OtlpOptions::resolve(
            Some("http://c:4317"),
            env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
        )
        .is_err());
    }

    #[test]
    fn a_nest_lease_not_above_the_leader_lease_plus_reconnect_time_is_refused() {
        let with = |nest: u64, lease: Option<u64>| HubOptions {
            store: lease.map(|_| "postgres://agen@localhost/agen".into()),
            ha: lease.map(|l| crate::ha::HaOptions {
                identity_key_file: "k".into(),
                leader_lease: Duration::from_secs(l),
                advertise_url: None,
            }),
            nest_lease: Duration::from_secs(nest),
            ..HubOptions::default()
        };
        assert!(with(30, Some(5)).validate().is_ok());
        assert!(with(30, None).validate().is_ok());
        let e = with(10, Some(5)).validate().unwrap_err().to_string();
        for part in [
            "--nest-lease 10s",
            "--leader-lease 5s",
            "reconnect time (5s)",
            "more than 10s",
        ] {
            assert!(e.contains(part), "{part} in: {e}");
        }
        let e = with(5, None).validate().unwrap_err().to_string();
        assert!(
            e.contains("--nest-lease 5s") && !e.contains("leader"),
            "{e}"
        );
        assert!(with(11, Some(5)).validate().is_ok());
    }
}
