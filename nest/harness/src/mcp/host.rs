//! [`ToolHost`]: the running tool servers of one bundle — start (in parallel, each with a
//! deadline), the tool list, calls (with `_meta`, timeout and cancellation), death detection and
//! shutdown.
//!
//! Invariants: `start` never fails as a whole (a server that does not come up is a
//! [`ServerProblem`]); only tools of connected, living servers are listed; a call to a server
//! that died ends at once with [`CallError::NotConnected`]; `died` reports a server death only
//! while the host is not shutting down; dropping the last handle kills every server's process
//! group.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_shared::bundle::{Bundle, ServerSpec};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, MetaObject,
    RequestMetaObject, Tool,
};
use rmcp::service::{ClientInitializeError, Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::launch::{self, describe_exit, ProcessGroup};
use super::output::tool_output;
use super::stderr::StderrCapture;
use super::{CallError, HostStatus, LaunchContext, ServerProblem, ToolInfo, ToolOutput};
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
    servers: BTreeMap<String, Arc<Connected>>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    monitors: Mutex<Vec<JoinHandle<()>>>,
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
    /// Cancelled when the server dies: calls in flight end, new calls are refused.
    gone: CancellationToken,
    process: Option<Arc<ProcessGroup>>,
}

/// A server right after a successful `initialize` + `tools/list`.
struct Started {
    running: RunningService<RoleClient, ClientConfig>,
    tools: Vec<Tool>,
    process: Option<ProcessGroup>,
    stderr: StderrCapture,
}

impl ToolHost {
    /// Starts every MCP server of `bundle` in parallel; never fails as a whole.
    pub async fn start(bundle: &Bundle, ctx: LaunchContext) -> ToolHost {
        ToolHost::start_servers(&bundle.dir, &bundle.mcp.servers, ctx).await
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
        let mut connected = BTreeMap::new();
        let mut monitors = Vec::new();
        for (name, result) in results {
            match result {
                Ok(started) => {
                    let tools = tool_infos(&name, &started.tools);
                    tracing::info!(server = %name, tools = tools.len(), "tool server connected");
                    let conn = Arc::new(Connected {
                        name: name.clone(),
                        peer: started.running.peer().clone(),
                        tools,
                        gone: CancellationToken::new(),
                        process: started.process.map(Arc::new),
                    });
                    monitors.push(tokio::spawn(monitor(
                        conn.clone(),
                        started.running,
                        started.stderr,
                        shared.clone(),
                        shutdown.clone(),
                    )));
                    connected.insert(name, conn);
                }
                Err(reason) => {
                    tracing::warn!(server = %name, "tool server not connected: {reason}");
                    lock(&shared.problems).push(ServerProblem {
                        server: name,
                        reason,
                    });
                }
            }
        }
        let names: Vec<String> = servers.keys().cloned().collect();
        ToolHost {
            inner: Arc::new(Inner {
                names,
                servers: connected,
                shared,
                shutdown,
                monitors: Mutex::new(monitors),
            }),
        }
    }

    /// The MCP tools of the connected servers, sorted by qualified name.
    pub fn tools(&self) -> Vec<ToolInfo> {
        let mut tools: Vec<ToolInfo> = self
            .inner
            .servers
            .values()
            .filter(|c| !c.gone.is_cancelled())
            .flat_map(|c| c.tools.iter().cloned())
            .collect();
        tools.sort_by_key(ToolInfo::qualified_name);
        tools
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
        self.inner
            .servers
            .iter()
            .filter(|(_, c)| !c.gone.is_cancelled())
            .filter_map(|(name, c)| Some((name.clone(), c.process.as_ref()?.pid())))
            .collect()
    }

