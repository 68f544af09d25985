//! Webhooks of tasks: the targets a submit named and the one its deployment names
//! (`deployment_webhooks`), stored with the task in the `webhooks` table (one record per task,
//! written in the submit's commit), and [`Core::run_webhooks`],
//! the loop that turns a task's end (and, for targets that ask, its waiting for an approval)
//! into deliveries and delivers them ([`crate::webhooks`]: body, signature, outbound rule).
//!
//! Invariants: a delivery is made once per event and target and stored (flushed) before its
//! first attempt, so a Hub restart neither loses nor duplicates it; every attempt is recorded
//! in it (`agen tasks webhooks TASK`); attempts back off 1 s, 2 s, 4 s … up to 10 minutes
//! and stop 24 h after the delivery was made (`failed`); at most
//! [`crate::webhooks::MAX_CONCURRENT_DELIVERIES`] attempts are in flight. The secret is read
//! at each attempt (a submit's: the namespace's platform secret [`SUBMIT_SECRET`]; a
//! deployment's: the platform secret it names).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::error::{HubError, Result};
use crate::model::{now_ms, TaskRec, TaskState};
use crate::store::Table;
use crate::webhooks::{self as wire, Payload, PayloadTask};

/// The platform secret of a namespace that signs the webhooks its submits name.
pub const SUBMIT_SECRET: &str = "AGEN_WEBHOOK_SECRET";
/// Deliveries are retried for this long.
pub const RETRY_FOR_MS: i64 = 24 * 3600 * 1000;
const MAX_BACKOFF_MS: i64 = 600_000;
const TICK: Duration = Duration::from_millis(250);

/// A URL a task's events go to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WebhookTarget {
    pub url: String,
    #[serde(default)]
    pub on_waiting: bool,
    /// The platform secret (of the task's namespace) that signs its deliveries.
    pub secret: String,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }
}

/// One event for one target, with its attempts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delivery {
    pub delivery_id: String,
    pub target: usize,
    pub event: String,
    pub body: String,
    pub created_at_ms: i64,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_attempt_at_ms: i64,
    #[serde(default)]
    pub last_status: u16,
    #[serde(default)]
    pub last_error: String,
    #[serde(default)]
    pub delivered_at_ms: i64,
}

/// A task's webhooks (`webhooks`: task id).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WebhookRec {
    pub namespace: String,
    pub task_id: String,
    pub targets: Vec<WebhookTarget>,
    #[serde(default)]
    pub deliveries: Vec<Delivery>,
    /// The end was turned into deliveries.
    #[serde(default)]
    pub ended: bool,
    /// The current wait was turned into deliveries (cleared when the task runs again).
    #[serde(default)]
    pub waiting_told: bool,
}

impl WebhookRec {
    pub fn new(task: &TaskRec, targets: Vec<WebhookTarget>) -> WebhookRec {
        WebhookRec {
            namespace: task.namespace.clone(),
            task_id: task.task_id.clone(),
            targets,
            deliveries: Vec::new(),
            ended: false,
            waiting_told: false,
        }
    }

    fn open(&self) -> bool {
        !self.ended
            || self
                .deliveries
                .iter()
                .any(|d| d.state == DeliveryState::Pending)
    }
}

/// The webhooks' loop state: the tasks whose record is still open (read from the store once,
/// at the first pass; a submit adds its task), so a pass never reads the closed ones.
#[derive(Default)]
pub struct Webhooks {
    pub(crate) wake: tokio::sync::Notify,
    open: std::sync::Mutex<Option<std::collections::BTreeSet<String>>>,
}

impl Webhooks {
    /// A task with webhooks was stored.
    pub(crate) fn opened(&self, task_id: &str) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = open.as_mut() {
            set.insert(task_id.to_string());
        }
    }
}

fn payload(task: &TaskRec, event: &str, delivery_id: &str) -> String {
    let outcome = task.outcome.clone().unwrap_or_default();
    Payload {
        kind: event.to_string(),
        delivery_id: delivery_id.to_string(),
        task: PayloadTask {
            task_id: task.task_id.clone(),
            namespace: task.namespace.clone(),
            deployment: task.deployment.clone(),
            state: task.state.as_str().to_string(),
            response_type: outcome.response_type,
            result: outcome.result,
            result_truncated: false,
            error: outcome.error,
            labels: task.labels.clone(),
            conversation_key: task.conversation_key.clone(),
            created_at_ms: task.created_at_ms,
            finished_at_ms: task.finished_at_ms,
        },
    }
    .to_body()
}

