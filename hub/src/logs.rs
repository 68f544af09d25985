//! Log requests in flight: `ReadLogs` asks each Nest that runs a target instance for its kept
//! lines (a `LogRequest` on the Nest's stream), and the Nest answers over its own
//! `SendLogs` call, which [`LogRequests::deliver`] routes to the waiting reader by request id.
//!
//! Invariants: a request id is unguessable (uuid v4) and is answered only by the Nest it was
//! sent to (checked against the Nest's certificate on a TLS Hub); a request no Nest answers
//! within [`ANSWER_TIMEOUT`] is failed, so a reader never waits on a Nest that is gone; a
//! reader that goes away ends every Nest's answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

/// How long a Nest has to start answering a log request.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// One kept line of an instance or tool server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogLineRec {
    pub instance_id: String,
    pub server: String,
    pub at_ms: i64,
    pub level: String,
    pub text: String,
    pub nest: String,
}

/// What a reader receives.
#[derive(Debug, Clone, PartialEq)]
pub enum LogItem {
    Line(LogLineRec),
    /// A Nest started answering: it keeps logs of the instance (its lines follow).
    Found {
        instance_id: String,
        nest: String,
    },
    /// One instance's logs cannot be read (the Nest's reason).
    Failed {
        instance_id: String,
        nest: String,
        message: String,
        /// The Nest keeps no logs of the instance (a searched Nest that never had it).
        not_kept: bool,
    },
}

struct Pending {
    nest_id: String,
    nest_name: String,
    instance_id: String,
    tx: mpsc::Sender<LogItem>,
    answered: bool,
}

/// The log requests waiting for their Nest's answer. Shared by both gRPC services.
#[derive(Default)]
pub struct LogRequests {
    pending: Mutex<HashMap<String, Pending>>,
}

/// Why an answer was refused.
#[derive(Debug, PartialEq)]
pub enum DeliverError {
    /// No such request (never made, timed out, or its reader went away).
    Unknown,
    /// The request was sent to another Nest.
    WrongNest,
}

/// The Nest-facing half of one request, held by the `SendLogs` handler.
pub struct Answer {
    tx: mpsc::Sender<LogItem>,
    instance_id: String,
    nest_name: String,
}

impl Answer {
    /// Sends one line, stamped with the Nest's name; `false` when the reader is gone.
    pub async fn line(&self, mut line: LogLineRec) -> bool {
        line.instance_id.clone_from(&self.instance_id);
        line.nest.clone_from(&self.nest_name);
        self.tx.send(LogItem::Line(line)).await.is_ok()
    }

    /// The Nest keeps the instance's logs and starts sending them.
    pub async fn found(&self) -> bool {
        self.tx
            .send(LogItem::Found {
                instance_id: self.instance_id.clone(),
                nest: self.nest_name.clone(),
            })
            .await
            .is_ok()
    }

    /// The Nest cannot serve the request (`not_kept`: it has no logs of the instance).
    pub async fn failed(&self, message: String, not_kept: bool) {
        let _ = self
            .tx
            .send(LogItem::Failed {
                instance_id: self.instance_id.clone(),
                nest: self.nest_name.clone(),
                message,
                not_kept,
            })
            .await;
    }

    /// Resolves when the reader is gone.
    pub async fn reader_gone(&self) {
        self.tx.closed().await
    }
}

impl LogRequests {
    pub fn new() -> Arc<LogRequests> {
        Arc::new(LogRequests::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a request for `instance_id` on `nest_id`; returns its id. Answers go to `tx`.
    pub fn open(
        self: &Arc<Self>,
        nest_id: &str,
        nest_name: &str,
        instance_id: &str,
        tx: mpsc::Sender<LogItem>,
    ) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        self.lock().insert(
            id.clone(),
            Pending {
                nest_id: nest_id.to_string(),
                nest_name: nest_name.to_string(),
                instance_id: instance_id.to_string(),
                tx,
                answered: false,
            },
        );
        let (me, rid) = (self.clone(), id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(ANSWER_TIMEOUT).await;
            let late = {
                let mut map = me.lock();
                match map.get(&rid) {
                    Some(p) if !p.answered => map.remove(&rid),
                    _ => None,
                }
            };
            if let Some(p) = late {
                let _ = p
                    .tx
                    .send(LogItem::Failed {
                        instance_id: p.instance_id.clone(),
                        nest: p.nest_name.clone(),
                        not_kept: false,
                        message: format!(
                            "nest {} did not answer the log request for instance {} within {}s; check that it is connected (`agen nests`)",
                            p.nest_name,
                            p.instance_id,
                            ANSWER_TIMEOUT.as_secs()
                        ),
                    })
                    .await;
            }
        });
        id
    }

    /// Forgets a request that could not be sent.
    pub fn cancel(&self, request_id: &str) {
        self.lock().remove(request_id);
    }

    /// Takes the request `request_id` for the Nest answering it (`None` on a plaintext Hub,
    /// which cannot tell Nests apart and relies on the id alone).
    pub fn deliver(&self, request_id: &str, nest_id: Option<&str>) -> Result<Answer, DeliverError> {
        let mut map = self.lock();
        let p = map.get_mut(request_id).ok_or(DeliverError::Unknown)?;
        if nest_id.is_some_and(|n| n != p.nest_id) {
            return Err(DeliverError::WrongNest);
        }
        if p.answered {
            return Err(DeliverError::Unknown);
        }
        p.answered = true;
        let answer = Answer {
            tx: p.tx.clone(),
            instance_id: p.instance_id.clone(),
            nest_name: p.nest_name.clone(),
        };
        map.remove(request_id);
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_goes_only_to_its_request_from_its_nest_once() {
        let reqs = LogRequests::new();
        let (tx, mut rx) = mpsc::channel(4);
        let id = reqs.open("nest-a", "a", "i-1", tx);
        assert!(matches!(
            reqs.deliver("guess", None),
            Err(DeliverError::Unknown)
        ));
        assert!(matches!(
            reqs.deliver(&id, Some("nest-b")),
            Err(DeliverError::WrongNest)
        ));
        let answer = reqs.deliver(&id, Some("nest-a")).expect("answer");
        assert!(matches!(
            reqs.deliver(&id, Some("nest-a")),
            Err(DeliverError::Unknown)
        ));
        assert!(
            answer
                .line(LogLineRec {
                    text: "hi".into(),
                    ..Default::default()
                })
                .await
        );
        let Some(LogItem::Line(line)) = rx.recv().await else {
            panic!("expected a line");
        };
        assert_eq!(
            (line.instance_id.as_str(), line.nest.as_str()),
            ("i-1", "a")
        );
    }
}
