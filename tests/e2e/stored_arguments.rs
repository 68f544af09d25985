//! What the Hub keeps of tool-call arguments (issue 43: "let a bundle choose
//! `x-agen/harness.json` `"storeToolArguments": "redacted"` where the model can do without the
//! raw history (secrets and the declared sensitive fields replaced before storage)"), counted
//! in the bytes of every file under the Hub's and the Nest's data dirs.

use std::path::{Path, PathBuf};

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

/// Files under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        } else if std::fs::read(&p)
            .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            out.push(p);
        }
    }
    out
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// "let a bundle choose `x-agen/harness.json` `"storeToolArguments": "redacted"` … (secrets and
/// the declared sensitive fields replaced before storage)".
///
/// Two deployments run the same call, `ws_run` whose `command` holds a marker (and really
/// runs: each writes its line). Under the default the marker is in the Hub's files (the test
/// can see it); under `storeToolArguments: "redacted"` with `sensitiveFields: ["command"]` it
/// is in 0 files of the Hub's and the Nest's data dirs, the run's `model.answered` keeps
/// `[redacted]`, and the conversation's next task shows the model the redacted call, not the
/// marker.
#[test]
fn redacted_tool_arguments_are_replaced_before_storage() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let requests = tmp.path().join("requests.jsonl");
    let call = |marker: &str| json!({"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}; true {marker}", out.display())}}]});
    // One model per deployment (the fake model picks its step by the turns in the request).
    let full_model = FakeModel::start(
        &tmp.path().join("model-full"),
        &json!([call("MARKER-FULL-4f2a"), {"reply": "full done"}]),
    )
    .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"record": requests, "steps": [
            call("MARKER-RDCT-9c1e"), {"reply": "redacted done"}, {"reply": "second task"}
        ]}),
    )
    .unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    for (name, model, harness) in [
        ("full", &full_model, json!({})),
        (
            "rdct",
            &model,
            json!({"storeToolArguments": "redacted", "sensitiveFields": ["command"]}),
        ),
    ] {
        let dir = tmp.path().join(format!("bundle-{name}"));
        write_bundle(
            &dir,
            &[
                (
                    "mcp.json",
                    mcp_json(&[("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}))]),
                ),
                (
                    "x-agen/agent.md",
                    format!("---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run commands.\n", model.base_url()),
                ),
                ("x-agen/harness.json", harness.to_string()),
            ],
        )
        .unwrap();
        let o = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
            .unwrap();
        assert!(o.status.success(), "deploy {name}: {}", text(&o.stderr));
    }
    let run = |deployment: &str, conversation: &str| -> (String, Value) {
        let o = hub
            .cli(&["submit", deployment, "go", "--conversation", conversation])
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
        let task = text(&o.stdout).trim().to_string();
        let done = hub
            .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
            .unwrap();
        assert_eq!(done["state"], "succeeded", "{done}");
        (task, done)
    };
    run("full", "c-full");
    let (task, _) = run("rdct", "c-rdct");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().lines().count(),
        2,
        "both calls ran, with their real arguments"
    );

    let data = [tmp.path().join("hub"), tmp.path().join("nests")];
    let found = |needle: &str| -> Vec<PathBuf> {
        data.iter()
            .flat_map(|d| files_containing(d, needle))
            .collect()
    };
    assert!(
        !found("MARKER-FULL-4f2a").is_empty(),
        "by default the arguments are stored (so this search finds what is there)"
    );
    assert_eq!(found("MARKER-RDCT-9c1e"), Vec::<PathBuf>::new());

    let events = hub
        .cli(&["trace", &task, "--events", "-o", "json"])
        .unwrap();
    let answered: Vec<Value> = text(&events.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "model.answered")
        .collect();
    let args = &answered[0]["body"]["message"]["tool_calls"][0]["arguments"];
    assert_eq!(args, &json!({"command": "[redacted]"}), "{answered:?}");

    // The conversation's next task: the model is shown the stored (redacted) call.
    run("rdct", "c-rdct");
    let last = std::fs::read_to_string(&requests)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(
        last.contains("[redacted]") && !last.contains("MARKER-RDCT"),
        "{last}"
    );
}
