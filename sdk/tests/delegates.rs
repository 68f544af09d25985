//! Delegates that are other `Agent`s of the same program (`Agent::as_tool`), against two
//! scripted fake models: the delegate answers the caller's tool call, its run is in the
//! caller's delegation tree, and a failed delegate run is an error result for the caller.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use agen::{Agent, RunOptions, RunState, Tool, ToolContext};
use agen_fake_model::{FakeModel, Script, Step};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

async fn fake(steps: Vec<Step>) -> FakeModel {
    FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn on(model: &FakeModel, name: &str) -> agen::AgentBuilder {
    Agent::builder()
        .name(name)
        .model("openai/fake")
        .base_url(model.openai_base_url())
        .api_key("k")
}

#[tokio::test]
async fn another_agent_of_the_program_answers_as_a_delegate_in_the_callers_tree() {
    // The researcher reports where its run sits, through a host tool of its own.
    let researcher_model = fake(vec![
        Step::call("whoami", json!({})),
        Step::template("{{last_tool_result}} asked: {{last_user}}"),
    ])
    .await;
    let whoami = Tool::new("whoami", "Where this run sits")
        .read_only()
        .json_handler(|_a: Value, cx: ToolContext| async move {
            Ok::<_, String>(format!(
                "run {} root {} team {}",
                cx.meta.run_id,
                cx.meta.root_run_id,
                cx.meta.labels.get("team").cloned().unwrap_or_default()
            ))
        });
    let researcher = on(&researcher_model, "researcher")
        .tool(whoami)
        .build()
        .await
        .unwrap();

    let lead_model = fake(vec![
        Step {
            tool_calls: vec![agen_fake_model::ScriptedCall {
                name: "researcher".into(),
                arguments: json!({"input": "find the cause"}),
                id: Some("call_1".into()),
            }],
            ..Default::default()
        },
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let lead = on(&lead_model, "lead")
        .tool(researcher.as_tool("researcher", "Researches a question"))
        .build()
        .await
        .unwrap();
    let out = lead
        .run_with(
            "Why is it slow?",
            RunOptions::new().run_id("lead-1").label("team", "ops"),
        )
        .await
        .unwrap();

    assert_eq!(out.state, RunState::Succeeded);
    assert_eq!(
        out.result,
        "run lead-1-call_1 root lead-1 team ops asked: find the cause"
    );
}

#[tokio::test]
async fn a_failed_delegate_run_is_an_error_result_for_the_caller() {
    let researcher_model = fake(vec![Step::status(500, "model down")]).await;
    let researcher = on(&researcher_model, "researcher").build().await.unwrap();
    let lead_model = fake(vec![
        Step::call("researcher", json!({"input": "x"})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let lead = on(&lead_model, "lead")
        .tool(researcher.as_tool("researcher", "Researches"))
        .build()
        .await
        .unwrap();
    let out = lead.run("go").await.unwrap();
    assert!(
        out.result.starts_with("agent researcher failed:"),
        "{}",
        out.result
    );
}
