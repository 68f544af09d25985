//! The schedule RPCs (`CreateSchedule`, `ListSchedules`, `PauseSchedule`, `ResumeSchedule`,
//! `DeleteSchedule`, `RunSchedule`) and `ListTaskWebhooks` on AgenService: protobuf in and
//! out, authorization (Deploy to change a schedule, Submit to run one now, Read to list).

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{authorize, Action};
use crate::core::schedules::{ScheduleRec, ScheduleSpec};
use crate::core::Core;
use crate::limits;

fn check_namespace(ns: &str) -> Result<(), Status> {
    if ns.is_empty() {
        return Ok(());
    }
    limits::validate_name("namespace", ns).map_err(Status::from)
}

fn schedule(r: &ScheduleRec) -> pb::Schedule {
    pb::Schedule {
        namespace: r.namespace.clone(),
        schedule_id: r.schedule_id.clone(),
        deployment: r.deployment.clone(),
        cron: r.cron.clone(),
        timezone: r.timezone.clone(),
        input: r.input.clone(),
        conversation_key: r.conversation_key.clone(),
        overlap: r.overlap.as_str().into(),
        catch_up: r.catch_up.as_str().into(),
        paused: r.paused,
        created_at_ms: r.created_at_ms,
        last_slot_ms: r.last_slot_ms,
        last_task_id: r.last_task_id.clone(),
        next_slot_ms: r.next_slot_ms(),
        pending: u32::try_from(r.pending.len()).unwrap_or(u32::MAX),
    }
}

pub async fn create(
    core: &Core,
    request: Request<pb::CreateScheduleRequest>,
) -> Result<Response<pb::Schedule>, Status> {
    let r = request.get_ref();
    authorize(&request, &r.namespace, Action::Deploy, &r.deployment)?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    let lim = &core.opts.limits;
    lim.check_input(&r.input)?;
    lim.check_conversation_key(&r.conversation_key)?;
    let rec = core
        .create_schedule(ScheduleSpec {
            namespace: r.namespace,
            deployment: r.deployment,
            cron: r.cron,
            timezone: r.timezone,
            input: r.input,
            conversation_key: r.conversation_key,
            overlap: r.overlap,
            catch_up: r.catch_up,
        })
        .await?;
    Ok(Response::new(schedule(&rec)))
}

pub async fn list(
    core: &Core,
    request: Request<pb::ListSchedulesRequest>,
) -> Result<Response<pb::ListSchedulesResponse>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    let all = core.list_schedules(&r.namespace)?;
    Ok(Response::new(pb::ListSchedulesResponse {
        schedules: all.iter().map(schedule).collect(),
    }))
}

/// What `PauseSchedule`, `ResumeSchedule` and `DeleteSchedule` do.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Pause,
    Resume,
    Delete,
}

pub async fn change(
    core: &Core,
    request: Request<pb::ScheduleRequest>,
    what: Change,
) -> Result<Response<pb::Schedule>, Status> {
    let r = request.get_ref();
    authorize(&request, &r.namespace, Action::Deploy, &r.schedule_id)?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    limits::check_id("schedule_id", &r.schedule_id)?;
    let rec = match what {
        Change::Pause => {
            core.pause_schedule(&r.namespace, &r.schedule_id, true)
                .await?
        }
        Change::Resume => {
            core.pause_schedule(&r.namespace, &r.schedule_id, false)
                .await?
        }
        Change::Delete => core.delete_schedule(&r.namespace, &r.schedule_id).await?,
    };
    Ok(Response::new(schedule(&rec)))
}

pub async fn run_now(
    core: &Core,
    request: Request<pb::ScheduleRequest>,
) -> Result<Response<pb::Task>, Status> {
    let r = request.get_ref();
    authorize(&request, &r.namespace, Action::Submit, &r.schedule_id)?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    limits::check_id("schedule_id", &r.schedule_id)?;
    let task = core.run_schedule_now(&r.namespace, &r.schedule_id).await?;
    Ok(Response::new(super::convert::task(&task)))
}

pub async fn task_webhooks(
    core: &Core,
    request: Request<pb::ListTaskWebhooksRequest>,
) -> Result<Response<pb::ListTaskWebhooksResponse>, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let r = request.into_inner();
    check_namespace(&r.namespace)?;
    limits::check_id("task_id", &r.task_id)?;
    let deliveries = core.task_webhooks(&r.namespace, &r.task_id)?;
    Ok(Response::new(pb::ListTaskWebhooksResponse {
        deliveries: deliveries
            .into_iter()
            .map(|(url, d)| pb::WebhookDelivery {
                delivery_id: d.delivery_id,
                url,
                event: d.event,
                state: d.state.as_str().into(),
                attempts: d.attempts,
                created_at_ms: d.created_at_ms,
                next_attempt_at_ms: d.next_attempt_at_ms,
                last_status: u32::from(d.last_status),
                last_error: d.last_error,
                delivered_at_ms: d.delivered_at_ms,
            })
            .collect(),
    }))
}

/// The webhooks a `SubmitTask` names, checked (form, count, the namespace's signing secret).
pub fn submit_webhooks(
    core: &Core,
    namespace: &str,
    deployment: &str,
    targets: Vec<pb::WebhookTarget>,
) -> Result<Vec<crate::core::webhooks::WebhookTarget>, Status> {
    let urls = targets.into_iter().map(|t| (t.url, t.on_waiting)).collect();
    Ok(core.submit_webhooks(namespace, deployment, urls)?)
}

/// The webhook a `CreateDeployment` names, checked before anything is stored.
pub fn deployment_webhook(
    core: &Core,
    r: &mut pb::CreateDeploymentRequest,
) -> Result<Option<crate::core::webhooks::WebhookTarget>, Status> {
    let w = r.webhook.take().unwrap_or_default();
    Ok(core.check_deployment_webhook(&r.namespace, &w.url, w.on_waiting, &r.webhook_secret)?)
}
