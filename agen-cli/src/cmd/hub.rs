//! `agen hub`.

/// Arguments of `agen hub`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("agen hub is being built")
}
