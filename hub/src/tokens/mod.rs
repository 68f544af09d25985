//! Who may call the Hub: API tokens (a namespace and a role), Nest join tokens (expiry, uses),
//! the cluster admin token, and the [`Principal`] a bearer resolves to. Submodules: [`audit`]
//! (the log of every mutating call) and [`nests`] (Nest identities bound to their keys).
//!
//! Invariants: a token's secret is never stored, logged or returned after creation: the store
//! keeps its sha256 only, compared in constant time; a revoked or expired token resolves to
//! nothing from the moment it is revoked or expires (every check reads the live record), and
//! [`Tokens::revocations`] wakes open streams so they end at once; only the cluster admin
//! token (`<data-dir>/admin-token`) reaches every namespace, Nests and join tokens.

pub mod audit;
pub mod nests;
pub mod refusals;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{HubError, Result};
use crate::model::now_ms;
use crate::store::{Db, Table};

/// Prefix of API tokens: `agen_<id>_<secret>`.
pub const API_TOKEN_PREFIX: &str = "agen_";

/// Roles of an API token within its namespace; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// List, get, watch, traces, artifacts, logs.
    Viewer,
    /// + submit, cancel, approve/deny.
    Submitter,
    /// + deploy, rm, scale, rollback, secrets.
    Deployer,
    /// Everything in the namespace, its tokens and audit log included.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Submitter => "submitter",
            Role::Deployer => "deployer",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "submitter" => Ok(Role::Submitter),
            "deployer" => Ok(Role::Deployer),
            "admin" => Ok(Role::Admin),
            other => Err(HubError::invalid(format!(
                "role: `{other}` is not a role; expected viewer, submitter, deployer or admin"
            ))),
        }
    }
}

/// What a token is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// An `AgenService` bearer scoped to a namespace and a role.
    Api,
    /// A Nest's bearer for `NestService.Join`.
    Join,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Api => "api",
            TokenKind::Join => "join",
        }
    }
}

/// A stored token: metadata plus the sha256 of its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRec {
    pub id: String,
    pub name: String,
    pub kind: TokenKind,
    /// API tokens only.
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub role: Option<Role>,
    /// sha256 hex of the secret part.
    pub secret_sha256: String,
    pub created_at_ms: i64,
    /// 0 = never.
    #[serde(default)]
    pub expires_at_ms: i64,
    #[serde(default)]
    pub last_used_at_ms: i64,
    /// 0 = live.
    #[serde(default)]
    pub revoked_at_ms: i64,
    /// Join tokens: 0 = unlimited.
    #[serde(default)]
    pub max_uses: u32,
    #[serde(default)]
    pub uses: u32,
    /// Name of the token that created it.
    #[serde(default)]
    pub created_by: String,
}

impl TokenRec {
    /// Why this token cannot be used at `now`, if it cannot.
    fn refusal(&self, now: i64) -> Option<String> {
        if self.revoked_at_ms != 0 {
            return Some(format!(
                "token `{}` (id {}) was revoked; ask an admin for a new one",
                self.name, self.id
            ));
        }
        if self.expires_at_ms != 0 && now >= self.expires_at_ms && self.kind == TokenKind::Join {
            return Some(format!(
                "join token `{}` (id {}) expired at {}; Nests that joined with it keep working (they use their certificates), but no new Nest can join with it: make a join token with `agen tokens create --join [--ttl 24h]` on the Hub and start the Nest with that",
                self.name,
                self.id,
                utc(self.expires_at_ms)
            ));
        }
        if self.expires_at_ms != 0 && now >= self.expires_at_ms {
            return Some(format!(
                "token `{}` (id {}) expired; ask an admin for a new one",
                self.name, self.id
            ));
        }
        if self.max_uses != 0 && self.uses >= self.max_uses {
            return Some(format!(
                "join token `{}` (id {}) has been used {} of {} times; create another with `agen tokens create --join`",
                self.name, self.id, self.uses, self.max_uses
            ));
        }
        None
    }
}

