//! A Nest's configuration file read again on SIGHUP (README "Configuration file and reload"):
//! its labels and its `cordon` reach the Hub without a restart (`agen nests` shows them), a
//! cordon set through the API wins until the file's `cordon` changes, and a key that needs a
//! restart is named as such.

use std::path::Path;
use std::time::Duration;

use agen_tests::{wait_for, HubProcess, NestProcess};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

fn nest_of(hub: &HubProcess, name: &str) -> Option<Value> {
    hub.nests().ok()?.into_iter().find(|n| n["name"] == name)
}

/// Writes `text` to the Nest's file, sends SIGHUP and waits until `agen nests` shows `want`
/// (its labels and cordon).
fn reload(hub: &HubProcess, nest: &NestProcess, file: &Path, text: &str, want: (Value, bool)) {
    std::fs::write(file, text).unwrap();
    kill(Pid::from_raw(nest.proc.pid() as i32), Signal::SIGHUP).unwrap();
    let mut last = Value::Null;
    wait_for(
        "agen nests to show the reload",
        Duration::from_secs(20),
        || {
            let n = nest_of(hub, &nest.name)?;
            last = n.clone();
            (n["labels"] == want.0 && n["cordoned"] == want.1).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {last}\nnest log:\n{}", nest.proc.log_text()));
}

#[test]
fn sighup_applies_a_nests_labels_and_cordon_and_an_api_uncordon_wins_until_the_file_changes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let file = tmp.path().join("nest.toml");
    std::fs::write(&file, "label = [\"zone=eu-1\"]\ncapacity = 8\n").unwrap();
    let nest = hub
        .nest_with(
            "hup",
            &[],
            &[],
            &["--run-as-self", "--config", file.to_str().unwrap()],
        )
        .unwrap();
    let n = nest_of(&hub, "hup").unwrap();
    assert_eq!(n["labels"], json!({"zone": "eu-1"}), "{n}");
    assert_eq!(n["cordoned"], false, "{n}");

    // New labels and a cordon, live; the capacity needs a restart and says so.
    reload(
        &hub,
        &nest,
        &file,
        "label = [\"zone=eu-2\", \"gpu=yes\"]\ncordon = true\ncapacity = 4\n",
        (json!({"zone": "eu-2", "gpu": "yes"}), true),
    );
    let log = nest.proc.log_text();
    assert!(
        log.contains(
            "applied without a restart: cordon false -> true; label zone=eu-1 -> zone=eu-2,gpu=yes"
        ),
        "{log}"
    );
    assert!(
        log.contains("changed but applied only at a restart: capacity 8 -> 4"),
        "{log}"
    );
    assert_eq!(nest_of(&hub, "hup").unwrap()["capacity"], 8);

    // The API's uncordon wins over the file's unchanged `cordon = true`...
    let out = hub.cli(&["nests", "uncordon", "hup"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    reload(
        &hub,
        &nest,
        &file,
        "label = [\"zone=eu-3\"]\ncordon = true\ncapacity = 4\n",
        (json!({"zone": "eu-3"}), false),
    );
    // ...until the file changes it: off, then on again.
    reload(
        &hub,
        &nest,
        &file,
        "label = [\"zone=eu-3\"]\ncapacity = 4\n",
        (json!({"zone": "eu-3"}), false),
    );
    reload(
        &hub,
        &nest,
        &file,
        "label = [\"zone=eu-3\"]\ncordon = true\ncapacity = 4\n",
        (json!({"zone": "eu-3"}), true),
    );
    // `agen nest config` names what a SIGHUP applies.
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["nest", "config", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("# a SIGHUP applies log-level, label, cordon; a change of any other key needs a restart"),
        "{text}"
    );
}
