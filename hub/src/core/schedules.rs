//! Schedules: a deployment's task on a cron expression ([`crate::cron`]), stored in the
//! `schedules` table and fired by [`Core::run_schedules`], a loop of its own.
//!
//! Invariants: a slot is fired at most once, across Hub restarts: its task's client request
//! id is `schedule:<id>:<slot ms>`, so the submit of a slot whose record did not reach the disk
//! before a crash returns the task that slot already made; the record (`last_slot_ms`) is
//! written and flushed right after. Only the leader fires ([`Core::is_leader`], the one
//! place that decides it). Slots due before this Hub started were missed: `catch_up` latest
//! fires one task for the latest of them, none fires none; slots due while the Hub runs always
//! fire (the latest, when a pause of the loop let several pass). A paused schedule fires
//! nothing, and resuming it does not fire the slots it skipped. Every firing is a task
//! labelled `agen.schedule=<id>` and `agen.schedule.slot=<UTC slot | manual>`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::core::tasks::TaskSpec;
use crate::core::{namespace_or_default, validate_name, Core};
use crate::cron;
use crate::error::{HubError, Result};
use crate::model::{now_ms, TaskRec};
use crate::store::Table;

/// Schedules per namespace (the limits table).
pub const MAX_SCHEDULES_PER_NAMESPACE: usize = 100;
/// Slots an `enqueue` schedule holds while its last task runs; later ones are skipped.
pub const MAX_PENDING_SLOTS: usize = 16;
/// How often the loop looks at the schedules (6-field expressions name seconds).
const TICK: Duration = Duration::from_millis(200);

/// What a slot does while the schedule's last task has not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    #[default]
    Skip,
    Enqueue,
    Allow,
}

/// What slots missed while no Hub ran do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    #[default]
    Latest,
    None,
}

impl Overlap {
    pub fn parse(s: &str) -> Result<Overlap> {
        match s {
            "" | "skip" => Ok(Overlap::Skip),
            "enqueue" => Ok(Overlap::Enqueue),
            "allow" => Ok(Overlap::Allow),
            other => Err(HubError::invalid(format!(
                "overlap: expected skip, enqueue or allow, got {:?}",
                crate::limits::cut(other, 40)
            ))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Enqueue => "enqueue",
            Overlap::Allow => "allow",
        }
    }
}

impl CatchUp {
    pub fn parse(s: &str) -> Result<CatchUp> {
        match s {
            "" | "latest" => Ok(CatchUp::Latest),
            "none" => Ok(CatchUp::None),
            other => Err(HubError::invalid(format!(
                "catch_up: expected latest or none, got {:?}",
                crate::limits::cut(other, 40)
            ))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::None => "none",
        }
    }
}

/// A stored schedule (`schedules`: `namespace \0 id`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScheduleRec {
    pub schedule_id: String,
    pub namespace: String,
    pub deployment: String,
    pub cron: String,
    pub timezone: String,
    pub input: String,
    #[serde(default)]
    pub conversation_key: String,
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default)]
    pub catch_up: CatchUp,
    #[serde(default)]
    pub paused: bool,
    pub created_at_ms: i64,
    /// Slots at or before this are not fired (set by creation and by resume).
    #[serde(default)]
    pub from_ms: i64,
    /// The last slot handled (fired, skipped or queued); 0: none.
    #[serde(default)]
    pub last_slot_ms: i64,
    #[serde(default)]
    pub last_task_id: String,
    /// Slots of an `enqueue` schedule waiting for the last task to end, oldest first.
    #[serde(default)]
    pub pending: Vec<i64>,
}

impl ScheduleRec {
    /// The next slot it will fire (0: paused or none).
    pub fn next_slot_ms(&self) -> i64 {
        if self.paused {
            return 0;
        }
        cron::parse(&self.cron, &self.timezone)
            .ok()
            .and_then(|c| c.next_after(self.from_ms.max(self.last_slot_ms)))
            .unwrap_or(0)
    }
}

