//! Test harness for the Hub's wire protocol: an in-process Hub on 127.0.0.1:0 with TLS,
//! authenticated clients built from the generated code (Nest clients with a certificate from
//! `Join`, or without one), a hand-driven fake Nest stream, and
//! polling helpers with deadlines (never fixed sleeps to wait for readiness).

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_hub::{HubHandle, HubOptions};
use agen_proto::v1 as pb;
use agen_proto::v1::agen_service_client::AgenServiceClient;
use agen_proto::v1::nest_service_client::NestServiceClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A Hub running in this process.
pub struct TestHub {
    pub handle: Option<HubHandle>,
    pub shutdown: CancellationToken,
    pub data_dir: PathBuf,
    pub url: String,
    pub ca_file: PathBuf,
    pub admin_token: String,
    pub join_token: String,
}

pub fn options(data_dir: &Path, ttl: Duration) -> HubOptions {
    HubOptions {
        data_dir: data_dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("literal address"),
        insecure_plaintext: false,
        nest_ttl: ttl,
        heartbeat_interval: Duration::from_millis(200),
        tls_names: Vec::new(),
        ..HubOptions::default()
    }
}

impl TestHub {
    pub async fn start(data_dir: &Path, ttl: Duration) -> TestHub {
        Self::start_with(options(data_dir, ttl)).await
    }

    pub async fn start_with(opts: HubOptions) -> TestHub {
        let shutdown = CancellationToken::new();
        let data_dir = opts.data_dir.clone();
        let handle = agen_hub::start(opts, shutdown.clone())
            .await
            .expect("hub starts");
        TestHub {
            url: handle.url.clone(),
            ca_file: handle.ca_file.clone(),
            admin_token: handle.admin_token.clone(),
            join_token: handle.join_token.clone(),
            handle: Some(handle),
            shutdown,
            data_dir,
        }
    }

