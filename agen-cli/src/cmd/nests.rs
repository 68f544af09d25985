//! `agen nests`: nodes, their liveness and capacity.

use agen_proto::v1 as pb;
use serde_json::Value;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen nests`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    let nests = hub
        .client
        .list_nests(pb::ListNestsRequest {})
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .nests;
    match args.client.output {
        Output::Json | Output::Yaml => view::print_value(
            args.client.output,
            &Value::Array(nests.iter().map(view::nest_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&[
                "NAME",
                "STATE",
                "INSTANCES",
                "LABELS",
                "LAST HEARTBEAT",
                "VERSION",
                "ID",
            ])
            .keep(&["STATE", "ID"]);
            for n in &nests {
                let mut labels: Vec<_> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                t.add_row(vec![
                    n.name.clone(),
                    view::nest_state(n.state).to_owned(),
                    format!("{}/{}", n.instances, n.capacity),
                    if labels.is_empty() {
                        "-".into()
                    } else {
                        labels.join(",")
                    },
                    format!("{} ago", view::age(n.last_heartbeat_ms)),
                    n.version.clone(),
                    n.nest_id.clone(),
                ]);
            }
            if nests.is_empty() {
                crate::outln!("no nests have joined this Hub");
            } else {
                crate::outln!("{t}");
            }
        }
    }
    Ok(0)
}
