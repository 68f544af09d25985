//! The console's JSON API: each handler resolves the session, then makes the `AgenService`
//! call(s) the page needs through the Hub's own stack and answers a typed view.

use agen_proto::v1 as pb;
use axum::extract::{Path, Query};
use axum::http::{header, Extensions, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;

use super::{session, view, ApiErr, Caller, Shared};
use crate::tokens::Principal;

/// Artifacts larger than this are not downloaded through the console (use `agen artifacts get`).
const MAX_DOWNLOAD: usize = 64 * 1024 * 1024;
/// Log lines the task page shows.
const LOG_TAIL: u32 = 200;

fn me_of(s: &session::Session) -> view::Me {
    let (namespace, role) = match &s.principal {
        Principal::ClusterAdmin => (String::new(), "cluster-admin".to_string()),
        Principal::Api {
            namespace, role, ..
        } => (namespace.clone(), role.as_str().to_string()),
    };
    view::Me {
        token_id: s.principal.token_id().to_string(),
        name: s.principal.token_name().to_string(),
        namespace,
        role,
        csrf: s.csrf.clone(),
        expires_at_ms: s.expires_at_ms,
    }
}

fn session_cookie(value: &str, max_age_s: i64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{}={value}; Path=/ui; HttpOnly; Secure; SameSite=Strict; Max-Age={}",
        session::COOKIE,
        max_age_s.max(0)
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("agen_session=; Path=/ui; Max-Age=0"))
}

#[derive(Deserialize)]
pub struct SignIn {
    token: String,
}

/// `POST /ui/api/session {"token": "…"}`: a session for that token (401 when it is none).
pub async fn sign_in(
    state: Shared,
    ext: Extensions,
    Json(body): Json<SignIn>,
) -> Result<Response, ApiErr> {
    let c = &state.0;
    let max = c.core.opts.console_session_max;
    let (id, s) = session::sign_in(&c.core.db, &c.tokens, &body.token, max).await?;
    c.gate.authenticated(super::peer_of(&ext));
    let left_s = (s.expires_at_ms - crate::model::now_ms()) / 1000;
    let mut res = Json(me_of(&s)).into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&id, left_s));
    Ok(res)
}

/// `GET /ui/api/session`: who is signed in (401: no one).
pub async fn me(c: Caller) -> Json<view::Me> {
    Json(me_of(c.session()))
}

/// `DELETE /ui/api/session`: signs out (the session ends at once).
pub async fn sign_out(state: Shared, c: Caller) -> Result<Response, ApiErr> {
    c.mutating("SignOut", "").await?;
    session::sign_out(&state.0.core.db, c.session()).await?;
    let mut res = StatusCode::NO_CONTENT.into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, session_cookie("", 0));
    Ok(res)
}

/// The namespace to show: the one asked for, else the token's own, else `default`.
pub(super) fn namespace_for(s: &session::Session, asked: Option<&str>) -> String {
    match (asked.filter(|n| !n.is_empty()), &s.principal) {
        (Some(n), _) => n.to_string(),
        (None, Principal::Api { namespace, .. }) => namespace.clone(),
        (None, Principal::ClusterAdmin) => "default".into(),
    }
}

/// `GET /ui/api/fleet`: Nests (cluster admin only), deployments and instances.
pub async fn fleet(c: Caller) -> Result<Json<view::Fleet>, ApiErr> {
    let mut client = c.api();
    let (nests, nests_hidden) = match client
        .list_nests(c.req(pb::ListNestsRequest::default()))
        .await
    {
        Ok(r) => (
            r.into_inner().nests.iter().map(view::Nest::from).collect(),
            String::new(),
        ),
        Err(e) if e.code() == tonic::Code::PermissionDenied => {
            (Vec::new(), e.message().to_string())
        }
        Err(e) => return Err(e.into()),
    };
    let all = pb::ListDeploymentsRequest {
        namespace: String::new(),
        all_namespaces: true,
    };
    let deployments = client
        .list_deployments(c.req(all))
        .await?
        .into_inner()
        .deployments;
    let instances = client
        .list_instances(c.req(pb::ListInstancesRequest {
            all_namespaces: true,
            ..Default::default()
        }))
        .await?
        .into_inner()
        .instances;
    Ok(Json(view::Fleet {
        nests,
        nests_hidden,
        deployments: deployments.iter().map(view::Deployment::from).collect(),
        instances: instances.iter().map(view::Instance::from).collect(),
    }))
}

#[derive(Deserialize, Default)]
pub(super) struct TaskQuery {
    namespace: Option<String>,
    deployment: Option<String>,
    state: Option<String>,
    parent: Option<String>,
    /// `key=value`
    label: Option<String>,
    /// ms since the epoch: created at or after.
    since_ms: Option<i64>,
    /// ms since the epoch: created before.
    until_ms: Option<i64>,
    page_size: Option<u32>,
    page_token: Option<String>,
}

