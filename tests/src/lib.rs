//! Typed harnesses for end-to-end tests: the real `agen` binary as a Hub, Nests, the CLI and
//! the scripted fake model, each in its own process group that is killed when the guard drops.
//! Readiness is polled with deadlines, never slept for. Ports are picked free right before use.
//!
//! Nothing here mocks an Agen component: every process is the shipped binary.

pub mod postgres;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// `target/debug/agen` (or `$CARGO_TARGET_DIR/debug/agen`); `tests/run.sh` builds it first.
pub fn agen_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    // `AGEN_TEST_PROFILE=release` (read, never set): the benchmarks' release figures.
    let profile = match std::env::var("AGEN_TEST_PROFILE").as_deref() {
        Ok("release") => "release",
        _ => "debug",
    };
    let bin = target.join(profile).join("agen");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --bins` (tests/run.sh does; `--release` for AGEN_TEST_PROFILE=release)",
        bin.display()
    );
    bin
}

/// Third-party peers installed by `tests/peers/install.sh`.
pub struct Peers;

impl Peers {
    fn dir() -> PathBuf {
        workspace_root().join("target/peers")
    }
    /// The venv's python (PyPI `mcp` and `mcp-server-time` installed).
    pub fn python() -> PathBuf {
        let p = Self::dir().join("venv/bin/python");
        assert!(
            p.exists(),
            "{} is missing: run tests/peers/install.sh (tests/run.sh does)",
            p.display()
        );
        p
    }
    /// The `mcp-server-time` console script of the venv.
    pub fn mcp_server_time() -> PathBuf {
        let p = Self::dir().join("venv/bin/mcp-server-time");
        assert!(
            p.exists(),
            "{} is missing: run tests/peers/install.sh",
            p.display()
        );
        p
    }
    /// Entry point of an npm MCP server, e.g. `server-filesystem`.
    pub fn node_server(name: &str) -> PathBuf {
        let p = Self::dir()
            .join("node_modules/@modelcontextprotocol")
            .join(name)
            .join("dist/index.js");
        assert!(
            p.exists(),
            "{} is missing: run tests/peers/install.sh",
            p.display()
        );
        p
    }
    /// A script under `tests/peers/`.
    pub fn script(rel: &str) -> PathBuf {
        workspace_root().join("tests/peers").join(rel)
    }
}

/// A free loopback port, picked right before use.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Polls `f` every 100 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child in its own process group; the whole group is killed on drop.
pub struct Proc {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` in a new process group with stdout+stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("spawn {name}"))?;
        Ok(Proc {
            child,
            name: name.into(),
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL to the process only (not its group): a crash.
    pub fn kill9(&mut self) {
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait up to `grace`, then SIGKILL the group.
    pub fn stop(&mut self, grace: Duration) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Hub (`agen hub`) on a fixed free port with its own data dir and client config.
pub struct HubProcess {
    pub proc: Proc,
    pub dir: PathBuf,
    pub port: u16,
    pub nest_ttl: String,
    /// More `agen hub` flags this Hub was started with (kept across restarts).
    pub extra_args: Vec<String>,
    /// More environment variables of the Hub process (kept across restarts).
    pub extra_env: Vec<(String, String)>,
    /// The `--hub` Nests started by [`HubProcess::nest_with`] get (several Hubs:
    /// `URL1,URL2`); `None`: this Hub's URL.
    pub nest_hub: Option<String>,
    /// More environment variables of the Nests [`HubProcess::nest_with`] starts (e.g. an
    /// older build's `AGEN_PROTOCOL_VERSION`).
    pub nest_env: Vec<(String, String)>,
}

impl HubProcess {
    /// Starts a Hub with data under `dir/hub` and waits until it answers.
    pub fn start(dir: &Path) -> anyhow::Result<HubProcess> {
        Self::start_on(dir, free_port(), "3s")
    }

    pub fn start_on(dir: &Path, port: u16, nest_ttl: &str) -> anyhow::Result<HubProcess> {
        Self::start_with_args(dir, port, nest_ttl, &[])
    }

    /// Starts a Hub with more `agen hub` flags (limits, …).
    pub fn start_with_args(
        dir: &Path,
        port: u16,
        nest_ttl: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<HubProcess> {
        Self::start_with_env(dir, port, nest_ttl, extra_args, &[])
    }

    /// Starts a Hub with more `agen hub` flags and environment variables (`OTEL_*`, …).
    pub fn start_with_env(
        dir: &Path,
        port: u16,
        nest_ttl: &str,
        extra_args: &[&str],
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<HubProcess> {
        std::fs::create_dir_all(dir)?;
        let mut cmd = Command::new(agen_bin());
        cmd.args(["hub", "--data-dir"])
            .arg(dir.join("hub"))
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--nest-ttl",
                nest_ttl,
            ])
            .args(extra_args)
            .env("AGEN_CONFIG", dir.join("client.toml"))
            .env("RUST_LOG", "info")
            .envs(extra_env.iter().copied());
        let proc = Proc::spawn("hub", cmd, &dir.join("hub.log"))?;
        let hub = HubProcess {
            proc,
            dir: dir.to_owned(),
            port,
            nest_ttl: nest_ttl.into(),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            extra_env: extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            nest_hub: None,
            nest_env: Vec::new(),
        };
        hub.wait_ready()?;
        Ok(hub)
    }

    /// Kills the Hub (SIGKILL) and starts it again on the same port and data dir.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.proc.kill9();
        let extra: Vec<&str> = self.extra_args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .extra_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let fresh =
            Self::start_with_env(&self.dir, self.port, &self.nest_ttl.clone(), &extra, &env)?;
        *self = fresh;
        Ok(())
    }

    /// Waits until the Hub answers `agen nests` (a follower answers once it leads).
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        // Long enough for a Hub loading a large store (benchmarks seed 100,000 tasks).
        wait_for("the hub to answer", Duration::from_secs(300), || {
            if !self.dir.join("client.toml").exists() {
                return None;
            }
            self.cli(&["nests", "-o", "json"])
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ())
        })
        .with_context(|| format!("hub log:\n{}", self.proc.log_text()))
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A TLS channel to the Hub's gRPC API (trusting its CA), for tests that speak the API
    /// directly; calls need [`HubProcess::bearer`].
    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        agen_shared::tls::install_crypto_provider();
        let ca = std::fs::read_to_string(self.dir.join("hub/tls/ca.pem"))?;
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        Ok(tonic::transport::Endpoint::from_shared(self.url())?
            .tls_config(tls)?
            .connect()
            .await?)
    }

    /// `request` with the admin token as its bearer.
    pub fn bearer<T>(&self, request: T) -> anyhow::Result<tonic::Request<T>> {
        let token = std::fs::read_to_string(self.dir.join("hub/admin-token"))?;
        let mut req = tonic::Request::new(request);
        req.metadata_mut()
            .insert("authorization", format!("Bearer {}", token.trim()).parse()?);
        Ok(req)
    }

    pub fn join_token(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("hub/join-token"))?
            .trim()
            .to_owned())
    }

    /// The CLI against this Hub (its client config via `AGEN_CONFIG`).
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<Output> {
        cli(&self.dir.join("client.toml"), args)
    }

    /// Runs the CLI, requires success and parses stdout as JSON.
    pub fn cli_json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = self.cli(args)?;
        if !out.status.success() {
            bail!(
                "agen {} failed ({}):\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "agen {} printed no JSON: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `agen ps --all -o json`.
    pub fn instances(&self) -> anyhow::Result<Vec<Value>> {
        match self.cli_json(&["ps", "--all", "-o", "json"])? {
            Value::Array(a) => Ok(a),
            other => Err(anyhow!("ps printed {other}")),
        }
    }

    /// `agen nests -o json`.
    pub fn nests(&self) -> anyhow::Result<Vec<Value>> {
        match self.cli_json(&["nests", "-o", "json"])? {
            Value::Array(a) => Ok(a),
            other => Err(anyhow!("nests printed {other}")),
        }
    }

    /// Starts a Nest joined to this Hub, its instances running as the Nest's user
    /// (`--run-as-self`: tests write marker files into their root-only temp dirs).
    pub fn nest(
        &self,
        name: &str,
        labels: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<NestProcess> {
        self.nest_with(name, labels, env, &["--run-as-self"])
    }

    /// Starts a Nest joined to this Hub with `extra` flags (e.g. `--run-uids 62000-62009`:
    /// instances under their own uids; the test's dir must then let other users through).
    pub fn nest_with(
        &self,
        name: &str,
        labels: &[&str],
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> anyhow::Result<NestProcess> {
        self.nest_wrapped(name, labels, env, extra, &[])
    }

    /// [`Self::nest_with`], the Nest started through `wrapper`: a command that ends by
    /// exec-ing the arguments after its own (`unshare --mount sh -c '...; exec "$@"' sh`), so
    /// the Nest keeps its pid and process group.
    pub fn nest_wrapped(
        &self,
        name: &str,
        labels: &[&str],
        env: &[(&str, &str)],
        extra: &[&str],
        wrapper: &[&str],
    ) -> anyhow::Result<NestProcess> {
        let dir = self.dir.join("nests").join(name);
        std::fs::create_dir_all(&dir)?;
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(agen_bin());
                c
            }
            None => Command::new(agen_bin()),
        };
        cmd.args([
            "nest",
            "--hub",
            &self.nest_hub.clone().unwrap_or_else(|| self.url()),
            "--join-file",
            &self.dir.join("hub/join-token").to_string_lossy(),
            "--name",
            name,
            "--data-dir",
        ])
        .arg(&dir)
        .args(extra)
        .env("RUST_LOG", "info");
        for l in labels {
            cmd.args(["--label", l]);
        }
        for (k, v) in &self.nest_env {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let proc = Proc::spawn(name, cmd, &self.dir.join(format!("nest-{name}.log")))?;
        let nest = NestProcess {
            proc,
            dir,
            name: name.into(),
        };
        wait_for(
            &format!("nest {name} to join"),
            Duration::from_secs(30),
            || {
                self.nests()
                    .ok()?
                    .iter()
                    .any(|n| n["name"] == name && n["state"] == "ready")
                    .then_some(())
            },
        )
        .with_context(|| format!("nest log:\n{}", nest.proc.log_text()))?;
        Ok(nest)
    }

    /// Waits until `f` holds for the instances of `agen ps --all -o json`.
    pub fn wait_instances(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&[Value]) -> bool,
    ) -> anyhow::Result<Vec<Value>> {
        let mut last = Vec::new();
        wait_for(what, timeout, || {
            let list = self.instances().ok()?;
            last = list.clone();
            f(&list).then_some(list)
        })
        .with_context(|| {
            format!(
                "last instances: {}",
                serde_json::to_string_pretty(&last).unwrap_or_default()
            )
        })
    }
}

/// A Nest (`agen nest`) process.
pub struct NestProcess {
    pub proc: Proc,
    pub dir: PathBuf,
    pub name: String,
}

impl NestProcess {
    /// Pids of every process that belongs to this Nest (the Nest itself included: its command
    /// line names its data dir): instances and tool servers (their working directory is a
    /// bundle in it, or, for separated instances, in the Nest's run root outside it).
    pub fn descendants(&self) -> Vec<u32> {
        let mut pids = processes_under(&self.dir);
        for p in processes_under(&agen_nest::separation::runtime_root(&self.dir)) {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        pids
    }
}

/// Pids (other than ours) whose command line mentions `dir` or whose cwd is inside it.
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let dir_s = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = e.path();
        // Zombies have no cwd and an empty cmdline; they are gone for our purposes.
        if let Ok(stat) = std::fs::read_to_string(base.join("stat")) {
            if stat
                .rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
                .unwrap_or(false)
            {
                continue;
            }
        }
        let cmdline = std::fs::read(base.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let cwd = std::fs::read_link(base.join("cwd")).unwrap_or_default();
        if cmdline.contains(&dir_s) || cwd.starts_with(dir) {
            out.push(pid);
        }
    }
    out
}

/// Runs `agen ARGS` with the given client config.
pub fn cli(config: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(agen_bin())
        .args(args)
        .env("AGEN_CONFIG", config)
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .output()?)
}

