//! The raw MCP baseline of `agen bench`: the benchmark's tool called directly through
//! [`agen_harness::mcp::ToolHost`], the same server and arguments as inside a run, no fleet.
//!
//! Invariant: the tool host is shut down before this returns, whether the calls worked or not.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{BenchTool, DEPLOYMENT};

/// Times `n` sequential calls of `tool` made directly through a [`agen_harness::mcp::ToolHost`]
/// (with a `_meta` like the harness sends); milliseconds per call.
pub(super) async fn tool_calls(
    bundle_dir: &Path,
    agen_bin: &Path,
    tool: BenchTool,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let bundle = agen_shared::bundle::Bundle::load(bundle_dir)
        .context("the benchmark bundle is not valid")?;
    let host = agen_harness::mcp::ToolHost::start(
        &bundle,
        agen_harness::mcp::LaunchContext::new(agen_bin),
    )
    .await;
    let status = host.status();
    if let Some(p) = status.not_connected.first() {
        host.shutdown().await;
        bail!(
            "the workspace tool server did not start for the raw baseline: {}: {}",
            p.server,
            p.reason
        );
    }
    let meta: serde_json::Map<String, Value> = json!({
        "agen/namespace": "default",
        "agen/deployment": DEPLOYMENT,
        "agen/taskId": "bench-raw",
        "agen/runId": "bench-raw",
        "agen/rootRunId": "bench-raw",
        "traceparent": "00-00000000000000000000000000000001-0000000000000001-01",
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    let args = tool.arguments();
    let qualified = format!("ws.{}", tool.name());
    let mut samples = Vec::with_capacity(n);
    // A few unmeasured calls first, as the fleet phase has a warm-up too.
    for i in 0..n + 5 {
        let start = Instant::now();
        let out = host
            .call(
                &qualified,
                args.clone(),
                meta.clone(),
                Duration::from_secs(30),
                CancellationToken::new(),
            )
            .await;
        let took = start.elapsed();
        match out {
            Ok(o) if !o.is_error => {}
            Ok(o) => {
                host.shutdown().await;
                bail!("the raw {qualified} call failed: {}", o.text);
            }
            Err(e) => {
                host.shutdown().await;
                bail!("the raw {qualified} call failed: {e}");
            }
        }
        if i >= 5 {
            samples.push(took.as_secs_f64() * 1000.0);
        }
    }
    host.shutdown().await;
    Ok(samples)
}
