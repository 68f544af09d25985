//! Unit tests of the token registry and Nest identities over a real sled store.

use std::sync::Arc;

use super::nests::{JoinGrant, NestIdentities};
use super::*;
use crate::store::{Db, SledStore};

fn db(dir: &std::path::Path) -> Db {
    Db::new(Arc::new(SledStore::open(&dir.join("db")).unwrap()))
}

fn api(ns: &str, role: Role, expires_in_ms: i64) -> NewToken {
    NewToken {
        kind: Some(TokenKind::Api),
        namespace: ns.into(),
        role: Some(role),
        name: format!("{ns}-{}", role.as_str()),
        expires_in_ms,
        max_uses: 0,
    }
}

#[test]
fn tokens_resolve_until_revoked_and_keep_only_a_hash() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    assert_eq!(
        tokens.resolve("the-admin").unwrap(),
        Principal::ClusterAdmin
    );
    let (rec, text) = tokens
        .create(&Principal::ClusterAdmin, api("ci", Role::Submitter, 0))
        .unwrap();
    let who = tokens.resolve(&text).unwrap();
    assert_eq!(
        who,
        Principal::Api {
            id: rec.id.clone(),
            name: "ci-submitter".into(),
            namespace: "ci".into(),
            role: Role::Submitter,
        }
    );
    assert!(!serde_json::to_string(&tokens.list())
        .unwrap()
        .contains(&text[20..]));
    // The secret is checked, not just the id.
    let forged = format!("{API_TOKEN_PREFIX}{}_{}", rec.id, "0".repeat(64));
    assert!(tokens.resolve(&forged).is_err());

    let (_, rotated) = tokens.rotate(&rec.id).unwrap();
    assert!(
        tokens.resolve(&text).is_err(),
        "the old secret stops working"
    );
    assert_eq!(tokens.resolve(&rotated).unwrap(), who);

    tokens.revoke(&rec.id).unwrap();
    let err = tokens.resolve(&rotated).unwrap_err().to_string();
    assert!(err.contains("was revoked"), "{err}");

    // Everything survives a restart.
    drop(tokens);
}

#[test]
fn an_expired_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    let (_, text) = tokens
        .create(&Principal::ClusterAdmin, api("ci", Role::Viewer, 1))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let err = tokens.resolve(&text).unwrap_err().to_string();
    assert!(err.contains("expired"), "{err}");
}

#[test]
fn roles_nest_within_their_namespace_only() {
    let who = Principal::Api {
        id: "i".into(),
        name: "dash".into(),
        namespace: "prod".into(),
        role: Role::Submitter,
    };
    assert!(who
        .allows(Need::Role(Role::Viewer), "prod", "GetTask")
        .is_ok());
    assert!(who
        .allows(Need::Role(Role::Submitter), "prod", "SubmitTask")
        .is_ok());
    let err = who
        .allows(Need::Role(Role::Deployer), "prod", "CreateDeployment")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "CreateDeployment in namespace `prod` needs role deployer (or higher) in namespace `prod`; token `dash` (id i) is submitter in namespace `prod`"
    );
    assert!(who
        .allows(Need::Role(Role::Viewer), "ci", "GetTask")
        .is_err());
    assert!(who.allows(Need::Cluster, "", "ListNests").is_err());
    assert!(Principal::ClusterAdmin
        .allows(Need::Cluster, "", "ListNests")
        .is_ok());
}

#[test]
fn join_tokens_count_uses_and_the_bootstrap_one_is_unlimited() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    let ca = "ab".repeat(32);
    let boot = agen_shared::tls::JoinToken::generate(&ca).to_string();
    tokens.ensure_bootstrap_join(&boot, None).unwrap();
    tokens.ensure_bootstrap_join(&boot, None).unwrap();
    assert_eq!(tokens.list().len(), 1);
    for _ in 0..3 {
        let t = tokens.check_join(Some(&boot)).unwrap();
        tokens.use_join(&t.id).unwrap();
    }
    let (rec, once) = tokens
        .create_join(
            &Principal::ClusterAdmin,
            &ca,
            NewToken {
                max_uses: 1,
                ..NewToken::default()
            },
        )
        .unwrap();
    tokens
        .use_join(&tokens.check_join(Some(&once)).unwrap().id)
        .unwrap();
    assert!(tokens.check_join(Some(&once)).is_err(), "one use only");
    tokens.revoke(&rec.id).unwrap();
    // A join token is not an API token, and the other way round.
    assert!(tokens.resolve(&boot).is_err());
    assert!(tokens.check_join(Some("the-admin")).is_err());
}

