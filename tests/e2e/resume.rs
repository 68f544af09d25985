//! Durability end to end (`docs/durability.md`): a run whose Nest
//! or instance process is killed mid-run resumes with the same run id and the next attempt,
//! rebuilt from the Hub's run log. Answered model turns are not asked again, a completed call
//! is not repeated, an interrupted side-effecting call is reported to the model as
//! `effect_unknown` instead of being sent again, and interrupted read-only or idempotent calls
//! are simply retried.
//!
//! The tools are `tests/peers/servers/ledger_server.py` (`charge`: side-effecting, `put`:
//! idempotent, `lookup`: read-only), which logs every call it receives, so the tests count
//! real calls across the crash. The fake model records every request it answers.

use std::path::PathBuf;
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers};
use serde_json::{json, Value};

struct Ledger {
    tmp: tempfile::TempDir,
    hub: HubProcess,
    nests: Vec<NestProcess>,
    _model: FakeModel,
    /// The ledger server's call log.
    log: PathBuf,
}

/// A Hub, `nests` Nests, the fake model following `steps`, and deployment `ledger` with one
/// replica per Nest, all healthy.
fn ledger(nests: &[&str], steps: Value) -> Ledger {
    ledger_with(nests, steps, &[])
}

/// [`ledger`] with more bundle files (`x-agen/config.json`, `x-agen/harness.json`).
fn ledger_with(nests: &[&str], steps: Value, extra: &[(&str, String)]) -> Ledger {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest_procs: Vec<NestProcess> = nests
        .iter()
        .map(|n| hub.nest(n, &[], &[]).unwrap())
        .collect();
    let script = json!({"steps": steps, "record": tmp.path().join("model-requests.jsonl")});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("ledger.jsonl");
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ledger",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/ledger_server.py")], "env": {"LEDGER_LOG": log}}),
                )]),
            ),
            ("x-agen/agent.md", format!("---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n", model.base_url())),
        ],
    )
    .unwrap();
    write_bundle(&dir, extra).unwrap();
    let replicas = nests.len().to_string();
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "ledger",
            "--replicas",
            &replicas,
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("every replica healthy", Duration::from_secs(90), |l| {
        l.iter()
            .filter(|i| {
                i["deployment"] == "ledger" && i["state"] == "running" && i["healthy"] == true
            })
            .count()
            == nests.len()
    })
    .unwrap();
    Ledger {
        tmp,
        hub,
        nests: nest_procs,
        _model: model,
        log,
    }
}

impl Ledger {
    fn submit(&self, input: &str) -> String {
        let out = self.hub.cli(&["submit", "ledger", input]).unwrap();
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn query(&self, task: &str) -> Value {
        self.hub.cli_json(&["query", task, "-o", "json"]).unwrap()
    }

    fn wait(&self, task: &str) -> Value {
        let out = self
            .hub
            .cli(&["wait", task, "-o", "json", "--timeout", "90s"])
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}\nhub log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.hub.proc.log_text()
            )
        })
    }

    /// The calls the ledger server received, as `(tool, args)`.
    fn calls(&self) -> Vec<(String, Value)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| {
                (
                    v["tool"].as_str().unwrap_or_default().to_owned(),
                    v["args"].clone(),
                )
            })
            .collect()
    }

    fn count(&self, tool: &str) -> usize {
        self.calls().iter().filter(|(t, _)| t == tool).count()
    }

    /// Waits until the ledger server received `n` calls of `tool`.
    fn wait_calls(&self, tool: &str, n: usize) {
        wait_for(
            &format!("{n} call(s) of {tool}"),
            Duration::from_secs(60),
            || (self.count(tool) >= n).then_some(()),
        )
        .unwrap_or_else(|e| panic!("{e}; calls: {:?}", self.calls()));
    }

    /// The chat requests the fake model answered.
    fn model_requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.tmp.path().join("model-requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many requests the model got per turn (turn n = n - 1 assistant messages sent).
    fn requests_per_turn(&self) -> Vec<usize> {
        let mut per_turn: Vec<usize> = Vec::new();
        for r in self.model_requests() {
            let assistants = r["body"]["messages"]
                .as_array()
                .map(|m| m.iter().filter(|m| m["role"] == "assistant").count())
                .unwrap_or(0);
            if per_turn.len() <= assistants {
                per_turn.resize(assistants + 1, 0);
            }
            per_turn[assistants] += 1;
        }
        per_turn
    }

    /// The tool results of the last model request, as `(content, …)`.
    fn last_tool_results(&self) -> Vec<String> {
        let reqs = self.model_requests();
        let last = reqs.last().expect("the model was asked");
        last["body"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                m["content"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| m["content"].to_string())
            })
            .collect()
    }

    /// Kills the Nest that runs `task` (SIGKILL, the Nest process only) and returns its name.
    fn kill_nest_of(&mut self, task: &str) -> String {
        let nest = self.query(task)["nest"].as_str().unwrap().to_owned();
        let n = self
            .nests
            .iter_mut()
            .find(|n| n.name == nest)
            .expect("the task runs on one of our nests");
        n.proc.kill9();
        nest
    }
}

