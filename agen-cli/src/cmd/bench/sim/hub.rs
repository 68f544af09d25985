//! The Hub the simulated fleet drives: an `agen hub` this command starts in its own process
//! (data under the simulator's folder, loopback port 0, the connection caps
//! raised for N Nests on one address) or one already running (`--hub URL`), and what `/proc`
//! says about that process (RSS, CPU time, open file descriptors) and the size of its store.
//!
//! Invariants: a Hub started here stays in this command's process group (a signal to the group,
//! a test's guard, stops both) and is stopped (SIGTERM, SIGKILL after 10 s) before the command
//! returns; it never writes the user's client config (`AGEN_CONFIG` points into
//! the simulator's folder); no fixed port.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::client::{ClientArgs, Output};
use agen_shared::client_config::ClientConfig;

/// How to reach the Hub, and its process when this command started it.
pub struct HubProc {
    pub url: String,
    pub join_token: String,
    pub client: ClientArgs,
    /// The Hub's pid, for `/proc` figures (`None`: not known).
    pub pid: Option<u32>,
    /// Its data dir, for the store's size (`None`: not known).
    pub data_dir: Option<PathBuf>,
    child: Option<tokio::process::Child>,
}

impl HubProc {
    /// Starts `agen hub` with its data in `root/hub` and `extra` flags; waits until it writes
    /// its client config (it listens then).
    pub async fn start(root: &Path, nests: usize, extra: &[String]) -> anyhow::Result<HubProc> {
        let agen = std::env::current_exe().context("cannot find the agen binary")?;
        let data_dir = root.join("hub");
        let log = std::fs::File::create(root.join("hub.log"))
            .with_context(|| format!("cannot create {}", root.join("hub.log").display()))?;
        // Every simulated Nest comes from 127.0.0.1: the per-address and total caps are the
        // fleet's size, not a handful of clients'.
        let caps = [
            ("--max-unauthenticated-per-address", 4096.max(nests / 4)),
            ("--max-unauthenticated", 8192.max(nests / 2)),
            ("--max-connections", 16384.max(nests * 2 + 1024)),
            ("--max-nests", 10_000.max(nests + nests / 5 + 16)),
        ];
        let mut cmd = tokio::process::Command::new(agen);
        cmd.arg("hub")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen", "127.0.0.1:0"]);
        for (flag, n) in caps {
            if !extra.iter().any(|e| e == flag) {
                cmd.arg(flag).arg(n.to_string());
            }
        }
        cmd.args(extra)
            .env("AGEN_CONFIG", root.join("user-client.toml"))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("cannot start agen hub")?;
        let pid = child.id();
        let cfg_path = data_dir.join("client.toml");
        let deadline = Instant::now() + Duration::from_secs(300);
        let cfg = loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "agen hub exited ({status}) before it listened; its log: {}",
                    root.join("hub.log").display()
                );
            }
            if let Ok(cfg) = ClientConfig::load(&cfg_path) {
                if cfg.hub.is_some() {
                    break cfg;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "agen hub did not listen within 300 s; its log: {}",
                    root.join("hub.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let join_token = read_trimmed(&data_dir.join("join-token"))?;
        let url = cfg.hub.clone().unwrap_or_default();
        Ok(HubProc {
            client: ClientArgs {
                hub: Some(url.clone()),
                namespace: "default".into(),
                token: cfg.token.clone(),
                ca_file: cfg.ca_file.clone(),
                output: Output::Table,
            },
            url,
            join_token,
            pid,
            data_dir: Some(data_dir),
            child: Some(child),
        })
    }

    /// A Hub already running at `url`: the join token from `join_file`, the API client from
    /// the usual client settings.
    pub fn attach(
        url: &str,
        join_file: &Path,
        client: ClientArgs,
        pid: Option<u32>,
        data_dir: Option<PathBuf>,
    ) -> anyhow::Result<HubProc> {
        Ok(HubProc {
            url: url.to_string(),
            join_token: read_trimmed(join_file)?,
            client: ClientArgs {
                hub: Some(url.to_string()),
                ..client
            },
            pid,
            data_dir,
            child: None,
        })
    }

    /// What `/proc` says about the Hub's process now.
    pub fn sample(&self) -> Option<ProcSample> {
        ProcSample::of(self.pid?)
    }

    /// Bytes under the Hub's `db/` (its store), when its data dir is known.
    pub fn store_bytes(&self) -> Option<u64> {
        Some(dir_bytes(&self.data_dir.as_ref()?.join("db")))
    }

    /// Stops a Hub this command started (SIGTERM, SIGKILL after 10 s).
    pub async fn stop(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

fn read_trimmed(path: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .trim()
        .to_string())
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// One process's resident memory, CPU time and open descriptors at one moment.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub at: Instant,
    pub rss_bytes: u64,
    pub cpu: Duration,
    pub open_fds: usize,
}

impl ProcSample {
    pub fn of(pid: u32) -> Option<ProcSample> {
        let base = PathBuf::from(format!("/proc/{pid}"));
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)? as f64;
        let stat = std::fs::read_to_string(base.join("stat")).ok()?;
        // Fields after the command name (which may hold spaces): state is field 3, utime 14,
        // stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = f.get(11)?.parse().ok()?;
        let stime: u64 = f.get(12)?.parse().ok()?;
        let status = std::fs::read_to_string(base.join("status")).ok()?;
        let rss_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())?;
        let open_fds = std::fs::read_dir(base.join("fd")).ok()?.count();
        Some(ProcSample {
            at: Instant::now(),
            rss_bytes: rss_kb * 1024,
            cpu: Duration::from_secs_f64((utime + stime) as f64 / ticks),
            open_fds,
        })
    }

    /// The CPU spent from `before` to `self`, as a share of one core (100 = one core).
    pub fn cpu_percent_since(&self, before: &ProcSample) -> f64 {
        let wall = self.at.duration_since(before.at).as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        self.cpu.saturating_sub(before.cpu).as_secs_f64() / wall * 100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_can_be_sampled() {
        let s = ProcSample::of(std::process::id()).expect("/proc/self");
        assert!(s.rss_bytes > 0 && s.open_fds > 0);
    }
}
