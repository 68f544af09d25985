//! The self-contained fleet of `agen bench`: a Hub (TLS unless `--insecure-plaintext`) and one
//! Nest started in this process on loopback port 0 under the benchmark's temporary folder, the
//! client settings that reach them (and the Hub's `/metrics` on loopback port 0), and the
//! benchmark bundles they run.
//!
//! Invariants: no fixed port; instances run as the invoking user (no uid separation, so a
//! write tool can write the benchmark's workspace); [`Fleet::stop`] cancels the Hub and the Nest and waits for both
//! (the Nest at most 20 s), so no instance or tool server outlives the command.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use anyhow::{bail, Context};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Args, READ_FILE};
use crate::client::{status_error, ClientArgs, Hub, Output};
use crate::view;

/// A running Hub and Nest, and how a client reaches the Hub.
pub(super) struct Fleet {
    pub client: ClientArgs,
    /// The Hub's `/metrics` (loopback, port 0 resolved).
    pub metrics_addr: Option<SocketAddr>,
    hub: agen_hub::HubHandle,
    nest: tokio::task::JoinHandle<()>,
    shutdown: CancellationToken,
}

impl Fleet {
    /// Starts the Hub and the Nest under `root`; both stop on `shutdown` (or [`Fleet::stop`]).
    pub async fn start(
        args: &Args,
        root: &Path,
        agen_bin: &Path,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Fleet> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let hub = agen_hub::start(
            agen_hub::HubOptions {
                data_dir: root.join("hub"),
                listen: loopback,
                insecure_plaintext: args.insecure_plaintext,
                // Scraped before and after the measured phase for the fsync counters.
                metrics_listen: Some(loopback),
                ..agen_hub::HubOptions::default()
            },
            shutdown.child_token(),
        )
        .await
        .context("cannot start the Hub")?;
        let mut nest_opts =
            agen_nest::config::NestOptions::new(hub.url.clone(), hub.join_token.clone());
        nest_opts.data_dir = root.join("nest");
        nest_opts.name = "bench-nest".into();
        nest_opts.agen_bin = agen_bin.to_path_buf();
        // Instances run as this user, like the raw baseline's server: the workspace (and the
        // file `--tool write` replaces) is this user's, whatever uid the bench runs under.
        nest_opts.run_as = agen_nest::separation::RunAs::Myself;
        let nest_token = shutdown.child_token();
        let nest = tokio::spawn(async move {
            if let Err(e) = agen_nest::daemon::run(nest_opts, nest_token).await {
                tracing::error!("bench nest stopped: {e}");
            }
        });
        let client = ClientArgs {
            hub: Some(hub.url.clone()),
            namespace: "default".into(),
            token: Some(hub.admin_token.clone()),
            ca_file: if hub.plaintext {
                None
            } else {
                Some(hub.ca_file.clone())
            },
            output: Output::Table,
        };
        Ok(Fleet {
            client,
            metrics_addr: hub.metrics_addr,
            hub,
            nest,
            shutdown,
        })
    }

    /// Stops the Hub and the Nest and waits for them.
    pub async fn stop(self) {
        self.shutdown.cancel();
        if let Err(e) = self.hub.wait().await {
            tracing::warn!("hub stopped with an error: {e}");
        }
        if tokio::time::timeout(Duration::from_secs(20), self.nest)
            .await
            .is_err()
        {
            tracing::warn!("the bench nest did not stop within 20 s");
        }
    }
}

/// Waits until the Hub lists a ready Nest.
pub(super) async fn wait_for_nest(hub: &mut Hub, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let nests = hub
            .client
            .list_nests(pb::ListNestsRequest::default())
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner()
            .nests;
        if nests.iter().any(|n| view::nest_state(n.state) == "ready") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the bench Nest did not join the Hub within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bundle: the fake model at `base_url` and `agen mcp workspace` on `workspace` as server `ws`.
pub(super) fn write_bundle(dir: &Path, base_url: &str, workspace: &Path) -> anyhow::Result<()> {
    let agent = format!(
        "---\nname: bench\nmodel: openai/fake-bench\nbaseUrl: {base_url}\n---\n\
         You are a benchmark agent. Read {READ_FILE} with the ws tools and answer.\n"
    );
    let mcp = json!({
        "mcpServers": {
            "ws": {
                "command": "agen",
                "args": ["mcp", "workspace", "--root", workspace.to_string_lossy(), "--no-run"]
            }
        }
    });
    let write = |rel: &str, text: &str| -> anyhow::Result<()> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write("x-agen/agent.md", &agent)?;
    write("mcp.json", &serde_json::to_string_pretty(&mcp)?)?;
    Ok(())
}
