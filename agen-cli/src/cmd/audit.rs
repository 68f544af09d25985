//! `agen audit [--namespace NS] [--since D] [-o json]`: the Hub's audit log, one line per
//! mutating call (time, token, namespace, call, target, outcome). Every namespace the caller may
//! read unless `--namespace` is given.

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
    })
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
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(
            args.client.output,
            &Value::Array(entries.iter().map(entry_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&["TIME", "TOKEN", "NAMESPACE", "CALL", "TARGET", "OUTCOME"]);
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
