//! Least privilege on the Nest host (issue 12 items 2 and 3).
//!
//! No child left behind: a command the model runs through the workspace `run` tool escapes its
//! process group with `setsid` and with a double fork; the first is gone once the call times
//! out, the second once its instance stops, and neither outlives the Nest's view of the
//! instance.
//!
//! A uid per instance: with separation on, instances of two namespaces run under two uids of
//! the range; the workspace `run` tool of one reads neither the Nest's key, the Hub's admin
//! token and data dir, nor the environment of the other's tool server, and has a HOME and a
//! TMPDIR of its own; `--run-as-self` says so in `agen nests`, `--run-as USER` pins one user,
//! `agen up` separates its instances too; a workspace root its uid cannot use is a start error
//! naming the path and the uid; a Nest killed with -9 and restarted kills what its instances
//! left under their uids before it hands one out again.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agen_tests::{
    cli, free_port, mcp_json, wait_for, workspace_root, write_bundle, FakeModel, HubProcess,
    NestProcess, Proc,
};
use serde_json::{json, Value};

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `(ppid, state)` of a process, or None when it is gone.
fn stat(pid: u32) -> Option<(u32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.rsplit_once(')')?.1;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, state))
}

fn is_dead(pid: u32) -> bool {
    !matches!(stat(pid), Some((_, s)) if s != 'Z' && s != 'X')
}

#[test]
fn a_setsid_child_of_run_is_gone_after_the_timeout_and_a_double_forked_one_when_the_instance_stops()
{
    let tmp = tempfile::tempdir().unwrap();
    let esc1 = tmp.path().join("esc1.pid");
    let esc2 = tmp.path().join("esc2.pid");
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("reaper", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {
                "command": format!("setsid sh -c 'echo $$ > {}; exec sleep 300' & sleep 60", esc1.display()),
                "timeout": 2}}]},
            {"tool_calls": [{"name": "ws_run", "arguments": {
                "command": format!("(setsid sh -c 'echo $$ > {}; exec sleep 301' >/dev/null 2>&1 &)", esc2.display())}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: reaper\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run things.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--name",
            "reaper",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = hub
        .cli(&["submit", "reaper", "go", "--wait", "-o", "json"])
        .unwrap();
    let t: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "submit printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(t["state"], "succeeded", "{t}");

    // After the timeout: the setsid child is dead (at most a zombie nobody waited for yet).
    let p1 = read_pid(&esc1).expect("the first escapee wrote its pid");
    assert!(
        is_dead(p1),
        "setsid child {p1} survived the run timeout: {:?}",
        stat(p1)
    );
    // And it does not linger as a zombie of the instance that adopted it: it is reaped.
    wait_for(
        "the killed child to be reaped",
        Duration::from_secs(15),
        || stat(p1).is_none().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", stat(p1)));

    // The double-forked one was left running by a shell that exited by itself, and the
    // instance (a subreaper) adopted it instead of init.
    // It writes its pid after the call returned (nothing waits for it): wait for the file.
    let p2 = wait_for(
        "the second escapee to write its pid",
        Duration::from_secs(10),
        || read_pid(&esc2),
    )
    .unwrap();
    assert!(
        !is_dead(p2),
        "the background process runs on after the call"
    );
    let instance_pid = hub.instances().unwrap()[0]["pid"].as_u64();
    let (ppid, _) = stat(p2).unwrap();
    let parent_cmd = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&parent_cmd).contains("instance"),
        "the orphan's parent {ppid} is not the instance ({instance_pid:?}): {:?}",
        String::from_utf8_lossy(&parent_cmd)
    );

    // The instance stops: every descendant goes with it.
    let out = hub.cli(&["scale", "reaper", "0"]).unwrap();
    assert!(
        out.status.success(),
        "scale: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        "the double-forked child to die with its instance",
        Duration::from_secs(30),
        || is_dead(p2).then_some(()),
    )
    .unwrap();
    // (The Nest itself names its data dir on its command line.)
    let left = || -> Vec<u32> {
        nest.descendants()
            .into_iter()
            .filter(|p| *p != nest.proc.pid())
            .collect()
    };
    wait_for(
        "the nest to have no process left",
        Duration::from_secs(30),
        || left().is_empty().then_some(()),
    )
    .unwrap_or_else(|e| {
        let left: Vec<String> = left()
            .iter()
            .map(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                format!(
                    "{p} {:?} {}",
                    stat(*p),
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                )
            })
            .collect();
        panic!("{e}: {left:?}\nnest log:\n{}", nest.proc.log_text())
    });
    let survivors: Vec<u32> = [p1, p2].into_iter().filter(|p| !is_dead(*p)).collect();
    assert_eq!(survivors, Vec::<u32>::new());
}

