//! `agen fake-model`: the scripted fake model (not a real model) for tests and demos.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `agen fake-model`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The script: a JSON file of steps
    #[arg(long)]
    pub script: PathBuf,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Write the bound port to this file once listening
    #[arg(long)]
    pub port_file: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("info");
    agen_fake_model::serve_cli(args.script, args.listen, args.port_file).await?;
    Ok(0)
}