    /// Calls the tool named `server.tool` (or the model's `server_tool`) with `args` (a JSON
    /// object, or null for none) and `meta` as the request's `_meta`. On `timeout` or `cancel`
    /// the server is sent `notifications/cancelled` for the request.
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
            return Err(CallError::NotConnected(conn.name.clone()));
        }
        let arguments = match args {
            serde_json::Value::Object(map) => Some(map),
            // Some servers validate a missing `arguments` against their schema and fail.
            serde_json::Value::Null => Some(serde_json::Map::new()),
            other => {
                return Err(CallError::BadArguments {
                    tool: format!("{}.{tool}", conn.name),
                    message: format!("expected a JSON object, got {other}"),
                })
            }
        };
        let mut params = CallToolRequestParams::new(tool.clone());
        params.arguments = arguments;
        if !meta.is_empty() {
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        // Dropping this future before the answer sends `notifications/cancelled` (rmcp).
        let request = conn.peer.call_tool(params);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(CallError::Cancelled),
            _ = conn.gone.cancelled() => Err(CallError::NotConnected(conn.name.clone())),
            result = request => match result {
                Ok(result) => Ok(tool_output(&result)),
                // A server's JSON-RPC error may quote what it was given (a DSN, a header).
                Err(ServiceError::McpError(e)) => Err(CallError::Failed {
                    server: conn.name.clone(),
                    message: self.inner.shared.redactor.redact(&e.message),
                }),
                Err(ServiceError::TransportClosed) => Err(CallError::NotConnected(conn.name.clone())),
                Err(e) => Err(CallError::Failed {
                    server: conn.name.clone(),
                    message: self.inner.shared.redactor.redact(&error_chain(&e)),
                }),
            },
            _ = tokio::time::sleep(timeout) => Err(CallError::Timeout(timeout)),
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
        let stops = self
            .inner
            .servers
            .values()
            .filter_map(|c| c.process.clone())
            .map(|p| async move {
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
        let servers = &self.inner.servers;
        let has_tool = |server: &str, tool: &str| {
            servers
                .get(server)
                .is_some_and(|c| c.tools.iter().any(|t| t.tool == tool))
        };
        let connected = |server: &str| servers.contains_key(server);
        match resolve_name(name, &self.inner.names, &connected, &has_tool) {
            Resolved::Tool(server, tool) => match servers.get(&server) {
                Some(conn) => Ok((conn.clone(), tool)),
                None => Err(CallError::NotConnected(server)),
            },
            Resolved::NotConnected(server) => Err(CallError::NotConnected(server)),
            Resolved::Unknown => Err(CallError::UnknownTool(name.to_string())),
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("agen", env!("CARGO_PKG_VERSION")),
    )
}

fn tool_infos(server: &str, tools: &[Tool]) -> Vec<ToolInfo> {
    let mut seen = BTreeSet::new();
    tools
        .iter()
        .filter(|t| seen.insert(t.name.to_string()))
        .map(|t| {
            let hint = |f: fn(&rmcp::model::ToolAnnotations) -> Option<bool>| {
                t.annotations.as_ref().and_then(f).unwrap_or(false)
            };
            ToolInfo {
                server: server.to_string(),
                tool: t.name.to_string(),
                description: t.description.as_deref().unwrap_or("").to_string(),
                input_schema: serde_json::Value::Object((*t.input_schema).clone()),
                read_only: hint(|a| a.read_only_hint),
                idempotent: hint(|a| a.idempotent_hint),
            }
        })
        .collect()
}

/// Starts one server; the error is the "not connected" reason.
async fn start_one(
    name: &str,
    spec: &ServerSpec,
    bundle_dir: &Path,
    ctx: &LaunchContext,
    host_env: &[(String, String)],
    redactor: &Redactor,
    ct: CancellationToken,
) -> Result<Started, String> {
    match spec {
        ServerSpec::Command { command, args, env } => {
            let stderr = |s| StderrCapture::start(name, s, redactor.clone());
            start_command(
                name, command, args, env, bundle_dir, ctx, host_env, stderr, ct,
            )
            .await
        }
        ServerSpec::Url { url, headers } => start_url(url, headers, ctx, ct).await,
    }
}

#[allow(clippy::too_many_arguments)]
async fn start_command(
    name: &str,
    command: &str,
    args: &[String],
    own_env: &BTreeMap<String, String>,
    bundle_dir: &Path,
    ctx: &LaunchContext,
    host_env: &[(String, String)],
    capture: impl FnOnce(tokio::process::ChildStderr) -> StderrCapture,
    ct: CancellationToken,
) -> Result<Started, String> {
    let seat = if ctx.seats.is_empty() {
        None
    } else {
        Some(ctx.seats.get(name).ok_or_else(|| {
            "the nest set no uid of its own aside for this server, and it never runs as its instance; restart the instance".to_string()
        })?)
    };
    let mut env = launch::server_env(host_env, own_env, ctx)?;
    if let Some(seat) = seat {
        launch::seat_env(&mut env, seat);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let program = launch::resolve_program(command, bundle_dir, path, &ctx.agen_bin, seat)?;
    let cmd = launch::command(&program, args, bundle_dir, &env, seat);
    let mut child = launch::spawn(cmd).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            // The program, or the interpreter its `#!` line names, is out of reach.
            format!(
                "could not start {}: {}",
                program.display(),
                launch::permission_denied(command, &program, seat)
            )
        } else {
            format!("could not start {}: {e}", program.display())
        }
    })?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("could not open the server's stdin, stdout and stderr".into());
    };
    let mut stderr = capture(stderr);
    let Some(process) = ProcessGroup::watch(child) else {
        return Err("the server exited before it could be watched".into());
    };
    tracing::debug!(server = %name, pid = process.pid(), program = %program.display(), "tool server spawned");

    let connect = async {
        let running = client_config()
            .serve_with_ct((stdout, stdin), ct)
            .await
            .map_err(|e| format!("failed to initialize: {}", init_error(&e)))?;
        let tools = running
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("failed to list tools: {}", error_chain(&e)))?;
        Ok::<_, String>((running, tools))
    };
    let failure = match tokio::time::timeout(ctx.start_timeout, connect).await {
        Ok(Ok((running, tools))) => {
            return Ok(Started {
                running,
                tools,
                process: Some(process),
                stderr,
            })
        }
        Ok(Err(reason)) => reason,
        Err(_) => format!(
            "did not answer initialize and tools/list within {:?}",
            ctx.start_timeout
        ),
    };
    // Say how the process ended if it did (that is what explains most failures).
    let exit = tokio::time::timeout(STDERR_DRAIN, process.exited())
        .await
        .ok();
    process.terminate(Duration::from_millis(500)).await;
    stderr.drain(STDERR_DRAIN).await;
    let reason = exit.map(describe_exit).unwrap_or(failure);
    Err(with_output(reason, &stderr.head()))
}

