//! Token streaming end to end: the scripted fake model streams its answer in pieces, the
//! OpenAI-compatible provider reads them over SSE, the instance, the Nest and the Hub relay
//! them (not durable), `WatchTask` with `deltas` sends them coalesced, and `agen submit --wait
//! --stream` prints them. A turn cut off by a kill -9 of the instance is followed by a
//! `delta.reset`, so the text after the last reset is the stored answer. The same holds for
//! the Anthropic provider, reading the fake model's Anthropic Messages events over SSE.

use std::time::Duration;

use agen_proto::v1 as pb;
use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess, NestProcess};
use serde_json::{json, Value};

/// A Hub, one Nest, and deployment `talker` answering `reply` in pieces of `chunk` characters
/// `delay_ms` apart.
fn setup(
    tmp: &std::path::Path,
    reply: &str,
    chunk: u32,
    delay_ms: u32,
) -> (HubProcess, NestProcess, FakeModel) {
    setup_on(tmp, "openai", reply, chunk, delay_ms)
}

/// [`setup`] with the model of `provider` (`openai` or `anthropic`).
fn setup_on(
    tmp: &std::path::Path,
    provider: &str,
    reply: &str,
    chunk: u32,
    delay_ms: u32,
) -> (HubProcess, NestProcess, FakeModel) {
    let hub = HubProcess::start(tmp).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    // Every request the model gets is kept in model/requests.jsonl.
    let script = json!({
        "steps": [{"reply": reply, "chunk_chars": chunk, "chunk_delay_ms": delay_ms}],
        "record": "requests.jsonl",
    });
    let model = FakeModel::start(&tmp.join("model"), &script).unwrap();
    let dir = tmp.join("bundle");
    write_bundle(
        &dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: {provider}/fake-model\nbaseUrl: {}\n---\nYou talk.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "talker"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("the replica healthy", Duration::from_secs(90), |l| {
        l.iter()
            .any(|i| i["deployment"] == "talker" && i["state"] == "running" && i["healthy"] == true)
    })
    .unwrap();
    (hub, nest, model)
}

fn submit(hub: &HubProcess) -> String {
    let out = hub.cli(&["submit", "talker", "speak"]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The `agen instance` processes of a Nest.
fn instance_pids(nest: &NestProcess) -> Vec<u32> {
    nest.descendants()
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').nth(1) == Some("instance")
        })
        .collect()
}

/// Watches `task` with deltas until it ends; calls `on_text` once, at the first text frame.
/// Returns every frame (with the time it came) and the ended task.
fn watch(
    hub: &HubProcess,
    task: &str,
    mut on_text: impl FnMut(),
) -> (Vec<(std::time::Instant, pb::TurnDelta)>, pb::Task) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut api = pb::agen_service_client::AgenServiceClient::new(hub.channel().await.unwrap());
        let req = hub
            .bearer(pb::WatchTaskRequest {
                namespace: "default".into(),
                task_id: task.into(),
                from_seq: 0,
                deltas: true,
            })
            .unwrap();
        let mut events = api.watch_task(req).await.unwrap().into_inner();
        let mut frames = Vec::new();
        let mut called = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let e = tokio::time::timeout_at(deadline, events.message())
                .await
                .expect("the task ends within 120 s")
                .expect("the watch stream")
                .expect("the watch ended before the task did");
            if let Some(d) = e.delta {
                assert_eq!(e.seq, 0, "a delta is not a durable event");
                assert!(e.task.is_none());
                assert_eq!(
                    e.kind,
                    if d.reset {
                        "delta.reset"
                    } else {
                        "model.delta"
                    }
                );
                if !called && !d.text.is_empty() {
                    called = true;
                    on_text();
                }
                frames.push((std::time::Instant::now(), d));
                continue;
            }
            let t = e.task.expect("a durable event carries the task");
            if [
                pb::TaskState::Succeeded,
                pb::TaskState::Failed,
                pb::TaskState::Cancelled,
            ]
            .iter()
            .any(|s| *s as i32 == t.state)
            {
                return (frames, t);
            }
        }
    })
}

/// The text of the frames after the last reset (the reset's own text included).
fn after_last_reset(frames: &[(std::time::Instant, pb::TurnDelta)]) -> String {
    let start = frames.iter().rposition(|(_, d)| d.reset).unwrap_or(0);
    frames[start..]
        .iter()
        .map(|(_, d)| d.text.as_str())
        .collect()
}

#[test]
fn deltas_after_the_last_reset_equal_the_stored_answer_across_a_kill_9_of_the_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let answer: String = (0..60).map(|i| format!("w{i} ")).collect();
    // 60 words in pieces of 4 characters 40 ms apart: the turn streams for seconds.
    let (hub, nest, _model) = setup(tmp.path(), &answer, 4, 40);
    streams_across_a_kill_9(&hub, &nest, &answer);
}

