//! An agent from a bundle folder and the same agent built in code: same validation, same
//! messages, same behaviour on the same script (against the scripted fake model on
//! 127.0.0.1:0, through the real OpenAI client).

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::path::Path;

use agen::{Agent, Tool, ToolContext};
use agen_fake_model::{FakeModel, Script, Step};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn echo() -> Tool {
    Tool::new("shout", "Upper-cases a text")
        .read_only()
        .schema(json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}))
        .json_handler(|args: Value, _cx: ToolContext| async move {
            Ok::<_, String>(args["text"].as_str().unwrap_or_default().to_uppercase())
        })
}

fn script() -> Vec<Step> {
    vec![
        Step::call("load_skill", json!({"name": "tone"})),
        Step::call("shout", json!({"text": "hello"})),
        Step::template("{{last_tool_result}} (turn {{turn}})"),
    ]
}

/// The model requests' bodies, without what differs by server (nothing should).
fn bodies(model: &FakeModel) -> Vec<Value> {
    model
        .requests()
        .into_iter()
        .map(|r| r["body"].clone())
        .collect()
}

#[tokio::test]
async fn an_agent_built_in_code_and_one_from_its_bundle_behave_the_same() {
    let from_folder = FakeModel::start(Script::steps(script()), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let in_code = FakeModel::start(Script::steps(script()), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shouter");
    write(
        &dir,
        "x-agen/agent.md",
        "---\nname: shouter\nmodel: openai/fake\npreloadSkills: [style]\n---\nYou shout.\n",
    );
    write(
        &dir,
        "skills/tone/SKILL.md",
        "---\nname: tone\ndescription: How loud to be\n---\nBe loud.\n",
    );
    write(
        &dir,
        "skills/style/SKILL.md",
        "---\nname: style\ndescription: House style\n---\nShort sentences.\n",
    );
    write(
        &dir,
        "x-agen/harness.json",
        r#"{"limits": {"maxTurns": 5}}"#,
    );
    write(
        &dir,
        "x-agen/config.json",
        r#"{"tools": {"shout": {"idempotent": true}}}"#,
    );
    let a = Agent::from_bundle(&dir)
        .base_url(from_folder.openai_base_url())
        .api_key("k")
        .tool(echo())
        .build()
        .await
        .unwrap();
    let b = Agent::builder()
        .name("shouter")
        .model("openai/fake")
        .base_url(in_code.openai_base_url())
        .api_key("k")
        .system_prompt("You shout.")
        .skill("tone", "How loud to be", "Be loud.")
        .skill("style", "House style", "Short sentences.")
        .preload_skill("style")
        .harness_json(json!({"limits": {"maxTurns": 5}}))
        .config_json(json!({"tools": {"shout": {"idempotent": true}}}))
        .tool(echo())
        .build()
        .await
        .unwrap();

    assert_eq!(a.name(), b.name());
    assert_eq!(a.system_prompt(), b.system_prompt());
    assert_eq!(a.tool_names(), b.tool_names());
    let (oa, ob) = (
        a.run("Say hello").await.unwrap(),
        b.run("Say hello").await.unwrap(),
    );
    assert_eq!(oa.result, "HELLO (turn 2)");
    assert_eq!(
        (oa.state, oa.result, oa.response_type, oa.messages),
        (ob.state, ob.result, ob.response_type, ob.messages)
    );
    assert_eq!(bodies(&from_folder), bodies(&in_code));
}

#[tokio::test]
async fn a_bad_definition_in_code_gets_the_message_agen_deploy_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bad");
    write(
        &dir,
        "x-agen/agent.md",
        "---\nmodel: gpt-4\n---\nYou help.\n",
    );
    let from_folder = Agent::from_bundle(&dir).build().await.err().unwrap();
    let in_code = Agent::builder()
        .model("gpt-4")
        .system_prompt("You help.")
        .build()
        .await
        .err()
        .unwrap();
    let deploy = agen_shared::bundle::Bundle::load(&dir).err().unwrap();
    assert_eq!(from_folder.to_string(), deploy.to_string());
    assert_eq!(in_code.to_string(), deploy.to_string());
    assert!(
        deploy.to_string().starts_with("x-agen/agent.md"),
        "{deploy}"
    );

    let in_code = Agent::builder()
        .model("openai/m")
        .mcp_server(
            "crm",
            json!({"command": "crm-server", "env": {"T": "${CRM_TOKEN}"}}),
        )
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        in_code.to_string().contains("CRM_TOKEN")
            && in_code.to_string().contains("x-agen/secrets.json"),
        "{in_code}"
    );
}

/// `target/<profile>/agen`, built by `cargo build --bins`.
fn agen_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("agen");
    assert!(
        bin.exists(),
        "{} is missing; run `cargo build --bins` first",
        bin.display()
    );
    bin
}

#[tokio::test]
async fn a_code_built_agents_mcp_server_and_host_tool_answer_in_one_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    write(&root, "notes.txt", "the key is under the mat");
    let model = FakeModel::start(
        Script::steps(vec![
            Step::calls(vec![
                ("files_read", json!({"path": "notes.txt"})),
                ("shout", json!({"text": "found it"})),
            ]),
            Step::template("{{last_tool_result}}"),
        ]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let agent = Agent::builder()
        .model("openai/fake")
        .base_url(model.openai_base_url())
        .api_key("k")
        .agen_bin(agen_bin())
        .mcp_server(
            "files",
            json!({"command": "agen", "args": ["mcp", "workspace", "--root", root.to_str().unwrap(), "--no-run"]}),
        )
        .tool(echo())
        .build()
        .await
        .unwrap();
    assert_eq!(
        agent.servers_not_connected(),
        Vec::<(String, String)>::new()
    );
    assert!(agent.tool_names().contains(&"files_read".to_string()));

    let mut stream = agent.run_stream("Read the notes").unwrap();
    let mut results = Vec::new();
    while let Some(ev) = futures::StreamExt::next(&mut stream).await {
        if let agen::RunEventBody::ToolCompleted(c) = ev {
            results.push((
                c.tool,
                c.result.contains("under the mat") || c.result == "FOUND IT",
            ));
        }
    }
    let out = stream.outcome().await.unwrap();
    results.sort();
    assert_eq!(
        results,
        vec![
            ("files.read".to_string(), true),
            ("shout".to_string(), true)
        ]
    );
    assert_eq!(out.result, "FOUND IT");
    agent.shutdown().await;
}

#[tokio::test]
async fn a_code_only_setter_on_a_bundle_agent_is_refused_not_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write(
        &dir,
        "x-agen/agent.md",
        "---\nmodel: openai/m\n---\nYou help.\n",
    );
    let err = Agent::from_bundle(&dir)
        .system_prompt("something else")
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .starts_with("AgentBuilder::system_prompt is for agents built in code"),
        "{err}"
    );
    let err = Agent::builder()
        .model("openai/m")
        .harness_json(json!([1]))
        .build()
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "AgentBuilder::harness_json: expected a JSON object (the file's content), got [1]"
    );
}
