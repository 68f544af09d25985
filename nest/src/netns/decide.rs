//! The egress decision for one connection out of an instance's network namespace, and what the
//! proxy reads from the connection's first bytes to know its name (TLS SNI, HTTP Host).
//!
//! Rules, in order: a `network.deny` pattern that matches refuses; an explicit `network.allow`
//! pattern (not `*`) that matches allows; the bundle's own model endpoint (`baseUrl`, or its
//! provider's public endpoint) is allowed; the Nest host's own addresses, link-local addresses
//! (cloud metadata) and the Hub's and the Nest's ports are refused (`protected`); `*` in
//! `allow` allows; a non-empty `allow` list refuses the rest; without one the Nest's
//! `--egress-default` decides. Pure: the caller resolves names and says what is protected.

use std::net::IpAddr;

use agen_shared::bundle::{Destination, HostPattern};

/// What an instance's connections are decided by.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub allow: Vec<HostPattern>,
    pub deny: Vec<HostPattern>,
    /// The endpoints the bundle itself names for its model (allowed unless denied).
    pub implicit: Vec<HostPattern>,
    pub default_allow: bool,
}

/// A decision and the rule that made it (named in the refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow(String),
    Refuse(String),
}

impl Policy {
    /// Whether a connection to `names`/`ip` on `port` may go out (see the module doc).
    pub fn decide(
        &self,
        names: &[String],
        ip: Option<IpAddr>,
        port: u16,
        protected: bool,
    ) -> Verdict {
        let d = Destination { names, ip, port };
        if let Some(p) = self.deny.iter().find(|p| p.matches(&d)) {
            return Verdict::Refuse(format!("network.deny `{}`", p.as_str()));
        }
        if let Some(p) = self.allow.iter().find(|p| p.is_explicit() && p.matches(&d)) {
            return Verdict::Allow(format!("network.allow `{}`", p.as_str()));
        }
        if self.implicit.iter().any(|p| p.matches(&d)) {
            return Verdict::Allow("the bundle's model endpoint".into());
        }
        if protected {
            return Verdict::Refuse("the Nest host's own addresses, link-local addresses and the Hub's and Nest's ports are reachable only when network.allow names them".into());
        }
        if let Some(p) = self.allow.iter().find(|p| p.matches(&d)) {
            return Verdict::Allow(format!("network.allow `{}`", p.as_str()));
        }
        if !self.allow.is_empty() {
            return Verdict::Refuse("not in network.allow".into());
        }
        if self.default_allow {
            Verdict::Allow("--egress-default allow".into())
        } else {
            Verdict::Refuse("--egress-default deny (the bundle has no network.allow)".into())
        }
    }

    /// Whether a DNS question for `name` is answered (some connection to it could be
    /// allowed), else the rule that refuses it (named in the refusal).
    pub fn may_resolve(&self, name: &str) -> Result<(), String> {
        if let Some(p) = self
            .deny
            .iter()
            .find(|p| p.any_port() && p.covers_name(name))
        {
            return Err(format!("network.deny `{}`", p.as_str()));
        }
        if self
            .allow
            .iter()
            .chain(&self.implicit)
            .any(|p| p.covers_name(name))
        {
            return Ok(());
        }
        if !self.allow.is_empty() {
            return Err("not in network.allow".into());
        }
        if self.default_allow {
            Ok(())
        } else {
            Err("--egress-default deny (the bundle has no network.allow)".into())
        }
    }
}

/// What the first bytes of a connection say about where it is going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello with this server name.
    Tls(String),
    /// A TLS ClientHello without a server name.
    TlsNoName,
    /// A plain HTTP request with this Host (without its port).
    Http(String),
    /// Not enough bytes yet to tell.
    NeedMore,
    /// Neither TLS nor HTTP (decided by address).
    Other,
}

/// Reads the TLS server name or the HTTP Host from the start of a connection.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::NeedMore,
        Some(0x16) => sniff_tls(buf),
        Some(c) if c.is_ascii_uppercase() => sniff_http(buf),
        Some(_) => Sniffed::Other,
    }
}

