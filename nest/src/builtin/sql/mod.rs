//! `agen mcp sql`: tables, describe and query, read-only, against Postgres or a SQLite file.

use std::time::Duration;

/// Options of `agen mcp sql`.
#[derive(Debug, Clone)]
pub struct SqlOptions {
    /// Name of the environment variable holding the DSN (never the DSN itself).
    pub dsn_env: String,
    pub timeout: Duration,
}

/// Serves the sql tools over stdio until the client closes the stream.
pub async fn serve_stdio(_opts: SqlOptions) -> anyhow::Result<()> {
    anyhow::bail!("agen mcp sql is being built")
}