/// The uid range the separated Nest of the attack test hands out (apart from the default and
/// from the other tests' ranges, so no other Nest shares one).
const RANGE: &str = "62100-62109";

/// A temp dir other users can pass through (0711, no listing), as the Nest's data dir needs
/// for separated instances, with `out/` (0777) for what the attacker reports.
fn passable_tempdir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    (tmp, out)
}

/// The `agen instance` processes of the host whose uid is in `range`.
fn instances_with_uid_in(range: std::ops::RangeInclusive<u32>) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| cmdline(*p).ends_with("agen instance "))
        .filter(|p| uid_of(*p).is_some_and(|u| range.contains(&u)))
        .collect()
}

fn uid_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

/// The pid of instance `id`'s process (its working dir is its bundle copy in its run dir).
/// Where a separating Nest keeps its instances' run dirs (outside its data dir).
fn run_root(nest: &NestProcess) -> PathBuf {
    agen_nest::separation::runtime_root(&nest.dir)
}

fn instance_pid(nest: &NestProcess, id: &str) -> Option<u32> {
    let bundle = run_root(nest).join(id).join("bundle");
    nest.descendants().into_iter().find(|p| {
        cmdline(*p).contains("instance")
            && std::fs::read_link(format!("/proc/{p}/cwd")).ok().as_deref() == Some(&bundle)
    })
}

/// The workspace tool server under instance process `pid`.
fn workspace_server_of(nest: &NestProcess, pid: u32) -> Option<u32> {
    nest.descendants().into_iter().find(|p| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse::<u32>()
                    .ok()
            })
            == Some(pid)
            && cmdline(*p).contains("mcp workspace")
    })
}

fn agent_md(name: &str, model: &FakeModel) -> String {
    format!(
        "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run things.\n",
        model.base_url()
    )
}

