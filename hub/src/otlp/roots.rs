//! The CA certificates an `https://` OTLP endpoint is verified with: the PEM file named by
//! `OTEL_EXPORTER_OTLP_{TRACES_,}CERTIFICATE` when set (then only those, as the OpenTelemetry
//! SDKs do), else the system roots (`SSL_CERT_FILE` / `SSL_CERT_DIR`, then the distribution's
//! bundle). Read once when the Hub starts, so a missing or empty file stops it with a message
//! naming the file instead of failing every export later.

use std::path::Path;

use crate::error::{HubError, Result};

/// The DER certificates to trust for the collector, from `certificate` or the system.
pub fn load(certificate: Option<&Path>) -> Result<Vec<Vec<u8>>> {
    match certificate {
        Some(path) => {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                HubError::Config(format!(
                    "OTEL_EXPORTER_OTLP_CERTIFICATE {}: cannot read it: {e}; point it at a readable PEM file of the collector's CA certificates",
                    path.display()
                ))
            })?;
            let certs = agen_shared::tls::pem_certs(&pem);
            if certs.is_empty() {
                return Err(HubError::Config(format!(
                    "OTEL_EXPORTER_OTLP_CERTIFICATE {}: no PEM certificate in it; expected -----BEGIN CERTIFICATE----- blocks of the collector's CA",
                    path.display()
                )));
            }
            Ok(certs)
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(HubError::Config(format!(
                    "the OTLP endpoint is https:// but no system root certificate was found{why}; install the ca-certificates package or set OTEL_EXPORTER_OTLP_CERTIFICATE to the collector's CA file"
                )));
            }
            Ok(found.certs.into_iter().map(|c| c.to_vec()).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_ca_file_is_read_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        agen_shared::tls::load_or_create_hub_tls(dir.path(), &[]).expect("test CA");
        let ca = dir.path().join("ca.pem");
        assert_eq!(load(Some(&ca)).expect("the CA file").len(), 1);
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = load(Some(&empty)).expect_err("no certificate").to_string();
        assert!(
            e.contains("empty.pem") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = load(Some(&dir.path().join("missing.pem")))
            .expect_err("no file")
            .to_string();
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );
    }
}
