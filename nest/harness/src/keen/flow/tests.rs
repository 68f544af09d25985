//! Flow tests: validation table (file and node named), and runs with script, agent and
//! condition nodes, including the spec's failing `compute-stamp` node.

use super::*;
use crate::keen::registry::KeenBundle;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::path::Path;
use std::sync::Mutex;

#[track_caller]
fn check_invalid(text: &str, expected: &[&str]) {
    match parse_flow("flows/Next.json", text) {
        Err(KeenError::Invalid(problems)) => assert_eq!(problems, expected, "flow {text}"),
        other => panic!("expected problems for {text}, got {other:?}"),
    }
}

/// The flow file of `docs/keen.md`, verbatim.
const DOCS_FLOW: &str = r#"{"nodes": {
  "ToolCall":      {"type": "start", "next": "compute-stamp"},
  "compute-stamp": {"type": "script", "entry": "tools/stamp.js", "next": "check"},
  "check":         {"type": "condition", "key": "toolStatus", "equals": "error", "then": "ask", "else": "done"},
  "ask":           {"type": "agent", "prompt": "Explain the failure in one line.", "next": "done"},
  "done":          {"type": "end"}
}}"#;

#[test]
fn the_documented_flow_parses() {
    let flow = parse_flow("flows/Next.json", DOCS_FLOW).expect("valid flow");
    assert_eq!(flow.nodes.len(), 5);
    assert_eq!(
        flow.nodes.get("check"),
        Some(&FlowNode::Condition {
            key: "toolStatus".into(),
            equals: "error".into(),
            then: "ask".into(),
            otherwise: "done".into()
        })
    );
}

