//! The run contract as its users rely on it: every kind round-trips through its wire form, old
//! logs are still read, unknown kinds are kept, and trace ids are W3C.

use pretty_assertions::assert_eq;
use serde_json::{json, Value};

use super::*;

#[track_caller]
fn roundtrip(kind: &str, json: Value) {
    let body = RunEventBody::from_parts(kind, json.clone()).expect("reads");
    let wire = RunEventBody::from_wire(kind, &json.to_string()).expect("reads from text");
    assert_eq!(
        wire, body,
        "{kind}: the one-pass read from text reads the same"
    );
    assert_eq!(body.kind(), kind);
    assert_eq!(body.to_json(), json, "{kind} writes back what it read");
    assert_eq!(
        body.to_json_string(),
        body.to_json().to_string(),
        "{kind}: the text written straight from the fields is the text of the value"
    );
}

#[test]
fn every_kind_round_trips_through_its_wire_form() {
    roundtrip(kind::MODEL_REQUESTED, json!({"turn": 1}));
    roundtrip(kind::MODEL_REQUESTED, json!({"flow_agent": true}));
    roundtrip(
        kind::MODEL_REQUESTED,
        json!({"turn": 3, "activity": "waiting for the model (openai gpt-4o)"}),
    );
    roundtrip(
        kind::MODEL_ANSWERED,
        json!({"turn": 2, "message": {"role": "assistant", "content": "hi"}, "usage": {"input_tokens": 3, "output_tokens": 4}, "stop_reason": "stop"}),
    );
    roundtrip(
        kind::TOOL_STARTED,
        json!({"call_id": "c1", "tool": "time.now", "model_name": "time_now", "side_effect": true, "span_id": "00f067aa0ba902b7"}),
    );
    roundtrip(
        kind::TOOL_STARTED,
        json!({"call_id": "keen_1", "tool": "Lookup", "side_effect": false, "kind": "script"}),
    );
    roundtrip(
        kind::TOOL_COMPLETED,
        json!({"call_id": "c1", "tool": "t", "result": "ok", "is_error": false, "duration_ms": 5}),
    );
    roundtrip(
        kind::TOOL_FAILED,
        json!({"call_id": "c1", "tool": "t", "error": "boom", "reason": "effect_unknown", "duration_ms": 0}),
    );
    roundtrip(kind::ACTIVITY, json!({"activity": "calling t"}));
    roundtrip(
        kind::TASK_PROGRESS,
        json!({"step": "reading", "done": 1, "total": 3}),
    );
    roundtrip(
        kind::ARTIFACT_SAVED,
        json!({"id": "sha256:ab", "name": "r", "media_type": "text/plain", "size": 2}),
    );
    roundtrip(
        kind::RUN_FINISHED,
        json!({"state": "succeeded", "result": "done", "response_type": "text"}),
    );
    roundtrip(kind::RUN_INTERRUPTED, json!({"reason": "instance died"}));
    roundtrip(
        kind::PROGRESS_LATEST,
        json!({"step": "page 2", "done": 2, "total": 3}),
    );
    roundtrip(
        kind::RUN_SUSPENDED,
        json!({"waiting_for": {"type": "approval", "call_id": "c1", "tool": "ws.run"},
               "deadline_ms": 5, "on_deadline": "no one decided"}),
    );
    roundtrip(
        kind::RUN_SUSPENDED,
        json!({"waiting_for": {"type": "child", "call_id": "c2", "task_id": "t-1"},
               "deadline_ms": 9, "on_deadline": "toolTimeout ran out"}),
    );
}

#[test]
fn the_events_that_say_what_a_task_is_doing_name_its_activity() {
    let activity = |kind: &str, json: Value| {
        RunEventBody::from_parts(kind, json)
            .expect("reads")
            .activity()
            .map(|a| a.into_owned())
    };
    assert_eq!(
        activity(kind::ACTIVITY, json!({"activity": "resuming at turn 3"})).as_deref(),
        Some("resuming at turn 3")
    );
    assert_eq!(
        activity(kind::MODEL_REQUESTED, json!({"turn": 1})).as_deref(),
        Some("waiting for the model")
    );
    assert_eq!(
        activity(
            kind::MODEL_REQUESTED,
            json!({"turn": 2, "activity": "reading the result of Lookup"})
        )
        .as_deref(),
        Some("reading the result of Lookup")
    );
    assert_eq!(
        activity(kind::MODEL_ANSWERED, json!({"turn": 1})).as_deref(),
        Some("thinking")
    );
    assert_eq!(
        activity(
            kind::TOOL_STARTED,
            json!({"call_id": "c1", "tool": "ws.write", "side_effect": true})
        )
        .as_deref(),
        Some("calling ws.write")
    );
    assert_eq!(
        activity(
            kind::TOOL_COMPLETED,
            json!({"call_id": "c1", "tool": "t", "result": "ok", "is_error": false})
        ),
        None,
        "an event that does not say leaves the activity as it was"
    );
}

