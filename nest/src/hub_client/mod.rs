//! The bottom of the Nest: how it reaches its Hub. [`client`] builds the gRPC client (the
//! Hub's CA pinned by the join token's hash, fetched once by [`fetch_pinned_ca`]; the Nest's
//! certificate from `Join`, renewed when due), [`ClientSlot`] keeps one and rebuilds it when
//! the certificate is due; everything that calls the Hub (the link, bundles, artifacts,
//! children, logs) gets its client here and nothing here knows who calls.
//!
//! [`HubClient`]'s methods (in [`calls`]) take and return the Nest's domain types
//! (`crate::model`); [`convert`] is the Nest's one protobuf ⇄ domain conversion, used by the
//! calls and by the Hub link. Nothing below the link sees a protobuf type.

pub mod calls;
pub mod convert;

pub use calls::{CallError, Chunks};

use std::sync::Arc;
use std::time::Duration;

use agen_shared::tls::{self, TlsError};
use rustls::pki_types::ServerName;

use agen_proto::v1::nest_service_client::NestServiceClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::{NestError, NestOptions, Result};

/// The tonic client of the Hub's `NestService`.
type Raw = NestServiceClient<InterceptedService<Channel, Bearer>>;

/// The Nest's client of its Hub: its certificate (TLS) or the join token (plaintext)
/// identifies it. Cheap to clone (one connection).
#[derive(Clone)]
pub struct HubClient(Raw);

/// How long the TCP connect and the TLS handshake may each take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `hub_url` (`https://HOST:PORT`), accepts the TLS handshake only if the Hub
/// presents a certificate whose sha256 is `expected_sha256` (and a leaf signed by it), and
/// returns that certificate as PEM. The Nest stores it and uses it as its trust root.
pub async fn fetch_pinned_ca(hub_url: &str, expected_sha256: &str) -> Result<String, TlsError> {
    let (host, port) = tls::host_port(hub_url)?;
    let server_name =
        ServerName::try_from(host.clone()).map_err(|_| TlsError::BadUrl(hub_url.to_string()))?;
    let (config, pinned) = tls::pinned_ca_client(expected_sha256)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let connect_err = |reason: String| TlsError::Connect {
        url: hub_url.to_string(),
        reason,
    };
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| connect_err("timed out after 10s".into()))?
    .map_err(|e| connect_err(e.to_string()))?;
    let handshake =
        tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(server_name, tcp)).await;
    let mismatch = || TlsError::Mismatch {
        url: hub_url.to_string(),
        expected: expected_sha256.to_string(),
    };
    match (handshake, pinned.take_pem()) {
        (Ok(Ok(_stream)), Some(pem)) => Ok(pem),
        (Ok(Err(e)), _) if e.to_string().contains("join token") => Err(mismatch()),
        (Ok(Err(e)), _) => Err(connect_err(format!("tls handshake failed: {e}"))),
        (Err(_), _) => Err(connect_err("tls handshake timed out after 10s".into())),
        (Ok(Ok(_)), None) => Err(mismatch()),
    }
}

/// Adds the join token as the bearer of every request, when there is one to send.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Builds the client for `opts.hub`. For `https://` the Hub's CA is read from
/// `<data-dir>/hub-ca.pem` when its hash matches the join token, otherwise fetched from the Hub
/// pinned by that hash and stored; then the Nest's certificate is read from `<data-dir>` or
/// obtained by `Join`. Connects lazily: no network IO besides the CA fetch and `Join`.
pub async fn client(opts: &NestOptions) -> Result<HubClient> {
    let first = opts.hub_urls().into_iter().next().unwrap_or_default();
    client_at(opts, &first, false).await
}

