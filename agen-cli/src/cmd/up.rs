//! `agen up`.

/// Arguments of `agen up`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("agen up is being built")
}
