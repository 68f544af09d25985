//! `agen up`: a Hub and N local Nests in one foreground process — the single-machine default.
//! Writes the client config when none exists (so `agen ps` etc. just work), writes the join
//! token, and with `--deploy DIR` deploys bundles once the Nests have joined.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agen_shared::client_config::ClientConfig;
use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::client::{ClientArgs, Output};

/// Arguments of `agen up`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Log format on stderr: text (colour only on a terminal; syslog priorities under systemd) or json
    #[arg(long, env = "AGEN_LOG_FORMAT", default_value = "text")]
    pub log_format: agen_shared::telemetry::LogFormat,
    /// Where the Hub and the Nests keep their state
    #[arg(long, env = "AGEN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address the Hub listens on
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// Number of local Nests
    #[arg(long, default_value_t = 1)]
    pub nests: u32,
    /// Serve without TLS (loopback addresses only)
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// How long a silent Nest stays alive before its instances are replaced
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub nest_ttl: Duration,
    /// Deploy this bundle once the Nests have joined (repeatable; named after the folder)
    #[arg(long, value_name = "DIR")]
    pub deploy: Vec<PathBuf>,
    /// Who instances run as; with several Nests each gets its own slice of --run-uids
    #[command(flatten)]
    pub run_as: crate::cmd::nest::RunAsArgs,
}

pub fn default_data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("agen")
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    // Everything the Hub, the Nests and their children create is private to this user.
    agen_shared::private::restrict_umask();
    crate::cmd::raise_open_file_limit();
    agen_shared::telemetry::init_with("info", args.log_format);
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    agen_shared::private::prepare_data_dir(&data_dir).with_context(|| {
        format!(
            "cannot create or make private data dir {}",
            data_dir.display()
        )
    })?;
    let run_as = args.run_as.run_as();
    let shutdown = CancellationToken::new();
    crate::cmd::cancel_on_signals(shutdown.clone());

    let hub = agen_hub::start(
        agen_hub::HubOptions {
            data_dir: data_dir.join("hub"),
            listen: args.listen,
            insecure_plaintext: args.insecure_plaintext,
            nest_ttl: args.nest_ttl,
            // Its Nests' instances and tool servers are refused the Hub's port.
            refuse_uids: match &run_as {
                agen_nest::separation::RunAs::Uids { first, last } => vec![*first..=*last],
                _ => agen_hub::HubOptions::default().refuse_uids,
            },
            ..agen_hub::HubOptions::default()
        },
        shutdown.clone(),
    )
    .await
    .context("cannot start the Hub")?;

    let client_cfg = ClientConfig {
        hub: Some(hub.url.clone()),
        hubs: Vec::new(),
        ca_file: if hub.url.starts_with("https://") {
            Some(hub.ca_file.clone())
        } else {
            None
        },
        token: Some(hub.admin_token.clone()),
    };
    crate::cmd::write_client_config(&client_cfg, &data_dir)?;
    // The contract: `<data-dir>/join-token` holds the token other Nests join with.
    let join_file = data_dir.join("join-token");
    agen_shared::tls::write_private(&join_file, format!("{}\n", hub.join_token).as_bytes())
        .with_context(|| format!("cannot write {}", join_file.display()))?;

    let agen_bin = std::env::current_exe().context("cannot find the agen binary")?;
    let host = agen_nest::config::host_name();
    let mut nests = Vec::new();
    for i in 1..=args.nests.max(1) {
        let mut opts = agen_nest::config::NestOptions::new(hub.url.clone(), hub.join_token.clone());
        opts.data_dir = data_dir.join("nests").join(format!("nest-{i}"));
        let name = if i == 1 {
            host.clone()
        } else {
            agen_nest::config::fallback_name(&opts.data_dir)
        };
        opts.name = name;
        opts.agen_bin = agen_bin.clone();
        opts.commit = crate::cmd::version::COMMIT.into();
        opts.run_as = run_as.slice(i - 1, args.nests.max(1));
        opts.egress_default = args.run_as.egress_default;
        opts.shared_network = args.run_as.shared_network;
        opts.run_root = args.run_as.run_root.clone();
        let token = shutdown.child_token();
        nests.push(tokio::spawn(async move {
            if let Err(e) = agen_nest::daemon::run(opts, token).await {
                tracing::error!("nest stopped: {e}");
            }
        }));
    }
    eprintln!(
        "agen up: Hub at {} with {} local Nest(s); data in {}",
        hub.url,
        args.nests.max(1),
        data_dir.display()
    );
    eprintln!(
        "web console: {}/ui/ (sign in with the admin token in {})",
        hub.url,
        data_dir.join("hub").join("admin-token").display()
    );
    // The secret stays in the file (mode 0600): never printed, never on a command line.
    eprintln!(
        "more Nests can join with (copy the file to the other machine first):\n  agen nest --hub {} --join-file {}",
        hub.url,
        join_file.display()
    );

    if !args.deploy.is_empty() {
        let client = ClientArgs {
            hub: Some(hub.url.clone()),
            namespace: "default".into(),
            token: Some(hub.admin_token.clone()),
            ca_file: client_cfg.ca_file.clone(),
            output: Output::Table,
        };
        let shutdown2 = shutdown.clone();
        let deploys = args.deploy.clone();
        tokio::spawn(async move {
            if let Err(e) = deploy_all(client, deploys).await {
                eprintln!("agen up: deploy failed: {e:#}");
                shutdown2.cancel();
            }
        });
    }

    let served = hub.wait().await;
    shutdown.cancel();
    for n in nests {
        let _ = tokio::time::timeout(Duration::from_secs(15), n).await;
    }
    served.context("the Hub stopped with an error")?;
    eprintln!("agen up: stopped");
    Ok(0)
}

async fn deploy_all(client: ClientArgs, dirs: Vec<PathBuf>) -> anyhow::Result<()> {
    let mut hub = client.connect()?;
    for dir in dirs {
        let name = crate::cmd::deploy::validate(&dir)
            .map(|b| crate::cmd::deploy::default_name(&b))
            .with_context(|| format!("bundle {} is not valid", dir.display()))?;
        let dep = crate::cmd::deploy::deploy(&mut hub, &dir, &name, 1, 1, &[]).await?;
        crate::cmd::deploy::wait_ready(&mut hub, &dep, Duration::from_secs(120)).await?;
        eprintln!("agen up: deployed {} from {}", name, dir.display());
    }
    crate::cmd::ps::run(crate::cmd::ps::Args {
        all: true,
        ended: false,
        watch: false,
        client,
    })
    .await?;
    Ok(())
}
