//! The `agen instance` process: one running copy of a deployment. It connects to its Nest's
//! Unix socket, says hello, gets its placement (deployment, concurrency, resolved secrets),
//! loads the bundle, starts the tool servers ([`ToolHost`]), reports its state, runs the
//! harness for every run the Nest forwards, and streams each run's events back.
//!
//! Invariants: the instance never holds Hub credentials (the Nest is its only peer); it exits
//! when its socket to the Nest closes (and the kernel kills it if the Nest dies: PDEATHSIG set
//! by the Nest); it is the subreaper of its descendants and kills every one of them before it
//! exits; a tool server that does not start leaves it running without that server's tools
//! (reported in `servers_not_connected` with its cause); when a connected tool server dies it
//! reports itself unhealthy (the Hub replaces it) and never restarts the server itself; at most `concurrency` runs execute at once; event seqs
//! start at 1 per `(run_id, attempt)`; a `sync` event returns only after the Hub acked it; the
//! last event of every run is one `run.finished` (`{state, result, response_type, messages}`),
//! sent `sync`.

mod approvals;
mod artifacts;
mod bootstrap;
mod delegates;
mod sink;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_shared::bundle::Bundle;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::socket::{
    self, HostState, InstanceStatus, Placement, RunOrder, SpawnSecret, ToInstance, ToNest,
};
use agen_contract::run::{ResponseType, RunFinished, RunState};
use agen_harness::mcp::{LaunchContext, ToolHost};
use agen_harness::{Harness, RunAssignment};
pub use artifacts::NestArtifacts;
pub use bootstrap::BootstrapError;
pub use sink::NestSink;

/// How long one tool server may take to start and list its tools.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an `ask` call or a `call_agent` waits in place before its run gives the instance
/// slot back (`run.suspended`) and the Hub resumes it when the wait is over.
pub const SUSPEND_AFTER: Duration = Duration::from_secs(2);

/// Arguments of `agen instance` (given by the Nest through the bootstrap fd).
#[derive(Debug, Clone)]
pub struct InstanceArgs {
    pub socket: PathBuf,
    pub instance_id: String,
    pub bundle_dir: PathBuf,
    pub secret: SpawnSecret,
    /// The agen binary (`AGEN_BIN` for tool servers).
    pub agen_bin: PathBuf,
    /// Who each command server runs as (see `Bootstrap::seats`).
    pub seats: std::collections::BTreeMap<String, agen_harness::mcp::ServerSeat>,
}

impl InstanceArgs {
    /// Reads (and closes) the bootstrap the Nest left on the inherited fd.
    pub fn from_inherited_fd(agen_bin: PathBuf) -> Result<InstanceArgs, BootstrapError> {
        let b = bootstrap::read_inherited()?;
        Ok(InstanceArgs {
            socket: b.socket,
            instance_id: b.instance_id,
            bundle_dir: b.bundle_dir,
            secret: b.secret,
            agen_bin,
            seats: b.seats,
        })
    }
}

/// Why the instance could not even talk to its Nest.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("cannot connect to the nest socket {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Socket(#[from] socket::SocketError),
    #[error("the nest refused instance {id}: {reason}")]
    Refused { id: String, reason: String },
    #[error("the nest closed the socket before sending the placement of instance {0}")]
    NoPlacement(String),
}

/// State shared by the instance's tasks.
struct Shared {
    to_nest: mpsc::UnboundedSender<ToNest>,
    status: Mutex<InstanceStatus>,
    runs: Mutex<HashMap<String, RunCtl>>,
    /// `save_artifact` / `read_artifact` through the Nest.
    artifacts: Arc<NestArtifacts>,
    /// `call_agent` / `start_agent` children through the Nest.
    delegates: Arc<delegates::NestDelegator>,
    approver: Arc<approvals::HubApprover>,
}

/// One run in this instance.
struct RunCtl {
    attempt: u32,
    cancel: CancellationToken,
    /// Fired by a double-texting interrupt: the harness stops at its next safe point.
    interrupt: CancellationToken,
    /// `(acked_seq, fenced)` as the Hub last said.
    acks: watch::Sender<(u64, bool)>,
}

impl Shared {
    fn set_status(&self, f: impl FnOnce(&mut InstanceStatus)) {
        let snapshot = {
            let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut st);
            st.active_runs = self.active_runs();
            st.clone()
        };
        let _ = self.to_nest.send(ToNest::Status(snapshot));
    }

    fn active_runs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }
}

