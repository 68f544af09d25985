//! `agen rollback NAME [--to-generation N]`: a new generation from an old one (default: the
//! newest earlier generation that ran another bundle), keeping today's replica count. A
//! rollback to what already runs is a no-op that says so (`"changed": false`).

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen rollback`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment
    pub name: String,
    /// The generation to go back to (see `agen history NAME`)
    #[arg(long, value_name = "N")]
    pub to_generation: Option<u64>,
    /// Wait until every replica runs it and is healthy
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits
    #[arg(long, default_value = "120s", value_parser = crate::cmd::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if args.to_generation == Some(0) {
        return Err(crate::exit::coded(
            crate::exit::code::USAGE,
            "--to-generation: generations start at 1; see agen history",
        ));
    }
    let mut hub = args.client.connect()?;
    let before = hub
        .client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .deployment
        .map(|d| d.generation);
    let d = hub
        .client
        .rollback_deployment(pb::RollbackDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
            to_generation: args.to_generation.unwrap_or(0),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    if args.wait {
        crate::cmd::deploy::wait_ready(&mut hub, &d, args.timeout).await?;
    }
    // The Hub makes no generation when the target is what runs now: nothing restarts.
    let unchanged = before == Some(d.generation);
    match args.client.output {
        Output::Table if unchanged => crate::outln!(
            "deployment {}/{} already runs that: generation {} ({}) stays, nothing restarted",
            d.namespace,
            d.name,
            d.generation,
            view::short_digest(&d.bundle_digest)
        ),
        Output::Table => crate::outln!(
            "deployment {}/{} rolled back: generation {} runs {}",
            d.namespace,
            d.name,
            d.generation,
            view::short_digest(&d.bundle_digest)
        ),
        output => {
            let mut v = view::deployment_json(&d);
            v["changed"] = serde_json::Value::Bool(!unchanged);
            view::print_value(output, &v)
        }
    }
    Ok(0)
}
