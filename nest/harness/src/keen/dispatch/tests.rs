//! Dispatch tests: decisions for every failure case, attempts accounting, the run-wide cap,
//! native tools, and the exact texts sent back to the model.

use super::*;
use crate::keen::parser::parse_reply;
use crate::keen::registry::KeenBundle;
use pretty_assertions::assert_eq;
use serde_json::json;

fn block(action: &str, tool: &str, context: &str) -> String {
    format!(
        "<SYSTEM CALL>\n!*action\n{action}\n!*tool\n{tool}\n!*context\n{context}\n</SYSTEM CALL>"
    )
}

fn table() -> (tempfile::TempDir, ToolTable) {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |rel: &str, text: &str| {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("dir");
        }
        std::fs::write(path, text).expect("write");
    };
    write(
        "keen-tools.json",
        r#"[{"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "attempts": 2},
            {"name": "ToolTimestampScript", "type": "script", "entry": "tools/stamp.js", "attempts": 0},
            {"name": "Sensor", "type": "script", "entry": "tools/stamp.js"}]"#,
    );
    write(
        "tools/stamp.js",
        "exports.exec = (p, d) => { d.result = 'now'; };",
    );
    write(
        "flows/Next.json",
        r#"{"nodes": {"ToolCall": {"type": "start", "next": "done"}, "done": {"type": "end"}}}"#,
    );
    let bundle = KeenBundle::load(dir.path())
        .expect("valid")
        .expect("keen bundle");
    let mut table = ToolTable::from_bundle(Some(&bundle));
    table.add_native(
        "time_get_current_time",
        "Get the time.",
        "Pass a JSON object.",
    );
    (dir, table)
}

fn decide(run: &mut KeenRun, table: &ToolTable, reply: &str) -> Decision {
    run.decide(&parse_reply(reply), table)
}

#[track_caller]
fn assert_general(decision: Decision, log: &str) {
    assert_eq!(
        decision,
        Decision::Recall {
            prompt: GENERAL_FAILURE.to_string(),
            log: log.to_string()
        }
    );
}

#[test]
fn the_general_failure_sentence_is_word_for_word() {
    assert_eq!(
        GENERAL_FAILURE,
        "No tool response. The tool call could not be completed; check the call and try again, or tell the user it cannot run right now."
    );
}

#[test]
fn plain_answers_and_well_formed_calls() {
    let (_dir, table) = table();
    let mut run = KeenRun::new(50);
    assert_eq!(decide(&mut run, &table, "It is noon."), Decision::Answer);
    assert_eq!(
        decide(
            &mut run,
            &table,
            &format!(
                "Checking.\n{}",
                block("use tool flow", "ToolTimestamp", "tz=UTC")
            )
        ),
        Decision::Dispatch(ToolDispatch {
            tool: "ToolTimestamp".into(),
            kind: KeenToolKind::Flow,
            target: ToolTarget::Flow {
                controller: "Next".into(),
                start_node: "ToolCall".into()
            },
            context: "tz=UTC".into(),
            attempts_left: Some(2),
            narration: "Checking.".into(),
        })
    );
    assert_eq!(
        decide(
            &mut run,
            &table,
            &block("use tool", "Sensor", "sensorID=300")
        ),
        Decision::Dispatch(ToolDispatch {
            tool: "Sensor".into(),
            kind: KeenToolKind::Script,
            target: ToolTarget::Script {
                entry: "tools/stamp.js".into()
            },
            context: "sensorID=300".into(),
            attempts_left: None,
            narration: String::new(),
        })
    );
}

#[test]
fn every_failure_case_gets_the_general_sentence_and_a_log_line() {
    let (_dir, table) = table();
    let mut run = KeenRun::new(50);
    assert_general(
        decide(&mut run, &table, &format!("```\n{}\n```", block("use tool", "Sensor", ""))),
        "keen: malformed <SYSTEM CALL> at line 2: the <SYSTEM CALL> block is inside a code fence; write it without ``` around it",
    );
    assert_general(
        decide(&mut run, &table, &block("use tool", "sensor", "")),
        "keen: unknown tool \"sensor\"",
    );
    assert_general(
        decide(&mut run, &table, &block("use tool", "ToolTimestamp", "")),
        "keen: tool \"ToolTimestamp\" is a flow tool and is called with \"use tool flow\", not \"use tool\"",
    );
    assert_general(
        decide(&mut run, &table, &block("use tool flow", "Sensor", "")),
        "keen: tool \"Sensor\" is a script tool and is called with \"use tool\", not \"use tool flow\"",
    );
    assert_general(
        decide(&mut run, &table, &block("use tool flow", "time_get_current_time", "{}")),
        "keen: tool \"time_get_current_time\" is a native tool and is called with \"use tool\", not \"use tool flow\"",
    );
    // None of these spent an attempt: the one-shot tool still runs once.
    assert!(matches!(
        decide(
            &mut run,
            &table,
            &block("use tool", "ToolTimestampScript", "")
        ),
        Decision::Dispatch(ToolDispatch {
            attempts_left: Some(0),
            ..
        })
    ));
}

