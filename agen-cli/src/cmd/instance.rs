//! `agen instance` (hidden): one agent instance, started by a Nest. Everything happens in
//! `agen_nest::instance`; stdout is unused, logs go to stderr (the Nest forwards them).

use std::path::PathBuf;

use agen_nest::instance::{self, InstanceArgs};
use anyhow::Context;

/// Arguments of `agen instance`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Nest's Unix socket
    #[arg(long)]
    pub socket: PathBuf,
    #[arg(long)]
    pub instance_id: String,
    /// The unpacked bundle
    #[arg(long)]
    pub bundle_dir: PathBuf,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("info");
    let agen_bin = std::env::current_exe().context("while finding the agen binary for AGEN_BIN")?;
    let code = instance::run(InstanceArgs {
        socket: args.socket,
        instance_id: args.instance_id,
        bundle_dir: args.bundle_dir,
        agen_bin,
    })
    .await
    .context("agen instance")?;
    Ok(code)
}
