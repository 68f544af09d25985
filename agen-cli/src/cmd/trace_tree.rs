//! A trace as a tree of spans with durations and status (or JSON for scripts): what `agen
//! trace TASK` prints for a Hub's task and `agen trace --local RUN` for a local run.

use std::collections::BTreeMap;

use agen_proto::v1 as pb;
use serde_json::json;

use crate::client::Output;

/// Prints `trace` as a tree of spans (or for scripts).
pub fn print(trace: &pb::Trace, output: Output) {
    if output != Output::Table {
        let spans: Vec<_> = trace
            .spans
            .iter()
            .map(|s| {
                json!({
                    "span_id": s.span_id, "parent_span_id": s.parent_span_id, "name": s.name,
                    "start": crate::view::time(s.start_ms), "duration_ms": (s.end_ms - s.start_ms).max(0),
                    "status": s.status, "attributes": s.attributes,
                })
            })
            .collect();
        crate::view::print_value(
            output,
            &json!({"task": trace.task_id, "trace_id": trace.trace_id, "spans": spans}),
        );
        return;
    }
    let mut children: BTreeMap<&str, Vec<&pb::Span>> = BTreeMap::new();
    for s in &trace.spans {
        children
            .entry(s.parent_span_id.as_str())
            .or_default()
            .push(s);
    }
    let t0 = trace.spans.iter().map(|s| s.start_ms).min().unwrap_or(0);
    crate::outln!("trace {} (task {})", trace.trace_id, trace.task_id);
    let mut table = crate::view::table(&["SPAN", "START", "DURATION", "STATUS"]);
    fn walk(
        table: &mut crate::view::Table,
        children: &BTreeMap<&str, Vec<&pb::Span>>,
        parent: &str,
        depth: usize,
        t0: i64,
    ) {
        if let Some(list) = children.get(parent) {
            let mut list = list.clone();
            list.sort_by_key(|s| s.start_ms);
            for s in list {
                table.add_row(vec![
                    format!("{}{}", "  ".repeat(depth), s.name),
                    format!("+{}ms", s.start_ms - t0),
                    format!("{}ms", (s.end_ms - s.start_ms).max(0)),
                    s.status.clone(),
                ]);
                walk(table, children, &s.span_id, depth + 1, t0);
            }
        }
    }
    walk(&mut table, &children, "", 0, t0);
    if trace.spans.is_empty() {
        crate::outln!("(no spans yet)");
    } else {
        crate::outln!("{table}");
    }
}
