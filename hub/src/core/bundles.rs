//! Stored bundles by digest and what the Hub reads from each once (declared `platform` secrets,
//! `limits.maxAttempts`, permissions).

use std::sync::Arc;

use crate::core::Core;
use crate::error::{HubError, Result};
use crate::secrets;
use crate::store::Table;

use crate::model::*;

impl Core {
    /// Stores a validated bundle; returns whether it was already present.
    pub fn put_bundle(&self, digest: &str, bytes: &[u8], agent_name: &str) -> Result<bool> {
        if self
            .db
            .get_json::<BundleMeta>(Table::BundleMeta, digest)?
            .is_some()
        {
            return Ok(true);
        }
        self.db
            .raw()
            .put(Table::BundleData, digest.as_bytes(), bytes)?;
        let meta = BundleMeta {
            digest: digest.to_string(),
            size: bytes.len() as u64,
            agent_name: agent_name.to_string(),
            uploaded_at_ms: now_ms(),
        };
        self.db.put_json(Table::BundleMeta, digest, &meta)?;
        Ok(false)
    }

    pub fn bundle_meta(&self, digest: &str) -> Result<Option<BundleMeta>> {
        Ok(self.db.get_json(Table::BundleMeta, digest)?)
    }

    pub fn bundle_bytes(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.db.raw().get(Table::BundleData, digest.as_bytes())?)
    }

    /// Records the `platform` secrets a bundle declares (upload does this; placement reads the
    /// bundle when a Hub restart emptied the cache).
    pub fn remember_bundle_secrets(&self, digest: &str, names: Vec<String>) {
        self.bundle_secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), Arc::new(names));
    }

    /// The `platform` secrets the bundle `digest` declares.
    pub(in crate::core) fn declared_platform_secrets(
        &self,
        digest: &str,
    ) -> Result<Arc<Vec<String>>> {
        if let Some(names) = self
            .bundle_secrets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
        {
            return Ok(names.clone());
        }
        self.load_stored_bundle(digest)?;
        self.declared_platform_secrets(digest)
    }

    /// Reads a stored bundle once and caches what the Hub needs of it (its `platform` secrets,
    /// `limits.maxAttempts`, `taskTimeout` and `maxTokens`).
    pub(crate) fn load_stored_bundle(&self, digest: &str) -> Result<()> {
        let bytes = self.bundle_bytes(digest)?.ok_or_else(|| {
            HubError::FailedPrecondition(format!(
                "bundle {digest} is not stored on the hub; deploy it again"
            ))
        })?;
        let tmp = tempfile::tempdir().map_err(HubError::io(
            std::env::temp_dir(),
            "cannot create a temporary folder",
        ))?;
        let dir = tmp.path().join("bundle");
        let bundle = agen_shared::bundle::unpack(&bytes, &dir)
            .and_then(|()| agen_shared::bundle::Bundle::load(&dir))
            .map_err(|e| HubError::Internal(format!("stored bundle {digest}: {e}")))?;
        let names = secrets::platform_secret_names(&bundle);
        self.remember_bundle_secrets(digest, names);
        self.bundle_max_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.harness.limits.max_attempts);
        self.bundle_permissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.config.permissions.clone());
        self.bundle_double_texting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.config.double_texting);
        self.bundle_resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), bundle.config.resources);
        self.bundle_budgets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                digest.to_string(),
                super::deadlines::BundleBudget::of(&bundle.harness.limits),
            );
        Ok(())
    }

    /// `resources` of the bundle `digest`.
    pub(crate) fn bundle_resources(
        &self,
        digest: &str,
    ) -> Result<agen_shared::bundle::ResourceSpec> {
        let cached = self
            .bundle_resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .copied();
        if let Some(r) = cached {
            return Ok(r);
        }
        self.load_stored_bundle(digest)?;
        Ok(self
            .bundle_resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .copied()
            .unwrap_or_default())
    }

    /// `limits.maxAttempts` of the bundle `digest` (the default when it cannot be read).
    pub(crate) fn max_attempts(&self, digest: &str) -> u32 {
        let cached = self
            .bundle_max_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
            .copied();
        if let Some(n) = cached {
            return n;
        }
        if let Err(e) = self.load_stored_bundle(digest) {
            tracing::warn!(%digest, error = %e, "cannot read limits.maxAttempts; using the default");
            return crate::core::leases::DEFAULT_MAX_ATTEMPTS;
        }
        self.max_attempts(digest)
    }
}
