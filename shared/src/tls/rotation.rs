//! Rolling the Hub's CA without losing trust. [`rotate_hub_ca`] makes a new
//! CA (ten years, [`super::CA_DAYS`]) the signer: the previous CA's certificate stays trusted
//! (`ca-previous.pem`: Nest certificates it signed still verify), and the new CA signed by the
//! previous key (`ca-cross.pem`) goes in the server chain, so a client that trusts only the
//! previous CA still verifies the Hub. [`finish_hub_ca_rotation`] drops both: from then on only
//! the new CA is trusted. The CA key files never leave the Hub's `tls/` folder; the previous
//! key is not kept.

use std::path::Path;

use super::{ca_params, gen_err, io_err, load_or_create_hub_tls, write_private, HubTls, Result};

/// The previous CA's certificate, trusted until the rotation is finished.
pub const CA_PREVIOUS_FILE: &str = "ca-previous.pem";
/// The current CA's certificate signed by the previous CA's key, until the rotation is finished.
pub const CA_CROSS_FILE: &str = "ca-cross.pem";

fn validity(params: &mut rcgen::CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(super::CA_DAYS);
}

/// A new CA key and its self-signed certificate, valid [`super::CA_DAYS`] from now.
pub(super) fn new_ca() -> Result<(rcgen::KeyPair, rcgen::Certificate)> {
    let key = rcgen::KeyPair::generate().map_err(gen_err("the CA key"))?;
    let mut params = ca_params();
    validity(&mut params);
    let ca = params
        .self_signed(&key)
        .map_err(gen_err("the CA certificate"))?;
    Ok((key, ca))
}

/// When the (first) certificate of `pem` stops being valid.
pub(super) fn not_after(pem: &str) -> Option<time::OffsetDateTime> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let der = super::pem_certs(pem).into_iter().next()?;
    let (_, cert) = X509Certificate::from_der(&der).ok()?;
    time::OffsetDateTime::from_unix_timestamp(cert.validity().not_after.timestamp()).ok()
}

/// The text of `path`, empty when there is no such file.
pub(super) fn read_optional(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io_err(path, "cannot read")(e)),
    }
}

/// Starts a rotation in `dir` (the Hub's `tls/` folder): a new CA signs from now on, the
/// previous one stays trusted. Refused while a rotation is under way. Returns the Hub's TLS
/// with a server certificate of the new CA (names as [`load_or_create_hub_tls`]).
pub fn rotate_hub_ca(dir: &Path, extra_names: &[String]) -> Result<HubTls> {
    let previous_file = dir.join(CA_PREVIOUS_FILE);
    if previous_file.exists() {
        return Err(super::TlsError::Rotation(format!(
            "a CA rotation is under way ({} exists); finish it first",
            previous_file.display()
        )));
    }
    let (ca_file, key_file) = (dir.join("ca.pem"), dir.join("ca.key"));
    let old_pem = std::fs::read_to_string(&ca_file)
        .map_err(io_err(&ca_file, "cannot read CA certificate"))?;
    let old_key_pem =
        std::fs::read_to_string(&key_file).map_err(io_err(&key_file, "cannot read CA key"))?;
    let old_key =
        rcgen::KeyPair::from_pem(&old_key_pem).map_err(gen_err("the CA key from ca.key"))?;
    let old_issuer = ca_params()
        .self_signed(&old_key)
        .map_err(gen_err("the CA signer"))?;
    let (key, ca) = new_ca()?;
    let mut cross = ca_params();
    validity(&mut cross);
    let cross = cross
        .signed_by(&key, &old_issuer, &old_key)
        .map_err(gen_err("the cross-signed CA certificate"))?;
    // The previous CA first: until the new key is in place, the Hub still loads as before
    // plus trusting its own CA twice.
    write_private(&previous_file, old_pem.as_bytes())?;
    write_private(&dir.join(CA_CROSS_FILE), cross.pem().as_bytes())?;
    write_private(&key_file, key.serialize_pem().as_bytes())?;
    write_private(&ca_file, ca.pem().as_bytes())?;
    load_or_create_hub_tls(dir, extra_names)
}

