//! TLS helpers shared by the Hub and the Nest: the Hub's CA and server certificate (generated
//! with rcgen), the Nest join token (`agen1.<sha256 of the CA cert DER>.<secret>`), and
//! [`fetch_pinned_ca`], which trusts a Hub by the CA hash carried in a join token (as k3s
//! tokens do) and returns the CA certificate for later verified connections.
//!
//! Invariants: the CA key never leaves `<dir>/ca.key` (mode 0600); the CA is created once and
//! reused; the server certificate is re-issued at every start (so it names the current listen
//! address) by the same CA key and distinguished name; [`fetch_pinned_ca`] accepts a server only
//! if a certificate of its chain has the pinned hash AND the leaf verifies against that
//! certificate as the only root.
//!
//! Nest certificates (mTLS): a Nest makes its own key and a CSR ([`nest_key_and_csr`]); the Hub
//! signs it with its CA ([`HubTls::sign_nest_csr`]) for client authentication only, naming the
//! nest id as the subject's common name and as the URI SAN `agen-nest://<nest id>`; the Hub
//! reads the nest id back from a verified peer certificate with [`nest_id_of_cert`]. The Hub
//! decides what a Nest certificate says: the CSR contributes only its public key.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// Prefix of every join token (format version 1).
pub const JOIN_TOKEN_PREFIX: &str = "agen1";

/// URI SAN prefix naming the Nest a client certificate was issued to.
pub const NEST_URI_PREFIX: &str = "agen-nest://";

mod rotation;
pub use rotation::{finish_hub_ca_rotation, rotate_hub_ca, CA_CROSS_FILE, CA_PREVIOUS_FILE};

/// How long a new Hub CA is valid (about ten years); [`rotate_hub_ca`] replaces it.
pub const CA_DAYS: i64 = 3653;

/// How long a Nest certificate is valid. A Nest renews it with its own key once two thirds of
/// that have passed ([`nest_cert_renew_at`]).
pub const NEST_CERT_DAYS: i64 = 30;

/// A TLS helper failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error("the certificate signing request is unusable: {0}; the nest makes it with `nest_key_and_csr`")]
    BadCsr(String),
    #[error("the client certificate is unusable: {0}; restart the nest to re-join")]
    BadNestCert(String),
    #[error("cannot generate {what}: {reason}")]
    Generate { what: &'static str, reason: String },
    #[error("{what} is not a PEM certificate; expected `-----BEGIN CERTIFICATE-----`")]
    NotPem { what: String },
    #[error("join token is malformed: {0}; expected `agen1.<64 hex digits>.<secret>` as printed by `agen hub`")]
    BadJoinToken(String),
    #[error("CA rotation: {0}")]
    Rotation(String),
    #[error("hub url `{0}` is malformed; expected https://HOST:PORT")]
    BadUrl(String),
    #[error("cannot connect to the hub at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("the hub at {url} did not present the CA named by the join token (sha256 {expected}); check the --hub address and the token")]
    Mismatch { url: String, expected: String },
}

pub type Result<T, E = TlsError> = std::result::Result<T, E>;

/// The Hub's CA plus a freshly issued server certificate, as PEM.
#[derive(Debug, Clone)]
pub struct HubTls {
    /// `<dir>/ca.pem`.
    pub ca_file: PathBuf,
    pub ca_pem: String,
    /// sha256 hex of the CA certificate DER (the pin carried by join tokens).
    pub ca_sha256: String,
    /// Server certificate chain: leaf, then during a CA rotation the current CA signed by the
    /// previous one (so clients that trust only the previous CA still verify it), then the CA
    /// (and during a rotation the previous CA, which old join tokens pin).
    pub server_chain_pem: String,
    /// The CAs a Nest certificate may be signed by: the current one, and during a rotation the
    /// previous one (`ca-previous.pem`). What a Nest and the local client config trust.
    pub trust_pem: String,
    pub server_key_pem: String,
    /// The CA key, PEM (signs Nest certificates; never leaves the Hub).
    ca_key_pem: String,
}

