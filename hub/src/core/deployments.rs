//! Deployments (desired state, generations, carry-over of instances) and the instances that
//! serve them: create, read, list, delete, stop.

use std::collections::BTreeMap;

use crate::core::leases::Requeue;
use crate::core::{namespace_or_default, validate_name, Core, State};
use crate::error::{HubError, Result};
use crate::nodes::ToNest;
use crate::scheduler;
use crate::store::Table;

use crate::model::*;

/// Longest replica count a deployment may ask for.
pub const MAX_REPLICAS: u32 = 1000;

/// A deployment's desired state, as asked by a client.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentSpec {
    pub namespace: String,
    pub name: String,
    pub bundle_digest: String,
    pub replicas: u32,
    pub selector: BTreeMap<String, String>,
    pub concurrency: u32,
    /// Resources asked for with the request (`agen deploy --cpu …`); each unset key is the
    /// bundle's.
    pub resources: agen_shared::bundle::ResourceSpec,
}

/// A deployment with its ready replica count.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentView {
    pub rec: DeploymentRec,
    pub ready_replicas: u32,
}

impl Core {
    /// How many runs an instance has now (running or waiting for an approval).
    pub fn active_runs(&self, instance_id: &str) -> u32 {
        let st = self.lock();
        st.tasks
            .live()
            .filter(|t| {
                t.instance_id == instance_id
                    && matches!(t.state, TaskState::Running | TaskState::Waiting)
            })
            .count() as u32
    }

    /// Creates a deployment or updates it (a new generation when anything changed).
    pub async fn create_deployment(&self, spec: DeploymentSpec) -> Result<DeploymentRec> {
        let namespace = namespace_or_default(&spec.namespace);
        validate_name("namespace", &namespace)?;
        validate_name("name", &spec.name)?;
        if spec.replicas > MAX_REPLICAS {
            return Err(HubError::invalid(format!(
                "replicas: {} is too many; expected 0 to {MAX_REPLICAS}",
                spec.replicas
            )));
        }
        if spec.concurrency > 1000 {
            return Err(HubError::invalid(format!(
                "concurrency: {} is too many; expected 0 (default 1) to 1000",
                spec.concurrency
            )));
        }
        for (k, v) in &spec.selector {
            if k.is_empty() {
                return Err(HubError::invalid(format!(
                    "selector: empty label name (value `{v}`); expected k=v pairs"
                )));
            }
        }
        if spec.bundle_digest.is_empty() {
            return Err(HubError::invalid(
                "bundle_digest: expected the sha256:<hex> digest of an uploaded bundle",
            ));
        }
        let meta = self.bundle_meta(&spec.bundle_digest)?.ok_or_else(|| {
            HubError::FailedPrecondition(format!(
                "bundle {} is not uploaded; upload it with UploadBundle (agen deploy does) before creating the deployment",
                spec.bundle_digest
            ))
        })?;
        spec.resources
            .check(|k| format!("resources.{k}"))
            .map_err(HubError::invalid)?;
        let resources = spec
            .resources
            .or(self.bundle_resources(&spec.bundle_digest)?);
        let concurrency = spec.concurrency.max(1);
        let now = now_ms();
        let rec = {
            let mut st = self.lock();
            let key = deployment_key(&namespace, &spec.name);
            let rec = match st.deployments.get(&key) {
                Some(old) => {
                    let changed = old.bundle_digest != spec.bundle_digest
                        || old.replicas != spec.replicas
                        || old.selector != spec.selector
                        || old.concurrency != concurrency
                        || old.resources != resources;
                    if !changed {
                        return Ok(old.clone());
                    }
                    let mut rec = old.clone();
                    rec.bundle_digest = spec.bundle_digest.clone();
                    rec.replicas = spec.replicas;
                    rec.selector = spec.selector.clone();
                    rec.concurrency = concurrency;
                    rec.resources = resources;
                    rec.generation += 1;
                    rec.updated_at_ms = now;
                    rec.agent_name = meta.agent_name.clone();
                    rec
                }
                None => DeploymentRec {
                    namespace: namespace.clone(),
                    name: spec.name.clone(),
                    bundle_digest: spec.bundle_digest.clone(),
                    replicas: spec.replicas,
                    selector: spec.selector.clone(),
                    concurrency,
                    // Created again after `agen rm`: its kept history goes on.
                    generation: self.last_recorded_generation(&namespace, &spec.name) + 1,
                    created_at_ms: now,
                    updated_at_ms: now,
                    agent_name: meta.agent_name.clone(),
                    resources,
                },
            };
            if let Some(old) = st.deployments.get(&key).cloned() {
                self.carry_over_instances(&mut st, &old, &rec)?;
            }
            self.save_deployment(&mut st, rec.clone())?;
            rec
        };
        self.commit().await?;
        tracing::info!(deployment = %rec.key(), generation = rec.generation, digest = %rec.bundle_digest, "deployment saved");
        self.poke();
        Ok(rec)
    }

