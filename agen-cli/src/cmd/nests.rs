//! `agen nests`: nodes, their liveness and capacity (and a drain's deadline); `agen nests
//! cordon|uncordon|drain NEST`: no new placements, placements again, or cordon and move its
//! instances away now (`--wait` follows until none is left);
//! `agen nests revoke|forget NEST` (cluster admin): revoke disconnects a Nest and refuses it
//! from then on; forget drops its identity (its certificate is refused for good) so that its
//! id may join again. NEST is a name or an id.

use agen_proto::v1 as pb;
use serde_json::Value;

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// Arguments of `agen nests`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Also Nests lost longer ago than the Hub's --hide-ended-after
    #[arg(long)]
    pub all: bool,
    /// Print the list again whenever it changes (Ctrl-C ends)
    #[arg(short = 'w', long)]
    pub watch: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What `agen nests` does to one Nest (without one: lists them).
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// No new placements on NEST (what runs there keeps running)
    Cordon {
        /// The Nest's name or id
        nest: String,
    },
    /// Placements on NEST again
    Uncordon {
        /// The Nest's name or id
        nest: String,
    },
    /// Cordon NEST and move its instances to other Nests now (their runs are handed over)
    Drain {
        /// The Nest's name or id
        nest: String,
        /// Let running runs finish there for up to this long (no new run goes to it; an idle
        /// instance moves at once); the rest are handed over at the deadline. Without it every
        /// instance moves now
        #[arg(long, value_name = "D", value_parser = crate::cmd::parse_duration)]
        deadline: Option<std::time::Duration>,
        /// Follow the drain until no instance is left on NEST (progress on stderr); exit 7
        /// when --timeout passes first
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (default: the deadline plus 2 minutes)
        #[arg(long, value_name = "D", value_parser = crate::cmd::parse_duration)]
        timeout: Option<std::time::Duration>,
    },
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
            lifecycle => return nest_lifecycle(&mut hub, lifecycle, args.client.output).await,
        };
        let id = result.map_err(|s| status_error(&hub, s))?.into_inner();
        match args.client.output {
            Output::Table => crate::outln!("nest {} ({}) {verb}", id.name, id.nest_id),
            output => view::print_value(
                output,
                &serde_json::json!({
                    "nest_id": id.nest_id,
                    "name": id.name,
                    "key_sha256": id.key_sha256,
                    "joined_at": view::time(id.joined_at_ms),
                    "revoked_at": view::time(id.revoked_at_ms),
                }),
            ),
        }
        return Ok(0);
    }
    let req = pb::ListNestsRequest {
        include_ended: args.all,
    };
    let output = args.client.output;
    if args.watch {
        let stream = hub
            .client
            .watch_nests(req)
            .await
            .map_err(|s| status_error(&hub, s))?
            .into_inner();
        let url = hub.url.clone();
        let lists = futures::StreamExt::map(stream, move |r| {
            r.map(|l| l.nests)
                .map_err(|s| crate::client::status_error_at(&url, s))
        });
        return crate::watch::follow(lists, output, |nests: &Vec<pb::Nest>| print(nests, output))
            .await;
    }
    let nests = hub
        .client
        .list_nests(req)
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .nests;
    print(&nests, output);
    Ok(0)
}

