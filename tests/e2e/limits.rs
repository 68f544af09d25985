//! The limit table (issue 14) through the real API: each limit at the limit and one past it
//! (`INVALID_ARGUMENT` with `<field>: N bytes is over the limit of M bytes`), quotas as
//! `RESOURCE_EXHAUSTED`, short error texts for huge ids, malformed protobuf as
//! `INVALID_ARGUMENT`, an oversized input refused while another task runs on an unbroken
//! Nest link, and `ListTasks` paging over big inputs.

use std::path::Path;
use std::time::Duration;

use agen_proto::v1 as pb;
use agen_proto::v1::agen_service_client::AgenServiceClient;
use agen_tests::{free_port, mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

const MIB: usize = 1024 * 1024;

#[derive(Clone)]
pub(crate) struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: Request<()>) -> Result<Request<()>, Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

pub(crate) type Api = AgenServiceClient<InterceptedService<Channel, Bearer>>;

/// A TLS channel to the Hub, trusting its CA.
pub(crate) async fn channel(hub: &HubProcess) -> Channel {
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    Endpoint::from_shared(hub.url())
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap()
}

pub(crate) fn bearer(hub: &HubProcess) -> Bearer {
    let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    Bearer(format!("Bearer {}", token.trim()).parse().unwrap())
}

