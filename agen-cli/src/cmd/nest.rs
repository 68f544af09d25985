//! `agen nest`: the node daemon. Parses flags into [`NestOptions`], wires SIGTERM/SIGINT to the
//! shutdown token and calls `agen_nest::daemon::run`. Logs go to stderr; stdout stays empty.
//! A bad flag exits 64. The join token comes from `--join-file`, else `AGEN_JOIN_TOKEN`, else
//! `--join` (which warns: a command line is readable by every local user).

use std::path::PathBuf;

use agen_nest::config::{default_data_dir, host_name, NestOptions, DEFAULT_CAPACITY};
use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::parse_labels;

/// Arguments of `agen nest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Read flag values from this TOML file: keys are the long flags (`hub = "https://…"`,
    /// `label = ["zone=eu-1"]`); flags and AGEN_NEST_<FLAG> variables win over it; SIGHUP reads
    /// it again and applies what can change live (log-level, label, cordon)
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Log level of the Nest's own lines (error, warn, info, debug, trace, or directives)
    /// [default: RUST_LOG, else info]; SIGHUP applies a new one
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// The configuration these flags, variables and file make (set by `daemon_config`)
    #[arg(skip)]
    pub effective: crate::daemon_config::Effective,
    /// Log format on stderr: text (colour only on a terminal; syslog priorities under systemd) or json
    #[arg(long, env = "AGEN_LOG_FORMAT", default_value = "text")]
    pub log_format: agen_shared::telemetry::LogFormat,
    /// Serve this Nest's Prometheus metrics at http://ADDR/metrics
    #[arg(long, value_name = "ADDR", env = "AGEN_NEST_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// A file holding the bearer token /metrics needs (Prometheus `authorization:
    /// credentials_file`); /healthz and /readyz never need it
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// On SIGTERM, how long running runs may finish (no new ones come) before the Nest leaves
    /// and hands the rest over (keep it below the unit's TimeoutStopSec=30s)
    #[arg(long, value_name = "D", default_value = "20s", value_parser = crate::cmd::parse_duration)]
    pub stop_grace: std::time::Duration,
    /// How long this Nest keeps its runs while it hears from no Hub (a Hub restart or pause
    /// shorter than this interrupts no run); past it the Nest stops them and the Hub resumes
    /// them from their logs when it is back
    #[arg(long, value_name = "D", default_value = "30s", value_parser = crate::cmd::parse_duration)]
    pub nest_lease: std::time::Duration,
    /// The Hub's URL, e.g. https://hub.example:7443 (required to run)
    #[arg(long, env = "AGEN_HUB")]
    pub hub: Option<String>,
    /// A file holding the join token, e.g. a copy of <hub data dir>/join-token (mode 0600)
    #[arg(long = "join-file", value_name = "PATH")]
    pub join_file: Option<PathBuf>,
    /// The join token itself: visible to every local user in `ps`; prefer --join-file or
    /// AGEN_JOIN_TOKEN
    #[arg(long = "join", value_name = "TOKEN", hide_env_values = true)]
    pub join: Option<String>,
    /// Where the node id, the bundle cache and the instance socket live
    /// [default: ~/.local/share/agen/nest]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The Nest's name in `agen nests` [default: the host name for the first Nest on a host,
    /// `<host>-<6 hex of sha256(data dir)>` for others]
    #[arg(long)]
    pub name: Option<String>,
    /// A label for placement selectors (repeatable)
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Start cordoned: no new placements on this Nest (its file key `cordon = true`); a
    /// SIGHUP that changes it cordons or uncordons the Nest, while `agen nests cordon` /
    /// `uncordon` win until the file changes again
    #[arg(long)]
    pub cordon: bool,
    /// Maximum number of instances
    #[arg(long, default_value_t = DEFAULT_CAPACITY)]
    pub capacity: u32,
    #[command(flatten)]
    pub run_as: RunAsArgs,
}

/// What `agen nest` does instead of running the Nest.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Print the configuration `agen nest` would run with (these flags, AGEN_NEST_* variables,
    /// --config FILE, defaults) as TOML, each value's source in a comment; secrets never shown
    Config,
}

/// Who instances run as (`agen nest` and `agen up`).
#[derive(Debug, Clone, clap::Args)]
pub struct RunAsArgs {
    /// When the Nest runs as root: each instance and its tool servers run under a uid (and gid)
    /// of their own from this range (no passwd entry needed)
    #[arg(long, value_name = "FIRST-LAST", default_value = "61000-61999", value_parser = agen_nest::separation::parse_uid_range)]
    pub run_uids: agen_nest::separation::RunAs,
    /// Run every instance as this one user instead of a uid each
    #[arg(long, value_name = "USER", conflicts_with = "run_as_self")]
    pub run_as: Option<String>,
    /// No separation: instances and tool servers run as the Nest's own user (said at start and
    /// in `agen nests`)
    #[arg(long)]
    pub run_as_self: bool,
    /// What a separated instance may connect to when its bundle has no `network.allow` in
    /// x-agen/config.json: allow (anything but the Nest host's own addresses, link-local
    /// addresses and the Hub's and Nest's ports) or deny (only the bundle's model endpoint)
    #[arg(long, value_name = "allow|deny", default_value = "allow", value_parser = agen_nest::netns::EgressDefault::parse)]
    pub egress_default: agen_nest::netns::EgressDefault,
    /// Separated instances share the host's network (no namespace of their own, no egress
    /// proxy; said at start and in `agen nests`)
    #[arg(long)]
    pub shared_network: bool,
    /// With separation: the folder for run dirs and the Nest's socket (default /run/agen); a
    /// separating Nest refuses to start when neither is there, never falling back to a shared
    /// temp folder
    #[arg(long, value_name = "DIR")]
    pub run_root: Option<PathBuf>,
}

