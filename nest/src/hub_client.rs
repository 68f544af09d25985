//! The bottom of the Nest: how it reaches its Hub. Today: the first contact of a join, which
//! fetches the Hub's CA pinned by the join token's hash (the TLS verification itself is
//! `agen_shared::tls::pinned_ca_client`, pure; the connection is here).

use std::sync::Arc;
use std::time::Duration;

use agen_shared::tls::{self, TlsError};
use rustls::pki_types::ServerName;

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
