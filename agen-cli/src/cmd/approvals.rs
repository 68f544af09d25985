//! `agen approvals`, `agen approve TASK [CALL_ID] [--always] [--args FILE]` and `agen deny TASK
//! [CALL_ID] [--reason TEXT]`: the pending approvals of `ask` calls, and a person's decision.

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen approvals`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only the approvals of this deployment
    #[arg(long)]
    pub deployment: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `agen approve`.
#[derive(Debug, clap::Args)]
pub struct ApproveArgs {
    /// The task id
    pub task: String,
    /// The call id (may be left out when the task has exactly one pending approval)
    pub call_id: Option<String>,
    /// Approve later calls of the same tool in this task without asking
    #[arg(long)]
    pub always: bool,
    /// Run the call with the arguments in this JSON file (an object) in place of the asked
    /// ones (`-` reads stdin); the model is told it ran with edited arguments
    #[arg(long = "args", value_name = "FILE")]
    pub arguments: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Arguments of `agen deny`.
#[derive(Debug, clap::Args)]
pub struct DenyArgs {
    /// The task id
    pub task: String,
    /// The call id (may be left out when the task has exactly one pending approval)
    pub call_id: Option<String>,
    /// Why: the model is told "denied by a person: <reason>"
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// One approval as `-o json` shows it.
pub fn approval_json(a: &pb::Approval) -> Value {
    let arguments: Value =
        serde_json::from_str(&a.arguments_json).unwrap_or(Value::String(a.arguments_json.clone()));
    json!({
        "task": a.task_id,
        "deployment": a.deployment,
        "call_id": a.call_id,
        "tool": a.tool,
        "arguments": arguments,
        "asked_at": view::time(a.asked_at_ms),
    })
}

pub async fn list(args: ListArgs) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let approvals = hub
        .client
        .list_approvals(pb::ListApprovalsRequest {
            namespace: hub.namespace.clone(),
            deployment: args.deployment.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .approvals;
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(
            args.client.output,
            &Value::Array(approvals.iter().map(approval_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&["TASK", "DEPLOYMENT", "CALL", "TOOL", "ARGUMENTS", "ASKED"])
                .keep(&["CALL", "TOOL"]);
            for a in &approvals {
                let args = if a.arguments_json.chars().count() > 60 {
                    format!("{}…", a.arguments_json.chars().take(60).collect::<String>())
                } else {
                    a.arguments_json.clone()
                };
                t.add_row(vec![
                    a.task_id.clone(),
                    a.deployment.clone(),
                    a.call_id.clone(),
                    a.tool.clone(),
                    args,
                    view::age(a.asked_at_ms),
                ]);
            }
            if approvals.is_empty() {
                crate::outln!("no pending approvals");
            } else {
                crate::outln!("{t}");
            }
        }
    }
    Ok(0)
}

async fn decide(
    client: &ClientArgs,
    task: &str,
    call_id: Option<&str>,
    approved: bool,
    reason: &str,
    always: bool,
    arguments_json: String,
) -> anyhow::Result<i32> {
    let mut hub = client.connect()?;
    let d = hub
        .client
        .decide_approval(pb::DecideApprovalRequest {
            namespace: hub.namespace.clone(),
            task_id: task.to_string(),
            call_id: call_id.unwrap_or_default().to_string(),
            approved,
            reason: reason.to_string(),
            always,
            arguments_json,
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    let a = d.approval.unwrap_or_default();
    match client.output {
        Output::Json | Output::Yaml => {
            let mut v = approval_json(&a);
            v["approved"] = Value::Bool(d.approved);
            v["reason"] = Value::String(d.reason.clone());
            v["by"] = Value::String(d.by.clone());
            if !d.arguments_json.is_empty() {
                v["edited_arguments"] = serde_json::from_str(&d.arguments_json)
                    .unwrap_or(Value::String(d.arguments_json.clone()));
            }
            view::print_value(client.output, &v)
        }
        Output::Table => crate::outln!(
            "{} {} of task {} ({}){}",
            if d.approved { "approved" } else { "denied" },
            a.call_id,
            a.task_id,
            a.tool,
            if d.arguments_json.is_empty() {
                String::new()
            } else {
                format!(" with edited arguments {}", d.arguments_json)
            }
        ),
    }
    Ok(0)
}

pub async fn approve(args: ApproveArgs) -> anyhow::Result<i32> {
    let arguments_json = match &args.arguments {
        None => String::new(),
        Some(file) => edited_arguments(file)?,
    };
    decide(
        &args.client,
        &args.task,
        args.call_id.as_deref(),
        true,
        "",
        args.always,
        arguments_json,
    )
    .await
}

/// The JSON object in `file` (`-`: stdin), compact.
fn edited_arguments(file: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .context("while reading the edited arguments from stdin")?
    } else {
        std::fs::read_to_string(file)
            .with_context(|| format!("while reading the edited arguments {}", file.display()))?
    };
    let v: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "--args {}: not valid JSON; expected an object of the tool's arguments, such as {{\"command\": \"ls\"}}",
            file.display()
        )
    })?;
    if !v.is_object() {
        anyhow::bail!(
            "--args {}: expected a JSON object of the tool's arguments, such as {{\"command\": \"ls\"}}",
            file.display()
        );
    }
    Ok(v.to_string())
}

pub async fn deny(args: DenyArgs) -> anyhow::Result<i32> {
    decide(
        &args.client,
        &args.task,
        args.call_id.as_deref(),
        false,
        args.reason.as_deref().unwrap_or(""),
        false,
        String::new(),
    )
    .await
}
