//! `agen wait TASK`: follows a task until it ends, showing what the run is doing on stderr,
//! then prints the answer (or the task as JSON). Exit 0 when it succeeded, 1 when it failed,
//! 3 when it was cancelled, 7 on `--timeout` (`crate::exit`).

use std::time::Duration;

use agen_proto::v1 as pb;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

use crate::client::{status_error, ClientArgs, Hub, Output};
use crate::{exit, view};

/// Arguments of `agen wait`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id
    pub task: String,
    /// Give up after this long (exit 7)
    #[arg(long, value_parser = crate::cmd::parse_duration)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    follow(&mut hub, &args.task, args.client.output, args.timeout).await
}

/// Follows `task` to its end and prints it; returns the exit code.
pub async fn follow(
    hub: &mut Hub,
    task: &str,
    output: Output,
    timeout: Option<Duration>,
) -> anyhow::Result<i32> {
    let bar = spinner();
    let fut = watch_until_terminal(hub, task, &bar);
    let result = match timeout {
        Some(t) => match tokio::time::timeout(t, fut).await {
            Ok(r) => r,
            Err(_) => {
                bar.finish_and_clear();
                eprintln!("task {task} did not end within {t:?}");
                return Ok(exit::code::WAIT_TIMEOUT);
            }
        },
        None => fut.await,
    };
    bar.finish_and_clear();
    let t = result?;
    print_outcome(&t, output);
    Ok(exit_code(&t))
}

pub fn exit_code(t: &pb::Task) -> i32 {
    match view::task_state(t.state) {
        "succeeded" => exit::code::OK,
        "cancelled" => exit::code::CANCELLED,
        _ => exit::code::FAILED,
    }
}

pub fn print_outcome(t: &pb::Task, output: Output) {
    match output {
        Output::Json | Output::Yaml => view::print_value(output, &view::task_json(t)),
        Output::Table => {
            let o = t.outcome.clone().unwrap_or_default();
            match view::task_state(t.state) {
                "succeeded" => crate::outln!("{}", o.result),
                state => {
                    if !o.result.is_empty() {
                        crate::outln!("{}", o.result);
                    }
                    let why = if o.error.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", o.error)
                    };
                    eprintln!(
                        "task {} {state}{}",
                        t.task_id,
                        agen_shared::text::escape_controls(&why, true)
                    );
                }
            }
        }
    }
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Streams the task's events (re-attaching if the stream drops) until the task is terminal.
async fn watch_until_terminal(
    hub: &mut Hub,
    task: &str,
    bar: &ProgressBar,
) -> anyhow::Result<pb::Task> {
    let mut from_seq = 0u64;
    let mut last_line = String::new();
    let mut failures = 0u32;
    loop {
        let stream = hub
            .client
            .watch_task(pb::WatchTaskRequest {
                namespace: hub.namespace.clone(),
                task_id: task.to_owned(),
                from_seq,
            })
            .await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(s) if s.code() == tonic::Code::Unavailable && failures < 20 => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(s) => return Err(status_error(hub, s)),
        };
        while let Some(ev) = stream.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(_) => break,
            };
            failures = 0;
            from_seq = ev.seq + 1;
            if let Some(t) = &ev.task {
                // The activity comes from the run (a model, a tool): never raw to the terminal.
                let line = agen_shared::text::escape_controls(&describe(t), false).into_owned();
                if line != last_line {
                    if bar.is_hidden() {
                        eprintln!("{line}");
                    }
                    bar.set_message(line.clone());
                    last_line = line;
                }
                if view::task_terminal(t.state) {
                    return Ok(t.clone());
                }
            }
        }
        // The stream ended without a terminal event: ask directly, then re-attach.
        let t = hub
            .client
            .get_task(pb::GetTaskRequest {
                namespace: hub.namespace.clone(),
                task_id: task.to_owned(),
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        if view::task_terminal(t.state) {
            return Ok(t);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn describe(t: &pb::Task) -> String {
    let mut s = view::task_state(t.state).to_string();
    if !t.activity.is_empty() {
        s.push_str(": ");
        s.push_str(&t.activity);
    }
    if let Some(p) = &t.progress {
        s.push_str(&format!(" [{}", p.step));
        if let (Some(d), Some(tot)) = (p.done, p.total) {
            s.push_str(&format!(" {d}/{tot}"));
        }
        s.push(']');
    }
    s
}
