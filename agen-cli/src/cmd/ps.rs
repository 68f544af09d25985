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
    /// With --all: also instances that stopped or were lost longer ago than the Hub's
    /// --hide-ended-after
    #[arg(long, requires = "all")]
    pub ended: bool,
    /// Print the list again whenever it changes (Ctrl-C ends)
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    // `--all` spans namespaces unless one was asked for explicitly.
    let explicit_ns = std::env::args().any(|a| a == "--namespace" || a.starts_with("--namespace="))
        || std::env::var_os("AGEN_NAMESPACE").is_some();
    let output = args.client.output;
    if args.all {
        let req = pb::ListInstancesRequest {
            namespace: hub.namespace.clone(),
            deployment: String::new(),
            all_namespaces: !explicit_ns,
            include_ended: args.ended,
        };
        if args.watch {
            let url = hub.url.clone();
            let lists = crate::watch::poll(hub.client.clone(), move |mut c| {
                let (req, url) = (req.clone(), url.clone());
                async move {
                    let r = c
                        .list_instances(req)
                        .await
                        .map(|r| r.into_inner().instances)
                        .map_err(|s| crate::client::status_error_at(&url, s));
                    (r, c)
                }
            });
            return crate::watch::follow(lists, output, |l: &Vec<pb::Instance>| {
                print_instances(l, output)
            })
            .await;
        }
        let instances = hub
            .client
            .list_instances(req)
            .await
            .map_err(|s| status_error(&hub, s))?
            .into_inner()
            .instances;
        print_instances(&instances, output);
        return Ok(0);
    }
    let req = pb::ListDeploymentsRequest {
        namespace: hub.namespace.clone(),
        all_namespaces: false,
    };
    let namespace = hub.namespace.clone();
    if args.watch {
        let stream = hub
            .client
            .watch_deployments(req)
            .await
            .map_err(|s| status_error(&hub, s))?
            .into_inner();
        let url = hub.url.clone();
        let lists = futures::StreamExt::map(stream, move |r| {
            r.map(|l| l.deployments)
                .map_err(|s| crate::client::status_error_at(&url, s))
        });
        return crate::watch::follow(lists, output, |l: &Vec<pb::Deployment>| {
            print_deployments(l, output, &namespace)
        })
        .await;
    }
    let deployments = hub
        .client
        .list_deployments(req)
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .deployments;
    print_deployments(&deployments, output, &namespace);
    Ok(0)
}

/// Every instance, as a table or for scripts.
fn print_instances(instances: &[pb::Instance], output: Output) {
    match output {
        Output::Json | Output::Yaml => view::print_value(
            output,
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
                "CPU",
                "MEMORY",
                "NOT CONNECTED",
                "MESSAGE",
            ])
            .keep(&["DEPLOYMENT", "INSTANCE", "NEST", "STATE"]);
            for i in instances {
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
                let (cpu, mem) = view::usage_cells(i.usage.as_ref());
                let mut message = if i.message.is_empty() {
                    "-".to_string()
                } else {
                    i.message.clone()
                };
                if i.oom_kills > 0 && !message.contains("memory limit") {
                    message = format!(
                        "{message} (killed by its memory limit {} time{})",
                        i.oom_kills,
                        if i.oom_kills == 1 { "" } else { "s" }
                    );
                }
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
                    cpu,
                    mem,
                    if nc.is_empty() { "-".into() } else { nc },
                    message,
                ]);
            }
            if instances.is_empty() {
                crate::outln!("no instances");
            } else {
                crate::outln!("{t}");
            }
        }
    }
}

/// The deployments of `namespace`, as a table or for scripts.
fn print_deployments(deployments: &[pb::Deployment], output: Output, namespace: &str) {
    match output {
        Output::Json | Output::Yaml => view::print_value(
            output,
            &Value::Array(deployments.iter().map(view::deployment_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&["NAME", "AGENT", "READY", "GENERATION", "BUNDLE", "AGE"]);
            for d in deployments {
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
                crate::outln!("no deployments in namespace {namespace}");
            } else {
                crate::outln!("{t}");
            }
        }
    }
}

fn first_line(s: &str) -> String {
    let l = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if l.chars().count() > 80 {
        format!("{}…", l.chars().take(80).collect::<String>())
    } else {
        l.to_owned()
    }
}
