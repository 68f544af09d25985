//! `agen trace TASK --events`: the task's history, Temporal-style, one line per event from
//! `WatchTask`: state changes, each turn's model answer and tokens, each tool call with its
//! arguments (when the bundle records them) and result, retries (`run.interrupted`, a new
//! attempt), approvals, artifacts, progress, the run's end. Follows a task still running.
//! `-o json` (or yaml): one JSON object per event and line, as it arrives: `seq`, `at`,
//! `attempt`, `kind`, `details` (the table's text) and `body` (the event's own JSON).

use agen_contract::run::{Message, RunEventBody};
use agen_proto::v1 as pb;

use crate::client::{status_error, Hub, Output};

/// Longest shown argument or result text before it is cut.
const SHOW: usize = 200;

/// Prints every event of `task`, following until the task ends.
pub async fn print(hub: &mut Hub, task: &str, output: Output) -> anyhow::Result<i32> {
    let mut stream = hub
        .client
        .watch_task(pb::WatchTaskRequest {
            namespace: hub.namespace.clone(),
            task_id: task.to_string(),
            from_seq: 0,
            deltas: false,
        })
        .await
        .map_err(|s| status_error(hub, s))?
        .into_inner();
    let mut table = crate::view::table(&["SEQ", "TIME", "EVENT", "DETAILS"]);
    let mut attempt = 0;
    loop {
        let e = match stream.message().await {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(s) => return Err(status_error(hub, s)),
        };
        let now = e.task.as_ref().map(|t| t.attempt).unwrap_or(0);
        if now > attempt && attempt > 0 {
            table.add_row(vec![
                String::new(),
                String::new(),
                "attempt".into(),
                format!("attempt {now} starts (a retry: the run resumes from its log)"),
            ]);
        }
        attempt = attempt.max(now);
        let at = crate::view::time(e.at_ms);
        if output != Output::Table {
            let body: serde_json::Value =
                serde_json::from_str(&e.json).unwrap_or(serde_json::Value::Null);
            let line = serde_json::json!({
                "seq": e.seq,
                "at": at,
                "attempt": now,
                "kind": e.kind,
                "details": describe(&e.kind, &e.json),
                "body": body,
            });
            crate::outln!("{line}");
            continue;
        }
        table.add_row(vec![
            e.seq.to_string(),
            at.as_str().unwrap_or("-").to_string(),
            e.kind.clone(),
            describe(&e.kind, &e.json),
        ]);
    }
    if output == Output::Table {
        crate::outln!("{table}");
    }
    Ok(0)
}

/// The Hub's `task.state` event body.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct TaskState {
    state: String,
    message: String,
    error: String,
}

