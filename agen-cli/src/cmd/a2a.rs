//! `agen a2a ls`: each deployment's A2A agent card URL (the Hub serves every deployment as an
//! A2A agent; clients authenticate with an API token that may submit in its namespace).
//! `agen a2a serve`: one deployment at a local origin of its own ([`super::a2a_serve`]).

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// The A2A agent card URL of each deployment of the namespace
    Ls {
        /// Every namespace the token may read
        #[arg(long, short = 'A')]
        all_namespaces: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Serve one deployment as an A2A agent at http://ADDR/ (its card at
    /// /.well-known/agent-card.json), forwarding to the Hub; clients bring their own token
    Serve {
        /// The deployment
        deployment: String,
        /// A loopback address to listen on (port 0 picks a free port)
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    let (all_namespaces, client) = match cmd {
        Command::Ls {
            all_namespaces,
            client,
        } => (all_namespaces, client),
        Command::Serve {
            deployment,
            listen,
            client,
        } => return super::a2a_serve::run(deployment, listen, client).await,
    };
    let mut hub = client.connect()?;
    let deployments = hub
        .client
        .list_deployments(pb::ListDeploymentsRequest {
            namespace: hub.namespace.clone(),
            all_namespaces,
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .deployments;
    match client.output {
        Output::Json | Output::Yaml => view::print_value(
            client.output,
            &Value::Array(
                deployments
                    .iter()
                    .map(|d| {
                        json!({
                            "namespace": d.namespace,
                            "deployment": d.name,
                            "agent": d.agent_name,
                            "card_url": d.a2a_card_url,
                        })
                    })
                    .collect(),
            ),
        ),
        Output::Table => {
            let mut t = view::table(&["NAMESPACE", "DEPLOYMENT", "AGENT", "CARD URL"]);
            for d in &deployments {
                t.add_row(vec![
                    d.namespace.clone(),
                    d.name.clone(),
                    d.agent_name.clone(),
                    d.a2a_card_url.clone(),
                ]);
            }
            if deployments.is_empty() {
                crate::outln!("no deployments in namespace {}", hub.namespace);
            } else {
                crate::outln!("{t}");
            }
        }
    }
    Ok(0)
}
