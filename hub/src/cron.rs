//! Cron expressions of schedules: parsing (5 fields, or 6 with seconds first) in an IANA time
//! zone, and the slots they name, as unix milliseconds. Pure: no IO, no clock.
//!
//! Rules: a slot is a local time the expression matches, taken in the schedule's zone. A local
//! time that does not exist (the hour skipped when daylight-saving time starts) fires at the
//! first valid instant after it (the end of the gap; several skipped slots become that one
//! slot); a local time that exists twice (the hour repeated when it ends) fires once, at its
//! first instant. Slots are whole seconds.

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;

use crate::error::{HubError, Result};

/// The longest expression accepted (bytes).
pub const MAX_CRON_BYTES: usize = 256;

/// A parsed expression and its zone.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: croner::Cron,
    tz: Tz,
}

/// Slots that are due: the latest at or before now, and whether there were several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub latest_ms: i64,
    pub first_ms: i64,
}

/// Parses `expr` (5 fields, or 6 with seconds) in `timezone` (an IANA name; empty: UTC); an
/// error names the field (`cron`, `timezone`) and what is accepted.
pub fn parse(expr: &str, timezone: &str) -> Result<CronSpec> {
    crate::limits::check_bytes("cron", expr, MAX_CRON_BYTES)?;
    let fields = expr.split_whitespace().count();
    if fields != 5 && fields != 6 {
        return Err(HubError::invalid(format!(
            "cron: {:?} has {fields} fields; expected 5 (minute hour day month weekday) or 6 (second minute hour day month weekday)",
            crate::limits::cut(expr, 80)
        )));
    }
    let cron = croner::Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| {
            HubError::invalid(format!(
                "cron: {:?} is not a cron expression ({e}); expected e.g. `0 7 * * 1-5` or, with seconds, `*/10 * * * * *`",
                crate::limits::cut(expr, 80)
            ))
        })?;
    let tz = parse_timezone(timezone)?;
    Ok(CronSpec { cron, tz })
}

/// An IANA time zone name (empty: UTC).
pub fn parse_timezone(timezone: &str) -> Result<Tz> {
    if timezone.is_empty() {
        return Ok(Tz::UTC);
    }
    timezone.parse::<Tz>().map_err(|_| {
        HubError::invalid(format!(
            "timezone: unknown time zone {:?}; expected an IANA name such as Europe/Oslo or UTC",
            crate::limits::cut(timezone, 80)
        ))
    })
}

/// How far back [`CronSpec::due`] looks for the latest slot, smallest first.
const WINDOWS_MS: [i64; 6] = [
    60_000,
    3_600_000,
    86_400_000,
    32 * 86_400_000,
    366 * 86_400_000,
    5 * 366 * 86_400_000,
];

impl CronSpec {
    /// The first slot strictly after `after_ms`.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut start = self
            .tz
            .timestamp_opt(after_ms.div_euclid(1000), 0)
            .single()?;
        // A repeated local hour can answer an instant at or before `after_ms` (its first
        // instant, when `after_ms` is in the second one): search on by the local clock, which
        // moves forward at every step.
        for _ in 0..10_000 {
            let next = self.cron.find_next_occurrence(&start, false).ok()?;
            let ms = next.timestamp() * 1000;
            if ms > after_ms {
                return Some(ms);
            }
            start = next;
        }
        None
    }

    /// The slots in `(after_ms, now_ms]`: `None` when there is none.
    pub fn due(&self, after_ms: i64, now_ms: i64) -> Option<Due> {
        let first = self.next_after(after_ms)?;
        if first > now_ms {
            return None;
        }
        for w in WINDOWS_MS {
            let from = after_ms.max(now_ms - w);
            let Some(mut s) = self.next_after(from) else {
                continue;
            };
            if s > now_ms {
                continue;
            }
            while let Some(n) = self.next_after(s) {
                if n > now_ms {
                    break;
                }
                s = n;
            }
            return Some(Due {
                latest_ms: s,
                first_ms: first,
            });
        }
        Some(Due {
            latest_ms: first,
            first_ms: first,
        })
    }
}

/// A slot as RFC 3339 UTC text (the label value of a firing).
pub fn slot_text(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .expect("test time")
            .timestamp_millis()
    }

    #[track_caller]
    fn check_next(expr: &str, tz: &str, after: &str, expected: &[&str]) {
        let spec = parse(expr, tz).expect("valid");
        let mut at = ms(after);
        let mut got = Vec::new();
        for _ in expected {
            at = spec.next_after(at).expect("a next slot");
            got.push(slot_text(at));
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn five_and_six_fields_name_their_slots() {
        check_next(
            "0 7 * * *",
            "UTC",
            "2026-03-01T07:00:00Z",
            &["2026-03-02T07:00:00Z", "2026-03-03T07:00:00Z"],
        );
        check_next(
            "*/2 * * * * *",
            "",
            "2026-03-01T07:00:00.500Z",
            &["2026-03-01T07:00:02Z", "2026-03-01T07:00:04Z"],
        );
        check_next(
            "0 7 * * *",
            "Europe/Oslo",
            "2026-06-01T00:00:00Z",
            &["2026-06-01T05:00:00Z"],
        );
    }

    #[test]
    fn a_skipped_local_time_fires_at_the_next_valid_one_and_a_repeated_one_once() {
        // Oslo: 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z); 02:30 does not exist.
        check_next(
            "30 2 * * *",
            "Europe/Oslo",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        );
        // Every 15 minutes across the gap: the skipped 02:xx slots are one slot at 03:00.
        check_next(
            "*/15 * * * *",
            "Europe/Oslo",
            "2026-03-29T00:40:00Z",
            &[
                "2026-03-29T00:45:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z",
            ],
        );
        // 2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice, fires once (00:30Z).
        check_next(
            "30 2 * * *",
            "Europe/Oslo",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        );
        // From inside the repeated hour, the repeated slot is not found again.
        check_next(
            "30 2 * * *",
            "Europe/Oslo",
            "2026-10-25T01:10:00Z",
            &["2026-10-26T01:30:00Z"],
        );
    }

    #[test]
    fn due_finds_the_latest_missed_slot() {
        let spec = parse("*/2 * * * * *", "UTC").expect("valid");
        let d = spec
            .due(ms("2026-03-01T07:00:00Z"), ms("2026-03-01T09:00:05Z"))
            .expect("due");
        assert_eq!(slot_text(d.latest_ms), "2026-03-01T09:00:04Z");
        assert_eq!(slot_text(d.first_ms), "2026-03-01T07:00:02Z");
        assert_eq!(
            spec.due(ms("2026-03-01T07:00:00Z"), ms("2026-03-01T07:00:01Z")),
            None
        );
    }

    #[test]
    fn bad_expressions_and_zones_name_their_field() {
        for (expr, tz, field) in [
            ("* * *", "UTC", "cron:"),
            ("61 * * * *", "UTC", "cron:"),
            ("* * * * * * *", "UTC", "cron:"),
            ("0 7 * * *", "Europe/Atlantis", "timezone:"),
        ] {
            let e = parse(expr, tz).expect_err(expr).to_string();
            assert!(e.starts_with(field), "{expr} {tz}: {e}");
        }
    }
}
