//! Day two without footguns (issue 42): `agen deploy` keeps a scaled replica count, a rollback
//! to what runs is a no-op, `agen rm` asks first (and refuses without a terminal) and keeps the
//! history, `agen nests drain --wait` follows the drain, `agen init DIR` names the agent after
//! DIR.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::{agen_bin, HubProcess};
use serde_json::Value;

fn ok(hub: &HubProcess, args: &[&str]) -> String {
    let out = hub.cli(args).unwrap();
    assert!(
        out.status.success(),
        "agen {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `agen init DIR` with a model that needs no key (instances start; no task runs here).
fn init(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(agen_bin())
        .args(["init", dir.to_str().unwrap()])
        .args([
            "--model",
            "openai/fake-model",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn running_ids(hub: &HubProcess, name: &str) -> Vec<String> {
    let mut ids: Vec<String> = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["deployment"] == name && i["state"] == "running")
        .map(|i| i["instance"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn deployment(hub: &HubProcess, name: &str) -> Option<Value> {
    hub.cli_json(&["ps", "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
}

fn history_changes(hub: &HubProcess, name: &str) -> Vec<(u64, String)> {
    hub.cli_json(&["history", name, "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["generation"].as_u64().unwrap(),
                r["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `agen rm NAME` on a pseudo-terminal (util-linux `script`), answering `answer`.
fn rm_on_a_terminal(hub: &HubProcess, name: &str, answer: &str) -> std::process::Output {
    let cmd = format!("{} rm {name}", agen_bin().display());
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The question is asked before the answer is read; the terminal buffers what comes first.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{answer}\n").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn deploy_keeps_the_scale_rollback_to_what_runs_is_a_no_op_and_rm_asks_and_keeps_history() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();

    // `agen init DIR` names the agent after DIR; `--name` chooses; a bad name is usage.
    let dir = tmp.path().join("My Agent");
    let out = init(&dir, &[]);
    assert!(out.status.success(), "{out:?}");
    let md = std::fs::read_to_string(dir.join("x-agen/agent.md")).unwrap();
    assert!(md.contains("\nname: my-agent\n"), "{md}");
    let other = tmp.path().join("other");
    assert!(init(&other, &["--name", "chosen"]).status.success());
    let md = std::fs::read_to_string(other.join("x-agen/agent.md")).unwrap();
    assert!(md.contains("\nname: chosen\n"), "{md}");
    let bad = init(&tmp.path().join("bad"), &["--name", "Not OK!"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    // The README's own sequence: deploy (no --name), scale by the agent's name.
    let d = dir.to_str().unwrap();
    ok(&hub, &["deploy", d, "--wait"]);
    ok(&hub, &["scale", "my-agent", "3", "--wait"]);
    // A new version without --replicas keeps 3; --replicas still sets it.
    std::fs::write(dir.join("README.md"), "version two\n").unwrap();
    ok(&hub, &["deploy", d, "--wait"]);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 3);
    assert_eq!(running_ids(&hub, "my-agent").len(), 3);
    ok(&hub, &["deploy", d, "--replicas", "2", "--wait"]);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 2);

    // Rollback to the generation that runs now: nothing changes, and it says so.
    let ids = running_ids(&hub, "my-agent");
    let gen = deployment(&hub, "my-agent").unwrap()["generation"]
        .as_u64()
        .unwrap();
    let before = history_changes(&hub, "my-agent");
    let out = ok(
        &hub,
        &["rollback", "my-agent", "--to-generation", &gen.to_string()],
    );
    assert!(out.contains("already runs that"), "{out}");
    assert!(out.contains("nothing restarted"), "{out}");
    let v = hub
        .cli_json(&[
            "rollback",
            "my-agent",
            "--to-generation",
            &gen.to_string(),
            "-o",
            "json",
        ])
        .unwrap();
    assert_eq!(
        (v["changed"].clone(), v["generation"].clone()),
        (false.into(), gen.into())
    );
    assert_eq!(history_changes(&hub, "my-agent"), before);
    assert_eq!(running_ids(&hub, "my-agent"), ids, "no instance restarted");

    // rm without a terminal and without --yes refuses (2); on a terminal it asks.
    let out = hub.cli(&["rm", "my-agent"]).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--yes"),
        "{out:?}"
    );
    let out = rm_on_a_terminal(&hub, "my-agent", "n");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("remove deployment default/my-agent (2 replicas, generation"),
        "{said}"
    );
    assert!(deployment(&hub, "my-agent").is_some(), "a no keeps it");
    let out = rm_on_a_terminal(&hub, "my-agent", "y");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(deployment(&hub, "my-agent").is_none());

    // The history stays (until the task retention), its last row the removal.
    let mut want = before.clone();
    want.push((gen + 1, "removed".into()));
    assert_eq!(history_changes(&hub, "my-agent"), want);
    // Deployed again, the deployment goes on from there.
    ok(&hub, &["deploy", d, "--wait"]);
    want.push((gen + 2, "deploy".into()));
    assert_eq!(history_changes(&hub, "my-agent"), want);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 1);
    ok(&hub, &["rm", "my-agent", "--yes"]);
    // A name that never existed is still not found.
    assert_eq!(hub.cli(&["rm", "ghost"]).unwrap().status.code(), Some(4));
}

#[test]
fn nests_drain_wait_follows_until_the_nest_is_empty_and_nests_shows_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let dir = tmp.path().join("drainee");
    assert!(init(&dir, &[]).status.success());
    ok(
        &hub,
        &["deploy", dir.to_str().unwrap(), "--replicas", "2", "--wait"],
    );
    let _b = hub.nest("nest-b", &[], &[]).unwrap();

    // Idle instances move at once; --wait returns only when none is left on nest-a.
    let out = hub
        .cli(&["nests", "drain", "nest-a", "--deadline", "10m", "--wait"])
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("nest nest-a: no instance left"), "{err}");
    let left_on_a = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["nest"] == "nest-a" && i["state"] != "lost")
        .count();
    assert_eq!(left_on_a, 0);

    // The drain's deadline shows in the table and in JSON.
    let table = ok(&hub, &["nests"]);
    let row = table.lines().find(|l| l.starts_with("nest-a")).unwrap();
    assert!(row.contains("ready,cordoned,draining until"), "{table}");
    let a = hub
        .nests()
        .unwrap()
        .into_iter()
        .find(|n| n["name"] == "nest-a")
        .unwrap();
    assert!(a["draining_until"].is_string(), "{a}");
    let b = hub
        .nests()
        .unwrap()
        .into_iter()
        .find(|n| n["name"] == "nest-b")
        .unwrap();
    assert_eq!(b["draining_until"], Value::Null);
    hub.wait_instances("both replicas on nest-b", Duration::from_secs(60), |l| {
        l.iter()
            .filter(|i| i["nest"] == "nest-b" && i["state"] == "running")
            .count()
            == 2
    })
    .unwrap();
}
