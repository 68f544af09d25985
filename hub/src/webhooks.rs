//! Webhook deliveries on the wire: the body ([`Payload`]), its signature, and the Hub's
//! outbound rule, checked on the resolved address at every attempt.
//!
//! Signature: `Agen-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`
//! (receivers recompute it over the raw body and refuse an old `t`); `Agen-Event` names the
//! event (`task.ended`, `task.waiting`) and `Agen-Delivery` the delivery id (the same at every
//! retry: receivers deduplicate by it).
//!
//! Outbound rule: `https` only, except to a loopback address; an address that is loopback,
//! private, link-local, shared (100.64/10), unique-local, unspecified, multicast or broadcast
//! is refused unless `agen hub --webhook-allow HOST[:PORT]` names the URL's host (or that
//! address). The connection goes to the address that was checked (no second lookup), and
//! redirects are not followed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// The longest webhook URL (bytes).
pub const MAX_URL_BYTES: usize = 2048;
/// Webhooks per task (the submit's and the deployment's together).
pub const MAX_WEBHOOKS_PER_TASK: usize = 4;
/// Deliveries in flight at once, for the whole Hub.
pub const MAX_CONCURRENT_DELIVERIES: usize = 16;
/// The largest body; a longer result is cut to fit (`result_truncated`).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// How long one attempt may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The body of a delivery.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Payload {
    /// `task.ended` or `task.waiting`.
    #[serde(rename = "type")]
    pub kind: String,
    pub delivery_id: String,
    pub task: PayloadTask,
}

/// The task as a delivery tells it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PayloadTask {
    pub task_id: String,
    pub namespace: String,
    pub deployment: String,
    pub state: String,
    pub response_type: String,
    pub result: String,
    pub result_truncated: bool,
    pub error: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub conversation_key: String,
    pub created_at_ms: i64,
    pub finished_at_ms: i64,
}

impl Payload {
    /// The JSON body, the result cut so that it fits [`MAX_PAYLOAD_BYTES`].
    pub fn to_body(mut self) -> String {
        self.task.error = crate::limits::cut(&self.task.error, 4096);
        for _ in 0..8 {
            let body = serde_json::to_string(&self).unwrap_or_default();
            if body.len() <= MAX_PAYLOAD_BYTES {
                return body;
            }
            // JSON escaping can make text longer than its bytes: cut with room to spare.
            let over = body.len() - MAX_PAYLOAD_BYTES;
            let keep = self.task.result.len().saturating_sub(over + 64);
            self.task.result = crate::limits::cut(&self.task.result, keep / 2 * 2);
            self.task.result_truncated = true;
        }
        self.task.result.clear();
        serde_json::to_string(&self).unwrap_or_default()
    }
}

/// The `Agen-Signature` value of `body` at `t` (unix seconds).
pub fn signature(secret: &[u8], t: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// One `--webhook-allow HOST[:PORT]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    host: String,
    port: Option<u16>,
}

impl std::str::FromStr for Allow {
    type Err = String;
    fn from_str(s: &str) -> Result<Allow, String> {
        let bad = || {
            format!("--webhook-allow {s:?}: expected HOST or HOST:PORT (e.g. 127.0.0.1:8080, [::1]:9000, hooks.internal)")
        };
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (h, tail) = rest.split_once(']').ok_or_else(bad)?;
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
                None if tail.is_empty() => None,
                None => return Err(bad()),
            };
            (h.to_string(), port)
        } else if s.matches(':').count() == 1 {
            let (h, p) = s.split_once(':').ok_or_else(bad)?;
            (h.to_string(), Some(p.parse::<u16>().map_err(|_| bad())?))
        } else {
            (s.to_string(), None)
        };
        if host.is_empty() || host.len() > 253 {
            return Err(bad());
        }
        Ok(Allow {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

/// Whether an address is one the rule refuses unless allowed.
pub fn is_internal(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_broadcast()
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || o[0] == 0
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
        }
    }
}

fn allowed(rules: &[Allow], host: &str, addr: SocketAddr) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rules.iter().any(|r| {
        let host_match = r.host == host
            || r.host.parse::<IpAddr>().ok() == Some(addr.ip())
            || r.host.parse::<IpAddr>().ok().map(canonical) == Some(canonical(addr.ip()));
        host_match && r.port.is_none_or(|p| p == addr.port())
    })
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Checks a URL's form (not its address): `http` or `https`, a host, at most
/// [`MAX_URL_BYTES`]. An error names the field.
pub fn check_url(field: &str, url: &str) -> crate::error::Result<()> {
    crate::limits::check_bytes(field, url, MAX_URL_BYTES)?;
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        crate::error::HubError::invalid(format!(
            "{field}: {:?} is not a URL ({e}); expected https://host/path",
            crate::limits::cut(url, 80)
        ))
    })?;
    if !matches!(parsed.scheme(), "https" | "http") || parsed.host_str().is_none() {
        return Err(crate::error::HubError::invalid(format!(
            "{field}: {:?}: expected an https URL (http only to a loopback address)",
            crate::limits::cut(url, 80)
        )));
    }
    Ok(())
}

