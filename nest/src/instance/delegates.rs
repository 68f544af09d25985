//! The fleet [`Delegator`] of an instance: `call_agent` / `start_agent` go to the Nest over
//! the socket ([`ToNest::Child`]); the Nest asks the Hub and answers [`ToInstance::ChildReply`].
//!
//! Invariants: every request gets exactly one answer or a timeout; an answer for an unknown
//! request is ignored; the instance names only its own run (the Nest checks that it holds it).
//!
//! [`ToInstance::ChildReply`]: crate::socket::ToInstance::ChildReply

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use agen_harness::run::{ChildEnd, ChildRequest, Delegator, RunAssignment};
use tokio::sync::{mpsc, oneshot};

use crate::socket::{ChildCall, ChildOp, ChildReply, ToNest};

/// How long the Nest gets to answer, beyond the wait asked for.
const REPLY_SLACK: Duration = Duration::from_secs(30);

/// See the module doc. Shared by the instance's runs.
pub struct NestDelegator {
    to_nest: mpsc::UnboundedSender<ToNest>,
    next: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<ChildReply>>>,
}

impl NestDelegator {
    pub fn new(to_nest: mpsc::UnboundedSender<ToNest>) -> NestDelegator {
        NestDelegator {
            to_nest,
            next: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<ChildReply>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the Nest's answer to the request waiting for it.
    pub fn deliver(&self, reply: ChildReply) {
        match self.pending().remove(&reply.req) {
            Some(tx) => {
                let _ = tx.send(reply);
            }
            None => tracing::debug!(
                req = reply.req,
                "child reply for no pending request; ignored"
            ),
        }
    }

    async fn ask(
        &self,
        parent: &RunAssignment,
        op: ChildOp,
        within: Duration,
    ) -> Result<ChildReply, String> {
        let req = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending().insert(req, tx);
        let call = ChildCall {
            req,
            task_id: parent.task_id.as_str().to_string(),
            run_id: parent.run_id.as_str().to_string(),
            attempt: parent.attempt,
            op,
        };
        if self.to_nest.send(ToNest::Child(call)).is_err() {
            self.pending().remove(&req);
            return Err("the connection to the nest is closed".into());
        }
        let reply = match tokio::time::timeout(within + REPLY_SLACK, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err("the nest dropped the request".into()),
            Err(_) => {
                self.pending().remove(&req);
                return Err("the nest did not answer in time".into());
            }
        };
        match reply.error {
            Some(e) => Err(e),
            None => Ok(reply),
        }
    }
}

#[async_trait::async_trait]
impl Delegator for NestDelegator {
    async fn start(&self, parent: &RunAssignment, child: ChildRequest) -> Result<String, String> {
        let reply = self
            .ask(parent, ChildOp::Start(child), Duration::ZERO)
            .await?;
        reply
            .task_id
            .ok_or_else(|| "the nest answered without the child's task id".to_string())
    }

    async fn wait(
        &self,
        parent: &RunAssignment,
        task_id: &str,
        wait: Duration,
    ) -> Result<Option<ChildEnd>, String> {
        let op = ChildOp::Wait {
            child_task_id: task_id.to_string(),
            wait_ms: wait.as_millis() as u64,
        };
        Ok(self.ask(parent, op, wait).await?.end)
    }

    async fn cancel(
        &self,
        parent: &RunAssignment,
        task_id: &str,
        reason: &str,
    ) -> Result<(), String> {
        let op = ChildOp::Cancel {
            child_task_id: task_id.to_string(),
            reason: reason.to_string(),
        };
        self.ask(parent, op, Duration::ZERO).await.map(|_| ())
    }

    fn detached(&self) -> bool {
        true
    }

    fn suspend_after(&self) -> Option<Duration> {
        Some(super::SUSPEND_AFTER)
    }
}
