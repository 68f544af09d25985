//! `agen mcp sql`: tables, describe and query, read-only, against Postgres or a SQLite file.
//!
//! Reading order: `guard` (the lexical screen every query passes first), `render` (what the
//! tools return, and where results are cut), `postgres` and `sqlite` (the two engines and their
//! own read-only fences; the `postgres/` folder also holds its TLS, its tools and its value
//! decoding), then this file (the MCP server over stdio, through rmcp).
//!
//! Invariants:
//! - the DSN comes only from the environment variable named by `--dsn-env`, and is never logged
//!   or returned in a tool result;
//! - every tool is marked `readOnlyHint`, and no tool can change the database: each engine
//!   enforces read-only itself, and the screen only adds early, clear refusals;
//! - a failing call is a tool result with `isError: true`, never a crash of the server (only
//!   arguments of the wrong JSON shape are JSON-RPC invalid-params errors, as rmcp answers them);
//! - a cancelled call (MCP `notifications/cancelled`) stops its database work;
//! - stdout is the protocol: logs go to stderr through `tracing`.

mod error;
pub mod guard;
#[cfg(test)]
mod guard_fuzz;
mod postgres;
pub mod render;
mod sqlite;
mod sqlite_bounds;
mod unicode_ident;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

pub use error::SqlError;
use postgres::Postgres;
use render::{render_columns, render_rows, render_tables, row_limit};
use sqlite::Sqlite;

/// Options of `agen mcp sql`.
#[derive(Debug, Clone)]
pub struct SqlOptions {
    /// Name of the environment variable holding the DSN (never the DSN itself).
    pub dsn_env: String,
    pub timeout: Duration,
}

/// Serves the sql tools over stdio until the client closes the stream.
pub async fn serve_stdio(opts: SqlOptions) -> anyhow::Result<()> {
    let server = SqlServer::from_env(&opts).await?;
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("while starting the sql MCP server on stdio")?;
    running
        .waiting()
        .await
        .context("while serving the sql MCP server")?;
    Ok(())
}

/// The database behind the server.
enum Database {
    Postgres(Box<Postgres>),
    Sqlite(Sqlite),
}

impl Database {
    /// Opens the database a DSN names: `postgres://`/`postgresql://` URLs are Postgres, anything
    /// else is a SQLite file. `dsn_env` only names the variable in error messages.
    async fn open(dsn: &str, dsn_env: &str, timeout: Duration) -> Result<Self, SqlError> {
        let lower = dsn.trim_start().to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            let pg = Postgres::new(dsn.trim(), dsn_env, timeout)?;
            if let Err(e) = pg.warm_up().await {
                // Still serve: the database may come up later, and each call says what failed.
                tracing::warn!(error = %e, "postgres is not reachable yet");
            }
            Ok(Database::Postgres(Box::new(pg)))
        } else {
            let dsn = dsn.to_owned();
            let env = dsn_env.to_owned();
            tokio::task::spawn_blocking(move || Sqlite::open(&dsn, &env, timeout))
                .await
                .map_err(|e| SqlError::Config(format!("internal error while opening SQLite: {e}")))?
                .map(Database::Sqlite)
        }
    }

    fn engine(&self) -> &'static str {
        match self {
            Database::Postgres(_) => "postgres",
            Database::Sqlite(_) => "sqlite",
        }
    }
}

/// Arguments of `describe`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct DescribeArgs {
    /// The table or view, as `tables` lists it (for example `items` or `public.items`).
    pub table: String,
}

/// Arguments of `query`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct QueryArgs {
    /// One read-only SQL statement (SELECT, WITH, VALUES, EXPLAIN, …).
    pub sql: String,
    /// Maximum rows to return: 100 when absent, at most 1000.
    #[serde(default)]
    pub limit: Option<u64>,
}

/// The MCP server: three read-only tools over one database.
#[derive(Clone)]
pub struct SqlServer {
    db: Arc<Database>,
    tool_router: ToolRouter<Self>,
}

impl SqlServer {
    fn new(db: Database) -> Self {
        Self {
            db: Arc::new(db),
            tool_router: Self::tool_router(),
        }
    }

    /// Reads the DSN from the variable `opts.dsn_env` and opens the database.
    pub async fn from_env(opts: &SqlOptions) -> anyhow::Result<Self> {
        let var = &opts.dsn_env;
        let dsn = match std::env::var(var) {
            Ok(dsn) if !dsn.trim().is_empty() => dsn,
            Ok(_) => anyhow::bail!(
                "agen mcp sql: ${var} is empty; set it to a postgres:// URL or a SQLite file path \
                 (or name another variable with --dsn-env)"
            ),
            Err(_) => anyhow::bail!(
                "agen mcp sql: ${var} is not set; set it to a postgres:// URL or a SQLite file path \
                 (or name another variable with --dsn-env)"
            ),
        };
        let db = Database::open(&dsn, var, opts.timeout)
            .await
            .map_err(|e| anyhow::anyhow!("agen mcp sql: {e}"))?;
        tracing::info!(engine = db.engine(), timeout = ?opts.timeout, "sql server ready");
        Ok(Self::new(db))
    }
}