/// The `agen instance` processes of a Nest.
fn instance_pids(nest: &NestProcess) -> Vec<u32> {
    nest.descendants()
        .into_iter()
        .filter(|pid| {
            // `agen instance` (no arguments: its identity comes on an inherited fd).
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').nth(1) == Some("instance")
        })
        .collect()
}

fn assert_succeeded_on_attempt_2(t: &Value) {
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["attempt"], 2, "resumed once: {t}");
}

#[test]
fn an_interrupted_side_effecting_call_is_not_repeated_and_the_model_is_told_effect_unknown() {
    let steps = json!([
        {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 42, "seconds": 60}}]},
        {"reply_template": "after the charge: {{last_tool_result}}"}
    ]);
    let mut l = ledger(&["nest-a", "nest-b"], steps);
    let task = l.submit("charge the customer 42");
    l.wait_calls("charge", 1);
    let run_id = l.query(&task)["run_id"].clone();
    let killed = l.kill_nest_of(&task);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    assert_eq!(t["run_id"], run_id, "the same run resumed");
    assert_ne!(t["nest"], killed.as_str(), "it resumed on the other nest");
    assert_eq!(
        l.count("charge"),
        1,
        "the charge was sent once: {:?}",
        l.calls()
    );
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(
        result.starts_with(
            "after the charge: effect_unknown: the call to ledger_charge was interrupted"
        ),
        "{result}"
    );
    let told = l.last_tool_results();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].starts_with("effect_unknown:"),
        "the model is told effect_unknown: {told:?}"
    );
    assert_eq!(
        l.requests_per_turn(),
        vec![1, 1],
        "the answered first turn is not asked again"
    );
}

#[test]
fn interrupted_read_only_and_idempotent_calls_are_retried() {
    let steps = json!([
        {"tool_calls": [
            {"name": "ledger_lookup", "arguments": {"key": "balance", "seconds": 60}},
            {"name": "ledger_put", "arguments": {"key": "note", "value": "paid", "seconds": 60}}
        ]},
        {"reply": "done"}
    ]);
    let mut l = ledger(&["nest-a", "nest-b"], steps);
    let task = l.submit("look it up and note it");
    l.wait_calls("lookup", 1);
    l.wait_calls("put", 1);
    l.kill_nest_of(&task);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    assert_eq!(t["outcome"]["result"], "done");
    assert_eq!(
        (l.count("lookup"), l.count("put")),
        (2, 2),
        "both were sent again: {:?}",
        l.calls()
    );
    assert_eq!(
        l.last_tool_results(),
        vec!["value of balance".to_owned(), "stored note".to_owned()]
    );
    assert_eq!(l.requests_per_turn(), vec![1, 1]);
}

