//! Replacement back-off per replica slot, pure: which wait each new replica of a deployment
//! starts with.
//!
//! Rules: every instance holds one replica slot and carries that slot's count of consecutive
//! failures (`slot_failures`). An instance replaced because it failed leaves a [`Vacancy`]:
//! the count plus one, and no replacement before now + [`super::backoff`] of it (1 s, 2 s,
//! 4 s … 60 s). The new replicas a pass creates take the vacancies that can be placed soonest
//! first, then fresh slots (no failure, no wait); a vacancy no replica takes is dropped. An
//! instance that ran healthy for the stable time clears its slot's count ([`settled`]). So
//! one slot's crashes never delay the replacement of another: a dead instance whose slot was
//! not failing is replaced after 1 s.

use super::backoff;

/// A replica slot left empty by an instance that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vacancy {
    /// Consecutive failures of the slot, this one included.
    pub failures: u32,
    /// Its replacement is not placed before this time (unix ms).
    pub not_before_ms: i64,
    /// Why the instance failed.
    pub reason: String,
}

impl Vacancy {
    /// The vacancy an instance whose slot had failed `slot_failures` times in a row leaves
    /// when it fails at `now_ms`.
    pub fn after_failure(slot_failures: u32, reason: &str, now_ms: i64) -> Vacancy {
        let failures = slot_failures.saturating_add(1);
        let wait = i64::try_from(backoff(failures).as_millis()).unwrap_or(i64::MAX);
        Vacancy {
            failures,
            not_before_ms: now_ms.saturating_add(wait),
            reason: reason.to_string(),
        }
    }
}

/// What each of `create` new replicas starts from: a vacancy (soonest placeable first) or a
/// fresh slot (`None`).
pub fn fill(mut vacancies: Vec<Vacancy>, create: u32) -> Vec<Option<Vacancy>> {
    vacancies.sort_by_key(|v| (v.not_before_ms, v.failures));
    let mut out: Vec<Option<Vacancy>> = vacancies
        .into_iter()
        .take(create as usize)
        .map(Some)
        .collect();
    out.resize(create as usize, None);
    out
}

/// The slot count an instance carries on: cleared once it has run healthy for `stable_ms`
/// (`healthy_since_ms` 0: not healthy now).
pub fn settled(slot_failures: u32, healthy_since_ms: i64, now_ms: i64, stable_ms: i64) -> u32 {
    if healthy_since_ms > 0 && now_ms - healthy_since_ms >= stable_ms {
        0
    } else {
        slot_failures
    }
}
