//! The measured phases of `agen bench fleet`, in order: every Nest joins and registers; one
//! deployment of nests × instances-per-nest replicas is placed; the fleet is held with no task
//! (the Hub at rest); tasks are submitted at a rate while the Nests holding the most runs are
//! killed mid-run (their instances must be placed again and their runs resumed elsewhere);
//! the killed Nests return; the listing commands are timed at that size.
//!
//! Invariant: every wait is bounded by `--timeout` and fails naming what did not happen; the
//! counts in the report are read from the Hub (tasks succeeded) and from the simulated Nests'
//! ledger (side effects executed), never assumed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use anyhow::{bail, Context};

use super::hub::{HubProc, ProcSample};
use super::nest::SimNest;
use super::nest_state::Shared;
use super::report::*;
use super::stats::quantile;
use super::Args;
use crate::client::{status_error, Hub};
use crate::view;

const DEPLOYMENT: &str = "fleet-sim";

/// Polls `done` every 20 ms until it holds; fails after `timeout` naming `what`.
async fn until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Hub's peak RSS seen by the samples taken.
struct Peak(Mutex<u64>);

impl Peak {
    fn sample(&self, hub: &HubProc) -> Option<ProcSample> {
        let s = hub.sample()?;
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *p = (*p).max(s.rss_bytes);
        Some(s)
    }
}

pub async fn all(
    args: &Args,
    hub: &HubProc,
    nests: &[SimNest],
    shared: &Arc<Shared>,
) -> anyhow::Result<Report> {
    let peak = Peak(Mutex::new(0));
    let mut api = hub.client.connect()?;
    let mut report = Report {
        nests: nests.len(),
        instances_per_nest: args.instances_per_nest,
        hub_url: hub.url.clone(),
        ..Report::default()
    };
    eprintln!("agen bench fleet: {} nests joining", nests.len());
    report.join = join(args, &mut api, nests, shared).await?;
    peak.sample(hub);
    let replicas = u32::try_from(nests.len())
        .ok()
        .and_then(|n| n.checked_mul(args.instances_per_nest))
        .context("nests × instances-per-nest does not fit in 32 bits")?;
    eprintln!("agen bench fleet: deploying {replicas} replicas");
    report.placement = place(args, &mut api, replicas, shared).await?;
    peak.sample(hub);
    eprintln!("agen bench fleet: holding the fleet for {:?}", args.hold);
    report.steady = steady(args, hub, shared, &peak).await;
    if args.tasks > 0 {
        eprintln!(
            "agen bench fleet: {} tasks at {}/s, killing {}% of the nests mid-run",
            args.tasks, args.task_rate, args.kill_percent
        );
        let (tasks, kill) = tasks(args, replicas, hub, &mut api, nests, shared, &peak).await?;
        report.tasks = tasks;
        report.kill = kill;
    }
    report.queries = queries(hub, &mut api).await;
    let end = peak.sample(hub);
    report.hub = HubFigures {
        rss_bytes: end.map(|s| s.rss_bytes),
        rss_peak_bytes: end.map(|_| *peak.0.lock().unwrap_or_else(|e| e.into_inner())),
        open_fds: end.map(|s| s.open_fds),
        store_bytes: hub.store_bytes(),
    };
    Ok(report)
}