/// An admin client with the same 64 MiB message limit as the CLI.
pub(crate) async fn api(hub: &HubProcess) -> Api {
    AgenServiceClient::with_interceptor(channel(hub).await, bearer(hub))
        .max_decoding_message_size(agen_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(agen_proto::MAX_MESSAGE_BYTES)
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A bundle without tool servers whose model is the fake model.
pub(crate) fn bundle(dir: &Path, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: runner\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
}

pub(crate) fn deploy(hub: &HubProcess, dir: &Path, replicas: u32, wait: bool) {
    let replicas = replicas.to_string();
    let mut args = vec![
        "deploy",
        dir.to_str().unwrap(),
        "--name",
        "runner",
        "--replicas",
        &replicas,
    ];
    if wait {
        args.push("--wait");
    }
    let out = hub.cli(&args).unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn submit(input: String) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        deployment: "runner".into(),
        input,
        ..Default::default()
    }
}

/// `(code, message)` of a refused call.
pub(crate) fn refused<T: std::fmt::Debug>(r: Result<tonic::Response<T>, Status>) -> (Code, String) {
    let s = r.expect_err("the call must be refused");
    (s.code(), s.message().to_string())
}

pub(crate) fn invalid(text: &str) -> (Code, String) {
    (Code::InvalidArgument, text.to_string())
}

/// Waits until `task` reaches a terminal state; returns the task.
async fn wait_terminal(api: &mut Api, task: &str) -> pb::Task {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let t = api
            .get_task(pb::GetTaskRequest {
                namespace: String::new(),
                task_id: task.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if t.finished_at_ms > 0 {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "task {task} did not finish: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn every_field_limit_accepts_its_limit_and_refuses_one_byte_more_with_the_contract_text() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    // No replicas: accepted tasks stay queued, which is all this test needs.
    deploy(&hub, &dir, 0, false);
    let rt = runtime();
    rt.block_on(async {
        let mut api = api(&hub).await;
        let mut accepted = 0;

        // Input: 1 MiB.
        api.submit_task(submit("i".repeat(MIB))).await.unwrap();
        accepted += 1;
        assert_eq!(
            refused(api.submit_task(submit("i".repeat(MIB + 1))).await),
            invalid("input: 1048577 bytes is over the limit of 1048576 bytes")
        );

        // Labels: 64 pairs, key ≤ 128 bytes of the key rule, value ≤ 1 KiB.
        let with_labels = |labels: Vec<(String, String)>| pb::SubmitTaskRequest {
            labels: labels.into_iter().collect(),
            ..submit("hi".into())
        };
        let many = |n: usize| (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect();
        api.submit_task(with_labels(many(64))).await.unwrap();
        accepted += 1;
        assert_eq!(
            refused(api.submit_task(with_labels(many(65))).await),
            invalid("labels: 65 labels is over the limit of 64 labels")
        );
        let key = |k: String| vec![(k, "v".to_string())];
        api.submit_task(with_labels(key("k".repeat(128))))
            .await
            .unwrap();
        accepted += 1;
        assert_eq!(
            refused(api.submit_task(with_labels(key("k".repeat(129)))).await),
            invalid(&format!(
                "labels: key `{}…`: 129 bytes is over the limit of 128 bytes",
                "k".repeat(64)
            ))
        );
        let bad_key = "labels: key `bad key!` is not a label key; expected letters, digits, `.`, `_`, `/` or `-`, starting and ending with a letter or digit";
        assert_eq!(
            refused(api.submit_task(with_labels(key("bad key!".into()))).await),
            invalid(bad_key)
        );
        assert_eq!(
            refused(api.submit_task(with_labels(key(String::new()))).await).0,
            Code::InvalidArgument
        );
        let value = |n: usize| vec![("team".to_string(), "v".repeat(n))];
        api.submit_task(with_labels(value(1024))).await.unwrap();
        accepted += 1;
        assert_eq!(
            refused(api.submit_task(with_labels(value(1025))).await),
            invalid("labels[team]: 1025 bytes is over the limit of 1024 bytes")
        );
        // A 1 MiB value is refused with a short message.
        let (code, msg) = refused(api.submit_task(with_labels(value(MIB))).await);
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.len() < 200, "{msg}");

        // Conversation key: 256 bytes.
        let conv = |n: usize| pb::SubmitTaskRequest {
            conversation_key: "c".repeat(n),
            ..submit("hi".into())
        };
        api.submit_task(conv(256)).await.unwrap();
        accepted += 1;
        assert_eq!(
            refused(api.submit_task(conv(257)).await),
            invalid("conversation_key: 257 bytes is over the limit of 256 bytes")
        );
        assert_eq!(
            refused(api.submit_task(conv(MIB)).await),
            invalid("conversation_key: 1048576 bytes is over the limit of 256 bytes")
        );

        // Names: 63 characters (a valid 63-byte name of a deployment that does not exist).
        let named = |n: usize| pb::SubmitTaskRequest {
            deployment: "d".repeat(n),
            ..submit("hi".into())
        };
        assert_eq!(refused(api.submit_task(named(63)).await).0, Code::NotFound);
        let (code, msg) = refused(api.submit_task(named(64)).await);
        assert_eq!(code, Code::InvalidArgument);
        assert!(
            msg.starts_with("deployment: 64 bytes is over the limit of 63 bytes"),
            "{msg}"
        );
        // Deployment selectors follow the label rules.
        let (code, msg) = refused(
            api.create_deployment(pb::CreateDeploymentRequest {
                name: "runner".into(),
                bundle_digest: "sha256:00".into(),
                selector: [("bad key!".to_string(), "v".to_string())].into(),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.starts_with("selector: key `bad key!`"), "{msg}");

        // A 5 MiB task id: a short refusal, not an echo the client cannot take.
        let (code, msg) = refused(
            api.get_task(pb::GetTaskRequest {
                namespace: String::new(),
                task_id: "t".repeat(5 * MIB),
            })
            .await,
        );
        assert_eq!(
            (code, msg),
            invalid("task_id: 5242880 bytes is over the limit of 256 bytes")
        );
        let (code, msg) = refused(
            api.get_task(pb::GetTaskRequest {
                namespace: String::new(),
                task_id: format!("task-{}", "0".repeat(200)),
            })
            .await,
        );
        assert_eq!(code, Code::NotFound);
        assert!(msg.len() < 400, "{msg}");

        // Nothing refused was stored: exactly the accepted tasks are listed.
        let listed = api
            .list_tasks(pb::ListTasksRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.tasks.len(), accepted);
    });
}

/// Sends raw bytes as the request of a unary RPC.
#[derive(Clone, Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let n = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, n).to_vec()))
    }
}

#[test]
fn malformed_protobuf_is_invalid_argument_not_internal() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let mut grpc =
            tonic::client::Grpc::new(InterceptedService::new(channel(&hub).await, bearer(&hub)));
        for (what, body) in [
            // task_id (field 2) claims 5 bytes but 2 follow.
            ("a truncated field", vec![0x12, 0x05, b'a', b'b']),
            // task_id is not UTF-8.
            ("a string that is not UTF-8", vec![0x12, 0x02, 0xff, 0xfe]),
        ] {
            grpc.ready().await.unwrap();
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/agen.v1.AgenService/GetTask",
            );
            let status = grpc
                .unary(Request::new(body), path, RawCodec)
                .await
                .expect_err("a malformed request is refused");
            assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
            assert!(
                status
                    .message()
                    .starts_with("request: not a valid protobuf message"),
                "{what}: {}",
                status.message()
            );
        }
    });
}