fn sniff_http(buf: &[u8]) -> Sniffed {
    let method_end = buf.iter().position(|&b| b == b' ');
    match method_end {
        None if buf.len() < 16 && buf.iter().all(u8::is_ascii_uppercase) => {
            return Sniffed::NeedMore
        }
        None => return Sniffed::Other,
        Some(n) if n == 0 || n > 16 || !buf[..n].iter().all(u8::is_ascii_uppercase) => {
            return Sniffed::Other
        }
        Some(_) => {}
    }
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() >= 16 * 1024 {
            Sniffed::Other
        } else {
            Sniffed::NeedMore
        };
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    for line in head.split("\r\n").skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                let v = v.trim();
                let host = if let Some(rest) = v.strip_prefix('[') {
                    rest.split(']').next().unwrap_or("")
                } else {
                    v.rsplit_once(':').map_or(v, |(h, _)| h)
                };
                if !host.is_empty() {
                    return Sniffed::Http(host.to_ascii_lowercase());
                }
            }
        }
    }
    Sniffed::Other
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A ClientHello in one TLS record: record header, handshake header, version, random, session
/// id, cipher suites, compression, extensions; extension 0 is the server name.
fn sniff_tls(buf: &[u8]) -> Sniffed {
    if buf.len() < 5 {
        return Sniffed::NeedMore;
    }
    let rec_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if buf.len() < 5 + rec_len {
        return if rec_len > 16 * 1024 {
            Sniffed::TlsNoName
        } else {
            Sniffed::NeedMore
        };
    }
    let r = &buf[5..5 + rec_len];
    parse_client_hello(r).unwrap_or(Sniffed::TlsNoName)
}