/// The back-off after `attempts` failed attempts.
pub fn backoff_ms(attempts: u32) -> i64 {
    (1000i64 << attempts.saturating_sub(1).min(20)).min(MAX_BACKOFF_MS)
}

/// The deliveries whose attempt is due, `(record, delivery)`, oldest record first, at most
/// [`wire::MAX_CONCURRENT_DELIVERIES`] (the rest wait for a later pass).
fn due_attempts(recs: &[WebhookRec], now: i64) -> Vec<(usize, usize)> {
    let mut due = Vec::new();
    for (r, rec) in recs.iter().enumerate() {
        for (d, del) in rec.deliveries.iter().enumerate() {
            if del.state == DeliveryState::Pending && del.next_attempt_at_ms <= now {
                due.push((r, d));
            }
        }
    }
    due.truncate(wire::MAX_CONCURRENT_DELIVERIES);
    due
}

impl Core {
    /// The webhook deployment `name` names, if any.
    fn deployment_webhook(&self, namespace: &str, name: &str) -> Result<Option<WebhookTarget>> {
        Ok(self.db.get_json(
            Table::DeploymentWebhooks,
            &format!("{namespace}\u{0}{name}"),
        )?)
    }

    /// A task's targets: the submit's, then its deployment's (read under the submit's lock).
    pub(crate) fn webhooks_of_task(
        &self,
        task: &TaskRec,
        submitted: &[WebhookTarget],
    ) -> Result<Vec<WebhookTarget>> {
        let mut all = submitted.to_vec();
        all.extend(self.deployment_webhook(&task.namespace, &task.deployment)?);
        Ok(all)
    }

    /// Checks the webhook a `CreateDeployment` names (form, the secret set in the namespace).
    pub fn check_deployment_webhook(
        &self,
        namespace: &str,
        url: &str,
        on_waiting: bool,
        secret: &str,
    ) -> Result<Option<WebhookTarget>> {
        if url.is_empty() {
            return Ok(None);
        }
        wire::check_url("webhook.url", url)?;
        let namespace = crate::core::namespace_or_default(namespace);
        crate::secrets::validate_secret_name("webhook_secret", secret)?;
        let names = [secret.to_string()];
        if self.secrets.values(&namespace, names.iter())?.0.is_empty() {
            return Err(HubError::FailedPrecondition(format!(
                "webhook_secret: secret {secret} is not set in namespace {namespace}; set it with `agen secrets set {secret} --namespace {namespace}`"
            )));
        }
        Ok(Some(WebhookTarget {
            url: url.to_string(),
            on_waiting,
            secret: secret.to_string(),
        }))
    }

    /// Stores (or, with `None`, removes) the webhook of deployment `name`; its tasks submitted
    /// from now on carry it.
    pub async fn set_deployment_webhook(
        &self,
        namespace: &str,
        name: &str,
        hook: Option<WebhookTarget>,
    ) -> Result<()> {
        let key = format!(
            "{}\u{0}{name}",
            crate::core::namespace_or_default(namespace)
        );
        match hook {
            Some(h) => self.db.put_json(Table::DeploymentWebhooks, &key, &h)?,
            None => self.db.remove(Table::DeploymentWebhooks, &key)?,
        }
        self.commit().await
    }

    /// Checks the webhooks a submit names (form, count with the deployment's, the namespace's
    /// signing secret) and returns them as targets.
    pub fn submit_webhooks(
        &self,
        namespace: &str,
        deployment: &str,
        urls: Vec<(String, bool)>,
    ) -> Result<Vec<WebhookTarget>> {
        if urls.is_empty() {
            return Ok(Vec::new());
        }
        let ns = crate::core::namespace_or_default(namespace);
        let total = urls.len() + usize::from(self.deployment_webhook(&ns, deployment)?.is_some());
        if total > wire::MAX_WEBHOOKS_PER_TASK {
            return Err(HubError::invalid(format!(
                "webhooks: {total} webhooks is over the limit of {} per task",
                wire::MAX_WEBHOOKS_PER_TASK
            )));
        }
        for (i, (url, _)) in urls.iter().enumerate() {
            wire::check_url(&format!("webhooks[{i}].url"), url)?;
        }
        let namespace = crate::core::namespace_or_default(namespace);
        let names = [SUBMIT_SECRET.to_string()];
        if self.secrets.values(&namespace, names.iter())?.0.is_empty() {
            return Err(HubError::FailedPrecondition(format!(
                "webhooks: namespace {namespace} has no webhook secret to sign deliveries with; set one with `agen secrets set {SUBMIT_SECRET} --namespace {namespace}`"
            )));
        }
        Ok(urls
            .into_iter()
            .map(|(url, on_waiting)| WebhookTarget {
                url,
                on_waiting,
                secret: SUBMIT_SECRET.to_string(),
            })
            .collect())
    }

