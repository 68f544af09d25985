//! `agen rm NAME`: deletes a deployment: its instances stop, its queued tasks fail, its
//! history goes.

use agen_proto::v1 as pb;
use serde_json::json;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen rm`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    hub.client
        .delete_deployment(pb::DeleteDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?;
    match args.client.output {
        Output::Table => crate::outln!("deployment {}/{} removed", hub.namespace, args.name),
        output => view::print_value(
            output,
            &json!({"namespace": hub.namespace, "name": args.name, "deleted": true}),
        ),
    }
    Ok(0)
}