#[test]
fn a_completed_side_effecting_call_is_not_repeated_after_a_resume() {
    let steps = json!([
        {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 7}}]},
        {"tool_calls": [{"name": "ledger_lookup", "arguments": {"key": "receipt", "seconds": 60}}]},
        {"reply_template": "receipt: {{last_tool_result}}"}
    ]);
    let mut l = ledger(&["nest-a", "nest-b"], steps);
    let task = l.submit("charge 7 and get the receipt");
    l.wait_calls("lookup", 1);
    l.kill_nest_of(&task);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    assert_eq!(t["outcome"]["result"], "receipt: value of receipt");
    assert_eq!(
        l.count("charge"),
        1,
        "the completed charge is reused, not sent again: {:?}",
        l.calls()
    );
    assert_eq!(
        l.count("lookup"),
        2,
        "the interrupted read-only lookup is retried"
    );
    assert_eq!(
        l.last_tool_results(),
        vec!["charged 7".to_owned(), "value of receipt".to_owned()]
    );
    assert_eq!(
        l.requests_per_turn(),
        vec![1, 1, 1],
        "each turn asked once across both attempts"
    );
}

#[test]
fn a_resumed_run_counts_the_tokens_of_its_replayed_turns_against_max_tokens() {
    // 400 + 600 tokens in the first attempt; a third turn would re-send at least 600 more.
    let steps = json!([
        {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 7}}], "usage": {"input_tokens": 300, "output_tokens": 100}},
        {"tool_calls": [{"name": "ledger_lookup", "arguments": {"key": "receipt", "seconds": 60}}], "usage": {"input_tokens": 500, "output_tokens": 100}},
        {"reply": "all done", "usage": {"input_tokens": 10, "output_tokens": 10}}
    ]);
    let mut l = ledger(&["nest-a", "nest-b"], steps);
    let out = l
        .hub
        .cli(&[
            "submit",
            "ledger",
            "charge and look",
            "--max-tokens",
            "1500",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    l.wait_calls("lookup", 1);
    l.kill_nest_of(&task);

    let t = l.wait(&task);
    assert_eq!(t["attempt"], 2, "resumed once: {t}");
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["max_tokens"], 1500, "the budget is kept on resume: {t}");
    let result = t["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("token budget exceeded: 1000 of max 1500 tokens used"),
        "the replayed turns count: {result}"
    );
    assert_eq!(
        l.requests_per_turn(),
        vec![1, 1],
        "no third turn, and the replayed ones are not asked again"
    );
    assert_eq!(l.count("charge"), 1);
}

/// The crash window the ledger's one-wait rule relies on (issue 16): a side effect's "completed"
/// is streamed, not waited for, so the instance may die after the call ran and before its
/// result is durable. The tool server SIGKILLs its instance 0–8 ms after answering, four times;
/// every task must end succeeded with the charge executed exactly once (its result either kept
/// or reported as effect_unknown), none lost, none stuck, and at least one kill must land inside
/// its run (a run may finish within the longer delays; that trial still counts its executions).
#[test]
fn an_instance_killed_between_a_side_effect_and_its_completion_never_repeats_it() {
    let steps = json!([
        {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 5, "kill_instance": true}}]},
        {"reply_template": "after the charge: {{last_tool_result}}"}
    ]);
    let l = ledger(&["nest-a"], steps);
    let trials = 4;
    let (mut once, mut twice, mut kept, mut unknown, mut stuck, mut crashed) = (0, 0, 0, 0, 0, 0);
    for i in 0..trials {
        let before = l.count("charge");
        let task = l.submit(&format!("charge 5, trial {i}"));
        let t = l.wait(&task);
        if t["state"] != "succeeded" {
            stuck += 1;
            eprintln!("trial {i}: {t}");
            continue;
        }
        match l.count("charge") - before {
            1 => once += 1,
            _ => twice += 1,
        }
        let result = t["outcome"]["result"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if result == "after the charge: charged 5" {
            kept += 1;
        } else if result.contains("effect_unknown") {
            unknown += 1;
        } else {
            panic!("trial {i}: unexpected result {result:?}");
        }
        // The kill lands 0–8 ms after the answer; a run that finished sooner was not crashed.
        if t["attempt"].as_u64().unwrap_or(0) >= 2 {
            crashed += 1;
        }
    }
    eprintln!(
        "crash window: {trials} trials, crashed inside the run {crashed}, executed once {once}, twice+ {twice}, stuck {stuck}; result kept {kept}, effect_unknown {unknown}"
    );
    assert_eq!((once, twice, stuck), (trials, 0, 0));
    assert!(crashed >= 1, "no trial crashed the instance inside its run");
}