impl HubTls {
    /// Signs a Nest's CSR: a client-auth certificate for `nest_id`, valid for
    /// [`NEST_CERT_DAYS`], whose subject and SAN the Hub sets (only the CSR's key is used).
    pub fn sign_nest_csr(&self, csr_pem: &str, nest_id: &str) -> Result<String> {
        if nest_id.is_empty()
            || !nest_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(TlsError::BadCsr(format!(
                "nest id `{nest_id}` is empty or has characters other than letters, digits, -, _ and ."
            )));
        }
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| TlsError::BadCsr(e.to_string()))?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, nest_id);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "agen nests");
        let uri = format!("{NEST_URI_PREFIX}{nest_id}")
            .try_into()
            .map_err(|_| TlsError::BadCsr(format!("nest id `{nest_id}` cannot go in a URI")))?;
        params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(NEST_CERT_DAYS);
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
        csr.params = params;
        let ca_key =
            rcgen::KeyPair::from_pem(&self.ca_key_pem).map_err(gen_err("the CA signer key"))?;
        let issuer = ca_params()
            .self_signed(&ca_key)
            .map_err(gen_err("the CA signer"))?;
        let cert = csr
            .signed_by(&issuer, &ca_key)
            .map_err(gen_err("a nest certificate"))?;
        Ok(cert.pem())
    }
}

/// A fresh key (PEM) and a CSR (PEM) naming `nest_id`, for `NestService.Join`.
pub fn nest_key_and_csr(nest_id: &str) -> Result<(String, String)> {
    let key = rcgen::KeyPair::generate().map_err(gen_err("the nest key"))?;
    let csr_pem = csr_for(&key, nest_id)?;
    Ok((key.serialize_pem(), csr_pem))
}

/// A CSR (PEM) naming `nest_id` for the Nest's existing key (PEM): a re-join or renewal keeps
/// the key the Hub bound the id to.
pub fn nest_csr_for_key(key_pem: &str, nest_id: &str) -> Result<String> {
    let key = rcgen::KeyPair::from_pem(key_pem).map_err(gen_err("the nest key from nest.key"))?;
    csr_for(&key, nest_id)
}

/// When (unix seconds) a Nest certificate (PEM) is due for renewal: two thirds into its
/// validity. `None` when it cannot be read.
pub fn nest_cert_renew_at(cert_pem: &str) -> Option<i64> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = pem_certs(cert_pem).into_iter().next()?;
    let (_, cert) = X509Certificate::from_der(&der).ok()?;
    let from = cert.validity().not_before.timestamp();
    let to = cert.validity().not_after.timestamp();
    Some(from + (to - from) * 2 / 3)
}

fn csr_for(key: &rcgen::KeyPair, nest_id: &str) -> Result<String> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, nest_id);
    let csr = params
        .serialize_request(key)
        .map_err(gen_err("the nest certificate request"))?;
    csr.pem().map_err(gen_err("the nest certificate request"))
}

/// The nest id a Nest certificate (DER) was issued to: its `agen-nest://` URI SAN.
pub fn nest_id_of_cert(der: &[u8]) -> Result<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| TlsError::BadNestCert(format!("not an X.509 certificate: {e}")))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::BadNestCert(format!("bad subject alternative names: {e}")))?;
    san.into_iter()
        .flat_map(|s| s.value.general_names.iter())
        .find_map(|n| match n {
            GeneralName::URI(uri) => uri.strip_prefix(NEST_URI_PREFIX).map(str::to_string),
            _ => None,
        })
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            TlsError::BadNestCert(format!("it names no nest (no `{NEST_URI_PREFIX}<id>` SAN)"))
        })
}

/// sha256 hex of the public key (SubjectPublicKeyInfo DER) a certificate (DER) carries: what a
/// Nest's id is bound to at the Hub.
pub fn cert_key_sha256(der: &[u8]) -> Result<String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| TlsError::BadNestCert(format!("not an X.509 certificate: {e}")))?;
    Ok(hex::encode(Sha256::digest(cert.public_key().raw)))
}

/// sha256 hex of the public key (SubjectPublicKeyInfo DER) of a PEM certificate signing
/// request; equal to [`cert_key_sha256`] of the certificate signed from it.
pub fn csr_key_sha256(csr_pem: &str) -> Result<String> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::prelude::FromDer;
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| TlsError::BadCsr(format!("not PEM: {e}")))?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| TlsError::BadCsr(format!("not a PKCS#10 request: {e}")))?;
    Ok(hex::encode(Sha256::digest(
        csr.certification_request_info.subject_pki.raw,
    )))
}

/// Whether `cert_pem` is a currently valid Nest certificate for `nest_id` signed by the CA in
/// `ca_pem` (a Nest re-joins when not, e.g. after the Hub's CA changed).
pub fn nest_cert_is_current(cert_pem: &str, ca_pem: &str, nest_id: &str) -> bool {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (Some(cert_der), Some(ca_der)) = (
        pem_certs(cert_pem).into_iter().next(),
        pem_certs(ca_pem).into_iter().next(),
    ) else {
        return false;
    };
    let (Ok((_, cert)), Ok((_, ca))) = (
        X509Certificate::from_der(&cert_der),
        X509Certificate::from_der(&ca_der),
    ) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
        && cert.validity().is_valid()
        && nest_id_of_cert(&cert_der).ok().as_deref() == Some(nest_id)
}