/// Runs the instance until the Nest closes the socket. Returns the exit code.
pub async fn run(args: InstanceArgs) -> Result<i32, InstanceError> {
    // Orphans of tool servers (`setsid cmd &`, double forks) stay below this process, so they
    // can be found and killed when it stops.
    match agen_shared::process::become_subreaper() {
        Ok(()) => {
            tokio::spawn(reap_adopted_orphans());
        }
        Err(e) => tracing::warn!("cannot become the subreaper of the tool servers: {e}; a tool server's double-forked children may outlive this instance"),
    }
    let stream =
        UnixStream::connect(&args.socket)
            .await
            .map_err(|source| InstanceError::Connect {
                path: args.socket.clone(),
                source,
            })?;
    let (mut reader, mut writer) = socket::split::<ToInstance, ToNest>(stream);
    writer
        .send(&ToNest::Hello {
            instance_id: args.instance_id.clone(),
            pid: std::process::id(),
            secret: args.secret.clone(),
        })
        .await?;
    let placement = match reader.next().await? {
        Some(ToInstance::Placement(p)) => p,
        Some(ToInstance::Refused { reason }) => {
            return Err(InstanceError::Refused {
                id: args.instance_id,
                reason,
            })
        }
        Some(other) => {
            tracing::warn!("expected a placement first, got {other:?}");
            return Err(InstanceError::NoPlacement(args.instance_id));
        }
        None => return Err(InstanceError::NoPlacement(args.instance_id)),
    };
    tracing::info!(instance = %placement.instance_id, namespace = %placement.namespace, deployment = %placement.deployment, "instance starting");

    let (to_nest, mut out_rx) = mpsc::unbounded_channel::<ToNest>();
    let writer_task = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if let Err(e) = writer.send_queued(m, &mut out_rx).await {
                tracing::warn!("{e}");
                break;
            }
        }
    });
    let shared = Arc::new(Shared {
        artifacts: Arc::new(NestArtifacts::new(to_nest.clone())),
        delegates: Arc::new(delegates::NestDelegator::new(to_nest.clone())),
        approver: Arc::new(approvals::HubApprover::default()),
        to_nest,
        status: Mutex::new(InstanceStatus {
            state: HostState::Starting,
            tools_loaded: 0,
            servers_not_connected: vec![],
            tools: vec![],
            resources: vec![],
            message: "starting tool servers".into(),
            active_runs: vec![],
            server_pids: Default::default(),
        }),
        runs: Mutex::new(HashMap::new()),
    });
    shared.set_status(|_| {});

    let closed = CancellationToken::new();
    let ready = start(&args, &placement, &shared, &closed).await;
    let slots = Arc::new(Semaphore::new(placement.concurrency.max(1) as usize));

    // SIGTERM (the Nest stopping this instance) ends it like a closed socket: tool servers
    // are shut down before exiting.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async move {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(terminated);

    // Serve the Nest until it closes the socket.
    loop {
        let msg = tokio::select! {
            m = reader.next() => m,
            _ = &mut terminated => {
                tracing::info!("SIGTERM: instance stopping");
                break;
            }
        };
        match msg {
            Ok(Some(ToInstance::Run(a))) => start_run(&shared, &ready, &slots, &placement, a),
            Ok(Some(ToInstance::Cancel { run_id, reason })) => {
                let runs = shared.runs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = runs.get(&run_id) {
                    tracing::info!(run = %run_id, reason, "run cancelled");
                    r.cancel.cancel();
                }
            }
            Ok(Some(ToInstance::Interrupt { run_id })) => {
                let runs = shared.runs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = runs.get(&run_id) {
                    tracing::info!(run = %run_id, "run interrupted: stopping at the next safe point");
                    r.interrupt.cancel();
                }
            }
            Ok(Some(ToInstance::Ack {
                run_id,
                attempt,
                acked_seq,
                fenced,
            })) => {
                let runs = shared.runs.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = runs.get(&run_id).filter(|r| r.attempt == attempt) {
                    r.acks.send_modify(|(a, f)| {
                        *a = (*a).max(acked_seq);
                        *f |= fenced;
                    });
                    if fenced {
                        r.cancel.cancel();
                    }
                }
            }
            Ok(Some(ToInstance::ArtifactReply {
                req,
                artifact,
                content,
                error,
            })) => shared.artifacts.deliver(
                req,
                artifacts::Reply {
                    artifact,
                    content,
                    error,
                },
            ),
            Ok(Some(ToInstance::ChildReply(reply))) => shared.delegates.deliver(reply),
            Ok(Some(ToInstance::ApprovalDecided { run_id, decided })) => {
                shared.approver.deliver(&run_id, decided)
            }
            Ok(Some(ToInstance::Placement(_) | ToInstance::Refused { .. })) => {}
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("{e}");
                break;
            }
        }
    }
    tracing::info!("instance exiting");
    closed.cancel();
    for r in shared
        .runs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        r.cancel.cancel();
    }
    if let Some(h) = &ready.host {
        let _ = tokio::time::timeout(Duration::from_secs(4), h.shutdown()).await;
    }
    // No child left behind: whatever the servers left running (in any group or session).
    let left = agen_shared::process::kill_tree(std::process::id()).len();
    if left > 0 {
        tracing::info!(
            killed = left,
            "killed processes the tool servers left behind"
        );
    }
    writer_task.abort();
    Ok(0)
}

