//! `agen schedules create|ls|pause|resume|rm|run-now`: a deployment's task on a cron
//! expression, fired by the Hub (README "Schedules").

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create a schedule: DEPLOYMENT gets a task with INPUT at every slot of the expression
    Create {
        /// The deployment the tasks go to
        deployment: String,
        /// 5 fields (minute hour day month weekday) or 6 (second first), e.g. "0 7 * * 1-5"
        #[arg(long)]
        cron: String,
        /// An IANA time zone the expression is read in (e.g. Europe/Oslo)
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// The text each firing submits
        #[arg(long)]
        input: String,
        /// Every firing continues this conversation
        #[arg(long, value_name = "K")]
        conversation_key: Option<String>,
        /// A slot while the last firing's task runs: skip it, enqueue it (runs after), or allow it
        #[arg(long, default_value = "skip", value_parser = ["skip", "enqueue", "allow"])]
        overlap: String,
        /// Slots missed while no Hub ran: fire one task for the latest, or none
        #[arg(long, default_value = "latest", value_parser = ["latest", "none"])]
        catch_up: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the namespace's schedules
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Pause a schedule: it fires nothing until resumed
    Pause {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Resume a paused schedule from its next slot (skipped slots do not fire)
    Resume {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Remove a schedule (its tasks stay)
    Rm {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Submit the schedule's task now; prints the task id
    RunNow {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Create {
            deployment,
            cron,
            timezone,
            input,
            conversation_key,
            overlap,
            catch_up,
            client,
        } => {
            let mut hub = client.connect()?;
            let s = hub
                .client
                .create_schedule(pb::CreateScheduleRequest {
                    namespace: hub.namespace.clone(),
                    deployment,
                    cron,
                    timezone,
                    input,
                    conversation_key: conversation_key.unwrap_or_default(),
                    overlap,
                    catch_up,
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            print_one(client.output, &s);
            Ok(0)
        }
        Command::Ls { client } => {
            let mut hub = client.connect()?;
            let all = hub
                .client
                .list_schedules(pb::ListSchedulesRequest {
                    namespace: hub.namespace.clone(),
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner()
                .schedules;
            match client.output {
                Output::Json | Output::Yaml => view::print_value(
                    client.output,
                    &Value::Array(all.iter().map(schedule_json).collect()),
                ),
                Output::Table => {
                    let mut t = view::table(&[
                        "SCHEDULE",
                        "DEPLOYMENT",
                        "CRON",
                        "TIMEZONE",
                        "STATE",
                        "NEXT",
                        "LAST TASK",
                    ]);
                    for s in &all {
                        t.add_row(vec![
                            s.schedule_id.clone(),
                            s.deployment.clone(),
                            s.cron.clone(),
                            s.timezone.clone(),
                            if s.paused { "paused" } else { "active" }.into(),
                            view::time(s.next_slot_ms)
                                .as_str()
                                .unwrap_or("-")
                                .to_string(),
                            if s.last_task_id.is_empty() {
                                "-".into()
                            } else {
                                s.last_task_id.clone()
                            },
                        ]);
                    }
                    if all.is_empty() {
                        crate::outln!(
                            "no schedules in namespace {}; create one with agen schedules create DEPLOYMENT --cron EXPR --input TEXT",
                            hub.namespace
                        );
                    } else {
                        crate::outln!("{t}");
                    }
                }
            }
            Ok(0)
        }
        Command::Pause { id, client } => change(id, client, "paused").await,
        Command::Resume { id, client } => change(id, client, "resumed").await,
        Command::Rm { id, client } => change(id, client, "removed").await,
        Command::RunNow { id, client } => {
            let mut hub = client.connect()?;
            let task = hub
                .client
                .run_schedule(pb::ScheduleRequest {
                    namespace: hub.namespace.clone(),
                    schedule_id: id,
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            match client.output {
                Output::Table => crate::outln!("{}", task.task_id),
                output => view::print_value(output, &view::task_json(&task)),
            }
            Ok(0)
        }
    }
}

async fn change(id: String, client: ClientArgs, verb: &str) -> anyhow::Result<i32> {
    let mut hub = client.connect()?;
    let req = pb::ScheduleRequest {
        namespace: hub.namespace.clone(),
        schedule_id: id,
    };
    let s = match verb {
        "paused" => hub.client.pause_schedule(req).await,
        "resumed" => hub.client.resume_schedule(req).await,
        _ => hub.client.delete_schedule(req).await,
    }
    .map_err(|s| status_error(&hub, s))?
    .into_inner();
    match client.output {
        Output::Table => crate::outln!("schedule {} {verb}", s.schedule_id),
        output => view::print_value(output, &schedule_json(&s)),
    }
    Ok(0)
}

fn print_one(output: Output, s: &pb::Schedule) {
    match output {
        Output::Table => crate::outln!("{}", s.schedule_id),
        output => view::print_value(output, &schedule_json(s)),
    }
}

/// A schedule as `-o json` shows it (the Python SDK reads the same).
pub fn schedule_json(s: &pb::Schedule) -> Value {
    json!({
        "schedule_id": s.schedule_id,
        "namespace": s.namespace,
        "deployment": s.deployment,
        "cron": s.cron,
        "timezone": s.timezone,
        "input": s.input,
        "conversation_key": s.conversation_key,
        "overlap": s.overlap,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "created_at": view::time(s.created_at_ms),
        "last_slot": view::time(s.last_slot_ms),
        "last_task_id": s.last_task_id,
        "next_slot": view::time(s.next_slot_ms),
        "pending": s.pending,
    })
}