#[test]
fn a_5_mb_input_is_refused_while_another_task_keeps_running_and_the_nest_link_stays_up() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!([{"reply": "done after a while", "delay_ms": 3000}]),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, 1, true);
    let rt = runtime();
    rt.block_on(async {
        let mut api = api(&hub).await;
        let long = api
            .submit_task(submit("take your time".into()))
            .await
            .unwrap()
            .into_inner();
        // Wait until it runs (its model call takes 3 s).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let t = api
                .get_task(pb::GetTaskRequest {
                    namespace: String::new(),
                    task_id: long.task_id.clone(),
                })
                .await
                .unwrap()
                .into_inner();
            if t.state == pb::TaskState::Running as i32 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never ran: {t:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for size in [5_000_000usize, 10 * MIB] {
            assert_eq!(
                refused(api.submit_task(submit("x".repeat(size))).await),
                invalid(&format!(
                    "input: {size} bytes is over the limit of 1048576 bytes"
                ))
            );
        }
        let done = wait_terminal(&mut api, &long.task_id).await;
        assert_eq!(done.state, pb::TaskState::Succeeded as i32, "{done:?}");
        // A task submitted after the refusal runs on the same link too.
        let after = api
            .submit_task(submit("and another".into()))
            .await
            .unwrap()
            .into_inner();
        let after = wait_terminal(&mut api, &after.task_id).await;
        assert_eq!(after.state, pb::TaskState::Succeeded as i32, "{after:?}");
    });
    // The Nest's link never broke: one registration, no disconnect, no stream error.
    let hub_log = hub.proc.log_text();
    let nest_log = nest.proc.log_text();
    let count = |log: &str, what: &str| log.matches(what).count();
    assert_eq!(
        (
            count(&hub_log, "nest registered"),
            count(&hub_log, "nest disconnected"),
            count(&hub_log, "nest stream failed"),
            count(&nest_log, "message length too large"),
        ),
        (1, 0, 0, 0),
        "hub log:\n{hub_log}\nnest log:\n{nest_log}"
    );
}

#[test]
fn list_tasks_pages_over_201_tasks_with_900_kib_inputs() {
    const TASKS: usize = 201;
    const INPUT: usize = 900 * 1024;
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, 0, false);
    let rt = runtime();
    let ids = rt.block_on(async {
        let mut api = api(&hub).await;
        let mut ids = Vec::new();
        for i in 0..TASKS {
            let input = format!("{i:04}{}", "p".repeat(INPUT - 4));
            let t = api.submit_task(submit(input)).await.unwrap().into_inner();
            ids.push(t.task_id);
        }
        // Pages of 50: every task once, newest first, each a summary without its input.
        let mut seen = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let page = api
                .list_tasks(pb::ListTasksRequest {
                    page_size: 50,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            pages += 1;
            assert!(page.tasks.len() <= 50);
            for t in &page.tasks {
                assert!(t.summary, "{}", t.task_id);
                assert_eq!(t.input_bytes, INPUT as u64);
                assert!(t.input.len() <= 256 + 3, "{} bytes", t.input.len());
                seen.push(t.task_id.clone());
            }
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        assert_eq!(pages, 5);
        let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
        assert_eq!(seen, newest_first);
        // The default page (no page size) is one call that fits the message limit too.
        let first = api
            .list_tasks(pb::ListTasksRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(first.tasks.len(), 100);
        assert!(!first.next_page_token.is_empty());
        // GetTask has the whole input.
        let whole = api
            .get_task(pb::GetTaskRequest {
                namespace: String::new(),
                task_id: ids[7].clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!whole.summary);
        assert_eq!(whole.input.len(), INPUT);
        assert!(whole.input.starts_with("0007"));
        // A token that did not come from ListTasks is refused, briefly.
        let (code, msg) = refused(
            api.list_tasks(pb::ListTasksRequest {
                page_token: "z".repeat(MIB),
                ..Default::default()
            })
            .await,
        );
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.len() < 300, "{msg}");
        ids
    });
    // `agen tasks` pages through all of them.
    let all = hub
        .cli_json(&["tasks", "--limit", "0", "-o", "json"])
        .unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), TASKS);
    assert_eq!(all[0]["task"], ids[TASKS - 1].as_str());
    assert_eq!(all[0]["input_bytes"], INPUT);
    let some = hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(some.as_array().map(Vec::len), Some(100));
}

