//! `x-agen/config.json` `"network": {"allow": [...], "deny": [...]}`: where a sandboxed
//! instance and its tool servers may connect ([`NetworkRules`]), as host patterns
//! ([`HostPattern`]).
//!
//! A pattern is `HOST`, `HOST:PORT` or `HOST:*`: HOST is a DNS name (case-insensitive, a
//! trailing dot ignored), `*.example.com` (any name below example.com at any depth, not
//! example.com itself), `*` (any host), an IPv4 address, an IPv4 CIDR block (`10.0.0.0/8`), or
//! an IPv6 address in brackets (`[fd00::1]:443`); PORT is 1-65535, and no port or `*` means any
//! port.
//!
//! Invariants: deny beats allow; a non-empty `allow` list refuses everything it does not match
//! (the Nest's `--egress-default` decides only for a bundle with no `allow` list); matching is
//! pure (no DNS here: the Nest resolves and passes the names it knows for an address).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// A deployment's egress rule, as written (every entry a valid [`HostPattern`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRules {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// The host side of a [`HostPattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Host {
    Any,
    Name(String),
    /// `*.suffix`: the suffix without the `*.`.
    Below(String),
    Ip(IpAddr),
    /// An IPv4 block: network address and prefix length.
    Block(u32, u8),
}

/// One entry of `allow` or `deny` (see the module doc for the syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: Host,
    /// `None`: any port.
    port: Option<u16>,
    text: String,
}

/// What a connection is matched on: the names it is known by (TLS SNI, HTTP Host, the name the
/// instance resolved, or a name of a rule that resolves to its address), its address, its port.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    pub names: &'a [String],
    pub ip: Option<IpAddr>,
    pub port: u16,
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

impl HostPattern {
    /// Parses one pattern; the error says what was expected.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let expected = "expected HOST, HOST:PORT or HOST:* where HOST is a name (api.example.com), *.example.com, *, an IPv4 address or block (10.0.0.0/8) or [IPv6], e.g. \"api.openai.com:443\"";
        if text.trim() != text || text.is_empty() || text.chars().any(char::is_control) {
            return Err(format!("{expected}, got `{text}`"));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (v6, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("{expected}, got `{text}` (no closing `]`)"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("{expected}, got `{text}`"))?,
                ),
            };
            let ip: std::net::Ipv6Addr = v6
                .parse()
                .map_err(|_| format!("{expected}, got `{text}` (`{v6}` is not an IPv6 address)"))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (h, p) = match text.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            };
            if h.contains(':') {
                return Err(format!(
                    "{expected}, got `{text}` (an IPv6 address goes in brackets)"
                ));
            }
            (
                Self::parse_host(h).map_err(|m| format!("{expected}, got `{text}` ({m})"))?,
                p,
            )
        };
        let port = match port {
            None | Some("*") => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    return Err(format!(
                        "{expected}, got `{text}` (port `{p}` is not 1-65535 or *)"
                    ))
                }
            },
        };
        Ok(HostPattern {
            host,
            port,
            text: text.to_string(),
        })
    }

    fn parse_host(h: &str) -> Result<Host, String> {
        if h == "*" {
            return Ok(Host::Any);
        }
        if let Some((net, len)) = h.split_once('/') {
            let ip: std::net::Ipv4Addr = net
                .parse()
                .map_err(|_| format!("`{net}` is not an IPv4 address"))?;
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| format!("`/{len}` is not a prefix length 0-32"))?;
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            return Ok(Host::Block(u32::from(ip) & mask, len));
        }
        if let Ok(ip) = h.parse::<std::net::Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        if let Some(suffix) = h.strip_prefix("*.") {
            let s = normalize(suffix);
            return if valid_name(&s) {
                Ok(Host::Below(s))
            } else {
                Err(format!("`{suffix}` is not a host name"))
            };
        }
        if h.contains('*') {
            return Err("`*` may only stand alone or start `*.`".into());
        }
        let n = normalize(h);
        if valid_name(&n) {
            Ok(Host::Name(n))
        } else {
            Err(format!("`{h}` is not a host name"))
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The exact name this pattern names (no wildcard), which the Nest may resolve to match a
    /// connection that came with an address only.
    pub fn exact_name(&self) -> Option<&str> {
        match &self.host {
            Host::Name(n) => Some(n),
            _ => None,
        }
    }

    /// Whether the pattern allows some port of `name` (so its DNS question may be answered).
    pub fn covers_name(&self, name: &str) -> bool {
        self.host_matches_name(&normalize(name))
    }

    fn host_matches_name(&self, n: &str) -> bool {
        match &self.host {
            Host::Any => true,
            Host::Name(m) => m == n,
            Host::Below(s) => {
                n.len() > s.len() + 1
                    && n.ends_with(s.as_str())
                    && n.as_bytes()[n.len() - s.len() - 1] == b'.'
            }
            Host::Ip(ip) => n.parse::<IpAddr>().ok() == Some(*ip),
            Host::Block(..) => n.parse::<IpAddr>().is_ok_and(|ip| self.host_matches_ip(ip)),
        }
    }

    fn host_matches_ip(&self, ip: IpAddr) -> bool {
        match (&self.host, ip) {
            (Host::Any, _) => true,
            (Host::Ip(m), ip) => *m == ip,
            (Host::Block(net, len), IpAddr::V4(v4)) => {
                let mask = if *len == 0 { 0 } else { u32::MAX << (32 - len) };
                u32::from(v4) & mask == *net
            }
            _ => false,
        }
    }

    /// Whether the destination matches: its port, and one of its names or its address.
    pub fn matches(&self, d: &Destination<'_>) -> bool {
        if self.port.is_some_and(|p| p != d.port) {
            return false;
        }
        d.names
            .iter()
            .any(|n| self.host_matches_name(&normalize(n)))
            || d.ip.is_some_and(|ip| self.host_matches_ip(ip))
    }

    /// Whether the pattern names no port (every port of its host).
    pub fn any_port(&self) -> bool {
        self.port.is_none()
    }

    /// Whether this is an explicit pattern for the host (not `*`): only such a pattern opens
    /// what is closed by default (link-local addresses, the Nest host's own addresses).
    pub fn is_explicit(&self) -> bool {
        !matches!(self.host, Host::Any)
    }
}

