//! Artifacts and progress on the fleet: a scripted model (over the real OpenAI client) saves an
//! artifact, saves the same bytes again, reads it back in pages and reports progress; people
//! then see it all through the CLI (`agen artifacts ls|get`, `agen query`), the bytes having
//! gone instance → Nest (socket) → Hub (`PutArtifact`) and back (`ReadArtifact`).

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use agen_tests::{write_bundle, FakeModel, HubProcess, NestProcess};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

struct Fleet {
    _tmp: tempfile::TempDir,
    hub: HubProcess,
    _nest: NestProcess,
    _model: FakeModel,
}

/// A Hub, one Nest and deployment `writer` whose model follows `script`.
fn fleet(script: Value) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let mut script = script;
    script["record"] = json!(tmp.path().join("model-requests.jsonl"));
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[(
            "x-agen/agent.md",
            format!(
                "---\nname: writer\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou write reports.\n",
                model.base_url()
            ),
        )],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "writer",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fleet {
        hub,
        _nest: nest,
        _model: model,
        _tmp: tmp,
    }
}

impl Fleet {
    fn run_task(&self, input: &str) -> (String, Value) {
        let out = self.hub.cli(&["submit", "writer", input]).unwrap();
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let out = self
            .hub
            .cli(&["wait", &task, "-o", "json", "--timeout", "60s"])
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (task, v)
    }

    /// The tool results the model was sent in its last request, in order.
    fn last_tool_results(&self) -> Vec<String> {
        let path = self.hub.dir.join("model-requests.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let last: Value = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .next_back()
            .expect("the model was asked");
        last["body"]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// 6,000 characters of Markdown.
fn report() -> String {
    let mut s = String::from("# Weekly report\n");
    while s.chars().count() < 6000 {
        s.push_str("- one more finding, carefully written down\n");
    }
    s.chars().take(6000).collect()
}

#[test]
fn an_agent_saves_reads_and_reports_progress_and_people_get_the_exact_bytes() {
    let report = report();
    let id = agen_shared::bundle::digest(report.as_bytes());
    let f = fleet(json!({"steps": [
        {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "weekly-report", "content": report, "mediaType": "text/markdown"}}]},
        {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "weekly-report", "content": report, "mediaType": "text/markdown"}}]},
        {"tool_calls": [{"name": "report_progress", "arguments": {"step": "reading the report back", "done": 1, "total": 2}}]},
        {"tool_calls": [{"name": "read_artifact", "arguments": {"id": id}}]},
        {"tool_calls": [{"name": "read_artifact", "arguments": {"id": id, "offset": 4000}}]},
        {"tool_calls": [{"name": "report_progress", "arguments": {"step": "report checked", "done": 2, "total": 2, "note": "all pages read", "artifacts": [id]}}]},
        {"reply": "the report is saved"}
    ]}));
    let (task, t) = f.run_task("write the weekly report");
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["outcome"]["result"], "the report is saved");

    // What the model saw: the same id twice, progress recorded (not the end of the run), then
    // two pages, the first saying where the next starts.
    let chars: Vec<char> = report.chars().collect();
    let page = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    assert_eq!(
        f.last_tool_results(),
        vec![
            id.clone(),
            id.clone(),
            "progress recorded".to_owned(),
            format!("{}\n[characters 0..4000 of 6000; more follows: call read_artifact with offset 4000]", page(0, 4000)),
            format!("{}\n[characters 4000..6000 of 6000; end of artifact]", page(4000, 6000)),
            "progress recorded".to_owned(),
        ]
    );

    // `agen artifacts ls TASK`: one artifact, whatever the number of saves.
    let listed = f
        .hub
        .cli_json(&["artifacts", "ls", &task, "-o", "json"])
        .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let a = &listed[0];
    assert_eq!(
        (
            a["id"].clone(),
            a["name"].clone(),
            a["media_type"].clone(),
            a["size"].clone(),
            a["task"].clone()
        ),
        (
            json!(id),
            json!("weekly-report"),
            json!("text/markdown"),
            json!(report.len()),
            json!(task)
        )
    );
    let all = f.hub.cli_json(&["artifacts", "ls", "-o", "json"]).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");

    // `agen artifacts get ID --out F`: the exact bytes.
    let out_file = f.hub.dir.join("report.md");
    let out = f
        .hub
        .cli(&["artifacts", "get", &id, "--out", out_file.to_str().unwrap()])
        .unwrap();
    assert!(
        out.status.success(),
        "get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&out_file).unwrap(), report.as_bytes());

    // An unknown id is an error that names it.
    let missing = agen_shared::bundle::digest(b"never saved");
    let out = f.hub.cli(&["artifacts", "get", &missing]).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&missing) && err.contains("not found"), "{err}");

    // `agen query`: only the latest progress report is kept on the task.
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    let p = &q["progress"];
    assert_eq!(
        (
            p["step"].clone(),
            p["done"].clone(),
            p["total"].clone(),
            p["note"].clone(),
            p["artifacts"].clone()
        ),
        (
            json!("report checked"),
            json!(2),
            json!(2),
            json!("all pages read"),
            json!([id])
        )
    );
}

