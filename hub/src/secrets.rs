//! The Hub's secret store: values of secrets with `source: platform`, per namespace, encrypted
//! at rest with ChaCha20-Poly1305 (ring) under a key kept in `<data-dir>/secret.key`.
//!
//! Invariants: a value is only ever stored sealed (a random 96-bit nonce per write, the
//! record's `namespace/name` as associated data, so a sealed value moved to another name does
//! not open); no type here prints a value (`Debug` shows names only); values leave the Hub only
//! inside a `PlaceInstance` for an instance whose bundle declares them; the key file is created
//! once with mode 0600 and a Hub refuses to start with a key file of the wrong size.

use std::collections::BTreeMap;
use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use serde::{Deserialize, Serialize};

use crate::error::{HubError, Result};
use crate::store::{Db, Table};

/// The largest secret value the store accepts.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
/// Length of the key in `secret.key`.
const KEY_LEN: usize = 32;

/// The key that seals secret values.
pub struct SecretKey(LessSafeKey);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl SecretKey {
    /// A key from raw bytes.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> SecretKey {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .expect("a 32-byte key is the size ChaCha20-Poly1305 needs");
        SecretKey(LessSafeKey::new(unbound))
    }

    /// Reads the key in `path`, or creates one (random, mode 0600) when the file is absent.
    pub fn load_or_create(path: &Path) -> Result<SecretKey> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let bytes: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
                    HubError::Config(format!(
                        "{}: expected a {KEY_LEN}-byte key, found {} bytes; restore the key file \
                         from a backup (deleting it makes every stored secret unreadable)",
                        path.display(),
                        bytes.len()
                    ))
                })?;
                Ok(SecretKey::from_bytes(&bytes))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let bytes: [u8; KEY_LEN] = rand::random();
                agen_shared::tls::write_private(path, &bytes)?;
                tracing::info!(path = %path.display(), "secret store key created");
                Ok(SecretKey::from_bytes(&bytes))
            }
            Err(e) => Err(HubError::Io {
                path: path.to_path_buf(),
                action: "cannot read the secret store key",
                source: e,
            }),
        }
    }

    /// Seals `plaintext` with a fresh random nonce, binding it to `aad`.
    pub fn seal(&self, aad: &str, plaintext: &[u8]) -> Sealed {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut data = plaintext.to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .expect("sealing fails only for inputs over 256 GiB");
        Sealed {
            nonce: hex::encode(nonce),
            ciphertext: hex::encode(data),
        }
    }

    /// Opens what [`SecretKey::seal`] sealed with the same `aad`; `None` when it does not
    /// authenticate (another key, another name, or tampered bytes).
    pub fn open(&self, aad: &str, sealed: &Sealed) -> Option<Vec<u8>> {
        let nonce: [u8; NONCE_LEN] = hex::decode(&sealed.nonce).ok()?.try_into().ok()?;
        let mut data = hex::decode(&sealed.ciphertext).ok()?;
        let plain = self
            .0
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

/// A sealed value: nonce and ciphertext with its tag, hex-encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub nonce: String,
    pub ciphertext: String,
}

/// A stored secret (the value sealed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRec {
    pub namespace: String,
    pub name: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub sealed: Sealed,
}

/// A secret's metadata: what listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretMeta {
    pub namespace: String,
    pub name: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

impl From<&SecretRec> for SecretMeta {
    fn from(r: &SecretRec) -> Self {
        SecretMeta {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            created_at_ms: r.created_at_ms,
            updated_at_ms: r.updated_at_ms,
        }
    }
}

/// Secret values by name, on their way to a Nest. `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(pub BTreeMap<String, String>);

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Checks a secret name like `x-agen/secrets.json` does.
pub fn validate_secret_name(field: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(HubError::invalid(format!(
            "{field}: expected a secret name, got an empty string"
        )));
    }
    if name.len() > 128 || !agen_shared::bundle::valid_secret_name(name) {
        return Err(HubError::invalid(format!(
            "{field}: `{}` is not a valid secret name; expected up to 128 letters, digits and `_`, not starting with a digit (as in x-agen/secrets.json)",
            crate::limits::prefix(name)
        )));
    }
    Ok(())
}