/// Where an attempt may connect: the URL's address after the outbound rule, or why not.
pub async fn resolve(url: &reqwest::Url, rules: &[Allow]) -> Result<SocketAddr, String> {
    let host = url.host_str().ok_or("the URL has no host")?.to_string();
    let port = url.port_or_known_default().ok_or("the URL has no port")?;
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let mut refused = None;
    for addr in addrs {
        if is_internal(addr.ip()) && !allowed(rules, &bare, addr) {
            refused.get_or_insert(addr);
            continue;
        }
        if url.scheme() == "http" && !canonical(addr.ip()).is_loopback() {
            return Err(format!(
                "refused: http to {addr} (not loopback); webhooks use https except to a loopback address"
            ));
        }
        return Ok(addr);
    }
    Err(match refused {
        Some(addr) => format!(
            "refused: {host} resolves to {addr}, a private, loopback or link-local address; allow it with agen hub --webhook-allow {host}:{port}"
        ),
        None => format!("cannot resolve {host}: no address"),
    })
}

/// One attempt: the HTTP status it got, or why it got none.
pub async fn send(
    url: &str,
    rules: &[Allow],
    secret: &[u8],
    event: &str,
    delivery_id: &str,
    body: &str,
) -> Result<u16, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("bad URL: {e}"))?;
    let addr = resolve(&parsed, rules).await?;
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(ATTEMPT_TIMEOUT)
        .user_agent(concat!("agen-hub/", env!("CARGO_PKG_VERSION")));
    if let Some(domain) = parsed.domain() {
        // Connect to the address just checked, never to a second lookup's answer.
        builder = builder.resolve(domain, addr);
    }
    let client = builder.build().map_err(|e| format!("http client: {e}"))?;
    let t = crate::model::now_ms() / 1000;
    let resp = client
        .post(parsed)
        .header("content-type", "application/json")
        .header("agen-signature", signature(secret, t, body))
        .header("agen-event", event)
        .header("agen-delivery", delivery_id)
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| format!("POST failed: {e}"))?;
    Ok(resp.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_over_timestamp_dot_body() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let sig = signature(b"Jefe", 0, "what do ya want for nothing?");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").expect("key");
        mac.update(b"0.what do ya want for nothing?");
        assert_eq!(
            sig,
            format!("t=0,v1={}", hex::encode(mac.finalize().into_bytes()))
        );
        let mut plain = Hmac::<Sha256>::new_from_slice(b"Jefe").expect("key");
        plain.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(plain.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn internal_addresses_are_refused_unless_allowed() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_internal(ip.parse().expect("ip")), "{ip}");
        }
        for ip in ["8.8.8.8", "2606:4700::1111", "1.1.1.1"] {
            assert!(!is_internal(ip.parse().expect("ip")), "{ip}");
        }
        let rules: Vec<Allow> = ["127.0.0.1", "hooks.internal:8443"]
            .iter()
            .map(|s| s.parse().expect("rule"))
            .collect();
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert!(allowed(&rules, "127.0.0.1", a("127.0.0.1:9")));
        assert!(allowed(&rules, "hooks.internal", a("10.0.0.5:8443")));
        assert!(!allowed(&rules, "hooks.internal", a("10.0.0.5:443")));
        assert!(!allowed(&rules, "10.0.0.5", a("10.0.0.5:443")));
        assert!("a:b:c".parse::<Allow>().is_ok(), "a bare IPv6 address");
        assert!("[::1]:x".parse::<Allow>().is_err());
    }

    #[tokio::test]
    async fn a_name_is_checked_on_the_address_it_resolves_to() {
        // `localhost` is no internal address by its name, but by what it resolves to.
        let url = reqwest::Url::parse("https://localhost:9/hook").expect("url");
        let refused = resolve(&url, &[]).await.expect_err("refused");
        assert!(
            refused.starts_with("refused: localhost resolves to")
                && refused.contains("--webhook-allow localhost:9"),
            "{refused}"
        );
        let rules: Vec<Allow> = vec!["localhost:9".parse().expect("rule")];
        let addr = resolve(&url, &rules).await.expect("allowed by name");
        assert!(addr.ip().is_loopback() && addr.port() == 9, "{addr}");
        // Plain http goes to loopback only, however the name is allowed.
        let rules: Vec<Allow> = vec!["10.0.0.1".parse().expect("rule")];
        let http = reqwest::Url::parse("http://10.0.0.1:9/hook").expect("url");
        let refused = resolve(&http, &rules).await.expect_err("http refused");
        assert!(refused.contains("not loopback"), "{refused}");
    }

    #[test]
    fn a_long_result_is_cut_to_fit_the_payload_limit() {
        let p = Payload {
            kind: "task.ended".into(),
            delivery_id: "d".into(),
            task: PayloadTask {
                task_id: "t".into(),
                namespace: "default".into(),
                deployment: "d".into(),
                state: "succeeded".into(),
                response_type: "text".into(),
                result: "\"x".repeat(60 * 1024),
                result_truncated: false,
                error: String::new(),
                labels: Default::default(),
                conversation_key: String::new(),
                created_at_ms: 0,
                finished_at_ms: 0,
            },
        };
        let body = p.to_body();
        assert!(body.len() <= MAX_PAYLOAD_BYTES, "{}", body.len());
        let back: Payload = serde_json::from_str(&body).expect("json");
        assert!(back.task.result_truncated);
    }
}
