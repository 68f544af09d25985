//! The Hub's group commit for run events: the read loop of a Nest's stream stores a batch and
//! goes on reading; the batch's acks wait, held in [`crate::nodes::Liveness`], for a store flush
//! that started after the batch was written, and leave for the Nest when it ends.
//!
//! Invariants: an ack leaves only after a flush that covers its event (the held-message
//! ticket is taken after the write; a flush covers every ticket up to the mark read before it
//! starts). A batch with a waited-for (`sync`) event asks for a flush at once; while one is in
//! flight, every batch that arrives meanwhile is covered by the next single flush (one fsync
//! serves many runs and Nests). A batch nobody waits for asks only for a lazy flush, at most
//! [`LAZY_FLUSH`] later, and any flush before that covers it too. A flush that fails sends
//! nothing: the store is broken, and when it heals the held acks are dropped and the links
//! of their Nests cut (the Nests reconnect and resend what was not acked).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Core;

/// The longest a batch of events nobody waits for waits for its flush.
pub const LAZY_FLUSH: Duration = Duration::from_millis(20);

/// Whether a lazy flush is scheduled (at most one at a time).
#[derive(Default)]
pub(crate) struct LazyFlush(AtomicBool);

impl Core {
    /// Asks for the flush that releases the acks just held: at once when someone waits for
    /// one of them (`urgent`), else within [`LAZY_FLUSH`].
    pub(crate) fn commit_soon(self: &Arc<Self>, urgent: bool) {
        if urgent {
            let core = self.clone();
            tokio::spawn(async move { core.commit_in_background().await });
            return;
        }
        if self.lazy_flush.0.swap(true, Ordering::SeqCst) {
            return;
        }
        let core = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(LAZY_FLUSH) => {}
                _ = core.stopping.cancelled() => {}
            }
            core.lazy_flush.0.store(false, Ordering::SeqCst);
            // An earlier flush (a waited-for event, a dispatch) may have released them all.
            if core.lock().live.held() > 0 {
                core.commit_in_background().await;
            }
        });
    }

    async fn commit_in_background(&self) {
        if let Err(e) = self.commit().await {
            // The store marked itself broken; healing drops what is held and cuts its links.
            tracing::warn!(error = %e, "store flush failed: run event acks are held until the store heals");
        }
    }
}