async fn join(
    args: &Args,
    api: &mut Hub,
    nests: &[SimNest],
    shared: &Arc<Shared>,
) -> anyhow::Result<Join> {
    let t0 = Instant::now();
    for n in nests {
        n.start();
    }
    let n = nests.len();
    let registered = until("every nest registering", args.timeout, || {
        shared.registrations.load(Ordering::SeqCst) >= n
    })
    .await?;
    let seconds = registered.duration_since(t0).as_secs_f64();
    let mut all_ready = None;
    let deadline = Instant::now() + args.timeout;
    while Instant::now() < deadline {
        let list = api
            .client
            .list_nests(pb::ListNestsRequest::default())
            .await
            .map_err(|s| status_error(api, s))?
            .into_inner()
            .nests;
        let ready = list
            .iter()
            .filter(|x| x.name.starts_with("sim-") && view::nest_state(x.state) == "ready")
            .count();
        if ready >= n {
            all_ready = Some(t0.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Join {
        registered: shared.registrations.load(Ordering::SeqCst),
        seconds,
        per_second: n as f64 / seconds.max(1e-9),
        all_ready_seconds: all_ready,
    })
}

/// The deployments that hold `replicas` (a deployment has at most
/// [`agen_hub::core::MAX_REPLICAS`]): their names and replicas, the last one taking the rest.
fn deployments(replicas: u32) -> Vec<(String, u32)> {
    let max = agen_hub::core::MAX_REPLICAS.max(1);
    let n = replicas.div_ceil(max).max(1);
    (0..n)
        .map(|i| {
            let r = if i + 1 == n {
                replicas - max * (n - 1)
            } else {
                max
            };
            (format!("{DEPLOYMENT}-{i}"), r)
        })
        .collect()
}

async fn place(
    args: &Args,
    api: &mut Hub,
    replicas: u32,
    shared: &Arc<Shared>,
) -> anyhow::Result<Placement> {
    let bundle = std::env::temp_dir().join(format!(
        "agen-fleet-bundle-{}",
        uuid::Uuid::new_v4().simple()
    ));
    super::super::fleet::write_bundle(&bundle, "http://127.0.0.1:9/v1", &bundle)?;
    let before = shared.stats.counts().placements;
    let t0 = Instant::now();
    let mut deps = Vec::new();
    for (name, r) in deployments(replicas) {
        match crate::cmd::deploy::deploy(api, &bundle, &name, r, 1, &[]).await {
            Ok(d) => deps.push(d),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&bundle);
                return Err(e);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&bundle);
    let want = u64::from(replicas);
    until("every replica being placed", args.timeout, || {
        shared.stats.counts().placements - before >= want
    })
    .await?;
    let last = shared
        .stats
        .last_placement_after(t0)
        .unwrap_or_else(Instant::now);
    let seconds = last.duration_since(t0).as_secs_f64();
    let mut all_ready = None;
    let deadline = Instant::now() + args.timeout;
    'poll: while Instant::now() < deadline {
        let mut ready = 0;
        for dep in &deps {
            let d = api
                .client
                .get_deployment(pb::GetDeploymentRequest {
                    namespace: dep.namespace.clone(),
                    name: dep.name.clone(),
                })
                .await
                .map_err(|s| status_error(api, s))?
                .into_inner()
                .deployment;
            let Some(d) = d.filter(|d| d.ready_replicas >= dep.replicas) else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'poll;
            };
            ready += d.ready_replicas;
        }
        if ready >= replicas {
            all_ready = Some(t0.elapsed().as_secs_f64());
            break;
        }
    }
    Ok(Placement {
        replicas,
        deployments: deps.len(),
        placed: shared.stats.counts().placements - before,
        seconds,
        per_second: want as f64 / seconds.max(1e-9),
        all_ready_seconds: all_ready,
    })
}

async fn steady(args: &Args, hub: &HubProc, shared: &Arc<Shared>, peak: &Peak) -> Steady {
    let (c0, s0) = (shared.stats.counts(), peak.sample(hub));
    let t0 = Instant::now();
    // Sample on the way for the peak RSS.
    while t0.elapsed() < args.hold {
        tokio::time::sleep(Duration::from_secs(1).min(args.hold)).await;
        peak.sample(hub);
    }
    let (c1, s1) = (shared.stats.counts(), peak.sample(hub));
    let seconds = t0.elapsed().as_secs_f64();
    let heartbeats = c1.since(c0).heartbeats;
    let cpu = s0.zip(s1);
    Steady {
        seconds,
        heartbeats,
        heartbeats_per_second: heartbeats as f64 / seconds.max(1e-9),
        hub_cpu_percent: cpu.map(|(a, b)| b.cpu_percent_since(&a)),
        hub_cpu_us_per_heartbeat: cpu
            .filter(|_| heartbeats > 0)
            .map(|(a, b)| b.cpu.saturating_sub(a.cpu).as_secs_f64() * 1e6 / heartbeats as f64),
    }
}

