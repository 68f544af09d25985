//! `agen init` (issue 15): every template writes a bundle that `agen deploy` accepts as
//! written, and in the coder and ci-fixer templates `workspace.run` asks before it runs.

use agen_tests::{agen_bin, FakeModel, HubProcess};
use serde_json::json;

#[test]
fn every_template_deploys_as_written_and_run_asks_first_in_coder_and_ci_fixer() {
    let tmp = tempfile::tempdir().unwrap();
    let list = std::process::Command::new(agen_bin())
        .args(["init", "--list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    for t in ["basic", "coder", "ci-fixer"] {
        assert!(
            listed.lines().any(|l| l.starts_with(t)),
            "{t} missing from {listed}"
        );
    }
    let marker = tmp.path().join("run-executions.txt");
    let script = json!({"steps": [
        {"tool_calls": [{"name": "workspace_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    for t in ["basic", "coder", "ci-fixer"] {
        let dir = tmp.path().join(t);
        let out = std::process::Command::new(agen_bin())
            .args([
                "init",
                dir.to_str().unwrap(),
                "--template",
                t,
                "--model",
                "openai/fake-model",
                "--base-url",
                &model.base_url(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "init {t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(dir.join("README.md").exists(), "{t} has a README");
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", t])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {t}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if t == "basic" {
            continue;
        }
        let out = std::process::Command::new(agen_bin())
            .args(["run", dir.to_str().unwrap(), "fix it"])
            .env("XDG_STATE_HOME", tmp.path().join("state"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(
                "workspace_run was not run: it needs approval and was denied: no one to approve"
            ),
            "{t}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap_or_default(),
            "",
            "{t}: run never ran unapproved"
        );
    }
}
