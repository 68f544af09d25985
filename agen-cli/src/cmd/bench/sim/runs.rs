//! A simulated run, as an instance's harness would send it: a model turn, one side-effecting
//! tool call whose `tool.started` is durable at the Hub (acked) before the effect happens, the
//! effect's end, a last model turn and `run.finished`, also waited for. A resumed attempt
//! (`context_by_fetch`) first fetches its context with the Nest's own
//! [`agen_nest::run_context::fetch_or_interrupt`] and reads the replay as the harness does: a
//! call the replay shows ended is not made again; one started with no end is reported
//! `effect_unknown` (never made again).
//!
//! Invariant: the effect is counted in the ledger only after its `tool.started` was acked, and
//! a run that loses its ack (fenced, or its Nest killed) stops there, so a task counted twice
//! in the ledger is a side effect the Hub let run twice.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use agen_contract::run::{
    ModelAnswered, ModelRequested, ResponseType, RunEventBody, RunFinished, RunInterrupted,
    RunState, ToolCompleted, ToolFailed, ToolFailure, ToolStarted,
};
use agen_nest::hub_client::{convert, HubClient};
use agen_nest::model::{AssignedRun, EventBatch, RunEvent};
use agen_proto::v1::nest_message::Msg as NestMsg;
use agen_proto::v1::NestMessage;
use tokio::sync::mpsc;

use super::nest_state::{acked, AckRx, NestState, Shared};

/// The simulated tool (`<server>.<tool>`).
pub const TOOL: &str = "sim.charge";
/// The one call of every run.
const CALL_ID: &str = "sim-call-1";

/// What a run needs from its Nest.
pub struct RunCtx {
    pub client: HubClient,
    pub tx: mpsc::Sender<NestMessage>,
    pub state: Arc<NestState>,
    pub shared: Arc<Shared>,
    pub acks: AckRx,
}

/// Sends a run's events in order, numbering them from 1 for its attempt.
struct Emitter<'a> {
    ctx: &'a mut RunCtx,
    a: &'a AssignedRun,
    seq: u64,
}

impl Emitter<'_> {
    /// Sends `bodies` as one message; when `wait`, waits for the last one's ack (false: the
    /// attempt is fenced, the Nest gone, or no ack came).
    async fn send(&mut self, bodies: Vec<RunEventBody>, wait: bool) -> bool {
        let n = bodies.len();
        let events: Vec<RunEvent> = bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| {
                self.seq += 1;
                RunEvent {
                    run_id: self.a.run_id.0.clone(),
                    attempt: self.a.attempt.0,
                    seq: self.seq,
                    task_id: self.a.task_id.0.clone(),
                    at_ms: chrono::Utc::now().timestamp_millis(),
                    body,
                    sync: wait && i + 1 == n,
                }
            })
            .collect();
        let batch = EventBatch {
            instance_id: self.a.instance_id.0.clone(),
            events,
        };
        let msg = NestMessage {
            msg: Some(NestMsg::RunEvents(convert::run_events(batch))),
        };
        if self.ctx.tx.send(msg).await.is_err() {
            return false;
        }
        self.ctx
            .shared
            .stats
            .events
            .fetch_add(n as u64, Ordering::Relaxed);
        !wait || acked(&mut self.ctx.acks, self.seq).await
    }
}

fn requested(turn: u32) -> RunEventBody {
    RunEventBody::ModelRequested(ModelRequested {
        turn: Some(turn),
        flow_agent: false,
        activity: Some("simulated model".into()),
    })
}

fn answered(turn: u32) -> RunEventBody {
    RunEventBody::ModelAnswered(ModelAnswered {
        turn: Some(turn),
        flow_agent: false,
        message: None,
        usage: None,
        stop_reason: Some("stop".into()),
        response_id: None,
        response_model: None,
        error: None,
    })
}

/// Runs `a` on its instance; `here`: the instance is on this Nest.
pub async fn run(mut ctx: RunCtx, a: AssignedRun, here: bool) {
    let (state, shared) = (ctx.state.clone(), ctx.shared.clone());
    let half = shared.run_time / 2;
    let mut out = Emitter {
        ctx: &mut ctx,
        a: &a,
        seq: 0,
    };
    if !here {
        let body = RunEventBody::RunInterrupted(RunInterrupted {
            reason: format!("instance {} is not on this nest", a.instance_id),
            cause: "not_here".into(),
        });
        out.send(vec![body], true).await;
        shared.stats.interrupted.fetch_add(1, Ordering::Relaxed);
        state.run_ended(a.instance_id.as_str(), a.run_id.as_str(), a.attempt.0);
        return;
    }
    let replay = if a.context_by_fetch {
        match agen_nest::run_context::fetch_or_interrupt(out.ctx.client.clone(), &a).await {
            Ok(c) => agen_contract::run::wire::replay(&c.replay),
            Err(ev) => {
                out.send(vec![ev.body], true).await;
                shared.stats.interrupted.fetch_add(1, Ordering::Relaxed);
                state.run_ended(a.instance_id.as_str(), a.run_id.as_str(), a.attempt.0);
                return;
            }
        }
    } else {
        Vec::new()
    };
    let ended = replay.iter().any(|b| {
        matches!(b, RunEventBody::ToolCompleted(c) if c.call_id == CALL_ID)
            || matches!(b, RunEventBody::ToolFailed(f) if f.call_id == CALL_ID)
    });
    let started = replay
        .iter()
        .any(|b| matches!(b, RunEventBody::ToolStarted(s) if s.call_id == CALL_ID));

    if !out.send(vec![requested(1)], false).await {
        return;
    }
    tokio::time::sleep(half).await;
    if !ended && started {
        // Started by an attempt that did not live to say how it ended: never made again.
        shared.stats.effect_unknown.fetch_add(1, Ordering::Relaxed);
        let failed = RunEventBody::ToolFailed(ToolFailed {
            call_id: CALL_ID.into(),
            tool: TOOL.into(),
            error: "the call's outcome is unknown (its run was interrupted)".into(),
            reason: ToolFailure::EffectUnknown,
            duration_ms: 0,
            keen_result: None,
            keen_text: None,
        });
        if !out.send(vec![answered(1), failed], true).await {
            return;
        }
    } else if !ended {
        let start = RunEventBody::ToolStarted(ToolStarted {
            call_id: CALL_ID.into(),
            tool: TOOL.into(),
            model_name: Some("sim_charge".into()),
            side_effect: true,
            arguments: None,
            keen_kind: None,
            span_id: None,
        });
        // The effect happens only once its start is durable.
        if !out.send(vec![answered(1), start], true).await {
            return;
        }
        shared.stats.executed(a.task_id.as_str());
        let done = RunEventBody::ToolCompleted(ToolCompleted {
            call_id: CALL_ID.into(),
            tool: TOOL.into(),
            result: "charged".into(),
            is_error: false,
            duration_ms: 0,
            keen_result: None,
        });
        if !out.send(vec![done], false).await {
            return;
        }
    }
    tokio::time::sleep(half).await;
    let finished = RunEventBody::RunFinished(RunFinished {
        state: RunState::Succeeded,
        result: "done".into(),
        response_type: ResponseType::Text,
        messages: Vec::new(),
    });
    if out
        .send(vec![requested(2), answered(2), finished], true)
        .await
    {
        shared.stats.finished(a.task_id.as_str(), a.attempt.0);
    }
    state.run_ended(a.instance_id.as_str(), a.run_id.as_str(), a.attempt.0);
}
