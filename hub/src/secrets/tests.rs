//! The secret store: values round-trip, are sealed on disk, survive a restart, and names and
//! values are checked with errors that name the field.

use std::sync::Arc;

use pretty_assertions::assert_eq;

use super::*;
use crate::store::SledStore;

const VALUE: &str = "postgres://app:hunter2-very-secret@db.internal/app";

fn open(dir: &Path) -> SecretStore {
    let store = SledStore::open(&dir.join("db")).expect("open sled");
    let key = SecretKey::load_or_create(&dir.join("secret.key")).expect("key");
    SecretStore::new(Db::new(Arc::new(store)), key)
}

fn names(values: &SecretValues) -> Vec<&str> {
    values.0.keys().map(String::as_str).collect()
}

#[test]
fn a_sealed_value_opens_only_with_its_key_and_its_name() {
    let key = SecretKey::from_bytes(&[7; 32]);
    let sealed = key.seal("agen-secret:default/A", VALUE.as_bytes());
    assert_eq!(
        key.open("agen-secret:default/A", &sealed),
        Some(VALUE.as_bytes().to_vec())
    );
    assert_eq!(key.open("agen-secret:default/B", &sealed), None);
    assert_eq!(
        SecretKey::from_bytes(&[8; 32]).open("agen-secret:default/A", &sealed),
        None
    );
    let again = key.seal("agen-secret:default/A", VALUE.as_bytes());
    assert_ne!(sealed.nonce, again.nonce, "every seal takes a fresh nonce");
    assert!(!sealed.ciphertext.contains(&hex::encode(VALUE)));
}

#[test]
fn stored_secrets_round_trip_and_list_without_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(dir.path());
    let (meta, replaced) = store
        .set("default", "DATABASE_URL", VALUE, 1000)
        .expect("set");
    assert!(!replaced);
    assert_eq!(
        (meta.name.as_str(), meta.created_at_ms, meta.updated_at_ms),
        ("DATABASE_URL", 1000, 1000)
    );
    let (meta, replaced) = store
        .set("default", "DATABASE_URL", "v2", 2000)
        .expect("set");
    assert!(replaced);
    assert_eq!((meta.created_at_ms, meta.updated_at_ms), (1000, 2000));
    store
        .set("other", "DATABASE_URL", "other-ns", 3000)
        .expect("set");

    let wanted = ["DATABASE_URL".to_string(), "NOT_SET".to_string()];
    let values = store.values("default", wanted.iter()).expect("values");
    assert_eq!(values.0.get("DATABASE_URL").map(String::as_str), Some("v2"));
    assert_eq!(names(&values), vec!["DATABASE_URL"]);
    assert_eq!(format!("{values:?}"), r#"{"DATABASE_URL"}"#);

    let listed: Vec<(String, String)> = store
        .list("default")
        .expect("list")
        .into_iter()
        .map(|m| (m.namespace, m.name))
        .collect();
    assert_eq!(listed, vec![("default".into(), "DATABASE_URL".into())]);

    assert!(store.delete("default", "DATABASE_URL").expect("delete"));
    assert!(!store
        .delete("default", "DATABASE_URL")
        .expect("delete again"));
    assert_eq!(store.list("default").expect("list").len(), 0);
    assert_eq!(store.list("other").expect("list").len(), 1);
}

#[test]
fn the_data_dir_never_holds_the_plaintext_and_a_restart_keeps_the_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = open(dir.path());
        store.set("default", "TOKEN", VALUE, 1).expect("set");
        futures::executor::block_on(store.db.flush()).expect("flush");
    }
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("secret.key"))
            .expect("key file")
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    for entry in walk(dir.path()) {
        let bytes = std::fs::read(&entry).expect("read");
        assert!(
            !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
            "{} holds the plaintext",
            entry.display()
        );
    }
    let store = open(dir.path());
    let values = store
        .values("default", ["TOKEN".to_string()].iter())
        .expect("values after restart");
    assert_eq!(values.0.get("TOKEN").map(String::as_str), Some(VALUE));
}

#[test]
fn a_key_file_of_the_wrong_size_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("secret.key");
    std::fs::write(&path, b"short").expect("write");
    let err = SecretKey::load_or_create(&path).expect_err("refused");
    assert!(
        err.to_string()
            .contains("expected a 32-byte key, found 5 bytes"),
        "{err}"
    );
}

#[test]
fn names_and_values_are_checked() {
    fn check_name(name: &str, expected: Result<(), &str>) {
        let got = validate_secret_name("name", name).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(part)) => assert!(e.contains(part), "{name}: {e}"),
            (got, expected) => panic!("{name}: got {got:?}, expected {expected:?}"),
        }
    }
    check_name("DATABASE_URL", Ok(()));
    check_name("_x9", Ok(()));
    check_name("", Err("name: expected a secret name, got an empty string"));
    check_name("9LIVES", Err("name: `9LIVES` is not a valid secret name"));
    check_name("A-B", Err("letters, digits and `_`"));
    check_name(&"A".repeat(129), Err("up to 128"));

    fn check_value(value: &[u8], expected: Result<&str, &str>) {
        let got = validate_secret_value("value", value).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(v), Ok(want)) => assert_eq!(v, want),
            (Err(e), Err(part)) => assert!(e.contains(part), "{e}"),
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }
    check_value(b"s3cret", Ok("s3cret"));
    check_value(b"", Err("value: expected a value, got nothing"));
    check_value(&[0xff, 0xfe], Err("value: expected UTF-8 text"));
    check_value(b"a\0b", Err("without NUL"));
    check_value(
        &vec![b'x'; MAX_SECRET_BYTES],
        Ok(&"x".repeat(MAX_SECRET_BYTES)),
    );
    check_value(
        &vec![b'x'; MAX_SECRET_BYTES + 1],
        Err("value: 65537 bytes is over the 64 KiB secret limit"),
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