/// The list of Nests, as a table or for scripts.
fn print(nests: &[pb::Nest], output: Output) {
    match output {
        Output::Json | Output::Yaml => view::print_value(
            output,
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
                "SEPARATION",
                "NETWORK",
                "ID",
            ])
            .keep(&["STATE", "ID"]);
            for n in nests {
                let mut labels: Vec<_> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.sort();
                t.add_row(vec![
                    n.name.clone(),
                    if n.revoked {
                        format!("{} (revoked)", view::nest_state(n.state))
                    } else if n.cordoned {
                        format!("{},cordoned{}", view::nest_state(n.state), drain_note(n))
                    } else {
                        format!("{}{}", view::nest_state(n.state), drain_note(n))
                    },
                    format!("{}/{}", n.instances, n.capacity),
                    if labels.is_empty() {
                        "-".into()
                    } else {
                        labels.join(",")
                    },
                    format!("{} ago", view::age(n.last_heartbeat_ms)),
                    version_of(n),
                    if n.separation.is_empty() {
                        "-".into()
                    } else {
                        n.separation.clone()
                    },
                    if n.network.is_empty() {
                        "-".into()
                    } else {
                        n.network.clone()
                    },
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
}

/// `0.1.0 (3f2a9c1b7e4d, protocol 1.0)`: the Nest's crate version, commit and protocol.
fn version_of(n: &pb::Nest) -> String {
    let mut parts = Vec::new();
    if !n.commit.is_empty() {
        parts.push(n.commit.clone());
    }
    if !n.protocol_version.is_empty() {
        parts.push(format!("protocol {}", n.protocol_version));
    }
    if parts.is_empty() {
        n.version.clone()
    } else {
        format!("{} ({})", n.version, parts.join(", "))
    }
}

/// `,draining until 15:04:05Z (42s left)` while a drain's deadline is ahead, `,drained` once it
/// passed, nothing when the Nest is not draining.
fn drain_note(n: &pb::Nest) -> String {
    if n.draining_until_ms <= 0 {
        return String::new();
    }
    let left_ms = n.draining_until_ms - chrono::Utc::now().timestamp_millis();
    if left_ms <= 0 {
        return ",drained".into();
    }
    let at = chrono::DateTime::from_timestamp_millis(n.draining_until_ms)
        .map(|t| t.format("%H:%M:%SZ").to_string())
        .unwrap_or_default();
    format!(",draining until {at} ({}s left)", (left_ms + 999) / 1000)
}

/// `agen nests drain NEST --wait`: polls the Nest until no instance is left on it, printing
/// each change of the count on stderr.
async fn follow_drain(
    hub: &mut crate::client::Hub,
    nest: &pb::Nest,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        let nests = hub
            .client
            .list_nests(pb::ListNestsRequest {
                include_ended: true,
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner()
            .nests;
        let Some(n) = nests.iter().find(|n| n.nest_id == nest.nest_id) else {
            anyhow::bail!("nest {} ({}) is gone from the Hub", nest.name, nest.nest_id);
        };
        if last != Some(n.instances) {
            last = Some(n.instances);
            if n.instances == 0 {
                eprintln!("nest {}: no instance left", n.name);
                return Ok(());
            }
            eprintln!(
                "nest {}: {} instance{} left{}",
                n.name,
                n.instances,
                if n.instances == 1 { "" } else { "s" },
                drain_note(n).replacen(',', "; ", 1)
            );
        }
        if std::time::Instant::now() > until {
            return Err(crate::exit::coded(
                crate::exit::code::WAIT_TIMEOUT,
                format!(
                    "nest {}: {} instances still there after {timeout:?}; see agen ps --all",
                    n.name, n.instances
                ),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// `agen nests cordon|uncordon|drain NEST`.
async fn nest_lifecycle(
    hub: &mut crate::client::Hub,
    action: Action,
    output: Output,
) -> anyhow::Result<i32> {
    let (verb, nest) = match &action {
        Action::Cordon { nest } => ("cordoned", nest.clone()),
        Action::Uncordon { nest } => ("uncordoned", nest.clone()),
        Action::Drain { nest, .. } => ("drained", nest.clone()),
        Action::Revoke { nest } | Action::Forget { nest } => ("", nest.clone()),
    };
    let deadline_ms = match &action {
        Action::Drain {
            deadline: Some(d), ..
        } => d.as_millis() as u64,
        _ => 0,
    };
    let wait =
        match &action {
            Action::Drain {
                wait: true,
                timeout,
                deadline,
                ..
            } => Some(timeout.unwrap_or_else(|| {
                deadline.unwrap_or_default() + std::time::Duration::from_secs(120)
            })),
            _ => None,
        };
    let req = pb::NestRequest { nest, deadline_ms };
    let result = match action {
        Action::Cordon { .. } => hub.client.cordon_nest(req).await,
        Action::Uncordon { .. } => hub.client.uncordon_nest(req).await,
        Action::Drain { .. } => hub.client.drain_nest(req).await,
        Action::Revoke { .. } | Action::Forget { .. } => {
            anyhow::bail!("revoke and forget are not lifecycle actions")
        }
    };
    let n = result.map_err(|s| status_error(hub, s))?.into_inner();
    if let Some(timeout) = wait {
        follow_drain(hub, &n, timeout).await?;
    }
    match output {
        Output::Table => crate::outln!("nest {} {verb}", n.name),
        output => view::print_value(output, &view::nest_json(&n)),
    }
    Ok(0)
}