fn parse_client_hello(r: &[u8]) -> Option<Sniffed> {
    let take = |at: usize, n: usize| r.get(at..at + n);
    if *r.first()? != 1 {
        return None;
    }
    let mut at = 4 + 2 + 32; // handshake header, version, random
    let sid = usize::from(*r.get(at)?);
    at += 1 + sid;
    let suites = take(at, 2)?;
    at += 2 + usize::from(u16::from_be_bytes([suites[0], suites[1]]));
    let comp = usize::from(*r.get(at)?);
    at += 1 + comp;
    let ext_len = take(at, 2)?;
    let end = at + 2 + usize::from(u16::from_be_bytes([ext_len[0], ext_len[1]]));
    at += 2;
    while at + 4 <= end {
        let h = take(at, 4)?;
        let (kind, len) = (
            u16::from_be_bytes([h[0], h[1]]),
            usize::from(u16::from_be_bytes([h[2], h[3]])),
        );
        at += 4;
        if kind == 0 {
            // server_name_list length, then entries of (type, length, name).
            let mut p = at + 2;
            while p + 3 <= at + len {
                let e = take(p, 3)?;
                let n = usize::from(u16::from_be_bytes([e[1], e[2]]));
                if e[0] == 0 {
                    let name = std::str::from_utf8(take(p + 3, n)?).ok()?;
                    return Some(Sniffed::Tls(name.to_ascii_lowercase()));
                }
                p += 3 + n;
            }
            return None;
        }
        at += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pats(list: &[&str]) -> Vec<HostPattern> {
        list.iter()
            .map(|p| HostPattern::parse(p).expect(p))
            .collect()
    }

    #[test]
    fn deny_beats_allow_and_an_allow_list_is_closed() {
        let policy = Policy {
            allow: pats(&[
                "api.example.com:443",
                "*.internal.test:8443",
                "10.9.0.0/16:5432",
            ]),
            deny: pats(&["bad.internal.test"]),
            implicit: pats(&["models.test:443"]),
            default_allow: true,
        };
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ip = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
        #[track_caller]
        fn check(v: Verdict, allowed: bool, rule: &str) {
            match (&v, allowed) {
                (Verdict::Allow(r), true) | (Verdict::Refuse(r), false) => {
                    assert!(r.contains(rule), "{v:?}")
                }
                _ => panic!("expected allowed={allowed}, got {v:?}"),
            }
        }
        check(
            policy.decide(&names(&["api.example.com"]), None, 443, false),
            true,
            "api.example.com:443",
        );
        check(
            policy.decide(&names(&["api.example.com"]), None, 80, false),
            false,
            "not in network.allow",
        );
        check(
            policy.decide(&names(&["a.internal.test"]), None, 8443, false),
            true,
            "*.internal.test",
        );
        check(
            policy.decide(&names(&["bad.internal.test"]), None, 8443, false),
            false,
            "network.deny `bad.internal.test`",
        );
        check(
            policy.decide(&[], ip("10.9.1.1"), 5432, false),
            true,
            "10.9.0.0/16",
        );
        check(
            policy.decide(&[], ip("10.8.1.1"), 5432, false),
            false,
            "not in network.allow",
        );
        check(
            policy.decide(&names(&["models.test"]), None, 443, false),
            true,
            "model endpoint",
        );
        // An explicit allow opens a protected address; nothing else does.
        check(
            policy.decide(&[], ip("10.9.0.1"), 5432, true),
            true,
            "10.9.0.0/16",
        );
        check(
            policy.decide(&[], ip("169.254.169.254"), 80, true),
            false,
            "link-local",
        );
    }

    #[test]
    fn without_an_allow_list_the_nests_default_decides_but_never_for_protected_addresses() {
        let open = Policy {
            default_allow: true,
            ..Policy::default()
        };
        let closed = Policy {
            default_allow: false,
            ..Policy::default()
        };
        let star = Policy {
            allow: pats(&["*"]),
            ..Policy::default()
        };
        let n = vec!["x.test".to_string()];
        assert_eq!(
            open.decide(&n, None, 1, false),
            Verdict::Allow("--egress-default allow".into())
        );
        assert!(
            matches!(closed.decide(&n, None, 1, false), Verdict::Refuse(r) if r.contains("--egress-default deny"))
        );
        assert!(
            matches!(open.decide(&n, None, 1, true), Verdict::Refuse(r) if r.contains("link-local"))
        );
        assert!(matches!(star.decide(&n, None, 1, true), Verdict::Refuse(_)));
        assert!(matches!(star.decide(&n, None, 1, false), Verdict::Allow(_)));
        assert!(open.may_resolve("x.test").is_ok());
        assert!(closed
            .may_resolve("x.test")
            .is_err_and(|r| r.contains("--egress-default deny")));
        let rules = Policy {
            allow: pats(&["*.ok.test:443"]),
            deny: pats(&["no.ok.test"]),
            ..Policy::default()
        };
        assert!(rules.may_resolve("a.ok.test").is_ok());
        assert_eq!(
            rules.may_resolve("no.ok.test"),
            Err("network.deny `no.ok.test`".into())
        );
        assert_eq!(
            rules.may_resolve("other.test"),
            Err("not in network.allow".into())
        );
    }

    #[test]
    fn the_name_is_read_from_an_http_request_or_a_tls_hello() {
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nHost: Srv.Test:8080\r\n\r\n"),
            Sniffed::Http("srv.test".into())
        );
        assert_eq!(
            sniff(b"GET / HTTP/1.1\r\nhost: [::1]:80\r\n\r\n"),
            Sniffed::Http("::1".into())
        );
        assert_eq!(sniff(b"GET / HTTP/1.1\r\nHost: a"), Sniffed::NeedMore);
        assert_eq!(sniff(b"GE"), Sniffed::NeedMore);
        assert_eq!(sniff(b"\x00\x00\x00\x08\x04\xd2\x16\x2f"), Sniffed::Other);
        assert_eq!(sniff(b"SSH-2.0-x\r\n"), Sniffed::Other);
        // A minimal ClientHello naming db.test.
        let name = b"db.test";
        let sni_entry = [&[0u8][..], &(name.len() as u16).to_be_bytes(), name].concat();
        let sni_list = [&(sni_entry.len() as u16).to_be_bytes()[..], &sni_entry].concat();
        let ext = [
            &[0u8, 0][..],
            &(sni_list.len() as u16).to_be_bytes(),
            &sni_list,
        ]
        .concat();
        let mut body = vec![3, 3];
        body.extend([0u8; 32]);
        body.extend([0u8]); // session id
        body.extend([0, 2, 0x13, 0x01]); // one suite
        body.extend([1, 0]); // compression
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(&ext);
        let hs = [&[1u8, 0][..], &(body.len() as u16).to_be_bytes(), &body].concat();
        let rec = [&[0x16u8, 3, 1][..], &(hs.len() as u16).to_be_bytes(), &hs].concat();
        assert_eq!(sniff(&rec), Sniffed::Tls("db.test".into()));
        assert_eq!(sniff(&rec[..rec.len() - 3]), Sniffed::NeedMore);
    }
}
