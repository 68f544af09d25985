//! `agen cancel TASK`: cancels a queued or running task (and its in-flight tool calls).

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen cancel`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id
    pub task: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let t = hub
        .client
        .cancel_task(pb::CancelTaskRequest {
            namespace: hub.namespace.clone(),
            task_id: args.task.clone(),
            reason: "cancelled with agen cancel".into(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(args.client.output, &view::task_json(&t)),
        Output::Table => crate::outln!("task {} {}", t.task_id, view::task_state(t.state)),
    }
    Ok(0)
}
