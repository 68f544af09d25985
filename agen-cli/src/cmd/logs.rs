//! `agen logs INSTANCE|DEPLOYMENT [--server NAME] [-f] [--since D] [--tail N] [--nest NAME]`:
//! the stderr an instance or one of its tool servers wrote, as its Nest kept it (redacted of
//! the instance's secrets), through `ReadLogs`; `-f` follows new lines until interrupted.

use agen_proto::v1 as pb;
use serde_json::json;

use crate::client::{status_error, ClientArgs, Output};

/// Arguments of `agen logs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An instance id, or a deployment name (every instance of it)
    pub target: String,
    /// A tool server's stderr (its name in mcp.json) instead of the instance's own
    #[arg(long)]
    pub server: Option<String>,
    /// Keep printing new lines as they are written
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only lines written in this last span of time (e.g. 10m, 2h)
    #[arg(long, value_parser = super::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Only the last N lines of each instance (before following)
    #[arg(long)]
    pub tail: Option<u32>,
    /// Only instances on this Nest (name or id)
    #[arg(long)]
    pub nest: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let since_ms = args
        .since
        .map(|d| chrono::Utc::now().timestamp_millis() - d.as_millis() as i64)
        .unwrap_or(0);
    let mut stream = hub
        .client
        .read_logs(pb::ReadLogsRequest {
            namespace: hub.namespace.clone(),
            target: args.target.clone(),
            server: args.server.clone().unwrap_or_default(),
            follow: args.follow,
            since_ms,
            tail: args.tail.unwrap_or(0),
            nest: args.nest.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    loop {
        let line = match stream.message().await {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(0),
            Err(s) => return Err(status_error(&hub, s)),
        };
        if args.client.output != Output::Table {
            crate::outln!(
                "{}",
                json!({
                    "instance": line.instance_id, "server": line.server, "nest": line.nest,
                    "at": crate::view::time(line.at_ms), "level": line.level, "text": line.text,
                })
            );
            continue;
        }
        // A deployment's instances are told apart; one instance's lines are printed as written.
        let prefix = if args.target == line.instance_id {
            String::new()
        } else {
            format!("[{}] ", line.instance_id)
        };
        let level = if line.level.is_empty() {
            String::new()
        } else {
            format!("{:<5} ", line.level)
        };
        let at = crate::view::time(line.at_ms);
        let at = at.as_str().unwrap_or("-");
        crate::outln!("{prefix}{at} {level}{}", line.text);
    }
}