/// The scripted fake model (`agen fake-model`): NOT a real model; it answers from a script
/// over the OpenAI-compatible (and Anthropic) HTTP API so the real provider clients run.
pub struct FakeModel {
    pub proc: Proc,
    pub port: u16,
}

impl FakeModel {
    pub fn start(dir: &Path, script: &Value) -> anyhow::Result<FakeModel> {
        std::fs::create_dir_all(dir)?;
        let script_file = dir.join("fake-model-script.json");
        std::fs::write(&script_file, serde_json::to_vec_pretty(script)?)?;
        let port_file = dir.join("fake-model.port");
        let _ = std::fs::remove_file(&port_file);
        let mut cmd = Command::new(agen_bin());
        cmd.arg("fake-model")
            .arg("--script")
            .arg(&script_file)
            .arg("--port-file")
            .arg(&port_file);
        let proc = Proc::spawn("fake-model", cmd, &dir.join("fake-model.log"))?;
        let port = wait_for("the fake model to listen", Duration::from_secs(20), || {
            std::fs::read_to_string(&port_file)
                .ok()?
                .trim()
                .parse::<u16>()
                .ok()
        })
        .with_context(|| format!("fake model log:\n{}", proc.log_text()))?;
        Ok(FakeModel { proc, port })
    }

    /// The OpenAI-compatible base URL (`baseUrl` in agent.md).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

/// Writes a bundle from `(relative path, contents)` pairs into `dir`.
pub fn write_bundle(dir: &Path, files: &[(&str, String)]) -> anyhow::Result<()> {
    for (rel, text) in files {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, text)?;
    }
    Ok(())
}

/// `mcp.json` text from `(server name, spec)` pairs.
pub fn mcp_json(servers: &[(&str, Value)]) -> String {
    let map: BTreeMap<_, _> = servers
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    serde_json::to_string_pretty(&serde_json::json!({ "mcpServers": map })).expect("json")
}
