//! Artifacts of an embedded agent go to the store the program chose: files under a folder it
//! names, or memory by default; the outcome lists them and the agent reads them back.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use agen::Agent;
use agen_fake_model::{FakeModel, Script, Step};
use pretty_assertions::assert_eq;
use serde_json::json;

fn steps() -> Vec<Step> {
    vec![
        Step::call(
            "save_artifact",
            json!({"name": "report", "content": "# Weekly\nall good", "mediaType": "text/markdown"}),
        ),
        Step::template("saved {{last_tool_result}}"),
    ]
}

#[tokio::test]
async fn artifacts_go_to_the_folder_the_program_chose_and_are_listed_in_the_outcome() {
    let model = FakeModel::start(Script::steps(steps()), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let agent = Agent::builder()
        .model("openai/fake")
        .base_url(model.openai_base_url())
        .api_key("k")
        .artifacts_dir(tmp.path())
        .build()
        .await
        .unwrap();
    let out = agent.run("Write the report").await.unwrap();

    assert_eq!(out.artifacts.len(), 1);
    let a = &out.artifacts[0];
    assert_eq!(
        (a.name.as_str(), a.media_type.as_str()),
        ("report", "text/markdown")
    );
    assert_eq!(out.result, format!("saved {}", a.id));
    assert_eq!(
        agent.read_artifact(&a.id).await.unwrap(),
        b"# Weekly\nall good"
    );
    // On disk under the embedded namespace's folder.
    let hex = a.id.strip_prefix("sha256:").unwrap();
    let files: Vec<String> = walk(tmp.path());
    assert!(files.iter().any(|f| f.contains(hex)), "{files:?}");
}

#[tokio::test]
async fn artifacts_stay_in_memory_by_default() {
    let model = FakeModel::start(Script::steps(steps()), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let agent = Agent::builder()
        .model("openai/fake")
        .base_url(model.openai_base_url())
        .api_key("k")
        .build()
        .await
        .unwrap();
    let out = agent.run("Write the report").await.unwrap();
    let id = &out.artifacts[0].id;
    assert_eq!(
        agent.read_artifact(id).await.unwrap(),
        b"# Weekly\nall good"
    );
    assert!(agent.read_artifact("sha256:00").await.is_err());
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

/// A Keen script tool's result over the recorded limit (1 MiB) is cut for the model with a note,
/// and kept whole as an artifact, as an MCP tool's is.
#[tokio::test]
async fn a_keen_script_result_over_one_mib_is_cut_for_the_model_and_kept_whole() {
    let call = "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nBig\n!*context\n{}\n</SYSTEM CALL>\n";
    let model = FakeModel::start(
        Script::steps(vec![Step::reply(call), Step::template("{{last_user}}")]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "x-agen/agent.md",
            format!(
                "---\nmodel: openai/fake\nbaseUrl: {}\n---\nYou use tools.\n",
                model.openai_base_url()
            ),
        ),
        (
            "x-agen/harness.json",
            json!({"toolProtocol": "keen"}).to_string(),
        ),
        (
            "keen-tools.json",
            json!([{"name": "Big", "type": "script", "entry": "tools/big.js"}]).to_string(),
        ),
        (
            "tools/big.js",
            "module.exports = { exec(props, dictionary) { dictionary.result = 'x'.repeat(1572864); } };\n".into(),
        ),
    ];
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let agent = Agent::from_bundle(dir.path())
        .api_key("k")
        .build()
        .await
        .unwrap();
    let out = agent.run("Make it big").await.unwrap();

    assert!(
        out.result.len() < 1024 * 1024 + 4096,
        "the model saw {} bytes",
        out.result.len()
    );
    assert!(
        out.result.contains("1572864"),
        "the note says how long it was"
    );
    assert_eq!(out.artifacts.len(), 1, "the whole result is kept");
    let whole = agent.read_artifact(&out.artifacts[0].id).await.unwrap();
    assert_eq!(whole.len(), 1572864);
}
