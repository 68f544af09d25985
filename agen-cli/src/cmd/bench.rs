//! `agen bench`: a load generator against a self-contained fleet it starts itself, in this
//! process — a Hub and one Nest on loopback port 0 with a temporary data dir, and the scripted
//! fake model (NOT a real model) — with a bundle whose one real tool server is
//! `agen mcp workspace` on a temporary folder (its `read` tool, or `write` with `--tool write`
//! to price the side-effecting path). It submits `--tasks` tasks with `--concurrency`
//! clients and reports throughput, end-to-end latency percentiles (submit → terminal, seen by
//! the client through `WatchTask`) and the ratio of a tool call's time inside a run (the
//! `tool.started` → `tool.completed` span of the run log, from `GetTrace`) to the same call
//! made directly through [`agen_harness::mcp::ToolHost::call`].
//!
//! Invariants: nothing here runs in `cargo test`; the fleet, its instances and tool servers
//! stop before the command returns, and the temporary folder is removed (unless `--keep`);
//! no fixed port is used; results go to stdout (a table, or one JSON object with `-o json`),
//! logs to stderr.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agen_fake_model::{FakeModel, Script, Step};
use agen_proto::v1 as pb;
use anyhow::{bail, Context};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::client::{status_error, ClientArgs, Hub, Output};
use crate::view;

