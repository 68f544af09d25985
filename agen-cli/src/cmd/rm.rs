//! `agen rm NAME`: deletes a deployment: its instances stop, its queued tasks fail; its
//! history (`agen history NAME`) stays until the Hub's task retention. It asks first on a
//! terminal; `--yes` for scripts, and without a terminal it refuses (exit 2) unless `--yes`.

use std::io::{BufRead, IsTerminal, Write};

use agen_proto::v1 as pb;
use serde_json::json;

use crate::client::{status_error, ClientArgs, Output};
use crate::exit::{code, coded};
use crate::view;

/// Arguments of `agen rm`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The deployment
    pub name: String,
    /// Remove without asking (needed when stdin is not a terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    // An unknown deployment is "not found" (4) before any question is asked.
    let d = hub
        .client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    if !args.yes {
        let (replicas, generation) = d
            .deployment
            .as_ref()
            .map_or((0, 0), |d| (d.replicas, d.generation));
        let what = format!(
            "deployment {}/{} ({replicas} replica{}, generation {generation})",
            hub.namespace,
            args.name,
            if replicas == 1 { "" } else { "s" },
        );
        if !std::io::stdin().is_terminal() {
            return Err(coded(
                code::USAGE,
                format!(
                    "agen rm {}: not removing {what} without confirmation; no terminal to ask on, pass --yes",
                    args.name
                ),
            ));
        }
        eprint!("remove {what}? Its instances stop and its queued tasks fail. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            eprintln!("nothing removed");
            return Ok(code::FAILED);
        }
    }
    hub.client
        .delete_deployment(pb::DeleteDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: args.name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?;
    match args.client.output {
        Output::Table => crate::outln!(
            "deployment {}/{} removed (its history stays until the task retention: agen history {})",
            hub.namespace,
            args.name,
            args.name
        ),
        output => view::print_value(
            output,
            &json!({"namespace": hub.namespace, "name": args.name, "deleted": true}),
        ),
    }
    Ok(0)
}
