//! `agen history NAME`: every generation of a deployment, oldest first: bundle digest, time,
//! replicas, who made it and how (deploy, scale, rollback).

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen history`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub fn revision_json(r: &pb::DeploymentRevision) -> Value {
    json!({
        "generation": r.generation,
        "bundle_digest": r.bundle_digest,
        "agent": r.agent_name,
        "replicas": r.replicas,
        "concurrency": r.concurrency,
        "selector": r.selector,
        "created_at": view::time(r.created_at_ms),
        "deployed_by": r.deployed_by,
        "change": r.change,
        "current": r.current,
    })
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let list = hub
        .client
        .list_deployment_history(pb::ListDeploymentHistoryRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .revisions;
    match args.client.output {
        Output::Table => {
            let mut t = view::table(&[
                "GENERATION",
                "BUNDLE",
                "REPLICAS",
                "CHANGE",
                "DEPLOYED BY",
                "TIME",
            ])
            .keep(&["BUNDLE", "REPLICAS"]);
            for r in &list {
                let time = view::time(r.created_at_ms);
                t.add_row(vec![
                    format!("{}{}", r.generation, if r.current { " *" } else { "" }),
                    view::short_digest(&r.bundle_digest),
                    r.replicas.to_string(),
                    r.change.clone(),
                    r.deployed_by.clone(),
                    time.as_str().unwrap_or("-").to_string(),
                ]);
            }
            crate::outln!("{t}");
        }
        output => view::print_value(
            output,
            &Value::Array(list.iter().map(revision_json).collect()),
        ),
    }
    Ok(0)
}
