//! Dispatch: queued tasks onto instances with a free slot (the choice comes from the pure
//! `scheduler`), each run's lease stored before its `AssignRun` leaves. An `AssignRun` never
//! carries the run's history or replay, and dispatch never reads them from the store (it runs
//! under the state lock): the Nest fetches them (`core::run_context`).

use std::collections::{HashMap, HashSet};

use crate::core::{Core, State};
use crate::error::Result;
use crate::nodes::{RunAssignment, ToNest};
use crate::scheduler::dispatch::{choose, Ask, Choice, SlotView};

use super::outcome::CANCEL_GRACE_MS;
use super::*;

impl Core {
    /// Dispatches queued tasks to instances with a free slot; expires cancel graces.
    pub(crate) fn dispatch_tasks(&self, st: &mut State, now: i64) -> Result<()> {
        self.expire_unstarted(st, now)?;
        self.expire_waits(st, now)?;
        // Running tasks whose cancel grace ran out are cancelled without their run.
        let expired: Vec<String> = st
            .tasks
            .live()
            .filter(|t| t.cancel_requested_at_ms > 0)
            .filter(|t| now - t.cancel_requested_at_ms > CANCEL_GRACE_MS)
            .map(|t| t.task_id.clone())
            .collect();
        for id in expired {
            if let Some(task) = st.tasks.get(&id).cloned() {
                self.finish_cancelled(st, task)?;
            }
        }

        let mut active: HashMap<String, u32> = HashMap::new();
        for t in st.tasks.live() {
            if matches!(t.state, TaskState::Running | TaskState::Waiting)
                && !t.instance_id.is_empty()
            {
                *active.entry(t.instance_id.clone()).or_default() += 1;
            }
        }
        let mut busy_conversations: HashSet<String> = HashSet::new();
        for id in st.tasks.live_ids() {
            let Some(task) = st.tasks.get(&id).cloned() else {
                continue;
            };
            let first_of_conversation = busy_conversations.insert(task.conversation_id.clone());
            if task.state != TaskState::Queued || !first_of_conversation {
                continue;
            }
            if task.lease.not_before_ms > now {
                continue;
            }
            let key = deployment_key(&task.namespace, &task.deployment);
            let Some(d) = st.deployments.get(&key).cloned() else {
                self.finish_task(
                    st,
                    task,
                    TaskState::Failed,
                    "",
                    "error",
                    "deployment deleted before the task ran",
                )?;
                continue;
            };
            let slots: Vec<SlotView<'_>> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .map(|i| SlotView {
                    instance_id: &i.instance_id,
                    bundle_digest: &i.bundle_digest,
                    generation: i.generation,
                    ready: i.state == InstanceState::Running && i.healthy,
                    // A draining Nest gets no new run.
                    connected: st.live.is_connected(&i.nest_id)
                        && !st.nests.get(&i.nest_id).is_some_and(|n| n.draining(now)),
                    alive: !matches!(i.state, InstanceState::Lost | InstanceState::Stopping),
                    active_runs: active.get(&i.instance_id).copied().unwrap_or(0),
                    leaving: i.leaving_since_ms != 0,
                })
                .collect();
            let ask = Ask {
                digest: &d.bundle_digest,
                generation: d.generation,
                concurrency: d.concurrency,
                pinned: (!task.bundle_digest.is_empty()).then_some(task.bundle_digest.as_str()),
                avoid: &task.lease.avoid_instance,
            };
            let candidate = match choose(&ask, &slots) {
                Choice::Run(id) => st.instances.get(id).cloned(),
                Choice::Wait => {
                    // A task left queued says why (no instance placed, none ready and what
                    // its instances report, or every slot taken), shown by `agen query`.
                    let why = wait_reason(&d, st.instances.values(), &slots);
                    if task.activity != why {
                        if let Some(mut t) = st.tasks.get_mut(&task.task_id) {
                            t.activity = why;
                        }
                    }
                    None
                }
                Choice::VersionGone if task.suspended.is_none() && task.attempt > 0 => {
                    // A run resumes only on its own version: place an instance of it.
                    self.place_for_resume(st, &d, &task.bundle_digest, now)?;
                    continue;
                }
                Choice::VersionGone => {
                    let error = format!(
                        "the run started on bundle {}, which no instance of deployment {} runs any more (it was redeployed as {}); a run resumes only on its own version: submit the task again",
                        task.bundle_digest, d.name, d.bundle_digest
                    );
                    self.finish_task(st, task, TaskState::Failed, &error, "error", &error)?;
                    continue;
                }
            };
            let Some(inst) = candidate else { continue };
            *active.entry(inst.instance_id.clone()).or_default() += 1;
            self.assign(st, task, &inst, now)?;
        }
        Ok(())
    }

    /// Creates an instance of an old bundle version of `d` to resume that version's runs on
    /// (its instances are all gone: lost with their Nest after a redeploy). It is not a
    /// replica; `plan_deployments` stops it once no run of its version is left.
    fn place_for_resume(
        &self,
        st: &mut State,
        d: &DeploymentRec,
        digest: &str,
        now: i64,
    ) -> Result<()> {
        let rec = InstanceRec {
            instance_id: format!("{}-{}", d.name, crate::core::short_id()),
            namespace: d.namespace.clone(),
            deployment: d.name.clone(),
            nest_id: String::new(),
            nest_name: String::new(),
            state: InstanceState::Pending,
            healthy: false,
            tools_loaded: 0,
            servers_not_connected: Vec::new(),
            bundle_digest: digest.to_string(),
            generation: 0,
            message: format!("placed to resume runs that started on {digest}"),
            restarts: 0,
            created_at_ms: now,
            updated_at_ms: now,
            tools: Vec::new(),
            resources: Vec::new(),
            not_before_ms: 0,
            healthy_since_ms: 0,
            replacement: false,
            slot_failures: 0,
            leaving_since_ms: 0,
            for_resume: true,
            oom_kills: 0,
            usage: Usage::default(),
        };
        tracing::info!(instance = %rec.instance_id, digest, "placing an instance of an old version to resume its runs");
        self.save_instance(st, rec)
    }

    pub(in crate::core) fn assign(
        &self,
        st: &mut State,
        mut task: TaskRec,
        inst: &InstanceRec,
        now: i64,
    ) -> Result<()> {
        if task.run_id.is_empty() {
            task.run_id = format!("run-{}", uuid::Uuid::now_v7().simple());
        }
        // Attempts are the task's, never reused: the fence of the run moves with them; after
        // a restore they start above any the Hub before it could have issued.
        task.attempt = (task.attempt + 1).max(self.attempt_floor() + 1);
        self.db.set_run_attempt(&task.run_id, task.attempt)?;
        task.lease.nest_id = inst.nest_id.clone();
        task.lease.instance_id = inst.instance_id.clone();
        task.lease.assigned_at_ms = now;
        task.lease.started = false;
        task.lease.missing_since_ms = 0;
        task.lease.revoked = false;
        // A new attempt has no run events yet (attempts are never reused).
        task.lease.stored_through = Some(0);
        task.state = TaskState::Running;
        task.instance_id = inst.instance_id.clone();
        task.nest_name = inst.nest_name.clone();
        task.bundle_digest = inst.bundle_digest.clone();
        if task.started_at_ms == 0 {
            task.started_at_ms = now;
        }
        task.activity = format!("starting on instance {}", inst.instance_id);
        let assignment = RunAssignment {
            run_id: task.run_id.clone().into(),
            attempt: task.attempt.into(),
            task_id: task.task_id.clone().into(),
            instance_id: inst.instance_id.clone().into(),
            namespace: task.namespace.clone(),
            deployment: task.deployment.clone().into(),
            input: task.input.clone(),
            labels: task.labels.clone(),
            conversation_id: task.conversation_id.clone(),
            conversation_key: task.conversation_key.clone(),
            root_run_id: if task.root_run_id.is_empty() {
                task.run_id.clone().into()
            } else {
                task.root_run_id.clone().into()
            },
            delegation_depth: task.delegation_depth,
            trace_id: crate::trace::trace_id(&task),
            bundle_digest: inst.bundle_digest.clone(),
            // Deprecated on the wire: the context travels over `FetchRunContext`.
            history_json: String::new(),
            replay_json: String::new(),
            // A conversation (a key) may have a history, a later attempt has a replay: the
            // Nest fetches them (`core::run_context`); the store is not read here.
            context_by_fetch: !task.conversation_key.is_empty() || task.attempt > 1,
            tool_overrides: task.tool_overrides.clone(),
            max_tokens: task.budget.max_tokens,
            output_schema: task.output_schema.clone(),
        };
        tracing::info!(task = %task.task_id, run = %task.run_id, attempt = task.attempt, instance = %inst.instance_id, "dispatching run");
        // Held until the flush that makes this lease durable (`Core::commit`).
        st.live
            .send_durable(&inst.nest_id, ToNest::AssignRun(Box::new(assignment)));
        self.emit_state(st, task)
    }
}

