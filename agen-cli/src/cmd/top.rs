//! `agen top`: CPU % and memory of every running instance (its group: the instance with its
//! tool servers) and of each of its tool servers, as the Nests last measured them; `-o json`
//! for scripts, `-w` to follow.

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen top`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the table again whenever it changes (Ctrl-C ends)
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let explicit_ns = std::env::args().any(|a| a == "--namespace" || a.starts_with("--namespace="))
        || std::env::var_os("AGEN_NAMESPACE").is_some();
    let output = args.client.output;
    let req = pb::ListInstancesRequest {
        namespace: hub.namespace.clone(),
        deployment: String::new(),
        all_namespaces: !explicit_ns,
        include_ended: false,
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
        return crate::watch::follow(lists, output, |l: &Vec<pb::Instance>| print(l, output)).await;
    }
    let instances = hub
        .client
        .list_instances(req)
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .instances;
    print(&instances, output);
    Ok(0)
}

fn measured(i: &pb::Instance) -> bool {
    i.usage.is_some() && view::instance_state(i.state) != "pending"
}

fn print(instances: &[pb::Instance], output: Output) {
    let rows: Vec<&pb::Instance> = instances.iter().filter(|i| measured(i)).collect();
    match output {
        Output::Json | Output::Yaml => view::print_value(
            output,
            &Value::Array(
                rows.iter()
                    .map(|i| {
                        json!({
                            "namespace": i.namespace,
                            "deployment": i.deployment,
                            "instance": i.instance_id,
                            "nest": i.nest_name,
                            "usage": i.usage.as_ref().map(view::usage_json),
                            "servers": i.servers_usage.iter().map(view::usage_json).collect::<Vec<_>>(),
                            "oom_kills": i.oom_kills,
                        })
                    })
                    .collect(),
            ),
        ),
        Output::Table => {
            let mut t = view::table(&[
                "NAMESPACE",
                "DEPLOYMENT",
                "INSTANCE",
                "TOOL SERVER",
                "NEST",
                "CPU",
                "MEMORY",
                "PIDS",
            ])
            .keep(&["INSTANCE", "TOOL SERVER", "CPU", "MEMORY"]);
            for i in &rows {
                let (cpu, mem) = view::usage_cells(i.usage.as_ref());
                let pids = i.usage.as_ref().map_or(0, |u| u.pids);
                t.add_row(vec![
                    i.namespace.clone(),
                    i.deployment.clone(),
                    i.instance_id.clone(),
                    "(all)".into(),
                    i.nest_name.clone(),
                    cpu,
                    mem,
                    pids.to_string(),
                ]);
                for s in &i.servers_usage {
                    let (cpu, mem) = view::usage_cells(Some(s));
                    t.add_row(vec![
                        i.namespace.clone(),
                        i.deployment.clone(),
                        i.instance_id.clone(),
                        s.name.clone(),
                        i.nest_name.clone(),
                        cpu,
                        mem,
                        s.pids.to_string(),
                    ]);
                }
            }
            if rows.is_empty() {
                crate::outln!("no running instances");
            } else {
                crate::outln!("{t}");
            }
        }
    }
}
