//! What a `WatchTask` stream sends: the stored events from `from_seq`, then the live ones
//! until the task ends, and (`WatchTaskRequest.deltas`) the task's streamed pieces coalesced by
//! [`crate::core::deltas::DeltaFollower`], sent as `TaskEvent`s with `delta` set.

use std::sync::Arc;

use agen_contract::run::TurnDelta;
use agen_proto::v1 as pb;

use super::convert;
use crate::core::deltas::DeltaFollower;
use crate::core::tasks::watchers::TaskUpdates;
use crate::core::Core;
use crate::model::{TaskEventRec, TaskRec, TaskState};

type Tx = tokio::sync::mpsc::Sender<Result<pb::TaskEvent, tonic::Status>>;

/// Feeds one watcher: `stored` (read after `live` subscribed, so nothing falls between), then
/// what `live` and `deltas` bring, until the task ends, the Hub stops or the watcher leaves.
pub(super) async fn pump(
    core: Arc<Core>,
    task: TaskRec,
    stored: Vec<TaskEventRec>,
    mut live: TaskUpdates,
    mut deltas: DeltaFollower,
    from_seq: u64,
    tx: Tx,
) {
    let mut last = from_seq.saturating_sub(1);
    for e in &stored {
        // Replayed events carry the task as it was after each of them.
        let event = convert::task_event(e, &task);
        if tx
            .send(Ok(super::approvals::event_with_pending(&core, event)))
            .await
            .is_err()
        {
            return;
        }
        last = e.seq;
    }
    let is_end = |kind: &str, state: TaskState| kind == "task.state" && state.is_terminal();
    if task.state.is_terminal() {
        // Finished already: send whatever was stored after the snapshot, then end.
        let Ok(rest) = core.task_events(&task.task_id, last + 1) else {
            return;
        };
        for e in rest {
            if tx.send(Ok(convert::task_event(&e, &task))).await.is_err() {
                return;
            }
        }
        return;
    }
    loop {
        let next = tokio::select! {
            frames = deltas.next() => match send(&tx, frames).await {
                true => continue,
                false => return,
            },
            n = live.recv() => n,
            _ = core.stopping.cancelled() => return,
            _ = tx.closed() => return,
        };
        if !send(&tx, deltas.drain()).await {
            return;
        }
        match next {
            Ok(u) if u.task_id == task.task_id => {
                if u.event.seq <= last {
                    continue;
                }
                last = u.event.seq;
                let end = is_end(&u.event.kind, u.task.state);
                let event = convert::task_event(&u.event, &u.task);
                if tx
                    .send(Ok(super::approvals::event_with_pending(&core, event)))
                    .await
                    .is_err()
                    || end
                {
                    return;
                }
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                // Fell behind: catch up from the store.
                let Ok(missed) = core.task_events(&task.task_id, last + 1) else {
                    return;
                };
                let Ok(now) = core.get_task(&task.namespace, &task.task_id) else {
                    return;
                };
                for e in missed {
                    last = e.seq;
                    if tx.send(Ok(convert::task_event(&e, &now))).await.is_err() {
                        return;
                    }
                }
                if now.state.is_terminal() {
                    return;
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Sends `frames` in order; false when the watcher is gone.
pub(super) async fn send(tx: &Tx, frames: Vec<TurnDelta>) -> bool {
    for f in frames {
        if tx.send(Ok(convert::delta_event(&f))).await.is_err() {
            return false;
        }
    }
    true
}
