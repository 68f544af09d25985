//! Bounds on one `grep` call with a model-chosen regular expression: the compiled program is
//! small ([`GREP_REGEX_SIZE_LIMIT`]), each line is matched on at most its first
//! [`super::search::MAX_GREP_LINE_BYTES`] bytes, and the search stops at a deadline
//! ([`GREP_DEADLINE`]) or as soon as the call is cancelled, checked between lines.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// The longest one `grep` call searches.
pub const GREP_DEADLINE: Duration = Duration::from_secs(10);
/// The compiled size a `grep` pattern may have (the regex crate's `size_limit`).
pub const GREP_REGEX_SIZE_LIMIT: usize = 512 * 1024;

/// When a running `grep` must stop.
#[derive(Clone)]
pub(crate) struct Stop {
    deadline: Instant,
    limit: Duration,
    cancel: CancellationToken,
}

impl Stop {
    pub(crate) fn new(limit: Duration, cancel: CancellationToken) -> Self {
        Stop {
            deadline: Instant::now() + limit,
            limit,
            cancel,
        }
    }

    /// Why the search must stop now, if it must.
    pub(crate) fn reason(&self) -> Option<String> {
        if self.cancel.is_cancelled() {
            return Some("the call was cancelled".into());
        }
        (Instant::now() >= self.deadline).then(|| {
            format!(
                "stopped after {} (grep's time limit); narrow the search with `path` or `glob`, or use a simpler pattern",
                humantime::format_duration(self.limit)
            )
        })
    }
}
