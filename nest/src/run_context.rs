//! A run's context (its conversation history and the replay of earlier attempts), fetched from
//! the Hub over `FetchRunContext` when an `AssignRun` says `context_by_fetch`, before the run is
//! handed to its instance: the context never travels inside the Connect stream.
//!
//! Invariants: a run with a context never starts without it. A fetch that fails for a reason
//! that may pass (the Hub unreachable, a broken answer) is retried [`ATTEMPTS`] times with
//! back-off; then, or at once when the Hub refuses (not the lease holder, no such run), the run
//! is reported `run.interrupted` (cause `context_unavailable`, the reason naming the fetch) so
//! that the Hub hands it out again. An answer over [`MAX_CONTEXT_BYTES`], or whose parts do not
//! add up to the totals its first chunk announced, is refused. A `CancelRun` that arrives while
//! the context is on its way ends the fetch, and the run never starts (reported interrupted, so
//! that the Hub ends the cancelled task at once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_contract::run::{RunEventBody, RunInterrupted};
use tokio_util::sync::CancellationToken;

use crate::hub_client::HubClient;
use crate::model::{AssignedRun, ContextChunk, RunEvent};
use crate::outbox::Outbox;
use crate::supervisor::Supervisor;

/// Fetches per run before it is reported interrupted.
pub const ATTEMPTS: u32 = 4;
/// The first retry's delay; each next one doubles it (250 ms, 500 ms, 1 s: the Hub's
/// reconciliation grace is longer than the whole budget).
const RETRY_BASE: Duration = Duration::from_millis(250);
/// The largest context (history + replay) a Nest accepts: far above the Hub's history quota
/// (32 MiB per conversation by default) plus a replay.
pub const MAX_CONTEXT_BYTES: u64 = 512 * 1024 * 1024;

/// The cause of the `run.interrupted` sent when the context cannot be fetched.
pub const CAUSE: &str = "context_unavailable";

/// Runs whose context is on its way, by run id (with the attempt), so that a `CancelRun`
/// that reaches the Nest first stops the fetch.
#[derive(Debug, Default)]
pub struct Fetching(Mutex<HashMap<String, (u32, CancellationToken)>>);

impl Fetching {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u32, CancellationToken)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self, run_id: &str, attempt: u32) -> CancellationToken {
        let token = CancellationToken::new();
        self.lock()
            .insert(run_id.to_string(), (attempt, token.clone()));
        token
    }

    fn done(&self, run_id: &str, attempt: u32) {
        let mut map = self.lock();
        if map.get(run_id).is_some_and(|(a, _)| *a == attempt) {
            map.remove(run_id);
        }
    }

    /// Stops the fetch of `run_id`'s context, if one is on its way; says whether it was.
    pub fn cancel(&self, run_id: &str) -> bool {
        match self.lock().remove(run_id) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// Hands `a` to its instance: at once when it has no context, else after fetching it (in a
/// task of its own, so the link keeps reading).
pub fn assign(
    client: HubClient,
    sup: Arc<Supervisor>,
    outbox: Arc<Outbox>,
    fetching: Arc<Fetching>,
    a: AssignedRun,
) {
    if !a.context_by_fetch {
        sup.assign(a);
        return;
    }
    let cancelled = fetching.start(a.run_id.as_str(), a.attempt.0);
    tokio::spawn(async move {
        let mut a = a;
        let got = tokio::select! {
            got = fetch_or_interrupt(client, &a) => got,
            _ = cancelled.cancelled() => {
                tracing::info!(run = %a.run_id, attempt = a.attempt.0, "run cancelled before its context arrived; it never starts");
                Err(interrupted(&a, "the run was cancelled before its context arrived; it never started"))
            }
        };
        fetching.done(a.run_id.as_str(), a.attempt.0);
        match got {
            Ok(Context { history, replay }) => {
                a.history_json = history;
                a.replay_json = replay;
                match crate::refused_run::unusable(&a) {
                    None => sup.assign(a),
                    Some(why) => crate::refused_run::refuse(&outbox, &a, &why),
                }
            }
            Err(event) => outbox.push(a.instance_id.as_str(), event),
        }
    });
}

/// The context of `a`, or the `run.interrupted` to send instead (the run never starts).
pub async fn fetch_or_interrupt(client: HubClient, a: &AssignedRun) -> Result<Context, RunEvent> {
    fetch_with_retries(client, a).await.map_err(|why| {
        tracing::warn!(run = %a.run_id, attempt = a.attempt.0, "{why}; the run is handed back to the hub");
        interrupted(a, &why)
    })
}

/// A run's context as the JSON text `agen_contract::run::wire` reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    pub history: String,
    pub replay: String,
}

