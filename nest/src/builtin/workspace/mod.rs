//! `agen mcp workspace`: read, list, grep, edit, write and run, confined to one root folder.

use std::path::PathBuf;
use std::time::Duration;

/// Options of `agen mcp workspace`.
#[derive(Debug, Clone)]
pub struct WorkspaceOptions {
    pub root: PathBuf,
    pub no_run: bool,
    pub run_timeout: Duration,
}

/// Serves the workspace tools over stdio until the client closes the stream.
pub async fn serve_stdio(_opts: WorkspaceOptions) -> anyhow::Result<()> {
    anyhow::bail!("agen mcp workspace is being built")
}
