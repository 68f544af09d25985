//! The DSN's TLS parameters, read the way libpq reads them: `sslmode` (default `prefer`) and
//! `sslrootcert` decide whether and how the connection is verified.
//!
//! Invariants: client certificates and CRLs are refused with an error that names the variable,
//! never its value; the URL handed on keeps only an `sslmode` tokio-postgres understands.

use crate::sql::error::{Result, SqlError};

use super::tls::{Roots, Verify};

/// The TLS the DSN asks for, libpq style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ssl {
    Disable,
    Tls(Verify, Roots),
}

/// Takes the libpq TLS parameters out of the URL (tokio-postgres knows only `sslmode=disable|
/// prefer|require`): `sslmode` (default `prefer`) and `sslrootcert` decide the [`Ssl`]; the URL
/// keeps an `sslmode` tokio-postgres understands. Client certificates and CRLs are refused.
pub(super) fn split_ssl_params(dsn: &str, dsn_env: &str) -> Result<(String, Ssl)> {
    let (base, query) = dsn.split_once('?').unwrap_or((dsn, ""));
    let mut params = Vec::new();
    let mut mode = "prefer".to_owned();
    let mut root: Option<String> = None;
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "sslmode" => mode = percent_decode(value),
            "sslrootcert" => root = Some(percent_decode(value)),
            "sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir" => {
                return Err(SqlError::Config(format!(
                    "${dsn_env} uses {key}, which agen mcp sql does not support (no client certificates \
                     or CRLs); connect with a password or trust instead"
                )))
            }
            "sslcompression" | "sslsni" | "ssl_min_protocol_version" | "ssl_max_protocol_version" => {}
            _ => params.push(param.to_owned()),
        }
    }
    let roots = match root.as_deref() {
        None | Some("system") => Roots::System,
        Some(path) => Roots::File(path.into()),
    };
    let (wire, ssl) = match mode.as_str() {
        "disable" => ("disable", Ssl::Disable),
        "allow" | "prefer" => ("prefer", Ssl::Tls(Verify::None, roots)),
        // libpq: `require` with a root certificate verifies the chain, as `verify-ca` does.
        "require" if root.is_some() => ("require", Ssl::Tls(Verify::Chain, roots)),
        "require" => ("require", Ssl::Tls(Verify::None, roots)),
        "verify-ca" => ("require", Ssl::Tls(Verify::Chain, roots)),
        "verify-full" => ("require", Ssl::Tls(Verify::Full, roots)),
        other => {
            return Err(SqlError::Config(format!(
                "${dsn_env} has sslmode={other}; use disable, allow, prefer, require, verify-ca or verify-full"
            )))
        }
    };
    params.push(format!("sslmode={wire}"));
    Ok((format!("{base}?{}", params.join("&")), ssl))
}

/// Decodes `%XX` escapes in a URL query value (`+` is left as it is, as libpq does).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::time::Duration;

    use crate::sql::postgres::Postgres;

    #[test]
    fn sslmode_values_libpq_knows_are_accepted_or_explained() {
        let check = |dsn: &str, expected: std::result::Result<(&str, Ssl), ()>| {
            let got = split_ssl_params(dsn, "DSN").map_err(|_| ());
            let expected = expected.map(|(url, ssl)| (url.to_owned(), ssl));
            assert_eq!(got, expected, "{dsn}");
        };
        let tls = |verify| Ssl::Tls(verify, Roots::System);
        let root = |verify, path: &str| Ssl::Tls(verify, Roots::File(path.into()));
        check(
            "postgres://u@h/db",
            Ok(("postgres://u@h/db?sslmode=prefer", tls(Verify::None))),
        );
        check(
            "postgres://u@h/db?sslmode=disable",
            Ok(("postgres://u@h/db?sslmode=disable", Ssl::Disable)),
        );
        check(
            "postgres://u@h/db?sslmode=allow&connect_timeout=3",
            Ok((
                "postgres://u@h/db?connect_timeout=3&sslmode=prefer",
                tls(Verify::None),
            )),
        );
        check(
            "postgres://u@h/db?sslmode=require",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::None))),
        );
        check(
            "postgres://u@h/db?sslmode=require&sslrootcert=%2Fetc%2Fca.pem",
            Ok((
                "postgres://u@h/db?sslmode=require",
                root(Verify::Chain, "/etc/ca.pem"),
            )),
        );
        check(
            "postgres://u@h/db?sslmode=verify-ca",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::Chain))),
        );
        check(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=system",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::Full))),
        );
        check("postgres://u@h/db?sslmode=bogus", Err(()));
        check("postgres://u@h/db?sslcert=/c.pem&sslkey=/k.pem", Err(()));
        assert!(Postgres::new(
            "postgres://u@h/db?sslmode=verify-full",
            "DSN",
            Duration::from_secs(1)
        )
        .is_ok());
        assert!(Postgres::new(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
            "DSN",
            Duration::from_secs(1)
        )
        .is_err());
    }
}
