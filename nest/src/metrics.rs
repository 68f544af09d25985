//! The Nest's own Prometheus metrics (`agen nest --metrics-listen ADDR`, `GET /metrics`), read
//! from the supervisor and the Hub link at scrape time: instances by state, instance restarts
//! per deployment (with its namespace), connections the egress proxy refused per deployment,
//! run events waiting for the Hub's ack, the build.

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
        })
    }

    /// The Prometheus text of every metric, read now.
    pub fn render(&self, supervisor: &Supervisor, outbox: &Outbox) -> String {
        self.instances.clear();
        let mut restarts: BTreeMap<(String, String), u64> = BTreeMap::new();
        for r in supervisor.snapshot() {
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