/// Checks a secret value: UTF-8 text (it becomes an environment value) of at most 64 KiB.
pub fn validate_secret_value(field: &str, value: &[u8]) -> Result<String> {
    if value.len() > MAX_SECRET_BYTES {
        return Err(HubError::invalid(format!(
            "{field}: {} bytes is over the {} KiB secret limit",
            value.len(),
            MAX_SECRET_BYTES / 1024
        )));
    }
    if value.is_empty() {
        return Err(HubError::invalid(format!(
            "{field}: expected a value, got nothing; pass the value on stdin (agen secrets set NAME)"
        )));
    }
    let text = std::str::from_utf8(value).map_err(|_| {
        HubError::invalid(format!(
            "{field}: expected UTF-8 text (the value becomes an environment variable)"
        ))
    })?;
    if text.contains('\0') {
        return Err(HubError::invalid(format!(
            "{field}: expected text without NUL bytes (the value becomes an environment variable)"
        )));
    }
    Ok(text.to_string())
}

fn key_of(namespace: &str, name: &str) -> String {
    format!("{namespace}\0{name}")
}

fn aad_of(namespace: &str, name: &str) -> String {
    format!("agen-secret:{namespace}/{name}")
}

/// Secrets in the store, sealed under one key.
pub struct SecretStore {
    db: Db,
    key: SecretKey,
}

impl SecretStore {
    pub fn new(db: Db, key: SecretKey) -> SecretStore {
        SecretStore { db, key }
    }

    /// Stores (or replaces) a secret; returns its metadata and whether it replaced one. The
    /// caller flushes the store.
    pub fn set(
        &self,
        namespace: &str,
        name: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<(SecretMeta, bool)> {
        let key = key_of(namespace, name);
        let old: Option<SecretRec> = self.db.get_json(Table::Secrets, &key)?;
        let rec = SecretRec {
            namespace: namespace.to_string(),
            name: name.to_string(),
            created_at_ms: old.as_ref().map_or(now_ms, |o| o.created_at_ms),
            updated_at_ms: now_ms,
            sealed: self.key.seal(&aad_of(namespace, name), value.as_bytes()),
        };
        self.db.put_json(Table::Secrets, &key, &rec)?;
        Ok((SecretMeta::from(&rec), old.is_some()))
    }

    /// Every secret of `namespace`, by name.
    pub fn list(&self, namespace: &str) -> Result<Vec<SecretMeta>> {
        let prefix = format!("{namespace}\0");
        let recs: Vec<SecretRec> = self.db.list_json(Table::Secrets, prefix.as_bytes())?;
        Ok(recs.iter().map(SecretMeta::from).collect())
    }

    /// Removes a secret; returns whether it existed.
    pub fn delete(&self, namespace: &str, name: &str) -> Result<bool> {
        let key = key_of(namespace, name);
        let existed = self
            .db
            .get_json::<SecretRec>(Table::Secrets, &key)?
            .is_some();
        if existed {
            self.db.remove(Table::Secrets, &key)?;
        }
        Ok(existed)
    }

    /// The values of those of `names` that are set in `namespace` (the others are left out:
    /// the Nest reports a used secret without a value, naming it).
    pub fn values<'a>(
        &self,
        namespace: &str,
        names: impl IntoIterator<Item = &'a String>,
    ) -> Result<SecretValues> {
        let mut out = BTreeMap::new();
        for name in names {
            let key = key_of(namespace, name);
            let Some(rec) = self.db.get_json::<SecretRec>(Table::Secrets, &key)? else {
                continue;
            };
            let plain = self
                .key
                .open(&aad_of(namespace, name), &rec.sealed)
                .ok_or_else(|| {
                    HubError::Internal(format!(
                        "secret {name} in namespace {namespace} does not decrypt with the hub's secret.key; was the key file replaced? set the secret again (agen secrets set {name} --namespace {namespace})"
                    ))
                })?;
            let value = String::from_utf8(plain).map_err(|_| {
                HubError::Internal(format!(
                    "secret {name} in namespace {namespace} is not UTF-8 text; set it again"
                ))
            })?;
            out.insert(name.clone(), value);
        }
        Ok(SecretValues(out))
    }
}

/// The names of the secrets a bundle declares with `source: platform`.
pub fn platform_secret_names(bundle: &agen_shared::bundle::Bundle) -> Vec<String> {
    bundle
        .secrets
        .iter()
        .filter(|(_, s)| matches!(s, agen_shared::bundle::SecretSource::Platform))
        .map(|(n, _)| n.clone())
        .collect()
}

#[cfg(test)]
mod tests;
