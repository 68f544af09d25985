//! `agen __complete -- WORDS…` (hidden): the dynamic half of the shell completions that
//! `agen completions` prints. Given the words typed after `agen` before the one being
//! completed, it prints the names that fit there, one a line: deployments (`scale`, `rm`,
//! `history`, `rollback`, `submit`, `--deployment`), tasks (`wait`, `query`, `cancel`, `trace`,
//! `approve`, `deny`; the newest 200) or Nests (`nests cordon|uncordon|drain|revoke|forget`,
//! `--nest`), asked of the Hub the client config names with a 2 s timeout. Anywhere else, or
//! when the Hub does not answer, it prints nothing and the shell falls back to the static
//! completions. It always exits 0: a completion never prints an error into a prompt.

use std::time::Duration;

use agen_proto::v1 as pb;
use clap::CommandFactory;

use crate::client::ClientArgs;

/// How long a completion waits for the Hub.
const TIMEOUT: Duration = Duration::from_secs(2);
/// The newest tasks offered.
const TASKS: u32 = 200;

/// Arguments of `agen __complete`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The words after `agen` before the one being completed
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub words: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What names fit at a place of the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deployments,
    Tasks,
    Nests,
}

/// The kind of name that fits after `words` (the words after `agen`), if any.
pub fn kind(words: &[String]) -> Option<Kind> {
    match words.last().map(String::as_str) {
        Some("--deployment") => return Some(Kind::Deployments),
        Some("--nest") => return Some(Kind::Nests),
        _ => {}
    }
    let mut root = crate::Cli::command();
    root.build();
    let mut cur = &root;
    let mut path: Vec<&str> = Vec::new();
    let mut positionals = 0;
    let mut skip = false;
    for w in words {
        if std::mem::take(&mut skip) {
            continue;
        }
        if w.starts_with('-') {
            skip = !w.contains('=') && takes_value(cur, w);
            continue;
        }
        if positionals == 0 {
            if let Some(sub) = cur.find_subcommand(w) {
                path.push(sub.get_name());
                cur = sub;
                continue;
            }
        }
        positionals += 1;
    }
    if positionals != 0 {
        return None;
    }
    match path.as_slice() {
        ["scale" | "rm" | "history" | "rollback" | "submit"] => Some(Kind::Deployments),
        ["wait" | "query" | "cancel" | "trace" | "approve" | "deny"] => Some(Kind::Tasks),
        ["nests", "cordon" | "uncordon" | "drain" | "revoke" | "forget"] => Some(Kind::Nests),
        _ => None,
    }
}

/// Whether the option `flag` (`--namespace`, `-o`) of `cmd` takes a value in the next word.
fn takes_value(cmd: &clap::Command, flag: &str) -> bool {
    cmd.get_arguments()
        .find(|a| match flag.strip_prefix("--") {
            Some(long) => a.get_long() == Some(long),
            None => flag
                .strip_prefix('-')
                .and_then(|s| s.chars().next())
                .is_some_and(|c| a.get_short() == Some(c) && flag.len() == 2),
        })
        .is_some_and(|a| a.get_action().takes_values())
}

/// The value of `--namespace NS` / `--namespace=NS` among `words`.
fn namespace_in(words: &[String]) -> Option<String> {
    let mut it = words.iter();
    while let Some(w) = it.next() {
        if w == "--namespace" {
            return it.next().cloned();
        }
        if let Some(ns) = w.strip_prefix("--namespace=") {
            return Some(ns.to_string());
        }
    }
    None
}

pub async fn run(mut args: Args) -> anyhow::Result<i32> {
    let Some(kind) = kind(&args.words) else {
        return Ok(0);
    };
    if let Some(ns) = namespace_in(&args.words) {
        args.client.namespace = ns;
    }
    if let Ok(Ok(names)) = tokio::time::timeout(TIMEOUT, names(&args.client, kind)).await {
        for n in names {
            crate::out::line(&n);
        }
    }
    Ok(0)
}

async fn names(client: &ClientArgs, kind: Kind) -> anyhow::Result<Vec<String>> {
    let mut hub = client.connect()?;
    let namespace = hub.namespace.clone();
    Ok(match kind {
        Kind::Deployments => hub
            .client
            .list_deployments(pb::ListDeploymentsRequest {
                namespace,
                all_namespaces: false,
            })
            .await?
            .into_inner()
            .deployments
            .into_iter()
            .map(|d| d.name)
            .collect(),
        Kind::Tasks => hub
            .client
            .list_tasks(pb::ListTasksRequest {
                namespace,
                page_size: TASKS,
                ..Default::default()
            })
            .await?
            .into_inner()
            .tasks
            .into_iter()
            .map(|t| t.task_id)
            .collect(),
        Kind::Nests => hub
            .client
            .list_nests(pb::ListNestsRequest {
                include_ended: false,
            })
            .await?
            .into_inner()
            .nests
            .into_iter()
            .map(|n| n.name)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(line: &str, expected: Option<Kind>) {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(kind(&words), expected, "agen {line} <TAB>");
    }

    #[test]
    fn names_are_offered_where_the_command_takes_one() {
        check("scale", Some(Kind::Deployments));
        check("--hub https://h:1 rm", None);
        check("rm --namespace team-a", Some(Kind::Deployments));
        check("submit -o json", Some(Kind::Deployments));
        check("scale hello", None);
        check("wait", Some(Kind::Tasks));
        check("cancel --namespace=x", Some(Kind::Tasks));
        check("nests drain", Some(Kind::Nests));
        check("nests drain --deadline 5m", Some(Kind::Nests));
        check("nests", None);
        check("tasks --deployment", Some(Kind::Deployments));
        check("logs inst-1 --nest", Some(Kind::Nests));
        check("deploy", None);
        check("", None);
    }
}
