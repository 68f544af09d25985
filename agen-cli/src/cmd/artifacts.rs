//! `agen artifacts ls [TASK]` and `agen artifacts get ID [--out FILE]`.

use std::io::Write;
use std::path::PathBuf;

use agen_proto::v1 as pb;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List artifacts (of one task, or of the namespace)
    Ls {
        /// Only this task's artifacts
        task: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Write an artifact's content to stdout or a file
    Get {
        /// The artifact id (sha256:<hex>)
        id: String,
        /// Write to this file instead of stdout
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Ls { task, client } => {
            let mut hub = client.connect()?;
            let list = hub
                .client
                .list_artifacts(pb::ListArtifactsRequest {
                    namespace: hub.namespace.clone(),
                    task_id: task.unwrap_or_default(),
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner()
                .artifacts;
            match client.output {
                Output::Json | Output::Yaml => view::print_value(client.output, &Value::Array(
                    list.iter()
                        .map(|a| json!({"id": a.artifact_id, "name": a.name, "media_type": a.media_type, "size": a.size, "task": a.task_id, "created_at": view::time(a.created_at_ms)}))
                        .collect(),
                )),
                Output::Table => {
                    let mut t = view::table(&["ID", "NAME", "TYPE", "SIZE", "TASK", "AGE"]).keep(&["TASK"]);
                    for a in &list {
                        t.add_row(vec![a.artifact_id.clone(), a.name.clone(), a.media_type.clone(), a.size.to_string(), a.task_id.clone(), view::age(a.created_at_ms)]);
                    }
                    if list.is_empty() { crate::outln!("no artifacts") } else { crate::outln!("{t}") }
                }
            }
            Ok(0)
        }
        Command::Get { id, out, client } => {
            let mut hub = client.connect()?;
            let mut stream = hub
                .client
                .get_artifact(pb::GetArtifactRequest {
                    namespace: hub.namespace.clone(),
                    artifact_id: id.clone(),
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            let mut data = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|s| status_error(&hub, s))?;
                data.extend_from_slice(&chunk.data);
            }
            match out {
                Some(path) => std::fs::write(&path, &data)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
                None => std::io::stdout().write_all(&data)?,
            }
            Ok(0)
        }
    }
}