    /// Stops the Hub gracefully and waits for it.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(20), h.wait())
                .await
                .expect("hub stops within 20s")
                .expect("hub stops cleanly");
        }
    }

    pub async fn channel(&self) -> Channel {
        self.channel_with(None).await
    }

    /// A channel presenting `identity` as the client certificate (none when `None`).
    pub async fn channel_with(&self, identity: Option<Identity>) -> Channel {
        let ca = std::fs::read_to_string(&self.ca_file).expect("ca file");
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost");
        if let Some(identity) = identity {
            tls = tls.identity(identity);
        }
        Endpoint::from_shared(self.url.clone())
            .expect("hub url")
            .tls_config(tls)
            .expect("tls config")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connects to the hub")
    }

    pub async fn client(&self) -> Api {
        AgenServiceClient::with_interceptor(self.channel().await, Bearer::new(&self.admin_token))
    }

    /// A Nest client with the join token but no client certificate (only `Join` works).
    pub async fn nest_client(&self) -> NestApi {
        NestServiceClient::with_interceptor(self.channel().await, Bearer::new(&self.join_token))
    }

    /// Joins as `nest_id`: returns the issued certificate and its key (PEM). A Nest keeps its
    /// key across reconnects and Hub restarts (the Hub binds an id to the key it first joined
    /// with), so one test process uses one key per nest id.
    pub async fn join(&self, nest_id: &str) -> (String, String) {
        static KEYS: std::sync::Mutex<Option<std::collections::HashMap<String, String>>> =
            std::sync::Mutex::new(None);
        let key = KEYS
            .lock()
            .expect("the key table is never poisoned: nothing panics while holding it")
            .get_or_insert_with(Default::default)
            .entry(nest_id.to_string())
            .or_insert_with(|| {
                agen_shared::tls::nest_key_and_csr(nest_id)
                    .expect("key and csr")
                    .0
            })
            .clone();
        let csr_pem = agen_shared::tls::nest_csr_for_key(&key, nest_id).expect("csr");
        let response = self
            .nest_client()
            .await
            .join(pb::JoinRequest {
                nest_id: nest_id.into(),
                name: format!("{nest_id}-name"),
                csr_pem,
            })
            .await
            .expect("join")
            .into_inner();
        (response.cert_pem, key)
    }

    /// A Nest client presenting a certificate issued to `nest_id` by `Join`.
    pub async fn nest_client_as(&self, nest_id: &str) -> NestApi {
        let (cert, key) = self.join(nest_id).await;
        let channel = self.channel_with(Some(Identity::from_pem(cert, key))).await;
        NestServiceClient::with_interceptor(channel, Bearer::new(&self.join_token))
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(MetadataValue<tonic::metadata::Ascii>);

impl Bearer {
    pub fn new(token: &str) -> Bearer {
        Bearer(format!("Bearer {token}").parse().expect("ascii token"))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

pub type Api = AgenServiceClient<InterceptedService<Channel, Bearer>>;
pub type NestApi = NestServiceClient<InterceptedService<Channel, Bearer>>;

/// A minimal valid bundle folder.
pub fn write_bundle(dir: &Path, prompt: &str) {
    std::fs::create_dir_all(dir.join("x-agen")).expect("mkdir");
    std::fs::write(
        dir.join("x-agen/agent.md"),
        format!("---\nname: hello\nmodel: openai/gpt-4.1-mini\n---\n{prompt}\n"),
    )
    .expect("write agent.md");
}

/// Uploads the bundle in `dir` in small chunks; returns its digest.
pub async fn upload(api: &mut Api, dir: &Path) -> Result<pb::UploadBundleResponse, tonic::Status> {
    let bytes = agen_shared::bundle::pack(dir).expect("pack bundle");
    upload_bytes(api, &bytes).await
}

pub async fn upload_bytes(
    api: &mut Api,
    bytes: &[u8],
) -> Result<pb::UploadBundleResponse, tonic::Status> {
    let digest = agen_shared::bundle::digest(bytes);
    let mut chunks: Vec<pb::BundleChunk> = bytes
        .chunks(64)
        .map(|c| pb::BundleChunk {
            digest: String::new(),
            total_size: 0,
            data: c.to_vec(),
        })
        .collect();
    chunks[0].digest = digest;
    chunks[0].total_size = bytes.len() as u64;
    api.upload_bundle(futures::stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

/// Uploads a bundle and creates (or updates) a deployment of it.
pub async fn deploy(api: &mut Api, bundle_dir: &Path, name: &str, replicas: u32) -> pb::Deployment {
    let up = upload(api, bundle_dir).await.expect("upload");
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: name.into(),
        bundle_digest: up.digest,
        replicas,
        selector: Default::default(),
        concurrency: 0,
        ..Default::default()
    })
    .await
    .expect("create deployment")
    .into_inner()
}

/// A Nest driven by hand over the real `Connect` stream.
pub struct FakeNest {
    pub nest_id: String,
    pub name: String,
    pub tx: mpsc::Sender<pb::NestMessage>,
    pub rx: tonic::Streaming<pb::HubMessage>,
    /// Instances this fake runs (reported in heartbeats).
    pub running: Arc<Mutex<Vec<pb::InstanceReport>>>,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Drop for FakeNest {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

pub fn msg(m: pb::nest_message::Msg) -> pb::NestMessage {
    pb::NestMessage { msg: Some(m) }
}

impl FakeNest {
    /// Connects and registers; returns the Nest and the `Registered` answer.
    pub async fn connect(
        hub: &TestHub,
        nest_id: &str,
        labels: &[(&str, &str)],
        running: Vec<pb::InstanceReport>,
    ) -> (FakeNest, pb::Registered) {
        let mut client = hub.nest_client_as(nest_id).await;
        let (tx, rx) = mpsc::channel(64);
        tx.send(msg(pb::nest_message::Msg::Register(pb::Register {
            nest_id: nest_id.into(),
            name: format!("{nest_id}-name"),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            capacity: 0,
            version: "test".into(),
            instances: running.clone(),
            fallback_name: String::new(),
            separation: String::new(),
            network: String::new(),
            protocol_version: agen_shared::version::Protocol::CURRENT.to_string(),
            commit: String::new(),
            cpu_millis: 0,
            memory_bytes: 0,
            resources: String::new(),
        })))
        .await
        .expect("queue register");
        let response = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("connect stream")
            .into_inner();
        let running = Arc::new(Mutex::new(running));
        let heartbeats = {
            let (tx, running) = (tx.clone(), running.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let instances = running.lock().map(|r| r.clone()).unwrap_or_default();
                    let hb = msg(pb::nest_message::Msg::Heartbeat(pb::Heartbeat {
                        at_ms: 0,
                        instances,
                    }));
                    if tx.send(hb).await.is_err() {
                        return;
                    }
                }
            })
        };
        let mut nest = FakeNest {
            nest_id: nest_id.into(),
            name: format!("{nest_id}-name"),
            tx,
            rx: response,
            running,
            heartbeats,
        };
        let registered = match nest.next().await {
            pb::hub_message::Msg::Registered(r) => r,
            other => panic!("expected Registered first, got {other:?}"),
        };
        (nest, registered)
    }

    /// The next Hub message (10 s deadline), skipping pings. A run assignment is remembered
    /// in the heartbeats (`run_attempts` of its instance), as a real Nest reports it, until
    /// the test sends its `run.finished` or `run.interrupted`.
    pub async fn next(&mut self) -> pb::hub_message::Msg {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
                .await
                .expect("a message from the hub within 10s")
                .expect("hub stream healthy")
                .expect("hub stream open");
            let m = m.msg.expect("message has a body");
            match &m {
                pb::hub_message::Msg::Ping(_) => continue,
                pb::hub_message::Msg::AssignRun(a) => {
                    if let Ok(mut running) = self.running.lock() {
                        for r in running.iter_mut() {
                            r.run_attempts.retain(|x| x.run_id != a.run_id);
                            if r.instance_id == a.instance_id {
                                r.run_attempts.push(pb::ActiveRun {
                                    run_id: a.run_id.clone(),
                                    attempt: a.attempt,
                                });
                            }
                        }
                    }
                }
                _ => {}
            }
            return m;
        }
    }

    /// Stops heartbeating (as a frozen or dead Nest would).
    pub fn go_silent(&self) {
        self.heartbeats.abort();
    }

    /// The next run assignment, skipping other messages.
    pub async fn next_assign(&mut self) -> pb::AssignRun {
        self.next_matching(|m| match m {
            pb::hub_message::Msg::AssignRun(r) => Some(r),
            _ => None,
        })
        .await
    }

    /// The next message matching `pick`, skipping others.
    pub async fn next_matching<T>(
        &mut self,
        mut pick: impl FnMut(pb::hub_message::Msg) -> Option<T>,
    ) -> T {
        loop {
            if let Some(t) = pick(self.next().await) {
                return t;
            }
        }
    }

    /// Reports an instance as running and healthy (and remembers it).
    pub async fn report_running(&mut self, place: &pb::PlaceInstance) {
        let report = pb::InstanceReport {
            instance_id: place.instance_id.clone(),
            namespace: place.namespace.clone(),
            deployment: place.deployment.clone(),
            bundle_digest: place.bundle_digest.clone(),
            generation: place.generation,
            state: pb::InstanceState::Running as i32,
            healthy: true,
            tools_loaded: 2,
            servers_not_connected: vec![],
            message: String::new(),
            restarts: 0,
            pid: 42,
            active_runs: vec![],
            tools: vec!["time.get_current_time".into(), "time.convert_time".into()],
            resources: vec![],
            run_attempts: vec![],
            usage: None,
            servers_usage: vec![],
            oom_kills: 0,
        };
        if let Ok(mut running) = self.running.lock() {
            running.retain(|r| r.instance_id != report.instance_id);
            running.push(report.clone());
        }
        self.send(pb::nest_message::Msg::Instance(report)).await;
    }

    pub async fn send(&self, m: pb::nest_message::Msg) {
        if let pb::nest_message::Msg::RunEvents(batch) = &m {
            for e in &batch.events {
                if e.kind == "run.finished" || e.kind == "run.interrupted" {
                    if let Ok(mut running) = self.running.lock() {
                        for r in running.iter_mut() {
                            r.run_attempts.retain(|x| x.run_id != e.run_id);
                        }
                    }
                }
            }
        }
        self.tx.send(msg(m)).await.expect("nest stream open");
    }

    /// Waits for a PlaceInstance and reports it running.
    pub async fn accept_placement(&mut self) -> pb::PlaceInstance {
        let place = self
            .next_matching(|m| match m {
                pb::hub_message::Msg::Place(p) => Some(p),
                _ => None,
            })
            .await;
        self.report_running(&place).await;
        place
    }
}

/// Polls `f` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn instances(api: &mut Api, deployment: &str) -> Vec<pb::Instance> {
    api.list_instances(pb::ListInstancesRequest {
        namespace: "default".into(),
        deployment: deployment.into(),
        all_namespaces: false,
        include_ended: false,
    })
    .await
    .expect("list instances")
    .into_inner()
    .instances
}

pub fn state(i: &pb::Instance) -> pb::InstanceState {
    pb::InstanceState::try_from(i.state).unwrap_or(pb::InstanceState::Unspecified)
}

pub fn task_state(t: &pb::Task) -> pb::TaskState {
    pb::TaskState::try_from(t.state).unwrap_or(pb::TaskState::Unspecified)
}

/// A run event of `run` as a Nest relays it (the Hub acks every event alike; `sync` is the
/// instance's business).
pub fn event(run: &pb::AssignRun, seq: u64, kind: &str, json: serde_json::Value) -> pb::RunEvent {
    pb::RunEvent {
        run_id: run.run_id.clone(),
        attempt: run.attempt,
        seq,
        task_id: run.task_id.clone(),
        at_ms: 1_000 + seq as i64,
        kind: kind.into(),
        json: json.to_string(),
        sync: false,
    }
}

/// Sends `events` from `instance_id` on `nest`'s stream and returns the Hub's ack.
pub async fn send_events(
    nest: &mut FakeNest,
    instance_id: &str,
    events: Vec<pb::RunEvent>,
) -> pb::RunEventsAck {
    nest.send(pb::nest_message::Msg::RunEvents(pb::RunEvents {
        instance_id: instance_id.into(),
        events,
    }))
    .await;
    nest.next_matching(|m| match m {
        pb::hub_message::Msg::Ack(a) => Some(a),
        _ => None,
    })
    .await
}

/// A Hub with one fake Nest connected and a deployment `hello` (one replica) placed on it.
pub async fn fleet_with_one_instance(
    dir: &std::path::Path,
    concurrency: u32,
) -> (TestHub, Api, FakeNest, pb::PlaceInstance) {
    let hub = TestHub::start(&dir.join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let bundle = dir.join("hello");
    write_bundle(&bundle, "hi");
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    let up = upload(&mut api, &bundle).await.expect("upload");
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "hello".into(),
        bundle_digest: up.digest,
        replicas: 1,
        selector: Default::default(),
        concurrency,
        ..Default::default()
    })
    .await
    .expect("create deployment");
    let place = nest.accept_placement().await;
    (hub, api, nest, place)
}