#[test]
fn flow_problems_name_the_file_and_node() {
    check_invalid(
        "[]",
        &[
            r#"flows/Next.json: expected an object {"nodes": {"<id>": {"type": "start", "next": "…"}, …}}"#,
        ],
    );
    check_invalid(
        r#"{"nodes": {"s": {"type": "start", "next": "x"}, "e": {"type": "end"}}}"#,
        &[r#"flows/Next.json: node "s": next: unknown node "x""#],
    );
    check_invalid(
        r#"{"nodes": {"s": {"type": "start"}, "e": {"type": "end"}}}"#,
        &[r#"flows/Next.json: node "s": next: missing in a start node"#],
    );
    check_invalid(
        r#"{"nodes": {"s": {"type": "begin", "next": "e"}, "e": {"type": "end"}}}"#,
        &[
            r#"flows/Next.json: node "s": type: unknown node type "begin"; expected start, script, agent, condition or end"#,
        ],
    );
    check_invalid(
        r#"{"nodes": {"s": {"type": "start", "next": "e", "nxt": "e"}, "e": {"type": "end"}}}"#,
        &[r#"flows/Next.json: node "s": nxt: unknown field for a start node; expected next"#],
    );
    check_invalid(
        r#"{"nodes": {"s": {"type": "start", "next": "x"}, "x": {"type": "script", "entry": "../x.js", "next": "e"}, "e": {"type": "end"}}}"#,
        &[
            r#"flows/Next.json: node "x": entry: script entry `../x.js` must start with `tools/` (e.g. `tools/my-tool.js`)"#,
        ],
    );
    check_invalid(
        r#"{"nodes": {"c": {"type": "condition", "key": "k", "equals": "v", "then": "e"}, "e": {"type": "end"}}}"#,
        &[r#"flows/Next.json: node "c": else: missing in a condition node"#],
    );
    check_invalid(
        r#"{"nodes": {"e": {"type": "end"}}}"#,
        &[r#"flows/Next.json: has no start node; add {"type": "start", "next": "…"}"#],
    );
    // A cycle without an exit: a and b only lead to each other.
    check_invalid(
        r#"{"nodes": {
            "s": {"type": "start", "next": "a"},
            "a": {"type": "agent", "prompt": "p", "next": "b"},
            "b": {"type": "condition", "key": "k", "equals": 1, "then": "a", "else": "a"},
            "e": {"type": "end"}}}"#,
        &[
            r#"flows/Next.json: node "a": cannot reach an end node (a loop without an exit, or no end node)"#,
            r#"flows/Next.json: node "b": cannot reach an end node (a loop without an exit, or no end node)"#,
            r#"flows/Next.json: node "s": cannot reach an end node (a loop without an exit, or no end node)"#,
        ],
    );
    // A cycle with an exit is fine.
    parse_flow(
        "flows/Next.json",
        r#"{"nodes": {
            "s": {"type": "start", "next": "a"},
            "a": {"type": "agent", "prompt": "p", "next": "b"},
            "b": {"type": "condition", "key": "responseType", "equals": "text", "then": "e", "else": "a"},
            "e": {"type": "end"}}}"#,
    )
    .expect("a loop with an exit is valid");
}

/// A scripted stand-in for the bundle's model (the harness implements the real one).
struct ScriptedAgent {
    answers: Mutex<Vec<std::result::Result<(String, String), String>>>,
    asked: Mutex<Vec<(String, String)>>,
}

impl ScriptedAgent {
    fn new(answers: Vec<std::result::Result<(String, String), String>>) -> Self {
        ScriptedAgent {
            answers: Mutex::new(answers),
            asked: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait::async_trait]
impl FlowAgent for ScriptedAgent {
    async fn ask(
        &self,
        prompt: &str,
        context: &str,
    ) -> std::result::Result<(String, String), String> {
        self.asked
            .lock()
            .expect("lock")
            .push((prompt.to_string(), context.to_string()));
        let mut answers = self.answers.lock().expect("lock");
        if answers.is_empty() {
            return Err("no more scripted answers".into());
        }
        answers.remove(0)
    }
}

fn bundle_with(flow: &str, stamp_js: &str) -> (tempfile::TempDir, KeenBundle) {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |rel: &str, text: &str| {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).expect("dir");
        std::fs::write(path, text).expect("write");
    };
    write(
        "keen-tools.json",
        r#"[{"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "attempts": 5}]"#,
    );
    write("flows/Next.json", flow);
    write("tools/stamp.js", stamp_js);
    let bundle = KeenBundle::load(dir.path())
        .expect("valid bundle")
        .expect("keen bundle");
    (dir, bundle)
}

#[tokio::test]
async fn the_spec_timestamp_flow_answers() {
    let (_dir, bundle) = bundle_with(
        DOCS_FLOW,
        "exports.exec = (props, dictionary) => { dictionary.result = '2026-05-07T10:42:13Z'; };",
    );
    let agent = ScriptedAgent::new(vec![]);
    let outcome = run_flow(
        &bundle,
        "Next",
        "ToolCall",
        "",
        &agent,
        &ScriptLimits::default(),
    )
    .await;
    assert_eq!(
        outcome,
        FlowOutcome::Done {
            result: Some("2026-05-07T10:42:13Z".into()),
            tool_status_error: false,
            dictionary: json!({"context": "", "result": "2026-05-07T10:42:13Z"}),
        }
    );
    assert!(
        agent.asked.lock().expect("lock").is_empty(),
        "the else branch skips the agent node"
    );
}

#[tokio::test]
async fn the_spec_failing_compute_stamp_node_is_named() {
    let (_dir, bundle) = bundle_with(
        DOCS_FLOW,
        "exports.exec = (props, dictionary) => { dictionary.result = now(); };",
    );
    let agent = ScriptedAgent::new(vec![]);
    let outcome = run_flow(
        &bundle,
        "Next",
        "ToolCall",
        "",
        &agent,
        &ScriptLimits::default(),
    )
    .await;
    assert_eq!(
        outcome,
        FlowOutcome::NodeFailed {
            node: "compute-stamp".into(),
            error: r#"ScriptNode "compute-stamp" threw: ReferenceError: now is not defined"#.into(),
        }
    );
}

#[tokio::test]
async fn a_tool_status_error_branches_to_the_agent_node() {
    let (_dir, bundle) = bundle_with(
        DOCS_FLOW,
        "exports.exec = (p, d) => { d.result = 'clock offline'; d.toolStatus = 'error'; };",
    );
    let agent = ScriptedAgent::new(vec![Ok((
        "The clock service is offline.".into(),
        "text".into(),
    ))]);
    let outcome = run_flow(
        &bundle,
        "Next",
        "ToolCall",
        "tz=UTC",
        &agent,
        &ScriptLimits::default(),
    )
    .await;
    assert_eq!(
        outcome,
        FlowOutcome::Done {
            result: Some("The clock service is offline.".into()),
            tool_status_error: true,
            dictionary: json!({
                "context": "tz=UTC",
                "result": "The clock service is offline.",
                "toolStatus": "error",
                "responseType": "text",
            }),
        }
    );
    assert_eq!(
        *agent.asked.lock().expect("lock"),
        vec![(
            "Explain the failure in one line.".to_string(),
            "tz=UTC".to_string()
        )]
    );
}

#[tokio::test]
async fn agent_nodes_record_the_response_type_and_failures_name_the_node() {
    let flow = r#"{"nodes": {
        "ToolCall": {"type": "start", "next": "ask"},
        "ask": {"type": "agent", "prompt": "Say hi.", "next": "route"},
        "route": {"type": "condition", "key": "responseType", "equals": "error", "then": "failed", "else": "done"},
        "failed": {"type": "script", "entry": "tools/stamp.js", "next": "done"},
        "done": {"type": "end"}}}"#;
    let (_dir, bundle) = bundle_with(
        flow,
        "exports.exec = (p, d) => { d.result = 'provider said no'; d.toolStatus = 'error'; };",
    );
    let limits = ScriptLimits::default();

    let agent = ScriptedAgent::new(vec![Ok(("hi".into(), "text".into()))]);
    let done = run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await;
    assert!(
        matches!(done, FlowOutcome::Done { result: Some(r), tool_status_error: false, .. } if r == "hi")
    );

    let agent = ScriptedAgent::new(vec![Ok(("rate limited".into(), "error".into()))]);
    let routed = run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await;
    assert!(
        matches!(routed, FlowOutcome::Done { result: Some(r), tool_status_error: true, .. } if r == "provider said no")
    );

    let agent = ScriptedAgent::new(vec![Err("model unreachable".into())]);
    assert_eq!(
        run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await,
        FlowOutcome::NodeFailed {
            node: "ask".into(),
            error: r#"AgentNode "ask" failed: model unreachable"#.into()
        }
    );
}