fn io_err(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> TlsError {
    let path = path.to_path_buf();
    move |source| TlsError::Io {
        path,
        action,
        source,
    }
}

fn gen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> TlsError {
    move |e| TlsError::Generate {
        what,
        reason: e.to_string(),
    }
}

/// Selects ring as the process-wide rustls crypto provider unless one is installed already.
/// Both ring and aws-lc-rs are in the dependency tree (tonic, reqwest, rmcp), and rustls
/// refuses to guess; every entry point that builds a TLS config calls this first.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Writes `data` to `path` with mode 0600 (atomically: temp file + rename); missing parent
/// folders are created 0700.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        crate::private::create_dir_all(parent).map_err(io_err(parent, "cannot create folder"))?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp, "cannot create file"))?;
    f.write_all(data)
        .map_err(io_err(&tmp, "cannot write file"))?;
    f.sync_all().map_err(io_err(&tmp, "cannot sync file"))?;
    std::fs::rename(&tmp, path).map_err(io_err(path, "cannot move file into place"))
}

/// The CA's distinguished name and usages (same for every CA of a Hub: the validity is set
/// where a CA is made).
fn ca_params() -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "agen hub CA");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "agen");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Loads the CA from `dir` (`ca.pem`, `ca.key`), creating it on first use, and issues a server
/// certificate naming `localhost`, `127.0.0.1` and every name in `extra_names` (host names or
/// IP addresses, e.g. the listen address).
pub fn load_or_create_hub_tls(dir: &Path, extra_names: &[String]) -> Result<HubTls> {
    let ca_file = dir.join("ca.pem");
    let key_file = dir.join("ca.key");
    let ca_key = if ca_file.exists() && key_file.exists() {
        let key_pem =
            std::fs::read_to_string(&key_file).map_err(io_err(&key_file, "cannot read CA key"))?;
        rcgen::KeyPair::from_pem(&key_pem).map_err(gen_err("the CA key from ca.key"))?
    } else {
        let (key, ca) = rotation::new_ca()?;
        write_private(&key_file, key.serialize_pem().as_bytes())?;
        // The CA certificate is public, but it lives in the Hub's private data dir like
        // everything else there (0600); clients get it from the client config's `ca_file`
        // (same user) or by the join token's pin (`fetch_pinned_ca`).
        write_private(&ca_file, ca.pem().as_bytes())?;
        key
    };
    let ca_pem = std::fs::read_to_string(&ca_file)
        .map_err(io_err(&ca_file, "cannot read CA certificate"))?;
    let ca_sha256 = ca_pem_sha256(&ca_pem)?;
    // Same key + same distinguished name: certificates it signs verify against ca.pem.
    let issuer = ca_params()
        .self_signed(&ca_key)
        .map_err(gen_err("the CA signer"))?;

    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for n in extra_names {
        if !n.is_empty() && !names.contains(n) {
            names.push(n.clone());
        }
    }
    let mut params = rcgen::CertificateParams::default();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    // Issued again at every start; never valid past its CA (a running Hub does not re-issue
    // it, so it is not cut shorter than that).
    params.not_after = rotation::not_after(&ca_pem).unwrap_or(now + time::Duration::days(CA_DAYS));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "agen hub");
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(rcgen::SanType::IpAddress(ip)),
            Err(_) => n
                .clone()
                .try_into()
                .map(rcgen::SanType::DnsName)
                .map_err(gen_err("a server certificate name")),
        })
        .collect::<Result<Vec<_>>>()?;
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = rcgen::KeyPair::generate().map_err(gen_err("the server key"))?;
    let server = params
        .signed_by(&server_key, &issuer, &ca_key)
        .map_err(gen_err("the server certificate"))?;
    let previous = rotation::read_optional(&dir.join(CA_PREVIOUS_FILE))?;
    let cross = rotation::read_optional(&dir.join(CA_CROSS_FILE))?;
    Ok(HubTls {
        ca_file,
        // During a rotation the previous CA too: a join token that pins it still finds it.
        server_chain_pem: format!("{}{cross}{ca_pem}{previous}", server.pem()),
        trust_pem: format!("{ca_pem}{previous}"),
        ca_pem,
        ca_sha256,
        server_key_pem: server_key.serialize_pem(),
        ca_key_pem: ca_key.serialize_pem(),
    })
}

