//! The daemons' config file: keys set flags, flags win, unknown keys and bad values are named.

use std::ffi::OsString;

use pretty_assertions::assert_eq;

use super::*;

fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("hub.toml");
    std::fs::write(&path, text).expect("write config");
    (dir, path)
}

fn argv(args: &[&str]) -> Vec<OsString> {
    std::iter::once("agen")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect()
}

fn hub(args: &[&str]) -> Result<Box<crate::cmd::hub::Args>, String> {
    match try_parse(&argv(args)) {
        Ok(Cli {
            command: Command::Hub(a),
        }) => Ok(a),
        Ok(other) => Err(format!("not agen hub: {other:?}")),
        Err(Failure::File(m)) => Err(m),
        Err(Failure::Clap(e)) => Err(first_line(&e.to_string())),
    }
}

#[test]
fn a_config_file_sets_flags_and_a_flag_wins_over_it() {
    let (_d, path) = file(
        "nest-ttl = \"7s\"\nmax-labels = 9\ninsecure-plaintext = true\ntls-name = [\"a.example\", \"b.example\"]\n",
    );
    let p = path.to_str().unwrap();
    let a = hub(&["hub", "--config", p]).unwrap();
    assert_eq!(
        (
            a.nest_ttl,
            a.max_labels,
            a.insecure_plaintext,
            a.tls_names.clone()
        ),
        (
            std::time::Duration::from_secs(7),
            9,
            true,
            vec!["a.example".to_string(), "b.example".to_string()]
        )
    );
    assert_eq!(a.effective.get("nest-ttl").unwrap().source, Source::File);
    assert_eq!(a.effective.get("listen").unwrap().source, Source::Default);

    let a = hub(&["hub", "--config", p, "--nest-ttl", "3s"]).unwrap();
    assert_eq!(a.nest_ttl, std::time::Duration::from_secs(3));
    assert_eq!(a.effective.get("nest-ttl").unwrap().source, Source::Flag);
}

#[test]
fn an_unknown_key_is_refused_naming_it() {
    let (_d, path) = file("nest-ttl = \"7s\"\nretention = \"3d\"\n");
    let err = hub(&["hub", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(
        err.contains("unknown key `retention`") && err.contains(path.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn a_bad_value_is_refused_naming_the_key_and_the_flags_own_parser_error() {
    let (_d, path) = file("nest-ttl = \"soon\"\n");
    let err = hub(&["hub", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(
        err.contains("key `nest-ttl`") && err.contains("soon"),
        "{err}"
    );
    let (_d, path) = file("insecure-plaintext = \"yes\"\n");
    let err = hub(&["hub", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("expected true or false"), "{err}");
    let (_d, path) = file("listen = [\"127.0.0.1:1\"]\n");
    let err = hub(&["hub", "--config", path.to_str().unwrap()]).unwrap_err();
    assert!(err.contains("not a list"), "{err}");
}

#[test]
fn the_effective_config_reads_back_as_the_same_config_and_hides_secrets() {
    let (_d, path) = file(
        "nest-ttl = \"7s\"\nstore = \"postgres://u:hunter2@db/agen\"\ntls-name = [\"a.example\"]\n",
    );
    let a = hub(&["hub", "--config", path.to_str().unwrap(), "config"]).unwrap();
    let text = a.effective.to_toml();
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        text.contains("# store is set (file, AGEN_HUB_STORE); a secret, not shown"),
        "{text}"
    );
    assert!(
        text.contains("nest-ttl = \"7s\"  # file, AGEN_HUB_NEST_TTL"),
        "{text}"
    );
    // What it prints is a config file that gives the same values.
    let (_d2, again) = file(&text);
    let b = hub(&["hub", "--config", again.to_str().unwrap(), "config"]).unwrap();
    let values = |e: &Effective| -> Vec<(String, Vec<String>)> {
        e.settings
            .iter()
            .filter(|s| !s.secret)
            .map(|s| (s.key.clone(), s.values.clone()))
            .collect()
    };
    assert_eq!(values(&b.effective), values(&a.effective));
}

#[test]
fn every_daemon_flag_has_a_variable() {
    let cmd = command();
    for (daemon, _) in DAEMONS {
        let sub = cmd.find_subcommand(daemon).unwrap();
        let missing: Vec<&str> = sub
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .filter_map(|a| a.get_long())
            .collect();
        assert_eq!(missing, Vec::<&str>::new(), "agen {daemon}");
    }
    let hub = cmd.find_subcommand("hub").unwrap();
    let env_of = |long: &str| {
        hub.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
    };
    assert_eq!(env_of("nest-ttl").as_deref(), Some("AGEN_HUB_NEST_TTL"));
    assert_eq!(env_of("store").as_deref(), Some("AGEN_HUB_STORE"));
    assert_eq!(
        env_of("snapshot-key-file").as_deref(),
        Some("AGEN_SNAPSHOT_KEY_FILE")
    );
}
