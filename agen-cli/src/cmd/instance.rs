//! `agen instance` (hidden): one agent instance, started by a Nest. Everything happens in
//! `agen_nest::instance`; stdout is unused, logs go to stderr (the Nest forwards them). It takes
//! no arguments: the Nest hands it its socket, id, bundle and secret on an inherited fd.

use agen_nest::instance::{self, InstanceArgs};
use anyhow::Context;

/// Arguments of `agen instance` (none: see the module doc).
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("info");
    let agen_bin = std::env::current_exe().context("while finding the agen binary for AGEN_BIN")?;
    let args = InstanceArgs::from_inherited_fd(agen_bin).context("agen instance")?;
    let code = instance::run(args).await.context("agen instance")?;
    Ok(code)
}
