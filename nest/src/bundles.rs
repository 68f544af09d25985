//! The Nest's bundle cache: bundles fetched from the Hub by digest over `FetchBundle` (never
//! inside the Nest stream), verified (sha256) and unpacked once into
//! `<data-dir>/bundles/<hex>/`.
//!
//! Invariants: a folder under `bundles/` exists only once its archive was verified against its
//! digest and completely unpacked (unpack renames into place); concurrent requests for one
//! digest fetch it once; an archive larger than [`MAX_BUNDLE_BYTES`] is refused mid-stream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agen_shared::bundle::{unpack_verified, MAX_BUNDLE_BYTES};

use crate::config::{NestError, NestOptions, Result};
use crate::hub_client::ClientSlot;

/// The cache. Cheap to share behind an `Arc`.
pub struct BundleCache {
    dir: PathBuf,
    opts: Arc<NestOptions>,
    client: Arc<ClientSlot>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The hex part of `sha256:<hex>`, checked (it becomes a folder name).
pub fn digest_hex(digest: &str) -> Result<&str> {
    let bad = |reason: &str| NestError::Bundle {
        digest: digest.to_string(),
        reason: reason.to_string(),
    };
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| bad("expected sha256:<64 hex digits>"))?;
    if hex.len() != 64
        || !hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    {
        return Err(bad("expected sha256:<64 lowercase hex digits>"));
    }
    Ok(hex)
}

impl BundleCache {
    pub fn new(opts: Arc<NestOptions>, client: Arc<ClientSlot>) -> BundleCache {
        BundleCache {
            dir: opts.bundles_dir(),
            opts,
            client,
            locks: Mutex::new(HashMap::new()),
        }
    }

    /// Where the bundle with `digest` is (or will be) unpacked.
    pub fn path_of(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.dir.join(digest_hex(digest)?))
    }

    /// The unpacked folder of `digest`, fetching it from the Hub first when absent.
    pub async fn ensure(&self, digest: &str) -> Result<PathBuf> {
        let path = self.path_of(digest)?;
        if path.is_dir() {
            return Ok(path);
        }
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(digest.to_string()).or_default().clone()
        };
        let _guard = lock.lock().await;
        if path.is_dir() {
            return Ok(path);
        }
        let bytes = self.fetch(digest).await?;
        let (d, p) = (digest.to_string(), path.clone());
        tokio::task::spawn_blocking(move || unpack_verified(&bytes, &d, &p))
            .await
            .map_err(|e| NestError::Bundle {
                digest: digest.to_string(),
                reason: format!("unpack task failed: {e}"),
            })?
            .map_err(|e| NestError::Bundle {
                digest: digest.to_string(),
                reason: e.to_string(),
            })?;
        tracing::info!(%digest, path = %path.display(), "bundle cached");
        Ok(path)
    }

    /// A client of the Hub's `NestService` (connecting when there is none yet), for the
    /// other by-digest transfers (artifacts).
    pub async fn hub_client(&self) -> Result<crate::hub_client::HubClient> {
        self.client.get_or_connect(&self.opts).await
    }

    async fn fetch(&self, digest: &str) -> Result<Vec<u8>> {
        let err = |reason: String| NestError::Bundle {
            digest: digest.to_string(),
            reason,
        };
        let mut client = self.client.get_or_connect(&self.opts).await?;
        let mut stream = client
            .fetch_bundle(digest)
            .await
            .map_err(|e| err(format!("cannot fetch from the hub: {}", e.message)))?;
        let mut bytes = Vec::new();
        while let Some(data) = stream
            .next()
            .await
            .map_err(|e| err(format!("fetch interrupted: {}", e.message)))?
        {
            if bytes.len() + data.len() > MAX_BUNDLE_BYTES {
                return Err(err(format!(
                    "larger than {} MiB",
                    MAX_BUNDLE_BYTES / (1024 * 1024)
                )));
            }
            bytes.extend_from_slice(&data);
        }
        Ok(bytes)
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(digest: &str, ok: bool) {
        assert_eq!(digest_hex(digest).is_ok(), ok, "{digest}");
    }

    #[test]
    fn only_well_formed_digests_become_folder_names() {
        check(&format!("sha256:{}", "a".repeat(64)), true);
        check(&format!("sha256:{}", "A".repeat(64)), false);
        check(&format!("sha256:{}", "a".repeat(63)), false);
        check(&format!("sha256:../{}", "a".repeat(61)), false);
        check(&"a".repeat(64), false);
        check("", false);
    }
}
