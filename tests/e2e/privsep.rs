//! Least privilege on the Nest host (issue 12 item 3): no child left behind. A command the
//! model runs through the workspace `run` tool escapes its process group with `setsid` and
//! with a double fork; the first is gone once the call times out, the second once its instance
//! stops, and neither outlives the Nest's view of the instance.

use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess};
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
    let p2 = read_pid(&esc2).expect("the second escapee wrote its pid");
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