/// [`client`] for one of the Nest's Hubs, `hub`, renewing the Nest's certificate first when
/// `renew` (the Hub's CA changed).
pub async fn client_at(opts: &NestOptions, hub: &str, renew: bool) -> Result<HubClient> {
    let hub = hub.trim_end_matches('/').to_string();
    let bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
        format!("Bearer {}", opts.join_token.trim())
            .parse()
            .map_err(|_| {
                NestError::JoinToken("it contains characters that cannot go in a header".into())
            })?;
    let endpoint = Endpoint::from_shared(hub.clone())
        .map_err(|e| NestError::HubUrl {
            url: hub.clone(),
            reason: e.to_string(),
        })?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let endpoint = if hub.starts_with("https://") {
        // Several rustls providers are in the build graph: pick ring for the process (no-op
        // when one is installed already).
        agen_shared::tls::install_crypto_provider();
        let ca = trusted_ca(opts, &hub).await?;
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        let trust_err = |e: tonic::transport::Error| NestError::Trust {
            url: hub.clone(),
            reason: e.to_string(),
        };
        let identity = nest_identity(
            opts,
            &hub,
            &ca,
            endpoint.clone(),
            tls.clone(),
            &bearer,
            renew,
        )
        .await?;
        // A renewal may have brought the Hub's new CAs (a CA rotation): trust them from now on.
        let ca = std::fs::read_to_string(opts.ca_file()).unwrap_or(ca);
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
            // The certificate is the Nest's credential from now on.
            return Ok(HubClient(NestServiceClient::with_interceptor(
                endpoint.tls_config(tls).map_err(trust_err)?.connect_lazy(),
                Bearer(None),
            )));
        }
        endpoint.tls_config(tls).map_err(trust_err)?
    } else if hub.starts_with("http://") {
        endpoint
    } else {
        return Err(NestError::HubUrl {
            url: hub,
            reason: "no http:// or https:// scheme".into(),
        });
    };
    // The same message limit as the Hub's, both ways: the Hub refuses over-limit fields itself.
    Ok(HubClient(
        NestServiceClient::with_interceptor(endpoint.connect_lazy(), Bearer(Some(bearer)))
            .max_decoding_message_size(agen_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(agen_proto::MAX_MESSAGE_BYTES),
    ))
}

