//! `agen trace TASK`: the task's run as a tree of spans (model turns, tool calls) with
//! durations and status. `--local RUN`: the same for a run of `agen run` from its local run log
//! (no Hub; `agen runs` lists them), see `trace_local`.

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs};

/// Arguments of `agen trace`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id (with --local: the run id of an `agen run`)
    pub task: String,
    /// TASK is a run of `agen run`: read its local run log instead of asking a Hub
    #[arg(long)]
    pub local: bool,
    /// The task's whole history instead: each event with each turn's tokens, each tool's
    /// arguments and result, retries, approvals (follows a task still running)
    #[arg(long)]
    pub events: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if args.local {
        return super::trace_local::print(&args.task, args.events, args.client.output);
    }
    let mut hub = args.client.connect()?;
    if args.events {
        return super::trace_events::print(&mut hub, &args.task, args.client.output).await;
    }
    let trace = hub
        .client
        .get_trace(pb::GetTraceRequest {
            namespace: hub.namespace.clone(),
            task_id: args.task.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    super::trace_tree::print(&trace, args.client.output);
    Ok(0)
}