    /// The deliveries of a task, oldest first, with the URL each went to.
    pub fn task_webhooks(&self, namespace: &str, task_id: &str) -> Result<Vec<(String, Delivery)>> {
        let task = self.get_task(namespace, task_id)?;
        let rec = self
            .db
            .get_json::<WebhookRec>(Table::Webhooks, &task.task_id)?;
        Ok(rec
            .map(|r| {
                r.deliveries
                    .iter()
                    .map(|d| {
                        let url = r.targets.get(d.target).map(|t| t.url.clone());
                        (url.unwrap_or_default(), d.clone())
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Runs until `shutdown`: makes and delivers the deliveries of every task with webhooks.
    pub async fn run_webhooks(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
                _ = self.webhooks.wake.notified() => {}
            }
            if !self.is_leader() || self.store_broken().is_some() {
                continue;
            }
            if let Err(e) = self.webhooks_pass().await {
                tracing::warn!(error = %e, "webhooks: a pass failed; retrying");
            }
        }
    }

    async fn webhooks_pass(&self) -> Result<()> {
        let now = now_ms();
        let ids: Vec<String> = {
            let mut open = self.webhooks.open.lock().unwrap_or_else(|p| p.into_inner());
            if open.is_none() {
                let all: Vec<WebhookRec> = self.db.list_json(Table::Webhooks, b"")?;
                *open = Some(
                    all.into_iter()
                        .filter(|r| r.open())
                        .map(|r| r.task_id)
                        .collect(),
                );
            }
            open.iter().flatten().cloned().collect()
        };
        let mut recs = Vec::new();
        for id in ids {
            match self.db.get_json::<WebhookRec>(Table::Webhooks, &id)? {
                Some(r) if r.open() => recs.push(r),
                _ => {
                    let mut open = self.webhooks.open.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(set) = open.as_mut() {
                        set.remove(&id);
                    }
                }
            }
        }
        // New deliveries first, stored before any attempt.
        let mut made = false;
        for rec in recs.iter_mut() {
            let task = self.lock().tasks.get(&rec.task_id).cloned();
            let Some(task) = task else {
                // Removed by retention: nothing more will happen to it.
                rec.ended = true;
                self.db
                    .put_json(Table::Webhooks, &rec.task_id.clone(), &*rec)?;
                made = true;
                continue;
            };
            let mut events = Vec::new();
            if task.state.is_terminal() && !rec.ended {
                rec.ended = true;
                events.push(("task.ended", false));
            } else if task.state == TaskState::Waiting && !rec.waiting_told {
                rec.waiting_told = true;
                events.push(("task.waiting", true));
            } else if task.state != TaskState::Waiting && rec.waiting_told && !rec.ended {
                rec.waiting_told = false;
            } else {
                continue;
            }
            for (event, waiting) in events {
                for (i, target) in rec.targets.iter().enumerate() {
                    if waiting && !target.on_waiting {
                        continue;
                    }
                    let id = format!("whd-{}", uuid::Uuid::now_v7().simple());
                    rec.deliveries.push(Delivery {
                        body: payload(&task, event, &id),
                        delivery_id: id,
                        target: i,
                        event: event.to_string(),
                        created_at_ms: now,
                        state: DeliveryState::Pending,
                        attempts: 0,
                        next_attempt_at_ms: now,
                        last_status: 0,
                        last_error: String::new(),
                        delivered_at_ms: 0,
                    });
                }
            }
            self.db
                .put_json(Table::Webhooks, &rec.task_id.clone(), &*rec)?;
            made = true;
        }
        if made {
            self.commit().await?;
        }
        // Then the attempts that are due, at most MAX_CONCURRENT_DELIVERIES at once.
        let due = due_attempts(&recs, now);
        if due.is_empty() {
            return Ok(());
        }
        let attempts = due.iter().map(|&(r, d)| {
            let rec = &recs[r];
            let del = &rec.deliveries[d];
            let target = rec.targets.get(del.target).cloned();
            let secret = target.as_ref().map(|t| {
                self.secrets
                    .values(&rec.namespace, std::iter::once(&t.secret))
                    .map(|v| v.0.into_values().next())
            });
            let rules = &self.opts.webhook_allow;
            async move {
                let target = target.ok_or("the delivery's target is gone")?;
                let secret = match secret {
                    Some(Ok(Some(s))) => s,
                    Some(Ok(None)) => {
                        return Err(format!(
                            "the secret {} is not set in namespace {}",
                            target.secret, rec.namespace
                        ))
                    }
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err("no target".into()),
                };
                wire::send(
                    &target.url,
                    rules,
                    secret.as_bytes(),
                    &del.event,
                    &del.delivery_id,
                    &del.body,
                )
                .await
            }
        });
        let results = futures::future::join_all(attempts).await;
        let done = now_ms();
        let mut touched = std::collections::BTreeSet::new();
        for (&(r, d), result) in due.iter().zip(results) {
            let rec = &mut recs[r];
            let del = &mut rec.deliveries[d];
            del.attempts += 1;
            match result {
                Ok(status) if (200..300).contains(&status) => {
                    del.state = DeliveryState::Delivered;
                    del.last_status = status;
                    del.last_error.clear();
                    del.delivered_at_ms = done;
                }
                other => {
                    let (status, error) = match other {
                        Ok(s) => (s, format!("HTTP {s}")),
                        Err(e) => (0, e),
                    };
                    del.last_status = status;
                    del.last_error = crate::limits::cut(&error, 1024);
                    if done - del.created_at_ms >= RETRY_FOR_MS {
                        del.state = DeliveryState::Failed;
                    } else {
                        del.next_attempt_at_ms = done + backoff_ms(del.attempts);
                    }
                    tracing::info!(task = %rec.task_id, delivery = %del.delivery_id, attempt = del.attempts, error = %del.last_error, "webhook delivery failed; retrying later");
                }
            }
            touched.insert(r);
        }
        for r in touched {
            let rec = &recs[r];
            self.db.put_json(Table::Webhooks, &rec.task_id, rec)?;
        }
        self.commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(result: String) -> TaskRec {
        let mut t: TaskRec = serde_json::from_value(serde_json::json!({
            "task_id": "task-1", "namespace": "default", "deployment": "d", "input": "hi",
            "labels": {}, "conversation_key": "", "conversation_id": "c", "state": "succeeded",
            "activity": "", "progress": null, "outcome": null, "run_id": "", "attempt": 1,
            "instance_id": "", "bundle_digest": "", "client_request_id": "",
            "created_at_ms": 1, "updated_at_ms": 2, "started_at_ms": 1, "finished_at_ms": 2,
            "nest_name": "", "seq": 1, "next_event_seq": 1,
        }))
        .expect("a task record");
        t.outcome = Some(crate::model::OutcomeRec {
            result,
            response_type: "text".into(),
            error: String::new(),
        });
        t
    }

    #[tokio::test]
    async fn a_wait_and_an_end_make_one_delivery_per_target_that_asks_and_are_recorded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = crate::core::test_core(dir.path());
        let mut t = task("done".into());
        t.state = TaskState::Waiting;
        core.lock().tasks.insert(t.clone());
        core.set_secret("default", SUBMIT_SECRET, b"s3cret")
            .await
            .expect("secret");
        let target = |url: &str, on_waiting| WebhookTarget {
            url: url.into(),
            on_waiting,
            secret: SUBMIT_SECRET.into(),
        };
        // Loopback without --webhook-allow: refused at the attempt, never connected to.
        let rec = WebhookRec::new(
            &t,
            vec![
                target("https://127.0.0.1:1/a", true),
                target("https://127.0.0.1:1/b", false),
            ],
        );
        core.db
            .put_json(Table::Webhooks, &t.task_id, &rec)
            .expect("put");
        let read = |core: &Core| -> WebhookRec {
            core.db
                .get_json(Table::Webhooks, "task-1")
                .expect("get")
                .expect("rec")
        };
        core.webhooks_pass().await.expect("pass");
        core.webhooks_pass().await.expect("pass again");
        let got = read(&core);
        let events: Vec<(String, usize)> = got
            .deliveries
            .iter()
            .map(|d| (d.event.clone(), d.target))
            .collect();
        assert_eq!(events, [("task.waiting".to_string(), 0)]);
        let d = &got.deliveries[0];
        assert_eq!((d.attempts, d.state), (1, DeliveryState::Pending));
        assert!(
            d.last_error
                .starts_with("refused: 127.0.0.1 resolves to 127.0.0.1:1"),
            "{}",
            d.last_error
        );
        // It ends: one `task.ended` per target, once however many passes run.
        t.state = TaskState::Succeeded;
        core.lock().tasks.insert(t);
        core.webhooks_pass().await.expect("pass");
        core.webhooks_pass().await.expect("pass again");
        let events: Vec<(String, usize)> = read(&core)
            .deliveries
            .iter()
            .map(|d| (d.event.clone(), d.target))
            .collect();
        assert_eq!(
            events,
            [
                ("task.waiting".to_string(), 0),
                ("task.ended".to_string(), 0),
                ("task.ended".to_string(), 1)
            ]
        );
    }

    #[tokio::test]
    async fn a_delivery_failing_for_24_hours_is_given_up_and_a_younger_one_backs_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = crate::core::test_core(dir.path());
        let t = task("done".into());
        core.lock().tasks.insert(t.clone());
        core.set_secret("default", SUBMIT_SECRET, b"s3cret")
            .await
            .expect("secret");
        let mut rec = WebhookRec::new(
            &t,
            vec![WebhookTarget {
                // Loopback without --webhook-allow: every attempt fails.
                url: "https://127.0.0.1:1/hook".into(),
                on_waiting: false,
                secret: SUBMIT_SECRET.into(),
            }],
        );
        rec.ended = true;
        let now = now_ms();
        for (id, created) in [
            ("whd-old", now - RETRY_FOR_MS - 1),
            ("whd-young", now - 1000),
        ] {
            rec.deliveries.push(Delivery {
                delivery_id: id.into(),
                target: 0,
                event: "task.ended".into(),
                body: "{}".into(),
                created_at_ms: created,
                state: DeliveryState::Pending,
                attempts: 3,
                next_attempt_at_ms: 0,
                last_status: 0,
                last_error: String::new(),
                delivered_at_ms: 0,
            });
        }
        core.db
            .put_json(Table::Webhooks, &t.task_id, &rec)
            .expect("put");
        core.webhooks_pass().await.expect("pass");
        core.webhooks_pass().await.expect("pass again");
        let got: WebhookRec = core
            .db
            .get_json(Table::Webhooks, "task-1")
            .expect("get")
            .expect("rec");
        let old = &got.deliveries[0];
        assert_eq!(
            (old.state, old.attempts),
            (DeliveryState::Failed, 4),
            "{old:?}"
        );
        assert!(old.last_error.starts_with("refused"), "{old:?}");
        let young = &got.deliveries[1];
        assert_eq!(
            (young.state, young.attempts),
            (DeliveryState::Pending, 4),
            "{young:?}"
        );
        assert!(
            young.next_attempt_at_ms >= now + backoff_ms(4) - 1000,
            "the next attempt waits its back-off: {young:?}"
        );
        // Failed is final: no more attempts, and the record is no longer open.
        assert!(got.open(), "the young delivery keeps the record open");
        let mut gone = got.clone();
        gone.deliveries.truncate(1);
        assert!(!gone.open());
    }

    #[test]
    fn deliveries_in_flight_are_capped_and_a_long_result_is_cut() {
        let t = task("r".repeat(wire::MAX_PAYLOAD_BYTES + 1));
        let body = payload(&t, "task.ended", "whd-1");
        assert!(body.len() <= wire::MAX_PAYLOAD_BYTES, "{}", body.len());
        let back: Payload = serde_json::from_str(&body).expect("json");
        assert!(back.task.result_truncated);
        let short: Payload =
            serde_json::from_str(&payload(&task("done".into()), "task.ended", "whd-2"))
                .expect("json");
        assert_eq!(
            (short.task.result.as_str(), short.task.result_truncated),
            ("done", false)
        );

        let targets = (0..4)
            .map(|i| WebhookTarget {
                url: format!("https://example.com/{i}"),
                on_waiting: false,
                secret: SUBMIT_SECRET.into(),
            })
            .collect();
        let mut rec = WebhookRec::new(&t, targets);
        for i in 0..(wire::MAX_CONCURRENT_DELIVERIES + 1) {
            rec.deliveries.push(Delivery {
                delivery_id: format!("whd-{i}"),
                target: i % 4,
                event: "task.ended".into(),
                body: String::new(),
                created_at_ms: 0,
                state: DeliveryState::Pending,
                attempts: 0,
                next_attempt_at_ms: 10,
                last_status: 0,
                last_error: String::new(),
                delivered_at_ms: 0,
            });
        }
        let recs = vec![rec];
        assert_eq!(
            due_attempts(&recs, 10).len(),
            wire::MAX_CONCURRENT_DELIVERIES
        );
        assert_eq!(due_attempts(&recs, 9).len(), 0, "not due before its time");
        assert_eq!(
            (1..=6).map(backoff_ms).collect::<Vec<_>>(),
            [1000, 2000, 4000, 8000, 16000, 32000]
        );
        assert_eq!(backoff_ms(40), MAX_BACKOFF_MS);
    }
}
