//! The Nest's configuration ([`NestOptions`]), its error type ([`NestError`]) and the files it
//! keeps in its data dir (`node-id`, `nest.sock`, `bundles/`, `children.json`, `hub-ca.pem`,
//! `nest.key` (0600) and `nest.crt`: the Nest's client certificate, issued by the Hub's `Join`;
//! with separated instances also `run-uids.json`; their run dirs and the socket are then in a
//! run root outside the data dir, see `separation`).
//! The data dir is private to the Nest's user: 0700, files 0600 (`agen nest`/`agen up` set
//! umask 077, and the files here are created with that mode); a looser one is tightened at start.
//!
//! The join token comes from a file (`--join-file`, e.g. the Hub's `<data-dir>/join-token`) or
//! the `AGEN_JOIN_TOKEN` environment variable ([`read_join_file`], [`JOIN_TOKEN_ENV`]), so that
//! it is not on the Nest's command line.
//!
//! Invariants: the node id is created once and then read back on every start, so a Nest keeps
//! its identity across restarts; nothing here binds a socket or talks to the network; the join
//! token never reaches [`NestOptions::env`] (bundles' `source: env` secrets read that).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The environment variable a Nest reads its join token from.
pub const JOIN_TOKEN_ENV: &str = "AGEN_JOIN_TOKEN";

/// Reads a join token from `path` (surrounding whitespace ignored).
pub fn read_join_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        NestError::JoinToken(format!(
            "cannot read --join-file {}: {e}; copy <hub data dir>/join-token there (mode 0600)",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(NestError::JoinToken(format!(
            "--join-file {} is empty; copy <hub data dir>/join-token there",
            path.display()
        )));
    }
    Ok(token.to_string())
}

/// Default number of instances a Nest runs at most.
pub const DEFAULT_CAPACITY: u32 = 32;

/// The default `--stop-grace`: below the unit's `TimeoutStopSec=30s`.
pub const DEFAULT_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// The default [`NestOptions::event_batch_window`].
pub const DEFAULT_EVENT_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(5);

/// The default `--nest-lease`: how long a Nest with no Hub keeps its runs.
pub const DEFAULT_NEST_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// The shortest `--nest-lease` accepted (a Hub restart takes longer than this).
pub const MIN_NEST_LEASE: std::time::Duration = std::time::Duration::from_secs(1);

/// Everything `daemon::run` needs. `agen nest` builds it from flags; `agen up` builds several.
#[derive(Debug, Clone)]
pub struct NestOptions {
    /// The Hub's URL (`https://host:port`, or `http://` for a plaintext loopback Hub).
    pub hub: String,
    /// `agen1.<ca sha256>.<secret>`: presented as the bearer token on every NestService call.
    pub join_token: String,
    /// Where the node id, the socket, the bundle cache and the children registry live.
    pub data_dir: PathBuf,
    /// Shown by `agen nests`; defaults to the host name.
    pub name: String,
    /// With a default `name`: the name the Hub gives this Nest when another live Nest holds the
    /// host name (`<host>-<6 hex of sha256(data dir)>`, see [`fallback_name`]). Empty when the
    /// name was given explicitly.
    pub fallback_name: String,
    /// Its labels and configured cordon: what a SIGHUP can change while it runs.
    pub settings: LiveSettings,
    /// Maximum number of instances.
    pub capacity: u32,
    /// The agen binary that instances run as (`<agen_bin> instance ...`).
    pub agen_bin: PathBuf,
    /// The Nest's environment, for secrets with `source: env`.
    pub env: Vec<(String, String)>,
    /// Where to serve Prometheus metrics (`GET /metrics`); `None`: not served.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The bearer token `/metrics` needs (`--metrics-token-file`); `None`: unauthenticated.
    pub metrics_token: Option<String>,
    /// Who instances run as (`--run-uids`, `--run-as`, `--run-as-self`; see `separation`).
    pub run_as: crate::separation::RunAs,
    /// `--run-root`: where a separating Nest keeps run dirs and its socket (`None`: `/run/agen`).
    pub run_root: Option<PathBuf>,
    /// Where the socket is when not in the data dir (set at start for separated instances).
    pub socket_dir: Option<PathBuf>,
    /// On shutdown, how long running runs may go on finishing (no new ones come) before the
    /// Nest leaves and the rest are handed over (`--stop-grace`).
    pub stop_grace: std::time::Duration,
    /// How long run events nobody waits for are gathered before their batch goes to the Hub
    /// (default 5 ms). A waited-for event never waits for it, nor does anything the Hub sends.
    pub event_batch_window: std::time::Duration,
    /// How long the Nest keeps its runs while it hears nothing from any Hub (`--nest-lease`,
    /// default 30 s): a Hub restart or pause shorter than this interrupts no run; past it the
    /// Nest stops them (`nest_fenced`) and the Hub resumes them from their logs.
    pub nest_lease: std::time::Duration,
    /// The commit this Nest was built from (the binary knows it; `unknown` otherwise), sent in
    /// `Register` and shown by `agen nests`.
    pub commit: String,
    /// What a sandboxed instance may reach when its bundle has no `network.allow`
    /// (`--egress-default`, default allow).
    pub egress_default: EgressDefault,
    /// `--shared-network`: separated instances share the host's network (no namespace, no
    /// egress proxy); said at start and in `agen nests`.
    pub shared_network: bool,
}