/// Why a queued task of deployment `d` waits, from its instances (`slots` are the same
/// instances as dispatch sees them).
fn wait_reason<'a>(
    d: &DeploymentRec,
    instances: impl Iterator<Item = &'a InstanceRec>,
    slots: &[SlotView<'_>],
) -> String {
    if slots.iter().any(|s| s.ready && s.connected) {
        return format!(
            "queued: every instance of deployment {} is busy ({} run(s) each at most)",
            d.name, d.concurrency
        );
    }
    let mut mine: Vec<&InstanceRec> = instances
        .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
        .filter(|i| !matches!(i.state, InstanceState::Lost | InstanceState::Stopped))
        .collect();
    mine.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
    match mine.first() {
        None => format!(
            "queued: no instance of deployment {} is placed yet (see `agen nests` for Nests that match its selector)",
            d.name
        ),
        Some(i) => {
            let state = if i.state == InstanceState::Running && !i.healthy {
                "unhealthy"
            } else {
                i.state.as_str()
            };
            let message = if i.message.is_empty() {
                String::new()
            } else {
                format!(": {}", i.message)
            };
            format!(
                "queued: no instance of deployment {} is ready (instance {} is {state}{message}; see `agen ps --all`)",
                d.name, i.instance_id
            )
        }
    }
}
