//! The fleet client: one `Hub` connection (resolved exactly as the CLI resolves it: arguments,
//! then the client config) and the calls the Python `Client` makes; `EventStream` follows a
//! task's events and re-attaches after a dropped stream from the next sequence number, so no
//! event is lost or repeated.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use agen_cli::client::{status_error_at, Client, ClientArgs, Output};
use agen_cli::{cmd, view};
use agen_proto::v1 as pb;
use futures::StreamExt;
use pyo3::prelude::*;
use serde_json::{json, Value};

use crate::{block, cli_error, error, rt};

/// A connection to a Hub (lazy: the first call reports an unreachable Hub).
#[pyclass(frozen, module = "agen._native")]
pub struct Hub {
    client: Client,
    url: String,
    namespace: String,
}

impl Hub {
    fn fail(&self, s: tonic::Status) -> PyErr {
        cli_error(status_error_at(&self.url, s))
    }

    fn inner(&self) -> agen_cli::client::Hub {
        agen_cli::client::Hub {
            client: self.client.clone(),
            url: self.url.clone(),
            namespace: self.namespace.clone(),
            ca_file: None,
        }
    }
}

/// What `submit` sends, as the Python layer gives it.
#[derive(serde::Deserialize)]
struct Submit {
    deployment: String,
    input: String,
    #[serde(default)]
    conversation_key: Option<String>,
    #[serde(default)]
    labels: HashMap<String, String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    ask: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    client_request_id: Option<String>,
    #[serde(default)]
    traceparent: Option<String>,
    /// reject|enqueue|interrupt|rollback; none: the bundle's `doubleTexting`.
    #[serde(default)]
    double_texting: Option<String>,
    /// URLs told (signed POST) when the task ends.
    #[serde(default)]
    webhooks: Vec<String>,
    /// The `webhooks` are also told when the task waits for an approval.
    #[serde(default)]
    webhook_on_waiting: bool,
}

#[pymethods]
impl Hub {
    /// Connects as the CLI would with `--hub`, `--token`, `--ca-file`, `--namespace`: a
    /// missing value comes from the client config (`$AGEN_CONFIG` or ~/.config/agen/config.toml).
    #[new]
    #[pyo3(signature = (hub=None, token=None, ca_file=None, namespace=None))]
    fn new(
        hub: Option<String>,
        token: Option<String>,
        ca_file: Option<PathBuf>,
        namespace: Option<String>,
    ) -> PyResult<Hub> {
        let args = ClientArgs {
            hub,
            namespace: namespace.unwrap_or_else(|| "default".into()),
            token,
            ca_file,
            output: Output::Json,
        };
        let _in_runtime = rt().enter();
        let h = args.connect().map_err(cli_error)?;
        Ok(Hub {
            client: h.client,
            url: h.url,
            namespace: h.namespace,
        })
    }

    /// The Hub URL this connection uses.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// The namespace every call is made in.
    #[getter]
    fn namespace(&self) -> String {
        self.namespace.clone()
    }

    /// Uploads the bundle folder `dir` and creates or rolls deployment `name` (default: the
    /// bundle's name); with `wait`, until every replica runs it and is healthy. The answer has
    /// the deployment, its instances and what `agen deploy` would warn about (`warnings`).
    /// `webhook` (signed with platform secret `webhook_secret`) is told of every task's end
    /// (and wait, with `webhook_on_waiting`); a deploy without one removes the deployment's.
    #[pyo3(signature = (dir, name=None, replicas=None, wait=false, timeout_s=120.0, webhook=None, webhook_secret=None, webhook_on_waiting=false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one for one
    fn deploy(
        &self,
        py: Python<'_>,
        dir: PathBuf,
        name: Option<String>,
        replicas: Option<u32>,
        wait: bool,
        timeout_s: f64,
        webhook: Option<String>,
        webhook_secret: Option<String>,
        webhook_on_waiting: bool,
    ) -> PyResult<String> {
        let hook = webhook.map(|url| {
            (
                pb::WebhookTarget {
                    url,
                    on_waiting: webhook_on_waiting,
                },
                webhook_secret.unwrap_or_default(),
            )
        });
        let loaded = cmd::deploy::validate(&dir).map_err(|e| {
            error(
                agen_cli::exit::code::USAGE,
                format!("bundle {} is not valid: {e:#}", dir.display()),
            )
        })?;
        let name = name.unwrap_or_else(|| cmd::deploy::default_name(&loaded));
        let warnings = cmd::deploy::warnings(&dir, &loaded);
        let mut hub = self.inner();
        let timeout = Duration::try_from_secs_f64(timeout_s).unwrap_or(Duration::from_secs(120));
        let got = block(py, async move {
            let replicas = match replicas {
                Some(n) => n,
                None => match hub
                    .client
                    .get_deployment(pb::GetDeploymentRequest {
                        namespace: hub.namespace.clone(),
                        name: name.clone(),
                    })
                    .await
                {
                    Ok(d) => d.into_inner().deployment.map_or(1, |d| d.replicas),
                    Err(s) if s.code() == tonic::Code::NotFound => 1,
                    Err(s) => return Err(status_error_at(&hub.url, s)),
                },
            };
            let dep =
                cmd::deploy::deploy_with(&mut hub, &dir, &name, (replicas, 1), &[], hook).await?;
            if wait {
                cmd::deploy::wait_ready(&mut hub, &dep, timeout).await?;
            }
            deployment(&mut hub, &name).await
        })?;
        let mut v: Value = serde_json::from_str(&got.map_err(cli_error)?)
            .expect("deployment() gives JSON it made itself");
        v["warnings"] = json!(warnings);
        Ok(v.to_string())
    }

