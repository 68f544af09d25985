//! Host tools in an embedded agent, end to end inside one process: the real OpenAI client
//! against the scripted fake model (on 127.0.0.1:0), the real harness loop, tools written as
//! Rust closures and trait impls.
//!
//! What this shows: a host tool's result reaches the model and the outcome, with the same
//! `_meta` an MCP call gets; two read-only host tools of one turn run at the same time;
//! cancelling a run stops a host tool mid-call; permissions deny a host tool as they deny an MCP
//! tool (not offered, never called); a run streams its typed events; a conversation carries
//! its history; usage adds up over turns.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen::events::ToolFailure;
use agen::{Agent, CancellationToken, RunEventBody, RunOptions, RunState, Tool, ToolContext};
use agen_fake_model::{FakeModel, Script, Step};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

async fn fake(steps: Vec<Step>) -> FakeModel {
    FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct City {
    /// The city to look up.
    city: String,
}

/// A read-only weather tool that records the `_meta` of each call.
fn weather(seen: Arc<Mutex<Vec<ToolContext>>>) -> Tool {
    Tool::new("weather", "Today's weather in a city")
        .read_only()
        .handler(move |a: City, cx: ToolContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(cx);
                Ok::<_, String>(format!("sunny and 21 C in {}", a.city))
            }
        })
}

fn agent_on(model: &FakeModel) -> agen::AgentBuilder {
    Agent::builder()
        .name("helper")
        .model("openai/fake")
        .base_url(model.openai_base_url())
        .api_key("test-key")
        .system_prompt("You answer with the tools you have.")
}