fn deploy(hub: &HubProcess, bundle: &Path, namespace: &str, name: &str) {
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--namespace",
            namespace,
            "--name",
            name,
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn submit(hub: &HubProcess, namespace: &str, name: &str) -> Value {
    let out = hub
        .cli(&[
            "submit",
            name,
            "go",
            "--namespace",
            namespace,
            "--wait",
            "-o",
            "json",
        ])
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "submit printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The id of the running instance of `deployment`.
fn instance_id(hub: &HubProcess, deployment: &str) -> String {
    let list = hub
        .wait_instances(
            &format!("{deployment} running"),
            Duration::from_secs(60),
            |l| {
                l.iter()
                    .any(|i| i["deployment"] == deployment && i["state"] == "running")
            },
        )
        .unwrap();
    list.iter()
        .find(|i| i["deployment"] == deployment && i["state"] == "running")
        .and_then(|i| i["instance"].as_str())
        .unwrap()
        .to_string()
}

#[test]
fn a_tool_server_of_one_namespace_cannot_read_the_nests_key_the_hubs_data_or_another_namespaces_environment(
) {
    const CANARY: &str = "victim-canary-5be1";
    let (tmp, out) = passable_tempdir();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest_with(
            "separated",
            &[],
            &[("VICTIM_SECRET", CANARY)],
            &["--run-uids", RANGE],
        )
        .unwrap();

    // Namespace b: a victim whose tool server holds a secret in its environment.
    let victim_model = FakeModel::start(
        &tmp.path().join("model-b"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": "echo victim-ok"}}]},
            {"reply": "victim done"}
        ]}),
    )
    .unwrap();
    let victim = tmp.path().join("victim");
    write_bundle(
        &victim,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."],
                           "env": {"VICTIM_TOKEN": "${VICTIM_SECRET}"}}),
                )]),
            ),
            (
                "x-agen/secrets.json",
                json!({"VICTIM_SECRET": {"source": "env", "var": "VICTIM_SECRET"}}).to_string(),
            ),
            ("x-agen/agent.md", agent_md("victim", &victim_model)),
        ],
    )
    .unwrap();
    deploy(&hub, &victim, "b", "victim");
    let victim_id = instance_id(&hub, "victim");
    let victim_pid = wait_for("the victim's process", Duration::from_secs(30), || {
        instance_pid(&nest, &victim_id)
    })
    .unwrap();
    let victim_server = wait_for("the victim's tool server", Duration::from_secs(30), || {
        workspace_server_of(&nest, victim_pid)
    })
    .unwrap();
    let victim_uid = uid_of(victim_pid).unwrap();
    // A tool server runs under a uid of its own, not its instance's (issue 40).
    let victim_server_uid = uid_of(victim_server).unwrap();
    assert!((62100..=62109).contains(&victim_server_uid));
    assert_ne!(victim_server_uid, victim_uid);
    let victim_environ = format!("/proc/{victim_server}/environ");
    assert!(
        std::fs::read_to_string(&victim_environ)
            .unwrap()
            .contains(CANARY),
        "the victim's server holds the secret (root reads it; the attacker must not)"
    );

    // Namespace a: the attacker probes through the workspace `run` tool.
    let hub_dir = tmp.path().join("hub");
    let targets: Vec<String> = [
        nest.dir.join("nest.key"),
        hub_dir.join("admin-token"),
        hub_dir.join("join-token"),
        PathBuf::from(&victim_environ),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let report = out.join("report.txt");
    let script = format!(
        r#"r={report}; e="$TMPDIR/err"
probe() {{ if "$@" >/dev/null 2>"$e"; then echo "READ $2"; elif grep -q 'Permission denied' "$e"; then echo "DENIED $2"; else echo "OTHER $2 $(cat "$e")"; fi; }}
for t in {targets}; do probe cat "$t"; done >> $r
probe ls {hub} >> $r
echo "ME uid=$(id -u) gid=$(id -g) groups=$(id -G) home=$HOME tmp=$TMPDIR home_owner=$(stat -c %u "$HOME") tmp_owner=$(stat -c %u "$TMPDIR")" >> $r"#,
        report = report.display(),
        targets = targets.join(" "),
        hub = hub_dir.display(),
    );
    let attacker_model = FakeModel::start(
        &tmp.path().join("model-a"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": script}}]},
            {"reply": "probed"}
        ]}),
    )
    .unwrap();
    let attacker = tmp.path().join("attacker");
    write_bundle(
        &attacker,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            ("x-agen/agent.md", agent_md("attacker", &attacker_model)),
        ],
    )
    .unwrap();
    deploy(&hub, &attacker, "a", "attacker");
    let attacker_id = instance_id(&hub, "attacker");
    let attacker_pid = instance_pid(&nest, &attacker_id).unwrap();
    let attacker_uid = uid_of(attacker_pid).unwrap();
    let attacker_server = workspace_server_of(&nest, attacker_pid).unwrap();
    let t = submit(&hub, "a", "attacker");
    assert_eq!(t["state"], "succeeded", "{t}");

    // Two namespaces, two uids of the range, neither root; the tool server runs under one of
    // its own, with its instance's gid as its one supplementary group (issue 40).
    let range = 62100..=62109;
    assert!(range.contains(&victim_uid) && range.contains(&attacker_uid));
    assert_ne!(victim_uid, attacker_uid);
    let server_uid = uid_of(attacker_server).unwrap();
    assert!(range.contains(&server_uid));
    assert!(![attacker_uid, victim_uid, victim_server_uid].contains(&server_uid));

    let text = std::fs::read_to_string(&report).unwrap();
    let count = |tag: &str| text.lines().filter(|l| l.starts_with(tag)).count();
    assert_eq!(
        (count("READ "), count("OTHER "), count("DENIED ")),
        (0, 0, targets.len() + 1),
        "{text}"
    );
    let me = text.lines().find(|l| l.starts_with("ME ")).unwrap();
    let run_dir = run_root(&nest).join(&attacker_id);
    assert_eq!(
        me,
        format!(
            "ME uid={u} gid={u} groups={u} {i} home={} tmp={} home_owner={u} tmp_owner={u}",
            run_dir.join("servers/0/home").display(),
            run_dir.join("servers/0/tmp").display(),
            u = server_uid,
            i = attacker_uid
        )
    );
    assert!(!text.contains(CANARY));

    // The victim is untouched and still does its work.
    let t = submit(&hub, "b", "victim");
    assert_eq!(t["state"], "succeeded", "{t}");

    // `agen nests` says who the instances run as.
    let nests = hub.nests().unwrap();
    assert_eq!(
        nests[0]["separation"],
        format!("uid range {RANGE}"),
        "{nests:?}"
    );
}

