//! `agen bench`: a load generator against a self-contained fleet it starts itself, in this
//! process — a Hub and one Nest on loopback port 0 with a temporary data dir, and the scripted
//! fake model (NOT a real model) — with a bundle whose one real tool server is
//! `agen mcp workspace` on a temporary folder (its `read` tool, or `write` with `--tool write`
//! to price the side-effecting path). It submits `--tasks` tasks with `--concurrency`
//! clients and reports throughput (tasks/s and tool calls/s), end-to-end latency percentiles
//! (submit → terminal, seen by the client through `WatchTask`), the Hub's fsyncs per second
//! and run events per fsync over the measured phase (scraped from its `/metrics`), and the
//! ratio of a tool call's time inside a run (the `tool.started` → `tool.completed` span of the
//! run log, from `GetTrace`) to the same call made directly through
//! [`agen_harness::mcp::ToolHost::call`].
//!
//! Layout: this file parses the flags and runs the phases in order; [`fleet`] starts and stops
//! the Hub, the Nest and the bundles; [`raw`] times the direct tool calls; [`load`] is the load
//! loop (clients, phases, trace spans); [`metrics`] scrapes the Hub's fsync counters around
//! the measured phase; [`report`] turns what was measured into the table or
//! the JSON object.
//!
//! Invariants: nothing here runs in `cargo test`; the fleet, its instances and tool servers
//! stop before the command returns, and the temporary folder is removed (unless `--keep`);
//! no fixed port is used; results go to stdout (a table, or one JSON object with `-o json`),
//! logs to stderr.

mod cpu;
mod fleet;
mod load;
mod metrics;
mod raw;
mod report;
pub mod sim;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agen_fake_model::{FakeModel, Script, Step};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::client::Output;
use crate::view;

pub use report::Summary;

/// Arguments of `agen bench`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// `agen bench fleet`: the fleet simulator (without: the single-Nest load benchmark)
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// Number of measured tasks
    #[arg(long, default_value_t = 200)]
    pub tasks: usize,
    /// Clients submitting and waiting at the same time
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Instances of the benchmark deployment
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Tasks one instance runs at a time (the deployment's concurrency)
    #[arg(long, default_value_t = 4)]
    pub instance_concurrency: u32,
    /// Tool calls per task; 0 measures the bare task path
    #[arg(long, default_value_t = 1)]
    pub tool_calls: u32,
    /// The workspace tool called: `read` (read-only: streamed to the run log) or `write`
    /// (side-effecting: the call waits until its "started" is durable at the Hub; its
    /// "completed" is streamed, durable before anything after it)
    #[arg(long, value_enum, default_value = "read")]
    pub tool: BenchTool,
    /// Direct `ToolHost::call`s timed for the raw MCP baseline
    #[arg(long, default_value_t = 200)]
    pub raw_calls: usize,
    /// Also run this many tasks that call no tool, to price one tool round inside a run
    #[arg(long, default_value_t = 50)]
    pub baseline_tasks: usize,
    /// Tasks run (and not measured) before the measurement
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Time between the pieces (8 characters each) of the models' streamed answers; with
    /// it, the time to the first token is visibly shorter than a task's end (the default
    /// `read` answer, ~730 characters, streams over ~90 pieces)
    #[arg(long, default_value = "0s", value_parser = crate::cmd::parse_duration)]
    pub piece_delay: Duration,
    /// Give up on one task after this long
    #[arg(long, default_value = "120s", value_parser = crate::cmd::parse_duration)]
    pub task_timeout: Duration,
    /// Serve the Hub over plaintext gRPC on loopback instead of TLS
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// Keep the temporary folder (Hub and Nest data, logs) and print its path
    #[arg(long)]
    pub keep: bool,
    /// Output format: table (for people) or json (for scripts)
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

/// The benchmarks beside the default one.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Simulate N Nests (real mTLS clients, one process) against a real `agen hub` and measure
    /// joins, placements, dispatch, a Nest kill and the Hub's cost at that size
    Fleet(sim::Args),
}

/// Which `agen mcp workspace` tool the benchmark calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchTool {
    Read,
    Write,
}

impl BenchTool {
    fn name(self) -> &'static str {
        match self {
            BenchTool::Read => "read",
            BenchTool::Write => "write",
        }
    }

    fn arguments(self) -> Value {
        match self {
            BenchTool::Read => json!({ "path": READ_FILE }),
            BenchTool::Write => json!({ "path": WRITE_FILE, "content": "written by agen bench\n" }),
        }
    }
}