/// Reaps the orphans this instance adopted (as a subreaper) once they exit, on every SIGCHLD
/// and at least every 10 s, so they never pile up as zombies.
async fn reap_adopted_orphans() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut chld = signal(SignalKind::child()).ok();
    loop {
        let tick = tokio::time::sleep(Duration::from_secs(10));
        match chld.as_mut() {
            Some(s) => {
                tokio::select! { _ = s.recv() => {}, _ = tick => {} }
            }
            None => tick.await,
        }
        let n = agen_shared::process::reap_adopted();
        if n > 0 {
            tracing::debug!(reaped = n, "reaped exited orphans of tool servers");
        }
    }
}

/// What a started instance has: its tool servers and its harness (or why there is none).
struct Ready {
    host: Option<ToolHost>,
    harness: Result<Arc<Harness>, String>,
}

/// Loads the bundle, checks secrets, starts the tool servers and reports the result.
async fn start(
    args: &InstanceArgs,
    placement: &Placement,
    shared: &Arc<Shared>,
    closed: &CancellationToken,
) -> Ready {
    let unhealthy = |message: String| {
        tracing::warn!("{message}");
        shared.set_status(|s| {
            s.state = HostState::Unhealthy;
            s.message = message.clone();
        });
        Ready {
            host: None,
            harness: Err(message),
        }
    };
    let dir = args.bundle_dir.clone();
    let bundle = match tokio::task::spawn_blocking(move || Bundle::load(&dir)).await {
        Ok(Ok(b)) => Arc::new(b),
        Ok(Err(e)) => return unhealthy(format!("bundle: {e}")),
        Err(e) => return unhealthy(format!("bundle: cannot load: {e}")),
    };
    if !placement.missing_secrets.is_empty() {
        return unhealthy(placement.missing_secrets.join("; "));
    }
    let mut launch = LaunchContext::new(args.agen_bin.clone());
    launch.secrets = placement.secrets.clone();
    launch.start_timeout = SERVER_START_TIMEOUT;
    launch.seats = args.seats.clone();
    let host = ToolHost::start(&bundle, launch).await;
    let status = host.status();
    let tools: Vec<String> = host.tools().iter().map(|t| t.qualified_name()).collect();
    let problems: Vec<(String, String)> = status
        .not_connected
        .iter()
        .map(|p| (p.server.clone(), p.reason.clone()))
        .collect();
    // A server that never came up leaves the instance running with the tools of the others
    // (the guide: `agen ps --all` says which are not connected); only a server that was
    // connected and then dies makes it unhealthy (below).
    let message = match problems.first() {
        None => format!("{} tools loaded", status.tools_loaded),
        Some((server, reason)) => format!(
            "{} tools loaded; tool server {server} is not connected: {reason}",
            status.tools_loaded
        ),
    };
    shared.set_status(|s| {
        s.state = HostState::Running;
        s.tools_loaded = status.tools_loaded;
        s.servers_not_connected = problems.clone();
        s.tools = tools;
        s.resources = host
            .resources()
            .into_iter()
            .take(crate::socket::MAX_REPORTED_RESOURCES)
            .collect();
        s.message = message.clone();
        s.server_pids = host.server_pids();
    });
    tracing::info!(
        tools_loaded = status.tools_loaded,
        not_connected = problems.len(),
        "{message}"
    );

    // A tool server that dies makes the instance unhealthy; the Hub replaces it.
    let (watch_host, watch_shared, watch_closed) = (host.clone(), shared.clone(), closed.clone());
    tokio::spawn(async move {
        let problem = tokio::select! {
            p = watch_host.died() => p,
            _ = watch_closed.cancelled() => return,
        };
        let message = format!("tool server {} died: {}", problem.server, problem.reason);
        tracing::warn!("{message}");
        let status = watch_host.status();
        watch_shared.set_status(|s| {
            s.state = HostState::Unhealthy;
            s.tools_loaded = status.tools_loaded;
            s.servers_not_connected = status
                .not_connected
                .iter()
                .map(|p| (p.server.clone(), p.reason.clone()))
                .collect();
            s.server_pids = watch_host.server_pids();
            s.message = message;
        });
    });

    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(600))
        .build();
    let harness = match http {
        Err(e) => Err(format!("cannot build the HTTP client: {e}")),
        Ok(http) => Harness::new(bundle, Arc::new(host.clone()), &placement.secrets, http)
            .map(|h| {
                Arc::new(
                    h.with_progress(true)
                        .with_artifacts(shared.artifacts.clone())
                        .with_delegator(shared.delegates.clone())
                        .with_approver(shared.approver.clone()),
                )
            })
            .map_err(|e| e.to_string()),
    };
    if let Err(e) = &harness {
        tracing::warn!("runs will fail: {e}");
    }
    Ready {
        host: Some(host),
        harness,
    }
}

