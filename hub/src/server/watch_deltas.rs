//! A `WatchTask` watcher's streamed frames (`WatchTaskRequest.deltas`): the task's pieces
//! coalesced by [`crate::core::deltas::DeltaFollower`], sent as `TaskEvent`s with `delta` set.

use agen_proto::v1 as pb;
use agen_shared::run::TurnDelta;

use super::convert;

/// Sends `frames` in order; false when the watcher is gone.
pub(super) async fn send(
    tx: &tokio::sync::mpsc::Sender<Result<pb::TaskEvent, tonic::Status>>,
    frames: Vec<TurnDelta>,
) -> bool {
    for f in frames {
        if tx.send(Ok(convert::delta_event(&f))).await.is_err() {
            return false;
        }
    }
    true
}
