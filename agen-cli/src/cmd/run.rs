//! `agen run DIR PROMPT`: a bundle standalone, no Hub; the same harness as in a fleet.
//! `agen run --resume RUN` carries on a run a kill or crash interrupted, from its local run log
//! (`agen runs` lists them).

use std::path::PathBuf;

/// Arguments of `agen run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The bundle folder (with --resume: optional, the run log names it)
    pub dir: Option<PathBuf>,
    /// What to ask the agent (not with --resume)
    pub prompt: Option<String>,
    /// Override the model of x-agen/agent.md (`<provider>/<model>`)
    #[arg(long)]
    pub model: Option<String>,
    /// Approve every call that needs approval (`permissions.ask`) without asking
    #[arg(long)]
    pub approve_all: bool,
    /// Resume run RUN from its local run log: answered model turns are not asked again,
    /// finished calls are not repeated, an interrupted side-effecting call is reported to the
    /// model as effect_unknown (`agen runs` lists the runs)
    #[arg(long, value_name = "RUN", conflicts_with = "prompt")]
    pub resume: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    // `RUST_LOG=debug agen run …` logs the harness (model requests, tool servers, calls) to
    // stderr; without it the output stays the run's own.
    if std::env::var_os("RUST_LOG").is_some() {
        agen_shared::telemetry::init("warn");
    }
    if let Some(run_id) = args.resume {
        return agen_harness::standalone::resume_cli(
            &run_id,
            args.dir,
            args.model,
            args.approve_all,
        )
        .await;
    }
    let (Some(dir), Some(prompt)) = (args.dir, args.prompt) else {
        eprintln!("error: agen run needs a bundle folder and a prompt: agen run DIR PROMPT (or agen run --resume RUN)");
        return Ok(agen_harness::standalone::EXIT_BAD_INPUT);
    };
    agen_harness::standalone::run_cli_with(dir, prompt, args.model, args.approve_all).await
}