#[test]
fn a_nest_id_stays_bound_to_its_key_until_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let ids = NestIdentities::open(db(dir.path())).unwrap();
    assert_eq!(ids.join_grant("n1", "key-a").unwrap(), JoinGrant::Bind);
    ids.bind("n1", "alpha", "key-a").unwrap();
    assert_eq!(ids.join_grant("n1", "key-a").unwrap(), JoinGrant::Renew);
    let err = ids.join_grant("n1", "key-b").unwrap_err().to_string();
    assert!(err.contains("cannot take over"), "{err}");
    ids.check_caller("n1", "key-a").unwrap();
    assert!(ids.check_caller("n1", "key-b").is_err());

    ids.revoke("n1", "alpha").unwrap();
    assert!(ids.check_caller("n1", "key-a").is_err());
    assert!(ids.join_grant("n1", "key-a").is_err());

    ids.forget("n1", "alpha").unwrap();
    assert_eq!(ids.join_grant("n1", "key-c").unwrap(), JoinGrant::Bind);
    // The forgotten key's certificate is refused for good.
    assert!(ids.check_caller("n1", "key-a").is_err());
}

#[test]
fn a_never_expiring_bootstrap_join_token_is_given_an_expiry_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    let boot = agen_shared::tls::JoinToken::generate(&"ab".repeat(32)).to_string();
    // As an older Hub left it: no expiry.
    tokens.ensure_bootstrap_join(&boot, None).unwrap();
    assert_eq!(tokens.list()[0].expires_at_ms, 0);
    // The next start gives it one; a later start does not move it.
    let day = std::time::Duration::from_secs(24 * 3600);
    tokens.ensure_bootstrap_join(&boot, Some(day)).unwrap();
    let at = tokens.list()[0].expires_at_ms;
    let from_now = at - crate::model::now_ms();
    assert!((day.as_millis() as i64 - 60_000..=day.as_millis() as i64).contains(&from_now));
    tokens.ensure_bootstrap_join(&boot, Some(day * 2)).unwrap();
    assert_eq!(tokens.list()[0].expires_at_ms, at);
    // Expired: refused naming the expiry and the command that makes another.
    let dir2 = tempfile::tempdir().unwrap();
    let expired = Tokens::open(db(dir2.path()), "the-admin").unwrap();
    let other = agen_shared::tls::JoinToken::generate(&"cd".repeat(32)).to_string();
    expired
        .ensure_bootstrap_join(&other, Some(std::time::Duration::ZERO))
        .unwrap();
    let err = expired.check_join(Some(&other)).unwrap_err().to_string();
    assert!(err.contains("expired at 20"), "{err}");
    assert!(err.contains("agen tokens create --join"), "{err}");
}

#[test]
fn a_name_stored_before_the_name_rule_is_kept_and_can_be_renamed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    let (rec, _) = tokens
        .create(&Principal::ClusterAdmin, api("ns", Role::Viewer, 0))
        .unwrap();
    // What an older Hub let through: a line break and an escape sequence.
    let mut old = tokens.get(&rec.id).unwrap();
    old.name = "admin\n\u{1b}[2Jx".into();
    tokens.save(&old).unwrap();
    drop(tokens);
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    assert_eq!(tokens.get(&rec.id).unwrap().name, "admin\n\u{1b}[2Jx");
    // The new name obeys the rule; the id stays.
    for bad in ["admin", "two\nlines", "bell\u{7}"] {
        assert!(tokens.rename(&rec.id, bad).is_err(), "{bad:?}");
    }
    assert!(tokens.rename("nosuch", "fine").is_err());
    assert_eq!(tokens.rename(&rec.id, "ci-bot").unwrap().id, rec.id);
    drop(tokens);
    let tokens = Tokens::open(db(dir.path()), "the-admin").unwrap();
    assert_eq!(tokens.get(&rec.id).unwrap().name, "ci-bot");
}