/// Task `task_id` of namespace `default`.
pub async fn get(api: &mut Api, task_id: &str) -> pb::Task {
    api.get_task(pb::GetTaskRequest {
        namespace: "default".into(),
        task_id: task_id.into(),
    })
    .await
    .expect("get task")
    .into_inner()
}

/// What `FetchRunContext` gave for a run: the history's and the replay's JSON text and the
/// data bytes of each chunk.
#[derive(Debug)]
pub struct FetchedContext {
    pub history: String,
    pub replay: String,
    pub chunk_bytes: Vec<usize>,
}

/// Fetches the context of `run` as Nest `as_nest` (its own certificate), naming `instance_id`.
pub async fn fetch_context(
    hub: &TestHub,
    as_nest: &str,
    run: &pb::AssignRun,
    instance_id: &str,
) -> Result<FetchedContext, tonic::Status> {
    let mut client = hub.nest_client_as(as_nest).await;
    let mut stream = client
        .fetch_run_context(pb::FetchRunContextRequest {
            task_id: run.task_id.clone(),
            run_id: run.run_id.clone(),
            attempt: run.attempt,
            instance_id: instance_id.into(),
        })
        .await?
        .into_inner();
    let (mut history, mut replay, mut chunk_bytes) = (Vec::new(), Vec::new(), Vec::new());
    let mut sizes = None;
    while let Some(c) = stream.message().await? {
        sizes.get_or_insert((c.history_size, c.replay_size));
        chunk_bytes.push(c.history.len() + c.replay.len());
        history.extend_from_slice(&c.history);
        replay.extend_from_slice(&c.replay);
    }
    assert_eq!(
        sizes,
        Some((history.len() as u64, replay.len() as u64)),
        "the first chunk announces the totals that arrive"
    );
    Ok(FetchedContext {
        history: String::from_utf8(history).expect("history is UTF-8"),
        replay: String::from_utf8(replay).expect("replay is UTF-8"),
        chunk_bytes,
    })
}
