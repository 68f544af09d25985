//! The limits table of `docs/limits.md`, row by row, through the public API: the test reads the
//! table, and for each row sends an input one unit over the limit (one byte, one label, one
//! task) to a real Hub and asserts the documented refusal. A row this test has no case for fails
//! it, and so does a case whose row is gone. Rows that need a whole fleet at work (a Nest that
//! stops reading, 32 MiB of history, an instance saving 25 MB) or a Nest's certificate are not
//! sent here: each names the test that sends it and says why.

use std::collections::BTreeSet;
use std::path::Path;

use agen_proto::v1 as pb;
use agen_tests::{free_port, FakeModel, HubProcess};
use prost::Message;
use serde_json::json;
use tonic::Code;

use crate::limits::{api, bundle, deploy, invalid, refused, runtime, submit, Api};

const MIB: usize = 1024 * 1024;

/// Rows whose one-over input this test sends itself.
const SENT: &[&str] = &[
    "task input",
    "labels (task, Nest `Register`, deployment selector)",
    "conversation key",
    "names (namespace, deployment)",
    "secret name",
    "ids (task, artifact, bundle digest)",
    "cancel reason / secret value",
    "edited approval arguments (`agen approve --args`, `DecideApprovalRequest.arguments_json`)",
    "task output schema (`agen submit --output-schema`, `SubmitTaskRequest.output_schema_json`)",
    "`ListTasks` page",
    "A2A request body",
    "web console request body",
    "A2A `ListTasks` page",
    "A2A blocking `SendMessage` wait",
    "gRPC messages",
    "schedules",
    "webhooks of a task (URL, count)",
    "queued tasks per deployment",
    "resources per instance (`x-agen/config.json` `resources`, `agen deploy --cpu --memory --pids`)",
];

/// Rows sent one over by another test, with the reason they are not sent here.
const ELSEWHERE: &[(&str, &str, &str)] = &[
    (
        "conversation history",
        "tests/e2e/limits.rs a_conversation_over_its_history_quota_is_refused_as_resource_exhausted",
        "reaching 32 MiB takes running tasks whose answers add up to 32 MiB; that test lowers the quota with --max-history-bytes and goes one conversation over it",
    ),
    (
        "artifacts",
        "hub/src/core/artifacts.rs a_damaged_upload_and_the_limits_are_refused",
        "artifacts are saved only by an instance running a task (NestService.PutArtifact, Nest certificate and lease); no client RPC stores one",
    ),
    (
        "queue to one Nest",
        "tests/e2e/limits.rs a_nest_that_stops_reading_is_disconnected_and_its_runs_handed_over_while_hub_memory_stays_bounded",
        "the queue fills only when a Nest stops reading its stream, which that test stages",
    ),
    (
        "run context (`FetchRunContext`)",
        "hub/tests/run_context.rs only_the_nest_holding_the_lease_may_fetch_a_runs_history",
        "FetchRunContext is a NestService call that needs a Nest certificate and a lease",
    ),
    (
        "recorded tool result",
        "tests/e2e/limits.rs a_tool_result_over_1_mib_is_cut_for_the_model_and_kept_whole_as_an_artifact",
        "a tool result is produced by a tool server inside a run (a Nest, an instance, a model), which that test runs",
    ),
    (
        "token names, label values",
        "tests/e2e/hostile_clients.rs hostile_names_and_model_output_reach_the_terminal_escaped",
        "the rule is about which characters, not a count: that test sends the reserved names and control, format and line-break characters and checks each refusal",
    ),
    (
        "messages before authentication",
        "tests/e2e/hostile_clients.rs tokenless_slow_bodies_cost_the_hub_no_memory_and_a_legitimate_call_still_answers",
        "one over is a 64 KiB + 1 `Join`, which that test sends (as a 60 MB one) on its own TLS connection while it measures the Hub's memory",
    ),
    (
        "connections not yet authenticated",
        "tests/e2e/hostile_clients.rs tokenless_slow_bodies_cost_the_hub_no_memory_and_a_legitimate_call_still_answers",
        "one over needs the cap's worth of silent connections held open; that test lowers the cap and holds them",
    ),
    (
        "connections in all",
        "hub/src/conn_gate.rs unauthenticated_connections_are_capped_per_address_and_authenticated_ones_only_in_total",
        "16,384 real connections do not fit a test; the gate's own test goes one over a small total",
    ),
    (
        "open server streams (WatchTask, WatchDeployments, WatchNests, logs follow, A2A SSE)",
        "tests/e2e/hostile_clients.rs every_stream_kind_is_capped_per_token_and_in_total_and_refusals_are_counted",
        "one over needs the cap's worth of open streams; that test lowers the caps, holds them and counts the refusals",
    ),
    (
        "metric label values from bundles and models (`tool`, `model`)",
        "tests/e2e/hostile_clients.rs a_model_inventing_thousands_of_tool_names_makes_a_bounded_number_of_series",
        "label values come from a model inside a run (a Nest, an instance, a fake model), which that test runs",
    ),
    (
        "webhook deliveries (in flight, body)",
        "hub/src/core/webhooks.rs deliveries_in_flight_are_capped_and_a_long_result_is_cut",
        "16 deliveries in flight need 16 slow receivers; the pass's own test goes one over the cap and over the body size",
    ),
    (
        "Nests per Hub",
        "tests/e2e/scale_limits.rs a_nest_over_the_hubs_nest_limit_is_refused_and_retries_and_a_nest_gets_no_more_instances_than_the_hub_allows",
        "one over is a Nest registering with its own certificate while the limit's worth are connected; that test runs them",
    ),
    (
        "instances per Nest",
        "tests/e2e/scale_limits.rs a_nest_over_the_hubs_nest_limit_is_refused_and_retries_and_a_nest_gets_no_more_instances_than_the_hub_allows",
        "placement needs a connected Nest; that test deploys one replica more than the limit onto one",
    ),
    (
        "TLS handshake / A2A body",
        "tests/e2e/hostile_clients.rs tokenless_slow_bodies_cost_the_hub_no_memory_and_a_legitimate_call_still_answers",
        "one over is a connection that stays silent past the deadline, which that test holds and sees cut",
    ),
];