#[test]
fn an_invalid_script_path_is_caught_before_dispatch() {
    let mut table = ToolTable::new();
    table.tools.push(OfferedTool {
        spec: KeenToolSpec {
            name: "Evil".into(),
            kind: KeenToolKind::Script,
            description: String::new(),
            context_hint: String::new(),
            attempts: None,
        },
        target: ToolTarget::Script {
            entry: "tools/../../etc/passwd".into(),
        },
    });
    let mut run = KeenRun::new(5);
    assert_general(
        decide(&mut run, &table, &block("use tool", "Evil", "")),
        "keen: tool \"Evil\": script entry \"tools/../../etc/passwd\" must not contain ..",
    );
}

#[test]
fn attempts_allow_n_recalls_then_answer_attempts_0() {
    let (_dir, table) = table();
    let mut run = KeenRun::new(50);
    let call = block("use tool flow", "ToolTimestamp", "");
    let left = |d: Decision| match d {
        Decision::Dispatch(d) => d.attempts_left,
        other => panic!("expected a dispatch, got {other:?}"),
    };
    // attempts: 2 → the first call and two recalls, whatever their outcome.
    assert_eq!(left(decide(&mut run, &table, &call)), Some(2));
    assert_eq!(left(decide(&mut run, &table, &call)), Some(1));
    assert_eq!(left(decide(&mut run, &table, &call)), Some(0));
    let spent = Decision::Recall {
        prompt: "<SYSTEM RESPONSE>\nThis tool cannot be called again in this run.\nattempts 0\n</SYSTEM RESPONSE>".into(),
        log: "keen: tool \"ToolTimestamp\" has no attempts left (attempts: 2)".into(),
    };
    assert_eq!(decide(&mut run, &table, &call), spent);
    assert_eq!(decide(&mut run, &table, &call), spent);

    // attempts: 0 → one-shot.
    let one_shot = block("use tool", "ToolTimestampScript", "");
    assert_eq!(left(decide(&mut run, &table, &one_shot)), Some(0));
    assert!(
        matches!(decide(&mut run, &table, &one_shot), Decision::Recall { prompt, .. } if prompt.contains("attempts 0"))
    );

    // No attempts → no per-tool limit.
    for _ in 0..10 {
        assert_eq!(
            left(decide(&mut run, &table, &block("use tool", "Sensor", ""))),
            None
        );
    }
}

#[test]
fn the_run_wide_cap_stops_endless_loops() {
    let (_dir, table) = table();
    let mut run = KeenRun::new(3);
    let call = block("use tool", "Sensor", "");
    for _ in 0..2 {
        assert!(matches!(
            decide(&mut run, &table, &call),
            Decision::Dispatch(_)
        ));
    }
    // Malformed calls count too.
    assert!(matches!(
        decide(&mut run, &table, "<SYSTEM CALL>\n"),
        Decision::Recall { .. }
    ));
    assert_eq!(
        decide(&mut run, &table, &call),
        Decision::Stop {
            log: "keen: the run reached its cap of 3 tool calls".into()
        }
    );
    // A plain answer is still an answer.
    assert_eq!(decide(&mut run, &table, "Done."), Decision::Answer);
    assert_eq!(run.total_calls(), 3);
}

#[test]
fn native_tools_take_a_json_object() {
    let (_dir, table) = table();
    let mut run = KeenRun::new(50);
    let target = |d: Decision| match d {
        Decision::Dispatch(d) => d.target,
        other => panic!("expected a dispatch, got {other:?}"),
    };
    let args = |v: serde_json::Value| ToolTarget::Native {
        arguments: v.as_object().cloned().expect("object"),
    };
    assert_eq!(
        target(decide(
            &mut run,
            &table,
            &block(
                "use tool",
                "time_get_current_time",
                "{\"timezone\": \"Europe/Paris\"}"
            )
        )),
        args(json!({"timezone": "Europe/Paris"}))
    );
    assert_eq!(
        target(decide(
            &mut run,
            &table,
            &block("use tool", "time_get_current_time", "")
        )),
        args(json!({}))
    );
    for bad in ["timezone=Europe/Paris", "[1]", "\"x\"", "{oops"] {
        assert_eq!(
            decide(
                &mut run,
                &table,
                &block("use tool", "time_get_current_time", bad)
            ),
            Decision::Recall {
                prompt: format!(
                    "<SYSTEM RESPONSE>\n{NATIVE_CONTEXT_CORRECTION}\n</SYSTEM RESPONSE>"
                ),
                log: "keen: tool \"time_get_current_time\": !*context is not a JSON object".into(),
            },
            "context {bad:?}"
        );
    }
    // The prompt lists registry tools first, then natives; a clash keeps the registry tool.
    let mut table = table;
    table.add_native("Sensor", "an MCP tool with a clashing name", "");
    let names: Vec<String> = table.specs().into_iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "ToolTimestamp",
            "ToolTimestampScript",
            "Sensor",
            "time_get_current_time"
        ]
    );
}