#[test]
fn run_as_self_is_said_at_start_and_in_agen_nests() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("plain", &[], &[]).unwrap();
    let nests = hub.nests().unwrap();
    assert_eq!(nests[0]["separation"], "off (run-as-self)", "{nests:?}");
    let table = hub.cli(&["nests"]).unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("SEPARATION") && table.contains("off (run-as-self)"),
        "{table}"
    );
    assert!(
        nest.proc
            .log_text()
            .contains("instance separation is off (--run-as-self)"),
        "{}",
        nest.proc.log_text()
    );
}

#[test]
fn a_workspace_root_its_uid_cannot_use_is_a_start_error_naming_the_path_and_the_uid() {
    let (tmp, _out) = passable_tempdir();
    let private = tmp.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest_with("separated", &[], &[], &["--run-uids", "62130-62139"])
        .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "hi"}]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", private]}),
                )]),
            ),
            ("x-agen/agent.md", agent_md("locked", &model)),
        ],
    )
    .unwrap();
    let _ = hub.cli(&["deploy", bundle.to_str().unwrap(), "--name", "locked"]);
    let list = hub
        .wait_instances("the tool server error", Duration::from_secs(60), |l| {
            l.iter()
                .any(|i| i["servers_not_connected"] == json!(["ws"]))
        })
        .unwrap_or_else(|e| panic!("{e}\nnest log:\n{}", nest.proc.log_text()));
    let i = list
        .iter()
        .find(|i| i["servers_not_connected"] == json!(["ws"]))
        .unwrap();
    let reason = i["server_errors"][0]["reason"].as_str().unwrap_or_default();
    // The uid it names is the workspace server's own, one of the range (issue 40: not the
    // instance's).
    let uid: u32 = reason
        .split_once("not usable by uid ")
        .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no uid named: {i}"));
    assert!((62130..=62139).contains(&uid), "{i}");
    assert!(reason.contains(&private.display().to_string()), "{i}");
    let id = i["instance"].as_str().unwrap();
    if let Some(pid) = instance_pid(&nest, id) {
        assert_ne!(uid_of(pid), Some(uid), "{i}");
    }
}

/// A bundle with one workspace server (root `.`, its own copy of the bundle) and `model`.
fn workspace_bundle(dir: &Path, name: &str, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            ("x-agen/agent.md", agent_md(name, model)),
        ],
    )
    .unwrap();
}

/// A system user for the test, removed when dropped.
struct TestUser(String);

