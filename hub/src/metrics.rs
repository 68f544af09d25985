//! The Hub's Prometheus metrics (`--metrics-listen ADDR`, `GET /metrics`): counters and
//! histograms fed by the task updates every watcher sees (task states, model turns, tool
//! calls, run events), the store's flushes (the leaf `store_metrics.rs` counts them), and gauges read from the core state at scrape
//! time (queue depth, Nest heartbeat age, instance restarts, artifact bytes).
//!
//! Invariants: metrics never block or fail the Hub (a lagging subscriber loses counts and says
//! so, it never slows a writer); label values come from names the Hub already validated
//! (namespace, deployment, tool, model, nest), never from free text.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use agen_contract::run::RunEventBody;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::core::Core;
use crate::model::TaskUpdate;
use crate::store_metrics::seconds_histogram;
pub use crate::store_metrics::{store_flushed, store_fsyncs};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    namespace: String,
    deployment: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeploymentLabels {
    namespace: String,
    deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    namespace: String,
    deployment: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    namespace: String,
    deployment: String,
    model: String,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolStatusLabels {
    namespace: String,
    deployment: String,
    tool: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    namespace: String,
    deployment: String,
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OnlyDeployment {
    namespace: String,
    deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NestLabel {
    nest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabel {
    limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamespaceLabel {
    namespace: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of one Hub.
pub struct HubMetrics {
    registry: Registry,
    tasks: Family<TaskLabels, Counter>,
    queue_depth: Family<DeploymentLabels, Gauge>,
    dispatch_latency: Histogram,
    task_duration: Hist<DeploymentLabels>,
    model_duration: Hist<ModelLabels>,
    model_tokens: Family<TokenLabels, Counter>,
    tool_calls: Family<ToolStatusLabels, Counter>,
    tool_duration: Hist<ToolLabels>,
    restarts: Family<OnlyDeployment, Counter>,
    heartbeat_age: Family<NestLabel, Gauge<f64, AtomicU64>>,
    run_events: Counter,
    artifact_bytes: Family<NamespaceLabel, Gauge>,
    streams_open: Family<StreamLabel, Gauge>,
    streams_refused: Family<StreamLabel, Counter>,
    limit_refused: Family<LimitLabel, Counter>,
    is_leader: Gauge,
    connections_refused: Family<ReasonLabel, Counter>,
    ops: OpsGauges,
    /// What the event loop remembers between events.
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    /// `model.requested` time by (task, attempt).
    model_requested: HashMap<(String, u32), i64>,
    /// Tasks already dispatched once (the dispatch latency is the first start's).
    dispatched: HashSet<String>,
    /// The model each bundle's agent uses, by digest.
    models: HashMap<String, String>,
    /// The label values seen per (deployment, label) ([`MAX_LABEL_VALUES`]).
    label_values: HashMap<(String, &'static str), HashSet<String>>,
}

/// Distinct values a label that comes from a bundle or a model (`tool`, `model`) takes per
/// deployment; later ones (and any over [`MAX_LABEL_VALUE_BYTES`]) are counted as `other`, so a
/// model inventing tool names cannot grow the series without bound.
pub const MAX_LABEL_VALUES: usize = 64;
/// The longest such label value kept as it is.
pub const MAX_LABEL_VALUE_BYTES: usize = 128;

impl Open {
    /// `value` as the `label` of `deployment`'s series: itself while the deployment has fewer
    /// than [`MAX_LABEL_VALUES`] distinct ones, else `other`.
    fn bounded(&mut self, deployment: &str, label: &'static str, value: &str) -> String {
        if value.len() > MAX_LABEL_VALUE_BYTES {
            return "other".into();
        }
        let seen = self
            .label_values
            .entry((deployment.to_string(), label))
            .or_default();
        if seen.contains(value) || (seen.len() < MAX_LABEL_VALUES && seen.insert(value.to_string()))
        {
            value.to_string()
        } else {
            "other".into()
        }
    }
}

impl HubMetrics {
    pub fn new() -> Arc<HubMetrics> {
        let mut registry = Registry::default();
        let m = HubMetrics {
            tasks: Family::default(),
            queue_depth: Family::default(),
            dispatch_latency: seconds_histogram(),
            task_duration: Family::new_with_constructor(seconds_histogram),
            model_duration: Family::new_with_constructor(seconds_histogram),
            model_tokens: Family::default(),
            tool_calls: Family::default(),
            tool_duration: Family::new_with_constructor(seconds_histogram),
            restarts: Family::default(),
            heartbeat_age: Family::default(),
            run_events: Counter::default(),
            artifact_bytes: Family::default(),
            streams_open: Family::default(),
            streams_refused: Family::default(),
            limit_refused: Family::default(),
            is_leader: Gauge::default(),
            connections_refused: Family::default(),
            ops: OpsGauges::default(),
            open: Mutex::new(Open::default()),
            registry: Registry::default(),
        };
        crate::rpc_metrics::register(&mut registry);
        registry.register(
            "agen_hub_streams_open",
            "Open server streams of each kind (WatchTask, WatchDeployments, WatchNests, logs follow, A2A SSE)",
            m.streams_open.clone(),
        );
        registry.register(
            "agen_hub_streams_refused",
            "Streams refused at their cap (--max-streams-per-token, --max-streams)",
            m.streams_refused.clone(),
        );
        registry.register(
            "agen_hub_limit_refused",
            "Refusals by a scale limit (nests: --max-nests, queued_tasks: --max-queued-tasks)",
            m.limit_refused.clone(),
        );
        registry.register("agen_hub_is_leader", IS_LEADER_HELP, m.is_leader.clone());
        registry.register(
            "agen_hub_connections_refused",
            "Connections to the Hub's port refused or cut by the connection gate, by reason",
            m.connections_refused.clone(),
        );
        registry.register(
            "agen_tasks",
            "Tasks that entered each state",
            m.tasks.clone(),
        );
        registry.register(
            "agen_queue_depth",
            "Tasks queued, waiting for an instance",
            m.queue_depth.clone(),
        );
        registry.register(
            "agen_dispatch_latency_seconds",
            "From submit to the first start of a run",
            m.dispatch_latency.clone(),
        );
        registry.register(
            "agen_task_duration_seconds",
            "From submit to a terminal state",
            m.task_duration.clone(),
        );
        registry.register(
            "agen_model_request_duration_seconds",
            "One model turn, requested to answered",
            m.model_duration.clone(),
        );
        registry.register(
            "agen_model_tokens",
            "Model tokens by type (input, output)",
            m.model_tokens.clone(),
        );
        registry.register(
            "agen_tool_calls",
            "Tool calls by status (ok, error, failed)",
            m.tool_calls.clone(),
        );
        registry.register(
            "agen_tool_call_duration_seconds",
            "One tool call",
            m.tool_duration.clone(),
        );
        registry.register(
            "agen_instance_restarts",
            "Instance process restarts reported by Nests",
            m.restarts.clone(),
        );
        registry.register(
            "agen_nest_heartbeat_age_seconds",
            "Time since each Nest was last heard from",
            m.heartbeat_age.clone(),
        );
        registry.register(
            "agen_run_events_appended",
            "Run events stored",
            m.run_events.clone(),
        );
        crate::store_metrics::register(&mut registry);
        registry.register(
            "agen_hub_otlp_spans_exported",
            "Spans the OTLP collector accepted",
            crate::otlp::SPANS_EXPORTED.clone(),
        );
        registry.register(
            "agen_hub_otlp_spans_dropped",
            "Spans not exported over OTLP: the export queue was full, the export failed, or the Hub stopped first",
            crate::otlp::SPANS_DROPPED.clone(),
        );
        registry.register(
            "agen_artifact_bytes",
            "Artifact bytes stored per namespace",
            m.artifact_bytes.clone(),
        );
        m.ops.register(&mut registry);
        Arc::new(HubMetrics { registry, ..m })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Follows the core's task updates until the Hub stops.
    pub fn follow(self: &Arc<Self>, core: Arc<Core>) {
        let me = self.clone();
        let mut updates = core.subscribe();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    n = updates.recv() => n,
                    _ = core.stopping.cancelled() => return,
                };
                match next {
                    Ok(u) => me.on_update(&core, &u),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(
                            missed = n,
                            "metrics fell behind the task updates; {n} events are not counted"
                        );
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    fn on_update(&self, core: &Core, u: &TaskUpdate) {
        let task = &u.task;
        let (ns, dep) = (task.namespace.clone(), task.deployment.clone());
        let at = u.event.at_ms;
        let secs = |from: i64| ((at - from).max(0) as f64) / 1000.0;
        if u.event.kind == "task.state" {
            let state = task.state.as_str().to_string();
            self.tasks
                .get_or_create(&TaskLabels {
                    namespace: ns.clone(),
                    deployment: dep.clone(),
                    state,
                })
                .inc();
            let mut open = self.open();
            if task.state == crate::model::TaskState::Running
                && open.dispatched.insert(task.task_id.clone())
            {
                self.dispatch_latency.observe(secs(task.created_at_ms));
            }
            if task.state.is_terminal() {
                open.dispatched.remove(&task.task_id);
                open.model_requested.retain(|(t, _), _| t != &task.task_id);
                self.task_duration
                    .get_or_create(&DeploymentLabels {
                        namespace: ns,
                        deployment: dep,
                    })
                    .observe(secs(task.created_at_ms));
            }
            return;
        }
        if u.event.kind.starts_with("task.") && u.event.kind != "task.progress" {
            return;
        }
        self.run_events.inc();
        let read_here;
        let body = match u.body.as_deref() {
            Some(body) => body,
            None => {
                read_here = RunEventBody::from_wire_lossy(&u.event.kind, &u.event.json);
                &read_here
            }
        };
        match body {
            RunEventBody::ModelRequested(_) => {
                self.open()
                    .model_requested
                    .insert((task.task_id.clone(), task.attempt), at);
            }
            RunEventBody::ModelAnswered(a) => {
                let model = self.model_of(core, &task.bundle_digest);
                let model = self.open().bounded(&dep, "model", &model);
                let requested = self
                    .open()
                    .model_requested
                    .remove(&(task.task_id.clone(), task.attempt));
                if let Some(from) = requested {
                    self.model_duration
                        .get_or_create(&ModelLabels {
                            namespace: ns.clone(),
                            deployment: dep.clone(),
                            model: model.clone(),
                        })
                        .observe(secs(from));
                }
                if let Some(usage) = &a.usage {
                    for (kind, n) in [
                        ("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                    ] {
                        self.model_tokens
                            .get_or_create(&TokenLabels {
                                namespace: ns.clone(),
                                deployment: dep.clone(),
                                model: model.clone(),
                                r#type: kind.into(),
                            })
                            .inc_by(n);
                    }
                }
            }
            RunEventBody::ToolCompleted(c) => {
                let status = if c.is_error { "error" } else { "ok" };
                self.tool(&ns, &dep, &c.tool, status, c.duration_ms);
            }
            RunEventBody::ToolFailed(f) => self.tool(&ns, &dep, &f.tool, "failed", f.duration_ms),
            _ => {}
        }
    }

    fn tool(&self, ns: &str, dep: &str, tool: &str, status: &str, duration_ms: u64) {
        let tool = self.open().bounded(&format!("{ns}/{dep}"), "tool", tool);
        let tool = tool.as_str();
        self.tool_calls
            .get_or_create(&ToolStatusLabels {
                namespace: ns.into(),
                deployment: dep.into(),
                tool: tool.into(),
                status: status.into(),
            })
            .inc();
        self.tool_duration
            .get_or_create(&ToolLabels {
                namespace: ns.into(),
                deployment: dep.into(),
                tool: tool.into(),
            })
            .observe(duration_ms as f64 / 1000.0);
    }

    /// The model name (without the provider) of the bundle `digest`'s agent, read once.
    fn model_of(&self, core: &Core, digest: &str) -> String {
        if let Some(m) = self.open().models.get(digest) {
            return m.clone();
        }
        let model = read_model(core, digest).unwrap_or_default();
        self.open().models.insert(digest.to_string(), model.clone());
        model
    }

    /// Sets the connection gate's refusal counts (`agen_hub_connections_refused_total`).
    pub fn connections_refused(&self, counts: &[(crate::conn_gate::Reason, u64)]) {
        for (reason, n) in counts {
            let c = self.connections_refused.get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            });
            if *n > c.get() {
                c.inc_by(n - c.get());
            }
        }
    }

    /// Whether this Hub leads (`agen_hub_is_leader`: 1 for a Hub alone on its store).
    pub fn set_leader(&self, leads: bool) {
        self.is_leader.set(i64::from(leads));
    }

    /// The Prometheus text of every metric, with the gauges read now.
    pub fn render(&self, core: &Core) -> String {
        self.queue_depth.clear();
        self.heartbeat_age.clear();
        let mut namespaces = HashSet::new();
        {
            let st = core.lock();
            for t in st.tasks.values() {
                namespaces.insert(t.namespace.clone());
                if t.state == crate::model::TaskState::Queued {
                    self.queue_depth
                        .get_or_create(&DeploymentLabels {
                            namespace: t.namespace.clone(),
                            deployment: t.deployment.clone(),
                        })
                        .inc();
                }
            }
            for d in st.deployments.values() {
                namespaces.insert(d.namespace.clone());
                // Every deployment has a queue depth, 0 included.
                let _ = self.queue_depth.get_or_create(&DeploymentLabels {
                    namespace: d.namespace.clone(),
                    deployment: d.name.clone(),
                });
            }
            let mut restarts: HashMap<(String, String), u64> = HashMap::new();
            for i in st.instances.values() {
                *restarts
                    .entry((i.namespace.clone(), i.deployment.clone()))
                    .or_default() += u64::from(i.restarts);
            }
            for ((namespace, deployment), total) in restarts {
                let c = self.restarts.get_or_create(&OnlyDeployment {
                    namespace,
                    deployment,
                });
                let seen = c.get();
                if total > seen {
                    c.inc_by(total - seen);
                }
            }
            let now = crate::model::now_ms();
            for n in st.nests.values() {
                // Not heard from since this Hub started: its stored last heartbeat says how
                // long (a Nest that went down before a Hub restart must not read 0).
                let age = match st.live.heard_from(&n.nest_id) {
                    Some(silent) => silent.as_secs_f64(),
                    None => (now - n.last_heartbeat_ms).max(0) as f64 / 1000.0,
                };
                self.heartbeat_age
                    .get_or_create(&NestLabel {
                        nest: n.name.clone(),
                    })
                    .set(age);
            }
        }
        for namespace in namespaces {
            if let Ok(bytes) = core.artifact_bytes_used(&namespace) {
                self.artifact_bytes
                    .get_or_create(&NamespaceLabel { namespace })
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        for (kind, open, refused) in core.streams.snapshot() {
            let label = StreamLabel {
                kind: kind.as_str().to_string(),
            };
            self.streams_open
                .get_or_create(&label)
                .set(i64::try_from(open).unwrap_or(i64::MAX));
            let c = self.streams_refused.get_or_create(&label);
            if refused > c.get() {
                c.inc_by(refused - c.get());
            }
        }
        for (limit, refused) in core.limit_refusals.snapshot() {
            let c = self.limit_refused.get_or_create(&LimitLabel {
                limit: limit.to_string(),
            });
            if refused > c.get() {
                c.inc_by(refused - c.get());
            }
        }
        self.ops.read(core);
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode the metrics: {e}");
        }
        out
    }
}

const IS_LEADER_HELP: &str =
    "1 while this Hub leads (holds the leader lease, or is alone on its store), 0 while it follows";

/// What a follower's `/metrics` shows: it runs no core, so only `agen_hub_is_leader 0`.
pub fn follower_text() -> String {
    let mut registry = Registry::default();
    registry.register(
        "agen_hub_is_leader",
        IS_LEADER_HELP,
        Gauge::<i64>::default(),
    );
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::warn!("cannot encode the metrics: {e}");
    }
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NestStateLabel {
    state: String,
}

/// The gauges an operator alerts on, read from the core at scrape time: the build, Nests by
/// state, each deployment's desired and ready replicas, tasks waiting for an approval.
#[derive(Default)]
struct OpsGauges {
    build: Family<BuildLabels, Gauge>,
    nests: Family<NestStateLabel, Gauge>,
    desired: Family<DeploymentLabels, Gauge>,
    ready: Family<DeploymentLabels, Gauge>,
    approvals: Family<NamespaceLabel, Gauge>,
}

/// The states `agen_nests` always has a series for.
const NEST_STATES: [&str; 5] = ["ready", "cordoned", "draining", "disconnected", "lost"];

impl OpsGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "agen_build_info",
            "The running build (always 1): component and version",
            self.build.clone(),
        );
        registry.register(
            "agen_nests",
            "Nests by state (ready, cordoned, draining, disconnected, lost)",
            self.nests.clone(),
        );
        registry.register(
            "agen_deployment_replicas_desired",
            "Replicas each deployment asks for",
            self.desired.clone(),
        );
        registry.register(
            "agen_deployment_replicas_ready",
            "Replicas of each deployment's current generation running and healthy",
            self.ready.clone(),
        );
        registry.register(
            "agen_approvals_pending",
            "Tasks waiting for a person's decision, per namespace",
            self.approvals.clone(),
        );
    }

    fn read(&self, core: &Core) {
        self.build
            .get_or_create(&BuildLabels {
                component: "hub".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        self.nests.clear();
        self.desired.clear();
        self.ready.clear();
        self.approvals.clear();
        let now = crate::model::now_ms();
        for state in NEST_STATES {
            let _ = self.nests.get_or_create(&NestStateLabel {
                state: state.into(),
            });
        }
        for (n, _) in core.list_nests() {
            let state = match n.state {
                crate::model::NestState::Ready if n.draining(now) => "draining",
                crate::model::NestState::Ready if n.cordoned => "cordoned",
                crate::model::NestState::Ready => "ready",
                crate::model::NestState::Disconnected => "disconnected",
                crate::model::NestState::Lost => "lost",
            };
            self.nests
                .get_or_create(&NestStateLabel {
                    state: state.into(),
                })
                .inc();
        }
        for d in core.list_deployments("", true) {
            let labels = DeploymentLabels {
                namespace: d.rec.namespace.clone(),
                deployment: d.rec.name.clone(),
            };
            self.desired
                .get_or_create(&labels)
                .set(i64::from(d.rec.replicas));
            self.ready
                .get_or_create(&labels)
                .set(i64::from(d.ready_replicas));
            let _ = self.approvals.get_or_create(&NamespaceLabel {
                namespace: d.rec.namespace,
            });
        }
        let st = core.lock();
        for t in st.tasks.values() {
            if t.state == crate::model::TaskState::Waiting {
                self.approvals
                    .get_or_create(&NamespaceLabel {
                        namespace: t.namespace.clone(),
                    })
                    .inc();
            }
        }
    }
}

fn read_model(core: &Core, digest: &str) -> Option<String> {
    Some(bundle_model(core, digest)?.model)
}

/// The model the agent of bundle `digest` uses (provider and name), when it names one.
pub(crate) fn bundle_model(core: &Core, digest: &str) -> Option<agen_shared::bundle::ModelRef> {
    let bytes = core.bundle_bytes(digest).ok()??;
    let tmp = tempfile::tempdir().ok()?;
    let dir = tmp.path().join("bundle");
    agen_shared::bundle::unpack(&bytes, &dir).ok()?;
    let bundle = agen_shared::bundle::Bundle::load(&dir).ok()?;
    bundle.agent.model
}
