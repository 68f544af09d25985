//! Per-tool limits (`x-agen/config.json` `tools.<name>` or its server's `tools.<server>.*`):
//! a tool's own `timeout` in place of `limits.toolTimeout`, and `retries` with a doubling
//! `backoff` for a call that timed out or failed at the protocol level, or whose server died or
//! lost its connection mid-call (that one is sent again, after its server is restarted, even
//! when `retries` is not set: [`LOST_CALL_RETRIES`] times).
//!
//! Invariants: only a tool the [`ToolPolicy`] calls retry-safe (read-only or idempotent) is
//! ever sent again; a tool's own error result (`isError`) is an answer, never retried; a
//! cancelled call is never retried; a retry waits its backoff under the run's cancel and is
//! announced in the run log (an `activity` event) before it is sent.

use std::time::Duration;

use agen_shared::bundle::{Bundle, DEFAULT_TOOL_BACKOFF};
use agen_shared::duration::format_duration;

use super::tools::ToolPolicy;
use crate::mcp::{CallError, Interruption};

/// How often a retry-safe call cut off by its server's death or a lost connection is sent again
/// (after the server is restarted) when its tool sets no `retries`.
pub(super) const LOST_CALL_RETRIES: u32 = 2;

/// The limits of one tool's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ToolLimits {
    /// The tool's own timeout, else `limits.toolTimeout`.
    pub timeout: Duration,
    /// How often a failed call may be sent again (0 unless retry-safe and configured).
    pub retries: u32,
    /// How often a call whose server died or lost its connection mid-call is sent again once
    /// the server is back: `retries` when set, else [`LOST_CALL_RETRIES`] (0 unless retry-safe).
    pub lost_retries: u32,
    /// The wait before the first retry; doubled before each next one.
    pub backoff: Duration,
}

impl ToolLimits {
    /// The limits of `tool` (`<server>.<tool>`) in `bundle`, given its ledger policy.
    pub fn of(bundle: &Bundle, tool: &str, policy: ToolPolicy) -> ToolLimits {
        let over = bundle.config.tool_override(tool).unwrap_or_default();
        let retries = over.retries.unwrap_or(0);
        let lost_retries = over.retries.unwrap_or(LOST_CALL_RETRIES);
        if retries > 0 && !policy.retry_safe() {
            tracing::warn!(tool, "tools.{tool}.retries ignored: the tool is side-effecting and not idempotent (set \"idempotent\": true if sending it twice is safe)");
        }
        ToolLimits {
            timeout: over.timeout.unwrap_or(bundle.harness.limits.tool_timeout),
            retries: if policy.retry_safe() { retries } else { 0 },
            lost_retries: if policy.retry_safe() { lost_retries } else { 0 },
            backoff: over.backoff.unwrap_or(DEFAULT_TOOL_BACKOFF),
        }
    }

    /// When a call that ended with `error` after `done` retries is sent again: `Some(wait)`.
    pub fn retry_after(&self, error: &CallError, done: u32) -> Option<Duration> {
        (done < self.allowed(error)).then(|| self.backoff.saturating_mul(1 << done.min(16)))
    }

    /// How often a call that ended with `error` may be sent again in all.
    pub fn allowed(&self, error: &CallError) -> u32 {
        match error {
            CallError::Interrupted {
                cause: Interruption::Timeout(_),
                ..
            }
            | CallError::Failed { .. } => self.retries,
            CallError::Interrupted {
                cause: Interruption::Lost(_),
                ..
            } => self.lost_retries,
            CallError::Interrupted {
                cause: Interruption::Cancelled,
                ..
            }
            | CallError::NotSent(_) => 0,
        }
    }
}

/// The run-log activity that announces a retry.
pub(super) fn retry_activity(
    tool: &str,
    error: &CallError,
    retry: u32,
    of: u32,
    wait: Duration,
) -> String {
    let why = match error {
        CallError::Interrupted {
            cause: Interruption::Timeout(d),
            ..
        } => format!("timed out after {}", format_duration(*d)),
        CallError::Interrupted {
            cause: Interruption::Lost(why),
            ..
        } => format!("was cut off ({why}); the server is started again first"),
        other => format!("failed ({other})"),
    };
    format!(
        "retrying {tool} in {} (retry {retry} of {of}, tools.{tool}.retries): it {why}",
        format_duration(wait)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_their_backoff_and_stop_at_the_count() {
        let l = ToolLimits {
            timeout: Duration::from_secs(1),
            retries: 2,
            lost_retries: 1,
            backoff: Duration::from_millis(100),
        };
        let t = CallError::interrupted("s", Interruption::Timeout(Duration::from_secs(1)));
        assert_eq!(l.retry_after(&t, 0), Some(Duration::from_millis(100)));
        assert_eq!(l.retry_after(&t, 1), Some(Duration::from_millis(200)));
        assert_eq!(l.retry_after(&t, 2), None);
        let lost = CallError::interrupted("s", Interruption::Lost("died".into()));
        assert_eq!(l.retry_after(&lost, 0), Some(Duration::from_millis(100)));
        assert_eq!(l.retry_after(&lost, 1), None);
        let cancelled = CallError::interrupted("s", Interruption::Cancelled);
        assert_eq!(l.retry_after(&cancelled, 0), None);
        let unknown = CallError::NotSent(crate::mcp::NotSent::UnknownTool("x".into()));
        assert_eq!(l.retry_after(&unknown, 0), None);
    }
}