/// The `ListTasks` request of a task list query.
pub(super) fn list_request(s: &session::Session, q: TaskQuery) -> pb::ListTasksRequest {
    let (label_key, label_value) = match q.label.as_deref().filter(|l| !l.is_empty()) {
        Some(l) => match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    pb::ListTasksRequest {
        namespace: namespace_for(s, q.namespace.as_deref()),
        deployment: q.deployment.unwrap_or_default(),
        state: q.state.unwrap_or_default(),
        parent_task_id: q.parent.unwrap_or_default(),
        page_size: q.page_size.unwrap_or(50),
        page_token: q.page_token.unwrap_or_default(),
        label_key,
        label_value,
        created_after_ms: q.since_ms.unwrap_or(0),
        created_before_ms: q.until_ms.unwrap_or(0),
        ..Default::default()
    }
}

/// `GET /ui/api/tasks?namespace&deployment&state&parent&label&since_ms&until_ms&page_size&page_token`.
pub async fn tasks(c: Caller, Query(q): Query<TaskQuery>) -> Result<Json<view::TaskPage>, ApiErr> {
    let req = list_request(c.session(), q);
    let page = c.api().list_tasks(c.req(req)).await?.into_inner();
    Ok(Json(view::TaskPage::from(&page)))
}

/// `GET /ui/api/tasks/{namespace}/{task}`: the whole task, its children and artifacts.
pub async fn task(
    c: Caller,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Json<view::TaskDetail>, ApiErr> {
    let mut client = c.api();
    let task = client
        .get_task(c.req(pb::GetTaskRequest {
            namespace: namespace.clone(),
            task_id: task_id.clone(),
        }))
        .await?
        .into_inner();
    let children = client
        .list_tasks(c.req(pb::ListTasksRequest {
            namespace: namespace.clone(),
            parent_task_id: task_id.clone(),
            page_size: 1000,
            ..Default::default()
        }))
        .await?
        .into_inner()
        .tasks;
    let artifacts = client
        .list_artifacts(c.req(pb::ListArtifactsRequest { namespace, task_id }))
        .await?
        .into_inner()
        .artifacts;
    Ok(Json(view::TaskDetail {
        task: view::Task::from(&task),
        children: children.iter().map(view::Task::from).collect(),
        artifacts: artifacts.iter().map(view::Artifact::from).collect(),
    }))
}

/// `GET /ui/api/tasks/{namespace}/{task}/trace`.
pub async fn trace(
    c: Caller,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Json<view::Trace>, ApiErr> {
    let t = c
        .api()
        .get_trace(c.req(pb::GetTraceRequest { namespace, task_id }))
        .await?
        .into_inner();
    Ok(Json(view::Trace::from(&t)))
}

/// `GET /ui/api/tasks/{namespace}/{task}/logs`: the last lines of the task's instance.
pub async fn logs(
    c: Caller,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Json<Vec<view::LogLine>>, ApiErr> {
    let mut client = c.api();
    let task = client
        .get_task(c.req(pb::GetTaskRequest {
            namespace: namespace.clone(),
            task_id,
        }))
        .await?
        .into_inner();
    if task.instance_id.is_empty() {
        return Ok(Json(Vec::new()));
    }
    let read = pb::ReadLogsRequest {
        namespace,
        target: task.instance_id,
        tail: LOG_TAIL,
        ..Default::default()
    };
    let mut stream = client.read_logs(c.req(read)).await?.into_inner();
    let mut lines = Vec::new();
    while let Some(line) = stream.next().await {
        match line {
            Ok(l) => lines.push(view::LogLine::from(&l)),
            // The Nest is away: show what came.
            Err(e) if lines.is_empty() && e.code() != tonic::Code::Unavailable => {
                return Err(e.into())
            }
            Err(_) => break,
        }
    }
    let skip = lines.len().saturating_sub(LOG_TAIL as usize);
    Ok(Json(lines.split_off(skip)))
}

/// `POST /ui/api/tasks/{namespace}/{task}/cancel`.
pub async fn cancel(
    c: Caller,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Json<view::Task>, ApiErr> {
    c.mutating("CancelTask", &task_id).await?;
    let t = c
        .api()
        .cancel_task(c.req(pb::CancelTaskRequest {
            namespace,
            task_id,
            reason: format!(
                "cancelled in the web console by {}",
                c.principal().token_name()
            ),
        }))
        .await?
        .into_inner();
    Ok(Json(view::Task::from(&t)))
}

/// `GET /ui/api/artifacts/{namespace}/{artifact}`: the bytes, as a download (never rendered).
pub async fn artifact(
    c: Caller,
    Path((namespace, artifact_id)): Path<(String, String)>,
) -> Result<Response, ApiErr> {
    let mut stream = c
        .api()
        .get_artifact(c.req(pb::GetArtifactRequest {
            namespace,
            artifact_id: artifact_id.clone(),
        }))
        .await?
        .into_inner();
    let mut name = artifact_id;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if let Some(a) = chunk.artifact {
            name = a.name;
        }
        bytes.extend_from_slice(&chunk.data);
        if bytes.len() > MAX_DOWNLOAD {
            return Err(ApiErr(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the artifact is larger than the console downloads (64 MiB); use `agen artifacts get`".into(),
            ));
        }
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut res = bytes.into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{safe}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}

#[derive(Deserialize, Default)]
pub(super) struct NsQuery {
    pub(super) namespace: Option<String>,
}

/// `GET /ui/api/approvals?namespace`: every waiting call.
pub async fn approvals(
    c: Caller,
    Query(q): Query<NsQuery>,
) -> Result<Json<Vec<view::Approval>>, ApiErr> {
    let list = c
        .api()
        .list_approvals(c.req(pb::ListApprovalsRequest {
            namespace: namespace_for(c.session(), q.namespace.as_deref()),
            deployment: String::new(),
        }))
        .await?
        .into_inner();
    Ok(Json(
        list.approvals.iter().map(view::Approval::from).collect(),
    ))
}

#[derive(Deserialize)]
pub struct Decide {
    namespace: String,
    task_id: String,
    call_id: String,
    approved: bool,
    #[serde(default)]
    always: bool,
    #[serde(default)]
    reason: String,
}

/// `POST /ui/api/approvals/decide`: approve (`always` too) or deny with a reason.
pub async fn decide(c: Caller, Json(d): Json<Decide>) -> Result<Json<view::Approval>, ApiErr> {
    c.mutating("DecideApproval", &d.task_id).await?;
    let r = c
        .api()
        .decide_approval(c.req(pb::DecideApprovalRequest {
            namespace: d.namespace,
            task_id: d.task_id,
            call_id: d.call_id,
            approved: d.approved,
            reason: d.reason,
            always: d.always,
            // The console approves calls as they were asked (no edited arguments).
            arguments_json: String::new(),
        }))
        .await?
        .into_inner();
    let a = r.approval.unwrap_or_default();
    Ok(Json(view::Approval::from(&a)))
}

/// `GET /ui/api/deployments/{namespace}/{name}`: the deployment, its instances, its history.
pub async fn deployment(
    c: Caller,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<view::DeploymentPage>, ApiErr> {
    let mut client = c.api();
    let d = client
        .get_deployment(c.req(pb::GetDeploymentRequest {
            namespace: namespace.clone(),
            name: name.clone(),
        }))
        .await?
        .into_inner();
    let history = client
        .list_deployment_history(c.req(pb::ListDeploymentHistoryRequest { namespace, name }))
        .await?
        .into_inner();
    Ok(Json(view::DeploymentPage {
        deployment: d.deployment.as_ref().map(view::Deployment::from),
        instances: d.instances.iter().map(view::Instance::from).collect(),
        revisions: history.revisions.iter().map(view::Revision::from).collect(),
    }))
}

#[derive(Deserialize)]
pub struct Scale {
    replicas: u32,
}

/// `POST /ui/api/deployments/{namespace}/{name}/scale {"replicas": N}`.
pub async fn scale(
    c: Caller,
    Path((namespace, name)): Path<(String, String)>,
    Json(b): Json<Scale>,
) -> Result<Json<view::Deployment>, ApiErr> {
    c.mutating("ScaleDeployment", &name).await?;
    let d = c
        .api()
        .scale_deployment(c.req(pb::ScaleDeploymentRequest {
            namespace,
            name,
            replicas: b.replicas,
        }))
        .await?
        .into_inner();
    Ok(Json(view::Deployment::from(&d)))
}

#[derive(Deserialize)]
pub struct Rollback {
    #[serde(default)]
    to_generation: u64,
}

/// `POST /ui/api/deployments/{namespace}/{name}/rollback {"to_generation": N}`.
pub async fn rollback(
    c: Caller,
    Path((namespace, name)): Path<(String, String)>,
    Json(b): Json<Rollback>,
) -> Result<Json<view::Deployment>, ApiErr> {
    c.mutating("RollbackDeployment", &name).await?;
    let d = c
        .api()
        .rollback_deployment(c.req(pb::RollbackDeploymentRequest {
            namespace,
            name,
            to_generation: b.to_generation,
        }))
        .await?
        .into_inner();
    Ok(Json(view::Deployment::from(&d)))
}

#[derive(Deserialize, Default)]
pub struct AuditQuery {
    namespace: Option<String>,
    since_ms: Option<i64>,
    limit: Option<u32>,
}

/// `GET /ui/api/audit?namespace&since_ms&limit` (admin roles; the page filters further).
pub async fn audit(
    c: Caller,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Vec<view::AuditEntry>>, ApiErr> {
    let all = q.namespace.as_deref().is_none_or(str::is_empty);
    let r = c
        .api()
        .list_audit(c.req(pb::ListAuditRequest {
            namespace: namespace_for(c.session(), q.namespace.as_deref()),
            all_namespaces: all && *c.principal() == Principal::ClusterAdmin,
            since_ms: q.since_ms.unwrap_or(0),
            limit: q.limit.unwrap_or(500),
        }))
        .await?
        .into_inner();
    Ok(Json(r.entries.iter().map(view::AuditEntry::from).collect()))
}
