//! `agen run DIR PROMPT`: one run of a bundle in-process, no Hub: loads and validates the
//! bundle, resolves `env` secrets, starts its tool servers, runs the harness with a local sled
//! run log, and prints the answer.
//!
//! Invariants: stdout carries only the answer; a bad bundle exits 64, a failed run 1.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Runs `prompt` against the bundle in `dir`; returns the process exit code.
pub async fn run_cli(dir: PathBuf, prompt: String, model: Option<String>) -> anyhow::Result<i32> {
    let _ = (dir, prompt, model);
    let _: Option<SocketAddr> = None;
    anyhow::bail!("agen run is not implemented yet")
}
