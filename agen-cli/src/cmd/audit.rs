//! `agen audit [--namespace NS] [--since D] [--token T] [--action CALL] [--outcome O] [-f]
//! [-o json]`: the Hub's audit log, one line per mutating call (time, token, namespace, call,
//! target, outcome, the peer address, and what the call decided: an approval's decision, the
//! tool call it was about and the reason). Every namespace the caller may read unless `--namespace` is given; the
//! token, action and outcome filters apply to the entries the Hub returns; `-f` prints new
//! entries as they come (polled every second; JSON lines with `-o json`).

use std::time::Duration;

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen audit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only entries from this long ago onwards, e.g. 1h or 7d
    #[arg(long, value_parser = crate::cmd::parse_duration)]
    pub since: Option<Duration>,
    /// At most this many entries (the newest)
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
    /// Only entries of this token (its id or name)
    #[arg(long = "token-id", alias = "by-token", value_name = "TOKEN")]
    pub by_token: Option<String>,
    /// Only entries of this call, e.g. DeleteDeployment (case does not matter)
    #[arg(long)]
    pub action: Option<String>,
    /// Only entries with this outcome, e.g. ok or permission_denied (case does not matter)
    #[arg(long)]
    pub outcome: Option<String>,
    /// Keep printing new entries as they are written (Ctrl-C ends)
    #[arg(short = 'f', long)]
    pub follow: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// JSON of one entry (snake_case keys).
pub fn entry_json(e: &pb::AuditEntry) -> Value {
    json!({
        "at": view::time(e.at_ms),
        "token_id": e.token_id,
        "token_name": e.token_name,
        "namespace": e.namespace,
        "call": e.call,
        "target": e.target,
        "outcome": e.outcome,
        "message": e.message,
        "decision": opt(&e.decision),
        "tool_call": if e.task_id.is_empty() && e.call_id.is_empty() && e.tool.is_empty() {
            Value::Null
        } else {
            json!({"task": e.task_id, "call_id": e.call_id, "tool": e.tool})
        },
        "reason": opt(&e.reason),
        "peer": opt(&e.peer),
        "suppressed": e.suppressed,
    })
}

fn opt(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        json!(s)
    }
}

/// What the call decided, for the table: `approve always ws.run (call c1 of task t): "why"`.
fn detail(e: &pb::AuditEntry) -> String {
    let mut out = e.decision.clone();
    if !e.tool.is_empty() || !e.call_id.is_empty() {
        let tool = if e.tool.is_empty() { "-" } else { &e.tool };
        out = format!("{out} {tool} (call {} of task {})", e.call_id, e.task_id);
    }
    if !e.reason.is_empty() {
        out = format!("{out}: {:?}", e.reason);
    }
    if e.suppressed > 0 {
        out = format!(
            "{out} (and {} more like it from this address in 1 s)",
            e.suppressed
        );
    }
    match out.trim() {
        "" => "-".into(),
        s => s.to_string(),
    }
}

fn dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

/// Whether `e` passes the `--token-id`, `--action` and `--outcome` filters.
fn wanted(args: &Args, e: &pb::AuditEntry) -> bool {
    let same = |want: &Option<String>, have: &str| {
        want.as_ref().is_none_or(|w| w.eq_ignore_ascii_case(have))
    };
    args.by_token
        .as_ref()
        .is_none_or(|t| *t == e.token_id || *t == e.token_name)
        && same(&args.action, &e.call)
        && same(&args.outcome, &e.outcome)
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let explicit_ns = std::env::args().any(|a| a == "--namespace" || a.starts_with("--namespace="))
        || std::env::var_os("AGEN_NAMESPACE").is_some();
    let mut hub = args.client.connect()?;
    let since_ms = args
        .since
        .map(|d| chrono::Utc::now().timestamp_millis() - d.as_millis().min(i64::MAX as u128) as i64)
        .unwrap_or(0);
    let entries = hub
        .client
        .list_audit(pb::ListAuditRequest {
            namespace: hub.namespace.clone(),
            all_namespaces: !explicit_ns,
            since_ms,
            limit: args.limit,
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .entries;
    let mut last_ms = entries.iter().map(|e| e.at_ms).max().unwrap_or(since_ms);
    let mut seen: Vec<pb::AuditEntry> = entries
        .iter()
        .filter(|e| e.at_ms == last_ms)
        .cloned()
        .collect();
    let entries: Vec<pb::AuditEntry> = entries.into_iter().filter(|e| wanted(&args, e)).collect();
    if args.follow {
        // One entry per line from the start, then every new one.
        for e in &entries {
            print_line(args.client.output, e);
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let fresh = hub
                .client
                .list_audit(pb::ListAuditRequest {
                    namespace: hub.namespace.clone(),
                    all_namespaces: !explicit_ns,
                    since_ms: last_ms,
                    limit: 0,
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner()
                .entries;
            for e in fresh {
                if e.at_ms == last_ms && seen.contains(&e) {
                    continue;
                }
                if e.at_ms > last_ms {
                    last_ms = e.at_ms;
                    seen.clear();
                }
                seen.push(e.clone());
                if wanted(&args, &e) {
                    print_line(args.client.output, &e);
                }
            }
        }
    }
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(
            args.client.output,
            &Value::Array(entries.iter().map(entry_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&[
                "TIME",
                "TOKEN",
                "NAMESPACE",
                "CALL",
                "TARGET",
                "OUTCOME",
                "PEER",
                "DECISION",
            ]);
            for e in &entries {
                t.add_row(vec![
                    match view::time(e.at_ms) {
                        Value::String(s) => s,
                        _ => "-".into(),
                    },
                    format!("{} ({})", e.token_name, e.token_id),
                    if e.namespace.is_empty() {
                        "-".into()
                    } else {
                        e.namespace.clone()
                    },
                    e.call.clone(),
                    if e.target.is_empty() {
                        "-".into()
                    } else {
                        e.target.clone()
                    },
                    e.outcome.clone(),
                    dash(&e.peer).to_string(),
                    detail(e),
                ]);
            }
            if entries.is_empty() {
                println!("no audit entries");
            } else {
                println!("{t}");
            }
        }
    }
    Ok(0)
}

/// One entry on one line (`agen audit -f`): JSON with `-o json|yaml`, else the table's columns.
fn print_line(output: Output, e: &pb::AuditEntry) {
    match output {
        Output::Json | Output::Yaml => crate::outln!("{}", entry_json(e)),
        Output::Table => crate::outln!(
            "{} {} ({}) {} {} {} {} {} {}",
            view::time(e.at_ms).as_str().unwrap_or("-"),
            e.token_name,
            e.token_id,
            if e.namespace.is_empty() {
                "-"
            } else {
                &e.namespace
            },
            e.call,
            if e.target.is_empty() { "-" } else { &e.target },
            e.outcome,
            dash(&e.peer),
            detail(e)
        ),
    }
}