#[test]
fn a_conversation_over_its_history_quota_is_refused_as_resource_exhausted() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--max-history-bytes", "4KiB"],
    )
    .unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let long_answer = "a".repeat(5000);
    let model =
        FakeModel::start(&tmp.path().join("model"), &json!([{"reply": long_answer}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, 1, true);
    let rt = runtime();
    rt.block_on(async {
        let mut api = api(&hub).await;
        let in_conv = |input: &str, key: &str| pb::SubmitTaskRequest {
            conversation_key: key.into(),
            ..submit(input.into())
        };
        // An empty history is under the quota: the first task runs and stores ~5 KB.
        let first = api
            .submit_task(in_conv("hello", "chat-1"))
            .await
            .unwrap()
            .into_inner();
        let first = wait_terminal(&mut api, &first.task_id).await;
        assert_eq!(first.state, pb::TaskState::Succeeded as i32, "{first:?}");
        let (code, msg) = refused(api.submit_task(in_conv("more", "chat-1")).await);
        assert_eq!(code, Code::ResourceExhausted, "{msg}");
        assert!(
            msg.starts_with("history: conversation `chat-1` holds ")
                && msg.contains("over the quota of 4096 bytes per conversation"),
            "{msg}"
        );
        // Another conversation still takes tasks.
        api.submit_task(in_conv("hello", "chat-2")).await.unwrap();
    });
}

/// The CLI shows the Hub's refusal as it is, and nothing refused is stored.
#[test]
fn the_cli_reports_a_refused_label_with_the_contract_text() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, 0, false);
    let label = format!("k={}", "v".repeat(1025));
    let out = hub
        .cli(&["submit", "runner", "hi", "--label", &label])
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("labels[k]: 1025 bytes is over the limit of 1024 bytes"),
        "{err}"
    );
    let tasks: Value = hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(tasks, json!([]));
}

