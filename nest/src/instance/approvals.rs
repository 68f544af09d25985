//! The fleet [`Approver`] of an instance: an `ask` call waits in place for the Hub's decision
//! over the socket ([`ToInstance::ApprovalDecided`]) for [`super::SUSPEND_AFTER`], then its run
//! gives the slot back (`run.suspended`) and the Hub resumes it once decided; the harness has
//! already recorded `approval.requested` durably, which is what makes the Hub ask a person.
//!
//! Invariants: a decision is handed to the call it names (run id, call id and digest of the tool
//! and arguments) exactly once, never to a call with the same id and another digest; a
//! decision that arrives before the call waits for it (the Hub answers at once when it already
//! holds one) is kept until the call asks.
//!
//! [`ToInstance::ApprovalDecided`]: crate::socket::ToInstance::ApprovalDecided

use std::collections::HashMap;
use std::sync::Mutex;

use agen_contract::run::ApprovalDecided;
use agen_harness::run::{ApprovalDecision, ApprovalRequest, Approver};
use tokio::sync::oneshot;

/// One call: (run id, call id).
type Key = (String, String);

/// See the module doc. Shared by the instance's runs.
#[derive(Default)]
pub struct HubApprover {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The waiting call's sender and digest.
    waiting: HashMap<Key, (oneshot::Sender<ApprovalDecided>, String)>,
    early: HashMap<Key, ApprovalDecided>,
}

impl HubApprover {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the Hub's decision to the call waiting for it (or keeps it for that call).
    pub fn deliver(&self, run_id: &str, decided: ApprovalDecided) {
        let key = (run_id.to_string(), decided.call_id.clone());
        let mut inner = self.lock();
        // A waiter whose run gave its slot back is gone: its resumed attempt asks again and
        // takes the decision from `early`.
        let unclaimed = match inner.waiting.remove(&key) {
            Some((tx, digest)) if same_call(&digest, &decided.digest) => tx.send(decided).err(),
            Some(other) => {
                tracing::warn!(run_id, call_id = %decided.call_id, "a decision for another digest of this call id is not handed to the waiting call");
                inner.waiting.insert(key.clone(), other);
                Some(decided)
            }
            None => Some(decided),
        };
        if let Some(decided) = unclaimed {
            inner.early.insert(key, decided);
        }
    }
}

#[async_trait::async_trait]
impl Approver for HubApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalDecision {
        let d = self.decide_recorded(request).await;
        if d.approved {
            ApprovalDecision::Approved
        } else {
            ApprovalDecision::Denied(agen_harness::run::denial_text(&d))
        }
    }

    fn suspend_after(&self) -> Option<std::time::Duration> {
        Some(super::SUSPEND_AFTER)
    }

    async fn decide_recorded(&self, request: &ApprovalRequest) -> ApprovalDecided {
        let key = (request.run_id.clone(), request.call_id.clone());
        let rx = {
            let mut inner = self.lock();
            if let Some(d) = inner.early.remove(&key) {
                if same_call(&request.digest, &d.digest) {
                    return d;
                }
            }
            let (tx, rx) = oneshot::channel();
            inner
                .waiting
                .insert(key.clone(), (tx, request.digest.clone()));
            rx
        };
        match rx.await {
            Ok(d) => d,
            // The approver was dropped (the instance is going away): the run is cancelled
            // with it; this call stays undecided and is asked again on the resume.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Whether a decision with digest `decided` decides the call with digest `asked` (an empty
/// digest is a Hub or log from before digests: the call id alone).
fn same_call(asked: &str, decided: &str) -> bool {
    asked.is_empty() || decided.is_empty() || asked == decided
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            run_id: "run-1".into(),
            call_id: "c1".into(),
            tool: "ws.run".into(),
            arguments: serde_json::json!({}),
            digest: "d1".into(),
        }
    }

    #[tokio::test]
    async fn a_decision_for_a_waiter_that_gave_up_reaches_the_resumed_ask() {
        let approver = HubApprover::default();
        // The first attempt waits, then gives its slot back (its wait is dropped).
        let first = tokio::time::timeout(
            Duration::from_millis(20),
            approver.decide_recorded(&request()),
        )
        .await;
        assert!(first.is_err(), "nothing decided yet");
        // The decision arrives before the resumed attempt asks again.
        approver.deliver(
            "run-1",
            ApprovalDecided {
                call_id: "c1".into(),
                approved: true,
                reason: String::new(),
                by: "alice".into(),
                digest: "d1".into(),
                arguments: None,
            },
        );
        let again =
            tokio::time::timeout(Duration::from_secs(1), approver.decide_recorded(&request()))
                .await
                .expect("the resumed ask gets the decision");
        assert!(again.approved);
        assert_eq!(again.by, "alice");
    }

    #[tokio::test]
    async fn a_decision_for_another_digest_of_the_same_call_id_is_not_handed_over() {
        let approver = HubApprover::default();
        approver.deliver(
            "run-1",
            ApprovalDecided {
                call_id: "c1".into(),
                approved: true,
                reason: String::new(),
                by: "alice".into(),
                digest: "other arguments".into(),
                arguments: None,
            },
        );
        let asked = tokio::time::timeout(
            Duration::from_millis(50),
            approver.decide_recorded(&request()),
        )
        .await;
        assert!(asked.is_err(), "the call with digest d1 is still undecided");
    }
}
