//! Agen's versions: the crate version, and the **protocol version** (`MAJOR.MINOR`, separate
//! from the crate version) that a Nest announces in `Register` and the Hub compares.
//!
//! Invariants: a Hub accepts a Nest of the same major whose minor is its own or the one before
//! (the window that lets Hubs be upgraded first, then Nests one by one), and refuses every other
//! with an error that names both versions; the minor goes up whenever `proto/` or the
//! Nest⇄instance socket contract changes (`tests/tidy.rs` checks it against the digests in
//! `proto/CONTRACT`). `AGEN_PROTOCOL_VERSION=MAJOR.MINOR` in a process's environment makes it
//! speak another version (a stand-in for an older or newer build when an upgrade is rehearsed
//! or tested).

use std::fmt;

/// The crate version of this build.
pub const CRATE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The environment variable that overrides the protocol version this process speaks.
pub const PROTOCOL_ENV: &str = "AGEN_PROTOCOL_VERSION";

/// A protocol version, `MAJOR.MINOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Protocol {
    pub major: u32,
    pub minor: u32,
}

impl Protocol {
    /// The protocol this build speaks.
    pub const CURRENT: Protocol = Protocol { major: 1, minor: 2 };

    /// The protocol this process speaks: [`Protocol::CURRENT`] unless `AGEN_PROTOCOL_VERSION`
    /// names another (an unreadable value is ignored, with the current one spoken).
    pub fn spoken() -> Protocol {
        std::env::var(PROTOCOL_ENV)
            .ok()
            .and_then(|v| Protocol::parse(&v))
            .unwrap_or(Protocol::CURRENT)
    }

    /// `MAJOR.MINOR` (`None` for anything else, an empty string included).
    pub fn parse(s: &str) -> Option<Protocol> {
        let (major, minor) = s.trim().split_once('.')?;
        Some(Protocol {
            major: major.parse().ok()?,
            minor: minor.parse().ok()?,
        })
    }

    /// Whether a peer speaking `other` is inside this side's window: the same major, and this
    /// minor or the one before.
    pub fn accepts(self, other: Protocol) -> bool {
        other.major == self.major && (other.minor == self.minor || other.minor + 1 == self.minor)
    }

    /// The versions this side accepts, for error messages: `1.3 or 1.2`, or `1.0` alone.
    pub fn window(self) -> String {
        match self.minor {
            0 => self.to_string(),
            m => format!(
                "{self} or {}",
                Protocol {
                    major: self.major,
                    minor: m - 1
                }
            ),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(hub: &str, nest: &str, accepted: bool) {
        let hub = Protocol::parse(hub).expect("a hub version");
        let nest = Protocol::parse(nest).expect("a nest version");
        assert_eq!(hub.accepts(nest), accepted, "hub {hub}, nest {nest}");
    }

    #[test]
    fn a_hub_accepts_its_own_minor_and_the_one_before_of_its_major() {
        check("1.3", "1.3", true);
        check("1.3", "1.2", true);
        check("1.3", "1.1", false);
        check("1.3", "1.4", false);
        check("1.3", "2.3", false);
        check("1.0", "1.0", true);
        check("1.0", "0.9", false);
        check("2.0", "1.9", false);
    }

    #[test]
    fn only_major_dot_minor_parses() {
        assert_eq!(
            Protocol::parse("1.2"),
            Some(Protocol { major: 1, minor: 2 })
        );
        for bad in ["", "1", "1.", ".2", "1.2.3", "a.b", "-1.2"] {
            assert_eq!(Protocol::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            Protocol::parse("1.3").map(|p| p.window()).as_deref(),
            Some("1.3 or 1.2")
        );
        assert_eq!(
            Protocol::parse("1.0").map(|p| p.window()).as_deref(),
            Some("1.0")
        );
    }
}