async fn tasks(
    args: &Args,
    replicas: u32,
    hub: &HubProc,
    api: &mut Hub,
    nests: &[SimNest],
    shared: &Arc<Shared>,
    peak: &Peak,
) -> anyhow::Result<(Tasks, Kill)> {
    let (c0, s0) = (shared.stats.counts(), peak.sample(hub));
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    let names: Vec<String> = deployments(replicas)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let submitter = tokio::spawn(submit_all(
        hub.client.clone(),
        names,
        (args.tasks, args.task_rate),
        submitted.clone(),
    ));
    // Kill once half the tasks have started: the Nests holding the most runs.
    let kill_n =
        ((nests.len() as f64 * args.kill_percent / 100.0).ceil() as usize).min(nests.len());
    let mut kill = Kill::default();
    let mut in_flight: Vec<(String, u32)> = Vec::new();
    let mut killed: Vec<usize> = Vec::new();
    let mut kill_at = None;
    if kill_n > 0 {
        let half = (args.tasks as u64).div_ceil(2);
        until("half the tasks starting", args.timeout, || {
            shared.stats.counts().assigns - c0.assigns >= half
        })
        .await?;
        let mut by_runs: Vec<(usize, usize)> = nests
            .iter()
            .map(|n| (n.state.active_runs(), n.index))
            .collect();
        by_runs.sort_by(|a, b| b.cmp(a));
        killed = by_runs.iter().take(kill_n).map(|(_, i)| *i).collect();
        for &i in &killed {
            kill.instances_affected += nests[i].state.instance_count();
            in_flight.extend(nests[i].state.active_tasks());
        }
        kill_at = Some(Instant::now());
        for &i in &killed {
            nests[i].kill();
        }
        kill.nests_killed = killed.len();
        kill.runs_in_flight = in_flight.len();
        eprintln!(
            "agen bench fleet: killed {} nests ({} instances, {} runs in flight)",
            killed.len(),
            kill.instances_affected,
            in_flight.len()
        );
    }
    let submitted_ids = submitter.await.context("the submitter panicked")??;
    let total = submitted_ids.len();
    let all_finished = until("every task finishing", args.timeout, || {
        submitted_ids
            .iter()
            .all(|t| shared.stats.finished_at(t).is_some())
    })
    .await;
    let (c1, s1) = (shared.stats.counts(), peak.sample(hub));
    let seconds = t0.elapsed().as_secs_f64();
    if let Err(e) = &all_finished {
        eprintln!("agen bench fleet: {e:#}");
    }
    if let Some(at) = kill_at {
        let affected = kill.instances_affected;
        kill.replaced_seconds = (affected > 0)
            .then(|| shared.stats.nth_placement_after(at, affected))
            .flatten()
            .map(|t| t.duration_since(at).as_secs_f64());
        let mut resumed_at = Vec::new();
        let mut finished_at = Vec::new();
        for (task, attempt) in &in_flight {
            let later = shared
                .stats
                .attempts(task)
                .into_iter()
                .filter(|(a, _, _)| a > attempt)
                .map(|(_, _, t)| t)
                .min();
            if let Some(t) = later {
                resumed_at.push(t);
            }
            if let Some((t, a)) = shared.stats.finished_at(task) {
                if a > *attempt {
                    finished_at.push(t);
                }
            }
        }
        kill.runs_resumed = resumed_at.len();
        let span = |ts: &[Instant]| ts.iter().max().map(|t| t.duration_since(at).as_secs_f64());
        if resumed_at.len() == in_flight.len() {
            kill.resumed_seconds = span(&resumed_at);
        }
        if finished_at.len() == in_flight.len() {
            kill.resumed_finished_seconds = span(&finished_at);
        }
        // The killed Nests come back (same identity, no instances).
        let back = Instant::now();
        for &i in &killed {
            nests[i].start();
        }
        let returned = until("the killed nests registering again", args.timeout, || {
            killed.iter().all(|&i| nests[i].is_registered())
        })
        .await;
        kill.returned_seconds = returned.ok().map(|t| t.duration_since(back).as_secs_f64());
    }
    let succeeded = succeeded(api, &submitted_ids).await?;
    let d = c1.since(c0);
    let mut lat: Vec<f64> = {
        let sub = submitted.lock().unwrap_or_else(|e| e.into_inner());
        sub.iter()
            .filter_map(|(t, at)| {
                Some(
                    shared
                        .stats
                        .first_assign(t)?
                        .saturating_duration_since(*at)
                        .as_secs_f64()
                        * 1000.0,
                )
            })
            .collect()
    };
    Ok((
        Tasks {
            submitted: total,
            succeeded,
            lost: total - succeeded.min(total),
            twice: shared.stats.twice(),
            executed: shared.stats.effects(),
            effect_unknown: shared.stats.effect_unknown.load(Ordering::Relaxed),
            seconds,
            dispatches: d.assigns,
            dispatches_per_second: d.assigns as f64 / seconds.max(1e-9),
            run_events: d.events,
            run_events_per_second: d.events as f64 / seconds.max(1e-9),
            submit_to_start_p50_ms: quantile(&mut lat, 0.5),
            submit_to_start_p99_ms: quantile(&mut lat, 0.99),
            hub_cpu_us_per_event: s0
                .zip(s1)
                .filter(|_| d.events > 0)
                .map(|(a, b)| b.cpu.saturating_sub(a.cpu).as_secs_f64() * 1e6 / d.events as f64),
        },
        kill,
    ))
}

