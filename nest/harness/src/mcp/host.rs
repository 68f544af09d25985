//! [`ToolHost`]: the running tool servers of one bundle — start (in parallel, each with a
//! deadline), the tool list, calls (with `_meta`, timeout and cancellation), death detection and
//! shutdown.
//!
//! Invariants: `start` never fails as a whole (a server that does not come up is a
//! [`ServerProblem`]); only tools of connected, living servers are listed; a call to a server
//! that died ends at once: [`NotSent::NotConnected`] when it was never handed to the server,
//! [`Interruption::Lost`] when it was; `died` reports a server death only
//! while the host is not shutting down; dropping the last handle kills every server's process
//! group.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use agen_shared::bundle::{Bundle, ServerSpec};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientConfig, ClientRequest,
    MetaObject, RequestMetaObject, ServerResult,
};
use rmcp::service::{
    Peer, PeerRequestOptions, RequestHandle, RoleClient, RunningService, ServiceError,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::launch::{describe_exit, ProcessGroup};
use super::output::tool_output;
use super::start::{start_one, tool_infos, with_output, Started};
use super::stderr::StderrCapture;
use super::{
    error_chain, CallError, HostStatus, Interruption, LaunchContext, NotSent, ServerProblem,
    ToolInfo, ToolOutput,
};
use crate::redact::Redactor;

/// How long a server gets to exit after its stdin closes, and again after SIGTERM.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for the last stderr lines of a server that stopped.
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// The tool servers of one bundle. Cheap to clone; all clones share the servers.
#[derive(Clone)]
pub struct ToolHost {
    inner: Arc<Inner>,
}

struct Inner {
    /// Every server name of the bundle, connected or not (model-name matching).
    names: Vec<String>,
    /// The servers that started, each its latest connection (a restart replaces it).
    servers: RwLock<BTreeMap<String, Arc<Connected>>>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    monitors: Mutex<Vec<JoinHandle<()>>>,
    relaunch: Relaunch,
    /// The prompts `agent.md` `systemPrompts` names, fetched once after the start (by
    /// `server/prompt`): the text, or why it could not be had.
    prompts: Mutex<BTreeMap<String, Result<String, String>>>,
}

/// What a server that died needs to be started again: what `start` was given.
struct Relaunch {
    bundle_dir: PathBuf,
    specs: BTreeMap<String, ServerSpec>,
    ctx: LaunchContext,
    host_env: Vec<(String, String)>,
    /// One restart at a time.
    one: tokio::sync::Mutex<()>,
}

/// What the monitors of dead servers write to.
struct Shared {
    /// Servers that did not start, then servers that died, in that order.
    problems: Mutex<Vec<ServerProblem>>,
    /// The first server death.
    died: watch::Sender<Option<ServerProblem>>,
    /// Secret values out of every reason and stderr line before anyone sees them.
    redactor: Redactor,
}

/// One server that started.
struct Connected {
    name: String,
    peer: Peer<RoleClient>,
    tools: Vec<ToolInfo>,
    /// The resources it listed when it started (see [`super::resources`]).
    resources: Vec<super::ResourceInfo>,
    /// Cancelled when the server dies: calls in flight end, new calls are refused.
    gone: CancellationToken,
    process: Option<Arc<ProcessGroup>>,
}

impl ToolHost {
    /// Starts every MCP server of `bundle` in parallel; never fails as a whole.
    pub async fn start(bundle: &Bundle, ctx: LaunchContext) -> ToolHost {
        let host = ToolHost::start_servers(&bundle.dir, &bundle.mcp.servers, ctx).await;
        host.load_prompts(&bundle.system_prompts).await;
        host
    }

    /// Starts `servers` with `bundle_dir` as the working directory of command servers.
    pub async fn start_servers(
        bundle_dir: &Path,
        servers: &BTreeMap<String, ServerSpec>,
        ctx: LaunchContext,
    ) -> ToolHost {
        let shutdown = CancellationToken::new();
        let redactor = Redactor::of_secrets(&ctx.secrets);
        let host_env: Vec<(String, String)> = match &ctx.host_env {
            Some(env) => env.clone(),
            None => std::env::vars().collect(),
        };
        // Spawned from this task (never a blocking-pool thread): PR_SET_PDEATHSIG is tied to
        // the spawning thread.
        let starts = servers.iter().map(|(name, spec)| {
            let ct = shutdown.child_token();
            let (ctx, host_env, redactor) = (&ctx, &host_env, &redactor);
            async move {
                let result = start_one(name, spec, bundle_dir, ctx, host_env, redactor, ct)
                    .await
                    .map_err(|reason| redactor.redact(&reason));
                (name.clone(), result)
            }
        });
        let results = futures::future::join_all(starts).await;

        let (died, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            problems: Mutex::new(Vec::new()),
            died,
            redactor: redactor.clone(),
        });
        let names: Vec<String> = servers.keys().cloned().collect();
        let host = ToolHost {
            inner: Arc::new(Inner {
                names,
                servers: RwLock::new(BTreeMap::new()),
                shared,
                shutdown,
                monitors: Mutex::new(Vec::new()),
                relaunch: Relaunch {
                    bundle_dir: bundle_dir.to_path_buf(),
                    specs: servers.clone(),
                    ctx,
                    host_env,
                    one: tokio::sync::Mutex::new(()),
                },
                prompts: Mutex::new(BTreeMap::new()),
            }),
        };
        for (name, result) in results {
            match result {
                Ok(started) => host.connect(&name, started),
                Err(reason) => {
                    tracing::warn!(server = %name, "tool server not connected: {reason}");
                    lock(&host.inner.shared.problems).push(ServerProblem {
                        server: name,
                        reason,
                    });
                }
            }
        }
        host
    }

    /// Makes a started server the connection of `name` and watches it for death.
    fn connect(&self, name: &str, started: Started) {
        let tools = tool_infos(name, &started.tools);
        tracing::info!(server = %name, tools = tools.len(), "tool server connected");
        let conn = Arc::new(Connected {
            name: name.to_string(),
            peer: started.running.peer().clone(),
            tools,
            resources: started.resources,
            gone: CancellationToken::new(),
            process: started.process.map(Arc::new),
        });
        lock(&self.inner.monitors).push(tokio::spawn(monitor(
            conn.clone(),
            started.running,
            started.stderr,
            self.inner.shared.clone(),
            self.inner.shutdown.clone(),
        )));
        write(&self.inner.servers).insert(name.to_string(), conn);
    }

    /// Starts `server` again if it was connected and died (its process exited or its
    /// connection closed), exactly as `start` did, within the start deadline; `Ok` once it is
    /// connected (at once when it is alive). One restart runs at a time. A server that never
    /// started is not restarted. [`ToolHost::died`] still reports the first death: an instance
    /// stays unhealthy and is replaced; the restart only lets a call in flight be sent again.
    pub async fn restart(&self, server: &str) -> Result<(), String> {
        let relaunch = &self.inner.relaunch;
        let _one = relaunch.one.lock().await;
        if self.inner.shutdown.is_cancelled() {
            return Err("the tool servers are shutting down".into());
        }
        match read(&self.inner.servers).get(server) {
            Some(c) if !c.gone.is_cancelled() => return Ok(()),
            Some(_) => {}
            None => return Err(format!("tool server {server} never started")),
        }
        let Some(spec) = relaunch.specs.get(server) else {
            return Err(format!("tool server {server} is not in the bundle"));
        };
        let redactor = &self.inner.shared.redactor;
        let started = start_one(
            server,
            spec,
            &relaunch.bundle_dir,
            &relaunch.ctx,
            &relaunch.host_env,
            redactor,
            self.inner.shutdown.child_token(),
        )
        .await
        .map_err(|reason| redactor.redact(&reason))?;
        self.connect(server, started);
        tracing::info!(server, "tool server restarted");
        Ok(())
    }

    /// The MCP tools of the connected servers, sorted by qualified name.
    pub fn tools(&self) -> Vec<ToolInfo> {
        let mut tools: Vec<ToolInfo> = read(&self.inner.servers)
            .values()
            .filter(|c| !c.gone.is_cancelled())
            .flat_map(|c| c.tools.iter().cloned())
            .collect();
        tools.sort_by_key(ToolInfo::qualified_name);
        tools
    }

    /// The resources the connected servers listed when they started, by server then URI.
    pub fn resources(&self) -> Vec<super::ResourceInfo> {
        read(&self.inner.servers)
            .values()
            .filter(|c| !c.gone.is_cancelled())
            .flat_map(|c| c.resources.iter().cloned())
            .collect()
    }

    /// Keeps what fetching prompt `name` (`server/prompt`) gave.
    pub(super) fn keep_prompt(&self, name: &str, text: Result<String, String>) {
        lock(&self.inner.prompts).insert(name.to_string(), text);
    }

    /// The text of prompt `server/prompt` as fetched after the start (see
    /// [`ToolHost::load_prompts`]).
    pub fn system_prompt(&self, name: &str) -> Result<String, String> {
        lock(&self.inner.prompts)
            .get(name)
            .cloned()
            .unwrap_or_else(|| Err(format!("prompt {name} was not fetched")))
    }

    /// The connection of `server` while it lives.
    pub(super) fn living_peer(&self, server: &str) -> Option<Peer<RoleClient>> {
        read(&self.inner.servers)
            .get(server)
            .filter(|c| !c.gone.is_cancelled())
            .map(|c| c.peer.clone())
    }

    /// How many tools loaded, and every server that is not connected (did not start, or died).
    pub fn status(&self) -> HostStatus {
        HostStatus {
            tools_loaded: u32::try_from(self.tools().len()).unwrap_or(u32::MAX),
            not_connected: lock(&self.inner.shared.problems).clone(),
        }
    }

    /// The process ids of the running command servers, by server name (for diagnostics and tests).
    pub fn server_pids(&self) -> BTreeMap<String, u32> {
        read(&self.inner.servers)
            .iter()
            .filter(|(_, c)| !c.gone.is_cancelled())
            .filter_map(|(name, c)| Some((name.clone(), c.process.as_ref()?.pid())))
            .collect()
    }

    /// Calls the tool named `server.tool` (or the model's `server_tool`) with `args` (a JSON
    /// object, or null for none) and `meta` as the request's `_meta`. On `timeout` or `cancel`
    /// the server is sent `notifications/cancelled` for the request.
    ///
    /// The error says whether the call may have run: it is [`CallError::NotSent`] only when the
    /// request was never handed to the server's connection (resolved, checked, and the hand-over
    /// to the connection's writer not done), [`CallError::Interrupted`] once it was.
    pub async fn call(
        &self,
        qualified_or_model_name: &str,
        args: serde_json::Value,
        meta: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, CallError> {
        let (conn, tool) = self.resolve(qualified_or_model_name)?;
        if conn.gone.is_cancelled() {
            return Err(CallError::not_connected(&conn.name));
        }
        let arguments = match args {
            serde_json::Value::Object(map) => Some(map),
            // Some servers validate a missing `arguments` against their schema and fail.
            serde_json::Value::Null => Some(serde_json::Map::new()),
            other => {
                return Err(NotSent::BadArguments {
                    tool: format!("{}.{tool}", conn.name),
                    message: format!("expected a JSON object, got {other}"),
                }
                .into())
            }
        };
        let mut params = CallToolRequestParams::new(tool.clone());
        params.arguments = arguments;
        if !meta.is_empty() {
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let deadline = tokio::time::Instant::now() + timeout;
        // The hand-over to the connection's writer (a channel send, cancel-safe: dropped before
        // it completes, nothing was handed over) is the point after which the call may have run.
        let handoff = conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::no_options());
        let handle = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(NotSent::Cancelled.into()),
            _ = conn.gone.cancelled() => return Err(CallError::not_connected(&conn.name)),
            handle = handoff => match handle {
                Ok(handle) => handle,
                // The connection's writer is gone: nothing was handed to it.
                Err(_) => return Err(CallError::not_connected(&conn.name)),
            },
            _ = tokio::time::sleep_until(deadline) => return Err(NotSent::Timeout(timeout).into()),
        };
        // Dropped before the answer (the caller gave up): the server is told to stop.
        let mut pending = Pending(Some(handle));
        let Some(rx) = pending.0.as_mut().map(|h| &mut h.rx) else {
            return Err(CallError::not_connected(&conn.name));
        };
        let answer = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(Interruption::Cancelled),
            _ = conn.gone.cancelled() => Err(lost(&conn.name)),
            answer = rx => Ok(answer),
            _ = tokio::time::sleep_until(deadline) => Err(Interruption::Timeout(timeout)),
        };
        let answer = match answer {
            Ok(answer) => {
                pending.0 = None;
                answer
            }
            Err(cause) => {
                if matches!(cause, Interruption::Lost(_)) {
                    pending.0 = None;
                }
                return Err(CallError::interrupted(&conn.name, cause));
            }
        };
        let redact = |m: &str| self.inner.shared.redactor.redact(m);
        match answer {
            Ok(Ok(ServerResult::CallToolResult(result))) => Ok(tool_output(&result)),
            Ok(Ok(ServerResult::EmptyResult(_))) => Ok(tool_output(&CallToolResult::default())),
            Ok(Ok(_)) => Err(CallError::Failed {
                server: conn.name.clone(),
                message: "it answered tools/call with a result of another kind".into(),
            }),
            // A server's JSON-RPC error may quote what it was given (a DSN, a header).
            Ok(Err(ServiceError::McpError(e))) => Err(CallError::Failed {
                server: conn.name.clone(),
                message: redact(&e.message),
            }),
            // The request was handed over and then the write or the connection failed: some of
            // it may have reached the server.
            Ok(Err(e @ ServiceError::TransportSend(_))) => Err(CallError::interrupted(
                &conn.name,
                Interruption::Lost(redact(&error_chain(&e))),
            )),
            Ok(Err(ServiceError::TransportClosed)) | Err(_) => {
                Err(CallError::interrupted(&conn.name, lost(&conn.name)))
            }
            Ok(Err(e)) => Err(CallError::Failed {
                server: conn.name.clone(),
                message: redact(&error_chain(&e)),
            }),
        }
    }

    /// Resolves when a connected server dies (its process exits or its connection closes), with
    /// its name and why. Later calls return the first death again. Never resolves once the host
    /// is shutting down without a death.
    pub async fn died(&self) -> ServerProblem {
        let mut rx = self.inner.shared.died.subscribe();
        let problem = match rx.wait_for(Option::is_some).await {
            Ok(p) => p.clone(),
            Err(_) => None,
        };
        match problem {
            Some(p) => p,
            None => std::future::pending().await,
        }
    }

    /// Closes every client, then SIGTERM and (after a grace) SIGKILL to every server's process
    /// group. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        // A restart under way ends (its start is cancelled) before the servers are stopped.
        let _no_restart = self.inner.relaunch.one.lock().await;
        let processes: Vec<Arc<ProcessGroup>> = read(&self.inner.servers)
            .values()
            .filter_map(|c| c.process.clone())
            .collect();
        let stops = processes.into_iter().map(|p| async move {
            // The client closed the server's stdin: most servers exit on their own.
            let _ = tokio::time::timeout(EXIT_GRACE, p.exited()).await;
            p.terminate(EXIT_GRACE).await;
        });
        futures::future::join_all(stops).await;
        let monitors: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.inner.monitors));
        for m in monitors {
            let _ = tokio::time::timeout(EXIT_GRACE, m).await;
        }
        tracing::debug!("tool servers stopped");
    }

    /// `server.tool` or `server_tool` → the connected server and the tool's own name.
    fn resolve(&self, name: &str) -> Result<(Arc<Connected>, String), CallError> {
        let servers = read(&self.inner.servers);
        let has_tool = |server: &str, tool: &str| {
            servers
                .get(server)
                .is_some_and(|c| c.tools.iter().any(|t| t.tool == tool))
        };
        let connected = |server: &str| servers.contains_key(server);
        match resolve_name(name, &self.inner.names, &connected, &has_tool) {
            Resolved::Tool(server, tool) => match servers.get(&server) {
                Some(conn) => Ok((conn.clone(), tool)),
                None => Err(CallError::not_connected(server)),
            },
            Resolved::NotConnected(server) => Err(CallError::not_connected(server)),
            Resolved::Unknown => Err(NotSent::UnknownTool(name.to_string()).into()),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Resolved {
    Tool(String, String),
    /// The name points at a server of the bundle that is not connected.
    NotConnected(String),
    Unknown,
}

/// Splits `server.tool` at the dot, or the model's `server_tool` after a known server name
/// (server names may contain `_`, so the split whose server has that tool wins, longest server
/// name first). `names` is every server of the bundle, connected or not.
fn resolve_name(
    name: &str,
    names: &[String],
    connected: &dyn Fn(&str) -> bool,
    has_tool: &dyn Fn(&str, &str) -> bool,
) -> Resolved {
    // `server.tool` first (tool names may themselves hold dots or underscores), then every
    // `server_tool` split after a known server name, longest server name first.
    let mut by_model_name: Vec<(&str, &str)> = names
        .iter()
        .filter_map(|s| {
            Some((
                s.as_str(),
                name.strip_prefix(s.as_str())?.strip_prefix('_')?,
            ))
        })
        .collect();
    by_model_name.sort_by_key(|c| std::cmp::Reverse(c.0.len()));
    let candidates: Vec<(&str, &str)> = name
        .split_once('.')
        .filter(|(s, _)| names.iter().any(|n| n == s))
        .into_iter()
        .chain(by_model_name)
        .collect();
    if let Some((server, tool)) = candidates.iter().find(|(s, t)| has_tool(s, t)) {
        return Resolved::Tool(server.to_string(), tool.to_string());
    }
    match candidates.iter().find(|(s, _)| !connected(s)) {
        Some((server, _)) => Resolved::NotConnected(server.to_string()),
        None => Resolved::Unknown,
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Monitors end, dropping the last handles on the process groups, which SIGKILLs them.
        self.shutdown.cancel();
    }
}

/// A call handed to its server and not answered yet: dropped as it is, the server is sent
/// `notifications/cancelled` for it.
struct Pending(Option<RequestHandle<RoleClient>>);

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(handle) = self.0.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(
                    EXIT_GRACE,
                    handle.cancel(Some("the caller stopped waiting".into())),
                )
                .await;
            });
        }
    }
}