async fn fetch_with_retries(client: HubClient, a: &AssignedRun) -> Result<Context, String> {
    let mut delay = RETRY_BASE;
    let mut tries = 0;
    loop {
        tries += 1;
        match fetch(client.clone(), a).await {
            Ok(c) => return Ok(c),
            Err(Failure::Refused(why)) => {
                return Err(format!(
                    "the hub refused the context of run {} attempt {}: {why}",
                    a.run_id, a.attempt
                ))
            }
            Err(Failure::Transient(why)) if tries >= ATTEMPTS => {
                return Err(format!(
                    "fetching the context of run {} attempt {} failed {tries} times (last: {why})",
                    a.run_id, a.attempt
                ))
            }
            Err(Failure::Transient(why)) => {
                tracing::info!(run = %a.run_id, attempt = a.attempt.0, "fetching the run's context failed: {why}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}

enum Failure {
    /// The Hub will not give it (not the lease holder, no such run): no retry.
    Refused(String),
    /// May pass: the Hub unreachable, the stream broken, a bad answer.
    Transient(String),
}

async fn fetch(mut client: HubClient, a: &AssignedRun) -> Result<Context, Failure> {
    let failure = |e: crate::hub_client::CallError| match e.is_refusal() {
        true => Failure::Refused(e.to_string()),
        false => Failure::Transient(e.to_string()),
    };
    let mut stream = client
        .fetch_run_context(&a.lease())
        .await
        .map_err(failure)?;
    let mut parts = Assembler::default();
    while let Some(chunk) = stream.next().await.map_err(failure)? {
        parts.push(chunk).map_err(Failure::Transient)?;
    }
    parts.finish().map_err(Failure::Transient)
}

/// Puts a context together from its chunks and checks it against the announced totals.
#[derive(Debug, Default)]
pub struct Assembler {
    sizes: Option<(u64, u64)>,
    history: Vec<u8>,
    replay: Vec<u8>,
}

impl Assembler {
    pub fn push(&mut self, c: ContextChunk) -> Result<(), String> {
        let (history_size, replay_size) = match self.sizes {
            Some(s) => s,
            None => {
                let total = c.history_size.saturating_add(c.replay_size);
                if total > MAX_CONTEXT_BYTES {
                    return Err(format!(
                        "run context: {total} bytes is over the limit of {MAX_CONTEXT_BYTES} bytes"
                    ));
                }
                self.sizes = Some((c.history_size, c.replay_size));
                (c.history_size, c.replay_size)
            }
        };
        if (self.history.len() + c.history.len()) as u64 > history_size
            || (self.replay.len() + c.replay.len()) as u64 > replay_size
        {
            return Err(format!(
                "run context: the hub sent more than the {history_size} + {replay_size} bytes it announced"
            ));
        }
        self.history.extend_from_slice(&c.history);
        self.replay.extend_from_slice(&c.replay);
        Ok(())
    }

    pub fn finish(self) -> Result<Context, String> {
        let Some((history_size, replay_size)) = self.sizes else {
            return Err("run context: the hub's answer ended before its first chunk".into());
        };
        if self.history.len() as u64 != history_size || self.replay.len() as u64 != replay_size {
            return Err(format!(
                "run context: the answer ended after {} + {} of the {history_size} + {replay_size} bytes announced",
                self.history.len(),
                self.replay.len()
            ));
        }
        let text = |b: Vec<u8>, what: &str| {
            String::from_utf8(b).map_err(|e| format!("run context: the {what} is not UTF-8: {e}"))
        };
        Ok(Context {
            history: text(self.history, "history")?,
            replay: text(self.replay, "replay")?,
        })
    }
}

/// The `run.interrupted` of a run whose context could not be fetched: its instance never saw
/// it, so it is the attempt's first event.
fn interrupted(a: &AssignedRun, why: &str) -> RunEvent {
    RunEvent {
        run_id: a.run_id.0.clone(),
        attempt: a.attempt.0,
        seq: 1,
        task_id: a.task_id.0.clone(),
        at_ms: chrono::Utc::now().timestamp_millis(),
        body: RunEventBody::RunInterrupted(RunInterrupted {
            reason: why.to_string(),
            cause: CAUSE.to_string(),
        }),
        sync: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::kind;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_cancel_stops_only_the_fetch_still_on_its_way() {
        let f = Fetching::default();
        let t = f.start("run-1", 1);
        f.done("run-1", 1);
        assert!(!f.cancel("run-1"), "a finished fetch is not cancelled");
        assert!(!t.is_cancelled());
        let old = f.start("run-2", 1);
        let new = f.start("run-2", 2);
        f.done("run-2", 1);
        assert!(
            f.cancel("run-2"),
            "the newer attempt's fetch is still on its way"
        );
        assert!(new.is_cancelled() && !old.is_cancelled());
        assert!(!f.cancel("run-3"));
    }

    #[tokio::test]
    async fn a_hub_that_cannot_be_reached_gets_the_run_back_as_interrupted_after_the_retries() {
        // A port nothing listens on: every fetch fails the way a Hub that is down does.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let opts = crate::config::NestOptions::new(format!("http://127.0.0.1:{port}"), "t0k");
        let client = crate::hub_client::client(&opts).await.expect("lazy client");
        let a = AssignedRun {
            run_id: "run-1".into(),
            attempt: 2.into(),
            task_id: "task-1".into(),
            instance_id: "inst-1".into(),
            context_by_fetch: true,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let event = fetch_or_interrupt(client, &a)
            .await
            .expect_err("no context without a hub");
        assert!(
            started.elapsed() >= Duration::from_millis(1_750),
            "three back-offs (250 + 500 + 1000 ms) came first: {:?}",
            started.elapsed()
        );
        assert_eq!(
            (
                event.run_id.as_str(),
                event.attempt,
                event.seq,
                event.body.kind(),
                event.sync
            ),
            ("run-1", 2, 1, kind::RUN_INTERRUPTED, true)
        );
        let RunEventBody::RunInterrupted(body) = event.body else {
            panic!("not a run.interrupted: {:?}", event.body);
        };
        assert_eq!(body.cause, CAUSE);
        assert!(
            body.reason
                .starts_with("fetching the context of run run-1 attempt 2 failed 4 times"),
            "{}",
            body.reason
        );
    }

    fn chunk(hs: u64, rs: u64, h: &str, r: &str) -> ContextChunk {
        ContextChunk {
            history_size: hs,
            replay_size: rs,
            history: h.as_bytes().to_vec(),
            replay: r.as_bytes().to_vec(),
        }
    }

    #[test]
    fn parts_are_joined_and_checked_against_the_totals() {
        let mut a = Assembler::default();
        a.push(chunk(4, 2, "[1,", "")).expect("first");
        a.push(chunk(0, 0, "2]", ""))
            .expect_err("over the announced history size");

        let mut a = Assembler::default();
        a.push(chunk(5, 2, "[1,", "")).expect("first");
        a.push(chunk(0, 0, "2]", "[]")).expect("second");
        assert_eq!(
            a.finish(),
            Ok(Context {
                history: "[1,2]".into(),
                replay: "[]".into()
            })
        );

        let mut short = Assembler::default();
        short.push(chunk(5, 0, "[1,", "")).expect("first");
        assert!(short
            .finish()
            .expect_err("cut short")
            .contains("3 + 0 of the 5 + 0"));
        assert!(Assembler::default().finish().is_err());
        let mut huge = Assembler::default();
        assert!(huge
            .push(chunk(MAX_CONTEXT_BYTES, 1, "", ""))
            .expect_err("too big")
            .contains("over the limit"));
    }
}
