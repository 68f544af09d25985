//! A task's trace, built from its run log: a root span for the run, one span per model turn
//! (`model.requested` → `model.answered`) and one per tool call (`tool.started` →
//! `tool.completed`/`tool.failed`, matched by call id), and one per approval
//! (`approval.requested` → `approval.decided`, with `approved`, `by` and `reason`). Ids are W3C and derived exactly as the
//! harness derives them (`agen_contract::run::trace`), so the `traceparent` a tool server received
//! names its span here.

use std::collections::{BTreeMap, HashMap, VecDeque};

use agen_contract::run::{kind, trace, RunEventBody, ToolFailure};

use crate::model::{RunEventRec, TaskRec};

/// One span of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRec {
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub status: String,
    pub attributes: BTreeMap<String, String>,
}

/// The run's trace id (every attempt is in one trace): the caller's when it submitted the task
/// with a traceparent, else derived from the run id.
pub fn trace_id(task: &TaskRec) -> String {
    match parse_traceparent(&task.traceparent) {
        Some((trace_id, _)) => trace_id,
        None => trace::trace_id(&task.run_id),
    }
}

/// The trace id and span id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, lower
/// case, ids not all zeros); `None` when it is not one.
pub fn parse_traceparent(s: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = s.trim().split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match parts.as_slice() {
        [v, t, p, f]
            if hex(v, 2)
                && *v != "ff"
                && hex(t, 32)
                && hex(p, 16)
                && hex(f, 2)
                && t.bytes().any(|b| b != b'0')
                && p.bytes().any(|b| b != b'0') =>
        {
            Some((t.to_string(), p.to_string()))
        }
        _ => None,
    }
}

/// What a trace's root span is made of: a Hub task, or a local run of `agen run`.
#[derive(Debug, Clone, Default)]
pub struct RunRoot {
    pub run_id: String,
    pub task_id: String,
    pub deployment: String,
    /// The caller's W3C traceparent (empty: none).
    pub traceparent: String,
    pub start_ms: i64,
    /// 0 while it goes on: the root ends at the last event.
    pub finished_at_ms: i64,
    pub state: String,
    /// The run has ended: a span still open then is `unfinished`.
    pub terminal: bool,
    pub attempt: u32,
}

/// Whether `s` is an approval's wait (`approval {tool}`), not the call itself.
pub fn is_approval(s: &SpanRec) -> bool {
    s.attributes.contains_key("call_id") && s.name.starts_with("approval ")
}

/// The deployment of a task's root span (`task {deployment}`); `None` for any other span.
pub fn root_deployment(s: &SpanRec) -> Option<&str> {
    if s.attributes.contains_key("task_id") {
        s.name.strip_prefix("task ")
    } else {
        None
    }
}

/// The event kinds that open or close a span; [`build_run_spans`] decodes no other.
const SPAN_KINDS: [&str; 7] = [
    kind::MODEL_REQUESTED,
    kind::MODEL_ANSWERED,
    kind::TOOL_STARTED,
    kind::TOOL_COMPLETED,
    kind::TOOL_FAILED,
    kind::APPROVAL_REQUESTED,
    kind::APPROVAL_DECIDED,
];

/// Builds the spans of `task` from its run events, in log order.
pub fn build_spans(task: &TaskRec, events: &[RunEventRec]) -> Vec<SpanRec> {
    let root = RunRoot {
        run_id: task.run_id.clone(),
        task_id: task.task_id.clone(),
        deployment: task.deployment.clone(),
        traceparent: task.traceparent.clone(),
        start_ms: if task.started_at_ms > 0 {
            task.started_at_ms
        } else {
            task.created_at_ms
        },
        finished_at_ms: task.finished_at_ms,
        state: task.state.as_str().to_string(),
        terminal: task.state.is_terminal(),
        attempt: task.attempt,
    };
    build_run_spans(&root, events)
}

