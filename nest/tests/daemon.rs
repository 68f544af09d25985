//! The Nest daemon against a real Hub (in-process, TLS, its real gRPC API): a Nest joins with
//! only the join token (it fetches and pins the Hub's CA), runs an instance whose tool server is
//! the real PyPI `mcp-server-time`, executes a task whose scripted fake model calls that tool,
//! keeps its instance across a Hub restart, and leaves no process behind when it stops.
//!
//! Needs the `agen` binary (`cargo build -p agen-cli`) and the test peers
//! (`tests/peers/install.sh`, i.e. `target/peers/venv` with `mcp-server-time`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agen_fake_model::{FakeModel, Script, Step};
use agen_hub::{HubHandle, HubOptions};
use agen_nest::config::NestOptions;
use agen_proto::v1 as pb;
use agen_proto::v1::agen_service_client::AgenServiceClient;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("nest/ has a parent")
        .to_path_buf()
}

fn agen_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug/agen");
    assert!(
        bin.exists(),
        "{} is missing; build it first with `cargo build -p agen-cli`",
        bin.display()
    );
    bin
}

fn peer_python() -> PathBuf {
    let py = repo_root().join("target/peers/venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing; install the test peers with tests/peers/install.sh",
        py.display()
    );
    py
}

/// A bundle whose one tool server is `mcp-server-time`; `model` points at the fake model.
fn write_bundle(dir: &Path, model_url: &str) {
    std::fs::create_dir_all(dir.join("x-agen")).expect("mkdir");
    let mcp = json!({"mcpServers": {"time": {"command": peer_python(), "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}}});
    std::fs::write(
        dir.join("mcp.json"),
        serde_json::to_vec_pretty(&mcp).expect("json"),
    )
    .expect("write mcp.json");
    std::fs::write(
        dir.join("x-agen/agent.md"),
        format!(
            "---\nname: clock\nmodel: openai/fake\nbaseUrl: {model_url}\n---\nYou tell the time.\n"
        ),
    )
    .expect("write agent.md");
}

type Client = AgenServiceClient<InterceptedService<Channel, Admin>>;

#[derive(Clone)]
struct Admin(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);
impl tonic::service::Interceptor for Admin {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

async fn client(hub: &HubHandle) -> Client {
    let ca = std::fs::read_to_string(&hub.ca_file).expect("hub CA");
    let channel = Endpoint::from_shared(hub.url.clone())
        .expect("url")
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
        .expect("tls")
        .connect_lazy();
    let bearer = format!("Bearer {}", hub.admin_token)
        .parse()
        .expect("header");
    AgenServiceClient::with_interceptor(channel, Admin(bearer))
}

async fn start_hub(
    data_dir: &Path,
    listen: std::net::SocketAddr,
) -> (HubHandle, CancellationToken) {
    // Both rustls providers are in the build graph; pick one for the process (as the CLI does).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stop = CancellationToken::new();
    let opts = HubOptions {
        data_dir: data_dir.to_path_buf(),
        listen,
        nest_ttl: Duration::from_secs(5),
        heartbeat_interval: Duration::from_millis(500),
        ..Default::default()
    };
    let hub = agen_hub::start(opts, stop.clone())
        .await
        .expect("hub starts");
    (hub, stop)
}

struct Nest {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), agen_nest::config::NestError>>,
}

fn start_nest(hub: &HubHandle, data_dir: &Path, name: &str) -> Nest {
    start_nest_with(hub, data_dir, name, |_| {})
}

fn start_nest_with(
    hub: &HubHandle,
    data_dir: &Path,
    name: &str,
    tweak: impl FnOnce(&mut NestOptions),
) -> Nest {
    let mut opts = NestOptions::new(hub.url.clone(), hub.join_token.clone());
    opts.data_dir = data_dir.to_path_buf();
    opts.name = name.to_string();
    opts.settings.set(agen_nest::config::NodeSettings {
        labels: [("zone".to_string(), "test".to_string())]
            .into_iter()
            .collect(),
        cordon: false,
    });
    opts.agen_bin = agen_bin();
    // The test's temp dirs are root's own: instances run as the test's user.
    opts.run_as = agen_nest::separation::RunAs::Myself;
    tweak(&mut opts);
    let stop = CancellationToken::new();
    let task = tokio::spawn(agen_nest::daemon::run(opts, stop.clone()));
    Nest { stop, task }
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn upload(c: &mut Client, dir: &Path) -> String {
    let bytes = agen_shared::bundle::pack(dir).expect("pack");
    let digest = agen_shared::bundle::digest(&bytes);
    let chunk = pb::BundleChunk {
        digest: digest.clone(),
        total_size: bytes.len() as u64,
        data: bytes,
    };
    c.upload_bundle(futures::stream::iter(vec![chunk]))
        .await
        .expect("upload");
    digest
}

async fn instances(c: &mut Client) -> Vec<pb::Instance> {
    c.list_instances(pb::ListInstancesRequest {
        namespace: "default".into(),
        ..Default::default()
    })
    .await
    .expect("list instances")
    .into_inner()
    .instances
}

async fn running_instance(c: &Client) -> pb::Instance {
    let c = c.clone();
    eventually(
        Duration::from_secs(60),
        "a running instance with tools",
        move || {
            let mut c = c.clone();
            async move {
                let list = instances(&mut c).await;
                list.into_iter().find(|i| {
                    i.state == pb::InstanceState::Running as i32 && i.healthy && i.tools_loaded > 0
                })
            }
        },
    )
    .await
}

/// The process groups the Nest recorded in `children.json`, by key (`<instance>` for an
/// instance, `<instance>/<server>` for one of its tool servers).
fn recorded_pgids(nest_dir: &Path) -> std::collections::BTreeMap<String, u32> {
    let text = std::fs::read_to_string(nest_dir.join("children.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["children"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, c)| Some((k.clone(), c["pgid"].as_u64()? as u32)))
                .collect()
        })
        .unwrap_or_default()
}

fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z"),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nest_runs_an_instance_with_real_tools_executes_a_task_and_survives_a_hub_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = FakeModel::start(
        Script::steps(vec![
            Step::call("time_get_current_time", json!({"timezone": "UTC"})),
            Step::template("The tool said: {{last_tool_result}}"),
        ]),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    .expect("fake model");
    let bundle = tmp.path().join("bundle");
    write_bundle(&bundle, &model.openai_base_url());

    let (hub, hub_stop) = start_hub(
        &tmp.path().join("hub"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await;
    let hub_addr = hub.addr;
    assert!(
        hub.url.starts_with("https://"),
        "the hub serves TLS: {}",
        hub.url
    );
    let mut c = client(&hub).await;
    let nest_dir = tmp.path().join("nest");
    let nest = start_nest(&hub, &nest_dir, "nest-a");

    // The Nest registers: ready, with its name and labels.
    let lc = c.clone();
    let registered = eventually(Duration::from_secs(30), "nest-a to be ready", move || {
        let mut c = lc.clone();
        async move {
            let nests = c
                .list_nests(pb::ListNestsRequest::default())
                .await
                .ok()?
                .into_inner()
                .nests;
            nests
                .into_iter()
                .find(|n| n.name == "nest-a" && n.state == pb::NestState::Ready as i32)
        }
    })
    .await;
    assert_eq!(
        registered.labels.get("zone").map(String::as_str),
        Some("test")
    );
    assert_eq!(registered.capacity, 32);
    assert!(
        nest_dir.join("hub-ca.pem").exists(),
        "the pinned hub CA is kept in the nest data dir"
    );

    // Deploy: the instance comes up with the time server's tools.
    let digest = upload(&mut c, &bundle).await;
    c.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "clock".into(),
        bundle_digest: digest.clone(),
        replicas: 1,
        ..Default::default()
    })
    .await
    .expect("create deployment");
    let inst = running_instance(&c).await;
    assert_eq!(inst.nest_name, "nest-a");
    assert!(
        inst.tools.iter().any(|t| t == "time.get_current_time"),
        "tools: {:?}",
        inst.tools
    );
    assert!(inst.servers_not_connected.is_empty());
    let hex = digest.trim_start_matches("sha256:");
    assert!(
        nest_dir.join("bundles").join(hex).join("mcp.json").exists(),
        "bundle cached by digest"
    );

    // A task: the scripted model calls the real tool, then answers with its result.
    let task = c
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "clock".into(),
            input: "what time is it?".into(),
            client_request_id: "req-1".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let tc = c.clone();
    let task_id = task.task_id.clone();
    let done = eventually(Duration::from_secs(60), "the task to finish", move || {
        let (mut c, id) = (tc.clone(), task_id.clone());
        async move {
            let t = c
                .get_task(pb::GetTaskRequest {
                    namespace: "default".into(),
                    task_id: id,
                })
                .await
                .ok()?
                .into_inner();
            (t.state >= pb::TaskState::Succeeded as i32).then_some(t)
        }
    })
    .await;
    let outcome = done
        .outcome
        .clone()
        .expect("a finished task has an outcome");
    assert_eq!(
        done.state,
        pb::TaskState::Succeeded as i32,
        "outcome: {outcome:?}"
    );
    assert!(
        outcome.result.starts_with("The tool said: "),
        "{}",
        outcome.result
    );
    assert!(
        outcome.result.contains("\"timezone\""),
        "the answer carries the tool output: {}",
        outcome.result
    );

    // Restart the Hub on the same address: the Nest reconnects, its instance is re-adopted.
    hub.stop().await.expect("hub stops");
    drop(hub_stop);
    let (hub, _hub_stop2) = start_hub(&tmp.path().join("hub"), hub_addr).await;
    let c = client(&hub).await;
    let lc = c.clone();
    let inst_id = inst.instance_id.clone();
    let again = eventually(
        Duration::from_secs(30),
        "the same instance after the hub restart",
        move || {
            let (mut c, id) = (lc.clone(), inst_id.clone());
            async move {
                let list = instances(&mut c).await;
                let nest_ok = c
                    .list_nests(pb::ListNestsRequest::default())
                    .await
                    .ok()?
                    .into_inner()
                    .nests
                    .iter()
                    .any(|n| n.name == "nest-a" && n.state == pb::NestState::Ready as i32);
                (nest_ok
                    && list.iter().any(|i| {
                        i.instance_id == id && i.state == pb::InstanceState::Running as i32
                    }))
                .then_some(list)
            }
        },
    )
    .await;
    assert_eq!(again.len(), 1, "no instance is duplicated: {again:?}");

    // Stop the Nest: its instance process is gone.
    let pgids = recorded_pgids(&nest_dir);
    let keys: Vec<&String> = pgids.keys().collect();
    let time_key = format!("{}/time", inst.instance_id);
    assert_eq!(
        keys,
        vec![&inst.instance_id, &time_key],
        "the instance and its tool server are recorded"
    );
    assert!(pgids.values().all(|p| process_alive(*p)));
    nest.stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), nest.task)
        .await
        .expect("the nest stops within its grace")
        .expect("join")
        .expect("clean exit");
    assert!(
        recorded_pgids(&nest_dir).is_empty(),
        "every child was removed from the registry"
    );
    for (what, pid) in &pgids {
        assert!(!process_alive(*pid), "{what} (pid {pid}) is gone");
    }
    drop(model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nest_does_not_trust_a_hub_whose_ca_is_not_the_one_its_join_token_names() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (hub, _stop) = start_hub(
        &tmp.path().join("hub"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await;
    let secret = hub
        .join_token
        .rsplit('.')
        .next()
        .expect("token has a secret")
        .to_string();
    let mut opts = NestOptions::new(
        hub.url.clone(),
        format!("agen1.{}.{secret}", "0".repeat(64)),
    );
    opts.data_dir = tmp.path().join("nest");
    std::fs::create_dir_all(&opts.data_dir).expect("mkdir");
    let err = match agen_nest::hub_client::client(&opts).await {
        Ok(_) => panic!("a hub presenting another CA must not be trusted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.starts_with(&format!("cannot trust the hub at {}", hub.url)),
        "{err}"
    );
    assert!(
        err.contains("did not present the CA named by the join token"),
        "{err}"
    );
    assert!(
        !opts.ca_file().exists(),
        "nothing is stored from an untrusted hub"
    );
}

/// Batching is for events nobody waits for. With a batching window far longer than the test,
/// a task whose side-effecting calls each wait for a durable "started" still finishes at once:
/// a waited-for event ends the window, and the link reads the Hub's acks while a window runs
/// (it used to wait out a window inside its loop with the Hub's acks unread, ~4 ms of every
/// side-effecting call at the default window).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waited_for_events_and_their_acks_never_wait_for_the_batching_window() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let files = ["one.txt", "two.txt", "three.txt"];
    let mut steps: Vec<Step> = files
        .iter()
        .map(|f| Step::call("ws_write", json!({"path": f, "content": format!("{f}\n")})))
        .collect();
    steps.push(Step::reply("written"));
    let model = FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("fake model");
    let workspace = tmp.path().join("ws");
    std::fs::create_dir_all(&workspace).expect("mkdir ws");
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir_all(bundle.join("x-agen")).expect("mkdir");
    let mcp = json!({"mcpServers": {"ws": {"command": agen_bin(), "args": ["mcp", "workspace", "--root", workspace, "--no-run"]}}});
    std::fs::write(bundle.join("mcp.json"), mcp.to_string()).expect("write mcp.json");
    std::fs::write(
        bundle.join("x-agen/agent.md"),
        format!(
            "---\nname: writer\nmodel: openai/fake\nbaseUrl: {}\n---\nYou write files.\n",
            model.openai_base_url()
        ),
    )
    .expect("write agent.md");

    let (hub, _hub_stop) = start_hub(
        &tmp.path().join("hub"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await;
    let mut c = client(&hub).await;
    let _nest = start_nest_with(&hub, &tmp.path().join("nest"), "nest-w", |o| {
        o.event_batch_window = Duration::from_secs(600);
    });
    let digest = upload(&mut c, &bundle).await;
    c.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "writer".into(),
        bundle_digest: digest,
        replicas: 1,
        ..Default::default()
    })
    .await
    .expect("create deployment");
    running_instance(&c).await;

    let task = c
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "writer".into(),
            input: "write three files".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let tc = c.clone();
    let task_id = task.task_id.clone();
    let done = eventually(
        Duration::from_secs(60),
        "the task to finish (a 600 s batching window must not delay it)",
        move || {
            let (mut c, id) = (tc.clone(), task_id.clone());
            async move {
                let t = c
                    .get_task(pb::GetTaskRequest {
                        namespace: "default".into(),
                        task_id: id,
                    })
                    .await
                    .ok()?
                    .into_inner();
                (t.state >= pb::TaskState::Succeeded as i32).then_some(t)
            }
        },
    )
    .await;
    assert_eq!(
        done.state,
        pb::TaskState::Succeeded as i32,
        "outcome: {:?}",
        done.outcome
    );
    let written: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| std::fs::read_to_string(workspace.join(f)).is_ok_and(|t| t == format!("{f}\n")))
        .collect();
    assert_eq!(written, files, "every side-effecting call ran once");
}
