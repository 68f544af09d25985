//! `agen secrets set NAME [--value-stdin | --from-env VAR | --from-file F]`, `agen secrets ls`,
//! `agen secrets rm NAME`: the Hub's secret store (values of secrets with `source: platform`).
//!
//! Invariants: a value is never taken as a plain argument (it would show in `ps` and shell
//! history) and never printed; listing shows names and times only.

use std::io::Read;
use std::path::PathBuf;

use agen_proto::v1 as pb;
use anyhow::Context;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Set a secret (the value is read from stdin unless --from-env or --from-file)
    Set {
        /// The secret's name, as declared in x-agen/secrets.json
        name: String,
        /// Read the value from stdin (the default)
        #[arg(long, conflicts_with_all = ["from_env", "from_file"])]
        value_stdin: bool,
        /// Take the value from this environment variable
        #[arg(long, value_name = "VAR", conflicts_with = "from_file")]
        from_env: Option<String>,
        /// Read the value from this file
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List secrets (names and times, never values)
    Ls {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a secret
    Rm {
        /// The secret's name
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// Drops one trailing newline (`echo value | agen secrets set X`, files ending in a newline).
fn trim_newline(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

fn read_value(
    name: &str,
    from_env: Option<String>,
    from_file: Option<PathBuf>,
) -> anyhow::Result<Vec<u8>> {
    let value = if let Some(var) = from_env {
        std::env::var_os(&var)
            .ok_or_else(|| {
                anyhow::anyhow!("--from-env {var}: environment variable {var} is not set")
            })?
            .into_encoded_bytes()
    } else if let Some(path) = from_file {
        trim_newline(
            std::fs::read(&path)
                .with_context(|| format!("--from-file: cannot read {}", path.display()))?,
        )
    } else {
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            eprintln!("enter the value of {name}, then Ctrl-D:");
        }
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .context("cannot read the secret value from stdin")?;
        trim_newline(v)
    };
    if value.is_empty() {
        anyhow::bail!(
            "the value of {name} is empty; pipe it on stdin (printf %s \"$VALUE\" | agen secrets set {name}), or use --from-env VAR or --from-file FILE"
        );
    }
    Ok(value)
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Set {
            name,
            value_stdin: _,
            from_env,
            from_file,
            client,
        } => {
            let value = read_value(&name, from_env, from_file)?;
            let mut hub = client.connect()?;
            let resp = hub
                .client
                .set_secret(pb::SetSecretRequest {
                    namespace: hub.namespace.clone(),
                    name: name.clone(),
                    value,
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner();
            let secret = resp.secret.unwrap_or_default();
            match client.output {
                Output::Json | Output::Yaml => {
                    view::print_value(client.output, &secret_json(&secret))
                }
                Output::Table => {
                    let verb = if resp.replaced { "updated" } else { "set" };
                    crate::outln!("secret {name} {verb} in namespace {}", secret.namespace);
                }
            }
            Ok(0)
        }
        Command::Ls { client } => {
            let mut hub = client.connect()?;
            let secrets = hub
                .client
                .list_secrets(pb::ListSecretsRequest {
                    namespace: hub.namespace.clone(),
                })
                .await
                .map_err(|s| status_error(&hub, s))?
                .into_inner()
                .secrets;
            match client.output {
                Output::Json | Output::Yaml => view::print_value(
                    client.output,
                    &Value::Array(secrets.iter().map(secret_json).collect()),
                ),
                Output::Table => {
                    let mut t = view::table(&["NAME", "NAMESPACE", "CREATED", "UPDATED"]);
                    for s in &secrets {
                        t.add_row(vec![
                            s.name.clone(),
                            s.namespace.clone(),
                            format!("{} ago", view::age(s.created_at_ms)),
                            format!("{} ago", view::age(s.updated_at_ms)),
                        ]);
                    }
                    if secrets.is_empty() {
                        crate::outln!(
                            "no secrets in namespace {}; set one with agen secrets set NAME",
                            hub.namespace
                        );
                    } else {
                        crate::outln!("{t}");
                    }
                }
            }
            Ok(0)
        }
        Command::Rm { name, client } => {
            let mut hub = client.connect()?;
            hub.client
                .delete_secret(pb::DeleteSecretRequest {
                    namespace: hub.namespace.clone(),
                    name: name.clone(),
                })
                .await
                .map_err(|s| status_error(&hub, s))?;
            if client.output == Output::Table {
                crate::outln!("secret {name} deleted from namespace {}", hub.namespace);
            } else {
                view::print_value(
                    client.output,
                    &json!({"name": name, "namespace": hub.namespace, "deleted": true}),
                );
            }
            Ok(0)
        }
    }
}

fn secret_json(s: &pb::Secret) -> Value {
    json!({
        "name": s.name,
        "namespace": s.namespace,
        "created_at": view::time(s.created_at_ms),
        "updated_at": view::time(s.updated_at_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::trim_newline;

    #[test]
    fn one_trailing_newline_is_dropped() {
        fn check(input: &[u8], expected: &[u8]) {
            assert_eq!(trim_newline(input.to_vec()), expected.to_vec(), "{input:?}");
        }
        check(b"v", b"v");
        check(b"v\n", b"v");
        check(b"v\r\n", b"v");
        check(b"v\n\n", b"v\n");
        check(b" v ", b" v ");
    }
}