#[tokio::test]
async fn a_host_tool_result_reaches_the_model_and_the_outcome_with_the_calls_meta() {
    let model = fake(vec![
        Step::call("weather", json!({"city": "Paris"})),
        Step::template("Forecast: {{last_tool_result}}"),
    ])
    .await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let agent = agent_on(&model)
        .tool(weather(seen.clone()))
        .build()
        .await
        .unwrap();

    let out = agent
        .run_with(
            "Weather in Paris?",
            RunOptions::new().label("team", "ops").run_id("run-1"),
        )
        .await
        .unwrap();

    assert_eq!(out.state, RunState::Succeeded);
    assert_eq!(out.result, "Forecast: sunny and 21 C in Paris");
    assert_eq!(out.run_id, "run-1");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let meta = seen[0].meta_map();
    assert_eq!(meta["agen/namespace"], "embedded");
    assert_eq!(meta["agen/deployment"], "helper");
    assert_eq!(meta["agen/runId"], "run-1");
    assert_eq!(meta["agen/taskId"], "run-1");
    assert_eq!(meta["agen/labels"], json!({"team": "ops"}));
    assert!(meta["traceparent"].as_str().unwrap().starts_with("00-"));

    // The model saw the host tool beside the built-ins, with the derived schema.
    let requests = model.requests();
    let tools = requests[0]["body"]["tools"].as_array().unwrap();
    let w = tools
        .iter()
        .find(|t| t["function"]["name"] == "weather")
        .unwrap();
    assert_eq!(
        w["function"]["parameters"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(w["function"]["parameters"]["required"], json!(["city"]));
    assert_eq!(
        agent.tool_names(),
        vec!["weather", "finish", "save_artifact", "read_artifact"]
    );
}

#[tokio::test]
async fn read_only_host_tools_of_one_turn_run_at_the_same_time() {
    let model = fake(vec![
        Step::calls(vec![
            ("lookup", json!({"key": "a"})),
            ("lookup", json!({"key": "b"})),
        ]),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    // Each call waits for the other: run one at a time, neither could finish.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let lookup = Tool::new("lookup", "Looks a key up")
        .read_only()
        .schema(json!({"type": "object", "properties": {"key": {"type": "string"}}}))
        .json_handler(move |args: Value, _cx| {
            let barrier = barrier.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                    .await
                    .map_err(|_| "the other call never ran beside this one".to_string())?;
                Ok::<_, String>(format!("value of {}", args["key"].as_str().unwrap_or("?")))
            }
        });
    let agent = agent_on(&model).tool(lookup).build().await.unwrap();

    let mut stream = agent.run_stream("Look up a and b").unwrap();
    let mut completed = Vec::new();
    while let Some(ev) = stream.next().await {
        if let RunEventBody::ToolCompleted(c) = ev {
            completed.push((c.result, c.is_error));
        }
    }
    let out = stream.outcome().await.unwrap();

    completed.sort();
    assert_eq!(
        completed,
        vec![
            ("value of a".to_string(), false),
            ("value of b".to_string(), false)
        ]
    );
    assert_eq!(out.state, RunState::Succeeded);
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicU32>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn cancelling_a_run_stops_a_host_tool_mid_call() {
    let model = fake(vec![
        Step::call("slow", json!({})),
        Step::reply("should never be asked"),
    ])
    .await;
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicU32::new(0));
    let finished = Arc::new(AtomicU32::new(0));
    let (s, d, f) = (started.clone(), dropped.clone(), finished.clone());
    let slow = Tool::new("slow", "Takes a minute").json_handler(move |_args: Value, _cx| {
        let (s, d, f) = (s.clone(), d.clone(), f.clone());
        async move {
            let _guard = DropFlag(d);
            s.notify_one();
            tokio::time::sleep(Duration::from_secs(60)).await;
            f.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("done".into())
        }
    });
    let agent = agent_on(&model).tool(slow).build().await.unwrap();

    let token = CancellationToken::new();
    let stream = agent
        .stream_with("Do the slow thing", RunOptions::new().cancel(token.clone()))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the host tool was called");
    token.cancel();
    let out = tokio::time::timeout(Duration::from_secs(5), stream.outcome())
        .await
        .expect("the run ends soon after the cancel")
        .unwrap();

    assert_eq!(out.state, RunState::Cancelled);
    // The tool's future was dropped mid-sleep, not left running.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while dropped.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    // One model turn only: the model was not asked again after the cancel.
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn permissions_deny_a_host_tool_as_they_deny_an_mcp_tool() {
    let model = fake(vec![
        Step::call("wire_money", json!({"amount": 100})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let wire = Tool::new("wire_money", "Sends money").json_handler(move |_a: Value, _cx| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("sent".into())
        }
    });
    let agent = agent_on(&model)
        .config_json(json!({"permissions": {"deny": ["wire_*"]}}))
        .tool(wire)
        .build()
        .await
        .unwrap();
    assert!(!agent.tool_names().contains(&"wire_money".to_string()));

    let mut stream = agent.run_stream("Send 100").unwrap();
    let mut failures = Vec::new();
    while let Some(ev) = stream.next().await {
        if let RunEventBody::ToolFailed(f) = ev {
            failures.push((f.tool, f.reason));
        }
    }
    let out = stream.outcome().await.unwrap();

    assert_eq!(
        failures,
        vec![("wire_money".to_string(), ToolFailure::Denied)]
    );
    assert!(out.result.contains("deny"), "{}", out.result);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Not offered to the model either.
    let tools = model.requests()[0]["body"]["tools"].clone();
    assert!(!tools.to_string().contains("wire_money"));
}

#[tokio::test]
async fn a_run_streams_its_typed_events_in_order() {
    let model = fake(vec![
        Step::call("weather", json!({"city": "Oslo"})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let agent = agent_on(&model)
        .tool(weather(Default::default()))
        .build()
        .await
        .unwrap();
    let mut stream = agent.run_stream("Oslo?").unwrap();
    let mut kinds = Vec::new();
    while let Some(ev) = stream.next().await {
        if !matches!(ev, RunEventBody::Activity(_)) {
            kinds.push(ev.kind().to_string());
        }
    }
    let out = stream.outcome().await.unwrap();
    assert_eq!(
        kinds,
        vec![
            "model.requested",
            "model.answered",
            "tool.started",
            "tool.completed",
            "model.requested",
            "model.answered",
            "run.finished"
        ]
    );
    assert_eq!(out.result, "sunny and 21 C in Oslo");
    // The fake model reports zero tokens; the sum over turns is unit-tested in the harness.
    assert_eq!(out.usage, agen::Usage::default());
}

#[tokio::test]
async fn a_conversation_carries_its_history_to_the_next_run() {
    let model = fake(vec![Step {
        echo_history: true,
        ..Default::default()
    }])
    .await;
    let agent = agent_on(&model).build().await.unwrap();
    let chat = agent.conversation("user-42");
    assert_eq!(
        chat.run("first").await.unwrap().result,
        "user messages: first"
    );
    assert_eq!(
        chat.run("second").await.unwrap().result,
        "user messages: first | second"
    );
    // Another key starts afresh.
    let other = agent.conversation("user-7").run("hello").await.unwrap();
    assert_eq!(other.result, "user messages: hello");
    assert_eq!(chat.history().unwrap().len(), 4);
}

#[tokio::test]
async fn a_host_tool_name_that_clashes_is_refused_with_the_name() {
    let model = fake(vec![Step::reply("hi")]).await;
    let t = || {
        Tool::new("finish", "x")
            .json_handler(|_a: Value, _cx| async { Ok::<_, String>(String::new()) })
    };
    let err = agent_on(&model).tool(t()).build().await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "host tool name `finish` is taken by a built-in tool; pick another name"
    );
    let dup = || {
        Tool::new("twice", "x")
            .json_handler(|_a: Value, _cx| async { Ok::<_, String>(String::new()) })
    };
    let err = agent_on(&model)
        .tool(dup())
        .tool(dup())
        .build()
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("twice"), "{err}");
}

/// A host tool written as a trait impl, with a hand-given spec.
struct Refund {
    calls: Arc<AtomicU32>,
}

#[agen::async_trait]
impl agen::HostTool for Refund {
    fn spec(&self) -> agen::HostToolSpec {
        agen::HostToolSpec {
            name: "refund".into(),
            description: "Refunds an order".into(),
            input_schema: agen::schema_of::<City>(),
            read_only: false,
            idempotent: true,
        }
    }

    async fn call(&self, _arguments: Value, cx: ToolContext) -> Result<String, agen::ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(format!("refunded in run {}", cx.meta.run_id))
    }
}

#[tokio::test]
async fn an_ask_host_tool_waits_for_the_approver_and_is_denied_without_one() {
    let steps = || {
        vec![
            Step::call("refund", json!({"city": "x"})),
            Step::template("{{last_tool_result}}"),
        ]
    };
    let calls = Arc::new(AtomicU32::new(0));

    let model = fake(steps()).await;
    let approved = agent_on(&model)
        .ask("refund")
        .approver(Arc::new(agen::ApproveAll))
        .tool(Refund {
            calls: calls.clone(),
        })
        .build()
        .await
        .unwrap();
    let out = approved
        .run_with("Refund it", RunOptions::new().run_id("r-1"))
        .await
        .unwrap();
    assert_eq!(out.result, "refunded in run r-1");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let model = fake(steps()).await;
    let unattended = agent_on(&model)
        .ask("refund")
        .tool(Refund {
            calls: calls.clone(),
        })
        .build()
        .await
        .unwrap();
    let out = unattended.run("Refund it").await.unwrap();
    assert!(
        out.result.contains("needs approval and was denied"),
        "{}",
        out.result
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_host_tool_is_called_through_the_keen_text_protocol_too() {
    let call = "I'll look.\n\n<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nweather\n!*context\n{\"city\": \"Rome\"}\n</SYSTEM CALL>\n";
    let model = fake(vec![Step::reply(call), Step::template("{{last_user}}")]).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let agent = agent_on(&model)
        .harness_json(json!({"toolProtocol": "keen"}))
        .tool(weather(seen.clone()))
        .build()
        .await
        .unwrap();
    let out = agent.run("Weather in Rome?").await.unwrap();

    assert_eq!(seen.lock().unwrap().len(), 1, "{}", out.result);
    assert!(
        out.result.starts_with("<SYSTEM RESPONSE>")
            && out.result.contains("sunny and 21 C in Rome"),
        "{}",
        out.result
    );
    // No native tools were sent; the tools section in the system prompt names the host tool.
    let first = &model.requests()[0]["body"];
    assert!(first.get("tools").is_none_or(|t| t.is_null()));
    assert!(first["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("weather"));
}

#[tokio::test]
async fn a_host_tool_that_panics_or_overruns_its_timeout_is_a_tool_failure_not_a_crash() {
    let model = fake(vec![
        Step::calls(vec![("boom", json!({})), ("stuck", json!({}))]),
        Step::reply("carried on"),
    ])
    .await;
    let boom = Tool::new("boom", "Panics")
        .read_only()
        .json_handler(|_a: Value, _cx| async move {
            if true {
                panic!("host tool bug");
            }
            Ok::<_, String>(String::new())
        });
    let stuck = Tool::new("stuck", "Never answers")
        .read_only()
        .json_handler(|_a: Value, _cx| async move {
            tokio::time::sleep(Duration::from_secs(300)).await;
            Ok::<_, String>(String::new())
        });
    let agent = agent_on(&model)
        .tool_timeout(Duration::from_millis(300))
        .tool(boom)
        .tool(stuck)
        .build()
        .await
        .unwrap();
    let mut stream = agent.run_stream("go").unwrap();
    let mut failed = Vec::new();
    while let Some(ev) = stream.next().await {
        if let RunEventBody::ToolFailed(f) = ev {
            failed.push((f.tool, f.reason, f.error));
        }
    }
    let out = stream.outcome().await.unwrap();
    failed.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        failed,
        vec![
            (
                "boom".to_string(),
                ToolFailure::Failed,
                "tool boom failed: the host tool panicked".to_string()
            ),
            (
                "stuck".to_string(),
                ToolFailure::Timeout,
                "tool stuck timed out after 300ms and was cancelled".to_string()
            ),
        ]
    );
    assert_eq!(out.result, "carried on");
}