/// The DER certificates of a PEM text.
pub fn pem_certs(pem: &str) -> Vec<Vec<u8>> {
    let mut reader = std::io::BufReader::new(pem.as_bytes());
    rustls_pemfile::certs(&mut reader)
        .filter_map(|c| c.ok())
        .map(|c| c.to_vec())
        .collect()
}

/// sha256 hex of a DER certificate.
pub fn der_sha256(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// sha256 hex of the (first) certificate of a PEM text: the pin a join token carries.
pub fn ca_pem_sha256(pem: &str) -> Result<String> {
    let certs = pem_certs(pem);
    let first = certs.first().ok_or_else(|| TlsError::NotPem {
        what: "the CA certificate".into(),
    })?;
    Ok(der_sha256(first))
}

/// PEM text of one DER certificate.
pub fn der_to_pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// A random secret of 32 bytes as hex (admin tokens, join secrets).
pub fn random_secret() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// A Nest join token: `agen1.<sha256 hex of the Hub CA cert DER>.<secret>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub ca_sha256: String,
    pub secret: String,
}

impl JoinToken {
    /// A new token for the CA with hash `ca_sha256` and a random secret.
    pub fn generate(ca_sha256: &str) -> JoinToken {
        JoinToken {
            ca_sha256: ca_sha256.to_string(),
            secret: random_secret(),
        }
    }

    /// Parses `agen1.<64 hex>.<secret>` (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<JoinToken> {
        let text = text.trim();
        let mut parts = text.splitn(3, '.');
        let (prefix, hash, secret) = match (parts.next(), parts.next(), parts.next()) {
            (Some(p), Some(h), Some(s)) => (p, h, s),
            _ => {
                return Err(TlsError::BadJoinToken(
                    "expected three parts separated by `.`".into(),
                ))
            }
        };
        if prefix != JOIN_TOKEN_PREFIX {
            return Err(TlsError::BadJoinToken(format!("unknown prefix `{prefix}`")));
        }
        if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(TlsError::BadJoinToken(
                "the CA hash is not 64 hex digits".into(),
            ));
        }
        if secret.is_empty()
            || !secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(TlsError::BadJoinToken(
                "the secret is empty or has characters other than letters, digits, - and _".into(),
            ));
        }
        Ok(JoinToken {
            ca_sha256: hash.to_ascii_lowercase(),
            secret: secret.to_string(),
        })
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{JOIN_TOKEN_PREFIX}.{}.{}", self.ca_sha256, self.secret)
    }
}

/// Splits `https://host:port[/...]` into host and port (default 443).
pub fn host_port(url: &str) -> Result<(String, u16)> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| TlsError::BadUrl(url.to_string()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(TlsError::BadUrl(url.to_string()));
    }
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| TlsError::BadUrl(url.to_string()))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| TlsError::BadUrl(url.to_string()))?,
            None => 443,
        };
        return Ok((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Ok((
            h.to_string(),
            p.parse().map_err(|_| TlsError::BadUrl(url.to_string()))?,
        )),
        None => Ok((authority.to_string(), 443)),
    }
}