impl NestOptions {
    /// Options with the documented defaults: data dir `~/.local/share/agen/nest`, name = host
    /// name, capacity 32, the current executable, the process environment (without the join
    /// token).
    /// The Hubs of `--hub` (several, comma-separated, when several Hubs share one database):
    /// tried in turn while none answers as the leader.
    pub fn hub_urls(&self) -> Vec<String> {
        let urls: Vec<String> = self
            .hub
            .split(',')
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            vec![self.hub.trim().to_owned()]
        } else {
            urls
        }
    }

    pub fn new(hub: impl Into<String>, join_token: impl Into<String>) -> NestOptions {
        NestOptions {
            hub: hub.into(),
            join_token: join_token.into(),
            data_dir: default_data_dir(),
            name: host_name(),
            fallback_name: String::new(),
            settings: LiveSettings::default(),
            capacity: DEFAULT_CAPACITY,
            agen_bin: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("agen")),
            env: std::env::vars()
                .filter(|(k, _)| k != JOIN_TOKEN_ENV)
                .collect(),
            metrics_listen: None,
            metrics_token: None,
            run_as: crate::separation::RunAs::default(),
            run_root: None,
            socket_dir: None,
            stop_grace: DEFAULT_STOP_GRACE,
            event_batch_window: DEFAULT_EVENT_BATCH_WINDOW,
            nest_lease: DEFAULT_NEST_LEASE,
            commit: "unknown".into(),
            egress_default: EgressDefault::Allow,
            shared_network: false,
        }
    }

    /// `nest.sock` in the data dir, or in [`NestOptions::socket_dir`] when that is set (the
    /// run root of separated instances).
    pub fn socket_path(&self) -> PathBuf {
        self.socket_dir
            .as_deref()
            .unwrap_or(&self.data_dir)
            .join("nest.sock")
    }
    pub fn bundles_dir(&self) -> PathBuf {
        self.data_dir.join("bundles")
    }
    pub fn children_file(&self) -> PathBuf {
        self.data_dir.join("children.json")
    }
    pub fn ca_file(&self) -> PathBuf {
        self.data_dir.join("hub-ca.pem")
    }
    /// The join token CA hash `hub-ca.pem` descends from, once a CA rotation replaced the CA
    /// the token pins (the Hub sent the new CAs over a connection the pinned CA verified).
    pub fn ca_pin_file(&self) -> PathBuf {
        self.data_dir.join("hub-ca.pin")
    }
    /// The Nest's client certificate (PEM), issued by the Hub's `Join`.
    pub fn cert_file(&self) -> PathBuf {
        self.data_dir.join("nest.crt")
    }
    /// The Nest's private key (PEM, mode 0600); never leaves this machine.
    pub fn key_file(&self) -> PathBuf {
        self.data_dir.join("nest.key")
    }
    /// The value of an environment variable of the Nest, from [`NestOptions::env`].
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `~/.local/share/agen/nest` (or `$XDG_DATA_HOME/agen/nest`).
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("agen/nest");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/agen/nest")
}