/// Kills the `agen instance` process (SIGKILL, that process only) of the only Nest.
fn kill_instance(l: &Ledger) {
    let pids = instance_pids(&l.nests[0]);
    assert_eq!(pids.len(), 1, "one agen instance process: {pids:?}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[test]
fn config_overrides_decide_what_an_interrupted_call_does() {
    // `charge` declared idempotent is sent again; `lookup` declared side-effecting is not.
    let steps = json!([
        {"tool_calls": [
            {"name": "ledger_charge", "arguments": {"amount": 9, "seconds": 60}},
            {"name": "ledger_lookup", "arguments": {"key": "balance", "seconds": 60}}
        ]},
        {"reply": "done"}
    ]);
    let config = json!({"tools": {"ledger.charge": {"idempotent": true}, "ledger_lookup": {"sideEffect": true}}});
    let l = ledger_with(
        &["solo"],
        steps,
        &[("x-agen/config.json", config.to_string())],
    );
    let task = l.submit("charge 9 and look up the balance");
    l.wait_calls("charge", 1);
    l.wait_calls("lookup", 1);
    kill_instance(&l);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    assert_eq!(
        (l.count("charge"), l.count("lookup")),
        (2, 1),
        "{:?}",
        l.calls()
    );
    let told = l.last_tool_results();
    assert_eq!(told[0], "charged 9");
    assert!(
        told[1].starts_with("effect_unknown: the call to ledger_lookup"),
        "{told:?}"
    );
}

#[test]
fn a_keen_dialect_run_resumes_without_repeating_a_side_effect() {
    let call = "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nledger_charge\n!*context\n{\"amount\": 5, \"seconds\": 60}\n</SYSTEM CALL>\n";
    let steps = json!([
        {"reply": call},
        {"reply_template": "Keen says: {{last_user}}"}
    ]);
    let l = ledger_with(
        &["solo"],
        steps,
        &[(
            "x-agen/harness.json",
            json!({"toolProtocol": "keen"}).to_string(),
        )],
    );
    let task = l.submit("charge 5");
    l.wait_calls("charge", 1);
    kill_instance(&l);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(
        result.starts_with("Keen says: <SYSTEM SCRIPT ERROR>\neffect_unknown: the call to ledger_charge was interrupted"),
        "{result}"
    );
    assert_eq!(l.count("charge"), 1, "{:?}", l.calls());
    assert_eq!(
        l.requests_per_turn(),
        vec![1, 1],
        "the answered turn is not asked again"
    );
}

#[test]
fn a_killed_instance_process_resumes_its_run_on_the_restarted_instance() {
    let steps = json!([
        {"tool_calls": [{"name": "ledger_lookup", "arguments": {"key": "balance", "seconds": 60}}]},
        {"reply_template": "{{last_tool_result}}"}
    ]);
    let l = ledger(&["solo"], steps);
    let task = l.submit("what is the balance?");
    l.wait_calls("lookup", 1);
    kill_instance(&l);

    let t = l.wait(&task);
    assert_succeeded_on_attempt_2(&t);
    assert_eq!(t["outcome"]["result"], "value of balance");
    assert_eq!(l.count("lookup"), 2);
    assert_eq!(l.requests_per_turn(), vec![1, 1]);
}