/// What a client asks for.
#[derive(Debug, Clone, Default)]
pub struct ScheduleSpec {
    pub namespace: String,
    pub deployment: String,
    pub cron: String,
    pub timezone: String,
    pub input: String,
    pub conversation_key: String,
    pub overlap: String,
    pub catch_up: String,
}

/// The schedules' own lock: a firing and a change (pause, resume, remove) never interleave.
#[derive(Default)]
pub struct Schedules {
    lock: tokio::sync::Mutex<()>,
}

fn key(namespace: &str, id: &str) -> String {
    format!("{namespace}\u{0}{id}")
}

impl Core {
    /// Whether this Hub fires schedules and delivers webhooks: the leader does. One Hub today
    /// is always the leader; a Hub with a standby asks its lease here.
    pub fn is_leader(&self) -> bool {
        true
    }

    /// Stores a new schedule; its first slot is the first after now.
    pub async fn create_schedule(&self, spec: ScheduleSpec) -> Result<ScheduleRec> {
        let namespace = namespace_or_default(&spec.namespace);
        validate_name("namespace", &namespace)?;
        validate_name("deployment", &spec.deployment)?;
        cron::parse(&spec.cron, &spec.timezone)?;
        if spec.input.trim().is_empty() {
            return Err(HubError::invalid(
                "input: expected the text each firing submits, got an empty string",
            ));
        }
        let overlap = Overlap::parse(&spec.overlap)?;
        let catch_up = CatchUp::parse(&spec.catch_up)?;
        let _held = self.schedules.lock.lock().await;
        if !self
            .lock()
            .deployments
            .contains_key(&crate::model::deployment_key(&namespace, &spec.deployment))
        {
            return Err(HubError::not_found(format!(
                "deployment {namespace}/{} not found; deploy it first (agen deploy)",
                spec.deployment
            )));
        }
        let held = self.list_schedules(&namespace)?.len();
        if held >= MAX_SCHEDULES_PER_NAMESPACE {
            return Err(HubError::ResourceExhausted(format!(
                "schedules: namespace {namespace} holds {held} schedules, the limit is {MAX_SCHEDULES_PER_NAMESPACE}; remove one first (agen schedules rm ID)"
            )));
        }
        let now = now_ms();
        let rec = ScheduleRec {
            schedule_id: format!("sched-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]),
            namespace: namespace.clone(),
            deployment: spec.deployment,
            cron: spec.cron.trim().to_string(),
            timezone: if spec.timezone.is_empty() {
                "UTC".into()
            } else {
                spec.timezone
            },
            input: spec.input,
            conversation_key: spec.conversation_key,
            overlap,
            catch_up,
            paused: false,
            created_at_ms: now,
            from_ms: now,
            last_slot_ms: 0,
            last_task_id: String::new(),
            pending: Vec::new(),
        };
        self.db
            .put_json(Table::Schedules, &key(&namespace, &rec.schedule_id), &rec)?;
        self.commit().await?;
        tracing::info!(schedule = %rec.schedule_id, deployment = %format!("{namespace}/{}", rec.deployment), cron = %rec.cron, timezone = %rec.timezone, "schedule created");
        Ok(rec)
    }

    /// The schedules of a namespace, by id.
    pub fn list_schedules(&self, namespace: &str) -> Result<Vec<ScheduleRec>> {
        let namespace = namespace_or_default(namespace);
        let mut prefix = namespace.into_bytes();
        prefix.push(0);
        Ok(self.db.list_json(Table::Schedules, &prefix)?)
    }

    fn schedule(&self, namespace: &str, id: &str) -> Result<ScheduleRec> {
        self.db
            .get_json::<ScheduleRec>(Table::Schedules, &key(namespace, id))?
            .ok_or_else(|| {
                HubError::not_found(format!(
                    "schedule {id} not found in namespace {namespace}; list them with agen schedules ls"
                ))
            })
    }

    /// Pauses (`true`) or resumes a schedule; a resumed one fires from the next slot on.
    pub async fn pause_schedule(
        &self,
        namespace: &str,
        id: &str,
        pause: bool,
    ) -> Result<ScheduleRec> {
        let namespace = namespace_or_default(namespace);
        let _held = self.schedules.lock.lock().await;
        let mut rec = self.schedule(&namespace, id)?;
        if rec.paused != pause {
            rec.paused = pause;
            if !pause {
                rec.from_ms = now_ms();
            }
            self.db
                .put_json(Table::Schedules, &key(&namespace, id), &rec)?;
            self.commit().await?;
        }
        Ok(rec)
    }

    /// Removes a schedule (its tasks stay).
    pub async fn delete_schedule(&self, namespace: &str, id: &str) -> Result<ScheduleRec> {
        let namespace = namespace_or_default(namespace);
        let _held = self.schedules.lock.lock().await;
        let rec = self.schedule(&namespace, id)?;
        self.db.remove(Table::Schedules, &key(&namespace, id))?;
        self.commit().await?;
        Ok(rec)
    }

    /// Submits the schedule's task now, whatever its slots and pause say.
    pub async fn run_schedule_now(&self, namespace: &str, id: &str) -> Result<TaskRec> {
        let namespace = namespace_or_default(namespace);
        let _held = self.schedules.lock.lock().await;
        let mut rec = self.schedule(&namespace, id)?;
        let request = format!("schedule:{id}:manual:{}", uuid::Uuid::now_v7().simple());
        let task = self.submit_firing(&rec, "manual", request).await?;
        rec.last_task_id = task.task_id.clone();
        self.db
            .put_json(Table::Schedules, &key(&namespace, id), &rec)?;
        self.commit().await?;
        Ok(task)
    }

    async fn submit_firing(
        &self,
        rec: &ScheduleRec,
        slot: &str,
        request: String,
    ) -> Result<TaskRec> {
        let labels = BTreeMap::from([
            ("agen.schedule".to_string(), rec.schedule_id.clone()),
            ("agen.schedule.slot".to_string(), slot.to_string()),
        ]);
        self.submit_task(TaskSpec {
            namespace: rec.namespace.clone(),
            deployment: rec.deployment.clone(),
            input: rec.input.clone(),
            labels,
            conversation_key: rec.conversation_key.clone(),
            client_request_id: request,
            ..Default::default()
        })
        .await
    }

    /// Runs until `shutdown`: fires the slots that are due.
    pub async fn run_schedules(self: Arc<Self>, shutdown: CancellationToken) {
        let boot_ms = now_ms();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            if !self.is_leader() || self.store_broken().is_some() {
                continue;
            }
            if let Err(e) = self.fire_due(boot_ms).await {
                tracing::warn!(error = %e, "schedules: a pass failed; retrying");
            }
        }
    }

