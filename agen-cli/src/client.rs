//! The CLI's connection to the Hub: resolves `--hub`/`--token`/`--namespace`/`--ca-file`
//! (flags, then `AGEN_*` environment, then the client config), builds a TLS channel that
//! trusts the Hub's CA, and attaches the bearer token to every call. Client commands speak
//! only gRPC to the Hub, through this module.

use std::path::PathBuf;
use std::time::Duration;

use agen_proto::v1::agen_service_client::AgenServiceClient;
use agen_shared::client_config::ClientConfig;
use anyhow::Context;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Options every client command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Hub URL; several Hubs on one database comma-separated, URL1,URL2 (default: the client
    /// config's `hubs`, else its `hub`)
    #[arg(long, env = "AGEN_HUB", global = true)]
    pub hub: Option<String>,
    /// Namespace
    #[arg(long, env = "AGEN_NAMESPACE", default_value = "default", global = true)]
    pub namespace: String,
    /// API token (default: the client config's `token`)
    #[arg(long, env = "AGEN_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file of the CA that signs the Hub's certificate (default: the client config's `ca_file`)
    #[arg(long, env = "AGEN_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// Output format: table (for people), json or yaml (for scripts)
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "table",
        global = true
    )]
    pub output: Output,
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// Adds `authorization: Bearer <token>` to every request, and `agen-client: user@host` (who
/// made a change, for `agen history`; informative, never trusted for access).
#[derive(Clone)]
pub struct Bearer(
    Option<MetadataValue<tonic::metadata::Ascii>>,
    Option<MetadataValue<tonic::metadata::Ascii>>,
);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        if let Some(v) = &self.1 {
            req.metadata_mut().insert("agen-client", v.clone());
        }
        Ok(req)
    }
}

/// `user@host` of this process, when both are known and printable.
fn client_identity() -> Option<MetadataValue<tonic::metadata::Ascii>> {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })?;
    let host = nix::unistd::gethostname().ok()?.into_string().ok()?;
    format!("{user}@{host}").parse().ok()
}

pub type Client = AgenServiceClient<InterceptedService<Channel, Bearer>>;

/// A connected client plus what the command needs to know about where it points.
pub struct Hub {
    pub client: Client,
    pub url: String,
    pub namespace: String,
    /// The CA file the Hub's certificate is checked with (`None`: plaintext or system roots).
    pub ca_file: Option<PathBuf>,
}

impl ClientArgs {
    /// Resolves the settings and connects (lazily: the first call reports an unreachable Hub).
    pub fn connect(&self) -> anyhow::Result<Hub> {
        let cfg_path = ClientConfig::default_path();
        let cfg = ClientConfig::load(&cfg_path).map_err(|e| {
            crate::exit::coded(
                crate::exit::code::USAGE,
                format!("client config {}: {e:#}", cfg_path.display()),
            )
        })?;
        // Several Hubs: `--hub`/`AGEN_HUB` with commas, or the config's `hubs` (over `hub`).
        let from_cfg = if cfg.hubs.is_empty() {
            cfg.hub.clone()
        } else {
            Some(cfg.hubs.join(","))
        };
        let url = self.hub.clone().or(from_cfg).ok_or_else(|| {
            crate::exit::coded(
                crate::exit::code::USAGE,
                format!(
                    "no Hub to talk to: pass --hub URL, set AGEN_HUB, or run `agen up` \
                     (which writes {})",
                    cfg_path.display()
                ),
            )
        })?;
        let url = leader_of(&url);
        let token = self.token.clone().or(cfg.token.clone());
        let ca_file = self.ca_file.clone().or(cfg.ca_file.clone());
        let channel = channel(&url, ca_file.as_deref())?;
        let bearer = match token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .context("the API token has characters that cannot go in a header")?,
            ),
            None => None,
        };
        let client =
            AgenServiceClient::with_interceptor(channel, Bearer(bearer, client_identity()))
                .max_decoding_message_size(agen_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(agen_proto::MAX_MESSAGE_BYTES);
        Ok(Hub {
            client,
            url,
            namespace: self.namespace.clone(),
            ca_file,
        })
    }
}