/// The first cell of every row of the table under "## The table" in docs/limits.md.
fn table_rows() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/limits.md");
    let text = std::fs::read_to_string(&path).expect("docs/limits.md");
    let section = text
        .split("\n## The table")
        .nth(1)
        .expect("docs/limits.md has a `## The table` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn the_table_and_the_cases_name_the_same_rows() {
    let rows: BTreeSet<String> = table_rows().into_iter().collect();
    assert!(rows.len() >= 10, "found only {} rows: {rows:?}", rows.len());
    let cases: BTreeSet<String> = SENT
        .iter()
        .copied()
        .chain(ELSEWHERE.iter().map(|(r, _, _)| *r))
        .map(String::from)
        .collect();
    let untested: Vec<&String> = rows.difference(&cases).collect();
    assert!(
        untested.is_empty(),
        "rows of docs/limits.md without a case in tests/e2e/limits_table.rs: {untested:?}"
    );
    let gone: Vec<&String> = cases.difference(&rows).collect();
    assert!(
        gone.is_empty(),
        "cases for rows docs/limits.md no longer has: {gone:?}"
    );
    // Every test a row is left to exists.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (row, at, why) in ELSEWHERE {
        assert!(!why.is_empty(), "{row}: say why it is not sent here");
        let (file, test) = at.split_once(' ').expect("`<file> <test>`");
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_default();
        assert!(
            text.contains(&format!("fn {test}(")),
            "{row}: {file} has no test `{test}`"
        );
    }
}

#[test]
fn every_row_of_the_limits_table_refuses_one_unit_over_through_the_public_api() {
    let tmp = tempfile::tempdir().unwrap();
    // The blocking A2A wait is 5 min by default; its flag lowers it to 1 s so that a task that
    // cannot end within it (no replicas) is one unit over in a test's time.
    // --max-queued-tasks is lowered so that one over is a few hundred submits (the `ListTasks`
    // row queues 101 tasks of its own deployment, below it).
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "10s",
        &["--a2a-send-wait", "1s", "--max-queued-tasks", "150"],
    )
    .unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    // No replicas: accepted tasks stay queued, which is all this test needs.
    deploy(&hub, &dir, 0, false);
    let rt = runtime();
    let mut sent = 0;
    rt.block_on(async {
        let mut api = api(&hub).await;
        for row in table_rows() {
            if ELSEWHERE.iter().any(|(r, _, _)| *r == row) {
                continue;
            }
            one_over(&hub, &mut api, &row).await;
            sent += 1;
        }
    });
    assert_eq!(sent, SENT.len(), "every SENT row was sent one over");
}