/// The Nest's certificate and key (PEM): the stored ones when they are current for this Hub's
/// CA and node id (renewed first, with the Nest's own certificate and key, once two thirds of
/// their lifetime have passed), otherwise a certificate from `Join` with the join token for the
/// Nest's key (kept when there is one: the Hub binds a nest id to its key). `None` when the
/// Hub predates `Join` (it knows the Nest by the join token alone).
async fn nest_identity(
    opts: &NestOptions,
    hub: &str,
    ca_pem: &str,
    endpoint: Endpoint,
    tls_config: ClientTlsConfig,
    bearer: &tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    renew: bool,
) -> Result<Option<(String, String)>> {
    use agen_shared::tls;
    let nest_id = crate::config::load_or_create_node_id(&opts.data_dir)?;
    let (cert_path, key_path) = (opts.cert_file(), opts.key_file());
    let trust = |reason: String| NestError::Trust {
        url: hub.to_string(),
        reason,
    };
    let stored_key = std::fs::read_to_string(&key_path).ok();
    if let (Ok(cert), Some(key)) = (std::fs::read_to_string(&cert_path), stored_key.clone()) {
        if tls::nest_cert_is_current(&cert, ca_pem, &nest_id) {
            let due =
                renew || tls::nest_cert_renew_at(&cert).is_some_and(|at| now_ms() / 1000 >= at);
            if !due {
                return Ok(Some((cert, key)));
            }
            let own = endpoint
                .clone()
                .tls_config(tls_config.clone().identity(Identity::from_pem(&cert, &key)))
                .map_err(|e| trust(e.to_string()))?;
            let csr_pem =
                tls::nest_csr_for_key(&key, &nest_id).map_err(|e| trust(e.to_string()))?;
            let mut renewer = NestServiceClient::with_interceptor(own.connect_lazy(), Bearer(None));
            let request = agen_proto::v1::JoinRequest {
                nest_id: nest_id.clone(),
                name: opts.name.clone(),
                csr_pem,
            };
            match renewer.join(request).await {
                Ok(r) => {
                    let r = r.into_inner();
                    let renewed = r.cert_pem;
                    if adopt_rotated_ca(opts, ca_pem, &r.ca_pem, &renewed, &nest_id)? {
                        tls::write_private(&cert_path, renewed.as_bytes())
                            .map_err(|e| trust(e.to_string()))?;
                        tracing::info!(nest_id = %nest_id, path = %cert_path.display(), "the hub's CA changed: renewed the nest certificate and trust its new CAs");
                        return Ok(Some((renewed, key)));
                    }
                    if tls::nest_cert_is_current(&renewed, ca_pem, &nest_id) {
                        tls::write_private(&cert_path, renewed.as_bytes())
                            .map_err(|e| trust(e.to_string()))?;
                        tracing::info!(nest_id = %nest_id, path = %cert_path.display(), "renewed the nest certificate");
                        return Ok(Some((renewed, key)));
                    }
                    tracing::warn!(
                        "the hub returned an unusable renewed certificate; keeping the current one"
                    );
                }
                Err(status) => {
                    tracing::warn!(code = ?status.code(), message = %status.message(), "cannot renew the nest certificate; keeping the current one");
                }
            }
            return Ok(Some((cert, key)));
        }
        tracing::warn!(path = %cert_path.display(), "stored nest certificate is not valid for this hub and node id; joining again");
    }
    let (key, csr_pem) = match stored_key {
        Some(key) => {
            let csr = tls::nest_csr_for_key(&key, &nest_id).map_err(|e| trust(e.to_string()))?;
            (key, csr)
        }
        None => {
            // Stored before the Join leaves: a Join the Hub bound but whose answer was lost
            // (a timeout under load) is retried with the same key, which the Hub renews;
            // a new key would be refused for good as another Nest's.
            let (key, csr) = tls::nest_key_and_csr(&nest_id).map_err(|e| trust(e.to_string()))?;
            tls::write_private(&key_path, key.as_bytes()).map_err(|e| trust(e.to_string()))?;
            (key, csr)
        }
    };
    let joining = endpoint
        .tls_config(tls_config)
        .map_err(|e| trust(e.to_string()))?;
    let mut joiner =
        NestServiceClient::with_interceptor(joining.connect_lazy(), Bearer(Some(bearer.clone())));
    let request = agen_proto::v1::JoinRequest {
        nest_id: nest_id.clone(),
        name: opts.name.clone(),
        csr_pem,
    };
    match joiner.join(request).await {
        Ok(response) => {
            let response = response.into_inner();
            let cert = response.cert_pem;
            // Joined during a CA rotation with a token of the previous CA: the new CA signed.
            if !tls::nest_cert_is_current(&cert, ca_pem, &nest_id)
                && !adopt_rotated_ca(opts, ca_pem, &response.ca_pem, &cert, &nest_id)?
            {
                return Err(trust(format!(
                    "join: the hub returned a certificate that is not for nest {nest_id} or not signed by the pinned CA"
                )));
            }
            tls::write_private(&cert_path, cert.as_bytes()).map_err(|e| trust(e.to_string()))?;
            tracing::info!(nest_id = %nest_id, path = %cert_path.display(), "joined the hub: stored the nest certificate");
            Ok(Some((cert, key)))
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::warn!("the hub predates Join; connecting with the join token alone");
            Ok(None)
        }
        Err(status) => Err(trust(format!(
            "join failed ({:?}): {}",
            status.code(),
            status.message()
        ))),
    }
}

/// After a CA rotation (`agen hub rotate-ca`): when the renewed certificate is signed by the
/// first CA of `new_cas` (the Hub's trust, sent over a connection `trusted` verified) and
/// `new_cas` still holds the CA the Nest trusts, `new_cas` becomes the Nest's trust
/// (`hub-ca.pem`, with `hub-ca.pin` naming the join token's CA it descends from). False when
/// nothing changed.
fn adopt_rotated_ca(
    opts: &NestOptions,
    trusted: &str,
    new_cas: &str,
    renewed: &str,
    nest_id: &str,
) -> Result<bool> {
    use agen_shared::tls;
    let first = |pem: &str| tls::ca_pem_sha256(pem).ok();
    if new_cas.is_empty() || first(new_cas) == first(trusted) {
        return Ok(false);
    }
    let Some(trusted_sha) = first(trusted) else {
        return Ok(false);
    };
    let continuity = tls::pem_certs(new_cas)
        .iter()
        .any(|c| tls::der_sha256(c) == trusted_sha);
    if !continuity || !tls::nest_cert_is_current(renewed, new_cas, nest_id) {
        return Ok(false);
    }
    let token =
        tls::JoinToken::parse(&opts.join_token).map_err(|e| NestError::JoinToken(e.to_string()))?;
    let pin = std::fs::read_to_string(opts.ca_pin_file())
        .ok()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or(token.ca_sha256);
    let io = |e: TlsError| NestError::Trust {
        url: opts.hub.clone(),
        reason: e.to_string(),
    };
    tls::write_private(&opts.ca_pin_file(), pin.as_bytes()).map_err(io)?;
    tls::write_private(&opts.ca_file(), new_cas.as_bytes()).map_err(io)?;
    Ok(true)
}