fn start_run(
    shared: &Arc<Shared>,
    ready: &Ready,
    slots: &Arc<Semaphore>,
    placement: &Placement,
    order: RunOrder,
) {
    let req = run_request(order, placement);
    let run_id = req.run_id.to_string();
    let cancel = CancellationToken::new();
    let interrupt = CancellationToken::new();
    let (acks, acks_rx) = watch::channel((0u64, false));
    {
        let mut runs = shared.runs.lock().unwrap_or_else(|p| p.into_inner());
        if runs.contains_key(&run_id) {
            tracing::debug!(run = %run_id, "run already in progress here; assignment ignored");
            return;
        }
        runs.insert(
            run_id.clone(),
            RunCtl {
                attempt: req.attempt,
                cancel: cancel.clone(),
                interrupt: interrupt.clone(),
                acks,
            },
        );
    }
    shared.set_status(|_| {});
    let sink = Arc::new(
        NestSink::new(
            run_id.clone(),
            req.attempt,
            req.task_id.to_string(),
            shared.to_nest.clone(),
            acks_rx,
        )
        .with_interrupt(interrupt),
    );
    let harness = ready.harness.clone();
    let (shared, slots) = (shared.clone(), slots.clone());
    tokio::spawn(async move {
        let attempt = req.attempt;
        let finished = match harness {
            Err(reason) => RunFinished {
                state: RunState::Failed,
                result: reason,
                response_type: ResponseType::Error,
                messages: Vec::new(),
            },
            Ok(h) => {
                let permit = tokio::select! {
                    p = slots.acquire_owned() => p.ok(),
                    _ = cancel.cancelled() => None,
                };
                match permit {
                    None => RunFinished {
                        state: RunState::Cancelled,
                        result: "cancelled before it started".into(),
                        response_type: ResponseType::Error,
                        messages: Vec::new(),
                    },
                    Some(_permit) => {
                        tracing::info!(run = %req.run_id, attempt, task = %req.task_id, "run started");
                        let outcome = h.run(req.clone(), sink.clone(), cancel.clone()).await;
                        if outcome.suspended.is_some() {
                            // Its `run.suspended` is the attempt's last event: no run.finished.
                            tracing::info!(run = %req.run_id, "run suspended: it gave its slot back");
                            shared.end_run(&run_id, attempt);
                            return;
                        }
                        tracing::info!(run = %req.run_id, state = outcome.state.as_str(), "run finished");
                        RunFinished {
                            state: outcome.state,
                            result: outcome.result,
                            response_type: outcome.response_type,
                            messages: outcome.messages,
                        }
                    }
                }
            }
        };
        if let Err(e) = sink.finish(finished).await {
            tracing::warn!(run = %run_id, "run.finished not acknowledged: {e}");
        }
        shared.end_run(&run_id, attempt);
    });
}

impl Shared {
    /// The run is over here (finished or suspended): forget it and tell the Nest.
    fn end_run(&self, run_id: &str, attempt: u32) {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        let _ = self.to_nest.send(ToNest::RunDone {
            run_id: run_id.to_string(),
            attempt,
        });
        self.set_status(|_| {});
    }
}

/// The run as the harness takes it: the Hub's order, with the placement's namespace and
/// deployment where the order left them out.
fn run_request(order: RunOrder, placement: &Placement) -> RunAssignment {
    let mut run = order.run;
    run.attempt = run.attempt.max(1);
    if run.namespace.is_empty() {
        run.namespace = placement.namespace.clone();
    }
    if run.deployment.is_empty() {
        run.deployment = placement.deployment.clone();
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_run_request_defaults_from_the_placement() {
        let p = Placement {
            instance_id: "i".into(),
            namespace: "ns".into(),
            deployment: "dep".into(),
            bundle_digest: String::new(),
            generation: 1,
            concurrency: 1,
            secrets: Default::default(),
            missing_secrets: vec![],
        };
        let r = run_request(
            RunOrder::from(crate::model::AssignedRun {
                run_id: "r1".into(),
                attempt: 0.into(),
                history_json: r#"[{"role":"user","content":"hi"}]"#.into(),
                ..Default::default()
            }),
            &p,
        );
        assert_eq!(
            (
                r.root_run_id().as_str(),
                r.attempt,
                r.namespace.as_str(),
                r.deployment.as_str()
            ),
            ("r1", 1, "ns", "dep")
        );
        assert_eq!(r.history, vec![agen_contract::run::Message::user("hi")]);
    }
}