/// Submits `n` tasks at `rate` per second, round-robin over `deployments` (each from its own task, so a slow answer does not
/// slow the rate), recording when each was submitted; returns their ids.
async fn submit_all(
    client: crate::client::ClientArgs,
    deployments: Vec<String>,
    (n, rate): (usize, f64),
    submitted: Arc<Mutex<HashMap<String, Instant>>>,
) -> anyhow::Result<Vec<String>> {
    let hub = client.connect()?;
    let t0 = tokio::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
        let (mut c, ns, submitted) = (hub.client.clone(), hub.namespace.clone(), submitted.clone());
        let deployment = deployments[i % deployments.len().max(1)].clone();
        calls.spawn(async move {
            let at = Instant::now();
            let t = c
                .submit_task(pb::SubmitTaskRequest {
                    namespace: ns,
                    deployment,
                    input: format!("simulated task {i}"),
                    client_request_id: uuid::Uuid::new_v4().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(|s| anyhow::anyhow!("SubmitTask: {:?}: {}", s.code(), s.message()))?
                .into_inner();
            submitted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(t.task_id.clone(), at);
            anyhow::Ok(t.task_id)
        });
    }
    let mut ids = Vec::with_capacity(n);
    while let Some(r) = calls.join_next().await {
        ids.push(r.context("a submit panicked")??);
    }
    Ok(ids)
}

/// How many of `ids` the Hub shows succeeded.
async fn succeeded(api: &mut Hub, ids: &[String]) -> anyhow::Result<usize> {
    let mut n = 0;
    for chunk in ids.chunks(64) {
        let calls = chunk.iter().map(|id| {
            let (mut c, ns) = (api.client.clone(), api.namespace.clone());
            async move {
                c.get_task(pb::GetTaskRequest {
                    namespace: ns,
                    task_id: id.clone(),
                })
                .await
            }
        });
        for r in futures::future::join_all(calls).await {
            let t = r.map_err(|s| status_error(api, s))?.into_inner();
            if view::task_state(t.state) == "succeeded" {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Times `agen nests`, `agen ps --all` (this binary, as a user runs them) and the first page
/// of `ListTasks`.
async fn queries(hub: &HubProc, api: &mut Hub) -> Queries {
    let cli = |args: &'static [&'static str]| {
        let c = hub.client.clone();
        async move {
            let exe = std::env::current_exe().ok()?;
            let mut cmd = tokio::process::Command::new(exe);
            cmd.args(args)
                .args(["-o", "json"])
                .env("AGEN_HUB", c.hub.unwrap_or_default());
            if let Some(t) = c.token {
                cmd.env("AGEN_TOKEN", t);
            }
            if let Some(ca) = c.ca_file {
                cmd.env("AGEN_CA_FILE", ca);
            }
            cmd.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let t0 = Instant::now();
            let ok = cmd.status().await.ok()?.success();
            ok.then(|| t0.elapsed().as_secs_f64() * 1000.0)
        }
    };
    let nests = cli(&["nests"]).await;
    let ps = cli(&["ps", "--all"]).await;
    let t0 = Instant::now();
    let list = api
        .client
        .list_tasks(pb::ListTasksRequest {
            namespace: api.namespace.clone(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .ok()
        .map(|_| t0.elapsed().as_secs_f64() * 1000.0);
    Queries {
        agen_nests_ms: nests,
        agen_ps_all_ms: ps,
        list_tasks_first_page_ms: list,
    }
}