#[test]
fn recall_prompts_are_exact() {
    #[track_caller]
    fn check(result: ToolResult, attempts: Option<u32>, expected: &str) {
        assert_eq!(recall_prompt(&result, attempts), expected);
    }
    check(
        ToolResult::Answer("The current timestamp is 2026-05-07T10:42:13Z".into()),
        None,
        "<SYSTEM RESPONSE>\nThe current timestamp is 2026-05-07T10:42:13Z\n</SYSTEM RESPONSE>",
    );
    check(
        ToolResult::Answer("You did not provide a sensorID. Please call again with !*context containing sensorID=<number>.".into()),
        Some(19),
        "<SYSTEM RESPONSE>\nYou did not provide a sensorID. Please call again with !*context containing sensorID=<number>.\nattempts 19\n</SYSTEM RESPONSE>",
    );
    check(
        ToolResult::ScriptError("Could not connect to sensor 300".into()),
        Some(3),
        "<SYSTEM SCRIPT ERROR>\nCould not connect to sensor 300\nattempts 3\n</SYSTEM SCRIPT ERROR>",
    );
    check(
        ToolResult::FlowError(r#"ScriptNode "compute-stamp" threw: ReferenceError: now is not defined"#.into()),
        None,
        "<SYSTEM FLOW ERROR>\nScriptNode \"compute-stamp\" threw: ReferenceError: now is not defined\n</SYSTEM FLOW ERROR>",
    );
    check(
        ToolResult::TechnicalError(TECHNICAL_ERROR_TEXT.into()),
        None,
        "<SYSTEM TECHNICAL ERROR>\nThe tool is unreachable right now.\n</SYSTEM TECHNICAL ERROR>",
    );
    // The general sentence is plain, quotes nothing, and carries no attempts line.
    check(
        ToolResult::NoResponse("the script threw: TypeError: secret value 42".into()),
        Some(2),
        GENERAL_FAILURE,
    );
}

#[test]
fn outcomes_map_to_results() {
    use crate::keen::flow::FlowOutcome;
    use crate::keen::script::ScriptOutcome;
    let ok = |result: Option<&str>, err: bool| ScriptOutcome::Ok {
        result: result.map(str::to_string),
        tool_status_error: err,
        dictionary: json!({}),
    };
    assert_eq!(
        ToolResult::from(ok(Some("r"), false)),
        ToolResult::Answer("r".into())
    );
    assert_eq!(
        ToolResult::from(ok(Some("down"), true)),
        ToolResult::ScriptError("down".into())
    );
    assert!(matches!(
        ToolResult::from(ok(None, false)),
        ToolResult::NoResponse(_)
    ));
    for failed in [
        ScriptOutcome::Threw("ReferenceError: x".into()),
        ScriptOutcome::TimedOut,
        ScriptOutcome::OutOfMemory,
        ScriptOutcome::BadEntry("tools/x.js".into()),
    ] {
        let result = ToolResult::from(failed);
        assert!(matches!(result, ToolResult::NoResponse(_)), "{result:?}");
        assert_eq!(recall_prompt(&result, Some(1)), GENERAL_FAILURE);
    }
    let node_failed = FlowOutcome::NodeFailed {
        node: "compute-stamp".into(),
        error: r#"ScriptNode "compute-stamp" threw: ReferenceError: now is not defined"#.into(),
    };
    assert_eq!(
        recall_prompt(&ToolResult::from(node_failed), None),
        "<SYSTEM FLOW ERROR>\nScriptNode \"compute-stamp\" threw: ReferenceError: now is not defined\n</SYSTEM FLOW ERROR>"
    );
    let done = |result: Option<&str>, err: bool| FlowOutcome::Done {
        result: result.map(str::to_string),
        tool_status_error: err,
        dictionary: json!({}),
    };
    assert_eq!(
        ToolResult::from(done(Some("2026"), false)),
        ToolResult::Answer("2026".into())
    );
    assert_eq!(
        ToolResult::from(done(Some("offline"), true)),
        ToolResult::FlowError("offline".into())
    );
    assert!(matches!(
        ToolResult::from(done(None, false)),
        ToolResult::NoResponse(_)
    ));
    assert!(matches!(
        ToolResult::from(FlowOutcome::BadEntry("x".into())),
        ToolResult::NoResponse(_)
    ));
}