/// Sends `row`'s input one unit over its limit and asserts the documented refusal.
async fn one_over(hub: &HubProcess, api: &mut Api, row: &str) {
    let over = |field: &str, n: usize, limit: usize| {
        invalid(&format!(
            "{field}: {n} bytes is over the limit of {limit} bytes"
        ))
    };
    match row {
        "task input" => {
            let r = api.submit_task(submit("i".repeat(MIB + 1))).await;
            assert_eq!(refused(r), over("input", MIB + 1, MIB), "{row}");
        }
        "labels (task, Nest `Register`, deployment selector)" => {
            let labels = |n: usize| (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect();
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    labels: labels(65),
                    ..submit("hi".into())
                })
                .await;
            assert_eq!(
                refused(r),
                invalid("labels: 65 labels is over the limit of 64 labels")
            );
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    labels: [("k".repeat(129), "v".to_string())].into(),
                    ..submit("hi".into())
                })
                .await;
            let (code, msg) = refused(r);
            assert_eq!(code, Code::InvalidArgument, "{msg}");
            assert!(
                msg.starts_with("labels: key `")
                    && msg.ends_with("129 bytes is over the limit of 128 bytes"),
                "{msg}"
            );
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    labels: [("team".to_string(), "v".repeat(1025))].into(),
                    ..submit("hi".into())
                })
                .await;
            assert_eq!(refused(r), over("labels[team]", 1025, 1024));
            // A deployment selector follows the same table. (A Nest's `Register` labels need a
            // Nest certificate: hub/src/limits.rs checks them with the same function.)
            let r = api
                .create_deployment(pb::CreateDeploymentRequest {
                    name: "runner".into(),
                    bundle_digest: "sha256:00".into(),
                    selector: labels(65),
                    ..Default::default()
                })
                .await;
            assert_eq!(
                refused(r),
                invalid("selector: 65 labels is over the limit of 64 labels")
            );
        }
        "conversation key" => {
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    conversation_key: "c".repeat(257),
                    ..submit("hi".into())
                })
                .await;
            assert_eq!(refused(r), over("conversation_key", 257, 256));
        }
        "names (namespace, deployment)" => {
            let name_over = |(code, msg): (Code, String), field: &str| {
                assert_eq!(code, Code::InvalidArgument, "{field}: {msg}");
                assert!(
                    msg.starts_with(&format!(
                        "{field}: 64 bytes is over the limit of 63 bytes; "
                    )),
                    "{field}: {msg}"
                );
            };
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    deployment: "d".repeat(64),
                    ..submit("hi".into())
                })
                .await;
            name_over(refused(r), "deployment");
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    namespace: "n".repeat(64),
                    ..submit("hi".into())
                })
                .await;
            name_over(refused(r), "namespace");
        }
        "secret name" => {
            let secret = |name: String| pb::SetSecretRequest {
                namespace: String::new(),
                name,
                value: b"v".to_vec(),
            };
            api.set_secret(secret("S".repeat(128))).await.unwrap();
            let (code, msg) = refused(api.set_secret(secret("S".repeat(129))).await);
            assert_eq!(code, Code::InvalidArgument, "{msg}");
            // The name is echoed cut to 64 bytes, as every refusal echoes.
            assert_eq!(
                msg,
                format!(
                    "name: `{}…` is not a valid secret name; expected up to 128 letters, digits and `_`, not starting with a digit (as in x-agen/secrets.json)",
                    "S".repeat(64)
                )
            );
        }
        "ids (task, artifact, bundle digest)" => {
            let r = api
                .get_task(pb::GetTaskRequest {
                    namespace: String::new(),
                    task_id: "t".repeat(257),
                })
                .await;
            assert_eq!(refused(r), over("task_id", 257, 256));
            let r = api
                .get_artifact(pb::GetArtifactRequest {
                    namespace: String::new(),
                    artifact_id: "a".repeat(257),
                })
                .await;
            assert_eq!(refused(r), over("artifact_id", 257, 256));
            let r = api
                .create_deployment(pb::CreateDeploymentRequest {
                    name: "runner".into(),
                    bundle_digest: "b".repeat(257),
                    ..Default::default()
                })
                .await;
            assert_eq!(refused(r), over("bundle_digest", 257, 256));
            let r = api
                .submit_task(pb::SubmitTaskRequest {
                    client_request_id: "r".repeat(201),
                    ..submit("hi".into())
                })
                .await;
            assert_eq!(refused(r), over("client_request_id", 201, 200));
        }
        "cancel reason / secret value" => {
            let r = api
                .cancel_task(pb::CancelTaskRequest {
                    namespace: String::new(),
                    task_id: "task-1".into(),
                    reason: "r".repeat(4097),
                })
                .await;
            assert_eq!(refused(r), over("reason", 4097, 4096));
            let r = api
                .set_secret(pb::SetSecretRequest {
                    namespace: String::new(),
                    name: "TOKEN".into(),
                    value: vec![b'v'; 64 * 1024 + 1],
                })
                .await;
            assert_eq!(refused(r), over("value", 64 * 1024 + 1, 64 * 1024));
        }
        "edited approval arguments (`agen approve --args`, `DecideApprovalRequest.arguments_json`)" => {
            let decide = |arguments_json: String| pb::DecideApprovalRequest {
                task_id: "task-1".into(),
                approved: true,
                arguments_json,
                ..Default::default()
            };
            let text = format!("{{\"a\": \"{}\"}}", "x".repeat(64 * 1024 - 8));
            assert_eq!(text.len(), 64 * 1024 + 1);
            let r = api.decide_approval(decide(text)).await;
            assert_eq!(refused(r), over("arguments_json", 64 * 1024 + 1, 64 * 1024));
            let r = api.decide_approval(decide("[1]".into())).await;
            assert!(
                refused(r).1.starts_with("arguments_json: expected a JSON object"),
                "{row}"
            );
        }
        "task output schema (`agen submit --output-schema`, `SubmitTaskRequest.output_schema_json`)" => {
            let with_schema = |output_schema_json: String| pb::SubmitTaskRequest {
                output_schema_json,
                ..submit("hi".into())
            };
            let text = format!("{{\"description\": \"{}\"}}", "x".repeat(64 * 1024 - 18));
            assert_eq!(text.len(), 64 * 1024 + 1);
            let r = api.submit_task(with_schema(text)).await;
            assert_eq!(
                refused(r),
                over("output_schema_json", 64 * 1024 + 1, 64 * 1024)
            );
            let r = api.submit_task(with_schema("{\"type\": 7}".into())).await;
            assert!(
                refused(r)
                    .1
                    .starts_with("output_schema_json: not a valid JSON schema"),
                "{row}"
            );
        }
        "`ListTasks` page" => {
            // One task over the default page of 100, and an input one byte over a summary's 256.
            let listed = api
                .list_tasks(pb::ListTasksRequest::default())
                .await
                .unwrap()
                .into_inner();
            for _ in listed.tasks.len()..100 {
                api.submit_task(submit("hi".into())).await.unwrap();
            }
            api.submit_task(submit("s".repeat(257))).await.unwrap();
            let page = api
                .list_tasks(pb::ListTasksRequest::default())
                .await
                .unwrap()
                .into_inner();
            assert_eq!(page.tasks.len(), 100, "the default page");
            assert!(!page.next_page_token.is_empty(), "a next page is announced");
            let newest = &page.tasks[0];
            assert!(newest.summary, "{newest:?}");
            assert_eq!(newest.input, format!("{}…", "s".repeat(256)));
            assert_eq!(newest.input_bytes, 257);
            let next = api
                .list_tasks(pb::ListTasksRequest {
                    page_token: page.next_page_token,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert!(!next.tasks.is_empty(), "the 101st task is on the next page");
        }
        "schedules" => {
            let create = |cron: String| pb::CreateScheduleRequest {
                deployment: "runner".into(),
                cron,
                input: "tick".into(),
                ..Default::default()
            };
            let r = api
                .create_schedule(create(format!("0 7 * * *{}", " ".repeat(248))))
                .await;
            assert_eq!(refused(r), over("cron", 257, 256), "{row}");
            let held = api
                .list_schedules(pb::ListSchedulesRequest::default())
                .await
                .unwrap()
                .into_inner()
                .schedules
                .len();
            for _ in held..100 {
                api.create_schedule(create("0 0 1 1 *".into()))
                    .await
                    .unwrap();
            }
            let (code, msg) = refused(api.create_schedule(create("0 0 1 1 *".into())).await);
            assert_eq!(code, Code::ResourceExhausted, "{row}: {msg}");
            assert!(
                msg.starts_with(
                    "schedules: namespace default holds 100 schedules, the limit is 100"
                ),
                "{row}: {msg}"
            );
        }
        "webhooks of a task (URL, count)" => {
            let hooks = |n: usize, url: &str| pb::SubmitTaskRequest {
                webhooks: (0..n)
                    .map(|_| pb::WebhookTarget {
                        url: url.into(),
                        on_waiting: false,
                    })
                    .collect(),
                ..submit("hi".into())
            };
            let long = format!("https://example.com/{}", "p".repeat(2049 - 20));
            let r = api.submit_task(hooks(1, &long)).await;
            assert_eq!(refused(r), over("webhooks[0].url", 2049, 2048), "{row}");
            let r = api.submit_task(hooks(5, "https://example.com/h")).await;
            assert_eq!(
                refused(r),
                invalid("webhooks: 5 webhooks is over the limit of 4 per task"),
                "{row}"
            );
        }
        "A2A request body" => {
            let limit = 2 * MIB + 64 * 1024;
            assert_eq!(
                a2a_post(hub, &padded(limit + 1)).0,
                413,
                "{row}: one byte over"
            );
            assert_ne!(a2a_post(hub, &padded(limit)).0, 413, "{row}: at the limit");
        }
        "web console request body" => {
            let limit = 64 * 1024;
            let sign_in = |n: usize| {
                let pad = n - r#"{"token":""}"#.len();
                console_post(hub, &format!(r#"{{"token":"{}"}}"#, "a".repeat(pad)))
            };
            assert_eq!(sign_in(limit + 1), 413, "{row}: one byte over");
            // At the limit the body is read: an unknown token.
            assert_eq!(sign_in(limit), 401, "{row}: at the limit");
        }
        "A2A `ListTasks` page" => {
            let list = |n: u32| {
                json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": n}})
                    .to_string()
            };
            let (status, body) = a2a_post(hub, &list(100));
            assert!(status == 200 && body["result"].is_object(), "{row}: {body}");
            let (status, body) = a2a_post(hub, &list(101));
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["error"]["code"], -32602, "{row}: {body}");
            assert_eq!(
                body["error"]["message"], "pageSize: expected 1 to 100 tasks, got 101",
                "{row}: {body}"
            );
        }
        "A2A blocking `SendMessage` wait" => {
            let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
                "message": {"messageId": "wait-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
            }})
            .to_string();
            let started = std::time::Instant::now();
            let (status, body) = a2a_post(hub, &send);
            let waited = started.elapsed();
            assert_eq!(status, 200, "{body}");
            assert!(
                waited >= std::time::Duration::from_secs(1)
                    && waited < std::time::Duration::from_secs(30),
                "{row}: answered after {waited:?}"
            );
            // Answered with the task as it is: queued, since no instance can take it.
            assert_eq!(
                body["result"]["task"]["status"]["state"], "TASK_STATE_SUBMITTED",
                "{row}: {body}"
            );
        }
        "gRPC messages" => {
            // A request of exactly 64 MiB + 1 byte, from a client that would send more.
            let max = agen_proto::MAX_MESSAGE_BYTES;
            let mut req = submit(String::new());
            let framing = req.encoded_len() + 1 + 4; // the input's tag and 4-byte length
            req.input = "i".repeat(max + 1 - framing);
            assert_eq!(req.encoded_len(), max + 1);
            let r = api
                .clone()
                .max_encoding_message_size(2 * max)
                .submit_task(req)
                .await;
            assert_eq!(refused(r), over("request", max + 1, max));
        }
        "queued tasks per deployment" => {
            // A deployment of its own with no replicas: its tasks stay queued.
            let digest = api
                .get_deployment(pb::GetDeploymentRequest {
                    namespace: String::new(),
                    name: "runner".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .deployment
                .expect("runner")
                .bundle_digest;
            api.create_deployment(pb::CreateDeploymentRequest {
                name: "queue".into(),
                bundle_digest: digest,
                ..Default::default()
            })
            .await
            .unwrap();
            let queue = |input: &str| pb::SubmitTaskRequest {
                deployment: "queue".into(),
                ..submit(input.into())
            };
            let mut first = String::new();
            for i in 0..150 {
                let t = api.submit_task(queue("q")).await.unwrap().into_inner();
                if i == 0 {
                    first = t.task_id;
                }
            }
            let (code, msg) = refused(api.submit_task(queue("one over")).await);
            assert_eq!(code, Code::ResourceExhausted, "{row}: {msg}");
            assert_eq!(
                msg,
                "queued tasks: deployment default/queue has 150 tasks queued, the limit is 150 per deployment (agen hub --max-queued-tasks); submit again once some have started, or scale the deployment up",
                "{row}"
            );
            // Another deployment's queue is its own; a task leaving the queue makes room.
            api.submit_task(submit("hi".into())).await.unwrap();
            api.cancel_task(pb::CancelTaskRequest {
                namespace: String::new(),
                task_id: first,
                reason: "make room".into(),
            })
            .await
            .unwrap();
            api.submit_task(queue("after a cancel")).await.unwrap();
            let (code, _) = refused(api.submit_task(queue("over again")).await);
            assert_eq!(code, Code::ResourceExhausted, "{row}: full again");
        }
        "resources per instance (`x-agen/config.json` `resources`, `agen deploy --cpu --memory --pids`)" => {
            let digest = api
                .get_deployment(pb::GetDeploymentRequest {
                    namespace: String::new(),
                    name: "runner".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .deployment
                .unwrap()
                .bundle_digest;
            let over = |r: pb::Resources| pb::CreateDeploymentRequest {
                name: "runner".into(),
                bundle_digest: digest.clone(),
                resources: Some(r),
                ..Default::default()
            };
            let r = api
                .create_deployment(over(pb::Resources {
                    pids: 65_537,
                    ..Default::default()
                }))
                .await;
            assert_eq!(
                refused(r),
                invalid("resources.pids: 65537 is out of range; expected 8 to 65536 processes")
            );
            let r = api
                .create_deployment(over(pb::Resources {
                    cpu_millis: 256_001,
                    ..Default::default()
                }))
                .await;
            assert_eq!(
                refused(r),
                invalid("resources.cpu: 256.001 is out of range; expected 0.01 to 256 CPUs (such as 0.5)")
            );
            let r = api
                .create_deployment(over(pb::Resources {
                    memory_bytes: (1 << 40) + 1,
                    ..Default::default()
                }))
                .await;
            assert_eq!(
                refused(r),
                invalid("resources.memory: 1099511627777 bytes is out of range; expected 16Mi to 1Ti (such as \"512Mi\")")
            );
        }
        other => panic!("no case for the row `{other}` of docs/limits.md"),
    }
}

/// A JSON-RPC request of exactly `bytes` bytes (a `GetTask` padded in its id).
fn padded(bytes: usize) -> String {
    let head = r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":""#;
    let tail = r#""}}"#;
    let body = format!(
        "{head}{}{tail}",
        "x".repeat(bytes - head.len() - tail.len())
    );
    assert_eq!(body.len(), bytes);
    body
}

/// POSTs `body` to the deployment `runner`'s A2A endpoint as the admin: the HTTP status and the
/// JSON answer (null when there is none).
/// `POST /ui/api/session` with `body`: the HTTP status.
fn console_post(hub: &HubProcess, body: &str) -> u16 {
    let file = hub.dir.join("console-request.json");
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "-m", "60", "-w", "%{http_code}", "-o", "/dev/null"])
        .arg("--cacert")
        .arg(hub.dir.join("hub/tls/ca.pem"))
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg(format!("{}/ui/api/session", hub.url()))
        .output()
        .expect("curl runs");
    let code = String::from_utf8_lossy(&out.stdout).trim().to_string();
    code.parse()
        .unwrap_or_else(|_| panic!("curl: {code} {}", String::from_utf8_lossy(&out.stderr)))
}

fn a2a_post(hub: &HubProcess, body: &str) -> (u16, serde_json::Value) {
    let file = hub.dir.join("a2a-request.json");
    std::fs::write(&file, body).unwrap();
    let answer = hub.dir.join("a2a-answer.json");
    let _ = std::fs::remove_file(&answer);
    let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "-m", "60", "-w", "%{http_code}", "-o"])
        .arg(&answer)
        .arg("--cacert")
        .arg(hub.dir.join("hub/tls/ca.pem"))
        .args(["-H", &format!("Authorization: Bearer {}", token.trim())])
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg(format!("{}/a2a/default/runner", hub.url()))
        .output()
        .expect("curl runs");
    let code = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let status = code
        .parse()
        .unwrap_or_else(|_| panic!("curl: {code} {}", String::from_utf8_lossy(&out.stderr)));
    let text = std::fs::read_to_string(&answer).unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}
