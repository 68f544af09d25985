//! Nest identities: a Nest's id is fixed at its first `Join` and bound to the public key of
//! that request; later Joins for the id must carry the same key (renewal), every other call
//! must present a certificate with that key, and a revoked Nest is refused until forgotten.
//!
//! Invariants: a Join never takes over an id that is bound to another key; a revoked identity
//! refuses every call and ends the Nest's open stream at once ([`NestIdentities::revocations`]);
//! a forgotten Nest's key is retired for good, so its old certificate is refused although it
//! is still signed by the CA.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::error::{HubError, Result};
use crate::model::now_ms;
use crate::store::{Db, Table};

/// The key a Nest id is bound to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NestIdentityRec {
    pub nest_id: String,
    pub name: String,
    /// sha256 hex of the Nest's SubjectPublicKeyInfo.
    pub key_sha256: String,
    pub joined_at_ms: i64,
    /// 0 = not revoked.
    #[serde(default)]
    pub revoked_at_ms: i64,
}

/// What a Join may do for an id.
#[derive(Debug, Clone, PartialEq)]
pub enum JoinGrant {
    /// The id is new: bind it (needs a join token).
    Bind,
    /// The id is bound to this same key: renew its certificate.
    Renew,
}

/// Every Nest identity in memory, written through to the store.
pub struct NestIdentities {
    db: Db,
    by_id: Mutex<HashMap<String, NestIdentityRec>>,
    revoked: tokio::sync::watch::Sender<u64>,
}

fn id_key(nest_id: &str) -> String {
    format!("id\0{nest_id}")
}
fn retired_key(key_sha256: &str) -> String {
    format!("retired\0{key_sha256}")
}

impl NestIdentities {
    pub fn open(db: Db) -> Result<Arc<NestIdentities>> {
        let recs: Vec<NestIdentityRec> = db.list_json(Table::NestIdentities, b"id\0")?;
        let (revoked, _) = tokio::sync::watch::channel(0);
        Ok(Arc::new(NestIdentities {
            db,
            by_id: Mutex::new(recs.into_iter().map(|r| (r.nest_id.clone(), r)).collect()),
            revoked,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, NestIdentityRec>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_retired(&self, key_sha256: &str) -> Result<bool> {
        Ok(self
            .db
            .raw()
            .get(Table::NestIdentities, retired_key(key_sha256).as_bytes())?
            .is_some())
    }

    /// Decides a Join of `nest_id` with a CSR whose key hashes to `key_sha256`.
    pub fn join_grant(&self, nest_id: &str, key_sha256: &str) -> Result<JoinGrant> {
        let by_id = self.lock();
        match by_id.get(nest_id) {
            None => Ok(JoinGrant::Bind),
            Some(rec) if rec.revoked_at_ms != 0 => Err(HubError::PermissionDenied(format!(
                "join: nest `{}` (id {nest_id}) was revoked; `agen nests forget {nest_id}` lets it join again",
                rec.name
            ))),
            Some(rec) if rec.key_sha256 != key_sha256 => Err(HubError::PermissionDenied(format!(
                "join: nest id {nest_id} already belongs to nest `{}`, joined with another key; a join cannot take over a known nest (re-join with its own key, or `agen nests forget {nest_id}` first)",
                rec.name
            ))),
            Some(_) => Ok(JoinGrant::Renew),
        }
    }

    /// Binds `nest_id` to `key_sha256` (first Join).
    pub fn bind(&self, nest_id: &str, name: &str, key_sha256: &str) -> Result<NestIdentityRec> {
        let rec = NestIdentityRec {
            nest_id: nest_id.to_string(),
            name: name.to_string(),
            key_sha256: key_sha256.to_string(),
            joined_at_ms: now_ms(),
            revoked_at_ms: 0,
        };
        self.db
            .put_json(Table::NestIdentities, &id_key(nest_id), &rec)?;
        self.lock().insert(nest_id.to_string(), rec.clone());
        Ok(rec)
    }

    /// Checks a call made with a certificate for `nest_id` carrying key `key_sha256`. A Nest
    /// that joined before identities were recorded is bound on its first call.
    pub fn check_caller(&self, nest_id: &str, key_sha256: &str) -> Result<()> {
        let known = self.lock().get(nest_id).cloned();
        match known {
            Some(rec) if rec.revoked_at_ms != 0 => Err(HubError::PermissionDenied(format!(
                "nest `{}` (id {nest_id}) was revoked; ask the cluster admin (`agen nests forget {nest_id}` lets it join again)",
                rec.name
            ))),
            Some(rec) if rec.key_sha256 != key_sha256 => Err(HubError::PermissionDenied(format!(
                "the client certificate for nest {nest_id} carries another key than the one the nest joined with; it was forgotten or replaced: re-join with a join token"
            ))),
            Some(_) => Ok(()),
            None if self.is_retired(key_sha256)? => Err(HubError::PermissionDenied(format!(
                "the client certificate for nest {nest_id} belongs to a forgotten nest; re-join with a join token"
            ))),
            None => {
                self.bind(nest_id, "", key_sha256)?;
                Ok(())
            }
        }
    }

    /// Whether `nest_id` is revoked now.
    pub fn is_revoked(&self, nest_id: &str) -> bool {
        self.lock()
            .get(nest_id)
            .is_some_and(|r| r.revoked_at_ms != 0)
    }

    /// Revokes a Nest: every call refused, its stream ended.
    pub fn revoke(&self, nest_id: &str, name: &str) -> Result<NestIdentityRec> {
        let rec = {
            let mut by_id = self.lock();
            let rec = by_id
                .entry(nest_id.to_string())
                .or_insert_with(|| NestIdentityRec {
                    nest_id: nest_id.to_string(),
                    name: name.to_string(),
                    key_sha256: String::new(),
                    joined_at_ms: 0,
                    revoked_at_ms: 0,
                });
            if rec.name.is_empty() {
                rec.name = name.to_string();
            }
            if rec.revoked_at_ms == 0 {
                rec.revoked_at_ms = now_ms();
            }
            rec.clone()
        };
        self.db
            .put_json(Table::NestIdentities, &id_key(nest_id), &rec)?;
        self.revoked.send_modify(|g| *g += 1);
        Ok(rec)
    }

    /// Forgets a Nest's identity: its key is retired (its certificate refused for good) and its
    /// id may join again with a join token.
    pub fn forget(&self, nest_id: &str, name: &str) -> Result<NestIdentityRec> {
        let rec = self.lock().remove(nest_id);
        let rec = rec.unwrap_or_else(|| NestIdentityRec {
            nest_id: nest_id.to_string(),
            name: name.to_string(),
            key_sha256: String::new(),
            joined_at_ms: 0,
            revoked_at_ms: 0,
        });
        if !rec.key_sha256.is_empty() {
            self.db.raw().put(
                Table::NestIdentities,
                retired_key(&rec.key_sha256).as_bytes(),
                nest_id.as_bytes(),
            )?;
        }
        self.db.remove(Table::NestIdentities, &id_key(nest_id))?;
        self.revoked.send_modify(|g| *g += 1);
        Ok(rec)
    }

    /// Changes whenever a Nest is revoked or forgotten.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revoked.subscribe()
    }

    /// The identity of `nest_id`, if it has one.
    pub fn get(&self, nest_id: &str) -> Option<NestIdentityRec> {
        self.lock().get(nest_id).cloned()
    }
}
