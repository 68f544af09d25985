//! The Nest's own Prometheus metrics (`agen nest --metrics-listen ADDR`, `GET /metrics`), read
//! from the supervisor and the Hub link at scrape time: instances by state, instance restarts
//! per deployment (with its namespace), connections the egress proxy refused per deployment,
//! run events waiting for the Hub's ack, the build, and each live instance's CPU time, memory
//! and OOM kills (its group; `server` names a tool server's own share, empty for the whole
//! group): series of instances that are gone are dropped, so there are as many as instances
//! and tool servers running here.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::outbox::Outbox;
use crate::supervisor::Supervisor;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeploymentLabel {
    namespace: String,
    deployment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    namespace: String,
    deployment: String,
    instance: String,
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    namespace: String,
    deployment: String,
    instance: String,
}

type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    version: String,
}

/// Every metric of one Nest.
pub struct NestMetrics {
    registry: Registry,
    instances: Family<StateLabel, Gauge>,
    restarts: Family<DeploymentLabel, Counter>,
    egress_refused: Family<DeploymentLabel, Counter>,
    pending: Gauge,
    cpu: Family<UsageLabels, FloatCounter>,
    memory: Family<UsageLabels, FloatGauge>,
    ooms: Family<InstanceLabels, Counter>,
}

impl NestMetrics {
    pub fn new() -> Arc<NestMetrics> {
        let mut registry = Registry::default();
        let instances = Family::<StateLabel, Gauge>::default();
        let restarts = Family::<DeploymentLabel, Counter>::default();
        let pending = Gauge::default();
        let egress_refused = Family::<DeploymentLabel, Counter>::default();
        registry.register(
            "agen_egress_refused",
            "Connections out of an instance's network namespace that the Nest's egress proxy refused",
            egress_refused.clone(),
        );
        registry.register(
            "agen_nest_instances",
            "Instances on this Nest by state",
            instances.clone(),
        );
        registry.register(
            "agen_instance_restarts",
            "Instance process restarts on this Nest",
            restarts.clone(),
        );
        registry.register(
            "agen_nest_run_events_pending",
            "Run events not yet acknowledged by the Hub",
            pending.clone(),
        );
        let cpu = Family::<UsageLabels, FloatCounter>::default();
        let memory = Family::<UsageLabels, FloatGauge>::default();
        let ooms = Family::<InstanceLabels, Counter>::default();
        registry.register(
            "agen_instance_cpu_seconds",
            "CPU time used by an instance's group (server empty: the instance with its tool servers) or one tool server",
            cpu.clone(),
        );
        registry.register_with_unit(
            "agen_instance_memory",
            "Memory in use by an instance's group (server empty) or one tool server",
            prometheus_client::registry::Unit::Bytes,
            memory.clone(),
        );
        registry.register(
            "agen_instance_oom_kills",
            "Processes of an instance killed by its memory limit",
            ooms.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "agen_build_info",
            "The running build (always 1): component and version",
            build.clone(),
        );
        build
            .get_or_create(&BuildLabels {
                component: "nest".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .set(1);
        Arc::new(NestMetrics {
            registry,
            instances,
            restarts,
            egress_refused,
            pending,
            cpu,
            memory,
            ooms,
        })
    }

    /// The Prometheus text of every metric, read now.
    pub fn render(&self, supervisor: &Supervisor, outbox: &Outbox) -> String {
        self.instances.clear();
        let mut restarts: BTreeMap<(String, String), u64> = BTreeMap::new();
        self.cpu.clear();
        self.memory.clear();
        self.ooms.clear();
        for r in supervisor.snapshot() {
            let usage = r.usage.iter().chain(&r.servers_usage);
            for u in usage {
                let l = UsageLabels {
                    namespace: r.namespace.clone(),
                    deployment: r.deployment.clone(),
                    instance: r.instance_id.clone(),
                    server: u.name.clone(),
                };
                self.cpu.get_or_create(&l).inc_by(u.cpu_seconds);
                self.memory.get_or_create(&l).set(u.memory_bytes as f64);
            }
            self.ooms
                .get_or_create(&InstanceLabels {
                    namespace: r.namespace.clone(),
                    deployment: r.deployment.clone(),
                    instance: r.instance_id.clone(),
                })
                .inc_by(u64::from(r.oom_kills));
            let state = r.state.as_str().to_string();
            self.instances.get_or_create(&StateLabel { state }).inc();
            *restarts
                .entry((r.namespace.clone(), r.deployment.clone()))
                .or_default() += u64::from(r.restarts);
        }
        for ((namespace, deployment), total) in restarts {
            let c = self.restarts.get_or_create(&DeploymentLabel {
                namespace,
                deployment,
            });
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        }
        for ((namespace, deployment), total) in supervisor.network().refused() {
            let c = self.egress_refused.get_or_create(&DeploymentLabel {
                namespace,
                deployment,
            });
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        }
        self.pending
            .set(i64::try_from(outbox.pending()).unwrap_or(i64::MAX));
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode the metrics: {e}");
        }
        out
    }
}
