//! `agen submit DEPLOYMENT INPUT`: queues a task and prints its id alone on stdout, or the
//! task as an object with `-o json|yaml` (`--wait` then waits like `agen wait` and prints the
//! ended task instead).

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen submit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment that runs the task
    pub deployment: String,
    /// The task's input text
    pub input: String,
    /// Continue the conversation with this key
    #[arg(long)]
    pub conversation: Option<String>,
    /// What to do when the conversation already has a task queued or running: reject, enqueue,
    /// interrupt (stop it at its next safe point) or rollback (cancel it and drop its turns);
    /// default: the bundle's doubleTexting, else enqueue
    #[arg(long, value_name = "MODE", value_parser = ["reject", "enqueue", "interrupt", "rollback"])]
    pub double_texting: Option<String>,
    /// A label of the task (repeatable)
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Idempotency key: a retried submit with the same id returns the same task (default: random)
    #[arg(long)]
    pub request_id: Option<String>,
    /// Make the run's trace a child of this W3C traceparent (00-<trace id>-<span id>-<flags>)
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// Wait for the outcome (exit code as `agen wait`)
    #[arg(long)]
    pub wait: bool,
    /// With --wait: print the answer as it is written even when stdout is not a terminal
    #[arg(long)]
    pub stream: bool,
    /// Allow only tools matching this pattern for this task, within the bundle's permissions
    /// (repeatable; `<server>.<tool>`, `<server>_<tool>` or `*`; overrides only narrow)
    #[arg(long = "allow-tool", value_name = "PATTERN")]
    pub allow_tools: Vec<String>,
    /// Ask a person before calls of tools matching this pattern (repeatable)
    #[arg(long = "ask-tool", value_name = "PATTERN")]
    pub ask_tools: Vec<String>,
    /// Deny tools matching this pattern for this task (repeatable)
    #[arg(long = "deny-tool", value_name = "PATTERN")]
    pub deny_tools: Vec<String>,
    /// Fail the task with "deadline exceeded" when it has not finished this long after the
    /// submit (e.g. 90s, 10m; wins over the bundle's limits.taskTimeout)
    #[arg(long, value_name = "DURATION", value_parser = crate::cmd::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Stop the run before a model turn would take it over this many input + output tokens,
    /// over all turns and attempts (wins over the bundle's limits.maxTokens)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,
    /// POST a signed notice to this URL when the task ends (repeatable; signed with the
    /// namespace's platform secret AGEN_WEBHOOK_SECRET; README "Webhooks")
    #[arg(long = "webhook", value_name = "URL")]
    pub webhooks: Vec<String>,
    /// The --webhook URLs are also told when the task waits for an approval
    #[arg(long, requires = "webhooks")]
    pub webhook_on_waiting: bool,
    /// A JSON schema file the final answer must match (in place of the bundle's outputSchema);
    /// the task's result is then that JSON (`agen query -o json` shows it parsed)
    #[arg(long, value_name = "FILE")]
    pub output_schema: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let labels = view::parse_labels(&args.labels)?;
    let request_id = args
        .request_id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let req = pb::SubmitTaskRequest {
        namespace: hub.namespace.clone(),
        deployment: args.deployment.clone(),
        input: args.input.clone(),
        labels,
        conversation_key: args.conversation.clone().unwrap_or_default(),
        client_request_id: request_id,
        tool_overrides: Some(pb::ToolOverrides {
            allow: args.allow_tools.clone(),
            ask: args.ask_tools.clone(),
            deny: args.deny_tools.clone(),
        }),
        traceparent: args.traceparent.clone().unwrap_or_default(),
        timeout_ms: match args.timeout {
            Some(d) if d.is_zero() => {
                anyhow::bail!("--timeout: expected a duration above zero, such as 90s")
            }
            Some(d) => u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            None => 0,
        },
        max_tokens: args.max_tokens.unwrap_or(0),
        webhooks: args
            .webhooks
            .iter()
            .map(|url| pb::WebhookTarget {
                url: url.clone(),
                on_waiting: args.webhook_on_waiting,
            })
            .collect(),
        double_texting: args.double_texting.clone().unwrap_or_default(),
        output_schema_json: match &args.output_schema {
            Some(path) => read_output_schema(path)?,
            None => String::new(),
        },
    };
    // Retrying with the same request id is safe: the Hub creates one task.
    let mut tries = 0;
    let task = loop {
        match hub.client.submit_task(req.clone()).await {
            Ok(t) => break t.into_inner(),
            Err(s) if s.code() == tonic::Code::Unavailable && tries < 3 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(300 * tries)).await;
            }
            Err(s) => return Err(status_error(&hub, s)),
        }
    };
    for w in &task.warnings {
        eprintln!("warning: {w}");
    }
    if args.wait {
        if args.client.output == Output::Table {
            crate::outln!("{}", task.task_id);
        }
        let stream = crate::cmd::wait::streams(args.stream, args.client.output);
        return crate::cmd::wait::follow(&mut hub, &task.task_id, args.client.output, None, stream)
            .await;
    }
    match args.client.output {
        Output::Table => crate::outln!("{}", task.task_id),
        output => view::print_value(output, &view::task_json(&task)),
    }
    Ok(0)
}

/// The `--output-schema` file as compact JSON text (the Hub checks that it is a JSON schema).
fn read_output_schema(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--output-schema: cannot read {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        anyhow::anyhow!(
            "--output-schema: {} is not JSON ({e}); expected a JSON schema such as {{\"type\": \"object\"}}",
            path.display()
        )
    })?;
    Ok(value.to_string())
}
