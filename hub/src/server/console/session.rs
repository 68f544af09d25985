//! Web console sessions: a sign-in exchanges an API token for a random session id (the
//! cookie) and a CSRF token; the store keeps, under the sha256 of the id, which token it
//! stands for and the sha256 of that token's secret then, so every Hub on the store knows the
//! session and a restart keeps it. A session is refused from the moment its token is revoked,
//! rotated or expires, at its own end (`--console-session-max`, at most 12 h), and after
//! sign-out (its record is removed). No token secret is stored.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{HubError, Result};
use crate::model::now_ms;
use crate::store::{Db, Table};
use crate::tokens::{Principal, Tokens};

/// The session cookie's name.
pub const COOKIE: &str = "agen_session";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionRec {
    /// The token it stands for (`admin`: the cluster admin's).
    token_id: String,
    /// The sha256 of the token's secret at sign-in: a rotation ends the session.
    secret_sha256: String,
    /// Sent back in `X-CSRF-Token` on every mutating request.
    csrf: String,
    created_at_ms: i64,
    expires_at_ms: i64,
}

/// A live session.
#[derive(Debug, Clone)]
pub struct Session {
    pub principal: Principal,
    pub csrf: String,
    pub expires_at_ms: i64,
    key: String,
}

fn key_of(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

fn random_hex() -> String {
    agen_shared::tls::random_secret()
}

fn gone() -> HubError {
    HubError::Unauthenticated("not signed in, or the session ended; sign in again".into())
}

/// Starts a session for `bearer`: its id (for the cookie) and the session.
pub async fn sign_in(
    db: &Db,
    tokens: &Tokens,
    bearer: &str,
    max: std::time::Duration,
) -> Result<(String, Session)> {
    let (principal, secret_sha256) = tokens.resolve_with_secret(bearer.trim())?;
    let now = now_ms();
    let mut expires_at_ms = now + i64::try_from(max.as_millis()).unwrap_or(i64::MAX / 2);
    if let Some(at) = tokens.expires_at_ms(&principal) {
        expires_at_ms = expires_at_ms.min(at);
    }
    let id = random_hex();
    let rec = SessionRec {
        token_id: principal.token_id().to_string(),
        secret_sha256,
        csrf: random_hex(),
        created_at_ms: now,
        expires_at_ms,
    };
    let key = key_of(&id);
    db.put_json(Table::ConsoleSessions, &key, &rec)?;
    db.flush().await?;
    Ok((
        id,
        Session {
            principal,
            csrf: rec.csrf,
            expires_at_ms,
            key,
        },
    ))
}

/// The live session of cookie value `id`, or why there is none.
pub fn resume(db: &Db, tokens: &Tokens, id: &str) -> Result<Session> {
    if id.is_empty() || id.len() > 128 {
        return Err(gone());
    }
    let key = key_of(id);
    let Some(rec) = db.get_json::<SessionRec>(Table::ConsoleSessions, &key)? else {
        return Err(gone());
    };
    if now_ms() >= rec.expires_at_ms {
        db.remove(Table::ConsoleSessions, &key)?;
        return Err(HubError::Unauthenticated(
            "the console session ended (--console-session-max); sign in again".into(),
        ));
    }
    let principal = match tokens.principal_with_secret(&rec.token_id, &rec.secret_sha256) {
        Ok(p) => p,
        Err(e) => {
            // Revoked, rotated, expired or gone: the session ends for good.
            db.remove(Table::ConsoleSessions, &key)?;
            return Err(e);
        }
    };
    Ok(Session {
        principal,
        csrf: rec.csrf,
        expires_at_ms: rec.expires_at_ms,
        key,
    })
}

/// Ends `session` (sign-out).
pub async fn sign_out(db: &Db, session: &Session) -> Result<()> {
    db.remove(Table::ConsoleSessions, &session.key)?;
    db.flush().await?;
    Ok(())
}

/// Whether `sent` is the session's CSRF token (constant time).
pub fn csrf_ok(session: &Session, sent: &str) -> bool {
    let (a, b) = (session.csrf.as_bytes(), sent.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::tokens::{NewToken, Role};

    fn setup() -> (tempfile::TempDir, Db, Arc<Tokens>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::new(Arc::new(
            crate::store::SledStore::open(&dir.path().join("db")).unwrap(),
        ));
        let tokens = Tokens::open(db.clone(), "the-admin").unwrap();
        (dir, db, tokens)
    }

    fn viewer(tokens: &Tokens) -> (String, String) {
        let (rec, secret) = tokens
            .create(
                &Principal::ClusterAdmin,
                NewToken {
                    name: "v".into(),
                    namespace: "default".into(),
                    role: Some(Role::Viewer),
                    kind: None,
                    expires_in_ms: 0,
                    max_uses: 0,
                },
            )
            .unwrap();
        (rec.id, secret)
    }

    #[tokio::test]
    async fn a_session_ends_at_sign_out_revocation_rotation_and_its_end() {
        let (_dir, db, tokens) = setup();
        let max = Duration::from_secs(3600);

        // The admin token signs in too.
        let (id, s) = sign_in(&db, &tokens, "the-admin", max).await.unwrap();
        assert_eq!(s.principal, Principal::ClusterAdmin);
        assert_eq!(resume(&db, &tokens, &id).unwrap().csrf, s.csrf);
        assert!(csrf_ok(&s, &s.csrf) && !csrf_ok(&s, "forged") && !csrf_ok(&s, ""));
        sign_out(&db, &s).await.unwrap();
        assert!(resume(&db, &tokens, &id).is_err(), "signed out");

        // Revoked: refused at once.
        let (tid, secret) = viewer(&tokens);
        let (id, _) = sign_in(&db, &tokens, &secret, max).await.unwrap();
        assert!(resume(&db, &tokens, &id).is_ok());
        tokens.revoke(&tid).unwrap();
        assert!(resume(&db, &tokens, &id).is_err(), "revoked");

        // Rotated: refused at once, the new secret signs in.
        let (tid, secret) = viewer(&tokens);
        let (id, _) = sign_in(&db, &tokens, &secret, max).await.unwrap();
        let (_, new_secret) = tokens.rotate(&tid).unwrap();
        assert!(resume(&db, &tokens, &id).is_err(), "rotated");
        assert!(sign_in(&db, &tokens, &secret, max).await.is_err());
        assert!(sign_in(&db, &tokens, &new_secret, max).await.is_ok());

        // Past its end: refused, and a wrong or unknown id never finds one.
        let (_, secret) = viewer(&tokens);
        let (id, _) = sign_in(&db, &tokens, &secret, Duration::ZERO)
            .await
            .unwrap();
        assert!(resume(&db, &tokens, &id).is_err(), "ended");
        assert!(resume(&db, &tokens, "nope").is_err());
        assert!(sign_in(&db, &tokens, "not-a-token", max).await.is_err());
    }
}