/// 1.5 MB: more than one 1 MiB chunk each way (PutArtifact, ReadArtifact, GetArtifact), and
/// kept by id only in the run log and the conversation.
#[test]
fn big_artifacts_move_in_chunks_and_the_same_bytes_from_another_task_keep_their_id() {
    let body: String = "the same findings, word for word\n".repeat(48_000);
    assert!(body.len() > 1_500_000);
    let id = agen_shared::bundle::digest(body.as_bytes());
    let tail_at = body.chars().count() - 10;
    let f = fleet(json!({"steps": [
        {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "findings", "content": body}}]},
        {"tool_calls": [{"name": "read_artifact", "arguments": {"id": id, "offset": tail_at}}]},
        {"reply_template": "{{last_tool_result}}"}
    ]}));
    let (first, t1) = f.run_task("save the findings");
    let (second, t2) = f.run_task("save the findings again");
    let total = body.chars().count();
    let tail: String = body.chars().skip(tail_at).collect();
    assert_eq!(
        t1["outcome"]["result"],
        json!(format!(
            "{tail}\n[characters {tail_at}..{total} of {total}; end of artifact]"
        )),
        "{t1}"
    );
    assert_eq!(t2["outcome"]["result"], t1["outcome"]["result"]);
    assert_eq!(
        f.last_tool_results()[0],
        id,
        "the second save answered the same id"
    );

    // Listed under each task that saved it, stored once in the namespace.
    for task in [&first, &second] {
        let listed = f
            .hub
            .cli_json(&["artifacts", "ls", task, "-o", "json"])
            .unwrap();
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec![id.as_str()], "task {task}");
    }
    let all = f.hub.cli_json(&["artifacts", "ls", "-o", "json"]).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    assert_eq!(all[0]["size"], json!(body.len()));

    // People get the exact bytes, on stdout too.
    let out = f.hub.cli(&["artifacts", "get", &id]).unwrap();
    assert!(
        out.status.success(),
        "get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == body.as_bytes(), "the bytes differ");
}

#[test]
fn agen_run_keeps_artifacts_beside_its_run_log_says_where_and_offers_no_report_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let body = "a standalone report";
    let id = agen_shared::bundle::digest(body.as_bytes());
    let mut script = json!({"steps": [
        {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "notes", "content": body}}]},
        {"tool_calls": [{"name": "report_progress", "arguments": {"step": "nobody is watching"}}]},
        {"reply_template": "{{last_tool_result}}"}
    ]});
    script["record"] = json!(tmp.path().join("model-requests.jsonl"));
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[(
            "x-agen/agent.md",
            format!(
                "---\nname: solo\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou write notes.\n",
                model.base_url()
            ),
        )],
    )
    .unwrap();
    let state = tmp.path().join("state");
    let out = std::process::Command::new(agen_tests::agen_bin())
        .arg("run")
        .arg(&dir)
        .arg("take notes")
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agen run: {stderr}");

    // The artifact is a file named by its digest beside the run logs, and stderr says where.
    let where_ = state.join("agen/artifacts/standalone");
    let hex = id.trim_start_matches("sha256:");
    assert_eq!(std::fs::read(where_.join(hex)).unwrap(), body.as_bytes());
    assert!(stderr.contains(&where_.display().to_string()), "{stderr}");

    // report_progress is fleet only: the model is told it does not exist, and the run goes on.
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.contains("unknown tool `report_progress`"),
        "{answer}"
    );
    let first: Value = std::fs::read_to_string(tmp.path().join("model-requests.jsonl"))
        .unwrap()
        .lines()
        .next()
        .map(|l| serde_json::from_str(l).unwrap())
        .unwrap();
    let offered: Vec<&str> = first["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, vec!["finish", "save_artifact", "read_artifact"]);
}