impl NetworkRules {
    /// The parsed lists; the error names the list and index.
    pub fn patterns(&self) -> Result<(Vec<HostPattern>, Vec<HostPattern>), String> {
        let parse = |key: &str, list: &[String]| {
            list.iter()
                .enumerate()
                .map(|(i, p)| HostPattern::parse(p).map_err(|m| format!("network.{key}[{i}]: {m}")))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok((parse("allow", &self.allow)?, parse("deny", &self.deny)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(pattern: &str, names: &[&str], ip: Option<&str>, port: u16, expected: bool) {
        let p = HostPattern::parse(pattern).expect(pattern);
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let d = Destination {
            names: &names,
            ip: ip.map(|i| i.parse().expect("ip")),
            port,
        };
        assert_eq!(
            p.matches(&d),
            expected,
            "{pattern} vs {names:?} {ip:?}:{port}"
        );
    }

    #[test]
    fn patterns_match_names_wildcards_addresses_blocks_and_ports() {
        check("api.openai.com:443", &["api.openai.com"], None, 443, true);
        check("api.openai.com:443", &["API.OpenAI.com."], None, 443, true);
        check("api.openai.com:443", &["api.openai.com"], None, 80, false);
        check("api.openai.com", &["api.openai.com"], None, 80, true);
        check("api.openai.com:*", &["api.openai.com"], None, 8443, true);
        check(
            "*.internal.example:8443",
            &["a.b.internal.example"],
            None,
            8443,
            true,
        );
        check(
            "*.internal.example:8443",
            &["internal.example"],
            None,
            8443,
            false,
        );
        check(
            "*.internal.example:8443",
            &["xinternal.example"],
            None,
            8443,
            false,
        );
        check("*", &[], Some("10.1.2.3"), 22, true);
        check("10.0.0.0/8:5432", &[], Some("10.1.2.3"), 5432, true);
        check("10.0.0.0/8:5432", &[], Some("11.1.2.3"), 5432, false);
        check("10.1.2.3", &[], Some("10.1.2.3"), 1, true);
        check("10.1.2.3", &["10.1.2.3"], None, 1, true);
        check("[::1]:8080", &[], Some("::1"), 8080, true);
        check("db.test:5432", &[], Some("10.1.2.3"), 5432, false);
        check(
            "db.test:5432",
            &["other.test", "db.test"],
            Some("10.1.2.3"),
            5432,
            true,
        );
    }

    #[test]
    fn bad_patterns_are_named_with_the_expected_form() {
        for bad in [
            "",
            " a.com",
            "a.com:0",
            "a.com:70000",
            "a.com:x",
            "a*.com",
            "::1",
            "[::1",
            "10.0.0.0/33",
            "a..com",
            "http://a.com",
        ] {
            let e = HostPattern::parse(bad).expect_err(bad);
            assert!(
                e.starts_with("expected HOST, HOST:PORT or HOST:*"),
                "{bad}: {e}"
            );
        }
        let rules = NetworkRules {
            allow: vec!["ok.com:443".into()],
            deny: vec!["a.com".into(), "bad:port".into()],
        };
        let e = rules.patterns().expect_err("bad deny");
        assert!(e.starts_with("network.deny[1]: expected"), "{e}");
    }

    #[test]
    fn a_name_question_is_covered_by_the_patterns_that_could_allow_it() {
        let p = HostPattern::parse("*.example.com:443").expect("parse");
        assert!(p.covers_name("a.example.com"));
        assert!(!p.covers_name("example.com"));
        assert_eq!(
            HostPattern::parse("db.test:1").expect("p").exact_name(),
            Some("db.test")
        );
        assert!(!HostPattern::parse("*").expect("p").is_explicit());
    }
}
