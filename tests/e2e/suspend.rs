//! A run that waits gives its instance slot back (issues 15 and 17): while a person decides an
//! `ask` call, or a `call_agent` child runs, the run is suspended on its run log (`run.suspended`)
//! and holds no instance; once the call is decided it resumes from that log as a new attempt
//! that does not count toward `limits.maxAttempts`. So a wait holds no capacity and survives a
//! Hub kill, a Nest loss and a redeploy. Every test ends with how often the call ran (it must
//! be exactly once per approved call, never twice, and the task never stuck).

use std::collections::HashSet;
use std::time::Duration;

use agen_tests::{wait_for, FakeModel, HubProcess};
use serde_json::{json, Value};

use crate::approvals::{
    decide, deploy_asker, deploy_asker_with, executions, model, pending_of, submit, wait_task,
};

/// The task once its run gave its slot back (suspended, waiting without an instance).
fn suspended(hub: &HubProcess, task: &str) -> Value {
    wait_for(
        "the run to give its slot back",
        Duration::from_secs(60),
        || {
            let q = hub.cli_json(&["query", task, "-o", "json"]).ok()?;
            let gave_back = q["state"] == "waiting"
                && q["activity"]
                    .as_str()
                    .is_some_and(|a| a.contains("gave its slot back"));
            gave_back.then_some(q)
        },
    )
    .unwrap()
}

/// The approved call ran exactly once: counted as executed 0 / 1 / 2+ times.
fn assert_ran_once(marker: &std::path::Path) {
    let ran = executions(marker);
    assert_eq!(
        (ran == 0, ran == 1, ran >= 2),
        (false, true, false),
        "executed {ran} times"
    );
}

fn approve(hub: &HubProcess, args: &[&str]) {
    let mut all = vec!["approve"];
    all.extend_from_slice(args);
    let out = decide(hub, &all);
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_waiting_run_holds_no_slot_so_a_second_task_on_a_one_slot_deployment_runs_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    // One replica, concurrency 1: one slot in all.
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);

    let first = submit(&hub, "asker");
    suspended(&hub, &first);
    let second = submit(&hub, "asker");
    pending_of(&hub, &second);
    approve(&hub, &[&second]);
    let done = wait_task(&hub, &second);
    assert_eq!(done["state"], "succeeded", "{done}");
    let q = hub.cli_json(&["query", &first, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "waiting", "the first still waits: {q}");
    assert_eq!(executions(&marker), 1, "only the approved call ran");

    approve(&hub, &[&first]);
    let done = wait_task(&hub, &first);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["attempt"].as_u64().unwrap() >= 2, "resumed: {done}");
    assert_eq!(
        executions(&marker),
        2,
        "each approved call ran exactly once"
    );
}

#[test]
fn a_hub_killed_while_a_run_waits_resumes_it_after_the_restart_and_the_call_runs_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);

    let task = submit(&hub, "asker");
    suspended(&hub, &task);
    hub.restart().unwrap();
    let q = suspended(&hub, &task);
    assert_eq!(q["approvals"].as_array().map(Vec::len), Some(1), "{q}");
    approve(&hub, &[&task]);
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_ran_once(&marker);
}

#[test]
fn a_nest_lost_while_a_run_waits_resumes_it_on_another_nest() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut a = hub.nest("a", &[], &[]).unwrap();
    let mut b = hub.nest("b", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let running_on = || -> Option<String> {
        let list = hub.cli_json(&["ps", "--all", "-o", "json"]).ok()?;
        list.as_array()?
            .iter()
            .find(|i| i["deployment"] == "asker" && i["state"] == "running" && i["healthy"] == true)
            .and_then(|i| i["nest"].as_str().map(str::to_string))
    };
    let first_nest = wait_for("the instance", Duration::from_secs(30), running_on).unwrap();

    let task = submit(&hub, "asker");
    suspended(&hub, &task);
    let other = if first_nest == "a" {
        a.proc.kill9();
        "b"
    } else {
        b.proc.kill9();
        "a"
    };
    wait_for(
        "the instance on the other nest",
        Duration::from_secs(90),
        || (running_on()? == other).then_some(()),
    )
    .unwrap();
    approve(&hub, &[&task]);
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["nest"], other,
        "resumed on the nest that is left: {done}"
    );
    assert_ran_once(&marker);
}