/// `<host>-<first 6 hex digits of sha256(data dir)>`: the name of a Nest that is not the first
/// on its host (stable for a data dir).
pub fn fallback_name(data_dir: &std::path::Path) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    format!("{}-{}", host_name(), &hex::encode(digest)[..6])
}

/// The machine's host name, or `nest` when it cannot be read.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "nest".to_string())
}

/// Errors of the Nest daemon.
#[derive(Debug, thiserror::Error)]
pub enum NestError {
    #[error("nest data dir {}: {action}: {source}; check the path and its permissions (--data-dir)", path.display())]
    DataDir {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("bad --hub URL `{url}`: {reason}; expected https://host:port (or http:// for a plaintext Hub)")]
    HubUrl { url: String, reason: String },
    #[error("bad join token: {0}; use the token the Hub wrote to <hub data dir>/join-token")]
    JoinToken(String),
    #[error("cannot trust the hub at {url}: {reason}")]
    Trust { url: String, reason: String },
    #[error("cannot listen on the instance socket {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bundle {digest}: {reason}")]
    Bundle { digest: String, reason: String },
    #[error("cannot start instance {instance}: {source}")]
    Spawn {
        instance: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = NestError> = std::result::Result<T, E>;

impl NestError {
    /// Whether the error is in the options (exit code 64), not in the environment.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            NestError::Config(_) | NestError::HubUrl { .. } | NestError::JoinToken(_)
        )
    }
}

impl NestOptions {
    /// Checks the options without touching the disk or the network.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(NestError::Config(
                "the nest name is empty; pass --name NAME".into(),
            ));
        }
        if self.capacity == 0 {
            return Err(NestError::Config(
                "--capacity must be at least 1 (default 32)".into(),
            ));
        }
        if self.nest_lease < MIN_NEST_LEASE {
            return Err(NestError::Config(format!(
                "--nest-lease {:?} is too short: a nest must keep its runs for at least 1s without a hub (default 30s)",
                self.nest_lease
            )));
        }
        let hubs = self.hub_urls();
        for hub in &hubs {
            let rest = hub
                .strip_prefix("https://")
                .or_else(|| hub.strip_prefix("http://"))
                .ok_or_else(|| NestError::HubUrl {
                    url: hub.to_string(),
                    reason: "no http:// or https:// scheme".into(),
                })?;
            if rest.trim_end_matches('/').is_empty() {
                return Err(NestError::HubUrl {
                    url: hub.to_string(),
                    reason: "no host".into(),
                });
            }
        }
        if hubs.iter().any(|h| h.starts_with("https://")) {
            agen_shared::tls::JoinToken::parse(&self.join_token)
                .map_err(|e| NestError::JoinToken(e.to_string()))?;
        } else if self.join_token.trim().is_empty() {
            return Err(NestError::JoinToken("it is empty".into()));
        }
        Ok(())
    }
}

/// Reads `<data-dir>/node-id`, creating it (a fresh UUID) on first start.
pub fn load_or_create_node_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join("node-id");
    let err = |action: &'static str| {
        let path = path.clone();
        move |source| NestError::DataDir {
            path,
            action,
            source,
        }
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("cannot read")(e)),
    }
    let id = uuid::Uuid::new_v4().to_string();
    let tmp = data_dir.join(".node-id.tmp");
    agen_shared::private::write_file(&tmp, format!("{id}\n").as_bytes())
        .map_err(err("cannot write"))?;
    std::fs::rename(&tmp, &path).map_err(err("cannot write"))?;
    Ok(id)
}

/// Creates the data dir (mode 0700) if needed; one that others can read into is tightened
/// (folders 0700, files without group/other bits) and each change is logged.
pub fn prepare_data_dir(data_dir: &Path) -> Result<()> {
    agen_shared::private::prepare_data_dir(data_dir).map_err(|source| NestError::DataDir {
        path: data_dir.to_path_buf(),
        action: "cannot create or make private",
        source,
    })?;
    Ok(())
}

