//! `agen nest`.

/// Arguments of `agen nest`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("agen nest is being built")
}
