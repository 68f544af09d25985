//! Versions (issue 38): `agen version` prints the crate version, the commit and the protocol
//! version; a Nest outside the Hub's protocol window (its minor and the one before, same major)
//! is refused with an error naming both versions and never joins; `agen nests` shows each
//! Nest's version, commit and protocol. `AGEN_PROTOCOL_VERSION` on a process stands in for an
//! older or newer build.

use std::process::Command;
use std::time::Duration;

use agen_shared::version::Protocol;
use agen_tests::{agen_bin, free_port, wait_for, HubProcess, Proc};

fn is_commit(s: &str) -> bool {
    s.len() == 12 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[test]
fn agen_version_prints_the_crate_version_the_commit_and_the_protocol() {
    let out = Command::new(agen_bin()).arg("version").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("agen {}", env!("CARGO_PKG_VERSION")));
    let commit = lines[1].strip_prefix("commit ").unwrap_or_default();
    assert!(is_commit(commit), "a 12-hex commit: {text}");
    assert_eq!(lines[2], format!("protocol {}", Protocol::CURRENT));

    let out = Command::new(agen_bin())
        .args(["version", "-o", "json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["commit"], commit);
    assert_eq!(v["protocol"], Protocol::CURRENT.to_string());
}

#[test]
fn a_nest_outside_the_hubs_protocol_window_is_refused_naming_both_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_env(
        tmp.path(),
        free_port(),
        "3s",
        &[],
        &[("AGEN_PROTOCOL_VERSION", "1.3")],
    )
    .unwrap();
    // The minor before the Hub's: inside the window (Hubs are upgraded first).
    let _old = hub
        .nest("old-minor", &[], &[("AGEN_PROTOCOL_VERSION", "1.2")])
        .unwrap();
    let mut refused = Vec::new();
    for (name, version) in [
        ("too-old", "1.1"),
        ("too-new", "1.4"),
        ("other-major", "2.3"),
    ] {
        let dir = tmp.path().join("nests").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new(agen_bin());
        cmd.args(["nest", "--hub", &hub.url(), "--join-file"])
            .arg(tmp.path().join("hub/join-token"))
            .args(["--name", name, "--run-as-self", "--data-dir"])
            .arg(&dir)
            .env("RUST_LOG", "info")
            .env("AGEN_PROTOCOL_VERSION", version);
        let proc = Proc::spawn(name, cmd, &tmp.path().join(format!("nest-{name}.log"))).unwrap();
        let expected = [
            format!("nest {name} (agen {}", env!("CARGO_PKG_VERSION")),
            format!("speaks protocol {version}"),
            "this hub (agen".to_string(),
            "speaks protocol 1.3 and accepts nests of protocol 1.3 or 1.2".to_string(),
        ];
        wait_for(
            &format!("nest {name} (protocol {version}) to be refused"),
            Duration::from_secs(30),
            || {
                let log = proc.log_text();
                expected.iter().all(|e| log.contains(e)).then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}; nest log:\n{}", proc.log_text()));
        refused.push(proc);
    }
    let nests = hub.nests().unwrap();
    let names: Vec<&str> = nests.iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(
        names,
        ["old-minor"],
        "only the nest inside the window joined"
    );
    let n = &nests[0];
    assert_eq!(n["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(n["protocol_version"], "1.2");
    assert!(is_commit(n["commit"].as_str().unwrap_or_default()), "{n}");
    let table = hub.cli(&["nests"]).unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    let expected = format!(
        "{} ({}, protocol 1.2)",
        env!("CARGO_PKG_VERSION"),
        n["commit"].as_str().unwrap_or_default()
    );
    assert!(
        table.contains(&expected),
        "agen nests shows {expected}:\n{table}"
    );
}

/// A Hub that requires uid separation (`--require-uid-separation`) refuses a Nest whose
/// instances would run as its own user (`--run-as-self`), naming the capability and what the
/// Nest reported; a Nest with separation (root, a uid range) joins.
#[test]
fn a_nest_lacking_uid_separation_is_refused_when_the_hub_requires_it() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_env(
        tmp.path(),
        free_port(),
        "3s",
        &["--require-uid-separation"],
        &[],
    )
    .unwrap();
    let dir = tmp.path().join("nests/as-self");
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(agen_bin());
    cmd.args(["nest", "--hub", &hub.url(), "--join-file"])
        .arg(tmp.path().join("hub/join-token"))
        .args(["--name", "as-self", "--run-as-self", "--data-dir"])
        .arg(&dir)
        .env("RUST_LOG", "info");
    let proc = Proc::spawn("as-self", cmd, &tmp.path().join("nest-as-self.log")).unwrap();
    let expected = [
        "nest as-self lacks uid separation, which this hub requires (--require-uid-separation)",
        "separation: off (run-as-self)",
    ];
    wait_for(
        "the nest without separation to be refused",
        Duration::from_secs(30),
        || {
            let log = proc.log_text();
            expected.iter().all(|e| log.contains(e)).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}; nest log:\n{}", proc.log_text()));
    let mut kept = Vec::new();
    let mut joined = Vec::new();
    if nix::unistd::Uid::effective().is_root() {
        kept.push(
            hub.nest_with("separated", &[], &[], &["--run-uids", "62140-62149"])
                .unwrap(),
        );
        joined.push("separated");
    }
    let nests = hub.nests().unwrap();
    let names: Vec<&str> = nests.iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(names, joined, "only a nest with uid separation joined");
}