impl TestUser {
    fn create(name: &str) -> TestUser {
        let _ = std::process::Command::new("userdel").arg(name).output();
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .expect("useradd");
        assert!(
            out.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestUser(name.to_string())
    }

    fn uid(&self) -> u32 {
        nix::unistd::User::from_name(&self.0)
            .unwrap()
            .expect("the user exists")
            .uid
            .as_raw()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel").arg(&self.0).output();
    }
}

#[test]
fn run_as_user_runs_every_instance_as_that_user_and_says_so() {
    let user = TestUser::create("agen-privsep-t");
    let (tmp, _out) = passable_tempdir();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest_with("pinned", &[], &[], &["--run-as", "agen-privsep-t"])
        .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": "id -u > whoami"}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    workspace_bundle(&bundle, "pinned", &model);
    deploy(&hub, &bundle, "default", "pinned");
    let id = instance_id(&hub, "pinned");
    let t = submit(&hub, "default", "pinned");
    assert_eq!(t["state"], "succeeded", "{t}");
    let pid = instance_pid(&nest, &id).unwrap();
    assert_eq!(uid_of(pid), Some(user.uid()));
    // The run tool wrote into the instance's own bundle copy, as that user.
    let whoami = run_root(&nest).join(&id).join("bundle/whoami");
    assert_eq!(
        std::fs::read_to_string(&whoami).unwrap().trim(),
        user.uid().to_string()
    );
    let nests = hub.nests().unwrap();
    assert_eq!(
        nests[0]["separation"],
        format!("user agen-privsep-t (uid {})", user.uid()),
        "{nests:?}"
    );
}

#[test]
fn agen_up_runs_its_instances_under_uids_of_the_range() {
    // A private (0700) folder around the data dir, as root's home is: the instances' run root
    // and the socket are outside it, so separation works all the same.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = tmp.path().join("data");
    let config = tmp.path().join("config.toml");
    let mut cmd = std::process::Command::new(agen_tests::agen_bin());
    cmd.args([
        "up",
        "--run-uids",
        "62120-62129",
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--deploy",
    ])
    .arg(workspace_root().join("examples/hello"))
    .arg("--data-dir")
    .arg(&data)
    .env("AGEN_CONFIG", &config);
    let up = Proc::spawn("agen up", cmd, &tmp.path().join("up.log")).unwrap();
    let instance = wait_for(
        "agen up's instance under its own uid",
        Duration::from_secs(90),
        || instances_with_uid_in(62120..=62129).into_iter().next(),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));
    let uid = uid_of(instance).unwrap();
    assert!((62120..=62129).contains(&uid), "uid {uid}");
    let tools = wait_for("the tools to load", Duration::from_secs(60), || {
        let out = cli(&config, &["ps", "--all", "-o", "json"]).ok()?;
        let list: Value = serde_json::from_slice(&out.stdout).ok()?;
        let i = list
            .as_array()?
            .iter()
            .find(|i| i["deployment"] == "hello")?
            .clone();
        (i["healthy"] == true).then_some(i)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));
    assert!(tools["tools_loaded"].as_u64().unwrap() >= 5, "{tools}");
    // The Hub's data dir stays closed to the instance's uid.
    let out = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "ls",
        ])
        .arg(data.join("hub"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    let out = cli(&config, &["nests", "-o", "json"]).unwrap();
    let nests: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(nests[0]["separation"], "uid range 62120-62129", "{nests}");
}

#[test]
fn a_nest_killed_with_9_kills_what_its_instances_left_under_their_uids_when_it_restarts() {
    let (tmp, out) = passable_tempdir();
    let esc = out.join("esc.pid");
    let hub = HubProcess::start(tmp.path()).unwrap();
    let args = ["--run-uids", "62110-62111"];
    let mut nest = hub.nest_with("phoenix", &[], &[], &args).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {
                "command": format!("(setsid sh -c 'echo $$ > {}; exec sleep 302' >/dev/null 2>&1 &)", esc.display())}}]},
            {"reply": "left one behind"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    workspace_bundle(&bundle, "phoenix", &model);
    deploy(&hub, &bundle, "default", "phoenix");
    let id = instance_id(&hub, "phoenix");
    // What `run` starts runs as the workspace server's own uid (issue 40), not the instance's.
    let instance = instance_pid(&nest, &id).unwrap();
    let uid = uid_of(workspace_server_of(&nest, instance).unwrap()).unwrap();
    assert_ne!(Some(uid), uid_of(instance));
    let t = submit(&hub, "default", "phoenix");
    assert_eq!(t["state"], "succeeded", "{t}");
    let escapee = wait_for(
        "the escapee to write its pid",
        Duration::from_secs(10),
        || read_pid(&esc),
    )
    .unwrap();
    assert_eq!(uid_of(escapee), Some(uid));

    // kill -9: the instance dies with its Nest, the double-forked escapee does not.
    nest.proc.kill9();
    wait_for(
        "the instance to die with its nest",
        Duration::from_secs(15),
        || instance_pid(&nest, &id).is_none().then_some(()),
    )
    .unwrap();
    assert!(
        !is_dead(escapee),
        "the escapee outlived its instance (the case to clean up)"
    );

    // The restarted Nest kills it before it hands out any uid again.
    let nest = hub.nest_with("phoenix", &[], &[], &args).unwrap();
    wait_for("the leftover to be killed", Duration::from_secs(15), || {
        is_dead(escapee).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\nnest log:\n{}", nest.proc.log_text()));
    assert!(
        nest.proc
            .log_text()
            .contains("killed leftovers of a previous run of this nest under the instance's uid"),
        "{}",
        nest.proc.log_text()
    );
    // Its passable (0711) data dir is no loose mode to "fix" at a restart.
    assert!(
        !nest.proc.log_text().contains(r#"from="711""#),
        "{}",
        nest.proc.log_text()
    );
    let survivors: Vec<u32> = [escapee].into_iter().filter(|p| !is_dead(*p)).collect();
    assert_eq!(survivors, Vec::<u32>::new());
}

#[test]
fn a_nest_that_is_not_root_runs_its_instances_as_itself_and_says_so() {
    let (tmp, _out) = passable_tempdir();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let home = tmp.path().join("nobody");
    std::fs::create_dir(&home).unwrap();
    let join = home.join("join-token");
    std::fs::copy(tmp.path().join("hub/join-token"), &join).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    for p in [&home, &join] {
        std::os::unix::fs::chown(p, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw())).unwrap();
    }
    // nobody runs a copy in the passable folder: the build tree may sit under a folder only
    // its owner can enter (a checkout in a `mktemp -d` folder, 0700).
    let bin = tmp.path().join("agen");
    std::fs::hard_link(agen_tests::agen_bin(), &bin)
        .or_else(|_| std::fs::copy(agen_tests::agen_bin(), &bin).map(drop))
        .unwrap();
    let mut cmd = std::process::Command::new("runuser");
    cmd.args(["-u", "nobody", "--"])
        .arg(&bin)
        .args(["nest", "--hub", &hub.url(), "--name", "unprivileged"])
        .arg("--join-file")
        .arg(&join)
        .arg("--data-dir")
        .arg(home.join("data"))
        .env("RUST_LOG", "info");
    let nest = Proc::spawn("nest as nobody", cmd, &tmp.path().join("nobody.log")).unwrap();
    let n = wait_for("the nest to join", Duration::from_secs(30), || {
        hub.nests()
            .ok()?
            .into_iter()
            .find(|n| n["name"] == "unprivileged" && n["state"] == "ready")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", nest.log_text()));
    assert_eq!(n["separation"], "off (not root)", "{n}");
    assert!(
        nest.log_text()
            .contains("instance separation is off: this nest is not root"),
        "{}",
        nest.log_text()
    );
}

#[test]
fn a_restarted_instance_gets_its_verified_bundle_again_not_what_its_model_changed() {
    let (tmp, _out) = passable_tempdir();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest_with("fresh", &[], &[], &["--run-uids", "62140-62141"])
        .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {
                "command": "echo '{\"mcpServers\": {}}' > mcp.json && echo planted > planted"}}]},
            {"reply": "changed my bundle"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    workspace_bundle(&bundle, "fresh", &model);
    deploy(&hub, &bundle, "default", "fresh");
    let id = instance_id(&hub, "fresh");
    let t = submit(&hub, "default", "fresh");
    assert_eq!(t["state"], "succeeded", "{t}");
    let copy = run_root(&nest).join(&id).join("bundle");
    assert!(copy.join("planted").exists(), "the model changed its copy");

    // The instance dies; its restart starts from the verified bundle.
    let pid = instance_pid(&nest, &id).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = wait_for("the restarted instance", Duration::from_secs(30), || {
        instance_pid(&nest, &id).filter(|p| *p != pid)
    })
    .unwrap();
    hub.wait_instances("its tools back", Duration::from_secs(30), |l| {
        l.iter()
            .any(|i| i["instance"] == id.as_str() && i["healthy"] == true && i["restarts"] == 1)
    })
    .unwrap_or_else(|e| panic!("{e}\nnest log:\n{}", nest.proc.log_text()));
    let planted = usize::from(copy.join("planted").exists());
    let mcp = std::fs::read_to_string(copy.join("mcp.json")).unwrap();
    assert_eq!((planted, mcp.contains("\"ws\"")), (0, true), "{mcp}");
    assert!(restarted > 0);
}

#[test]
fn under_the_units_capabilities_alone_instances_get_their_own_uid_and_no_capability() {
    // As the systemd unit runs it: not root, with the unit's ambient capabilities.
    let (tmp, out) = passable_tempdir();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let home = tmp.path().join("nobody");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o711)).unwrap();
    let join = home.join("join-token");
    std::fs::copy(tmp.path().join("hub/join-token"), &join).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    for p in [&home, &join] {
        std::os::unix::fs::chown(p, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw())).unwrap();
    }
    let caps = "+setuid,+setgid,+chown,+kill,+dac_override,+fowner";
    let mut cmd = std::process::Command::new("setpriv");
    cmd.arg(format!("--reuid={}", nobody.uid))
        .arg(format!("--regid={}", nobody.gid))
        .args([
            "--clear-groups",
            "--inh-caps",
            caps,
            "--ambient-caps",
            caps,
            "--",
        ])
        .arg(agen_tests::agen_bin())
        .args(["nest", "--hub", &hub.url(), "--name", "unit-like"])
        .args(["--run-uids", "62150-62151"])
        // The unit's RuntimeDirectory; here a folder only the Nest's user can write.
        .arg("--run-root")
        .arg(home.join("run"))
        .arg("--join-file")
        .arg(&join)
        .arg("--data-dir")
        .arg(home.join("data"))
        .env("RUST_LOG", "info");
    let nest_proc =
        Proc::spawn("nest with capabilities", cmd, &tmp.path().join("caps.log")).unwrap();
    let n = wait_for("the nest to join", Duration::from_secs(30), || {
        hub.nests()
            .ok()?
            .into_iter()
            .find(|n| n["name"] == "unit-like" && n["state"] == "ready")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", nest_proc.log_text()));
    assert_eq!(n["separation"], "uid range 62150-62151", "{n}");

    let report = out.join("caps.txt");
    let key = home.join("data/nest.key");
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!(
                "{{ id -u; grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status; cat {} >/dev/null 2>&1 && echo READ-KEY || echo NO-KEY; }} > {}",
                key.display(), report.display())}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    workspace_bundle(&bundle, "caps", &model);
    deploy(&hub, &bundle, "default", "caps");
    let t = submit(&hub, "default", "caps");
    assert_eq!(t["state"], "succeeded", "{t}\n{}", nest_proc.log_text());
    let text = std::fs::read_to_string(&report).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let uid: u32 = lines[0].parse().unwrap();
    assert!((62150..=62151).contains(&uid), "{text}");
    let held: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("Cap") && !l.ends_with("0000000000000000"))
        .copied()
        .collect();
    assert_eq!(held, Vec::<&str>::new(), "{text}");
    assert_eq!(lines.last(), Some(&"NO-KEY"), "{text}");
}