/// One event's details.
pub fn describe(kind: &str, json: &str) -> String {
    if kind == "task.state" {
        let s: TaskState = serde_json::from_str(json).unwrap_or_default();
        let why = if s.error.is_empty() {
            s.message
        } else {
            s.error
        };
        return match why.as_str() {
            "" => s.state,
            w if w == s.state => s.state,
            w => format!("{}: {}", s.state, cut(w)),
        };
    }
    match RunEventBody::from_wire_lossy(kind, json) {
        RunEventBody::ModelRequested(r) => match (r.turn, &r.activity) {
            (Some(t), Some(a)) => format!("turn {t}: {}", cut(a)),
            (Some(t), None) => format!("turn {t}"),
            (None, Some(a)) => cut(a),
            (None, None) => String::new(),
        },
        RunEventBody::ModelAnswered(a) => {
            let mut out = a.turn.map(|t| format!("turn {t}")).unwrap_or_default();
            if let Some(u) = a.usage {
                out.push_str(&format!(
                    ", tokens {} in / {} out",
                    u.input_tokens, u.output_tokens
                ));
            }
            if let Some(Message::Assistant {
                content,
                tool_calls,
            }) = &a.message
            {
                if !tool_calls.is_empty() {
                    let names: Vec<&str> = tool_calls.iter().map(|c| c.name.as_str()).collect();
                    out.push_str(&format!(", calls {}", names.join(", ")));
                }
                if !content.is_empty() {
                    out.push_str(&format!(": {}", cut(content)));
                }
            }
            if let Some(err) = a.error {
                out.push_str(&format!(", error: {}", cut(&err)));
            }
            out.trim_start_matches(", ").to_string()
        }
        RunEventBody::ToolStarted(s) => {
            let mut out = format!("{} (call {})", s.tool, s.call_id);
            if let Some(args) = s.arguments {
                out.push_str(&format!(" arguments {}", cut(&args.to_string())));
            }
            out
        }
        RunEventBody::ToolCompleted(c) => format!(
            "{} {} in {} ms: {}",
            c.tool,
            if c.is_error { "isError" } else { "ok" },
            c.duration_ms,
            cut(&c.result)
        ),
        RunEventBody::ToolFailed(f) => format!(
            "{} {} after {} ms: {}",
            f.tool,
            f.reason.as_str(),
            f.duration_ms,
            cut(&f.error)
        ),
        RunEventBody::Activity(a) => cut(&a.activity),
        RunEventBody::TaskProgress(p) | RunEventBody::ProgressLatest(p) => cut(&p.step),
        RunEventBody::ArtifactSaved(a) => format!("{} {} ({} bytes)", a.name, a.id, a.size),
        RunEventBody::RunFinished(f) => format!("{}: {}", f.state.as_str(), cut(&f.result)),
        RunEventBody::RunInterrupted(i) => {
            format!("{} ({}): a new attempt resumes the run", i.reason, i.cause)
        }
        RunEventBody::ApprovalRequested(a) => {
            format!(
                "{} {} asks: {}",
                a.tool,
                a.call_id,
                cut(&compact(&a.arguments))
            )
        }
        RunEventBody::RunSuspended(s) => {
            let what = match &s.waiting_for {
                agen_contract::run::WaitingFor::Approval { call_id, tool } => {
                    format!("approval of {tool} {call_id}")
                }
                agen_contract::run::WaitingFor::Child { call_id, task_id } => {
                    format!("task {task_id} (call {call_id})")
                }
            };
            format!("waits for {what} without its slot; resumed when it is there")
        }
        RunEventBody::RemoteTaskStarted(r) => format!(
            "{} (call {}): remote A2A task {} at {}",
            r.agent, r.call_id, r.task_id, r.endpoint
        ),
        RunEventBody::ApprovalDecided(d) => format!(
            "{} {} by {}{}{}",
            d.call_id,
            if d.approved { "approved" } else { "denied" },
            d.by,
            if d.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", cut(&d.reason))
            },
            match &d.arguments {
                Some(a) => format!(" with edited arguments {}", cut(&compact(a))),
                None => String::new(),
            }
        ),
        RunEventBody::Unknown(u) => cut(&compact(&u.json)),
    }
}

fn compact(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) if m.len() == 1 => match m.values().next() {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ => v.to_string(),
        },
        serde_json::Value::Null => String::new(),
        _ => v.to_string(),
    }
}

fn cut(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.len() <= SHOW {
        return s;
    }
    let mut end = SHOW;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(kind: &str, json: &str, expected: &str) {
        assert_eq!(describe(kind, json), expected);
    }

    #[test]
    fn events_read_like_a_history() {
        check("model.requested", r#"{"turn":1}"#, "turn 1");
        check(
            "model.requested",
            r#"{"turn":2,"activity":"waiting for the model (openai gpt-4o)"}"#,
            "turn 2: waiting for the model (openai gpt-4o)",
        );
        check(
            "model.answered",
            r#"{"turn":1,"usage":{"input_tokens":12,"output_tokens":3},"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"save_artifact","arguments":{}}]}}"#,
            "turn 1, tokens 12 in / 3 out, calls save_artifact",
        );
        check(
            "tool.started",
            r#"{"call_id":"c1","tool":"crm.lookup","arguments":{"id":7}}"#,
            r#"crm.lookup (call c1) arguments {"id":7}"#,
        );
        check(
            "tool.completed",
            r#"{"call_id":"c1","tool":"crm.lookup","result":"nope","is_error":true,"duration_ms":5}"#,
            "crm.lookup isError in 5 ms: nope",
        );
        check(
            "task.state",
            r#"{"state":"queued","message":"queued"}"#,
            "queued",
        );
        check(
            "task.state",
            r#"{"state":"running","message":"starting on instance i-1"}"#,
            "running: starting on instance i-1",
        );
    }
}