#[tokio::test]
async fn script_nodes_share_the_flows_dictionary_and_loops_are_capped() {
    let flow = r#"{"nodes": {
        "ToolCall": {"type": "start", "next": "count"},
        "count": {"type": "script", "entry": "tools/stamp.js", "next": "enough"},
        "enough": {"type": "condition", "key": "n", "equals": 3, "then": "done", "else": "count"},
        "done": {"type": "end"}}}"#;
    let (_dir, bundle) = bundle_with(
        flow,
        "exports.exec = (p, d) => { d.n = (d.n || 0) + 1; d.result = `n=${d.n}`; };",
    );
    let agent = ScriptedAgent::new(vec![]);
    let limits = ScriptLimits::default();
    assert!(matches!(
        run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await,
        FlowOutcome::Done { result: Some(r), .. } if r == "n=3"
    ));

    // The exit is never taken: the step cap stops the run.
    let (_dir, bundle) = bundle_with(
        &flow.replace("\"equals\": 3", "\"equals\": -1"),
        "exports.exec = (p, d) => { d.n = (d.n || 0) + 1; };",
    );
    match run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await {
        FlowOutcome::NodeFailed { error, .. } => {
            assert!(error.contains("after 256 steps"), "{error}")
        }
        other => panic!("expected the step cap, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_entries_and_script_limits_in_flows() {
    let (_dir, bundle) = bundle_with(DOCS_FLOW, "exports.exec = () => { for (;;) {} };");
    let agent = ScriptedAgent::new(vec![]);
    let limits = ScriptLimits {
        timeout: std::time::Duration::from_millis(200),
        ..ScriptLimits::default()
    };
    assert_eq!(
        run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits).await,
        FlowOutcome::NodeFailed {
            node: "compute-stamp".into(),
            error: r#"ScriptNode "compute-stamp" timed out after 200ms"#.into()
        }
    );
    assert!(matches!(
        run_flow(&bundle, "Nope", "ToolCall", "", &agent, &limits).await,
        FlowOutcome::BadEntry(_)
    ));
    assert!(matches!(
        run_flow(&bundle, "Next", "check", "", &agent, &limits).await,
        FlowOutcome::BadEntry(_)
    ));
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn flow_and_script_futures_are_send_so_the_harness_can_spawn_them() {
    let (dir, bundle) = bundle_with(DOCS_FLOW, "exports.exec = () => {};");
    let agent = ScriptedAgent::new(vec![]);
    let limits = ScriptLimits::default();
    let flow = run_flow(&bundle, "Next", "ToolCall", "", &agent, &limits);
    assert_send(&flow);
    let script = crate::keen::script::run_script_tool(dir.path(), "tools/stamp.js", "", &limits);
    assert_send(&script);
    assert!(matches!(flow.await, FlowOutcome::Done { result: None, .. }));
    assert!(matches!(
        script.await,
        ScriptOutcome::Ok { result: None, .. }
    ));
}
