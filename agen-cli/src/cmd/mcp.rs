//! `agen mcp workspace|sql`: Agen's built-in MCP servers over stdio (stdout is the protocol;
//! logs go to stderr).

use std::path::PathBuf;
use std::time::Duration;

use agen_mcp_servers::{sql, workspace};

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Files and a shell in one folder: read, list, grep, edit, write, run
    Workspace {
        /// The folder every path is confined to
        #[arg(long)]
        root: PathBuf,
        /// Leave the run tool out (files only)
        #[arg(long)]
        no_run: bool,
        /// Default time limit of a run call (e.g. 2m, 90s)
        #[arg(long, default_value = "2m", value_parser = parse_duration)]
        run_timeout: Duration,
        /// Let write and edit change files under .git/ (refused by default: git runs commands
        /// from its config and hooks)
        #[arg(long)]
        allow_git_writes: bool,
    },
    /// Read-only SQL: tables, describe, query (Postgres URL or SQLite file)
    Sql {
        /// Environment variable holding the DSN (never the DSN itself)
        #[arg(long, default_value = "DATABASE_URL")]
        dsn_env: String,
        /// Statement timeout (e.g. 30s)
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}: expected a duration such as 90s or 10m"))
}

pub async fn run(cmd: Command) -> anyhow::Result<i32> {
    agen_shared::telemetry::init("warn");
    match cmd {
        Command::Workspace {
            root,
            no_run,
            run_timeout,
            allow_git_writes,
        } => {
            workspace::serve_stdio(workspace::WorkspaceOptions {
                root,
                no_run,
                run_timeout,
                allow_git_writes,
            })
            .await?
        }
        Command::Sql { dsn_env, timeout } => {
            sql::serve_stdio(sql::SqlOptions { dsn_env, timeout }).await?
        }
    }
    Ok(0)
}
