//! Streamed text of a model turn: [`TurnDelta`], what the instance sends its Nest, the Nest
//! the Hub, and the Hub a `WatchTask` watcher (kind [`DELTA_KIND`] or [`RESET_KIND`], the JSON
//! of this struct) and an A2A streaming client.
//!
//! Invariants: a delta is never a run event: it is not stored, not acked, not resent, and may
//! be lost; only the turn's `model.answered` is the record. A reset says that what was shown of
//! turn `turn` (and any later turn) of the task is void: the concatenation of a turn's deltas
//! after the last reset is the text that turn's `model.answered` holds.

use serde::{Deserialize, Serialize};

/// The `kind` of a frame with text.
pub const DELTA_KIND: &str = "model.delta";
/// The `kind` of a frame that voids what was shown of a turn.
pub const RESET_KIND: &str = "delta.reset";

/// A piece of a model turn's answer. With `reset`, what was shown of turn `turn` and every
/// later turn is void first, and `text` is the turn's new beginning (a reset and the text that
/// follows it travel as one frame when they are sent together).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TurnDelta {
    /// The run attempt that asked the model.
    pub attempt: u32,
    /// The turn of that attempt (1 = the run's first turn; a resumed attempt asks the turn it
    /// resumes at).
    pub turn: u32,
    /// The next text of the answer (empty in a reset).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
}

impl TurnDelta {
    /// [`DELTA_KIND`] or [`RESET_KIND`].
    pub fn kind(&self) -> &'static str {
        if self.reset {
            RESET_KIND
        } else {
            DELTA_KIND
        }
    }

    /// Whether `next` continues this frame's text (same attempt and turn, `next` no reset):
    /// then the two are one frame, this one's text followed by `next`'s.
    pub fn continues_with(&self, next: &TurnDelta) -> bool {
        !next.reset && self.attempt == next.attempt && self.turn == next.turn
    }
}
