//! `agen query TASK`: the task's state, progress, current activity and outcome, without waiting;
//! its parent and children when delegates made a tree (`children`: the task ids of its
//! call_agent/start_agent tasks, from `ListTasks` by parent).

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
    let children: Vec<pb::Task> = hub
        .client
        .list_tasks(pb::ListTasksRequest {
            namespace: hub.namespace.clone(),
            parent_task_id: t.task_id.clone(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .tasks;
    let approvals: Vec<serde_json::Value> = hub
        .client
        .list_approvals(pb::ListApprovalsRequest {
            namespace: hub.namespace.clone(),
            deployment: t.deployment.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .approvals
        .iter()
        .filter(|a| a.task_id == t.task_id)
        .map(crate::cmd::approvals::approval_json)
        .collect();
    let mut v = view::task_json(&t);
    v["approvals"] = serde_json::Value::Array(approvals);
    v["children"] = serde_json::Value::Array(
        children
            .iter()
            .map(|c| serde_json::Value::String(c.task_id.clone()))
            .collect(),
    );
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(args.client.output, &v),
        Output::Table => {
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
            if t.timeout_ms > 0 {
                crate::outln!(
                    "timeout:     {} (deadline {})",
                    view::duration_ms(t.timeout_ms),
                    v["deadline"].as_str().unwrap_or("-")
                );
            }
            if t.max_tokens > 0 {
                crate::outln!("max tokens:  {}", t.max_tokens);
            }
            if !t.parent_task_id.is_empty() {
                crate::outln!("parent:      {}", t.parent_task_id);
            }
            for c in &children {
                crate::outln!(
                    "child:       {} ({}, {})",
                    c.task_id,
                    c.deployment,
                    view::task_state(c.state)
                );
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