    /// Sets deployment `name`'s replica count.
    fn scale(&self, py: Python<'_>, name: String, replicas: u32) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ScaleDeploymentRequest {
            namespace: self.namespace.clone(),
            name,
            replicas,
        };
        let d = block(py, async move { c.scale_deployment(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(view::deployment_json(&d).to_string())
    }

    /// Deployment `name` with its instances.
    fn deployment(&self, py: Python<'_>, name: String) -> PyResult<String> {
        let mut hub = self.inner();
        block(py, async move { deployment(&mut hub, &name).await })?.map_err(cli_error)
    }

    /// Every deployment of the namespace.
    fn deployments(&self, py: Python<'_>) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ListDeploymentsRequest {
            namespace: self.namespace.clone(),
            all_namespaces: false,
        };
        let list = block(py, async move { c.list_deployments(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner()
            .deployments;
        Ok(Value::Array(list.iter().map(view::deployment_json).collect()).to_string())
    }

    /// Queues a task (`request` is the JSON of `Submit`); a retry with the same
    /// `client_request_id` returns the same task.
    fn submit(&self, py: Python<'_>, request: String) -> PyResult<String> {
        let s: Submit = serde_json::from_str(&request)
            .map_err(|e| error(agen_cli::exit::code::USAGE, format!("submit request: {e}")))?;
        if s.timeout_ms == Some(0) {
            return Err(error(
                agen_cli::exit::code::USAGE,
                "timeout: expected a duration above zero, such as 90 seconds",
            ));
        }
        if s.max_tokens == Some(0) {
            return Err(error(
                agen_cli::exit::code::USAGE,
                "max_tokens: expected a number above zero",
            ));
        }
        let req = pb::SubmitTaskRequest {
            namespace: self.namespace.clone(),
            deployment: s.deployment,
            input: s.input,
            labels: s.labels,
            conversation_key: s.conversation_key.unwrap_or_default(),
            client_request_id: s
                .client_request_id
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            tool_overrides: Some(pb::ToolOverrides {
                allow: s.allow,
                ask: s.ask,
                deny: s.deny,
            }),
            traceparent: s.traceparent.unwrap_or_default(),
            timeout_ms: s.timeout_ms.unwrap_or(0),
            max_tokens: s.max_tokens.unwrap_or(0),
            webhooks: s
                .webhooks
                .into_iter()
                .map(|url| pb::WebhookTarget {
                    url,
                    on_waiting: s.webhook_on_waiting,
                })
                .collect(),
            double_texting: s.double_texting.unwrap_or_default(),
            output_schema_json: String::new(),
        };
        let mut c = self.client.clone();
        let task = block(py, async move {
            // Retrying with the same request id is safe: the Hub creates one task.
            let mut tries = 0;
            loop {
                match c.submit_task(req.clone()).await {
                    Err(s) if s.code() == tonic::Code::Unavailable && tries < 3 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(300 * tries)).await;
                    }
                    other => break other,
                }
            }
        })?
        .map_err(|s| self.fail(s))?
        .into_inner();
        Ok(view::task_json(&task).to_string())
    }

    /// Task `task_id` as it is now.
    fn task(&self, py: Python<'_>, task_id: String) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::GetTaskRequest {
            namespace: self.namespace.clone(),
            task_id,
        };
        let t = block(py, async move { c.get_task(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(view::task_json(&t).to_string())
    }

    /// Cancels task `task_id`.
    #[pyo3(signature = (task_id, reason=String::new()))]
    fn cancel(&self, py: Python<'_>, task_id: String, reason: String) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::CancelTaskRequest {
            namespace: self.namespace.clone(),
            task_id,
            reason,
        };
        let t = block(py, async move { c.cancel_task(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(view::task_json(&t).to_string())
    }

    /// Follows task `task_id`'s events from sequence number `from_seq`; with `deltas`, the
    /// model's streamed text too (`model.delta` / `delta.reset`, not durable: `seq` 0).
    #[pyo3(signature = (task_id, from_seq=0, deltas=false))]
    fn watch(&self, task_id: String, from_seq: u64, deltas: bool) -> EventStream {
        EventStream {
            client: self.client.clone(),
            url: self.url.clone(),
            namespace: self.namespace.clone(),
            task_id,
            deltas,
            state: Mutex::new(Follow {
                next_seq: from_seq,
                stream: None,
                ended: false,
            }),
        }
    }

    /// Pending approvals of `ask` calls (of one deployment, or all).
    #[pyo3(signature = (deployment=None))]
    fn approvals(&self, py: Python<'_>, deployment: Option<String>) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ListApprovalsRequest {
            namespace: self.namespace.clone(),
            deployment: deployment.unwrap_or_default(),
        };
        let list = block(py, async move { c.list_approvals(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner()
            .approvals;
        Ok(Value::Array(list.iter().map(cmd::approvals::approval_json).collect()).to_string())
    }

    /// Approves or denies a pending `ask` call of `task_id` (`call_id` may be empty when the
    /// task waits on exactly one).
    #[pyo3(signature = (task_id, call_id, approved, reason=String::new(), always=false))]
    fn decide(
        &self,
        py: Python<'_>,
        task_id: String,
        call_id: String,
        approved: bool,
        reason: String,
        always: bool,
    ) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::DecideApprovalRequest {
            namespace: self.namespace.clone(),
            task_id,
            call_id,
            approved,
            reason,
            always,
            arguments_json: String::new(),
        };
        let d = block(py, async move { c.decide_approval(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        let mut v = cmd::approvals::approval_json(&d.approval.unwrap_or_default());
        v["approved"] = Value::Bool(d.approved);
        v["reason"] = Value::String(d.reason);
        v["by"] = Value::String(d.by);
        Ok(v.to_string())
    }

    /// Artifacts of task `task_id` (or of the namespace).
    #[pyo3(signature = (task_id=None))]
    fn artifacts(&self, py: Python<'_>, task_id: Option<String>) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ListArtifactsRequest {
            namespace: self.namespace.clone(),
            task_id: task_id.unwrap_or_default(),
        };
        let list = block(py, async move { c.list_artifacts(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner()
            .artifacts;
        Ok(Value::Array(list.iter().map(artifact_json).collect()).to_string())
    }

    /// Writes artifact `artifact_id` to `path`; returns its size.
    fn download(&self, py: Python<'_>, artifact_id: String, path: PathBuf) -> PyResult<u64> {
        let mut c = self.client.clone();
        let req = pb::GetArtifactRequest {
            namespace: self.namespace.clone(),
            artifact_id,
        };
        let data = block(py, async move {
            let mut stream = c.get_artifact(req).await?.into_inner();
            let mut data = Vec::new();
            while let Some(chunk) = stream.next().await {
                data.extend_from_slice(&chunk?.data);
            }
            Ok::<_, tonic::Status>(data)
        })?
        .map_err(|s| self.fail(s))?;
        std::fs::write(&path, &data).map_err(|e| {
            error(
                agen_cli::exit::code::FAILED,
                format!("cannot write the artifact to {}: {e}", path.display()),
            )
        })?;
        Ok(data.len() as u64)
    }

    /// Task `task_id`'s trace: its spans (model turns, tool calls).
    fn trace(&self, py: Python<'_>, task_id: String) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::GetTraceRequest {
            namespace: self.namespace.clone(),
            task_id,
        };
        let t = block(py, async move { c.get_trace(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        let spans: Vec<Value> = t
            .spans
            .iter()
            .map(|s| {
                json!({"span_id": s.span_id, "parent_span_id": s.parent_span_id, "name": s.name,
                       "start_ms": s.start_ms, "end_ms": s.end_ms, "status": s.status,
                       "attributes": s.attributes})
            })
            .collect();
        Ok(json!({"task_id": t.task_id, "trace_id": t.trace_id, "spans": spans}).to_string())
    }

    /// Creates a schedule (`request` is the JSON of `NewSchedule`); the answer is the
    /// schedule as `agen schedules create -o json` shows it.
    fn create_schedule(&self, py: Python<'_>, request: String) -> PyResult<String> {
        let s: NewSchedule = serde_json::from_str(&request).map_err(|e| {
            error(
                agen_cli::exit::code::USAGE,
                format!("schedule request: {e}"),
            )
        })?;
        let req = pb::CreateScheduleRequest {
            namespace: self.namespace.clone(),
            deployment: s.deployment,
            cron: s.cron,
            timezone: s.timezone,
            input: s.input,
            conversation_key: s.conversation_key.unwrap_or_default(),
            overlap: s.overlap,
            catch_up: s.catch_up,
        };
        let mut c = self.client.clone();
        let got = block(py, async move { c.create_schedule(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(cmd::schedules::schedule_json(&got).to_string())
    }

    /// The namespace's schedules.
    fn schedules(&self, py: Python<'_>) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ListSchedulesRequest {
            namespace: self.namespace.clone(),
        };
        let all = block(py, async move { c.list_schedules(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner()
            .schedules;
        Ok(Value::Array(all.iter().map(cmd::schedules::schedule_json).collect()).to_string())
    }

    /// `pause`, `resume` or `delete` schedule `schedule_id`; the answer is the schedule after.
    fn change_schedule(
        &self,
        py: Python<'_>,
        schedule_id: String,
        change: String,
    ) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ScheduleRequest {
            namespace: self.namespace.clone(),
            schedule_id,
        };
        let got = block(py, async move {
            match change.as_str() {
                "pause" => c.pause_schedule(req).await,
                "resume" => c.resume_schedule(req).await,
                "delete" => c.delete_schedule(req).await,
                other => Err(tonic::Status::invalid_argument(format!(
                    "schedule change {other:?}: expected pause, resume or delete"
                ))),
            }
        })?
        .map_err(|s| self.fail(s))?
        .into_inner();
        Ok(cmd::schedules::schedule_json(&got).to_string())
    }

    /// Submits schedule `schedule_id`'s task now; the answer is the task.
    fn run_schedule(&self, py: Python<'_>, schedule_id: String) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ScheduleRequest {
            namespace: self.namespace.clone(),
            schedule_id,
        };
        let t = block(py, async move { c.run_schedule(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner();
        Ok(view::task_json(&t).to_string())
    }

    /// Task `task_id`'s webhook deliveries as `agen tasks webhooks -o json` shows them.
    fn task_webhooks(&self, py: Python<'_>, task_id: String) -> PyResult<String> {
        let mut c = self.client.clone();
        let req = pb::ListTaskWebhooksRequest {
            namespace: self.namespace.clone(),
            task_id,
        };
        let all = block(py, async move { c.list_task_webhooks(req).await })?
            .map_err(|s| self.fail(s))?
            .into_inner()
            .deliveries;
        Ok(Value::Array(all.iter().map(cmd::task_webhooks::delivery_json).collect()).to_string())
    }
}

/// What `create_schedule` sends, as the Python layer gives it (the Hub checks every field and
/// names the bad one).
#[derive(serde::Deserialize)]
struct NewSchedule {
    deployment: String,
    cron: String,
    timezone: String,
    input: String,
    #[serde(default)]
    conversation_key: Option<String>,
    overlap: String,
    catch_up: String,
}

async fn deployment(hub: &mut agen_cli::client::Hub, name: &str) -> anyhow::Result<String> {
    let d = hub
        .client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: name.to_owned(),
        })
        .await
        .map_err(|s| status_error_at(&hub.url, s))?
        .into_inner();
    let mut v = d
        .deployment
        .as_ref()
        .map_or(Value::Null, view::deployment_json);
    v["instances"] = Value::Array(d.instances.iter().map(view::instance_json).collect());
    Ok(v.to_string())
}

fn artifact_json(a: &pb::Artifact) -> Value {
    json!({"id": a.artifact_id, "name": a.name, "media_type": a.media_type, "size": a.size,
           "task_id": a.task_id, "created_at_ms": a.created_at_ms})
}

/// Where a follow stands: the next sequence number it wants, the open stream if any.
struct Follow {
    next_seq: u64,
    stream: Option<tonic::Streaming<pb::TaskEvent>>,
    ended: bool,
}

/// A task's events, in order, each once: after a dropped stream it attaches again from the
/// sequence number after the last event it gave.
#[pyclass(frozen, module = "agen._native")]
pub struct EventStream {
    client: Client,
    url: String,
    namespace: String,
    task_id: String,
    deltas: bool,
    state: Mutex<Follow>,
}

/// Re-attaching gives up after this many failures in a row (the Hub stays unreachable).
const MAX_REATTACH: u32 = 20;

#[pymethods]
impl EventStream {
    /// The next event as JSON (`seq`, `at_ms`, `kind`, `body`, `task`), or `None` once the
    /// task ended (its terminal `task.state` event was the last one given). With `timeout_s`,
    /// raises `WaitTimeout` when no event came in time (nothing is lost: the next call goes on
    /// from the same place).
    #[pyo3(signature = (timeout_s=None))]
    fn next(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<Option<String>> {
        let mut st = self
            .state
            .lock()
            .map_err(|_| error(1, "the event stream was poisoned by a panic"))?;
        if st.ended {
            return Ok(None);
        }
        let st = &mut *st;
        let limit = timeout_s
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
            .unwrap_or(Duration::MAX);
        let follow = async {
            let mut failures = 0u32;
            loop {
                if st.stream.is_none() {
                    let mut c = self.client.clone();
                    let req = pb::WatchTaskRequest {
                        namespace: self.namespace.clone(),
                        task_id: self.task_id.clone(),
                        from_seq: st.next_seq,
                        deltas: self.deltas,
                    };
                    match c.watch_task(req).await {
                        Ok(s) => st.stream = Some(s.into_inner()),
                        Err(s)
                            if s.code() == tonic::Code::Unavailable && failures < MAX_REATTACH =>
                        {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(250)).await;
                            continue;
                        }
                        Err(s) => return Err(s),
                    }
                }
                let Some(stream) = st.stream.as_mut() else {
                    continue;
                };
                match stream.next().await {
                    // Streamed text is not durable: it has no place in the sequence (a stream
                    // attached again starts with a reset carrying the turn so far).
                    Some(Ok(ev)) if ev.delta.is_some() => return Ok(Some(ev)),
                    Some(Ok(ev)) if ev.seq < st.next_seq => continue,
                    Some(Ok(ev)) => {
                        st.next_seq = ev.seq + 1;
                        return Ok(Some(ev));
                    }
                    // Dropped or ended early: attach again from the next sequence number.
                    Some(Err(_)) | None => {
                        st.stream = None;
                        failures += 1;
                        if failures > MAX_REATTACH {
                            return Ok(None);
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        let got = block(py, async { tokio::time::timeout(limit, follow).await })?;
        let Ok(got) = got else {
            return Err(error(
                agen_cli::exit::code::WAIT_TIMEOUT,
                format!("task {} had no new event within {limit:?}", self.task_id),
            ));
        };
        let ev = match got {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                return Err(error(
                    agen_cli::exit::code::UNAVAILABLE,
                    format!(
                        "the Hub at {} kept dropping the event stream of task {}",
                        self.url, self.task_id
                    ),
                ))
            }
            Err(s) => return Err(cli_error(status_error_at(&self.url, s))),
        };
        if let Some(d) = &ev.delta {
            let body =
                json!({"attempt": d.attempt, "turn": d.turn, "text": d.text, "reset": d.reset});
            return Ok(Some(
                json!({"seq": 0, "at_ms": ev.at_ms, "kind": ev.kind, "body": body, "task": null})
                    .to_string(),
            ));
        }
        let body: Value = serde_json::from_str(&ev.json).unwrap_or(Value::String(ev.json));
        let task = ev.task.as_ref().map_or(Value::Null, view::task_json);
        if ev.kind == "task.state"
            && ev
                .task
                .as_ref()
                .is_some_and(|t| view::task_terminal(t.state))
        {
            st.ended = true;
            st.stream = None;
        }
        Ok(Some(
            json!({"seq": ev.seq, "at_ms": ev.at_ms, "kind": ev.kind, "body": body, "task": task})
                .to_string(),
        ))
    }

    /// The sequence number the next event will have at least.
    #[getter]
    fn next_seq(&self) -> PyResult<u64> {
        self.state
            .lock()
            .map(|s| s.next_seq)
            .map_err(|_| error(1, "the event stream was poisoned by a panic"))
    }
}