/// Of several Hubs (`URL1,URL2,…`, one database), the first that accepts a connection:
/// every Hub serves the client API (a follower forwards each call to the leader, and its refusal
/// when it cannot names the leader's URL). One URL is returned as is;
/// when none answers, the first (the call then says it cannot be reached).
pub fn leader_of(urls: &str) -> String {
    let list: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    if list.len() < 2 {
        return urls.trim().to_owned();
    }
    let listens = |u: &str| {
        use std::net::ToSocketAddrs;
        let Ok((host, port)) = agen_shared::tls::host_port(u) else {
            return false;
        };
        (host.as_str(), port)
            .to_socket_addrs()
            .map(|addrs| {
                addrs.into_iter().any(|a| {
                    std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok()
                })
            })
            .unwrap_or(false)
    };
    list.iter()
        .find(|u| listens(u))
        .or(list.first())
        .map(|u| u.to_string())
        .unwrap_or_default()
}

/// A lazily connecting channel to `url`, trusting `ca_file` for `https://`.
pub fn channel(url: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<Channel> {
    let mut ep = Endpoint::from_shared(url.to_owned())
        .map_err(|e| {
            crate::exit::coded(
                crate::exit::code::USAGE,
                format!("hub URL {url} is not a valid URL (expected https://HOST:PORT): {e}"),
            )
        })?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                crate::exit::coded(
                    crate::exit::code::USAGE,
                    format!(
                        "cannot read the Hub CA file {}: {e}; pass --ca-file or AGEN_CA_FILE, or fix ca_file in the client config",
                        ca.display()
                    ),
                )
            })?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        } else {
            return Err(crate::exit::coded(
                crate::exit::code::USAGE,
                format!(
                    "the Hub at {url} uses TLS but no CA file is configured: pass --ca-file, set \
                     AGEN_CA_FILE, or use the client config `agen up`/`agen hub` wrote"
                ),
            ));
        }
        ep = ep.tls_config(tls).context("bad TLS settings")?;
    }
    Ok(ep.connect_lazy())
}

/// Turns a gRPC status into an error a person can act on; it keeps the status, so the exit
/// code follows it (`exit::of_error`).
pub fn status_error(hub: &Hub, s: tonic::Status) -> anyhow::Error {
    status_error_at(&hub.url, s)
}

/// [`status_error`] for a Hub known by its URL (streams that outlive the borrow of a [`Hub`]).
pub fn status_error_at(url: &str, s: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    // A status the client made from a transport error carries that error as its source; one
    // the Hub sent does not (the Hub answered: it is reachable).
    let transport = std::error::Error::source(&s).map(|e| {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(": ");
            text.push_str(&c.to_string());
            cause = c.source();
        }
        text
    });
    let (code, message) = match (s.code(), transport) {
        (Code::Unavailable, Some(why)) if why.contains("certificate") => (
            crate::exit::code::DENIED,
            format!(
                "the Hub at {url} is not trusted: {why}; point --ca-file (AGEN_CA_FILE, or the client config's ca_file) at the CA of that Hub (its data dir's ca.pem)"
            ),
        ),
        (Code::Unavailable, Some(why)) => (
            crate::exit::code::UNAVAILABLE,
            format!(
                "cannot reach the Hub at {url}: {}: {why} (is `agen up` or `agen hub` running? set --hub or AGEN_HUB)",
                s.message()
            ),
        ),
        (Code::Unavailable, None) => (
            crate::exit::code::UNAVAILABLE,
            format!("the Hub at {url} answered: {}", s.message()),
        ),
        (Code::Unauthenticated, _) if s.message().contains("--token") => (
            crate::exit::code::DENIED,
            format!("the Hub at {url} refused the token: {}", s.message()),
        ),
        (Code::Unauthenticated, _) => (
            crate::exit::code::DENIED,
            format!(
                "the Hub at {url} refused the token: {} (set --token or AGEN_TOKEN, or check the client config)",
                s.message()
            ),
        ),
        (Code::PermissionDenied, _) => (
            crate::exit::code::DENIED,
            format!("permission denied: {}", s.message()),
        ),
        (c, _) => (crate::exit::of_status(c), s.message().to_string()),
    };
    crate::exit::coded(code, message)
}
