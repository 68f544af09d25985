//! The `agen` command line: one module per subcommand under `cmd/`, each with
//! `run(args) -> anyhow::Result<()>`. Client commands speak only gRPC to the Hub (`client`).

pub mod client;
pub mod cmd;
pub mod daemon_config;
pub mod exit;
pub mod out;
pub mod table;
pub mod view;
pub mod watch;

use clap::{Parser, Subcommand};

/// Agen runs AI agents as a fleet: a Hub schedules agent deployments onto Nests.
#[derive(Debug, Parser)]
#[command(name = "agen", version, propagate_version = true, after_help = exit::HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a Hub and local Nest(s) in one process (the single-machine default)
    Up(cmd::up::Args),
    /// Run the Hub alone
    Hub(Box<cmd::hub::Args>),
    /// Run a Nest (node daemon) that joins a Hub
    Nest(cmd::nest::Args),
    /// Upload a bundle and create or roll a deployment
    Deploy(cmd::deploy::Args),
    /// Deployments; --all: every instance with its health and tools
    Ps(cmd::ps::Args),
    /// CPU % and memory of every instance and tool server
    Top(cmd::top::Args),
    /// Delete a deployment: its instances stop, its queued tasks fail
    Rm(cmd::rm::Args),
    /// Set a deployment's replica count (no bundle folder needed)
    Scale(cmd::scale::Args),
    /// A deployment's generations: bundle digest, time, replicas, who deployed
    History(cmd::history::Args),
    /// Make a new generation from an old one (default: the previous bundle)
    Rollback(cmd::rollback::Args),
    /// Nests (nodes): liveness and capacity
    Nests(cmd::nests::Args),
    /// Submit a task to a deployment; prints the task id
    Submit(cmd::submit::Args),
    /// Wait for a task to end, showing what its run is doing
    Wait(cmd::wait::Args),
    /// A task's state, progress, activity and outcome, without waiting
    Query(cmd::query::Args),
    /// Cancel a task
    Cancel(cmd::cancel::Args),
    /// List tasks
    Tasks(cmd::tasks::Args),
    /// Pending approvals of `ask` calls
    Approvals(cmd::approvals::ListArgs),
    /// Approve a pending `ask` call (--always: later calls of the tool in the task too)
    Approve(cmd::approvals::ApproveArgs),
    /// Deny a pending `ask` call; the model is told the reason
    Deny(cmd::approvals::DenyArgs),
    /// A task's trace: model turns and tool calls with durations
    Trace(cmd::trace::Args),
    /// The stderr of an instance or of one of its tool servers (-f follows)
    Logs(cmd::logs::Args),
    /// Artifacts saved by agents
    #[command(subcommand)]
    Artifacts(cmd::artifacts::Command),
    /// Deployments as A2A agents: `agen a2a ls` prints each one's agent card URL, `agen a2a
    /// serve` serves one at a local origin of its own
    #[command(subcommand)]
    A2a(cmd::a2a::Command),
    /// Secrets with source platform: set (value from stdin), ls, rm
    #[command(subcommand)]
    Secrets(cmd::secrets::Command),
    /// Tasks on a cron expression: create, ls, pause, resume, rm, run-now
    #[command(subcommand)]
    Schedules(cmd::schedules::Command),
    /// API tokens (a namespace and a role) and Nest join tokens: create, ls, rotate, revoke
    #[command(subcommand)]
    Tokens(cmd::tokens::Command),
    /// The audit log: every mutating call with its token, namespace, target and outcome
    Audit(cmd::audit::Args),
    /// Shell completions: `agen completions bash > /etc/bash_completion.d/agen`
    Completions(cmd::completions::Args),
    /// This build's version, commit and protocol version (MAJOR.MINOR)
    Version(cmd::version::Args),
    /// Run a bundle standalone, with no Hub, and print the answer
    Run(cmd::run::Args),
    /// The local run logs of `agen run`: state, agent, prompt (resume one with agen run --resume RUN)
    Runs(cmd::runs::Args),
    /// Write a new bundle from a template (basic, coder, ci-fixer); --list lists them
    Init(cmd::init::Args),
    /// Agen's built-in MCP tool servers (stdio)
    #[command(subcommand)]
    Mcp(cmd::mcp::Command),
    /// One agent instance (started by a Nest)
    #[command(hide = true)]
    Instance(cmd::instance::Args),
    /// Load-test a self-contained fleet (Hub, Nest, fake model): throughput, latency percentiles, tool-call overhead
    Bench(cmd::bench::Args),
    /// A scripted fake model over the OpenAI/Anthropic HTTP APIs, for tests and demos
    #[command(hide = true, name = "fake-model")]
    FakeModel(cmd::fake_model::Args),
    /// The names a shell completion offers at a place of the command line (asked of the Hub)
    #[command(hide = true, name = "__complete")]
    Complete(cmd::complete::Args),
    /// One Keen script run in a killable child (started by an instance; JSON on stdin/stdout)
    #[command(hide = true, name = "keen-script")]
    KeenScript,
}