#[test]
fn an_unknown_kind_is_kept_and_a_known_kind_with_wrong_fields_is_an_error() {
    let log = RunEventBody::from_parts("log", json!({"a": 1})).expect("unknown kinds are kept");
    assert_eq!((log.kind(), log.to_json()), ("log", json!({"a": 1})));
    let err = RunEventBody::from_parts(kind::TOOL_STARTED, json!({"tool": 3}))
        .expect_err("tool.started needs a call id");
    assert!(err.to_string().contains("tool.started"), "{err}");
    let lossy = RunEventBody::from_wire_lossy(kind::TOOL_STARTED, "not json");
    assert_eq!(lossy.kind(), kind::TOOL_STARTED);
    // From text, the same errors: not JSON, and JSON that is not the kind's fields.
    let not_json =
        RunEventBody::from_wire(kind::TOOL_STARTED, "{\"call_id\": ").expect_err("cut JSON");
    assert!(not_json.to_string().contains("not JSON"), "{not_json}");
    let wrong = RunEventBody::from_wire(kind::TOOL_STARTED, r#"{"tool": 3}"#)
        .expect_err("tool.started needs a call id");
    assert!(
        wrong.to_string().contains("not those of tool.started"),
        "{wrong}"
    );
    // An empty or null body of a known kind is its empty fields.
    for empty in ["", "  ", "null"] {
        assert_eq!(
            RunEventBody::from_wire(kind::MODEL_REQUESTED, empty).expect("empty fields"),
            RunEventBody::from_parts(kind::MODEL_REQUESTED, Value::Null).expect("empty fields")
        );
    }
}

#[test]
fn a_model_given_progress_with_odd_fields_still_reads() {
    let body = RunEventBody::from_parts(
        kind::TASK_PROGRESS,
        json!({"step": "x", "done": "three", "artifacts": "sha256:1"}),
    )
    .expect("reads");
    let RunEventBody::TaskProgress(p) = body else {
        panic!("progress")
    };
    assert_eq!((p.step.as_str(), p.done, p.artifacts.len()), ("x", None, 0));
}

#[test]
fn the_replay_in_an_assignment_reads_json_values_and_json_strings() {
    let got = wire::replay(
        r#"[{"kind":"model.requested","json":{"turn":1}},{"kind":"log","json":"{\"a\":2}"},{"seq":3,"kind":"activity","json":"{\"activity\":\"x\"}"},{"nokind":1}]"#,
    );
    let kinds: Vec<(&str, Value)> = got.iter().map(|b| (b.kind(), b.to_json())).collect();
    assert_eq!(
        kinds,
        vec![
            ("model.requested", json!({"turn": 1})),
            ("log", json!({"a": 2})),
            ("activity", json!({"activity": "x"})),
        ]
    );
    let back = wire::replay(&wire::replay_to_wire(&got));
    assert_eq!(back, got);
    assert_eq!(
        wire::history(r#"[{"role":"user","content":"hi"},{"x":1}]"#),
        vec![Message::user("hi")]
    );
}

#[test]
fn run_logs_written_before_the_typed_contract_are_still_read() {
    // Run logs written by the harness before this module existed (its test runs, both
    // dialects, resumes, cancels), one `{"kind", "json"}` per line; the last line is an
    // `artifact.saved` in the shape that version wrote.
    let fixture = include_str!("fixtures/run-logs-v0.jsonl");
    let mut kinds = std::collections::BTreeSet::new();
    for (i, line) in fixture.lines().enumerate() {
        let v: Value = serde_json::from_str(line).expect("fixture line is JSON");
        let kind = v["kind"].as_str().expect("fixture line has a kind");
        let body = RunEventBody::from_parts(kind, v["json"].clone())
            .unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        let from_text = RunEventBody::from_wire(kind, &v["json"].to_string())
            .unwrap_or_else(|e| panic!("line {}, from text: {e}", i + 1));
        assert_eq!(from_text, body, "line {}: the one-pass read differs", i + 1);
        assert_eq!(
            body.to_json_string(),
            body.to_json().to_string(),
            "line {}: the text written straight from the fields differs",
            i + 1
        );
        assert!(
            !matches!(body, RunEventBody::Unknown(_)),
            "line {}: {kind} read as unknown",
            i + 1
        );
        kinds.insert(body.kind().to_string());
    }
    for k in [
        kind::MODEL_REQUESTED,
        kind::MODEL_ANSWERED,
        kind::TOOL_STARTED,
        kind::TOOL_COMPLETED,
        kind::TOOL_FAILED,
        kind::ACTIVITY,
        kind::TASK_PROGRESS,
        kind::ARTIFACT_SAVED,
        kind::RUN_FINISHED,
    ] {
        assert!(kinds.contains(k), "the fixture has a {k} event");
    }
}

#[test]
fn trace_and_span_ids_are_w3c_and_stable_across_attempts() {
    let is_hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let t = trace::trace_id("run-1");
    assert!(is_hex(&t, 32), "{t}");
    assert_eq!(
        t,
        trace::trace_id("run-1"),
        "every attempt is in the run's trace"
    );
    assert_ne!(t, trace::trace_id("run-2"));
    let s1 = trace::tool_span_id("run-1", 1, "c1");
    assert!(is_hex(&s1, 16), "{s1}");
    assert_ne!(s1, trace::tool_span_id("run-1", 2, "c1"));
    assert_ne!(s1, trace::run_span_id("run-1", 1));
    assert_eq!(trace::traceparent(&t, &s1), format!("00-{t}-{s1}-01"));
}