/// The Hub's RSS in bytes (`VmRSS` of its process).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A Nest that registers with a real certificate, takes one placement, reports the instance
/// running and healthy (and keeps heartbeating), but never reads its stream again.
#[test]
fn a_nest_that_stops_reading_is_disconnected_and_its_runs_handed_over_while_hub_memory_stays_bounded(
) {
    use agen_proto::v1::nest_service_client::NestServiceClient;
    use tonic::transport::Identity;

    const TASKS: usize = 40;
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "30s",
        &["--nest-queue-bytes", "8MiB"],
    )
    .unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    let join = hub.join_token().unwrap();
    let join_bearer = Bearer(format!("Bearer {join}").parse().unwrap());
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (handed_over, rss_before, rss_after) = rt.block_on(async {
        // Join: a certificate for our own key, as a real Nest gets one.
        let nest_id = "rogue-nest-1";
        let (key_pem, csr_pem) = agen_shared::tls::nest_key_and_csr(nest_id).unwrap();
        let mut joiner =
            NestServiceClient::with_interceptor(channel(&hub).await, join_bearer.clone());
        let cert_pem = joiner
            .join(pb::JoinRequest {
                nest_id: nest_id.into(),
                name: "rogue".into(),
                csr_pem,
            })
            .await
            .unwrap()
            .into_inner()
            .cert_pem;
        let ch = Endpoint::from_shared(hub.url())
            .unwrap()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&ca))
                    .domain_name("localhost")
                    .identity(Identity::from_pem(cert_pem, key_pem)),
            )
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut nest = NestServiceClient::with_interceptor(ch, join_bearer)
            .max_decoding_message_size(agen_proto::MAX_MESSAGE_BYTES);
        let (out_tx, out_rx) = tokio::sync::mpsc::channel::<pb::NestMessage>(16);
        let msg = |m| pb::NestMessage { msg: Some(m) };
        out_tx
            .send(msg(pb::nest_message::Msg::Register(pb::Register {
                nest_id: nest_id.into(),
                name: "rogue".into(),
                capacity: 32,
                version: "rogue".into(),
                protocol_version: agen_shared::version::Protocol::CURRENT.to_string(),
                ..Default::default()
            })))
            .await
            .unwrap();
        let mut inbound = nest
            .connect(tokio_stream::wrappers::ReceiverStream::new(out_rx))
            .await
            .unwrap()
            .into_inner();

        let out = hub
            .cli(&[
                "deploy",
                dir.to_str().unwrap(),
                "--name",
                "runner",
                "--replicas",
                "1",
                "--concurrency",
                "1000",
            ])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let place = loop {
            let m = tokio::time::timeout(Duration::from_secs(30), inbound.message())
                .await
                .expect("a placement within 30 s")
                .unwrap()
                .expect("the stream stays open");
            if let Some(pb::hub_message::Msg::Place(p)) = m.msg {
                break p;
            }
        };
        let report = pb::InstanceReport {
            instance_id: place.instance_id.clone(),
            namespace: place.namespace.clone(),
            deployment: place.deployment.clone(),
            bundle_digest: place.bundle_digest.clone(),
            generation: place.generation,
            state: pb::InstanceState::Running as i32,
            healthy: true,
            ..Default::default()
        };
        // Heartbeats go on (the Nest is not silent); its stream is never read again.
        let beats = tokio::spawn(async move {
            loop {
                let beat = msg(pb::nest_message::Msg::Heartbeat(pb::Heartbeat {
                    at_ms: 0,
                    instances: vec![report.clone()],
                }));
                if out_tx.send(beat).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        let mut api = api(&hub).await;
        // Wait until the Hub sees the instance healthy.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let d = api
                .get_deployment(pb::GetDeploymentRequest {
                    namespace: String::new(),
                    name: "runner".into(),
                })
                .await
                .unwrap()
                .into_inner();
            if d.instances.iter().any(|i| i.healthy) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never healthy: {d:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rss_before = rss_bytes(hub.proc.pid());
        let mut ids = Vec::new();
        for i in 0..TASKS {
            let input = format!("{i:04}{}", "m".repeat(MIB - 4));
            ids.push(
                api.submit_task(submit(input))
                    .await
                    .unwrap()
                    .into_inner()
                    .task_id,
            );
        }
        // The Nest is disconnected (lost) without waiting for its 30 s ttl.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let nests = api
                .list_nests(pb::ListNestsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .nests;
            if nests
                .iter()
                .any(|n| n.name == "rogue" && n.state == pb::NestState::Lost as i32)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the rogue nest is still connected: {nests:?}\nhub log:\n{}",
                hub.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Every run it was given is handed back: nothing stays running on it.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let handed_over = loop {
            let mut running = 0;
            let mut dispatched = 0;
            for id in &ids {
                let t = api
                    .get_task(pb::GetTaskRequest {
                        namespace: String::new(),
                        task_id: id.clone(),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                if t.state == pb::TaskState::Running as i32 {
                    running += 1;
                }
                if t.attempt > 0 {
                    dispatched += 1;
                }
            }
            if running == 0 {
                break dispatched;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{running} tasks still running on a disconnected nest"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let rss_after = rss_bytes(hub.proc.pid());
        beats.abort();
        drop(inbound);
        (handed_over, rss_before, rss_after)
    });
    let log = hub.proc.log_text();
    assert!(
        log.contains("stopped reading its stream"),
        "hub log:\n{log}"
    );
    assert!(
        handed_over > 0,
        "some runs were dispatched to the rogue nest"
    );
    // 40 MiB of inputs are stored; the queue to the Nest held at most 8 MiB of them (an
    // unbounded queue would have held every assignment).
    let grown = rss_after.saturating_sub(rss_before);
    eprintln!(
        "hub rss {} MiB -> {} MiB; {handed_over} runs handed over",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(
        grown < 400 * MIB as u64,
        "the hub grew by {} MiB",
        grown >> 20
    );
}

/// The text of the last tool message in a recorded model request.
fn last_tool_message(request: &Value) -> String {
    let messages = request["body"]["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let tool = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap_or(Value::Null);
    match &tool["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Deploys `name` (a bundle with the `big` tool server and its own fake model, which calls
/// `big(bytes)` once and then answers), runs one task to its end, and returns the task id and
/// the model requests recorded.
fn run_big_tool(hub: &HubProcess, root: &Path, name: &str, bytes: usize) -> (String, Vec<Value>) {
    let record = root.join(format!("{name}-requests.jsonl"));
    let model = FakeModel::start(
        &root.join(format!("{name}-model")),
        &json!({"record": record, "steps": [
            {"tool_calls": [{"name": "big_big", "arguments": {"bytes": bytes}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let dir = root.join(format!("{name}-bundle"));
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "big",
                    json!({"command": agen_tests::Peers::python(), "args": [agen_tests::Peers::script("servers/big_server.py")]}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hub.cli(&["submit", name, "fetch it"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = hub
        .cli(&["wait", &task, "-o", "json", "--timeout", "120s"])
        .unwrap();
    assert!(
        out.status.success(),
        "wait: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = std::fs::read_to_string(&record)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (task, requests)
}

#[test]
fn a_tool_result_over_1_mib_is_cut_for_the_model_and_kept_whole_as_an_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();

    // At the limit: the whole result, no note, no artifact.
    let (task, requests) = run_big_tool(&hub, tmp.path(), "at-limit", MIB);
    assert_eq!(requests.len(), 2);
    let at = last_tool_message(&requests[1]);
    assert_eq!(at.len(), MIB);
    assert!(at.ends_with("END"));
    let arts = hub
        .cli_json(&["artifacts", "ls", &task, "-o", "json"])
        .unwrap();
    assert_eq!(arts, json!([]));

    // One byte past it: the first 1 MiB and a note saying how long it was and where the rest is.
    let (task, requests) = run_big_tool(&hub, tmp.path(), "past-limit", MIB + 1);
    assert_eq!(requests.len(), 2);
    let past = last_tool_message(&requests[1]);
    let (kept, note) = past.split_once("\n\n[tool result cut: ").expect("a note");
    assert_eq!(kept.len(), MIB);
    assert!(
        note.starts_with("it was 1048577 bytes, over the limit of 1048576 bytes")
            && note.contains("read_artifact(id: \"sha256:")
            && note.contains("offset: 1048576)"),
        "{note}"
    );
    // Kept whole as an artifact of the task.
    let arts = hub
        .cli_json(&["artifacts", "ls", &task, "-o", "json"])
        .unwrap();
    let arts = arts.as_array().unwrap();
    assert_eq!(arts.len(), 1, "{arts:?}");
    assert_eq!(arts[0]["size"], MIB + 1);
    let id = arts[0]["id"].as_str().unwrap().to_string();
    assert!(note.contains(&id), "{note}");
    let file = tmp.path().join("whole.txt");
    let out = hub
        .cli(&["artifacts", "get", &id, "--out", file.to_str().unwrap()])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let whole = std::fs::read_to_string(&file).unwrap();
    assert_eq!(whole.len(), MIB + 1);
    assert!(whole.ends_with("END") && whole.starts_with(kept));
}