impl RunAsArgs {
    pub fn run_as(&self) -> agen_nest::separation::RunAs {
        use agen_nest::separation::RunAs;
        if self.run_as_self {
            RunAs::Myself
        } else if let Some(user) = &self.run_as {
            RunAs::User(user.clone())
        } else {
            self.run_uids.clone()
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(Action::Config) = args.action {
        crate::out::line(args.effective.to_toml().trim_end());
        return Ok(0);
    }
    // Everything this daemon and its children create is private to its user (umask 077).
    agen_shared::private::restrict_umask();
    crate::cmd::raise_open_file_limit();
    if let Err(e) = agen_shared::telemetry::filter_for(args.log_level.as_deref(), "info") {
        eprintln!("error: --log-level: {e}");
        return Ok(64);
    }
    let log_filter =
        agen_shared::telemetry::init_reloadable(args.log_level.as_deref(), "info", args.log_format);
    let reloads = super::reload::Reloads::listen()?;
    let Some(hub) = args.hub.clone() else {
        eprintln!(
            "error: no Hub URL: pass --hub URL, set AGEN_HUB, or put hub = \"https://…\" in the --config file"
        );
        return Ok(64);
    };
    let labels = match parse_labels(&args.labels) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(64);
        }
    };
    let join = match join_token(args.join_file.as_deref(), args.join) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(64);
        }
    };
    let mut opts = NestOptions::new(hub, join);
    opts.data_dir = args.data_dir.unwrap_or_else(default_data_dir);
    match args.name {
        Some(name) => opts.name = name,
        None => {
            opts.name = host_name();
            opts.fallback_name = agen_nest::config::fallback_name(&opts.data_dir);
        }
    }
    opts.settings.set(agen_nest::config::NodeSettings {
        labels,
        cordon: args.cordon,
    });
    opts.capacity = args.capacity;
    opts.run_as = args.run_as.run_as();
    opts.egress_default = args.run_as.egress_default;
    opts.shared_network = args.run_as.shared_network;
    opts.run_root = args.run_as.run_root.clone();
    opts.metrics_listen = args.metrics_listen;
    opts.metrics_token = match args
        .metrics_token_file
        .as_deref()
        .map(crate::cmd::read_token_file)
    {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return Ok(64);
        }
    };
    opts.stop_grace = args.stop_grace;
    opts.nest_lease = args.nest_lease;
    opts.commit = crate::cmd::version::COMMIT.into();
    opts.agen_bin =
        std::env::current_exe().context("while finding the agen binary to run instances with")?;
    if let Err(e) = opts.validate() {
        eprintln!("error: {e}");
        return Ok(64);
    }

    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone())?;
    reloads.spawn(
        args.effective.clone(),
        super::reload::Live {
            log: log_filter,
            retention: None,
            nest: Some(opts.settings.clone()),
        },
    );
    match agen_nest::daemon::run(opts, shutdown).await {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(if e.is_config() { 64 } else { 1 })
        }
    }
}

/// The join token: `--join-file`, else `AGEN_JOIN_TOKEN`, else `--join` (with a warning).
fn join_token(file: Option<&std::path::Path>, flag: Option<String>) -> anyhow::Result<String> {
    if let Some(path) = file {
        return Ok(agen_nest::config::read_join_file(path)?);
    }
    if let Some(t) = std::env::var(agen_nest::config::JOIN_TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok(t.trim().to_string());
    }
    match flag {
        Some(t) => {
            tracing::warn!(
                "--join puts the join token on the command line, where every local user can read it (ps, /proc); use --join-file PATH or AGEN_JOIN_TOKEN"
            );
            Ok(t)
        }
        None => anyhow::bail!(
            "no join token: pass --join-file PATH (e.g. a copy of <hub data dir>/join-token) or set {}",
            agen_nest::config::JOIN_TOKEN_ENV
        ),
    }
}

/// SIGTERM and SIGINT cancel `token` (a second signal exits at once).
pub fn spawn_signal_handler(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term =
        signal(SignalKind::terminate()).context("while installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("while installing the SIGINT handler")?;
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("signal received: shutting down");
        token.cancel();
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: exiting now");
        std::process::exit(130);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn check(input: &[&str], expected: Result<Vec<(&str, &str)>, &str>) {
        let input: Vec<String> = input.iter().map(|s| s.to_string()).collect();
        let got = parse_labels(&input);
        let expected = expected
            .map(|v| {
                v.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            })
            .map_err(str::to_string);
        assert_eq!(got, expected);
    }

    #[test]
    fn labels_are_key_value_pairs() {
        check(
            &["zone=eu-1", "gpu=true"],
            Ok(vec![("gpu", "true"), ("zone", "eu-1")]),
        );
        check(&["empty="], Ok(vec![("empty", "")]));
        check(&["a=b=c"], Ok(vec![("a", "b=c")]));
        check(
            &["zone"],
            Err("--label zone: expected key=value, e.g. --label zone=eu-1"),
        );
        check(
            &["=v"],
            Err("--label =v: expected key=value, e.g. --label zone=eu-1"),
        );
    }
}