/// `ms` since the epoch as an RFC 3339 UTC time (to the second).
fn utc(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| format!("{ms} ms since the epoch"))
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq)]
pub enum Principal {
    /// The token `agen up`/`agen hub` write: every namespace, Nests, join tokens.
    ClusterAdmin,
    /// An API token.
    Api {
        id: String,
        name: String,
        namespace: String,
        role: Role,
    },
}

impl Principal {
    pub fn token_id(&self) -> &str {
        match self {
            Principal::ClusterAdmin => "admin",
            Principal::Api { id, .. } => id,
        }
    }
    pub fn token_name(&self) -> &str {
        match self {
            Principal::ClusterAdmin => "admin",
            Principal::Api { name, .. } => name,
        }
    }
}

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// At least this role in the call's namespace.
    Role(Role),
    /// At least this role in some namespace (calls that name none: bundle uploads).
    AnyNamespace(Role),
    /// The cluster admin token.
    Cluster,
}

/// Names the Hub uses for itself (the cluster admin token, what decides on its own): no token
/// may be named so, in any case, or an audit line or an approval's `by` could pass for them.
pub const RESERVED_TOKEN_NAMES: [&str; 3] = ["admin", "system", "agen"];

/// A token name people give: not reserved, no control or format characters (see
/// `agen_shared::text::display_name_problem`). Names stored before this rule are kept.
pub fn check_token_name(name: &str) -> Result<()> {
    if RESERVED_TOKEN_NAMES
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
    {
        return Err(HubError::invalid(format!(
            "name: `{name}` is reserved for the hub itself ({}); pick another name such as `{name}-bot`",
            RESERVED_TOKEN_NAMES.join(", ")
        )));
    }
    if let Some(why) = agen_shared::text::display_name_problem(name) {
        return Err(HubError::invalid(format!("name: {why}")));
    }
    Ok(())
}

impl Principal {
    /// Whether the principal may do what `need` says in `namespace`; the error names the role
    /// and namespace the call would need.
    pub fn allows(&self, need: Need, namespace: &str, call: &str) -> Result<()> {
        let Principal::Api {
            id,
            name,
            namespace: own,
            role,
        } = self
        else {
            return Ok(());
        };
        let ok = match need {
            Need::Role(r) => own == namespace && *role >= r,
            Need::AnyNamespace(r) => *role >= r,
            Need::Cluster => false,
        };
        if ok {
            return Ok(());
        }
        let have = format!(
            "token `{name}` (id {id}) is {} in namespace `{own}`",
            role.as_str()
        );
        Err(HubError::PermissionDenied(match need {
            Need::Role(r) => format!(
                "{call} in namespace `{namespace}` needs role {} (or higher) in namespace `{namespace}`; {have}",
                r.as_str()
            ),
            Need::AnyNamespace(r) => format!(
                "{call} needs role {} (or higher) in some namespace; {have}",
                r.as_str()
            ),
            Need::Cluster => format!(
                "{call} needs the cluster admin token (the one `agen up`/`agen hub` write); {have}"
            ),
        }))
    }
}

/// Parameters of a new token.
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    pub kind: Option<TokenKind>,
    pub namespace: String,
    pub role: Option<Role>,
    pub name: String,
    /// 0 = never expires.
    pub expires_in_ms: i64,
    pub max_uses: u32,
}

#[derive(Default)]
struct Index {
    by_id: HashMap<String, TokenRec>,
    /// Join tokens by secret hash (their text carries no id).
    join_by_hash: HashMap<String, String>,
}

