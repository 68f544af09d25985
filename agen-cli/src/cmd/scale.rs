//! `agen scale NAME N`: sets a deployment's replica count without its bundle folder; the
//! instances it keeps are not restarted.

use agen_proto::v1 as pb;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen scale`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment
    pub name: String,
    /// The number of instances it should have
    pub replicas: u32,
    /// Wait until that many replicas are ready
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits
    #[arg(long, default_value = "120s", value_parser = crate::cmd::parse_duration)]
    pub timeout: std::time::Duration,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let d = hub
        .client
        .scale_deployment(pb::ScaleDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
            replicas: args.replicas,
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    if args.wait {
        crate::cmd::deploy::wait_ready(&mut hub, &d, args.timeout).await?;
    }
    match args.client.output {
        Output::Table => crate::outln!(
            "deployment {}/{} scaled to {} (generation {})",
            d.namespace,
            d.name,
            d.replicas,
            d.generation
        ),
        output => view::print_value(output, &view::deployment_json(&d)),
    }
    Ok(0)
}