    /// One pass over every schedule.
    async fn fire_due(&self, boot_ms: i64) -> Result<()> {
        let _held = self.schedules.lock.lock().await;
        let all: Vec<ScheduleRec> = self.db.list_json(Table::Schedules, b"")?;
        for rec in all.into_iter().filter(|r| !r.paused) {
            let id = rec.schedule_id.clone();
            if let Err(e) = self.fire_one(rec, boot_ms).await {
                tracing::warn!(schedule = %id, error = %e, "schedule: firing failed; retrying at the next pass");
            }
        }
        Ok(())
    }

    async fn fire_one(&self, mut rec: ScheduleRec, boot_ms: i64) -> Result<()> {
        let now = now_ms();
        let last_running = !rec.last_task_id.is_empty()
            && self
                .lock()
                .tasks
                .get(&rec.last_task_id)
                .is_some_and(|t| !t.state.is_terminal());
        // A queued slot of an `enqueue` schedule goes first, once the last task ended.
        if !last_running {
            if let Some(&slot) = rec.pending.first() {
                match self.fire_slot(&rec, slot).await {
                    Ok(task) => rec.last_task_id = task.task_id,
                    Err(e @ (HubError::NotFound(_) | HubError::InvalidArgument(_))) => {
                        tracing::warn!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), error = %e, "schedule: queued slot not fired");
                    }
                    Err(e) => return Err(e),
                }
                rec.pending.remove(0);
                return self.save_schedule(&rec).await;
            }
        }
        let spec = cron::parse(&rec.cron, &rec.timezone)?;
        let Some(due) = spec.due(rec.from_ms.max(rec.last_slot_ms), now) else {
            return Ok(());
        };
        let slot = due.latest_ms;
        rec.last_slot_ms = slot;
        if slot < boot_ms && rec.catch_up == CatchUp::None {
            tracing::info!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), "schedule: slot missed while no hub ran; catch-up none fires nothing");
            return self.save_schedule(&rec).await;
        }
        if last_running {
            match rec.overlap {
                Overlap::Skip => {
                    tracing::info!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), task = %rec.last_task_id, "schedule: slot skipped, the last firing still runs");
                    return self.save_schedule(&rec).await;
                }
                Overlap::Enqueue => {
                    if rec.pending.len() < MAX_PENDING_SLOTS {
                        rec.pending.push(slot);
                    } else {
                        tracing::warn!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), "schedule: {MAX_PENDING_SLOTS} slots already wait; this one is skipped");
                    }
                    return self.save_schedule(&rec).await;
                }
                Overlap::Allow => {}
            }
        }
        match self.fire_slot(&rec, slot).await {
            Ok(task) => rec.last_task_id = task.task_id,
            // The deployment is gone (or refuses the task for good): the slot is spent, logged
            // once, never retried at every pass.
            Err(e @ (HubError::NotFound(_) | HubError::InvalidArgument(_))) => {
                tracing::warn!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), error = %e, "schedule: slot not fired");
            }
            Err(e) => return Err(e),
        }
        self.save_schedule(&rec).await
    }

    /// Submits a slot's task: idempotent by the slot (a slot fired before a crash that lost
    /// the schedule's record returns that slot's task).
    async fn fire_slot(&self, rec: &ScheduleRec, slot: i64) -> Result<TaskRec> {
        let request = format!("schedule:{}:{slot}", rec.schedule_id);
        let task = self
            .submit_firing(rec, &cron::slot_text(slot), request)
            .await?;
        tracing::info!(schedule = %rec.schedule_id, slot = %cron::slot_text(slot), task = %task.task_id, "schedule fired");
        Ok(task)
    }

    async fn save_schedule(&self, rec: &ScheduleRec) -> Result<()> {
        let k = key(&rec.namespace, &rec.schedule_id);
        // Removed meanwhile (the lock is held, so only by a restore): leave it removed.
        if self
            .db
            .get_json::<ScheduleRec>(Table::Schedules, &k)?
            .is_none()
        {
            return Ok(());
        }
        self.db.put_json(Table::Schedules, &k, rec)?;
        self.commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DeploymentRec;

    fn core_with_runner(dir: &std::path::Path) -> Arc<Core> {
        let core = crate::core::test_core(dir);
        let dep = DeploymentRec {
            namespace: "default".into(),
            name: "runner".into(),
            bundle_digest: String::new(),
            replicas: 0,
            selector: Default::default(),
            concurrency: 1,
            generation: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            agent_name: "runner".into(),
            resources: Default::default(),
        };
        core.lock().deployments.insert(dep.key(), dep);
        core
    }

    fn slots(core: &Core) -> Vec<String> {
        let mut v: Vec<String> = core
            .lock()
            .tasks
            .values()
            .filter_map(|t| t.labels.get("agen.schedule.slot").cloned())
            .collect();
        v.sort();
        v
    }

    async fn every_second(core: &Core, overlap: &str, catch_up: &str) -> ScheduleRec {
        core.create_schedule(ScheduleSpec {
            deployment: "runner".into(),
            cron: "* * * * * *".into(),
            input: "tick".into(),
            overlap: overlap.into(),
            catch_up: catch_up.into(),
            ..Default::default()
        })
        .await
        .expect("created")
    }

    #[tokio::test]
    async fn missed_slots_fire_one_task_or_none_and_a_running_firing_skips_or_queues_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = core_with_runner(dir.path());
        let now = now_ms();
        // Ten slots passed while no Hub ran (before boot): latest fires the newest once.
        let mut rec = every_second(&core, "allow", "latest").await;
        rec.from_ms = now - 10_000;
        core.fire_one(rec.clone(), now + 60_000)
            .await
            .expect("pass");
        assert_eq!(slots(&core).len(), 1, "one task for ten missed slots");
        let saved = core.schedule("default", &rec.schedule_id).expect("saved");
        assert!(saved.last_slot_ms >= now - 1000, "{}", saved.last_slot_ms);
        // catch-up none: the missed slots fire nothing, and are spent.
        let mut none = every_second(&core, "allow", "none").await;
        none.from_ms = now - 10_000;
        core.fire_one(none.clone(), now + 60_000)
            .await
            .expect("pass");
        assert_eq!(slots(&core).len(), 1, "none fired");
        let saved = core.schedule("default", &none.schedule_id).expect("saved");
        assert!(saved.last_slot_ms > none.from_ms);

        // overlap skip: the last firing's task is still queued, so the next slot is skipped.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let mut skip = core.schedule("default", &rec.schedule_id).expect("saved");
        skip.overlap = Overlap::Skip;
        core.fire_one(skip, 0).await.expect("pass");
        assert_eq!(slots(&core).len(), 1, "skipped while the last task runs");
        // overlap enqueue: the slot waits, then fires once the last task ended.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        let mut queue = core.schedule("default", &rec.schedule_id).expect("saved");
        queue.overlap = Overlap::Enqueue;
        core.fire_one(queue, 0).await.expect("pass");
        let queued = core.schedule("default", &rec.schedule_id).expect("saved");
        assert_eq!((queued.pending.len(), slots(&core).len()), (1, 1));
        core.cancel_task("default", &queued.last_task_id, "test")
            .await
            .expect("cancelled");
        core.fire_one(queued.clone(), 0).await.expect("pass");
        assert_eq!(slots(&core).len(), 2, "the queued slot fired");
        let after = core.schedule("default", &rec.schedule_id).expect("saved");
        assert!(after.pending.is_empty());
        assert_ne!(after.last_task_id, queued.last_task_id);
    }

    #[tokio::test]
    async fn a_slot_fired_again_after_a_crash_lost_its_record_makes_no_second_task() {
        let dir = tempfile::tempdir().expect("tempdir");
        let core = core_with_runner(dir.path());
        let rec = core
            .create_schedule(ScheduleSpec {
                deployment: "runner".into(),
                cron: "*/2 * * * * *".into(),
                timezone: "Europe/Oslo".into(),
                input: "tick".into(),
                ..Default::default()
            })
            .await
            .expect("created");
        let slot = rec.next_slot_ms();
        // The slot fires; the crash comes before `last_slot_ms` is written, so the next Hub
        // finds the slot due again and fires it again.
        let first = core.fire_slot(&rec, slot).await.expect("fired");
        let again = core.fire_slot(&rec, slot).await.expect("fired again");
        assert_eq!(first.task_id, again.task_id);
        let tasks = core.lock().tasks.len();
        assert_eq!(tasks, 1, "one task for the slot");
        assert_eq!(
            first.labels.get("agen.schedule.slot"),
            Some(&cron::slot_text(slot))
        );
        // The loop's own pass, from a record that never saw the slot, adds none either.
        let mut stale = rec.clone();
        stale.from_ms = slot - 1;
        core.fire_one(stale, 0).await.expect("pass");
        let slots: Vec<String> = core
            .lock()
            .tasks
            .values()
            .filter_map(|t| t.labels.get("agen.schedule.slot").cloned())
            .collect();
        let mut unique = slots.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(slots.len(), unique.len(), "no slot twice: {slots:?}");
    }
}