/// The token registry: every token in memory, written through to the store.
pub struct Tokens {
    db: Db,
    admin_sha256: String,
    index: Mutex<Index>,
    /// Bumped on every revocation or rotation: open streams re-check their principal.
    revoked: tokio::sync::watch::Sender<u64>,
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The secret part of a join token as the Nest presents it (`agen1.<ca>.<secret>` or the
/// secret alone).
fn join_secret(text: &str) -> &str {
    match text.strip_prefix(agen_shared::tls::JOIN_TOKEN_PREFIX) {
        Some(rest) if rest.starts_with('.') => rest.rsplit('.').next().unwrap_or(""),
        _ => text,
    }
}

/// How often `last_used_at_ms` is written back at most (it is exact in memory).
const LAST_USED_WRITE_MS: i64 = 10_000;

impl Tokens {
    /// Loads every token; `admin_token` is the cluster admin's.
    pub fn open(db: Db, admin_token: &str) -> Result<Arc<Tokens>> {
        let recs: Vec<TokenRec> = db.list_json(Table::Tokens, b"")?;
        let mut index = Index::default();
        for r in recs {
            if r.kind == TokenKind::Join {
                index
                    .join_by_hash
                    .insert(r.secret_sha256.clone(), r.id.clone());
            }
            index.by_id.insert(r.id.clone(), r);
        }
        let (revoked, _) = tokio::sync::watch::channel(0);
        Ok(Arc::new(Tokens {
            db,
            admin_sha256: sha256_hex(admin_token),
            index: Mutex::new(index),
            revoked,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self, rec: &TokenRec) -> Result<()> {
        self.db.put_json(Table::Tokens, &rec.id, rec)?;
        Ok(())
    }

    /// Makes sure the join token of `<data-dir>/join-token` is known (unlimited uses, valid
    /// for `ttl` from now; `None` = never expires); a revoked one stays revoked. One known
    /// without an expiry (made by an older Hub) is given one now, and the Hub logs it.
    pub fn ensure_bootstrap_join(&self, join_token: &str, ttl: Option<Duration>) -> Result<()> {
        let hash = sha256_hex(join_secret(join_token));
        let expires_at_ms = match ttl {
            Some(ttl) => {
                now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
            }
            None => 0,
        };
        let known = {
            let idx = self.lock();
            idx.join_by_hash
                .get(&hash)
                .and_then(|id| idx.by_id.get(id))
                .cloned()
        };
        if let Some(mut rec) = known {
            if rec.expires_at_ms == 0 && rec.revoked_at_ms == 0 && expires_at_ms != 0 {
                rec.expires_at_ms = expires_at_ms;
                self.save(&rec)?;
                tracing::warn!(
                    token_id = %rec.id,
                    expires_at = %utc(expires_at_ms),
                    "the built-in join token had no expiry; it now expires at {} (--join-token-ttl); Nests that joined keep working, new ones need `agen tokens create --join` after that",
                    utc(expires_at_ms)
                );
                self.lock().by_id.insert(rec.id.clone(), rec);
            }
            return Ok(());
        }
        let rec = TokenRec {
            id: new_id(),
            name: "join-token".into(),
            kind: TokenKind::Join,
            namespace: String::new(),
            role: None,
            secret_sha256: hash.clone(),
            created_at_ms: now_ms(),
            expires_at_ms,
            last_used_at_ms: 0,
            revoked_at_ms: 0,
            max_uses: 0,
            uses: 0,
            created_by: "hub".into(),
        };
        if expires_at_ms != 0 {
            tracing::info!(token_id = %rec.id, expires_at = %utc(expires_at_ms), "the built-in join token expires at {}", utc(expires_at_ms));
        }
        self.save(&rec)?;
        let mut idx = self.lock();
        idx.join_by_hash.insert(hash, rec.id.clone());
        idx.by_id.insert(rec.id.clone(), rec);
        Ok(())
    }

    /// The principal of an `AgenService` bearer, or why it is refused.
    pub fn resolve(&self, bearer: &str) -> Result<Principal> {
        if constant_time_eq(sha256_hex(bearer).as_bytes(), self.admin_sha256.as_bytes()) {
            return Ok(Principal::ClusterAdmin);
        }
        let unknown = || {
            HubError::Unauthenticated(
                "the bearer token is not a token of this hub; check --token / AGEN_TOKEN or the client config"
                    .into(),
            )
        };
        let Some((id, secret)) = bearer
            .strip_prefix(API_TOKEN_PREFIX)
            .and_then(|rest| rest.split_once('_'))
        else {
            return Err(unknown());
        };
        let now = now_ms();
        let mut idx = self.lock();
        let Some(rec) = idx.by_id.get_mut(id) else {
            return Err(unknown());
        };
        if rec.kind != TokenKind::Api
            || !constant_time_eq(sha256_hex(secret).as_bytes(), rec.secret_sha256.as_bytes())
        {
            return Err(unknown());
        }
        if let Some(why) = rec.refusal(now) {
            return Err(HubError::Unauthenticated(why));
        }
        let write_back = now - rec.last_used_at_ms > LAST_USED_WRITE_MS;
        rec.last_used_at_ms = now;
        let principal = Principal::Api {
            id: rec.id.clone(),
            name: rec.name.clone(),
            namespace: rec.namespace.clone(),
            role: rec.role.unwrap_or(Role::Viewer),
        };
        if write_back {
            let rec = rec.clone();
            drop(idx);
            if let Err(e) = self.save(&rec) {
                tracing::warn!(token_id = %rec.id, error = %e, "cannot record when a token was last used");
            }
        }
        Ok(principal)
    }

    /// The principal of a bearer and the sha256 of its secret as this Hub keeps it (a console
    /// session remembers it: a rotation ends the session like a revocation).
    pub fn resolve_with_secret(&self, bearer: &str) -> Result<(Principal, String)> {
        let principal = self.resolve(bearer)?;
        let secret = match &principal {
            Principal::ClusterAdmin => self.admin_sha256.clone(),
            Principal::Api { .. } => self.secret_of(&principal).unwrap_or_default(),
        };
        Ok((principal, secret))
    }

    /// The principal of token `token_id` (`admin`: the cluster admin) as long as it is still
    /// usable and still has the secret whose sha256 is `secret_sha256`; why not otherwise.
    pub fn principal_with_secret(&self, token_id: &str, secret_sha256: &str) -> Result<Principal> {
        if token_id == Principal::ClusterAdmin.token_id() {
            return if constant_time_eq(secret_sha256.as_bytes(), self.admin_sha256.as_bytes()) {
                Ok(Principal::ClusterAdmin)
            } else {
                Err(HubError::Unauthenticated(
                    "the admin token changed; sign in again".into(),
                ))
            };
        }
        let principal = {
            let idx = self.lock();
            let rec = idx.by_id.get(token_id).filter(|r| r.kind == TokenKind::Api);
            let Some(rec) = rec else {
                return Err(HubError::Unauthenticated(format!(
                    "token {token_id} no longer exists; sign in again"
                )));
            };
            Principal::Api {
                id: rec.id.clone(),
                name: rec.name.clone(),
                namespace: rec.namespace.clone(),
                role: rec.role.unwrap_or(Role::Viewer),
            }
        };
        self.still_valid_with(&principal, Some(secret_sha256))?;
        Ok(principal)
    }

    /// Whether `principal` is still usable now (not revoked, not expired).
    pub fn still_valid(&self, principal: &Principal) -> Result<()> {
        let Principal::Api { id, .. } = principal else {
            return Ok(());
        };
        let idx = self.lock();
        match idx.by_id.get(id) {
            Some(rec) => match rec.refusal(now_ms()) {
                Some(why) => Err(HubError::Unauthenticated(why)),
                None => Ok(()),
            },
            None => Err(HubError::Unauthenticated(format!(
                "token {id} no longer exists"
            ))),
        }
    }

    /// The sha256 of the secret `principal`'s token has now (`None`: the cluster admin, or a
    /// token that no longer exists).
    pub fn secret_of(&self, principal: &Principal) -> Option<String> {
        let Principal::Api { id, .. } = principal else {
            return None;
        };
        self.lock().by_id.get(id).map(|r| r.secret_sha256.clone())
    }

    /// [`Tokens::still_valid`], and the token still has the secret it had when a stream was
    /// opened with it (`opened_with`, from [`Tokens::secret_of`]): a rotation ends the old
    /// secret's streams too.
    pub fn still_valid_with(&self, principal: &Principal, opened_with: Option<&str>) -> Result<()> {
        self.still_valid(principal)?;
        match (opened_with, self.secret_of(principal)) {
            (Some(then), Some(now)) if then != now => Err(HubError::Unauthenticated(format!(
                "token {} was rotated; use its new secret",
                principal.token_id()
            ))),
            _ => Ok(()),
        }
    }

    /// When `principal` expires (ms since the epoch), if ever.
    pub fn expires_at_ms(&self, principal: &Principal) -> Option<i64> {
        let Principal::Api { id, .. } = principal else {
            return None;
        };
        self.lock()
            .by_id
            .get(id)
            .map(|r| r.expires_at_ms)
            .filter(|t| *t != 0)
    }

    /// Changes whenever a token is revoked or rotated.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revoked.subscribe()
    }

    /// Checks a join token (validity only: plaintext Hubs present it on every call).
    pub fn check_join(&self, bearer: Option<&str>) -> Result<TokenRec> {
        let Some(bearer) = bearer else {
            return Err(HubError::Unauthenticated(
                "missing `authorization: Bearer <join token>`; start the nest with --join-file <hub data dir>/join-token or AGEN_JOIN_TOKEN".into(),
            ));
        };
        let hash = sha256_hex(join_secret(bearer));
        let idx = self.lock();
        let rec = idx
            .join_by_hash
            .get(&hash)
            .and_then(|id| idx.by_id.get(id))
            .ok_or_else(|| {
                HubError::Unauthenticated(
                    "the join token is not one of this hub's; create one with `agen tokens create --join` or use <hub data dir>/join-token".into(),
                )
            })?;
        match rec.refusal(now_ms()) {
            Some(why) => Err(HubError::Unauthenticated(why)),
            None => Ok(rec.clone()),
        }
    }

    /// Spends one use of a join token (a Join that was granted).
    pub fn use_join(&self, id: &str) -> Result<()> {
        let rec = {
            let mut idx = self.lock();
            let Some(rec) = idx.by_id.get_mut(id) else {
                return Ok(());
            };
            rec.uses = rec.uses.saturating_add(1);
            rec.last_used_at_ms = now_ms();
            rec.clone()
        };
        self.save(&rec)
    }

    /// Creates a token and returns it with its secret text (shown once).
    pub fn create(&self, by: &Principal, new: NewToken) -> Result<(TokenRec, String)> {
        let kind = new.kind.unwrap_or(TokenKind::Api);
        if new.expires_in_ms < 0 {
            return Err(HubError::invalid(
                "expires: expected a positive duration such as 30d",
            ));
        }
        let name = new.name.trim().to_string();
        if name.len() > 63 {
            return Err(HubError::invalid(format!(
                "name: {} bytes is over the limit of 63 bytes",
                name.len()
            )));
        }
        check_token_name(&name)?;
        let id = new_id();
        let secret = agen_shared::tls::random_secret();
        let (text, namespace, role) = match kind {
            TokenKind::Api => {
                crate::limits::validate_name("namespace", &new.namespace)?;
                let role = new.role.ok_or_else(|| {
                    HubError::invalid("role: expected viewer, submitter, deployer or admin")
                })?;
                (
                    format!("{API_TOKEN_PREFIX}{id}_{secret}"),
                    new.namespace.clone(),
                    Some(role),
                )
            }
            TokenKind::Join => {
                return Err(HubError::Internal(
                    "join tokens are made by create_join, which knows the CA hash".into(),
                ))
            }
        };
        let now = now_ms();
        let rec = TokenRec {
            name: if name.is_empty() { id.clone() } else { name },
            id,
            kind,
            namespace,
            role,
            secret_sha256: sha256_hex(&secret),
            created_at_ms: now,
            expires_at_ms: if new.expires_in_ms == 0 {
                0
            } else {
                now.saturating_add(new.expires_in_ms)
            },
            last_used_at_ms: 0,
            revoked_at_ms: 0,
            max_uses: 0,
            uses: 0,
            created_by: by.token_name().to_string(),
        };
        self.save(&rec)?;
        self.lock().by_id.insert(rec.id.clone(), rec.clone());
        Ok((rec, text))
    }

    /// Creates a join token (`agen1.<ca sha256>.<secret>`).
    pub fn create_join(
        &self,
        by: &Principal,
        ca_sha256: &str,
        new: NewToken,
    ) -> Result<(TokenRec, String)> {
        if new.expires_in_ms < 0 {
            return Err(HubError::invalid(
                "expires: expected a positive duration such as 24h",
            ));
        }
        let token = agen_shared::tls::JoinToken::generate(ca_sha256);
        let id = new_id();
        let now = now_ms();
        let name = new.name.trim().to_string();
        let rec = TokenRec {
            name: if name.is_empty() { id.clone() } else { name },
            id,
            kind: TokenKind::Join,
            namespace: String::new(),
            role: None,
            secret_sha256: sha256_hex(&token.secret),
            created_at_ms: now,
            expires_at_ms: if new.expires_in_ms == 0 {
                0
            } else {
                now.saturating_add(new.expires_in_ms)
            },
            last_used_at_ms: 0,
            revoked_at_ms: 0,
            max_uses: new.max_uses,
            uses: 0,
            created_by: by.token_name().to_string(),
        };
        self.save(&rec)?;
        let mut idx = self.lock();
        idx.join_by_hash
            .insert(rec.secret_sha256.clone(), rec.id.clone());
        idx.by_id.insert(rec.id.clone(), rec.clone());
        Ok((rec, token.to_string()))
    }

    /// A token by id.
    pub fn get(&self, id: &str) -> Result<TokenRec> {
        self.lock().by_id.get(id).cloned().ok_or_else(|| {
            HubError::not_found(format!(
                "token {id} not found; list them with `agen tokens ls`"
            ))
        })
    }

    /// Every token, oldest first.
    pub fn list(&self) -> Vec<TokenRec> {
        let mut all: Vec<TokenRec> = self.lock().by_id.values().cloned().collect();
        all.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        all
    }

    /// Revokes a token: refused from now on, open streams end.
    pub fn revoke(&self, id: &str) -> Result<TokenRec> {
        let rec = {
            let mut idx = self.lock();
            let rec = idx.by_id.get_mut(id).ok_or_else(|| {
                HubError::not_found(format!(
                    "token {id} not found; list them with `agen tokens ls`"
                ))
            })?;
            if rec.revoked_at_ms == 0 {
                rec.revoked_at_ms = now_ms();
            }
            rec.clone()
        };
        self.save(&rec)?;
        self.revoked.send_modify(|g| *g += 1);
        Ok(rec)
    }

    /// A new name for a token (the rule of [`check_token_name`]); id, secret and scope stay.
    /// A name stored before the rule is mended this way.
    pub fn rename(&self, id: &str, name: &str) -> Result<TokenRec> {
        check_token_name(name)?;
        let rec = {
            let mut idx = self.lock();
            let rec = idx.by_id.get_mut(id).ok_or_else(|| {
                HubError::not_found(format!(
                    "token {id} not found; list them with `agen tokens ls`"
                ))
            })?;
            rec.name = name.to_string();
            rec.clone()
        };
        self.save(&rec)?;
        Ok(rec)
    }

    /// A new secret for an API token; id, name and scope stay. The old secret stops working.
    pub fn rotate(&self, id: &str) -> Result<(TokenRec, String)> {
        let secret = agen_shared::tls::random_secret();
        let rec = {
            let mut idx = self.lock();
            let rec = idx.by_id.get_mut(id).ok_or_else(|| {
                HubError::not_found(format!(
                    "token {id} not found; list them with `agen tokens ls`"
                ))
            })?;
            if rec.kind != TokenKind::Api {
                return Err(HubError::FailedPrecondition(format!(
                    "token {id} is a join token; revoke it and create another with `agen tokens create --join`"
                )));
            }
            if let Some(why) = rec.refusal(now_ms()) {
                return Err(HubError::FailedPrecondition(format!(
                    "cannot rotate: {why}"
                )));
            }
            rec.secret_sha256 = sha256_hex(&secret);
            rec.clone()
        };
        self.save(&rec)?;
        self.revoked.send_modify(|g| *g += 1);
        let text = format!("{API_TOKEN_PREFIX}{}_{secret}", rec.id);
        Ok((rec, text))
    }
}

/// 12 hex digits.
fn new_id() -> String {
    hex::encode(rand::random::<[u8; 6]>())
}

#[cfg(test)]
mod tests;