/// Removes the benchmark folder on drop unless asked to keep it.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("agen bench: kept {}", self.path.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("agen bench: cannot remove {}: {e}", self.path.display());
        }
    }
}

const DEPLOYMENT: &str = "bench";
const BASELINE_DEPLOYMENT: &str = "bench-baseline";
const READ_FILE: &str = "notes.md";
const WRITE_FILE: &str = "bench-out.txt";

pub async fn run(mut args: Args) -> anyhow::Result<i32> {
    if let Some(BenchCommand::Fleet(fleet)) = args.command.take() {
        return sim::run(fleet).await;
    }
    agen_shared::telemetry::init("warn");
    if args.tasks == 0 || args.concurrency == 0 {
        bail!("--tasks and --concurrency must be at least 1");
    }
    let root = std::env::temp_dir().join(format!("agen-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let tmp = TempDir {
        path: root.clone(),
        keep: args.keep,
    };
    let shutdown = CancellationToken::new();
    crate::cmd::cancel_on_signals(shutdown.clone());
    let result = tokio::select! {
        r = bench(&args, &tmp.path, shutdown.clone()) => r,
        _ = shutdown.cancelled() => Err(anyhow::anyhow!("agen bench was interrupted")),
    };
    shutdown.cancel();
    drop(tmp);
    let report = result?;
    match args.output {
        Output::Json | Output::Yaml => view::print_value(args.output, &report),
        Output::Table => report::print_table(&report),
    }
    // A benchmark whose tasks failed measured something else: say so in the exit code.
    Ok(if report["failed"].as_u64().unwrap_or(0) > 0 {
        1
    } else {
        0
    })
}

/// Starts the fleet, runs every phase, stops the fleet; returns the report.
async fn bench(args: &Args, root: &Path, interrupt: CancellationToken) -> anyhow::Result<Value> {
    // The fleet stops on its own token; cancelling it must not look like an interrupt.
    let shutdown = interrupt.child_token();
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let agen_bin = std::env::current_exe().context("cannot find the agen binary")?;

    // The fake models: one calls the workspace tool `tool_calls` times, then answers.
    let mut steps: Vec<Step> = (0..args.tool_calls)
        .map(|_| Step::call(format!("ws_{}", args.tool.name()), args.tool.arguments()))
        .collect();
    let piece_delay_ms = u64::try_from(args.piece_delay.as_millis()).unwrap_or(u64::MAX);
    let streamed = |mut step: Step| {
        step.chunk_delay_ms = Some(piece_delay_ms);
        step
    };
    steps.push(streamed(Step::template("done: {{last_tool_result}}")));
    // Nobody reads what the models were sent, and thousands of ever longer conversations kept
    // in memory cost the measured fleet's process page faults.
    let model = FakeModel::start_unrecorded(Script::steps(steps), loopback)
        .await
        .context("cannot start the fake model")?;
    let baseline_model =
        FakeModel::start_unrecorded(Script::steps(vec![streamed(Step::reply("done"))]), loopback)
            .await
            .context("cannot start the fake model")?;

    let workspace = root.join("workspace");
    std::fs::create_dir_all(&workspace)
        .with_context(|| format!("cannot create {}", workspace.display()))?;
    std::fs::write(
        workspace.join(READ_FILE),
        "# Notes\n\nThe benchmark reads this file.\n".repeat(20),
    )
    .context("cannot write the benchmark workspace file")?;
    let bundle_dir = root.join("bundle");
    fleet::write_bundle(&bundle_dir, &model.openai_base_url(), &workspace)?;
    let baseline_dir = root.join("bundle-baseline");
    fleet::write_bundle(&baseline_dir, &baseline_model.openai_base_url(), &workspace)?;

    // Raw MCP baseline: the same server, the same call, straight through ToolHost.
    eprintln!("agen bench: timing {} direct tool calls", args.raw_calls);
    let raw = raw::tool_calls(&bundle_dir, &agen_bin, args.tool, args.raw_calls).await?;

    // The fleet: Hub + one Nest, in this process.
    eprintln!(
        "agen bench: starting a Hub and a Nest in {}",
        root.display()
    );
    let fleet = fleet::Fleet::start(args, root, &agen_bin, shutdown).await?;

    let measured = load::measure(
        args,
        &fleet.client,
        fleet.metrics_addr,
        &bundle_dir,
        &baseline_dir,
    )
    .await;

    fleet.stop().await;
    drop(model);
    drop(baseline_model);
    Ok(report::report(args, &raw, &measured?))
}
