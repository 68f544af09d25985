//! A task's tool overrides (`SubmitTaskRequest.tool_overrides`): they only narrow the bundle's
//! permissions (the harness takes the stricter decision, `Permissions::decide_narrowed`); an
//! `allow` that tries to widen is kept, has no effect, and is reported in `Task.warnings`.

use agen_shared::bundle::Permissions;

use crate::core::tasks::TaskSpec;
use crate::core::Core;
use crate::model::deployment_key;

impl Core {
    /// The warnings of a submit's overrides against the deployment's current bundle (none when
    /// the bundle cannot be read: the harness narrows all the same).
    pub(crate) fn override_warnings(&self, namespace: &str, spec: &TaskSpec) -> Vec<String> {
        if spec.tool_overrides.allow.is_empty() {
            return Vec::new();
        }
        let digest = self
            .lock()
            .deployments
            .get(&deployment_key(namespace, &spec.deployment))
            .map(|d| d.bundle_digest.clone());
        let Some(digest) = digest else {
            return Vec::new();
        };
        match self.bundle_permissions_of(&digest) {
            Some(p) => p.widening(&spec.tool_overrides),
            None => Vec::new(),
        }
    }

    fn bundle_permissions_of(&self, digest: &str) -> Option<Permissions> {
        let cached = || {
            self.bundle_permissions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(digest)
                .cloned()
        };
        if let Some(p) = cached() {
            return Some(p);
        }
        if let Err(e) = self.load_stored_bundle(digest) {
            tracing::warn!(%digest, error = %e, "cannot read the bundle's permissions");
            return None;
        }
        cached()
    }
}
