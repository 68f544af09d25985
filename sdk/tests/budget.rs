//! The bundle's token budget (`limits.maxTokens` in `x-agen/harness.json`) holds for an
//! embedded agent too: the run stops before the turn that would pass it, with an error outcome
//! naming the budget (against the scripted fake model, which reports each turn's usage).

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use agen::{Agent, Tool, ToolContext};
use agen_fake_model::{FakeModel, Script, Step};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

fn noop() -> Tool {
    Tool::new("note", "Takes a note")
        .read_only()
        .schema(json!({"type": "object", "properties": {}}))
        .json_handler(|_args: Value, _cx: ToolContext| async move {
            Ok::<_, String>("noted".to_string())
        })
}

#[tokio::test]
async fn an_embedded_agent_stops_before_the_turn_that_would_pass_max_tokens() {
    let model = FakeModel::start(
        Script::steps(vec![
            Step::call("note", json!({})).with_usage(300, 100),
            Step::call("note", json!({})).with_usage(500, 100),
            Step::reply("done").with_usage(50, 10),
        ]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let agent = |max: u64| {
        Agent::builder()
            .name("noter")
            .model("openai/fake")
            .base_url(model.openai_base_url())
            .api_key("k")
            .system_prompt("You take notes.")
            .harness_json(json!({"limits": {"maxTokens": max}}))
            .tool(noop())
            .build()
    };

    let before = model.requests().len();
    let out = agent(900).await.unwrap().run("go").await.unwrap();
    assert_eq!(out.response_type.as_str(), "error", "{}", out.result);
    assert!(
        out.result
            .starts_with("token budget exceeded: 1000 of max 900 tokens used"),
        "{}",
        out.result
    );
    assert_eq!(model.requests().len() - before, 2, "no third turn");

    let out = agent(5000).await.unwrap().run("go").await.unwrap();
    assert_eq!(out.result, "done");
}
