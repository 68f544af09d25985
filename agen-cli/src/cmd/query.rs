//! `agen query TASK`: the task's state, progress, current activity and outcome, without waiting.

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen query`.
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
        .query_task(pb::QueryTaskRequest {
            namespace: hub.namespace.clone(),
            task_id: args.task.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(args.client.output, &view::task_json(&t)),
        Output::Table => {
            let v = view::task_json(&t);
            crate::outln!("task:        {}", t.task_id);
            crate::outln!("deployment:  {}/{}", t.namespace, t.deployment);
            crate::outln!("state:       {}", view::task_state(t.state));
            if !t.activity.is_empty() {
                crate::outln!("activity:    {}", t.activity);
            }
            if let Some(p) = &t.progress {
                let count = match (p.done, p.total) {
                    (Some(d), Some(tot)) => format!(" ({d}/{tot})"),
                    (Some(d), None) => format!(" ({d})"),
                    _ => String::new(),
                };
                crate::outln!(
                    "progress:    {}{count}{}",
                    p.step,
                    if p.note.is_empty() {
                        String::new()
                    } else {
                        format!(" — {}", p.note)
                    }
                );
            }
            if !t.instance_id.is_empty() {
                crate::outln!("instance:    {} on {}", t.instance_id, t.nest_name);
            }
            if let Some(o) = v.get("outcome").filter(|o| !o.is_null()) {
                crate::outln!(
                    "response:    {}",
                    o["response_type"].as_str().unwrap_or("text")
                );
                crate::outln!("result:\n{}", o["result"].as_str().unwrap_or(""));
            }
        }
    }
    Ok(0)
}
