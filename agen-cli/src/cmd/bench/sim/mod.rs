//! `agen bench fleet`: a fleet simulator. N simulated Nests in this process, each a real
//! `NestService` client over mutual TLS with a certificate of its own (joined with the join
//! token, as a Nest joins), drive a real `agen hub` in another process (started here, or
//! `--hub URL`): they join, heartbeat at the Hub's rate with every instance's report, take
//! placements, run simulated runs (a few events, one side-effecting call durable before it
//! runs, a finish), and a share of them is killed mid-run and comes back. It reports joins/s,
//! placements/s, dispatches/s and run events/s with submit→start latency, the Hub's RSS, CPU
//! per heartbeat and per event, open descriptors and store size, the time from the kill to the
//! instances re-placed and the runs resumed, and how long `agen nests`, `agen ps --all` and
//! `ListTasks` take at that size; as a table or `-o json`.
//!
//! Layout: this file parses the flags and runs the phases in order; [`hub`] starts (or
//! reaches) the Hub and reads its process; [`nest`] is one simulated Nest; [`runs`] one
//! simulated run; [`phases`] the measured phases; [`stats`] the shared counters and ledgers;
//! [`report`] the result.
//!
//! Invariants: nothing here runs in `cargo test` beyond its unit tests (the e2e test runs the
//! command at a tiny size); a Hub started here and every simulated Nest stop before the command
//! returns and the temporary folder is removed (unless `--keep`); no fixed port; results go to
//! stdout, logs to stderr; the exit code is 1 when a task was lost or run twice.

mod hub;
mod nest;
mod nest_state;
mod phases;
mod report;
mod runs;
mod stats;

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::client::{ClientArgs, Output};

pub use report::Report;

/// Arguments of `agen bench fleet`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Simulated Nests
    #[arg(long, default_value_t = 100)]
    pub nests: usize,
    /// Instances deployed per Nest (the deployment's replicas are nests × this)
    #[arg(long, default_value_t = 10)]
    pub instances_per_nest: u32,
    /// Instances each Nest offers (default: twice --instances-per-nest, room for re-placement)
    #[arg(long)]
    pub capacity: Option<u32>,
    /// Tasks submitted in the task phase (0: no task phase, no kill)
    #[arg(long, default_value_t = 200)]
    pub tasks: usize,
    /// Tasks submitted per second
    #[arg(long, default_value_t = 100.0)]
    pub task_rate: f64,
    /// How long one simulated run takes (two model turns and its tool call)
    #[arg(long, default_value = "2s", value_parser = crate::cmd::parse_duration)]
    pub run_time: Duration,
    /// Share of the Nests killed mid-run (percent; those holding the most runs); 0: none
    #[arg(long, default_value_t = 10.0)]
    pub kill_percent: f64,
    /// How long the fleet is held with no tasks to measure the Hub at rest
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub hold: Duration,
    /// Nests joining (CA fetch + Join) at once
    #[arg(long, default_value_t = 64)]
    pub join_concurrency: usize,
    /// Give up on a phase after this long
    #[arg(long, default_value = "600s", value_parser = crate::cmd::parse_duration)]
    pub timeout: Duration,
    /// Drive this running Hub instead of starting one (needs --join-file; the API client from
    /// the usual client settings)
    #[arg(long)]
    pub hub: Option<String>,
    /// The join token file of the --hub Hub
    #[arg(long, requires = "hub")]
    pub join_file: Option<PathBuf>,
    /// The --hub Hub's pid, for its RSS, CPU and descriptors
    #[arg(long, requires = "hub")]
    pub hub_pid: Option<u32>,
    /// The --hub Hub's data dir, for its store size
    #[arg(long, requires = "hub")]
    pub hub_data_dir: Option<PathBuf>,
    /// The started Hub's store (`postgres://…`; default: its local store)
    #[arg(long, conflicts_with = "hub")]
    pub store: Option<String>,
    /// One more flag for the started Hub, e.g. --hub-arg=--nest-ttl=10s (repeatable)
    #[arg(long = "hub-arg", allow_hyphen_values = true, conflicts_with = "hub")]
    pub hub_args: Vec<String>,
    /// Keep the temporary folder (Hub data and log, Nest identities) and print its path
    #[arg(long)]
    pub keep: bool,
    /// Output format: table (for people) or json (for scripts)
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("warn");
    if args.nests == 0 || args.instances_per_nest == 0 {
        bail!("--nests and --instances-per-nest must be at least 1");
    }
    if args.task_rate <= 0.0 || !(0.0..=100.0).contains(&args.kill_percent) {
        bail!("--task-rate must be above 0 and --kill-percent within 0..=100");
    }
    // Every simulated Nest holds a connection.
    crate::cmd::raise_open_file_limit();
    let root = std::env::temp_dir().join(format!("agen-fleet-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let result = simulate(&args, &root).await;
    if args.keep {
        eprintln!("agen bench fleet: kept {}", root.display());
    } else if let Err(e) = std::fs::remove_dir_all(&root) {
        eprintln!("agen bench fleet: cannot remove {}: {e}", root.display());
    }
    let report = result?;
    match args.output {
        Output::Json | Output::Yaml => {
            crate::view::print_value(args.output, &serde_json::to_value(&report)?)
        }
        Output::Table => report::print_table(&report),
    }
    Ok(if report.tasks.lost > 0 || report.tasks.twice > 0 {
        1
    } else {
        0
    })
}

async fn simulate(args: &Args, root: &std::path::Path) -> anyhow::Result<Report> {
    let hub = match &args.hub {
        Some(url) => {
            let join = args
                .join_file
                .as_deref()
                .context("--hub needs --join-file (the Hub's join token)")?;
            let client = ClientArgs {
                hub: Some(url.clone()),
                namespace: "default".into(),
                token: None,
                ca_file: None,
                output: Output::Table,
            };
            hub::HubProc::attach(url, join, client, args.hub_pid, args.hub_data_dir.clone())?
        }
        None => {
            let mut extra = args.hub_args.clone();
            if let Some(s) = &args.store {
                extra.push(format!("--store={s}"));
            }
            eprintln!("agen bench fleet: starting agen hub in {}", root.display());
            hub::HubProc::start(root, args.nests, &extra).await?
        }
    };
    let shared = Arc::new(nest_state::Shared {
        stats: stats::Stats::new(),
        capacity: args.capacity.unwrap_or(args.instances_per_nest * 2),
        run_time: args.run_time,
        registrations: AtomicUsize::new(0),
        join_permits: tokio::sync::Semaphore::new(args.join_concurrency.max(1)),
    });
    let nests: Vec<nest::SimNest> = (0..args.nests)
        .map(|i| {
            let dir = root.join("nests").join(i.to_string());
            let mut opts =
                agen_nest::config::NestOptions::new(hub.url.clone(), hub.join_token.clone());
            opts.data_dir = dir;
            opts.name = format!("sim-{i}");
            opts.env = Vec::new();
            opts.commit = "simulated".into();
            nest::SimNest::new(i, opts, shared.clone())
        })
        .collect();
    for n in &nests {
        std::fs::create_dir_all(n_dir(root, n.index))?;
    }
    let result = phases::all(args, &hub, &nests, &shared).await;
    for n in &nests {
        n.kill();
    }
    hub.stop().await;
    result
}

fn n_dir(root: &std::path::Path, i: usize) -> PathBuf {
    root.join("nests").join(i.to_string())
}
