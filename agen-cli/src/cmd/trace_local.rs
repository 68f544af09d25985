//! `agen trace --local RUN [--events]`: the trace (or the event history) of a run of `agen run`,
//! read from its local run log: the same spans the Hub builds for a task
//! (`agen_hub::trace::build_run_spans`), the same event lines as `agen trace --events`.

use agen_contract::run::trace;
use agen_harness::local_runs::{self, LocalRun, LocalRunState};
use agen_hub::model::RunEventRec;
use agen_hub::trace::{build_run_spans, RunRoot};
use agen_proto::v1 as pb;

use crate::client::Output;

/// Prints the trace (or, with `events`, every event) of local run `run_id`; exit 4 when there is
/// no such run, 2 when it is still running.
pub fn print(run_id: &str, events: bool, output: Output) -> anyhow::Result<i32> {
    let root = local_runs::default_root();
    let run = match local_runs::read(&root, run_id) {
        Ok(Some(r)) => r,
        Ok(None) => {
            eprintln!(
                "error: run {run_id} is not in the run logs in {}; `agen runs` lists them",
                root.display()
            );
            return Ok(crate::exit::code::NOT_FOUND);
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            return Ok(crate::exit::code::USAGE);
        }
    };
    if run.state == LocalRunState::Running {
        eprintln!(
            "error: run {run_id} is still running (its log {} is open); trace it once it ends",
            run.dir.display()
        );
        return Ok(crate::exit::code::USAGE);
    }
    let recs = records(&run);
    if events {
        print_events(&recs, output);
        return Ok(0);
    }
    let a = run.assignment.as_ref();
    let root = RunRoot {
        run_id: run.run_id.clone(),
        task_id: run.run_id.clone(),
        deployment: a.map(|a| a.deployment.clone()).unwrap_or_default(),
        traceparent: String::new(),
        start_ms: recs.first().map(|r| r.at_ms).unwrap_or(0),
        finished_at_ms: match run.state {
            LocalRunState::Finished(_) => recs.last().map(|r| r.at_ms).unwrap_or(0),
            _ => 0,
        },
        state: run.state.as_str().to_string(),
        terminal: true,
        attempt: run.attempts(),
    };
    let spans = build_run_spans(&root, &recs)
        .into_iter()
        .map(|s| pb::Span {
            span_id: s.span_id,
            parent_span_id: s.parent_span_id,
            name: s.name,
            start_ms: s.start_ms,
            end_ms: s.end_ms,
            status: s.status,
            attributes: s.attributes.into_iter().collect(),
        })
        .collect();
    let t = pb::Trace {
        task_id: run.run_id.clone(),
        trace_id: trace::trace_id(&run.run_id),
        spans,
    };
    super::trace_tree::print(&t, output);
    Ok(0)
}

/// The log's events as the Hub keeps them (kind, JSON, time in ms).
fn records(run: &LocalRun) -> Vec<RunEventRec> {
    run.records
        .iter()
        .map(|r| RunEventRec {
            run_id: run.run_id.clone(),
            attempt: r.attempt,
            seq: r.seq,
            task_id: run.run_id.clone(),
            at_ms: chrono::DateTime::parse_from_rfc3339(&r.at)
                .map(|t| t.timestamp_millis())
                .unwrap_or(0),
            kind: r.body.kind().to_string(),
            json: r.body.to_json_string(),
        })
        .collect()
}

/// One line per event, as `agen trace --events` prints a task's (attempt, seq, time, kind,
/// details; `-o json`: one JSON object per line).
fn print_events(recs: &[RunEventRec], output: Output) {
    let mut table = crate::view::table(&["ATTEMPT", "SEQ", "TIME", "EVENT", "DETAILS"]);
    for e in recs {
        let at = crate::view::time(e.at_ms);
        let details = super::trace_events::describe(&e.kind, &e.json);
        if output != Output::Table {
            let body: serde_json::Value =
                serde_json::from_str(&e.json).unwrap_or(serde_json::Value::Null);
            let line = serde_json::json!({
                "seq": e.seq, "at": at, "attempt": e.attempt, "kind": e.kind,
                "details": details, "body": body,
            });
            crate::outln!("{line}");
            continue;
        }
        table.add_row(vec![
            e.attempt.to_string(),
            e.seq.to_string(),
            at.as_str().unwrap_or("-").to_string(),
            e.kind.clone(),
            details,
        ]);
    }
    if output == Output::Table {
        crate::outln!("{table}");
    }
}
