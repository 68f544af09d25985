//! The secret store as the fleet sees it: set, list, delete, the values a placement carries, and
//! restarting instances that waited for a secret.

use std::collections::HashSet;

use crate::core::{namespace_or_default, validate_name, Core};
use crate::error::{HubError, Result};
use crate::secrets;
use crate::secrets::{SecretMeta, SecretValues};

use crate::model::*;

impl Core {
    /// The values an instance's placement carries: its bundle's `platform` secrets that are set
    /// in its namespace.
    pub(in crate::core) fn placement_secrets(&self, inst: &InstanceRec) -> Result<SecretValues> {
        let names = self.declared_platform_secrets(&inst.bundle_digest)?;
        self.secrets.values(&inst.namespace, names.iter())
    }

    /// Stores a secret (sealed), then promptly replaces the instances that are not healthy in
    /// deployments of its namespace whose bundle declares it (they started without it), with
    /// their replacement back-off cleared. Returns its metadata and whether it replaced one.
    pub async fn set_secret(
        &self,
        namespace: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(SecretMeta, bool)> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        secrets::validate_secret_name("name", name)?;
        let value = secrets::validate_secret_value("value", value)?;
        let (meta, replaced) = self.secrets.set(&namespace, name, &value, now_ms())?;
        self.commit().await?;
        tracing::info!(namespace = %namespace, secret = %name, replaced, "secret set");
        self.restart_waiting_for(&namespace, name)?;
        self.poke();
        Ok((meta, replaced))
    }

    /// Replaces the not-healthy instances of deployments in `namespace` that declare `name`.
    pub(in crate::core) fn restart_waiting_for(&self, namespace: &str, name: &str) -> Result<()> {
        let digests: HashSet<String> = {
            let st = self.lock();
            st.deployments
                .values()
                .filter(|d| d.namespace == namespace)
                .map(|d| d.bundle_digest.clone())
                .collect()
        };
        let mut declaring = HashSet::new();
        for digest in digests {
            match self.declared_platform_secrets(&digest) {
                Ok(names) if names.iter().any(|n| n == name) => {
                    declaring.insert(digest);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(%digest, error = %e, "cannot read the secrets a bundle declares")
                }
            }
        }
        if declaring.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        let now = now_ms();
        let deployments: Vec<DeploymentRec> = st
            .deployments
            .values()
            .filter(|d| d.namespace == namespace && declaring.contains(&d.bundle_digest))
            .cloned()
            .collect();
        for d in deployments {
            let ids: Vec<(String, InstanceState)> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .filter(|i| !i.healthy)
                .map(|i| (i.instance_id.clone(), i.state))
                .collect();
            if !ids.is_empty() {
                tracing::info!(deployment = %d.key(), secret = %name, instances = ids.len(), "secret set: replacing the instances that started without it now");
            }
            for (id, state) in ids {
                match state {
                    InstanceState::Pending => {
                        if let Some(mut rec) = st.instances.get(&id).cloned() {
                            if rec.not_before_ms > now {
                                rec.not_before_ms = 0;
                                rec.slot_failures = 0;
                                rec.message = format!("secret {name} set; waiting for placement");
                                rec.updated_at_ms = now;
                                self.save_instance(&mut st, rec)?;
                            }
                        }
                    }
                    InstanceState::Starting | InstanceState::Running | InstanceState::Unhealthy => {
                        self.stop_instance(&mut st, &id, &format!("secret {name} set; replacing"))?;
                    }
                    InstanceState::Stopping | InstanceState::Stopped | InstanceState::Lost => {}
                }
            }
        }
        Ok(())
    }

    /// The secrets of a namespace (names and times, never values).
    pub fn list_secrets(&self, namespace: &str) -> Result<Vec<SecretMeta>> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        self.secrets.list(&namespace)
    }

    /// Deletes a secret. Running instances keep the value they were started with.
    pub async fn delete_secret(&self, namespace: &str, name: &str) -> Result<()> {
        let namespace = namespace_or_default(namespace);
        validate_name("namespace", &namespace)?;
        secrets::validate_secret_name("name", name)?;
        if !self.secrets.delete(&namespace, name)? {
            return Err(HubError::not_found(format!(
                "secret {name} not found in namespace {namespace}; list them with agen secrets ls"
            )));
        }
        self.commit().await?;
        tracing::info!(namespace = %namespace, secret = %name, "secret deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// A placement after a Hub restart (no bundle cache): the bundle is read from the store
    /// and exactly its declared `platform` secrets of its own namespace are sent.
    #[test]
    fn a_placement_carries_only_the_declared_platform_secrets_of_its_namespace() {
        use super::*;
        use crate::config::HubOptions;
        use crate::secrets::SecretKey;
        use crate::store::{Db, SledStore};
        use std::sync::Arc;

        let dir = tempfile::tempdir().expect("tempdir");
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(bundle.join("x-agen")).expect("mkdir");
        std::fs::write(
            bundle.join("x-agen/agent.md"),
            "---\nname: t\nmodel: openai/gpt-4.1-mini\n---\nhi\n",
        )
        .expect("agent.md");
        std::fs::write(
            bundle.join("x-agen/secrets.json"),
            r#"{"DB": {"source": "platform"}, "UNSET": {"source": "platform"}, "FROM_ENV": {"source": "env", "var": "X"}}"#,
        )
        .expect("secrets.json");
        let bytes = agen_shared::bundle::pack(&bundle).expect("pack");
        let digest = agen_shared::bundle::digest(&bytes);

        let store = SledStore::open(&dir.path().join("db")).expect("sled");
        let key = SecretKey::load_or_create(&dir.path().join("secret.key")).expect("key");
        let core = Core::open(HubOptions::default(), Db::new(Arc::new(store)), key).expect("core");
        core.put_bundle(&digest, &bytes, "t").expect("bundle");
        for (ns, name, value) in [
            ("default", "DB", "db-of-default"),
            ("other", "DB", "db-of-other"),
            ("default", "FROM_ENV", "not-a-platform-secret"),
            ("default", "UNDECLARED", "never-sent"),
        ] {
            core.secrets.set(ns, name, value, 1).expect("set");
        }
        let inst = InstanceRec {
            instance_id: "t-1".into(),
            namespace: "default".into(),
            deployment: "t".into(),
            nest_id: String::new(),
            nest_name: String::new(),
            state: InstanceState::Pending,
            healthy: false,
            tools_loaded: 0,
            servers_not_connected: Vec::new(),
            bundle_digest: digest,
            generation: 1,
            message: String::new(),
            restarts: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            tools: Vec::new(),
            resources: Vec::new(),
            not_before_ms: 0,
            healthy_since_ms: 0,
            replacement: false,
            slot_failures: 0,
            leaving_since_ms: 0,
            for_resume: false,
            oom_kills: 0,
            usage: Usage::default(),
        };
        let values = core.placement_secrets(&inst).expect("values");
        assert_eq!(
            values.0.into_iter().collect::<Vec<_>>(),
            vec![("DB".to_string(), "db-of-default".to_string())]
        );
    }
}
