//! `agen instance`.

/// Arguments of `agen instance`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("agen instance is being built")
}