#[test]
fn approve_after_a_redeploy_resumes_on_the_version_the_run_started_on() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    let dir = tmp.path().join("asker");
    deploy_asker(&hub, &dir, "asker", &model);

    let task = submit(&hub, "asker");
    let started_on = suspended(&hub, &task)["bundle_digest"]
        .as_str()
        .unwrap()
        .to_string();
    deploy_asker_with(
        &hub,
        &dir,
        "asker",
        &model,
        json!({"limits": {"maxTurns": 7}}),
    );
    let ps = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    let deployed = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "asker")
        .map(|d| d["bundle_digest"].as_str().unwrap_or_default().to_string())
        .unwrap();
    assert_ne!(deployed, started_on, "the redeploy made a new version");

    approve(&hub, &[&task]);
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["bundle_digest"], started_on.as_str(), "{done}");
    assert_eq!(executions(&marker), 1, "the call ran exactly once");
}

#[test]
fn five_asks_in_one_run_do_not_exhaust_max_attempts() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let run = json!({"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}});
    let mut steps: Vec<Value> = (0..5).map(|_| json!({"tool_calls": [run]})).collect();
    steps.push(json!({"reply": "all five ran"}));
    let model = FakeModel::start(&tmp.path().join("model"), &json!({"steps": steps})).unwrap();
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);

    let task = submit(&hub, "asker");
    let mut decided = HashSet::new();
    for n in 1..=5 {
        let call = wait_for(&format!("ask {n}"), Duration::from_secs(60), || {
            let list = hub.cli_json(&["approvals", "-o", "json"]).ok()?;
            list.as_array()?
                .iter()
                .filter(|a| a["task"] == task.as_str())
                .filter_map(|a| a["call_id"].as_str().map(str::to_string))
                .find(|c| !decided.contains(c))
        })
        .unwrap();
        suspended(&hub, &task);
        approve(&hub, &[&task, &call]);
        decided.insert(call);
    }
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["outcome"]["result"], "all five ran", "{done}");
    assert!(
        done["attempt"].as_u64().unwrap() > 5,
        "more resumes than maxAttempts (5), none counted: {done}"
    );
    assert_eq!(
        executions(&marker),
        5,
        "each approved call ran exactly once"
    );
}

#[test]
fn watch_task_snapshots_carry_the_pending_approvals_while_the_task_waits() {
    use agen_proto::v1 as pb;
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let task = submit(&hub, "asker");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pending, last) = rt.block_on(async {
        let mut api = pb::agen_service_client::AgenServiceClient::new(hub.channel().await.unwrap());
        let req = hub
            .bearer(pb::WatchTaskRequest {
                namespace: "default".into(),
                task_id: task.clone(),
                from_seq: 0,
                deltas: false,
            })
            .unwrap();
        let mut events = api.watch_task(req).await.unwrap().into_inner();
        let mut pending: Option<pb::Approval> = None;
        let mut last = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while let Ok(Some(Ok(e))) = tokio::time::timeout_at(deadline, events.message())
            .await
            .map(|m| m.transpose())
        {
            let t = e.task.unwrap_or_default();
            if pending.is_none() {
                if let Some(a) = t.pending_approvals.first() {
                    pending = Some(a.clone());
                    approve(&hub, &[&task]);
                }
            }
            let end = t.state == pb::TaskState::Succeeded as i32;
            last = Some(t);
            if end {
                break;
            }
        }
        (pending, last)
    });
    let pending = pending.expect("a snapshot showed the pending approval");
    assert_eq!(
        (pending.tool.as_str(), pending.task_id.as_str()),
        ("ws.run", task.as_str())
    );
    assert!(pending.arguments_json.contains("echo ran"), "{pending:?}");
    let last = last.expect("snapshots");
    assert_eq!(last.state, pb::TaskState::Succeeded as i32, "{last:?}");
    assert!(
        last.pending_approvals.is_empty(),
        "nothing pending at the end"
    );
    assert_eq!(executions(&marker), 1);
}
