//! `agen wait TASK`: follows a task until it ends, showing what the run is doing on stderr,
//! then prints the answer (or the task as JSON). On a terminal, or with `--stream`, the answer
//! is printed as the model writes it (never with `-o json|yaml`): control characters escaped,
//! a turn cut off and asked again is followed by a note on stderr and the new text. Exit 0 when it succeeded, 1 when it failed,
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
    /// Print the answer as it is written even when stdout is not a terminal
    #[arg(long)]
    pub stream: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let stream = streams(args.stream, args.client.output);
    follow(
        &mut hub,
        &args.task,
        args.client.output,
        args.timeout,
        stream,
    )
    .await
}

/// Whether the answer is printed as it is written: on a terminal or with `--stream`, never
/// with `-o json|yaml`.
pub fn streams(flag: bool, output: Output) -> bool {
    output == Output::Table && (flag || std::io::IsTerminal::is_terminal(&std::io::stdout()))
}

/// Follows `task` to its end and prints it; returns the exit code. With `stream`, the answer
/// is printed as it is written.
pub async fn follow(
    hub: &mut Hub,
    task: &str,
    output: Output,
    timeout: Option<Duration>,
    stream: bool,
) -> anyhow::Result<i32> {
    let bar = if stream {
        ProgressBar::hidden()
    } else {
        spinner()
    };
    let mut shown = stream.then(Streamed::default);
    let fut = watch_until_terminal(hub, task, &bar, &mut shown);
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
    match shown {
        Some(s) if s.printed => {
            crate::out::raw("\n");
            let answer = t.outcome.as_ref().map(|o| o.result.as_str());
            if view::task_state(t.state) == "succeeded" && answer == Some(s.turn_text.as_str()) {
                // Printed whole as it was written.
                return Ok(exit_code(&t));
            }
            print_outcome(&t, output);
        }
        _ => print_outcome(&t, output),
    }
    Ok(exit_code(&t))
}

/// What of the answer was printed as it streamed.
#[derive(Debug, Default)]
pub struct Streamed {
    /// The attempt and turn of the text printed last.
    turn: Option<(u32, u32)>,
    /// That turn's text since its last reset.
    turn_text: String,
    /// Whether anything was printed on the current line.
    printed: bool,
}

impl Streamed {
    fn frame(&mut self, d: &pb::TurnDelta) {
        let turn = Some((d.attempt, d.turn));
        if d.reset {
            if self.printed {
                crate::out::raw("\n");
                self.printed = false;
            }
            eprintln!("(the model's answer was cut off; it starts again)");
            self.turn_text.clear();
        } else if self.turn != turn && self.printed {
            crate::out::raw("\n");
            self.printed = false;
            self.turn_text.clear();
        }
        self.turn = turn;
        if !d.text.is_empty() {
            crate::out::text(&d.text);
            self.turn_text.push_str(&d.text);
            self.printed = true;
        }
    }
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
    shown: &mut Option<Streamed>,
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
                deltas: shown.is_some(),
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
            if let Some(d) = &ev.delta {
                if let Some(s) = shown.as_mut() {
                    s.frame(d);
                }
                continue;
            }
            from_seq = ev.seq + 1;
            if let Some(t) = &ev.task {
                // The activity comes from the run (a model, a tool): never raw to the terminal.
                let line = agen_shared::text::escape_controls(&describe(t), false).into_owned();
                if line != last_line {
                    if bar.is_hidden() && shown.is_none() {
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
