//! The `agen` command line: one module per subcommand under `cmd/`, each with
//! `run(args) -> anyhow::Result<()>`. Client commands speak only gRPC to the Hub (`client`).

pub mod cmd;

use clap::{Parser, Subcommand};

/// Agen runs AI agents as a fleet: a Hub schedules agent deployments onto Nests.
#[derive(Debug, Parser)]
#[command(name = "agen", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a Hub and local Nest(s) in one process (the single-machine default)
    Up(cmd::up::Args),
    /// Run the Hub alone
    Hub(cmd::hub::Args),
    /// Run a Nest (node daemon) that joins a Hub
    Nest(cmd::nest::Args),
    /// Run a bundle standalone, with no Hub, and print the answer
    Run(cmd::run::Args),
    /// Agen's built-in MCP tool servers (stdio)
    #[command(subcommand)]
    Mcp(cmd::mcp::Command),
    /// One agent instance (started by a Nest)
    #[command(hide = true)]
    Instance(cmd::instance::Args),
    /// A scripted fake model over the OpenAI/Anthropic HTTP APIs, for tests and demos
    #[command(hide = true, name = "fake-model")]
    FakeModel(cmd::fake_model::Args),
}

/// Runs the parsed command and returns the process exit code.
pub fn main(cli: Cli) -> i32 {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 70;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Up(a) => cmd::up::run(a).await,
            Command::Hub(a) => cmd::hub::run(a).await,
            Command::Nest(a) => cmd::nest::run(a).await,
            Command::Run(a) => cmd::run::run(a).await,
            Command::Mcp(c) => cmd::mcp::run(c).await,
            Command::Instance(a) => cmd::instance::run(a).await,
            Command::FakeModel(a) => cmd::fake_model::run(a).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
