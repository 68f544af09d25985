//! The load loop of `agen bench`: deploy the benchmark bundle, warm up, run the measured
//! phase (`--concurrency` clients, each submitting a task and following it with `WatchTask` to
//! its end before submitting the next) between two scrapes of the Hub's counters, read the
//! measured tasks' traces, then the baseline phase (a model that calls no tool).
//!
//! Invariant: a client measures only its own tasks, submit → terminal; a task that does not
//! end within `--task-timeout` is a failure, never a sample.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use anyhow::{bail, Context};
use futures::StreamExt;

use super::cpu::Sample;
use super::metrics::{scrape, Counters};
use super::{Args, BASELINE_DEPLOYMENT, DEPLOYMENT, READ_FILE};
use crate::client::{status_error, ClientArgs, Hub};
use crate::view;

/// What one load phase measured.
#[derive(Debug, Default)]
pub(super) struct Phase {
    pub wall: Duration,
    pub succeeded: usize,
    pub failed: Vec<String>,
    /// Submit → terminal seen by the client, ms.
    pub latency: Vec<f64>,
    /// Submit → the first piece of the answer seen by the client (time to first token), ms:
    /// its first delta, or the task's end for an answer that came whole.
    pub first_token: Vec<f64>,
    /// Succeeded tasks whose answer reached the client as deltas before the task ended.
    pub streamed: usize,
    /// created → started at the Hub (queueing and dispatch), ms.
    pub queued: Vec<f64>,
    /// started → finished at the Hub, ms.
    pub running: Vec<f64>,
    pub task_ids: Vec<String>,
}

impl Phase {
    pub fn throughput(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.succeeded as f64 / secs
        } else {
            0.0
        }
    }
}

/// Everything the phases measured.
pub(super) struct Measured {
    pub phase: Phase,
    pub baseline: Option<Phase>,
    pub spans: Spans,
    /// The Hub's durability counters over the measured phase (after minus before).
    pub durability: Counters,
    /// CPU the fleet (this process and every process below it) spent in the measured phase,
    /// with how many processes that was at its end; `None` without `/proc`.
    pub cpu: Option<Sample>,
}

/// Span durations (ms) from the traces of the measured tasks.
#[derive(Debug, Default)]
pub(super) struct Spans {
    /// `tool.started` → `tool.completed`.
    pub tool: Vec<f64>,
    /// `model.requested` → `model.answered`.
    pub model: Vec<f64>,
}

/// Deploys, warms up, runs the measured and the baseline phases, and reads the tool spans.
pub(super) async fn measure(
    args: &Args,
    client: &ClientArgs,
    metrics_addr: Option<SocketAddr>,
    bundle_dir: &Path,
    baseline_dir: &Path,
) -> anyhow::Result<Measured> {
    let mut hub = client.connect()?;
    super::fleet::wait_for_nest(&mut hub, Duration::from_secs(60)).await?;
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
    let before = scrape(metrics_addr).await;
    let cpu_before = Sample::now();
    let phase = load(
        client,
        DEPLOYMENT,
        args.tasks,
        args.concurrency,
        args.task_timeout,
    )
    .await?;
    let cpu = match (cpu_before, Sample::now()) {
        (Some(b), Some(a)) => Some(a.since(&b)),
        _ => None,
    };
    let durability = scrape(metrics_addr).await.since(&before);
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
    Ok(Measured {
        phase,
        baseline,
        spans,
        durability,
        cpu,
    })
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
                let r = tokio::time::timeout(timeout, one_task(&mut hub, &deployment, i, t0)).await;
                let latency = t0.elapsed().as_secs_f64() * 1000.0;
                results.push(match r {
                    Ok(r) => r.map(|(t, first)| (t, latency, first)),
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
                Ok((t, latency, first)) if view::task_state(t.state) == "succeeded" => {
                    phase.succeeded += 1;
                    phase.latency.push(latency);
                    phase.streamed += usize::from(first.is_some());
                    phase.first_token.push(first.unwrap_or(latency));
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
                Ok((t, _, _)) => {
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

/// Submits one task and follows it (WatchTask with deltas, GetTask when the stream ends) to
/// its end; also returns when (ms after `t0`) the first piece of an answer arrived.
async fn one_task(
    hub: &mut Hub,
    deployment: &str,
    i: usize,
    t0: Instant,
) -> anyhow::Result<(pb::Task, Option<f64>)> {
    let mut first = None;
    let task = hub
        .client
        .submit_task(pb::SubmitTaskRequest {
            namespace: hub.namespace.clone(),
            deployment: deployment.to_owned(),
            input: format!("benchmark task {i}: read {READ_FILE}"),
            labels: Default::default(),
            conversation_key: String::new(),
            client_request_id: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
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
                deltas: true,
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner();
        while let Some(Ok(ev)) = stream.next().await {
            if let Some(d) = &ev.delta {
                if first.is_none() && !d.text.is_empty() {
                    first = Some(t0.elapsed().as_secs_f64() * 1000.0);
                }
                continue;
            }
            from_seq = ev.seq + 1;
            if let Some(t) = ev.task {
                if view::task_terminal(t.state) {
                    return Ok((t, first));
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
            return Ok((t, first));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The durations (ms) of every finished tool and model span in the traces of `tasks`. A
/// tool call that did not succeed fails the benchmark (timing failed calls measures
/// nothing), naming the task and what its run answered.
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
        if let Some(bad) = trace
            .spans
            .iter()
            .find(|s| s.name.starts_with("tool ") && s.status != "ok")
        {
            let task = hub
                .client
                .get_task(pb::GetTaskRequest {
                    namespace: hub.namespace.clone(),
                    task_id: task_id.clone(),
                })
                .await
                .map_err(|s| status_error(hub, s))?
                .into_inner();
            bail!(
                "tool call `{}` of task {task_id} ended `{}`, not ok; the task answered: {}",
                bad.name,
                bad.status,
                task.outcome.map(|o| o.result).unwrap_or_default()
            );
        }
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