/// What the Nest decides for a bundle without a `network.allow` list (`--egress-default`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EgressDefault {
    #[default]
    Allow,
    Deny,
}

impl EgressDefault {
    pub fn parse(s: &str) -> Result<EgressDefault, String> {
        match s {
            "allow" => Ok(EgressDefault::Allow),
            "deny" => Ok(EgressDefault::Deny),
            other => Err(format!("--egress-default {other}: expected allow or deny")),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            EgressDefault::Allow => "allow",
            EgressDefault::Deny => "deny",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_is_created_once_and_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_create_node_id(dir.path()).expect("create");
        let second = load_or_create_node_id(dir.path()).expect("read");
        assert_eq!(first, second);
        assert_eq!(first.len(), 36);
    }

    #[test]
    fn options_are_checked_before_anything_starts() {
        let token = format!("agen1.{}.s3cret", "a".repeat(64));
        let check = |hub: &str, token: &str, name: &str, expected: Result<(), &str>| {
            let mut o = NestOptions::new(hub, token);
            o.name = name.into();
            let got = o.validate().map_err(|e| e.to_string());
            match (&got, &expected) {
                (Ok(()), Ok(())) => {}
                (Err(g), Err(e)) => assert!(g.starts_with(e), "{hub}: got {g}, expected {e}…"),
                _ => panic!("{hub}: got {got:?}, expected {expected:?}"),
            }
        };
        check("https://hub:7070", &token, "n1", Ok(()));
        check("http://127.0.0.1:7070", "anything", "n1", Ok(()));
        check(
            "hub:7070",
            &token,
            "n1",
            Err("bad --hub URL `hub:7070`: no http:// or https:// scheme"),
        );
        check(
            "https://",
            &token,
            "n1",
            Err("bad --hub URL `https://`: no host"),
        );
        check(
            "https://hub:7070",
            "agen1.abc.s",
            "n1",
            Err("bad join token: join token is malformed"),
        );
        check(
            "https://hub:7070",
            &token,
            " ",
            Err("the nest name is empty"),
        );
    }

    #[test]
    fn a_join_file_is_read_trimmed_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("join-token");
        std::fs::write(&path, "agen1.x.y\n").expect("write");
        assert_eq!(read_join_file(&path).expect("read"), "agen1.x.y");
        std::fs::write(&path, " \n").expect("write");
        let err = read_join_file(&path).expect_err("empty").to_string();
        assert!(err.contains("is empty"), "{err}");
        let err = read_join_file(&dir.path().join("missing"))
            .expect_err("missing")
            .to_string();
        assert!(err.contains("cannot read --join-file"), "{err}");
    }

    #[test]
    fn env_var_reads_the_nest_environment_not_the_process() {
        let mut o = NestOptions::new("http://127.0.0.1:1", "t");
        o.env = vec![("A".into(), "1".into()), ("A".into(), "2".into())];
        assert_eq!(o.env_var("A"), Some("2"));
        assert_eq!(o.env_var("B"), None);
    }
}

/// What can change in a running Nest and reach the Hub (`NestSettings`): its labels and the
/// cordon of its configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSettings {
    pub labels: BTreeMap<String, String>,
    pub cordon: bool,
}

/// The Nest's [`NodeSettings`], shared by the daemon (its Hub link sends them after every
/// registration and whenever they change) and whoever reloads the configuration (SIGHUP).
#[derive(Debug, Clone)]
pub struct LiveSettings(std::sync::Arc<tokio::sync::watch::Sender<NodeSettings>>);

impl Default for LiveSettings {
    fn default() -> Self {
        LiveSettings(std::sync::Arc::new(tokio::sync::watch::Sender::new(
            NodeSettings::default(),
        )))
    }
}

impl LiveSettings {
    /// The settings now.
    pub fn get(&self) -> NodeSettings {
        self.0.borrow().clone()
    }

    /// Replaces them; the Hub link sends them at once (nothing when they are the same).
    pub fn set(&self, s: NodeSettings) {
        self.0.send_if_modified(|now| {
            let changed = *now != s;
            *now = s;
            changed
        });
    }

    /// Follows changes (the Hub link).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<NodeSettings> {
        self.0.subscribe()
    }
}
