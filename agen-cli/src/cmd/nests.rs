//! `agen nests`: nodes, their liveness and capacity; `agen nests revoke|forget NEST` (name or
//! id, cluster admin): revoke disconnects a Nest and refuses it from then on; forget drops its
//! identity (its certificate is refused for good) so that its id may join again.

use agen_proto::v1 as pb;
use serde_json::Value;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen nests`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Disconnect a Nest and refuse it from now on (its instances are replaced elsewhere)
    Revoke {
        /// The Nest's name or id
        nest: String,
    },
    /// Forget a Nest's identity: its certificate is refused for good and its id may join again
    Forget {
        /// The Nest's name or id
        nest: String,
    },
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let mut hub = args.client.connect()?;
    if let Some(action) = args.action {
        let (verb, result) = match action {
            Action::Revoke { nest } => (
                "revoked",
                hub.client.revoke_nest(pb::RevokeNestRequest { nest }).await,
            ),
            Action::Forget { nest } => (
                "forgotten",
                hub.client.forget_nest(pb::ForgetNestRequest { nest }).await,
            ),
        };
        let id = result.map_err(|s| status_error(&hub, s))?.into_inner();
        match args.client.output {
            Output::Json => view::print_json(&serde_json::json!({
                "nest_id": id.nest_id,
                "name": id.name,
                "key_sha256": id.key_sha256,
                "joined_at": view::time(id.joined_at_ms),
                "revoked_at": view::time(id.revoked_at_ms),
            })),
            Output::Table => println!("nest {} ({}) {verb}", id.name, id.nest_id),
        }
        return Ok(0);
    }
    let nests = hub
        .client
        .list_nests(pb::ListNestsRequest {})
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .nests;
    match args.client.output {
        Output::Json => {
            view::print_json(&Value::Array(nests.iter().map(view::nest_json).collect()))
        }
        Output::Table => {
            let mut t = view::table(&[
                "NAME",
                "STATE",
                "INSTANCES",
                "LABELS",
                "LAST HEARTBEAT",
                "VERSION",
                "ID",
            ]);
            for n in &nests {
                let mut labels: Vec<_> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                t.add_row(vec![
                    n.name.clone(),
                    if n.revoked {
                        format!("{} (revoked)", view::nest_state(n.state))
                    } else {
                        view::nest_state(n.state).to_owned()
                    },
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
                println!("no nests have joined this Hub");
            } else {
                println!("{t}");
            }
        }
    }
    Ok(0)
}