/// The async runtime a command runs on. An instance and a tool server are processes of their
/// own, many to a node, that mostly wait for a socket or a pipe: one thread each (blocking
/// work goes to tokio's blocking pool as anywhere), where a multi-threaded runtime's workers
/// spent their CPU waking and parking one another (`perf`, BENCHMARKS.md). Everything else
/// (Hub, Nest, the CLI) gets a worker per core.
fn runtime_for(command: &Command) -> std::io::Result<tokio::runtime::Runtime> {
    match command {
        Command::Instance(_) | Command::Mcp(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
}

/// Runs the parsed command and returns the process exit code.
pub fn main(cli: Cli) -> i32 {
    if let Command::KeenScript = cli.command {
        // No async runtime: the child only runs the script, under its rlimits.
        agen_shared::telemetry::init("info");
        return agen_harness::keen::script_child::serve_stdio();
    }
    // Keen script tools run in children of this binary, killed at their deadline.
    if let Ok(me) = std::env::current_exe() {
        agen_harness::keen::script_child::set_runner(me);
    }
    agen_shared::tls::install_crypto_provider();
    if let Command::Instance(_) = cli.command {
        // Before any thread and before the socket or a secret: non-dumpable, and the
        // capabilities a separated instance gets (to start its tool servers under their own
        // uids) kept on one thread of their own.
        if let Err(e) = agen_shared::privileged::keep_on_privileged_thread() {
            eprintln!("error: agen instance: {e}");
            return 70;
        }
    }
    let rt = match runtime_for(&cli.command) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 70;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Up(a) => cmd::up::run(a).await,
            Command::Hub(a) => cmd::hub::run(*a).await,
            Command::Nest(a) => cmd::nest::run(a).await,
            Command::Deploy(a) => cmd::deploy::run(a).await,
            Command::Ps(a) => cmd::ps::run(a).await,
            Command::Top(a) => cmd::top::run(a).await,
            Command::Rm(a) => cmd::rm::run(a).await,
            Command::Scale(a) => cmd::scale::run(a).await,
            Command::History(a) => cmd::history::run(a).await,
            Command::Rollback(a) => cmd::rollback::run(a).await,
            Command::Nests(a) => cmd::nests::run(a).await,
            Command::Submit(a) => cmd::submit::run(a).await,
            Command::Wait(a) => cmd::wait::run(a).await,
            Command::Query(a) => cmd::query::run(a).await,
            Command::Cancel(a) => cmd::cancel::run(a).await,
            Command::Tasks(a) => cmd::tasks::run(a).await,
            Command::Approvals(a) => cmd::approvals::list(a).await,
            Command::Approve(a) => cmd::approvals::approve(a).await,
            Command::Deny(a) => cmd::approvals::deny(a).await,
            Command::Trace(a) => cmd::trace::run(a).await,
            Command::Logs(a) => cmd::logs::run(a).await,
            Command::Artifacts(c) => cmd::artifacts::run(c).await,
            Command::A2a(c) => cmd::a2a::run(c).await,
            Command::Secrets(c) => cmd::secrets::run(c).await,
            Command::Schedules(c) => cmd::schedules::run(c).await,
            Command::Tokens(c) => cmd::tokens::run(c).await,
            Command::Audit(a) => cmd::audit::run(a).await,
            Command::Completions(a) => cmd::completions::run(a),
            Command::Complete(a) => cmd::complete::run(a).await,
            Command::Version(a) => cmd::version::run(a),
            Command::Run(a) => cmd::run::run(a).await,
            Command::Runs(a) => cmd::runs::run(a).await,
            Command::Init(a) => cmd::init::run(a).await,
            Command::Mcp(c) => cmd::mcp::run(c).await,
            Command::Instance(a) => cmd::instance::run(a).await,
            Command::FakeModel(a) => cmd::fake_model::run(a).await,
            Command::Bench(a) => cmd::bench::run(a).await,
            Command::KeenScript => Ok(agen_harness::keen::script_child::serve_stdio()),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit::of_error(&e)
        }
    }
}