    /// A new generation that changes neither the bundle nor the concurrency does not need new
    /// instances: those of the old generation whose Nest still matches the selector move to the
    /// new one (so scaling never restarts anything).
    pub(in crate::core) fn carry_over_instances(
        &self,
        st: &mut State,
        old: &DeploymentRec,
        new: &DeploymentRec,
    ) -> Result<()> {
        // New limits need new processes.
        if old.bundle_digest != new.bundle_digest
            || old.concurrency != new.concurrency
            || old.resources != new.resources
        {
            return Ok(());
        }
        let ids: Vec<String> = st
            .instances
            .values()
            .filter(|i| {
                i.namespace == new.namespace
                    && i.deployment == new.name
                    && i.generation == old.generation
            })
            .filter(|i| {
                i.state == InstanceState::Pending
                    || st
                        .nests
                        .get(&i.nest_id)
                        .is_some_and(|n| scheduler::matches(&new.selector, &n.labels))
            })
            .map(|i| i.instance_id.clone())
            .collect();
        for id in ids {
            if let Some(mut rec) = st.instances.get(&id).cloned() {
                rec.generation = new.generation;
                self.save_instance(st, rec)?;
            }
        }
        Ok(())
    }

    pub(in crate::core) fn ready_replicas(st: &State, d: &DeploymentRec) -> u32 {
        st.instances
            .values()
            .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
            .filter(|i| {
                i.state == InstanceState::Running && i.healthy && i.generation == d.generation
            })
            .count() as u32
    }

    pub fn get_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(DeploymentView, Vec<InstanceRec>)> {
        let namespace = namespace_or_default(namespace);
        validate_name("name", name)?;
        let st = self.lock();
        let d = st
            .deployments
            .get(&deployment_key(&namespace, name))
            .ok_or_else(|| {
                HubError::not_found(format!("deployment {namespace}/{name} not found"))
            })?;
        let instances = st
            .instances
            .values()
            .filter(|i| i.namespace == namespace && i.deployment == name)
            .cloned()
            .collect();
        Ok((
            DeploymentView {
                ready_replicas: Self::ready_replicas(&st, d),
                rec: d.clone(),
            },
            instances,
        ))
    }

    pub fn list_deployments(&self, namespace: &str, all: bool) -> Vec<DeploymentView> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        st.deployments
            .values()
            .filter(|d| all || d.namespace == namespace)
            .map(|d| DeploymentView {
                ready_replicas: Self::ready_replicas(&st, d),
                rec: d.clone(),
            })
            .collect()
    }

    /// Deletes a deployment: its instances are stopped and its queued tasks fail.
    pub async fn delete_deployment(&self, namespace: &str, name: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        validate_name("name", name)?;
        {
            let mut st = self.lock();
            let key = deployment_key(&namespace, name);
            if !st.deployments.contains_key(&key) {
                return Err(HubError::not_found(format!(
                    "deployment {namespace}/{name} not found"
                )));
            }
            self.db.remove(Table::Deployments, &key)?;
            st.deployments.remove(&key);
            let ids: Vec<String> = st
                .instances
                .values()
                .filter(|i| i.namespace == namespace && i.deployment == name)
                .map(|i| i.instance_id.clone())
                .collect();
            for id in ids {
                self.stop_instance(&mut st, &id, "deployment deleted")?;
            }
            self.fail_tasks_of_deployment(&mut st, &namespace, name)?;
        }
        self.commit().await?;
        tracing::info!(deployment = %format!("{namespace}/{name}"), "deployment deleted");
        self.poke();
        Ok(())
    }

    /// Stops an instance: a pending one is simply forgotten, a placed one is asked to stop.
    pub(crate) fn stop_instance(&self, st: &mut State, id: &str, reason: &str) -> Result<()> {
        let Some(mut rec) = st.instances.get(id).cloned() else {
            return Ok(());
        };
        match rec.state {
            InstanceState::Pending | InstanceState::Lost | InstanceState::Stopped => {
                self.delete_instance(st, id)
            }
            InstanceState::Stopping => Ok(()),
            _ => {
                st.live.send(
                    &rec.nest_id,
                    ToNest::Stop {
                        instance_id: id.to_string(),
                        reason: reason.to_string(),
                    },
                );
                rec.state = InstanceState::Stopping;
                rec.healthy = false;
                rec.message = reason.to_string();
                rec.updated_at_ms = now_ms();
                self.save_instance(st, rec)?;
                // Replacing an unhealthy instance (a tool server died) is its own failure;
                // any other stop is the Hub's choice and costs the run no attempt.
                let cause = if reason.starts_with("unhealthy") {
                    Requeue::InstanceFailed
                } else {
                    Requeue::NotCounted
                };
                self.requeue_tasks_of(st, id, &format!("instance {id} stopped: {reason}"), cause)
            }
        }
    }

    pub fn list_instances(&self, namespace: &str, deployment: &str, all: bool) -> Vec<InstanceRec> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        st.instances
            .values()
            .filter(|i| all || i.namespace == namespace)
            .filter(|i| deployment.is_empty() || i.deployment == deployment)
            .cloned()
            .collect()
    }
}
