//! `agen hub`: the Hub alone, in the foreground. Creates its data dir (store, CA, admin and
//! join tokens) on first start, writes the client config when none exists, prints the
//! `agen nest` command that joins it, notifies systemd when ready, and stops gracefully on
//! SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agen_shared::client_config::ClientConfig;
use anyhow::Context;
use tokio_util::sync::CancellationToken;

/// Arguments of `agen hub`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the Hub keeps its state, CA and tokens [default: $AGEN_DATA_DIR/hub, else ~/.local/share/agen/hub]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address to listen on
    #[arg(long, env = "AGEN_HUB_LISTEN", default_value = agen_hub::config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Serve plaintext gRPC instead of TLS (only on a loopback address)
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// How long a silent Nest stays alive before its instances are replaced elsewhere
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub nest_ttl: Duration,
    /// How often Nests heartbeat
    #[arg(long, default_value = "2s", value_parser = crate::cmd::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Another name (host name or IP address) Nests and clients use to reach the Hub, for its
    /// TLS certificate (repeatable)
    #[arg(long = "tls-name", value_name = "NAME")]
    pub tls_names: Vec<String>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("info");
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(agen_hub::default_data_dir);
    let opts = agen_hub::HubOptions {
        data_dir: data_dir.clone(),
        listen: args.listen,
        insecure_plaintext: args.insecure_plaintext,
        nest_ttl: args.nest_ttl,
        heartbeat_interval: args.heartbeat_interval.min(args.nest_ttl),
        tls_names: args.tls_names.clone(),
    };
    if let Err(e) = opts.validate() {
        eprintln!("error: {e}");
        return Ok(64);
    }
    let shutdown = CancellationToken::new();
    crate::cmd::cancel_on_signals(shutdown.clone());
    let hub = agen_hub::start(opts, shutdown.clone())
        .await
        .context("cannot start the Hub")?;

    let client_cfg = ClientConfig {
        hub: Some(hub.url.clone()),
        ca_file: if hub.plaintext {
            None
        } else {
            Some(hub.ca_file.clone())
        },
        token: Some(hub.admin_token.clone()),
    };
    crate::cmd::write_client_config(&client_cfg, &data_dir)?;
    eprintln!(
        "agen hub: listening at {}; data in {}",
        hub.url,
        data_dir.display()
    );
    eprintln!("join a Nest with:\n  {}", hub.nest_command());
    agen_hub::notify_ready();

    hub.wait().await.context("the Hub stopped with an error")?;
    eprintln!("agen hub: stopped");
    Ok(0)
}