/// The rustls crypto provider every Agen TLS endpoint uses (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts a chain only if one of its certificates hashes to the pin and the leaf verifies
/// against that certificate as the only root; remembers the pinned certificate.
#[derive(Debug)]
#[doc(hidden)]
pub struct PinVerifier {
    expected: String,
    captured: Mutex<Option<Vec<u8>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let pinned = std::iter::once(end_entity)
            .chain(intermediates.iter())
            .find(|c| der_sha256(c.as_ref()) == self.expected)
            .ok_or_else(|| {
                rustls::Error::General(
                    "no certificate of the chain matches the join token's CA hash".into(),
                )
            })?;
        let pinned_der = pinned.as_ref().to_vec();
        if pinned_der != end_entity.as_ref() {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from(pinned_der.clone()))
                .map_err(|e| rustls::Error::General(format!("pinned CA is unusable: {e}")))?;
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                self.provider.clone(),
            )
            .build()
            .map_err(|e| rustls::Error::General(format!("pinned CA is unusable: {e}")))?;
            inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        }
        if let Ok(mut slot) = self.captured.lock() {
            *slot = Some(pinned_der);
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What a pinned handshake captured: the Hub's CA certificate, once the handshake accepted it.
pub struct PinnedCa(Arc<PinVerifier>);

impl PinnedCa {
    /// The pinned CA as PEM, when a handshake presented it.
    pub fn take_pem(&self) -> Option<String> {
        self.0
            .captured
            .lock()
            .ok()
            .and_then(|mut c| c.take())
            .map(|der| der_to_pem(&der))
    }
}

/// A client TLS configuration (ALPN h2) that accepts a Hub only if it presents a certificate
/// whose sha256 is `expected_sha256` (and a leaf signed by it); after the handshake
/// [`PinnedCa::take_pem`] gives that certificate, which the Nest stores as its trust root. The
/// connection itself is the Nest's (`agen_nest::hub_client::fetch_pinned_ca`): this crate does
/// no network IO.
pub fn pinned_ca_client(expected_sha256: &str) -> Result<(rustls::ClientConfig, PinnedCa)> {
    let provider = provider();
    let verifier = Arc::new(PinVerifier {
        expected: expected_sha256.to_ascii_lowercase(),
        captured: Mutex::new(None),
        provider: provider.clone(),
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Connect {
            url: String::new(),
            reason: e.to_string(),
        })?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok((config, PinnedCa(verifier)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_token_round_trips_and_rejects_malformed_text() {
        let hash = "ab".repeat(32);
        let token = JoinToken {
            ca_sha256: hash.clone(),
            secret: "s3cret".into(),
        };
        assert_eq!(JoinToken::parse(&token.to_string()).unwrap(), token);
        fn check(text: &str, expected: &str) {
            let err = JoinToken::parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        check("nope", "three parts");
        check(&format!("agen2.{hash}.x"), "unknown prefix");
        check("agen1.abc.x", "64 hex digits");
        check(&format!("agen1.{hash}."), "secret is empty");
    }

    #[test]
    fn ca_is_created_once_and_server_cert_is_signed_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let a =
            load_or_create_hub_tls(dir.path(), &["10.0.0.1".into(), "hub.example".into()]).unwrap();
        let b = load_or_create_hub_tls(dir.path(), &[]).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem);
        assert_eq!(
            a.ca_sha256,
            ca_pem_sha256(&std::fs::read_to_string(&a.ca_file).unwrap()).unwrap()
        );
        assert_eq!(pem_certs(&a.server_chain_pem).len(), 2);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_signed_nest_csr_names_the_nest_and_verifies_against_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let tls = load_or_create_hub_tls(dir.path(), &[]).unwrap();
        let (_key, csr) = nest_key_and_csr("nest-a").unwrap();
        let cert = tls.sign_nest_csr(&csr, "nest-a").unwrap();
        let der = pem_certs(&cert).remove(0);
        assert_eq!(nest_id_of_cert(&der).unwrap(), "nest-a");
        assert!(nest_cert_is_current(&cert, &tls.ca_pem, "nest-a"));
        assert!(!nest_cert_is_current(&cert, &tls.ca_pem, "nest-b"));
        let other = tempfile::tempdir().unwrap();
        let other = load_or_create_hub_tls(other.path(), &[]).unwrap();
        assert!(!nest_cert_is_current(&cert, &other.ca_pem, "nest-a"));
        // The certificate carries the CSR's key, and nothing else does.
        assert_eq!(
            cert_key_sha256(&der).unwrap(),
            csr_key_sha256(&csr).unwrap()
        );
        let (other_key, other_csr) = nest_key_and_csr("nest-a").unwrap();
        // A CSR for an existing key carries that key.
        assert_eq!(
            csr_key_sha256(&nest_csr_for_key(&other_key, "nest-a").unwrap()).unwrap(),
            csr_key_sha256(&other_csr).unwrap()
        );
        let renew_at = nest_cert_renew_at(&cert).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        assert!(renew_at > now + 19 * 86_400 && renew_at < now + 21 * 86_400);
        assert_ne!(
            cert_key_sha256(&der).unwrap(),
            csr_key_sha256(&other_csr).unwrap()
        );
        // The server certificate names no nest.
        let server = pem_certs(&tls.server_chain_pem).remove(0);
        assert!(nest_id_of_cert(&server).is_err());
        assert!(tls.sign_nest_csr("garbage", "nest-a").is_err());
        assert!(tls.sign_nest_csr(&csr, "a/b").is_err());
    }

    #[test]
    fn host_port_parses_hub_urls() {
        assert_eq!(
            host_port("https://127.0.0.1:7070").unwrap(),
            ("127.0.0.1".into(), 7070)
        );
        assert_eq!(
            host_port("https://hub.example/x").unwrap(),
            ("hub.example".into(), 443)
        );
        assert_eq!(host_port("https://[::1]:9").unwrap(), ("::1".into(), 9));
        assert!(host_port("http://x:1").is_err());
    }
}
