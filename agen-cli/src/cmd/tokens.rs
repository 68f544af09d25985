//! `agen tokens create|ls|rotate|revoke`: API tokens (a namespace and a role) and Nest join
//! tokens (`--join`, expiry — 24h unless `--ttl` says otherwise — and uses).
//!
//! Invariants: a token's secret is printed once, by `create` and `rotate`, alone on stdout (or
//! as `secret` in `-o json`); `ls` never shows one (the Hub keeps only hashes).

use std::time::Duration;

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

/// How long a join token of `agen tokens create --join` is valid without `--ttl`.
const JOIN_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create a token and print it once: an API token (--role, in --namespace) or, with --join,
    /// a Nest join token
    Create {
        /// A Nest join token instead of an API token (cluster admin only)
        #[arg(long, conflicts_with = "role")]
        join: bool,
        /// The API token's role in its namespace: viewer, submitter, deployer or admin
        #[arg(long, value_parser = ["viewer", "submitter", "deployer", "admin"], required_unless_present = "join")]
        role: Option<String>,
        /// How long it is valid, e.g. 30d or 12h; 0 = never [default: no expiry for API tokens,
        /// 24h for join tokens]
        #[arg(long, visible_alias = "ttl", value_parser = crate::cmd::parse_duration)]
        expires: Option<Duration>,
        /// Join tokens: how many Nests may join with it [default: unlimited]
        #[arg(long, requires = "join")]
        uses: Option<u32>,
        /// A name for `agen tokens ls` and the audit log
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List tokens (never their secrets)
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Give an API token a new secret (printed once); its id, name and scope stay
    Rotate {
        /// The token's id (from `agen tokens ls`)
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Give a token a new name (e.g. one stored before the name rule, shown escaped); its id,
    /// secret and scope stay
    Rename {
        /// The token's id (from `agen tokens ls`)
        id: String,
        /// The new name
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revoke a token: refused from now on, open streams included
    Revoke {
        /// The token's id (from `agen tokens ls`)
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// JSON of a token's metadata (snake_case keys; never a secret).
pub fn token_json(t: &pb::TokenInfo) -> Value {
    json!({
        "id": t.id,
        "name": t.name,
        "kind": t.kind,
        "namespace": if t.namespace.is_empty() { Value::Null } else { json!(t.namespace) },
        "role": if t.role.is_empty() { Value::Null } else { json!(t.role) },
        "created_at": view::time(t.created_at_ms),
        "expires_at": view::time(t.expires_at_ms),
        "last_used_at": view::time(t.last_used_at_ms),
        "revoked_at": view::time(t.revoked_at_ms),
        "uses": t.uses,
        "max_uses": if t.max_uses == 0 { Value::Null } else { json!(t.max_uses) },
        "created_by": t.created_by,
        "state": state(t),
    })
}

fn state(t: &pb::TokenInfo) -> &'static str {
    let now = chrono::Utc::now().timestamp_millis();
    if t.revoked_at_ms != 0 {
        "revoked"
    } else if t.expires_at_ms != 0 && now >= t.expires_at_ms {
        "expired"
    } else if t.max_uses != 0 && t.uses >= t.max_uses {
        "used up"
    } else {
        "active"
    }
}

fn when(ms: i64) -> String {
    match view::time(ms) {
        Value::String(s) => s,
        _ => "-".into(),
    }
}

fn print_secret(output: Output, resp: &pb::CreateTokenResponse) {
    match output {
        Output::Json | Output::Yaml => {
            let mut v = resp.token.as_ref().map(token_json).unwrap_or(json!({}));
            v["secret"] = json!(resp.secret);
            view::print_value(output, &v);
        }
        Output::Table => {
            if let Some(t) = &resp.token {
                eprintln!(
                    "token {} ({}) created; it is shown this once, store it now:",
                    t.id, t.name
                );
            }
            println!("{}", resp.secret);
        }
    }
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Create {
            join,
            role,
            expires,
            uses,
            name,
            client,
        } => {
            let mut hub = client.connect()?;
            let req = pb::CreateTokenRequest {
                kind: if join { "join" } else { "api" }.into(),
                namespace: if join {
                    String::new()
                } else {
                    hub.namespace.clone()
                },
                role: role.unwrap_or_default(),
                name: name.unwrap_or_default(),
                // A join token is a credential for one thing, joining: short-lived unless asked.
                expires_in_ms: expires
                    .or(join.then_some(JOIN_TOKEN_TTL))
                    .map(|d| d.as_millis().min(i64::MAX as u128) as i64)
                    .unwrap_or(0),
                max_uses: uses.unwrap_or(0),
            };
            let resp = hub
                .client
                .create_token(req)
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            print_secret(client.output, &resp);
        }
        Command::Ls { client } => {
            let mut hub = client.connect()?;
            let tokens = hub
                .client
                .list_tokens(pb::ListTokensRequest {
                    namespace: hub.namespace.clone(),
                    all_namespaces: true,
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner()
                .tokens;
            match client.output {
                Output::Json | Output::Yaml => view::print_value(
                    client.output,
                    &Value::Array(tokens.iter().map(token_json).collect()),
                ),
                Output::Table => {
                    let mut t = view::table(&[
                        "ID",
                        "NAME",
                        "KIND",
                        "NAMESPACE",
                        "ROLE",
                        "CREATED",
                        "EXPIRES",
                        "LAST USED",
                        "USES",
                        "STATE",
                    ]);
                    for k in &tokens {
                        t.add_row(vec![
                            k.id.clone(),
                            k.name.clone(),
                            k.kind.clone(),
                            if k.namespace.is_empty() {
                                "-".into()
                            } else {
                                k.namespace.clone()
                            },
                            if k.role.is_empty() {
                                "-".into()
                            } else {
                                k.role.clone()
                            },
                            when(k.created_at_ms),
                            if k.expires_at_ms == 0 {
                                "never".into()
                            } else {
                                when(k.expires_at_ms)
                            },
                            if k.last_used_at_ms == 0 {
                                "never".into()
                            } else {
                                format!("{} ago", view::age(k.last_used_at_ms))
                            },
                            match (k.kind.as_str(), k.max_uses) {
                                ("join", 0) => format!("{}/unlimited", k.uses),
                                ("join", max) => format!("{}/{max}", k.uses),
                                _ => "-".into(),
                            },
                            state(k).into(),
                        ]);
                    }
                    if tokens.is_empty() {
                        println!("no tokens (besides the cluster admin token)");
                    } else {
                        println!("{t}");
                    }
                }
            }
        }
        Command::Rotate { id, client } => {
            let mut hub = client.connect()?;
            let resp = hub
                .client
                .rotate_token(pb::RotateTokenRequest { id })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            print_secret(client.output, &resp);
        }
        Command::Rename { id, name, client } => {
            let mut hub = client.connect()?;
            let t = hub
                .client
                .rename_token(pb::RenameTokenRequest { id, name })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            match client.output {
                Output::Table => crate::outln!("token {} renamed {}", t.id, t.name),
                output => view::print_value(output, &token_json(&t)),
            }
        }
        Command::Revoke { id, client } => {
            let mut hub = client.connect()?;
            let t = hub
                .client
                .revoke_token(pb::RevokeTokenRequest { id })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            match client.output {
                Output::Table => crate::outln!("token {} ({}) revoked", t.id, t.name),
                output => view::print_value(output, &token_json(&t)),
            }
        }
    }
    Ok(0)
}
