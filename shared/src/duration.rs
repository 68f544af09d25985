//! Human durations as they appear in bundle files and flags: `500ms`, `90s`, `10m`, `1h30m`.
//!
//! Invariants: parsing never panics; an error always says what was expected ("a duration such
//! as `90s` or `10m`"); [`format_duration`] output parses back to the same value.

use std::time::Duration;

/// A string that is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a duration such as `90s`, `10m` or `1h30m`, got `{input}`")]
pub struct DurationError {
    /// The text that did not parse.
    pub input: String,
}

/// Parses `500ms`, `90s`, `10m`, `1h30m`, `2h 5m` (units: ms, s, m, h, d and their long forms).
/// A bare number, a negative value or an empty string is refused.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: s.to_string(),
    };
    let trimmed = s.trim();
    if trimmed.is_empty() || trimmed.chars().all(|c| c.is_ascii_digit()) {
        return Err(err());
    }
    humantime::parse_duration(trimmed).map_err(|_| err())
}

/// Formats a duration the way [`parse_duration`] reads it (`10m`, `1h 30m`, `500ms`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Serde helpers for a `Duration` field written as a human string:
/// `#[serde(with = "agen_shared::duration::serde_human")]`.
pub mod serde_human {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde helpers for an `Option<Duration>` field written as a human string or absent/null.
pub mod serde_human_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => super::parse_duration(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<Duration>) {
        assert_eq!(parse_duration(input).ok(), expected, "input {input:?}");
    }

    #[test]
    fn parses_the_forms_bundles_use() {
        check("500ms", Some(Duration::from_millis(500)));
        check("90s", Some(Duration::from_secs(90)));
        check("10m", Some(Duration::from_secs(600)));
        check("1h30m", Some(Duration::from_secs(5400)));
        check("1h 30m", Some(Duration::from_secs(5400)));
        check(" 5s ", Some(Duration::from_secs(5)));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        check("", None);
        check("10", None);
        check("ten minutes", None);
        check("-5s", None);
        check("5 parsecs", None);
    }

    #[test]
    fn error_says_what_was_expected() {
        let err = parse_duration("ten minutes").unwrap_err();
        assert_eq!(
            err.to_string(),
            "expected a duration such as `90s`, `10m` or `1h30m`, got `ten minutes`"
        );
    }

    #[test]
    fn format_round_trips() {
        for d in [
            Duration::from_millis(500),
            Duration::from_secs(5400),
            Duration::from_secs(600),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn serde_helpers_read_and_write_strings() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct T {
            #[serde(with = "serde_human")]
            d: Duration,
        }
        let t: T = serde_json::from_str(r#"{"d": "90s"}"#).unwrap();
        assert_eq!(
            t,
            T {
                d: Duration::from_secs(90)
            }
        );
        assert_eq!(serde_json::to_string(&t).unwrap(), r#"{"d":"1m 30s"}"#);
        let bad = serde_json::from_str::<T>(r#"{"d": "soon"}"#).unwrap_err();
        assert!(bad.to_string().contains("expected a duration"), "{bad}");
    }
}
