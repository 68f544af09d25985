//! `agen tasks`: recent tasks, newest first, filtered by deployment, state, parent, label and
//! submission time, fetched page by page (`ListTasks` answers summaries: inputs and results cut
//! to a prefix).

use agen_proto::v1 as pb;
use serde_json::Value;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Tasks asked for per `ListTasks` call.
const PAGE_SIZE: usize = 100;

/// Arguments of `agen tasks`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only tasks of this deployment
    #[arg(long)]
    pub deployment: Option<String>,
    /// Only tasks in this state (queued|running|waiting|succeeded|failed|cancelled)
    #[arg(long)]
    pub state: Option<String>,
    /// Only the children of this task (its call_agent/start_agent tasks)
    #[arg(long)]
    pub parent: Option<String>,
    /// Only tasks with this label (KEY) or label value (KEY=VALUE)
    #[arg(long, value_name = "KEY[=VALUE]")]
    pub label: Option<String>,
    /// Only tasks submitted within this long before now (e.g. 30m, 2h)
    #[arg(long, value_name = "DURATION", value_parser = crate::cmd::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Only tasks submitted longer than this before now
    #[arg(long, value_name = "DURATION", value_parser = crate::cmd::parse_duration)]
    pub until: Option<std::time::Duration>,
    /// At most this many tasks (0: all of them)
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Print the list again whenever it changes (Ctrl-C ends)
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: Option<Sub>,
}

/// `agen tasks SUBCOMMAND`.
#[derive(Debug, clap::Subcommand)]
pub enum Sub {
    /// The webhook deliveries of a task, with their attempts
    Webhooks {
        task: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(Sub::Webhooks { task, client }) = args.command {
        return super::task_webhooks::run(task, client).await;
    }
    let mut hub = args.client.connect()?;
    let output = args.client.output;
    if args.watch {
        let args = std::sync::Arc::new(args);
        let lists = crate::watch::poll(hub, move |mut hub| {
            let args = args.clone();
            async move {
                let r = fetch(&mut hub, &args).await;
                (r, hub)
            }
        });
        return crate::watch::follow(lists, output, |l: &Vec<pb::Task>| print(l, output)).await;
    }
    let tasks = fetch(&mut hub, &args).await?;
    print(&tasks, output);
    Ok(0)
}

/// Up to `--limit` tasks, newest first, page by page.
async fn fetch(hub: &mut crate::client::Hub, args: &Args) -> anyhow::Result<Vec<pb::Task>> {
    let wanted = if args.limit == 0 {
        usize::MAX
    } else {
        args.limit as usize
    };
    let ago = |d: std::time::Duration| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(now.saturating_sub(d).as_millis())
            .unwrap_or(0)
            .max(1)
    };
    let (label_key, label_value) = match args.label.as_deref() {
        Some(l) => match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (l.to_string(), String::new()),
        },
        None => (String::new(), String::new()),
    };
    let mut tasks: Vec<pb::Task> = Vec::new();
    let mut page_token = String::new();
    loop {
        let left = wanted - tasks.len();
        let page = hub
            .client
            .list_tasks(pb::ListTasksRequest {
                namespace: hub.namespace.clone(),
                deployment: args.deployment.clone().unwrap_or_default(),
                state: args.state.clone().unwrap_or_default(),
                page_size: left.min(PAGE_SIZE) as u32,
                page_token: page_token.clone(),
                parent_task_id: args.parent.clone().unwrap_or_default(),
                label_key: label_key.clone(),
                label_value: label_value.clone(),
                created_after_ms: args.since.map(ago).unwrap_or(0),
                created_before_ms: args.until.map(ago).unwrap_or(0),
                ..Default::default()
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        tasks.extend(page.tasks);
        if page.next_page_token.is_empty() || tasks.len() >= wanted {
            break;
        }
        page_token = page.next_page_token;
    }
    tasks.truncate(wanted);
    Ok(tasks)
}

/// The tasks, as a table or for scripts.
fn print(tasks: &[pb::Task], output: Output) {
    match output {
        Output::Json | Output::Yaml => view::print_value(
            output,
            &Value::Array(tasks.iter().map(view::task_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&["TASK", "DEPLOYMENT", "STATE", "ACTIVITY / RESULT", "AGE"])
                .keep(&["DEPLOYMENT", "STATE"]);
            for task in tasks {
                let what = match &task.outcome {
                    Some(o) if view::task_terminal(task.state) => {
                        o.result.lines().next().unwrap_or("").to_owned()
                    }
                    _ => task.activity.clone(),
                };
                let what = if what.chars().count() > 60 {
                    format!("{}…", what.chars().take(60).collect::<String>())
                } else {
                    what
                };
                t.add_row(vec![
                    task.task_id.clone(),
                    task.deployment.clone(),
                    view::task_state(task.state).to_owned(),
                    what,
                    view::age(task.created_at_ms),
                ]);
            }
            if tasks.is_empty() {
                crate::outln!("no tasks");
            } else {
                crate::outln!("{t}");
            }
        }
    }
}
