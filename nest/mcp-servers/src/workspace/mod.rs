//! `agen mcp workspace`: read, list, grep, edit, write and run, confined to one root folder,
//! served over MCP stdio with rmcp.
//!
//! Map: [`confine`] is the security boundary (every path opened with `openat2` beneath the root
//! handle), [`files`] holds `read`/`write`/`edit`, [`search`] `list`/`grep` and their shared
//! walk, [`run`] the shell tool. This file is the MCP edge: tool definitions (argument schemas
//! and annotations, which the effect ledger reads), argument parsing and dispatch.
//!
//! Invariants:
//! - every failure a call can meet is a tool result with `isError: true` and a message the
//!   model can act on; protocol errors are only for requests that cannot be routed;
//! - `read`, `list` and `grep` carry `readOnlyHint: true`; `edit`, `write` and `run` do not;
//! - with `--no-run`, `run` is neither listed nor callable;
//! - `write` and `edit` refuse paths inside a `.git` folder unless `--allow-git-writes`
//!   (see [`git_guard`]), and their descriptions say so;
//! - background processes a `run` leaves behind are killed (their process group) when the server
//!   stops, so nothing it started outlives it (on a run timeout they are killed at once);
//! - stdout is the protocol: logs go to stderr through `tracing`.

mod confine;
mod error;
mod files;
mod git_guard;
mod grep_limits;
#[cfg(test)]
mod hostile_tests;
mod run;
mod search;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

pub use error::WorkspaceError;
pub use files::{
    EditArgs, ReadArgs, WriteArgs, DEFAULT_READ_LINES, MAX_LINE_CHARS, MAX_READ_LINES,
};
pub use grep_limits::{GREP_DEADLINE, GREP_REGEX_SIZE_LIMIT};
pub use run::{RunArgs, MAX_RUN_TIMEOUT, OUTPUT_TAIL_CHARS};
pub use search::MAX_GREP_LINE_BYTES;
pub use search::{GrepArgs, ListArgs, SKIPPED_DIRS};

/// The default of `--run-timeout`.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Options of `agen mcp workspace`.
#[derive(Debug, Clone)]
pub struct WorkspaceOptions {
    pub root: PathBuf,
    pub no_run: bool,
    pub run_timeout: Duration,
    /// Allow `write`/`edit` under `.git/` (refused by default: see `git_guard`).
    pub allow_git_writes: bool,
}

/// Serves the workspace tools over stdio until the client closes the stream.
pub async fn serve_stdio(opts: WorkspaceOptions) -> anyhow::Result<()> {
    let server = WorkspaceServer::new(&opts)?;
    tracing::info!(root = %server.inner.root.path().display(), no_run = opts.no_run, "workspace MCP server starting on stdio");
    let running = server
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .context("while starting the workspace MCP server on stdio");
    let reason = match running {
        Ok(running) => running
            .waiting()
            .await
            .context("while serving the workspace MCP server"),
        Err(e) => Err(e),
    };
    server.stop_background_processes();
    tracing::info!(reason = ?reason.as_ref().ok(), "workspace MCP server stopped");
    reason.map(|_| ())
}

/// The workspace MCP server (cheap to clone).
#[derive(Clone)]
pub struct WorkspaceServer {
    inner: Arc<Inner>,
}

struct Inner {
    root: confine::Root,
    no_run: bool,
    allow_git_writes: bool,
    run_timeout: Duration,
    tools: Vec<Tool>,
    /// Process groups of background processes that `run` calls left running.
    leftovers: std::sync::Mutex<Vec<i32>>,
}