async fn start_url(
    url: &str,
    headers: &BTreeMap<String, String>,
    ctx: &LaunchContext,
    ct: CancellationToken,
) -> Result<Started, String> {
    let mut map = HashMap::new();
    for (k, v) in headers {
        let value = launch::substitute(v, &ctx.secrets, &format!("header {k}"))?;
        let name = http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("header {k}: not a valid HTTP header name"))?;
        let value = http::HeaderValue::from_str(&value)
            .map_err(|_| format!("header {k}: the value is not a valid HTTP header value"))?;
        map.insert(name, value);
    }
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).custom_headers(map),
    );
    let connect = async {
        let running = client_config()
            .serve_with_ct(transport, ct)
            .await
            .map_err(|e| format!("failed to connect to {url}: {}", init_error(&e)))?;
        let tools = running
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("failed to list tools: {}", error_chain(&e)))?;
        Ok::<_, String>((running, tools))
    };
    match tokio::time::timeout(ctx.start_timeout, connect).await {
        Ok(Ok((running, tools))) => Ok(Started {
            running,
            tools,
            process: None,
            stderr: StderrCapture::none(),
        }),
        Ok(Err(reason)) => Err(reason),
        Err(_) => Err(format!(
            "{url} did not answer initialize and tools/list within {:?}",
            ctx.start_timeout
        )),
    }
}

/// An error and its sources as one line for people: rmcp's wrapper layers (which name Rust
/// types) are left out, and a message already contained in the one before it is not repeated.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let msg = err.to_string();
        if !msg.contains("rmcp::") && !parts.iter().any(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        next = err.source();
    }
    if parts.is_empty() {
        return e.to_string();
    }
    parts.join(": ")
}

/// Why `initialize` failed, without rmcp's type names.
fn init_error(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::TransportError { error, context } => {
            format!("{} (while trying to {context})", error_chain(&*error.error))
        }
        other => error_chain(other),
    }
}

/// `reason: output`, or just `reason` when the server wrote nothing.
fn with_output(reason: String, output: &str) -> String {
    let output = output.trim();
    if output.is_empty() {
        reason
    } else {
        format!("{reason}: {output}")
    }
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
