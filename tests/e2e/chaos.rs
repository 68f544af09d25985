//! The fault suite (issue "one live run per task"): a real fleet (Hub, Nests, instances, the
//! fake model, a counting tool server) hit with kill -9 of the Hub right after a dispatch,
//! kills of instances mid-call, kill -9 and SIGSTOP of Nests. Every test ends with counts:
//! tasks acknowledged, terminal, lost, stuck, and side effects executed 0, 1, 2+ times (from
//! `tests/peers/servers/charge_server.py`, one fsynced line per real execution); the counts
//! that must be zero are asserted. Loops are bounded in count and time (CI runs this file in a
//! few minutes; `tests/soak/chaos.sh` runs longer campaigns outside CI).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers};
use serde_json::{json, Value};

/// Hub kills per run of the dispatch-window test (`AGEN_CHAOS_HUB_KILLS` overrides).
const HUB_KILLS: usize = 12;

pub struct Fleet {
    pub _tmp: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub hub: HubProcess,
    pub nests: Vec<NestProcess>,
    _model: FakeModel,
    /// The charge server's execution log.
    pub log: PathBuf,
}

/// A Hub (nest ttl 3 s), one Nest per name, the fake model (charge, then reply), and
/// deployment `charge` with `replicas` instances running `concurrency` tasks each, all healthy.
/// Each charge takes `seconds`; the model's answer after it takes `reply_delay_ms`.
pub fn fleet(
    nests: &[&str],
    replicas: u32,
    concurrency: u32,
    seconds: f64,
    reply_delay_ms: u64,
) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let mut f = fleet_in(dir, nests, replicas, concurrency, seconds, reply_delay_ms);
    f._tmp = Some(tmp);
    f
}

/// [`fleet`] in `root` (the Hub's data dir is `root/hub`).
pub fn fleet_in(
    root: PathBuf,
    nests: &[&str],
    replicas: u32,
    concurrency: u32,
    seconds: f64,
    reply_delay_ms: u64,
) -> Fleet {
    let hub = HubProcess::start(&root).unwrap();
    fleet_on(
        hub,
        root,
        nests,
        replicas,
        concurrency,
        seconds,
        reply_delay_ms,
    )
}

/// [`fleet_in`] around a Hub already started in `root`.
pub fn fleet_on(
    hub: HubProcess,
    root: PathBuf,
    nests: &[&str],
    replicas: u32,
    concurrency: u32,
    seconds: f64,
    reply_delay_ms: u64,
) -> Fleet {
    fleet_on_with(
        hub,
        root,
        nests,
        &[],
        replicas,
        concurrency,
        seconds,
        reply_delay_ms,
    )
}

/// [`fleet_on`] with more `agen nest` flags for every Nest (e.g. `--nest-lease 3s`).
#[allow(clippy::too_many_arguments)]
pub fn fleet_on_with(
    hub: HubProcess,
    root: PathBuf,
    nests: &[&str],
    nest_flags: &[&str],
    replicas: u32,
    concurrency: u32,
    seconds: f64,
    reply_delay_ms: u64,
) -> Fleet {
    fleet_on_with_config(
        hub,
        root,
        nests,
        nest_flags,
        replicas,
        concurrency,
        seconds,
        reply_delay_ms,
        None,
    )
}

/// [`fleet_on_with`] with the bundle's `x-agen/config.json` (e.g. a per-tool timeout).
#[allow(clippy::too_many_arguments)]
pub fn fleet_on_with_config(
    hub: HubProcess,
    root: PathBuf,
    nests: &[&str],
    nest_flags: &[&str],
    replicas: u32,
    concurrency: u32,
    seconds: f64,
    reply_delay_ms: u64,
    config: Option<Value>,
) -> Fleet {
    let flags: Vec<&str> = ["--run-as-self"]
        .into_iter()
        .chain(nest_flags.iter().copied())
        .collect();
    let nest_procs: Vec<NestProcess> = nests
        .iter()
        .map(|n| hub.nest_with(n, &[], &[], &flags).unwrap())
        .collect();
    let script = json!({"record": root.join("model-requests.jsonl"), "steps": [
        {"tool_calls": [{"name": "pay_charge", "arguments": {"amount": 5, "seconds": seconds}}]},
        {"reply_template": "paid: {{last_tool_result}}", "delay_ms": reply_delay_ms}
    ]});
    let model = FakeModel::start(&root.join("model"), &script).unwrap();
    let log = root.join("charges.jsonl");
    let dir = root.join("bundle");
    if let Some(config) = config {
        write_bundle(&dir, &[("x-agen/config.json", config.to_string())]).unwrap();
    }
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "pay",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/charge_server.py")], "env": {"CHARGE_LOG": log}}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "charge",
            "--replicas",
            &replicas.to_string(),
            "--concurrency",
            &concurrency.to_string(),
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("every replica healthy", Duration::from_secs(90), |l| {
        l.iter()
            .filter(|i| i["state"] == "running" && i["healthy"] == true)
            .count()
            == replicas as usize
    })
    .unwrap();
    Fleet {
        _tmp: None,
        root,
        hub,
        nests: nest_procs,
        _model: model,
        log,
    }
}