/// A call whose server stopped (its process died or its connection closed) before it answered.
fn lost(server: &str) -> Interruption {
    Interruption::Lost(format!("tool server {server} stopped before it answered"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits for a connected server to die (or the host to shut down) and reports the death.
async fn monitor(
    conn: Arc<Connected>,
    running: RunningService<RoleClient, ClientConfig>,
    mut stderr: StderrCapture,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let process = conn.process.clone();
    let exited = async {
        match &process {
            Some(p) => p.exited().await,
            None => std::future::pending().await,
        }
    };
    let reason = tokio::select! {
        status = exited => describe_exit(status),
        _ = running.waiting() => {
            if shutdown.is_cancelled() {
                return;
            }
            // The connection closed; the process usually says why a moment later.
            match &process {
                Some(p) => match tokio::time::timeout(EXIT_GRACE, p.exited()).await {
                    Ok(status) => describe_exit(status),
                    Err(_) => "closed its connection".to_string(),
                },
                None => "connection closed".to_string(),
            }
        }
        _ = shutdown.cancelled() => return,
    };
    if shutdown.is_cancelled() {
        return;
    }
    conn.gone.cancel();
    if let Some(p) = &process {
        // Whatever the server left behind goes with it.
        p.kill();
    }
    stderr.drain(STDERR_DRAIN).await;
    let problem = ServerProblem {
        server: conn.name.clone(),
        reason: shared.redactor.redact(&with_output(reason, &stderr.tail())),
    };
    tracing::error!(server = %problem.server, "tool server died: {}", problem.reason);
    lock(&shared.problems).push(problem.clone());
    shared.died.send_if_modified(|first| {
        if first.is_none() {
            *first = Some(problem);
            true
        } else {
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, expected: Resolved) {
        // Servers `a`, `a_b` and `time` are connected; `down` and `a_b_c` (no tools) are not.
        let names: Vec<String> = ["a", "a_b", "a_b_c", "down", "time"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let tools = [
            ("a", "b_x"),
            ("a", "b_only"),
            ("a", "run"),
            ("a", "b_c.d"),
            ("a_b", "x"),
            ("a_b", "run"),
            ("time", "get_current_time"),
        ];
        let connected = |s: &str| matches!(s, "a" | "a_b" | "time");
        let has_tool = |s: &str, t: &str| tools.contains(&(s, t));
        assert_eq!(
            resolve_name(name, &names, &connected, &has_tool),
            expected,
            "{name}"
        );
    }

    fn tool(s: &str, t: &str) -> Resolved {
        Resolved::Tool(s.into(), t.into())
    }

    #[test]
    fn name_resolution_table() {
        check("time.get_current_time", tool("time", "get_current_time"));
        check("time_get_current_time", tool("time", "get_current_time"));
        check("a.b_x", tool("a", "b_x"));
        // Ambiguous (`a.b_x` and `a_b.x` both exist): the longest server name wins.
        check("a_b_x", tool("a_b", "x"));
        check("a_b_only", tool("a", "b_only"));
        check("a_b.x", tool("a_b", "x"));
        check("a_b_run", tool("a_b", "run"));
        check("a_run", tool("a", "run"));
        check("down_anything", Resolved::NotConnected("down".into()));
        check("down.anything", Resolved::NotConnected("down".into()));
        check("a_b_c_x", Resolved::NotConnected("a_b_c".into()));
        check("time_nope", Resolved::Unknown);
        check("nobody.x", Resolved::Unknown);
        check("nobody_x", Resolved::Unknown);
        check("time", Resolved::Unknown);
        check("a_b_c.d", tool("a", "b_c.d"));
        check("a.b_c.d", tool("a", "b_c.d"));
    }
}