async fn trusted_ca(opts: &NestOptions, hub: &str) -> Result<String> {
    use agen_shared::tls;
    let token =
        tls::JoinToken::parse(&opts.join_token).map_err(|e| NestError::JoinToken(e.to_string()))?;
    let path = opts.ca_file();
    if let Ok(pem) = std::fs::read_to_string(&path) {
        if tls::ca_pem_sha256(&pem).ok().as_deref() == Some(token.ca_sha256.as_str()) {
            return Ok(pem);
        }
        // The CAs a rotation gave, descending from the CA this token pins.
        let pin = std::fs::read_to_string(opts.ca_pin_file()).unwrap_or_default();
        if pin.trim() == token.ca_sha256 {
            return Ok(pem);
        }
        tracing::warn!(path = %path.display(), "stored hub CA does not match the join token; fetching it again");
    }
    let pem = crate::hub_client::fetch_pinned_ca(hub, &token.ca_sha256)
        .await
        .map_err(|e| NestError::Trust {
            url: hub.to_string(),
            reason: e.to_string(),
        })?;
    tls::write_private(&path, pem.as_bytes()).map_err(|e| NestError::Trust {
        url: hub.to_string(),
        reason: e.to_string(),
    })?;
    tracing::info!(path = %path.display(), "trusting the hub CA pinned by the join token");
    Ok(pem)
}

/// The Hub client, built on first use (an `https://` Hub needs its CA fetched first) and again
/// once its certificate is due for renewal, with the renewal time (unix seconds).
#[derive(Default)]
pub struct ClientSlot(
    tokio::sync::Mutex<Option<(HubClient, Option<i64>)>>,
    /// Set when the Hub said it signs with a CA the Nest does not trust first: renew.
    std::sync::atomic::AtomicBool,
    /// Which of the Nest's Hubs (`--hub URL1,URL2,…`) the client is for.
    std::sync::atomic::AtomicUsize,
    /// The leader a follower named (the leader hint) when it is none of `--hub`'s URLs.
    std::sync::Mutex<Option<String>>,
    /// A leader hint came since the last failure: the next `fail_over` keeps it.
    std::sync::atomic::AtomicBool,
);

impl ClientSlot {
    /// The URL of the Hub the slot's client is (or will be) for.
    pub fn current(&self, opts: &NestOptions) -> String {
        if let Some(hinted) = self.3.lock().ok().and_then(|h| h.clone()) {
            return hinted;
        }
        let urls = opts.hub_urls();
        let i = self.2.load(std::sync::atomic::Ordering::SeqCst) % urls.len().max(1);
        urls.get(i).cloned().unwrap_or_default()
    }