impl WorkspaceServer {
    /// Opens the root; fails when it is not an existing folder.
    pub fn new(opts: &WorkspaceOptions) -> Result<Self, WorkspaceError> {
        let root = confine::Root::open(&opts.root)?;
        let tools = tool_definitions(opts.no_run, opts.run_timeout, opts.allow_git_writes);
        Ok(WorkspaceServer {
            inner: Arc::new(Inner {
                root,
                no_run: opts.no_run,
                allow_git_writes: opts.allow_git_writes,
                run_timeout: opts.run_timeout,
                tools,
                leftovers: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }

    /// Kills the process groups that `run` calls left running in the background.
    pub fn stop_background_processes(&self) {
        let groups = std::mem::take(
            &mut *self
                .inner
                .leftovers
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        run::kill_groups(&groups);
    }

    /// The tools this server lists.
    pub fn tools(&self) -> &[Tool] {
        &self.inner.tools
    }

    /// Runs one tool call; every failure is a text the model can act on.
    pub async fn call(
        &self,
        name: &str,
        arguments: JsonObject,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<String, WorkspaceError> {
        let inner = self.inner.clone();
        match name {
            "read" => blocking(parse::<ReadArgs>(name, arguments)?, move |a| files::read(&inner.root, &a)).await,
            "write" => blocking(parse::<WriteArgs>(name, arguments)?, move |a| {
                git_guard::check(&inner.root, &a.path, inner.allow_git_writes)?;
                files::write(&inner.root, &a)
            }).await,
            "edit" => blocking(parse::<EditArgs>(name, arguments)?, move |a| {
                git_guard::check(&inner.root, &a.path, inner.allow_git_writes)?;
                files::edit(&inner.root, &a)
            }).await,
            "list" => blocking(parse::<ListArgs>(name, arguments)?, move |a| search::list(&inner.root, &a)).await,
            "grep" => {
                let stop = grep_limits::Stop::new(grep_limits::GREP_DEADLINE, cancel);
                blocking(parse::<GrepArgs>(name, arguments)?, move |a| search::grep_until(&inner.root, &a, stop)).await
            }
            "run" if !inner.no_run => {
                let args = parse::<RunArgs>(name, arguments)?;
                let timeout = run::effective_timeout(args.timeout, inner.run_timeout)?;
                let outcome = run::run(inner.root.path(), &args.command, timeout, cancel).await?;
                if let Some(pgid) = outcome.leftover_group {
                    inner.leftovers.lock().unwrap_or_else(|p| p.into_inner()).push(pgid);
                }
                if outcome.is_error() {
                    Err(WorkspaceError::Invalid(outcome.render()))
                } else {
                    Ok(outcome.render())
                }
            }
            "run" => Err(WorkspaceError::Invalid(
                "the run tool is disabled on this server (--no-run); use read, list, grep, edit and write".into(),
            )),
            other => Err(WorkspaceError::Invalid(format!(
                "there is no tool `{other}`; this server has {}",
                self.inner.tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

/// Parses tool arguments, naming the tool and the expected fields on failure.
fn parse<T: DeserializeOwned>(tool: &str, arguments: JsonObject) -> Result<T, WorkspaceError> {
    serde_json::from_value(serde_json::Value::Object(arguments))
        .map_err(|e| WorkspaceError::Invalid(format!("invalid arguments for `{tool}`: {e}")))
}

/// Runs file-system work off the async threads.
async fn blocking<A: Send + 'static>(
    args: A,
    work: impl FnOnce(A) -> Result<String, WorkspaceError> + Send + 'static,
) -> Result<String, WorkspaceError> {
    tokio::task::spawn_blocking(move || work(args))
        .await
        .unwrap_or_else(|e| {
            Err(WorkspaceError::Invalid(format!(
                "the tool stopped unexpectedly: {e}"
            )))
        })
}

/// The tool list: names, descriptions, argument schemas and annotations.
fn tool_definitions(no_run: bool, run_timeout: Duration, allow_git_writes: bool) -> Vec<Tool> {
    let git = if allow_git_writes {
        ""
    } else {
        " Files inside a `.git` folder cannot be written or edited, nor can a write make a folder a git repository (HEAD, objects/ and refs/ together): git runs commands from its config and hooks."
    };
    let read_only = |title: &str| {
        ToolAnnotations::with_title(title)
            .read_only(true)
            .open_world(false)
    };
    let skipped = SKIPPED_DIRS.join(", ");
    let mut tools = vec![
        tool::<ReadArgs>(
            "read",
            format!(
                "Read a text file with line numbers, {DEFAULT_READ_LINES} lines at a time. `offset` is the first line (1-based), `limit` how many lines (at most {MAX_READ_LINES}); the output says the next offset when there is more. Lines longer than {MAX_LINE_CHARS} characters are cut."
            ),
            read_only("Read file"),
        ),
        tool::<ListArgs>(
            "list",
            format!(
                "List files matching a glob relative to the workspace root (`src/**/*.go`, `*.md`, `docs/**`), sorted. `*` stays within one folder, `**` crosses folders. These folders are not searched unless the pattern starts inside them: {skipped}. Symbolic links leading outside the root are skipped and reported."
            ),
            read_only("List files"),
        ),
        tool::<GrepArgs>(
            "grep",
            format!(
                "Search file contents with a regular expression; prints matching lines as `path:line: text`. `path` limits the search to a folder or file, `glob` to matching files (`*.rs`). Binary files and these folders are skipped: {skipped}. Only the first {} KiB of a line is searched, and a search stops after {}.",
                MAX_GREP_LINE_BYTES / 1024,
                humantime::format_duration(GREP_DEADLINE)
            ),
            read_only("Search files"),
        ),
        tool::<EditArgs>(
            "edit",
            format!("Replace one exact piece of text in a file. `old_string` must occur exactly once (copy it from `read` output without the line numbers, whitespace included) unless `replace_all` is true.{git}"),
            ToolAnnotations::with_title("Edit file").read_only(false).destructive(true).idempotent(false).open_world(false),
        ),
        tool::<WriteArgs>(
            "write",
            format!("Create a file or replace a whole file with `content`; missing folders are created. Prefer `edit` for changes to an existing file.{git}"),
            ToolAnnotations::with_title("Write file").read_only(false).destructive(true).idempotent(true).open_world(false),
        ),
    ];
    if !no_run {
        tools.push(tool::<RunArgs>(
            "run",
            format!(
                "Run a shell command (`sh -c`) in the workspace root. Returns the exit code and the last {OUTPUT_TAIL_CHARS} characters of combined stdout and stderr. Stopped after {} unless `timeout` (seconds, at most {}) says otherwise; on timeout the command and everything it started are killed.",
                humantime::format_duration(run_timeout),
                MAX_RUN_TIMEOUT.as_secs()
            ),
            ToolAnnotations::with_title("Run command").read_only(false).destructive(true).idempotent(false).open_world(true),
        ));
    }
    tools
}

fn tool<T: JsonSchema + 'static>(
    name: &'static str,
    description: String,
    annotations: ToolAnnotations,
) -> Tool {
    Tool::new(name, description, Arc::new(JsonObject::new()))
        .with_input_schema::<T>()
        .with_annotations(annotations)
}

impl ServerHandler for WorkspaceServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agen-workspace", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Files and a shell in the folder {}. Paths are relative to it; nothing outside it can be read or written.",
                self.inner.root.path().display()
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let arguments = request.arguments.unwrap_or_default();
        tracing::debug!(tool = %name, "workspace tool call");
        let result = match self.call(&name, arguments, context.ct.clone()).await {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => {
                tracing::debug!(tool = %name, error = %e, "workspace tool call failed");
                CallToolResult::error(vec![ContentBlock::text(e.to_string())])
            }
        };
        Ok(result.into())
    }
}