/// What a fault campaign ended with.
#[derive(Debug, Default, PartialEq)]
pub struct Counts {
    pub acknowledged: usize,
    pub terminal: usize,
    pub succeeded: usize,
    /// Acknowledged by `SubmitTask` but unknown to the Hub afterwards.
    pub lost: usize,
    /// Not terminal when the deadline passed.
    pub stuck: usize,
    pub charged_0: usize,
    pub charged_1: usize,
    pub charged_2_or_more: usize,
}

impl Fleet {
    pub fn submit(&self, input: &str) -> String {
        let out = self.hub.cli(&["submit", "charge", input]).unwrap();
        assert!(
            out.status.success(),
            "submit: {}\nhub log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.hub.proc.log_text()
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    pub fn query(&self, task: &str) -> Option<Value> {
        self.hub.cli_json(&["query", task, "-o", "json"]).ok()
    }

    /// Real executions of each task's charge.
    pub fn charges(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for line in std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
        {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                *out.entry(v["task"].as_str().unwrap_or_default().to_owned())
                    .or_default() += 1;
            }
        }
        out
    }

    /// Waits (up to `timeout`) until every task is terminal, then counts.
    pub fn settle(&self, tasks: &[String], timeout: Duration) -> Counts {
        let deadline = Instant::now() + timeout;
        let mut states: BTreeMap<String, Option<String>> = BTreeMap::new();
        loop {
            for t in tasks {
                let state = self
                    .query(t)
                    .and_then(|v| v["state"].as_str().map(str::to_owned));
                states.insert(t.clone(), state);
            }
            let done = states.values().all(|s| {
                s.as_deref()
                    .is_some_and(|s| matches!(s, "succeeded" | "failed" | "cancelled"))
            });
            if done || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let charges = self.charges();
        let mut c = Counts {
            acknowledged: tasks.len(),
            ..Counts::default()
        };
        for t in tasks {
            match states.get(t).and_then(|s| s.as_deref()) {
                None => c.lost += 1,
                Some("succeeded") => {
                    c.terminal += 1;
                    c.succeeded += 1
                }
                Some("failed" | "cancelled") => c.terminal += 1,
                Some(_) => c.stuck += 1,
            }
            match charges.get(t).copied().unwrap_or(0) {
                0 => c.charged_0 += 1,
                1 => c.charged_1 += 1,
                _ => c.charged_2_or_more += 1,
            }
        }
        eprintln!("fault campaign counts: {c:?}");
        c
    }

    /// Kills the Hub (SIGKILL) and starts it again on the same port and data dir.
    pub fn restart_hub(&mut self) {
        self.hub.proc.kill9();
        self.hub = HubProcess::start_on(&self.hub.dir, self.hub.port, &self.hub.nest_ttl.clone())
            .unwrap_or_else(|e| panic!("hub restart: {e:#}"));
    }

    /// How many requests the fake model received.
    pub fn model_requests(&self) -> usize {
        std::fs::read_to_string(self.root.join("model-requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    pub fn hub_log(&self) -> String {
        self.hub.proc.log_text()
    }
}

/// Asserts the counts that must be zero, with the logs when they are not.
pub fn assert_safe(f: &Fleet, c: &Counts) {
    let context = || {
        format!(
            "{c:?}\ncharges: {:?}\nhub log (tail):\n{}",
            f.charges(),
            tail(&f.hub_log(), 60)
        )
    };
    assert_eq!(c.charged_2_or_more, 0, "a charge ran twice: {}", context());
    assert_eq!(c.lost, 0, "an acknowledged task was lost: {}", context());
    assert_eq!(c.stuck, 0, "a task is stuck: {}", context());
}

pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A delay of 0–2 ms that differs from call to call (the dispatch window).
fn aim() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    Duration::from_micros(u64::from(nanos % 2_000))
}

/// A gRPC `SubmitTask` straight from the test (no CLI process in between), so that the Hub
/// can be killed within the dispatch window after the answer arrives.
pub(crate) struct Submitter {
    pub(crate) rt: tokio::runtime::Runtime,
}

pub(crate) type Api =
    agen_proto::v1::agen_service_client::AgenServiceClient<tonic::transport::Channel>;

impl Submitter {
    pub(crate) fn new() -> Submitter {
        agen_shared::tls::install_crypto_provider();
        Submitter {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// A connected client of `hub` with its admin token.
    pub(crate) fn connect(&self, hub: &HubProcess) -> (Api, String) {
        let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
        let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        let channel = self.rt.block_on(async {
            tonic::transport::Endpoint::from_shared(hub.url())
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .unwrap()
        });
        (Api::new(channel), format!("Bearer {}", token.trim()))
    }

    /// Submits and returns the task id once the Hub answered.
    pub(crate) fn submit(&self, api: &mut Api, bearer: &str, input: &str) -> String {
        let mut req = tonic::Request::new(agen_proto::v1::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "charge".into(),
            input: input.into(),
            ..Default::default()
        });
        req.metadata_mut()
            .insert("authorization", bearer.parse().unwrap());
        self.rt
            .block_on(api.submit_task(req))
            .unwrap()
            .into_inner()
            .task_id
    }
}

fn hub_kills() -> usize {
    std::env::var("AGEN_CHAOS_HUB_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(HUB_KILLS)
}

#[test]
fn a_hub_killed_right_after_dispatch_never_runs_a_charge_twice() {
    let mut f = fleet(&["nest-a", "nest-b"], 2, 4, 0.2, 0);
    let submitter = Submitter::new();
    let mut tasks = Vec::new();
    for i in 0..hub_kills() {
        let (mut api, bearer) = submitter.connect(&f.hub);
        tasks.push(submitter.submit(&mut api, &bearer, &format!("charge customer {i}")));
        std::thread::sleep(aim());
        f.restart_hub();
    }
    let c = f.settle(&tasks, Duration::from_secs(120));
    assert_safe(&f, &c);
    assert_eq!(c.terminal, c.acknowledged, "{c:?}");
}

/// The `agen instance` processes of a Nest.
fn instance_pids(nest: &NestProcess) -> Vec<u32> {
    nest.descendants()
        .into_iter()
        .filter(|pid| {
            // `agen instance` (no arguments: its identity comes on an inherited fd).
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').nth(1) == Some("instance")
        })
        .collect()
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Waits until the charge server has logged `n` executions in all.
pub(crate) fn wait_charges(f: &Fleet, n: usize) {
    wait_for(&format!("{n} charge(s)"), Duration::from_secs(60), || {
        (f.charges().values().sum::<usize>() >= n).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", tail(&f.hub_log(), 60)));
}

#[test]
fn a_task_survives_two_instance_crashes_and_retries_go_to_the_other_instance() {
    // The first crash is in the middle of the charge, the second while the model answers.
    let f = fleet(&["nest-a", "nest-b"], 2, 1, 30.0, 15_000);
    let task = f.submit("charge the customer");
    wait_charges(&f, 1);
    for crash in 1..=2u64 {
        let t = f.query(&task).unwrap();
        let nest = t["nest"].as_str().unwrap().to_owned();
        let n = f.nests.iter().find(|n| n.name == nest).unwrap();
        let pids = instance_pids(n);
        assert_eq!(pids.len(), 1, "one instance on {nest}: {pids:?}");
        kill9(pids[0]);
        // The next attempt goes to the other instance, which is healthy.
        wait_for("the next attempt", Duration::from_secs(30), || {
            let t = f.query(&task)?;
            (t["attempt"].as_u64() == Some(crash + 1) && t["state"] == "running").then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", tail(&f.hub_log(), 60)));
        let now_on = f.query(&task).unwrap()["nest"].as_str().unwrap().to_owned();
        assert_ne!(
            now_on, nest,
            "the retry avoided the instance that just failed"
        );
        // Wait until the new attempt is with the model before crashing it again.
        let asked = crash as usize + 1;
        wait_for("the model to be asked", Duration::from_secs(30), || {
            (f.model_requests() >= asked).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}; task: {:?}", f.query(&task)));
    }
    let c = f.settle(std::slice::from_ref(&task), Duration::from_secs(60));
    assert_safe(&f, &c);
    let t = f.query(&task).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["attempt"], 3, "{t}");
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(result.starts_with("paid: effect_unknown"), "{result}");
    assert_eq!(
        (c.charged_1, c.charged_2_or_more),
        (1, 0),
        "an interrupted charge is never sent again"
    );
}

/// How long after the kill the run continued on another Nest: until the Hub reports the
/// task's next attempt on a different Nest (polled through the CLI: ~0.1 s resolution).
pub fn failover_after_nest_kill(f: &mut Fleet, task: &str) -> Duration {
    let t = f.query(task).unwrap();
    let nest = t["nest"].as_str().unwrap().to_owned();
    let attempt = t["attempt"].as_u64().unwrap();
    let n = f.nests.iter_mut().find(|n| n.name == nest).unwrap();
    let killed_at = Instant::now();
    n.proc.kill9();
    wait_for(
        "the run to continue elsewhere",
        Duration::from_secs(30),
        || {
            let t = f.query(task)?;
            // The next attempt may finish before we look: its Nest is what counts.
            (t["attempt"].as_u64() == Some(attempt + 1) && t["nest"] != nest.as_str()).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", tail(&f.hub_log(), 60)));
    killed_at.elapsed()
}

#[test]
fn a_killed_nest_has_its_run_continue_on_another_within_seconds() {
    let mut f = fleet(&["nest-a", "nest-b"], 2, 1, 30.0, 0);
    let task = f.submit("charge the customer");
    wait_charges(&f, 1);
    let took = failover_after_nest_kill(&mut f, &task);
    eprintln!("failover after kill -9 of a nest: {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "the run continued elsewhere only after {took:?} (disconnect grace 3 s)"
    );
    let c = f.settle(std::slice::from_ref(&task), Duration::from_secs(60));
    assert_safe(&f, &c);
    assert_eq!(c.succeeded, 1, "{c:?}");
}

#[test]
fn a_paused_nest_loses_its_run_to_another_nest_without_a_second_charge() {
    let f = fleet(&["nest-a", "nest-b"], 2, 1, 6.0, 0);
    let task = f.submit("charge the customer");
    wait_charges(&f, 1);
    let t = f.query(&task).unwrap();
    let nest = t["nest"].as_str().unwrap().to_owned();
    let n = f.nests.iter().find(|n| n.name == nest).unwrap();
    let pid = nix::unistd::Pid::from_raw(n.proc.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Past the ttl (3 s + a heartbeat): the Hub loses it and resumes the run elsewhere; once
    // woken, the Nest reconnects and the Hub cancels its old attempt (which could start no
    // side effect meanwhile: no ack comes for it).
    let moved = wait_for(
        "the run to resume elsewhere",
        Duration::from_secs(30),
        || {
            let t = f.query(&task)?;
            (t["attempt"].as_u64() == Some(2) && t["nest"] != nest.as_str()).then_some(())
        },
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    moved.unwrap_or_else(|e| panic!("{e}; hub log:\n{}", tail(&f.hub_log(), 60)));
    let c = f.settle(std::slice::from_ref(&task), Duration::from_secs(60));
    assert_safe(&f, &c);
    assert_eq!(c.succeeded, 1, "{c:?}");
    assert_eq!(c.charged_1, 1, "the charge ran once: {c:?}");
}

/// A small tmpfs mounted for the test (root only), unmounted on drop.
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    pub(crate) fn mount(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

impl Submitter {
    /// The Hub's overall gRPC health (`""`): SERVING or not.
    pub(crate) fn serving(&self, hub: &HubProcess) -> Option<bool> {
        let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).ok()?;
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        self.rt.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(hub.url())
                .ok()?
                .tls_config(tls)
                .ok()?
                .connect()
                .await
                .ok()?;
            let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?
                .into_inner()
                .status;
            Some(status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
        })
    }

    pub(crate) fn try_submit(
        &self,
        api: &mut Api,
        bearer: &str,
        input: &str,
    ) -> Result<String, tonic::Status> {
        let mut req = tonic::Request::new(agen_proto::v1::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "charge".into(),
            input: input.into(),
            ..Default::default()
        });
        req.metadata_mut()
            .insert("authorization", bearer.parse().unwrap());
        self.rt
            .block_on(api.submit_task(req))
            .map(|r| r.into_inner().task_id)
    }
}

/// Fills the file system of `dir` with `file` until it is full.
pub(crate) fn fill(file: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(file).unwrap();
    let chunk = vec![0u8; 256 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

#[test]
fn a_full_disk_turns_the_hub_not_serving_and_it_heals_by_itself_without_losing_a_task() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let Some(_mount) = Tmpfs::mount(&tmp.path().join("fleet/hub"), "64m") else {
        panic!("cannot mount a tmpfs (root is needed)");
    };
    let f = fleet_in(tmp.path().join("fleet"), &["nest-a"], 1, 4, 0.1, 0);
    let s = Submitter::new();
    let (mut api, bearer) = s.connect(&f.hub);
    let mut acknowledged = vec![s.submit(&mut api, &bearer, "before the disk fills")];

    fill(&f.hub.dir.join("hub/filler"));
    // Writes fail with UNAVAILABLE naming the store error, and health says NOT_SERVING.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match s.try_submit(&mut api, &bearer, "while the disk is full") {
            Ok(id) => acknowledged.push(id),
            Err(status) => break status,
        }
        assert!(Instant::now() < deadline, "no write failed on a full disk");
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("hub store"),
        "{}",
        refused.message()
    );
    wait_for("health NOT_SERVING", Duration::from_secs(10), || {
        (s.serving(&f.hub) == Some(false)).then_some(())
    })
    .unwrap();

    // Space is back: serving again within 10 s, by itself, and it says so.
    std::fs::remove_file(f.hub.dir.join("hub/filler")).unwrap();
    let freed = Instant::now();
    wait_for("health SERVING again", Duration::from_secs(10), || {
        (s.serving(&f.hub) == Some(true)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", tail(&f.hub_log(), 40)));
    eprintln!("serving again {:?} after space was freed", freed.elapsed());
    assert!(f.hub_log().contains("hub store recovered"));
    acknowledged.push(s.submit(&mut api, &bearer, "after the disk was freed"));

    let c = f.settle(&acknowledged, Duration::from_secs(60));
    assert_safe(&f, &c);
    assert_eq!(c.terminal, c.acknowledged, "{c:?}");
}

/// Soak (outside CI, `tests/soak/chaos.sh`): kill -9 of the Nest running a task, again and
/// again (`AGEN_SOAK_NEST_KILLS`, default 10); prints the failover p50 and max, and asserts
/// the safety counts over every task.
#[test]
#[ignore = "soak: run by tests/soak/chaos.sh"]
fn soak_nest_kill_failover_p50() {
    let kills: usize = std::env::var("AGEN_SOAK_NEST_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut f = fleet(&["nest-a", "nest-b", "nest-c"], 2, 1, 30.0, 0);
    let mut took = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..kills {
        let task = f.submit(&format!("charge customer {i}"));
        wait_for("the charge", Duration::from_secs(60), || {
            f.charges().contains_key(&task).then_some(())
        })
        .unwrap();
        let nest = f.query(&task).unwrap()["nest"].as_str().unwrap().to_owned();
        took.push(failover_after_nest_kill(&mut f, &task));
        tasks.push(task);
        // The killed Nest comes back (empty); the fleet is whole again before the next kill.
        let idx = f.nests.iter().position(|n| n.name == nest).unwrap();
        f.nests[idx] = f.hub.nest(&nest, &[], &[]).unwrap();
        f.hub
            .wait_instances("two healthy replicas", Duration::from_secs(60), |l| {
                l.iter()
                    .filter(|i| i["state"] == "running" && i["healthy"] == true)
                    .count()
                    == 2
            })
            .unwrap();
        let c = f.settle(
            std::slice::from_ref(tasks.last().unwrap()),
            Duration::from_secs(60),
        );
        assert_safe(&f, &c);
    }
    took.sort();
    let p50 = took[took.len() / 2];
    let max = took.last().copied().unwrap_or_default();
    eprintln!(
        "SOAK nest kill -9 failover: n={} p50={:.2}s max={:.2}s",
        took.len(),
        p50.as_secs_f64(),
        max.as_secs_f64()
    );
    let c = f.settle(&tasks, Duration::from_secs(60));
    assert_safe(&f, &c);
}