    /// Goes on to the next of several Hubs (after the current one failed or refused the Nest
    /// as a follower); the next call connects anew. No-op with one Hub.
    pub async fn fail_over(&self, opts: &NestOptions) {
        if self.4.swap(false, std::sync::atomic::Ordering::SeqCst) {
            // A follower named the leader: connect there next.
            *self.0.lock().await = None;
            return;
        }
        let had_hint = self.3.lock().ok().and_then(|mut h| h.take()).is_some();
        if opts.hub_urls().len() < 2 && !had_hint {
            return;
        }
        let mut slot = self.0.lock().await;
        *slot = None;
        if !had_hint {
            self.2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A follower answered with the leader's URL (`agen-leader`): the next connection goes
    /// there (one of `--hub`'s URLs, or the hinted one until it fails).
    pub fn follow_leader(&self, opts: &NestOptions, leader: &str) {
        let urls = opts.hub_urls();
        let trimmed = |u: &str| u.trim_end_matches('/').to_owned();
        match urls.iter().position(|u| trimmed(u) == trimmed(leader)) {
            Some(i) => {
                self.2.store(i, std::sync::atomic::Ordering::SeqCst);
                if let Ok(mut h) = self.3.lock() {
                    *h = None;
                }
            }
            None => {
                if let Ok(mut h) = self.3.lock() {
                    *h = Some(leader.to_owned());
                }
            }
        }
        self.4.store(true, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(%leader, "a follower hub named the leader; connecting there");
    }

    pub async fn get_or_connect(&self, opts: &NestOptions) -> Result<HubClient> {
        let mut slot = self.0.lock().await;
        let renew = self.1.swap(false, std::sync::atomic::Ordering::SeqCst);
        if let Some((c, renew_at)) = slot.as_ref() {
            if !renew && renew_at.is_none_or(|at| now_ms() / 1000 < at) {
                return Ok(c.clone());
            }
        }
        let c = client_at(opts, &self.current(opts), renew).await?;
        let renew_at = std::fs::read_to_string(opts.cert_file())
            .ok()
            .and_then(|pem| agen_shared::tls::nest_cert_renew_at(&pem));
        *slot = Some((c.clone(), renew_at));
        Ok(c)
    }
}

impl ClientSlot {
    /// The Hub signs Nest certificates with the CA `ca_sha256` now (a ping said so): when the
    /// Nest trusts another CA first, its next client renews its certificate (and takes the
    /// Hub's new CAs). True when this is news.
    pub fn note_hub_ca(&self, opts: &NestOptions, ca_sha256: &str) -> bool {
        if ca_sha256.is_empty() || !opts.hub.starts_with("https://") {
            return false;
        }
        let ours = std::fs::read_to_string(opts.ca_file())
            .ok()
            .and_then(|pem| agen_shared::tls::ca_pem_sha256(&pem).ok());
        if ours.as_deref() != Some(ca_sha256)
            && !self.1.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::info!(hub_ca = %ca_sha256, "the hub signs with a new CA; renewing the nest certificate");
            return true;
        }
        false
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::CertificateDer;

    /// A TLS server with the Hub's certificate that accepts handshakes and nothing else.
    async fn serve_tls(hub: &tls::HubTls) -> std::net::SocketAddr {
        let certs: Vec<CertificateDer<'static>> = tls::pem_certs(&hub.server_chain_pem)
            .into_iter()
            .map(CertificateDer::from)
            .collect();
        let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
            hub.server_key_pem.as_bytes(),
        ))
        .unwrap()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = acceptor.accept(tcp).await;
                });
            }
        });
        addr
    }

    /// A Join whose answer never comes (a Hub that takes the handshake and then says nothing
    /// gRPC) leaves the Nest's key stored, so the next try asks for the same key the Hub may
    /// have bound already, and the key is not replaced by that try.
    #[tokio::test]
    async fn the_nest_key_is_stored_before_its_join_so_a_retry_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let hub = tls::load_or_create_hub_tls(dir.path(), &[]).unwrap();
        let addr = serve_tls(&hub).await;
        let url = format!("https://127.0.0.1:{}", addr.port());
        let token = tls::JoinToken::generate(&hub.ca_sha256).to_string();
        let mut opts = NestOptions::new(url, token);
        opts.data_dir = dir.path().join("nest");
        std::fs::create_dir_all(&opts.data_dir).unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), client(&opts)).await;
        assert!(
            !matches!(first, Ok(Ok(_))),
            "a Hub that answers nothing gave a client"
        );
        let key = std::fs::read_to_string(opts.key_file()).expect("nest.key stored before Join");
        let second = tokio::time::timeout(Duration::from_secs(30), client(&opts)).await;
        assert!(!matches!(second, Ok(Ok(_))));
        assert_eq!(std::fs::read_to_string(opts.key_file()).unwrap(), key);
    }

    #[tokio::test]
    async fn fetch_pinned_ca_returns_the_ca_only_when_the_pin_matches() {
        let dir = tempfile::tempdir().unwrap();
        let hub = tls::load_or_create_hub_tls(dir.path(), &[]).unwrap();
        let addr = serve_tls(&hub).await;
        let url = format!("https://127.0.0.1:{}", addr.port());
        let pem = fetch_pinned_ca(&url, &hub.ca_sha256).await.unwrap();
        assert_eq!(tls::ca_pem_sha256(&pem).unwrap(), hub.ca_sha256);

        let other = tempfile::tempdir().unwrap();
        let wrong = tls::load_or_create_hub_tls(other.path(), &[]).unwrap();
        let err = fetch_pinned_ca(&url, &wrong.ca_sha256).await.unwrap_err();
        assert!(err.to_string().contains("did not present the CA"), "{err}");
    }
}
