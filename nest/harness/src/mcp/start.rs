//! Starting one tool server of a bundle: a command server (spawned with its allowlisted
//! environment, in its own process group, under its seat when the instance is separated) or a
//! url server (streamable HTTP), then `initialize` and `tools/list` within the start deadline.
//! The error of a start is the "not connected" reason people read: how the process ended and the
//! first lines of its stderr, never a secret value.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use agen_shared::bundle::ServerSpec;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, Tool};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use super::launch::{self, describe_exit, ProcessGroup};
use super::listing::ResourceInfo;
use super::stderr::StderrCapture;
use super::{error_chain, LaunchContext, ToolInfo};
use crate::redact::Redactor;

/// How long to wait for the last stderr lines of a server that did not start.
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// A server right after a successful `initialize` + `tools/list`.
pub(super) struct Started {
    pub running: RunningService<RoleClient, ClientConfig>,
    pub tools: Vec<Tool>,
    /// Its resources, listed right after its tools (none when it declares no `resources`).
    pub resources: Vec<ResourceInfo>,
    pub process: Option<ProcessGroup>,
    pub stderr: StderrCapture,
}

fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("agen", env!("CARGO_PKG_VERSION")),
    )
}

pub(super) fn tool_infos(server: &str, tools: &[Tool]) -> Vec<ToolInfo> {
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
pub(super) async fn start_one(
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
        ServerSpec::Url { url, headers } => start_url(name, url, headers, ctx, ct).await,
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
            let resources = super::listing::list_at_start(name, running.peer()).await;
            return Ok(Started {
                running,
                tools,
                resources,
                process: Some(process),
                stderr,
            });
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
    name: &str,
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
            resources: super::listing::list_at_start(name, running.peer()).await,
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
pub(super) fn with_output(reason: String, output: &str) -> String {
    let output = output.trim();
    if output.is_empty() {
        reason
    } else {
        format!("{reason}: {output}")
    }
}
