//! The Hub's TLS material as it is now: the CA that signs Nest certificates, the CAs a Nest
//! certificate may be signed by and the server certificate the listener presents. `agen hub
//! rotate-ca` changes the files of `<data-dir>/tls/` (through `agen_shared::tls`); [`LiveTls::watch`]
//! sees the change within a second and swaps them in, so new connections and new Nest
//! certificates use them without a restart (connections already open keep theirs).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use agen_shared::tls::HubTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::error::{HubError, Result};

/// How often the `tls/` folder is looked at.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The server TLS config: the Hub's certificate, client certificates from its CA accepted but
/// not required, ALPN `h2` and `http/1.1`.
pub fn server_config(hub_tls: &agen_shared::tls::HubTls) -> Result<rustls::ServerConfig> {
    let bad = |what: &str, e: String| {
        HubError::Serve(format!(
            "tls: {what}: {e}; delete the hub's tls/ folder to issue new ones"
        ))
    };
    let mut roots = rustls::RootCertStore::empty();
    // The CA, and during a CA rotation the previous one too (`agen hub rotate-ca`).
    for der in agen_shared::tls::pem_certs(&hub_tls.trust_pem) {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| bad("the CA certificate", e.to_string()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .allow_unauthenticated()
        .build()
        .map_err(|e| bad("the client certificate verifier", e.to_string()))?;
    let chain: Vec<CertificateDer<'static>> =
        agen_shared::tls::pem_certs(&hub_tls.server_chain_pem)
            .into_iter()
            .map(CertificateDer::from)
            .collect();
    let key = PrivateKeyDer::from_pem_slice(hub_tls.server_key_pem.as_bytes())
        .map_err(|e| bad("the server key", e.to_string()))?;
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| bad("the server certificate", e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

struct Loaded {
    hub: Arc<HubTls>,
    server: Arc<rustls::ServerConfig>,
    /// The CA files as they were read.
    stamp: Vec<u8>,
}

/// The Hub's current TLS material, swapped in place when the CA files change.
pub struct LiveTls {
    dir: PathBuf,
    names: Vec<String>,
    loaded: RwLock<Loaded>,
}

/// What the CA files of `dir` hold now (compared, never parsed).
fn stamp(dir: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    for f in [
        "ca.pem",
        agen_shared::tls::CA_PREVIOUS_FILE,
        agen_shared::tls::CA_CROSS_FILE,
    ] {
        out.extend(std::fs::read(dir.join(f)).unwrap_or_default());
        out.push(0);
    }
    out
}

impl LiveTls {
    /// The material of `hub` (loaded from `dir` with the server names `names`).
    pub fn new(dir: PathBuf, names: Vec<String>, hub: HubTls) -> Result<Arc<LiveTls>> {
        let server = Arc::new(server_config(&hub)?);
        let stamp = stamp(&dir);
        Ok(Arc::new(LiveTls {
            dir,
            names,
            loaded: RwLock::new(Loaded {
                hub: Arc::new(hub),
                server,
                stamp,
            }),
        }))
    }

    /// The CA, the trust and the server certificate now.
    pub fn hub(&self) -> Arc<HubTls> {
        match self.loaded.read() {
            Ok(l) => l.hub.clone(),
            Err(p) => p.into_inner().hub.clone(),
        }
    }

    /// The listener's TLS settings now.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        match self.loaded.read() {
            Ok(l) => l.server.clone(),
            Err(p) => p.into_inner().server.clone(),
        }
    }

    /// Loads the files again when they changed; true when something new was swapped in.
    pub fn reload(&self) -> Result<bool> {
        let now = stamp(&self.dir);
        if self.loaded.read().map(|l| l.stamp == now).unwrap_or(false) {
            return Ok(false);
        }
        let hub = agen_shared::tls::load_or_create_hub_tls(&self.dir, &self.names)
            .map_err(|e| HubError::Config(format!("tls: {e}")))?;
        let server = Arc::new(server_config(&hub)?);
        let trusted = agen_shared::tls::pem_certs(&hub.trust_pem).len();
        let ca = hub.ca_sha256.clone();
        match self.loaded.write() {
            Ok(mut l) => {
                *l = Loaded {
                    hub: Arc::new(hub),
                    server,
                    stamp: now,
                }
            }
            Err(p) => {
                *p.into_inner() = Loaded {
                    hub: Arc::new(hub),
                    server,
                    stamp: now,
                }
            }
        }
        tracing::info!(ca_sha256 = %ca, trusted_cas = trusted, "the hub's CA files changed: new connections and nest certificates use them now");
        Ok(true)
    }

    /// Reloads on change until `stop`; a file that cannot be read keeps what was loaded (said
    /// at warn).
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            if let Err(e) = self.reload() {
                tracing::warn!(dir = %self.dir.display(), "cannot load the hub's changed CA files, keeping the ones in use: {e}");
            }
        }
    }
}