#[test]
fn the_anthropic_provider_streams_to_watchers_and_submit_wait_across_a_kill_9_of_the_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let answer: String = (0..60).map(|i| format!("a{i} ")).collect();
    // `anthropic/…`: the provider posts to {baseUrl}/messages with "stream": true and reads
    // the fake model's message_start / content_block_delta / message_stop events.
    let (hub, nest, _model) = setup_on(tmp.path(), "anthropic", &answer, 4, 40);
    streams_across_a_kill_9(&hub, &nest, &answer);
    // `agen submit --wait --stream` prints the same answer as it is written.
    let out = hub
        .cli(&["submit", "talker", "speak", "--wait", "--stream"])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (task, printed) = stdout
        .split_once('\n')
        .expect("the task id, then the answer");
    assert_eq!(printed, format!("{answer}\n"), "streamed once, whole");
    let stored = hub.cli_json(&["query", task.trim(), "-o", "json"]).unwrap();
    assert_eq!(stored["outcome"]["result"], answer.as_str(), "{stored}");
    // Every model request was a streamed Anthropic Messages request.
    let requests = std::fs::read_to_string(tmp.path().join("model/requests.jsonl")).unwrap();
    let requests: Vec<Value> = requests
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(requests.len() >= 3, "two tasks, one resumed: {requests:?}");
    for r in &requests {
        assert_eq!(r["path"], "/v1/messages", "{r}");
        assert_eq!(r["body"]["stream"], true, "{r}");
    }
}

/// Submits a task, kills its instance at the first streamed text, and checks the deltas a
/// watcher got: attempt 1 streamed, the resumed turn was reset, the text after the last reset
/// is the stored `answer`, frames at most one per 50 ms.
fn streams_across_a_kill_9(hub: &HubProcess, nest: &NestProcess, answer: &str) {
    let task = submit(hub);
    let (frames, end) = watch(hub, &task, || {
        let pids = instance_pids(nest);
        assert_eq!(pids.len(), 1, "one agen instance process: {pids:?}");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pids[0] as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    assert_eq!(end.state, pb::TaskState::Succeeded as i32, "{end:?}");
    assert_eq!(end.attempt, 2, "resumed once after the kill: {end:?}");
    let result = end.outcome.clone().unwrap_or_default().result;
    assert_eq!(result, answer);
    let resets: Vec<&pb::TurnDelta> = frames.iter().map(|(_, d)| d).filter(|d| d.reset).collect();
    assert!(!resets.is_empty(), "the cut turn is reset: {frames:?}");
    assert_eq!(
        (
            resets[resets.len() - 1].attempt,
            resets[resets.len() - 1].turn
        ),
        (2, 1)
    );
    assert!(
        frames
            .iter()
            .any(|(_, d)| d.attempt == 1 && !d.text.is_empty()),
        "attempt 1 streamed before it was killed"
    );
    assert_eq!(after_last_reset(&frames), answer, "frames: {frames:?}");
    // Coalesced: at most one frame per turn every 50 ms (slack for frames that bunch up on
    // their way to this client on a loaded machine, and for the frame sent at once before the
    // turn's `model.answered`).
    let of_attempt_2: Vec<std::time::Instant> = frames
        .iter()
        .filter(|(_, d)| d.attempt == 2)
        .map(|(at, _)| *at)
        .collect();
    let close = of_attempt_2
        .windows(2)
        .filter(|w| w[1].duration_since(w[0]) < Duration::from_millis(35))
        .count();
    assert!(
        close <= 3,
        "frames closer than 50 ms: {close} of {}",
        of_attempt_2.len()
    );
}

#[test]
fn submit_wait_prints_the_answer_as_it_streams_with_control_characters_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    // An escape sequence cut across pieces (3 characters each) and a line break.
    let answer = "one \u{1b}[31mred\u{1b}[0m two\nthree \u{7} four five six seven eight nine ten";
    let (hub, _nest, _model) = setup(tmp.path(), answer, 3, 15);
    let out = hub
        .cli(&["submit", "talker", "speak", "--wait", "--stream"])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (task, printed) = stdout
        .split_once('\n')
        .expect("the task id, then the answer");
    assert!(!task.is_empty());
    assert_eq!(
        printed, "one \\e[31mred\\e[0m two\nthree \\x07 four five six seven eight nine ten\n",
        "streamed once, escaped, no raw control character"
    );
    // `-o json` never streams: stdout is the task as JSON alone.
    let out = hub
        .cli(&[
            "submit", "talker", "speak", "--wait", "--stream", "-o", "json",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("only JSON on stdout");
    assert_eq!(v["state"], "succeeded");
    assert_eq!(v["outcome"]["result"], answer);
}

#[test]
fn a2a_send_streaming_message_streams_the_answer_as_artifact_updates() {
    let mut f = crate::a2a::Fleet::start();
    let answer: String = (0..40).map(|i| format!("word{i} ")).collect();
    f.deploy(
        "talker",
        json!([{"reply": answer, "chunk_chars": 6, "chunk_delay_ms": 30}]),
        &[],
    );
    let token = f.token("default", "submitter", "streamer");
    let r = f.a2a(
        &token,
        "talker",
        json!({"op": "send", "text": "speak", "stream": true}),
    );
    let events = r["events"].as_array().unwrap_or_else(|| panic!("{r}"));
    let mut text = String::new();
    let mut pieces = 0;
    for e in events {
        let a = &e["artifactUpdate"];
        if !a["artifact"]["artifactId"]
            .as_str()
            .is_some_and(|id| id.starts_with("stream-"))
        {
            continue;
        }
        pieces += 1;
        let part = a["artifact"]["parts"][0]["text"]
            .as_str()
            .unwrap_or_default();
        if a["append"] == true {
            text.push_str(part);
        } else {
            text = part.to_owned();
        }
    }
    assert!(pieces >= 2, "the answer came in several pieces: {r}");
    assert_eq!(text, answer, "{r}");
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
}