/// Ends a rotation in `dir`: the previous CA is no longer trusted and leaves the server chain.
/// Refused when no rotation is under way.
pub fn finish_hub_ca_rotation(dir: &Path, extra_names: &[String]) -> Result<HubTls> {
    let previous_file = dir.join(CA_PREVIOUS_FILE);
    if !previous_file.exists() {
        return Err(super::TlsError::Rotation(
            "no CA rotation is under way; start one first".into(),
        ));
    }
    for f in [CA_CROSS_FILE, CA_PREVIOUS_FILE] {
        let path = dir.join(f);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path, "cannot remove")(e)),
        }
    }
    load_or_create_hub_tls(dir, extra_names)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    use super::super::*;
    use super::not_after;

    /// Whether `chain_pem` (leaf first) verifies for `localhost` against the CAs of `roots_pem`.
    fn server_verifies(chain_pem: &str, roots_pem: &str) -> bool {
        install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for der in pem_certs(roots_pem) {
            roots.add(CertificateDer::from(der)).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let chain: Vec<CertificateDer<'static>> = pem_certs(chain_pem)
            .into_iter()
            .map(CertificateDer::from)
            .collect();
        verifier
            .verify_server_cert(
                &chain[0],
                &chain[1..],
                &ServerName::try_from("localhost").unwrap(),
                &[],
                UnixTime::now(),
            )
            .is_ok()
    }

    /// Whether `cert_pem` verifies as a client certificate against the CAs of `roots_pem`.
    fn client_verifies(cert_pem: &str, roots_pem: &str) -> bool {
        install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for der in pem_certs(roots_pem) {
            roots.add(CertificateDer::from(der)).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let der = CertificateDer::from(pem_certs(cert_pem).remove(0));
        verifier
            .verify_client_cert(&der, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn a_new_ca_lives_ten_years_and_the_server_certificate_no_longer() {
        let dir = tempfile::tempdir().unwrap();
        let tls = load_or_create_hub_tls(dir.path(), &[]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        let ca_end = not_after(&tls.ca_pem).unwrap();
        assert!(
            ca_end > now + time::Duration::days(3650) && ca_end < now + time::Duration::days(3660)
        );
        let server_end = not_after(&tls.server_chain_pem).unwrap();
        assert!(server_end <= ca_end, "{server_end}");
        assert_eq!(tls.trust_pem, tls.ca_pem);
    }

    #[test]
    fn a_rotation_keeps_old_trust_until_finished_then_refuses_the_old_ca() {
        let dir = tempfile::tempdir().unwrap();
        let old = load_or_create_hub_tls(dir.path(), &[]).unwrap();
        let (_k, csr) = nest_key_and_csr("nest-a").unwrap();
        let old_nest = old.sign_nest_csr(&csr, "nest-a").unwrap();

        let mid = rotate_hub_ca(dir.path(), &[]).unwrap();
        assert_ne!(mid.ca_sha256, old.ca_sha256);
        assert!(
            rotate_hub_ca(dir.path(), &[]).is_err(),
            "one rotation at a time"
        );
        // A client that trusts only the previous CA, or only the new one, or both, verifies
        // the Hub; the old and the new Nest certificates are both accepted.
        assert!(server_verifies(&mid.server_chain_pem, &old.ca_pem));
        assert!(server_verifies(&mid.server_chain_pem, &mid.ca_pem));
        assert!(server_verifies(&mid.server_chain_pem, &mid.trust_pem));
        let new_nest = mid.sign_nest_csr(&csr, "nest-a").unwrap();
        assert!(nest_cert_is_current(&new_nest, &mid.ca_pem, "nest-a"));
        assert!(client_verifies(&old_nest, &mid.trust_pem));
        assert!(client_verifies(&new_nest, &mid.trust_pem));
        // The pin of a new join token is in the chain (a Nest joining during the overlap).
        assert!(pem_certs(&mid.server_chain_pem)
            .iter()
            .any(|c| der_sha256(c) == mid.ca_sha256));
        // A restart in the middle keeps the overlap.
        let again = load_or_create_hub_tls(dir.path(), &[]).unwrap();
        assert_eq!(again.trust_pem, mid.trust_pem);

        let done = finish_hub_ca_rotation(dir.path(), &[]).unwrap();
        assert_eq!(done.ca_sha256, mid.ca_sha256);
        assert_eq!(done.trust_pem, done.ca_pem);
        assert!(
            !client_verifies(&old_nest, &done.trust_pem),
            "the old CA is refused"
        );
        assert!(client_verifies(&new_nest, &done.trust_pem));
        assert!(!server_verifies(&done.server_chain_pem, &old.ca_pem));
        assert!(server_verifies(&done.server_chain_pem, &mid.trust_pem));
        assert!(finish_hub_ca_rotation(dir.path(), &[]).is_err());
    }
}
