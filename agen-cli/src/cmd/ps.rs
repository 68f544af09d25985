//! `agen ps [--all]`: deployments, or with `--all` every instance with its Nest, state,
//! health, tools loaded and the tool servers that are not connected (and why).

use agen_proto::v1 as pb;
use serde_json::Value;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen ps`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Every instance instead of one line per deployment
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    // `--all` spans namespaces unless one was asked for explicitly.
    let explicit_ns = std::env::args().any(|a| a == "--namespace" || a.starts_with("--namespace="))
        || std::env::var_os("AGEN_NAMESPACE").is_some();
    if args.all {
        let instances = hub
            .client
            .list_instances(pb::ListInstancesRequest {
                namespace: hub.namespace.clone(),
                deployment: String::new(),
                all_namespaces: !explicit_ns,
            })
            .await
            .map_err(|s| status_error(&hub, s))?
            .into_inner()
            .instances;
        match args.client.output {
            Output::Json | Output::Yaml => view::print_value(
                args.client.output,
                &Value::Array(instances.iter().map(view::instance_json).collect()),
            ),
            Output::Table => {
                let mut t = view::table(&[
                    "NAMESPACE",
                    "DEPLOYMENT",
                    "INSTANCE",
                    "NEST",
                    "STATE",
                    "HEALTHY",
                    "TOOLS",
                    "NOT CONNECTED",
                    "MESSAGE",
                ])
                .keep(&["DEPLOYMENT", "INSTANCE", "NEST", "STATE"]);
                for i in &instances {
                    let nc = i
                        .servers_not_connected
                        .iter()
                        .map(|p| {
                            if p.reason.is_empty() {
                                p.server.clone()
                            } else {
                                format!("{}: {}", p.server, first_line(&p.reason))
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("\n");
                    t.add_row(vec![
                        i.namespace.clone(),
                        i.deployment.clone(),
                        i.instance_id.clone(),
                        if i.nest_name.is_empty() {
                            "-".into()
                        } else {
                            i.nest_name.clone()
                        },
                        view::instance_state(i.state).to_owned(),
                        if i.healthy { "yes".into() } else { "no".into() },
                        i.tools_loaded.to_string(),
                        if nc.is_empty() { "-".into() } else { nc },
                        if i.message.is_empty() {
                            "-".into()
                        } else {
                            i.message.clone()
                        },
                    ]);
                }
                if instances.is_empty() {
                    crate::outln!("no instances");
                } else {
                    crate::outln!("{t}");
                }
            }
        }
        return Ok(0);
    }
    let deployments = hub
        .client
        .list_deployments(pb::ListDeploymentsRequest {
            namespace: hub.namespace.clone(),
            all_namespaces: false,
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .deployments;
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(
            args.client.output,
            &Value::Array(deployments.iter().map(view::deployment_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&["NAME", "AGENT", "READY", "GENERATION", "BUNDLE", "AGE"]);
            for d in &deployments {
                t.add_row(vec![
                    d.name.clone(),
                    d.agent_name.clone(),
                    format!("{}/{}", d.ready_replicas, d.replicas),
                    d.generation.to_string(),
                    view::short_digest(&d.bundle_digest),
                    view::age(d.created_at_ms),
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

fn first_line(s: &str) -> String {
    let l = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if l.chars().count() > 80 {
        format!("{}…", l.chars().take(80).collect::<String>())
    } else {
        l.to_owned()
    }
}