/// Builds the spans of the run `task` describes from its events, in log order.
pub fn build_run_spans(task: &RunRoot, events: &[RunEventRec]) -> Vec<SpanRec> {
    let root_id = trace::run_span_id(&task.run_id, 0);
    let end = if task.finished_at_ms > 0 {
        task.finished_at_ms
    } else {
        events.last().map(|e| e.at_ms).unwrap_or(0)
    };
    let mut spans = vec![SpanRec {
        span_id: root_id.clone(),
        parent_span_id: parse_traceparent(&task.traceparent)
            .map(|(_, span)| span)
            .unwrap_or_default(),
        name: format!("task {}", task.deployment),
        start_ms: task.start_ms,
        end_ms: end,
        status: task.state.clone(),
        attributes: BTreeMap::from([
            ("task_id".to_string(), task.task_id.clone()),
            ("run_id".to_string(), task.run_id.clone()),
            ("attempt".to_string(), task.attempt.to_string()),
        ]),
    }];
    let mut open_model: Option<usize> = None;
    // One pass over the log: open calls by call id, oldest first (a turn may open a thousand
    // at once; a call id started twice is closed in the order it was started).
    let mut open_tools: HashMap<String, VecDeque<usize>> = HashMap::new();
    let mut approval_spans: BTreeMap<String, usize> = BTreeMap::new();
    let mut turn = 0;
    for e in events {
        // Only these kinds make or end a span: the rest are not decoded at all.
        if !SPAN_KINDS.contains(&e.kind.as_str()) {
            continue;
        }
        match RunEventBody::from_wire_lossy(&e.kind, &e.json) {
            RunEventBody::ModelRequested(r) => {
                turn += 1;
                let key = r
                    .turn
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| format!("seq-{}", e.seq));
                spans.push(SpanRec {
                    span_id: trace::model_span_id(&e.run_id, e.attempt, &key),
                    parent_span_id: root_id.clone(),
                    name: if r.flow_agent {
                        "flow agent".to_string()
                    } else {
                        format!("model turn {turn}")
                    },
                    start_ms: e.at_ms,
                    end_ms: 0,
                    status: "running".into(),
                    attributes: BTreeMap::from([("attempt".to_string(), e.attempt.to_string())]),
                });
                open_model = Some(spans.len() - 1);
            }
            RunEventBody::ModelAnswered(a) => {
                if let Some(i) = open_model.take() {
                    spans[i].end_ms = e.at_ms;
                    spans[i].status = if a.error.is_some() { "error" } else { "ok" }.into();
                    if let Some(u) = a.usage {
                        spans[i]
                            .attributes
                            .insert("input_tokens".into(), u.input_tokens.to_string());
                        spans[i]
                            .attributes
                            .insert("output_tokens".into(), u.output_tokens.to_string());
                    }
                    for (key, value) in [
                        ("response_id", a.response_id),
                        ("response_model", a.response_model),
                        ("finish_reason", a.stop_reason),
                    ] {
                        if let Some(v) = value.filter(|v| !v.is_empty()) {
                            spans[i].attributes.insert(key.into(), v);
                        }
                    }
                }
            }
            RunEventBody::ToolStarted(s) => {
                let mut attributes = BTreeMap::from([
                    ("tool".to_string(), s.tool.clone()),
                    ("call_id".to_string(), s.call_id.clone()),
                    ("attempt".to_string(), e.attempt.to_string()),
                ]);
                if let Some(args) = &s.arguments {
                    attributes.insert("arguments".into(), args.to_string());
                }
                spans.push(SpanRec {
                    span_id: s
                        .span_id
                        .clone()
                        .unwrap_or_else(|| trace::tool_span_id(&e.run_id, e.attempt, &s.call_id)),
                    parent_span_id: root_id.clone(),
                    name: format!("tool {}", s.tool),
                    start_ms: e.at_ms,
                    end_ms: 0,
                    status: "running".into(),
                    attributes,
                });
                open_tools
                    .entry(s.call_id)
                    .or_default()
                    .push_back(spans.len() - 1);
            }
            RunEventBody::ToolCompleted(c) => {
                let closed =
                    close_tool(&mut spans, &mut open_tools, &c.call_id, e.at_ms, c.is_error);
                if !closed {
                    spans.push(unstarted_tool_span(
                        e,
                        &root_id,
                        &c.call_id,
                        &c.tool,
                        c.duration_ms,
                        c.is_error,
                        None,
                    ));
                }
            }
            RunEventBody::ToolFailed(f) => {
                let reason = serde_json::to_value(f.reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                if let Some(&i) = open_tools.get(&f.call_id).and_then(|q| q.front()) {
                    spans[i].attributes.insert("reason".into(), reason);
                    close_tool(&mut spans, &mut open_tools, &f.call_id, e.at_ms, true);
                } else if f.reason == ToolFailure::Denied && approval_spans.contains_key(&f.call_id)
                {
                    // A call denied at its approval: the approval span says so.
                } else {
                    // Never started (denied by permissions, an unknown tool, bad arguments):
                    // a span of its own all the same.
                    spans.push(unstarted_tool_span(
                        e,
                        &root_id,
                        &f.call_id,
                        &f.tool,
                        f.duration_ms,
                        true,
                        Some(reason),
                    ));
                }
            }
            // A resumed attempt asks again about a call it asked about before: the same wait,
            // one span.
            RunEventBody::ApprovalRequested(r) if approval_spans.contains_key(&r.call_id) => {}
            RunEventBody::ApprovalRequested(r) => {
                spans.push(SpanRec {
                    span_id: trace::tool_span_id(
                        &e.run_id,
                        e.attempt,
                        &format!("approval {}", r.call_id),
                    ),
                    parent_span_id: root_id.clone(),
                    name: format!("approval {}", r.tool),
                    start_ms: e.at_ms,
                    end_ms: 0,
                    status: "running".into(),
                    attributes: BTreeMap::from([
                        ("tool".to_string(), r.tool.clone()),
                        ("call_id".to_string(), r.call_id.clone()),
                        ("attempt".to_string(), e.attempt.to_string()),
                    ]),
                });
                approval_spans.insert(r.call_id, spans.len() - 1);
            }
            RunEventBody::ApprovalDecided(d) => {
                if let Some(&i) = approval_spans.get(&d.call_id) {
                    let span = &mut spans[i];
                    span.end_ms = e.at_ms;
                    span.status = if d.approved { "ok" } else { "denied" }.into();
                    span.attributes
                        .insert("approved".into(), d.approved.to_string());
                    span.attributes.insert("by".into(), d.by.clone());
                    if !d.reason.is_empty() {
                        span.attributes.insert("reason".into(), d.reason.clone());
                    }
                    if let Some(a) = &d.arguments {
                        span.attributes
                            .insert("edited_arguments".into(), a.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    for s in spans.iter_mut() {
        if s.end_ms == 0 {
            s.end_ms = end.max(s.start_ms);
            if s.status == "running" && task.terminal {
                s.status = "unfinished".into();
            }
        }
    }
    spans
}

/// Ends the open span of `call_id`; false when none is open.
fn close_tool(
    spans: &mut [SpanRec],
    open: &mut HashMap<String, VecDeque<usize>>,
    call_id: &str,
    at_ms: i64,
    error: bool,
) -> bool {
    let Some(i) = open.get_mut(call_id).and_then(VecDeque::pop_front) else {
        return false;
    };
    spans[i].end_ms = at_ms;
    spans[i].status = if error { "error" } else { "ok" }.into();
    true
}

/// The span of a call whose end is in the log without its start (it was never sent).
fn unstarted_tool_span(
    e: &RunEventRec,
    root_id: &str,
    call_id: &str,
    tool: &str,
    duration_ms: u64,
    error: bool,
    reason: Option<String>,
) -> SpanRec {
    let mut attributes = BTreeMap::from([
        ("tool".to_string(), tool.to_string()),
        ("call_id".to_string(), call_id.to_string()),
        ("attempt".to_string(), e.attempt.to_string()),
    ]);
    if let Some(r) = reason {
        attributes.insert("reason".into(), r);
    }
    SpanRec {
        span_id: trace::tool_span_id(&e.run_id, e.attempt, call_id),
        parent_span_id: root_id.to_string(),
        name: format!("tool {tool}"),
        start_ms: e.at_ms - i64::try_from(duration_ms).unwrap_or(0),
        end_ms: e.at_ms,
        status: if error { "error" } else { "ok" }.into(),
        attributes,
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn ev(seq: u64, kind: &str, json: serde_json::Value) -> RunEventRec {
        RunEventRec {
            run_id: "run-1".into(),
            attempt: 1,
            seq,
            task_id: "task-1".into(),
            at_ms: seq as i64 * 10,
            kind: kind.into(),
            json: json.to_string(),
        }
    }

    fn task() -> TaskRec {
        TaskRec::example()
    }

    #[test]
    fn spans_pair_model_turns_and_tool_calls_by_call_id() {
        let events = [
            ev(1, "model.requested", serde_json::json!({"turn": 1})),
            ev(2, "model.answered", serde_json::json!({"turn": 1})),
            ev(
                3,
                "tool.started",
                serde_json::json!({"call_id": "a", "tool": "time.now"}),
            ),
            ev(
                4,
                "tool.started",
                serde_json::json!({"call_id": "b", "tool": "files.read"}),
            ),
            ev(
                5,
                "tool.failed",
                serde_json::json!({"call_id": "b", "tool": "files.read"}),
            ),
            ev(
                6,
                "tool.completed",
                serde_json::json!({"call_id": "a", "tool": "time.now"}),
            ),
            ev(
                7,
                "tool.started",
                serde_json::json!({"call_id": "c", "tool": "x.y"}),
            ),
            ev(
                8,
                "tool.completed",
                serde_json::json!({"call_id": "c", "tool": "x.y", "is_error": true}),
            ),
            ev(9, "model.requested", serde_json::json!({"turn": 2})),
        ];
        let got: Vec<(String, i64, i64, String)> = build_spans(&task(), &events)
            .into_iter()
            .map(|s| (s.name, s.start_ms, s.end_ms, s.status))
            .collect();
        let expected = [
            ("task hello", 5, 100, "failed"),
            ("model turn 1", 10, 20, "ok"),
            ("tool time.now", 30, 60, "ok"),
            ("tool files.read", 40, 50, "error"),
            ("tool x.y", 70, 80, "error"),
            ("model turn 2", 90, 100, "unfinished"),
        ];
        let expected: Vec<(String, i64, i64, String)> = expected
            .iter()
            .map(|(n, a, b, s)| (n.to_string(), *a, *b, s.to_string()))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn an_approval_span_says_who_decided() {
        let events = [
            ev(
                1,
                "approval.requested",
                serde_json::json!({"call_id": "a", "tool": "ws.run", "arguments": {}}),
            ),
            ev(
                2,
                "approval.decided",
                serde_json::json!({"call_id": "a", "approved": false, "reason": "not today", "by": "release-bot"}),
            ),
        ];
        let spans = build_spans(&task(), &events);
        let s = &spans[1];
        assert_eq!(
            (s.name.as_str(), s.start_ms, s.end_ms),
            ("approval ws.run", 10, 20)
        );
        assert_eq!(
            (
                s.attributes.get("approved").map(String::as_str),
                s.attributes.get("by").map(String::as_str),
                s.attributes.get("reason").map(String::as_str)
            ),
            (Some("false"), Some("release-bot"), Some("not today"))
        );
    }

    #[test]
    fn calls_never_started_get_spans_and_a_repeated_approval_request_is_one_span() {
        let events = [
            ev(
                1,
                "tool.failed",
                serde_json::json!({"call_id": "a", "tool": "ws.write", "reason": "denied", "error": "no"}),
            ),
            ev(
                2,
                "tool.failed",
                serde_json::json!({"call_id": "b", "tool": "nosuch", "reason": "unknown_tool", "error": "no"}),
            ),
            ev(
                3,
                "approval.requested",
                serde_json::json!({"call_id": "c", "tool": "ws.run", "arguments": {}}),
            ),
            ev(
                4,
                "approval.requested",
                serde_json::json!({"call_id": "c", "tool": "ws.run", "arguments": {}}),
            ),
            ev(
                5,
                "approval.decided",
                serde_json::json!({"call_id": "c", "approved": false, "reason": "no", "by": "ann"}),
            ),
            ev(
                6,
                "tool.failed",
                serde_json::json!({"call_id": "c", "tool": "ws.run", "reason": "denied", "error": "no"}),
            ),
        ];
        let got: Vec<(String, String, Option<String>)> = build_spans(&task(), &events)
            .into_iter()
            .skip(1)
            .map(|s| (s.name, s.status, s.attributes.get("reason").cloned()))
            .collect();
        let expected = vec![
            (
                "tool ws.write".into(),
                "error".into(),
                Some("denied".into()),
            ),
            (
                "tool nosuch".into(),
                "error".into(),
                Some("unknown_tool".into()),
            ),
            ("approval ws.run".into(), "denied".into(), Some("no".into())),
        ];
        assert_eq!(got, expected);
    }

    #[test]
    fn a_tool_span_is_the_one_its_traceparent_named() {
        let events = [ev(
            1,
            "tool.started",
            serde_json::json!({"call_id": "a", "tool": "time.now"}),
        )];
        let spans = build_spans(&task(), &events);
        assert_eq!(spans[1].span_id, trace::tool_span_id("run-1", 1, "a"));
        assert_eq!(spans[1].parent_span_id, spans[0].span_id);
        assert_eq!(trace_id(&task()).len(), 32);
    }

    #[test]
    fn a_callers_traceparent_names_the_trace_and_the_run_spans_parent() {
        let mut t = task();
        t.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into();
        assert_eq!(trace_id(&t), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(build_spans(&t, &[])[0].parent_span_id, "00f067aa0ba902b7");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