/// Runs `work` until the MCP request is cancelled; then drops it, which stops the database
/// work too (the engines cancel or interrupt an abandoned call).
async fn until_cancelled<T>(
    ct: &CancellationToken,
    work: impl std::future::Future<Output = Result<T, SqlError>>,
) -> Result<T, SqlError> {
    tokio::select! {
        result = work => result,
        () = ct.cancelled() => Err(SqlError::Cancelled),
    }
}

fn ok(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn failed(tool: &str, e: &SqlError) -> CallToolResult {
    tracing::debug!(tool, error = %e, "tool call failed");
    CallToolResult::error(vec![ContentBlock::text(e.to_string())])
}

#[tool_router]
impl SqlServer {
    /// Lists the tables and views of the database, one `name (kind)` per line.
    #[tool(
        name = "tables",
        annotations(
            title = "List tables",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn tables(&self, ct: CancellationToken) -> CallToolResult {
        let db = &*self.db;
        let result = until_cancelled(&ct, async {
            match db {
                Database::Postgres(pg) => pg.tables().await,
                Database::Sqlite(lite) => lite.tables().await,
            }
        })
        .await;
        match result {
            Ok(tables) => ok(render_tables(&tables)),
            Err(e) => failed("tables", &e),
        }
    }

    /// Describes a table's columns: name, type, and whether it may be null.
    #[tool(
        name = "describe",
        annotations(
            title = "Describe a table",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn describe(
        &self,
        Parameters(args): Parameters<DescribeArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        let db = &*self.db;
        let result = until_cancelled(&ct, async {
            match db {
                Database::Postgres(pg) => pg.describe(&args.table).await,
                Database::Sqlite(lite) => lite.describe(&args.table).await,
            }
        })
        .await;
        match result {
            Ok((name, columns)) => ok(render_columns(&name, &columns)),
            Err(e) => failed("describe", &e),
        }
    }

    /// Runs one read-only SQL query and returns its rows as JSON lines (one object per row):
    /// 100 rows by default, at most 1000 with `limit`. Cells over 1,000 characters are cut.
    #[tool(
        name = "query",
        annotations(
            title = "Run a read-only query",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn query(
        &self,
        Parameters(args): Parameters<QueryArgs>,
        ct: CancellationToken,
    ) -> CallToolResult {
        let (limit, note) = match row_limit(args.limit) {
            Ok(limit) => limit,
            Err(reason) => return failed("query", &SqlError::BadArgument(reason)),
        };
        let db = &*self.db;
        let result = until_cancelled(&ct, async {
            match db {
                Database::Postgres(pg) => pg.query(&args.sql, limit).await,
                Database::Sqlite(lite) => lite.query(&args.sql, limit).await,
            }
        })
        .await;
        match result {
            Ok(rows) => ok(render_rows(rows, limit, note)),
            Err(e) => failed("query", &e),
        }
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "agen-sql",
    instructions = "Read-only SQL. `tables` lists tables and views, `describe` shows a table's columns, \
                    `query` runs one read-only statement and returns rows as JSON lines (100 by default, \
                    `limit` up to 1000). Writes, multiple statements and session changes are refused."
)]
impl ServerHandler for SqlServer {}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn every_tool_is_read_only_and_has_the_contract_arguments() {
        let server_tools = SqlServer::tool_router().list_all();
        let mut names: Vec<String> = server_tools.iter().map(|t| t.name.to_string()).collect();
        names.sort();
        assert_eq!(names, vec!["describe", "query", "tables"]);
        for tool in &server_tools {
            let annotations = tool.annotations.as_ref().expect("annotations");
            assert_eq!(annotations.read_only_hint, Some(true), "{}", tool.name);
            let properties = tool
                .input_schema
                .get("properties")
                .and_then(|p| p.as_object())
                .cloned()
                .unwrap_or_default();
            let mut keys: Vec<&str> = properties.keys().map(String::as_str).collect();
            keys.sort();
            let expected: Vec<&str> = match tool.name.as_ref() {
                "tables" => vec![],
                "describe" => vec!["table"],
                _ => vec!["limit", "sql"],
            };
            assert_eq!(keys, expected, "{}", tool.name);
        }
    }
}