/// Arguments of `agen bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
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
    /// (side-effecting: "started" and "completed" are made durable at the Hub around the call)
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

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Nearest-rank percentiles of `samples` (milliseconds); all zero when empty.
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
            s[i.clamp(1, s.len()) - 1]
        };
        Summary {
            count: s.len(),
            mean: s.iter().sum::<f64>() / s.len() as f64,
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            max: s[s.len() - 1],
        }
    }

    fn json(&self) -> Value {
        json!({
            "count": self.count,
            "mean": round3(self.mean),
            "p50": round3(self.p50),
            "p90": round3(self.p90),
            "p99": round3(self.p99),
            "max": round3(self.max),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// What one load phase measured.
#[derive(Debug, Default)]
struct Phase {
    wall: Duration,
    succeeded: usize,
    failed: Vec<String>,
    /// Submit → terminal seen by the client, ms.
    latency: Vec<f64>,
    /// created → started at the Hub (queueing and dispatch), ms.
    queued: Vec<f64>,
    /// started → finished at the Hub, ms.
    running: Vec<f64>,
    task_ids: Vec<String>,
}

impl Phase {
    fn throughput(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.succeeded as f64 / secs
        } else {
            0.0
        }
    }
}

const DEPLOYMENT: &str = "bench";
const BASELINE_DEPLOYMENT: &str = "bench-baseline";
const READ_FILE: &str = "notes.md";
const WRITE_FILE: &str = "bench-out.txt";

pub async fn run(args: Args) -> anyhow::Result<i32> {
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
        Output::Table => print_table(&report),
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
    steps.push(Step::template("done: {{last_tool_result}}"));
    let model = FakeModel::start(Script::steps(steps), loopback)
        .await
        .context("cannot start the fake model")?;
    let baseline_model = FakeModel::start(Script::steps(vec![Step::reply("done")]), loopback)
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
    write_bundle(&bundle_dir, &model.openai_base_url(), &workspace)?;
    let baseline_dir = root.join("bundle-baseline");
    write_bundle(&baseline_dir, &baseline_model.openai_base_url(), &workspace)?;

    // Raw MCP baseline: the same server, the same call, straight through ToolHost.
    eprintln!("agen bench: timing {} direct tool calls", args.raw_calls);
    let raw = raw_tool_calls(&bundle_dir, &agen_bin, args.tool, args.raw_calls).await?;

    // The fleet: Hub + one Nest, in this process.
    eprintln!(
        "agen bench: starting a Hub and a Nest in {}",
        root.display()
    );
    let hub = agen_hub::start(
        agen_hub::HubOptions {
            data_dir: root.join("hub"),
            listen: loopback,
            insecure_plaintext: args.insecure_plaintext,
            ..agen_hub::HubOptions::default()
        },
        shutdown.child_token(),
    )
    .await
    .context("cannot start the Hub")?;
    let mut nest_opts =
        agen_nest::config::NestOptions::new(hub.url.clone(), hub.join_token.clone());
    nest_opts.data_dir = root.join("nest");
    nest_opts.name = "bench-nest".into();
    nest_opts.agen_bin = agen_bin.clone();
    let nest_token = shutdown.child_token();
    let nest = tokio::spawn(async move {
        if let Err(e) = agen_nest::daemon::run(nest_opts, nest_token).await {
            tracing::error!("bench nest stopped: {e}");
        }
    });
    let client = ClientArgs {
        hub: Some(hub.url.clone()),
        namespace: "default".into(),
        token: Some(hub.admin_token.clone()),
        ca_file: if hub.plaintext {
            None
        } else {
            Some(hub.ca_file.clone())
        },
        output: Output::Table,
    };

    let measured = measure(args, &client, &bundle_dir, &baseline_dir).await;

    shutdown.cancel();
    if let Err(e) = hub.wait().await {
        tracing::warn!("hub stopped with an error: {e}");
    }
    if tokio::time::timeout(Duration::from_secs(20), nest)
        .await
        .is_err()
    {
        tracing::warn!("the bench nest did not stop within 20 s");
    }
    drop(model);
    drop(baseline_model);
    let (phase, baseline, spans) = measured?;
    Ok(report(args, &raw, &phase, baseline.as_ref(), &spans))
}

type Measured = (Phase, Option<Phase>, Spans);

/// Span durations (ms) from the traces of the measured tasks.
#[derive(Debug, Default)]
struct Spans {
    /// `tool.started` → `tool.completed`.
    tool: Vec<f64>,
    /// `model.requested` → `model.answered`.
    model: Vec<f64>,
}

/// Deploys, warms up, runs the measured and the baseline phases, and reads the tool spans.
async fn measure(
    args: &Args,
    client: &ClientArgs,
    bundle_dir: &Path,
    baseline_dir: &Path,
) -> anyhow::Result<Measured> {
    let mut hub = client.connect()?;
    wait_for_nest(&mut hub, Duration::from_secs(60)).await?;
    eprintln!(
        "agen bench: deploying {DEPLOYMENT} ({} replica(s), {} task(s) each at a time)",
        args.replicas, args.instance_concurrency
    );
    let dep = crate::cmd::deploy::deploy(
        &mut hub,
        bundle_dir,
        DEPLOYMENT,
        args.replicas,
        args.instance_concurrency,
        &[],
    )
    .await?;
    crate::cmd::deploy::wait_ready(&mut hub, &dep, Duration::from_secs(120)).await?;

    if args.warmup > 0 {
        eprintln!("agen bench: {} warm-up task(s)", args.warmup);
        let warm = load(
            client,
            DEPLOYMENT,
            args.warmup,
            args.concurrency.min(args.warmup),
            args.task_timeout,
        )
        .await?;
        if !warm.failed.is_empty() {
            bail!("warm-up tasks failed: {}", warm.failed.join("; "));
        }
    }
    eprintln!(
        "agen bench: {} tasks with {} clients",
        args.tasks, args.concurrency
    );
    let phase = load(
        client,
        DEPLOYMENT,
        args.tasks,
        args.concurrency,
        args.task_timeout,
    )
    .await?;
    let spans = trace_spans(&mut hub, &phase.task_ids).await?;

    let baseline = if args.baseline_tasks > 0 && args.tool_calls > 0 {
        let dep = crate::cmd::deploy::deploy(
            &mut hub,
            baseline_dir,
            BASELINE_DEPLOYMENT,
            args.replicas,
            args.instance_concurrency,
            &[],
        )
        .await?;
        crate::cmd::deploy::wait_ready(&mut hub, &dep, Duration::from_secs(120)).await?;
        if args.warmup > 0 {
            load(
                client,
                BASELINE_DEPLOYMENT,
                args.warmup,
                args.concurrency.min(args.warmup),
                args.task_timeout,
            )
            .await?;
        }
        eprintln!(
            "agen bench: {} baseline tasks (no tool call) with {} clients",
            args.baseline_tasks, args.concurrency
        );
        Some(
            load(
                client,
                BASELINE_DEPLOYMENT,
                args.baseline_tasks,
                args.concurrency,
                args.task_timeout,
            )
            .await?,
        )
    } else {
        None
    };
    Ok((phase, baseline, spans))
}

/// A bundle: the fake model at `base_url` and `agen mcp workspace` on `workspace` as server `ws`.
fn write_bundle(dir: &Path, base_url: &str, workspace: &Path) -> anyhow::Result<()> {
    let agent = format!(
        "---\nname: bench\nmodel: openai/fake-bench\nbaseUrl: {base_url}\n---\n\
         You are a benchmark agent. Read {READ_FILE} with the ws tools and answer.\n"
    );
    let mcp = json!({
        "mcpServers": {
            "ws": {
                "command": "agen",
                "args": ["mcp", "workspace", "--root", workspace.to_string_lossy(), "--no-run"]
            }
        }
    });
    let write = |rel: &str, text: &str| -> anyhow::Result<()> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write("x-agen/agent.md", &agent)?;
    write("mcp.json", &serde_json::to_string_pretty(&mcp)?)?;
    Ok(())
}

/// Times `n` sequential calls of `tool` made directly through a [`agen_harness::mcp::ToolHost`]
/// (with a `_meta` like the harness sends); milliseconds per call.
async fn raw_tool_calls(
    bundle_dir: &Path,
    agen_bin: &Path,
    tool: BenchTool,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let bundle = agen_shared::bundle::Bundle::load(bundle_dir)
        .context("the benchmark bundle is not valid")?;
    let host = agen_harness::mcp::ToolHost::start(
        &bundle,
        agen_harness::mcp::LaunchContext::new(agen_bin),
    )
    .await;
    let status = host.status();
    if let Some(p) = status.not_connected.first() {
        host.shutdown().await;
        bail!(
            "the workspace tool server did not start for the raw baseline: {}: {}",
            p.server,
            p.reason
        );
    }
    let meta: serde_json::Map<String, Value> = json!({
        "agen/namespace": "default",
        "agen/deployment": DEPLOYMENT,
        "agen/taskId": "bench-raw",
        "agen/runId": "bench-raw",
        "agen/rootRunId": "bench-raw",
        "traceparent": "00-00000000000000000000000000000001-0000000000000001-01",
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    let args = tool.arguments();
    let qualified = format!("ws.{}", tool.name());
    let mut samples = Vec::with_capacity(n);
    // A few unmeasured calls first, as the fleet phase has a warm-up too.
    for i in 0..n + 5 {
        let start = Instant::now();
        let out = host
            .call(
                &qualified,
                args.clone(),
                meta.clone(),
                Duration::from_secs(30),
                CancellationToken::new(),
            )
            .await;
        let took = start.elapsed();
        match out {
            Ok(o) if !o.is_error => {}
            Ok(o) => {
                host.shutdown().await;
                bail!("the raw {qualified} call failed: {}", o.text);
            }
            Err(e) => {
                host.shutdown().await;
                bail!("the raw {qualified} call failed: {e}");
            }
        }
        if i >= 5 {
            samples.push(took.as_secs_f64() * 1000.0);
        }
    }
    host.shutdown().await;
    Ok(samples)
}

/// Waits until the Hub lists a ready Nest.
async fn wait_for_nest(hub: &mut Hub, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let nests = hub
            .client
            .list_nests(pb::ListNestsRequest::default())
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner()
            .nests;
        if nests.iter().any(|n| view::nest_state(n.state) == "ready") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the bench Nest did not join the Hub within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Submits `n` tasks to `deployment` from `clients` concurrent clients, each waiting for its
/// task to end before submitting the next.
async fn load(
    client: &ClientArgs,
    deployment: &str,
    n: usize,
    clients: usize,
    timeout: Duration,
) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..clients.max(1) {
        let mut hub = client.connect()?;
        let next = next.clone();
        let deployment = deployment.to_owned();
        workers.push(tokio::spawn(async move {
            let mut results = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t0 = Instant::now();
                let r = tokio::time::timeout(timeout, one_task(&mut hub, &deployment, i)).await;
                let latency = t0.elapsed().as_secs_f64() * 1000.0;
                results.push(match r {
                    Ok(r) => r.map(|t| (t, latency)),
                    Err(_) => Err(anyhow::anyhow!("task {i} did not end within {timeout:?}")),
                });
            }
            results
        }));
    }
    let mut phase = Phase::default();
    for w in workers {
        for r in w.await.context("a bench client panicked")? {
            match r {
                Ok((t, latency)) if view::task_state(t.state) == "succeeded" => {
                    phase.succeeded += 1;
                    phase.latency.push(latency);
                    if t.started_at_ms > 0 && t.finished_at_ms >= t.started_at_ms {
                        phase
                            .queued
                            .push((t.started_at_ms - t.created_at_ms).max(0) as f64);
                        phase
                            .running
                            .push((t.finished_at_ms - t.started_at_ms) as f64);
                    }
                    phase.task_ids.push(t.task_id);
                }
                Ok((t, _)) => {
                    let o = t.outcome.unwrap_or_default();
                    phase.failed.push(format!(
                        "{} {}: {}",
                        t.task_id,
                        view::task_state(t.state),
                        o.error
                    ));
                }
                Err(e) => phase.failed.push(format!("{e:#}")),
            }
        }
    }
    phase.wall = started.elapsed();
    Ok(phase)
}

/// Submits one task and follows it (WatchTask, GetTask when the stream ends) to its end.
async fn one_task(hub: &mut Hub, deployment: &str, i: usize) -> anyhow::Result<pb::Task> {
    let task = hub
        .client
        .submit_task(pb::SubmitTaskRequest {
            namespace: hub.namespace.clone(),
            deployment: deployment.to_owned(),
            input: format!("benchmark task {i}: read {READ_FILE}"),
            labels: Default::default(),
            conversation_key: String::new(),
            client_request_id: uuid::Uuid::new_v4().to_string(),
            traceparent: String::new(),
        })
        .await
        .map_err(|s| status_error(hub, s))?
        .into_inner();
    let mut from_seq = 0;
    loop {
        let mut stream = hub
            .client
            .watch_task(pb::WatchTaskRequest {
                namespace: hub.namespace.clone(),
                task_id: task.task_id.clone(),
                from_seq,
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        while let Some(Ok(ev)) = stream.next().await {
            from_seq = ev.seq + 1;
            if let Some(t) = ev.task {
                if view::task_terminal(t.state) {
                    return Ok(t);
                }
            }
        }
        let t = hub
            .client
            .get_task(pb::GetTaskRequest {
                namespace: hub.namespace.clone(),
                task_id: task.task_id.clone(),
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        if view::task_terminal(t.state) {
            return Ok(t);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The durations (ms) of every finished tool and model span in the traces of `tasks`.
async fn trace_spans(hub: &mut Hub, tasks: &[String]) -> anyhow::Result<Spans> {
    let mut out = Spans::default();
    for task_id in tasks {
        let trace = hub
            .client
            .get_trace(pb::GetTraceRequest {
                namespace: hub.namespace.clone(),
                task_id: task_id.clone(),
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        for span in trace
            .spans
            .iter()
            .filter(|s| s.status == "ok" && s.end_ms >= s.start_ms)
        {
            let ms = (span.end_ms - span.start_ms) as f64;
            if span.name.starts_with("tool ") {
                out.tool.push(ms);
            } else if span.name.starts_with("model turn") {
                out.model.push(ms);
            }
        }
    }
    Ok(out)
}

fn report(
    args: &Args,
    raw: &[f64],
    phase: &Phase,
    baseline: Option<&Phase>,
    spans: &Spans,
) -> Value {
    let raw_s = Summary::of(raw);
    let span_s = Summary::of(&spans.tool);
    let lat = Summary::of(&phase.latency);
    let ratio = if raw_s.mean > 0.0 && span_s.count > 0 {
        span_s.mean / raw_s.mean
    } else {
        0.0
    };
    let mut tool_call = json!({
        "raw_mcp_ms": raw_s.json(),
        "in_run_span_ms": span_s.json(),
        "ratio_in_run_to_raw": round3(ratio),
        "overhead_ms": round3(if span_s.count > 0 { span_s.mean - raw_s.mean } else { 0.0 }),
    });
    let baseline_json = baseline.map(|b| {
        let bl = Summary::of(&b.latency);
        let per_round = if args.tool_calls > 0 {
            (lat.mean - bl.mean) / f64::from(args.tool_calls)
        } else {
            0.0
        };
        tool_call["in_run_round_ms"] = json!(round3(per_round));
        tool_call["ratio_round_to_raw"] = json!(round3(if raw_s.mean > 0.0 {
            per_round / raw_s.mean
        } else {
            0.0
        }));
        json!({
            "tasks": b.succeeded + b.failed.len(),
            "succeeded": b.succeeded,
            "failed": b.failed.len(),
            "throughput_tasks_per_s": round3(b.throughput()),
            "latency_ms": bl.json(),
        })
    });
    json!({
        "date": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "transport": if args.insecure_plaintext { "plaintext" } else { "tls" },
        // Other work on the machine skews every number: record the 1-minute load at the end.
        "loadavg_1m": std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse::<f64>().ok())),
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "replicas": args.replicas,
        "instance_concurrency": args.instance_concurrency,
        "tool_calls_per_task": args.tool_calls,
        "tool": format!("ws.{}", args.tool.name()),
        "succeeded": phase.succeeded,
        "failed": phase.failed.len(),
        "failures": phase.failed.iter().take(5).collect::<Vec<_>>(),
        "wall_s": round3(phase.wall.as_secs_f64()),
        "throughput_tasks_per_s": round3(phase.throughput()),
        "latency_ms": lat.json(),
        "hub_queued_ms": Summary::of(&phase.queued).json(),
        "hub_running_ms": Summary::of(&phase.running).json(),
        "model_turn_span_ms": Summary::of(&spans.model).json(),
        "tool_call": tool_call,
        "baseline_no_tool": baseline_json,
    })
}

fn print_table(r: &Value) {
    let f = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.2}"),
        None => v.to_string(),
    };
    crate::outln!(
        "agen bench ({} build, {} cores, load {}, {}): {} tasks, {} clients, {} replica(s) x {} task(s) at a time, {} call(s) of {} per task",
        r["build"].as_str().unwrap_or(""),
        r["cores"],
        r["loadavg_1m"],
        r["transport"].as_str().unwrap_or(""),
        r["tasks"],
        r["concurrency"],
        r["replicas"],
        r["instance_concurrency"],
        r["tool_calls_per_task"],
        r["tool"].as_str().unwrap_or("")
    );
    crate::outln!(
        "succeeded {} failed {} in {} s: {} tasks/s",
        r["succeeded"],
        r["failed"],
        f(&r["wall_s"]),
        f(&r["throughput_tasks_per_s"])
    );
    for e in r["failures"].as_array().into_iter().flatten() {
        crate::outln!("  failure: {}", e.as_str().unwrap_or(""));
    }
    let mut t = view::table(&["ms", "n", "mean", "p50", "p90", "p99", "max"]);
    let mut row = |name: &str, s: &Value| {
        if s.is_null() {
            return;
        }
        t.add_row(vec![
            name.to_string(),
            s["count"].to_string(),
            f(&s["mean"]),
            f(&s["p50"]),
            f(&s["p90"]),
            f(&s["p99"]),
            f(&s["max"]),
        ]);
    };
    row("task end-to-end (client)", &r["latency_ms"]);
    row("  queued at hub", &r["hub_queued_ms"]);
    row("  running at hub", &r["hub_running_ms"]);
    row("  model turn (span)", &r["model_turn_span_ms"]);
    row(
        "task without tool (client)",
        &r["baseline_no_tool"]["latency_ms"],
    );
    row("tool call, raw MCP", &r["tool_call"]["raw_mcp_ms"]);
    row(
        "tool call, in run (span)",
        &r["tool_call"]["in_run_span_ms"],
    );
    crate::outln!("{t}");
    let tc = &r["tool_call"];
    crate::outln!(
        "tool call in a run / raw MCP call: {}x (overhead {} ms per call, ms-resolution spans)",
        f(&tc["ratio_in_run_to_raw"]),
        f(&tc["overhead_ms"])
    );
    if !tc["in_run_round_ms"].is_null() {
        crate::outln!(
            "one tool round in a run (task with tools - task without, per call; includes a model turn): {} ms = {}x the raw call",
            f(&tc["in_run_round_ms"]),
            f(&tc["ratio_round_to_raw"])
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&samples);
        assert_eq!(
            (s.count, s.mean, s.p50, s.p90, s.p99, s.max),
            (100, 50.5, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(Summary::of(&[]), Summary::default());
        assert_eq!(Summary::of(&[7.0]).p99, 7.0);
    }
}
