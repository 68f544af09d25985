//! `agen run DIR PROMPT`: a bundle standalone, no Hub; the same harness as in a fleet.

use std::path::PathBuf;

/// Arguments of `agen run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The bundle folder
    pub dir: PathBuf,
    /// What to ask the agent
    pub prompt: String,
    /// Override the model of x-agen/agent.md (`<provider>/<model>`)
    #[arg(long)]
    pub model: Option<String>,
    /// Approve every call that needs approval (`permissions.ask`) without asking
    #[arg(long)]
    pub approve_all: bool,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    // `RUST_LOG=debug agen run …` logs the harness (model requests, tool servers, calls) to
    // stderr; without it the output stays the run's own.
    if std::env::var_os("RUST_LOG").is_some() {
        agen_shared::telemetry::init("warn");
    }
    agen_harness::standalone::run_cli_with(args.dir, args.prompt, args.model, args.approve_all)
        .await
}
