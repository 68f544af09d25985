//! The artifact built-ins in the harness, end to end inside one process: a real OpenAI client
//! against the scripted fake model (on 127.0.0.1:0) calls `save_artifact` / `read_artifact`,
//! which store into the standalone file store in a temp folder.
//!
//! What this shows: the id is `sha256:<hex>` of the content and saving the same bytes again
//! gives the same id (one file); long artifacts are read in pages of 4000 characters by
//! default, each page saying the next offset; the 25 MB limit and bad ids come back to the
//! model as clear tool errors; the tools are offered without config, and `report_progress`
//! only in a fleet.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use agen_fake_model::{FakeModel, Script, Step};
use agen_harness::artifacts::{artifact_id, LocalArtifacts, MAX_ARTIFACT_BYTES};
use agen_harness::mcp::{LaunchContext, ToolHost};
use agen_harness::{
    Harness, RunAssignment as RunRequest, RunEventBody, RunEventSink, RunOutcome, SinkError,
};
use agen_shared::bundle::Bundle;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct MemorySink {
    events: Mutex<Vec<(String, Value)>>,
}

#[async_trait::async_trait]
impl RunEventSink for MemorySink {
    async fn emit(&self, body: RunEventBody, _sync: bool) -> Result<(), SinkError> {
        self.events
            .lock()
            .unwrap()
            .push((body.kind().to_string(), body.to_json()));
        Ok(())
    }
}

impl MemorySink {
    fn of_kind(&self, kind: &str) -> Vec<Value> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

fn bundle(dir: &Path, base_url: &str) -> Arc<Bundle> {
    let agent = dir.join("x-agen/agent.md");
    std::fs::create_dir_all(agent.parent().unwrap()).unwrap();
    std::fs::write(
        &agent,
        format!("---\nmodel: openai/m\nbaseUrl: {base_url}\n---\nYou are a test agent.\n"),
    )
    .unwrap();
    Arc::new(Bundle::load(dir).unwrap())
}

fn request() -> RunRequest {
    RunRequest {
        run_id: "run-1".into(),
        attempt: 1,
        task_id: "task-1".into(),
        namespace: "default".into(),
        deployment: "helper".into(),
        input: "write the report".into(),
        conversation_id: "conv-1".into(),
        root_run_id: "run-1".into(),
        delegation_depth: 0,
        ..Default::default()
    }
}

/// Runs `steps` with artifacts stored under `store_dir`; returns the outcome, the events and
/// the fake model (for what it was sent).
async fn run(
    steps: Vec<Step>,
    store_dir: &Path,
    progress: bool,
) -> (RunOutcome, Arc<MemorySink>, FakeModel) {
    let model = FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle(dir.path(), &model.openai_base_url());
    let host = ToolHost::start(&bundle, LaunchContext::new("/nonexistent/agen")).await;
    let harness = Harness::new(
        bundle,
        Arc::new(host),
        &BTreeMap::new(),
        reqwest::Client::new(),
    )
    .unwrap()
    .with_progress(progress)
    .with_artifacts(Arc::new(LocalArtifacts::new(store_dir)));
    let sink = Arc::new(MemorySink::default());
    let outcome = harness
        .run(request(), sink.clone(), CancellationToken::new())
        .await;
    (outcome, sink, model)
}

/// The tool results the model saw, in order.
fn tool_results(outcome: &RunOutcome) -> Vec<String> {
    outcome
        .messages
        .iter()
        .map(|m| m.to_json())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

/// 9,000 characters, some of them multi-byte, so pages are counted in characters.
fn long_report() -> String {
    (0..900).map(|i| format!("line {i:03}é\n")).collect()
}

#[tokio::test]
async fn saved_artifacts_are_read_back_in_pages_and_the_same_bytes_keep_one_id() {
    let report = long_report();
    assert_eq!(report.chars().count(), 9000);
    let id = artifact_id(report.as_bytes());
    let store = tempfile::tempdir().unwrap();
    let (outcome, sink, model) = run(
        vec![
            Step::call(
                "save_artifact",
                json!({"name": "weekly-report", "content": report, "mediaType": "text/markdown"}),
            ),
            Step::call(
                "save_artifact",
                json!({"name": "weekly-report-again", "content": report}),
            ),
            Step::call("read_artifact", json!({"id": id})),
            Step::call("read_artifact", json!({"id": id, "offset": 4000})),
            Step::call(
                "read_artifact",
                json!({"id": id, "offset": 8000, "length": 4000}),
            ),
            Step::reply("saved and read"),
        ],
        store.path(),
        false,
    )
    .await;
    assert_eq!(outcome.result, "saved and read");

    let chars: Vec<char> = report.chars().collect();
    let slice = |a: usize, b: usize| chars[a..b].iter().collect::<String>();
    assert_eq!(
        tool_results(&outcome),
        vec![
            id.clone(),
            id.clone(),
            format!(
                "{}\n[characters 0..4000 of 9000; more follows: call read_artifact with offset 4000]",
                slice(0, 4000)
            ),
            format!(
                "{}\n[characters 4000..8000 of 9000; more follows: call read_artifact with offset 8000]",
                slice(4000, 8000)
            ),
            format!(
                "{}\n[characters 8000..9000 of 9000; end of artifact]",
                slice(8000, 9000)
            ),
        ]
    );

    // One blob and its metadata: the second save was free.
    let ns_dir = store.path().join("default");
    let mut files: Vec<String> = std::fs::read_dir(&ns_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let hex = id.trim_start_matches("sha256:");
    assert_eq!(files, vec![hex.to_string(), format!("{hex}.json")]);
    assert_eq!(std::fs::read(ns_dir.join(hex)).unwrap(), report.as_bytes());

    let saved = sink.of_kind("artifact.saved");
    assert_eq!(
        saved[0],
        json!({"id": id, "name": "weekly-report", "media_type": "text/markdown", "size": report.len()})
    );
    assert_eq!(saved.len(), 2, "each save is in the run log");

    // Offered with no config at all; report_progress only in a fleet.
    let offered: Vec<String> = model.requests()[0]["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(offered, vec!["finish", "save_artifact", "read_artifact"]);
}

/// The 25 MB limit is checked before anything is stored. (Through the fake model a 25 MB
/// argument would be echoed back in the next request, past its body limit, so the store is
/// called the way the harness calls it.)
#[tokio::test]
async fn an_artifact_over_25_mb_is_refused_with_a_clear_error() {
    use agen_harness::artifacts::{ArtifactStore, NewArtifact};
    let store_dir = tempfile::tempdir().unwrap();
    let store = LocalArtifacts::new(store_dir.path());
    let err = store
        .save(NewArtifact {
            namespace: "default".into(),
            task_id: "t".into(),
            run_id: "r".into(),
            name: "huge".into(),
            media_type: "text/plain".into(),
            content: vec![b'x'; MAX_ARTIFACT_BYTES as usize + 1],
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "artifact huge is 25000001 bytes, more than the limit of 25 MB per artifact; save it in smaller parts or save a summary"
    );
    assert!(
        !store_dir.path().join("default").exists(),
        "nothing was stored"
    );
}

#[tokio::test]
async fn bad_arguments_and_bad_ids_are_clear_tool_errors_and_the_run_goes_on() {
    let missing = artifact_id(b"never saved");
    let store = tempfile::tempdir().unwrap();
    let (outcome, _sink, _model) = run(
        vec![
            Step::calls(vec![
                ("save_artifact", json!({"content": "no name"})),
                ("read_artifact", json!({"id": "report.txt"})),
                ("read_artifact", json!({"id": missing})),
                ("read_artifact", json!({"id": missing, "offset": "soon"})),
            ]),
            Step::reply("gave up"),
        ],
        store.path(),
        true,
    )
    .await;
    assert_eq!(outcome.result, "gave up");
    assert_eq!(
        tool_results(&outcome),
        vec![
            "save_artifact needs `name`: a short name for the artifact, e.g. weekly-report".to_string(),
            "read_artifact failed: artifact id \"report.txt\" is not valid: expected sha256:<64 lowercase hex digits>, as save_artifact returns".to_string(),
            format!("read_artifact failed: artifact {missing} not found in this namespace; use an id that save_artifact returned"),
            "read_artifact: `offset` must be a whole number of characters, got \"soon\"".to_string(),
        ]
    );
    assert!(!store.path().join("default").exists(), "nothing was stored");
}

/// A long save is logged by id only (the run log and the conversation never carry the content
/// twice), and a resumed run whose log holds only that id answers the call from the store.
#[tokio::test]
async fn long_saves_are_logged_by_id_and_a_resumed_run_finds_the_artifact() {
    let long = "a long chapter. ".repeat(4000);
    let id = artifact_id(long.as_bytes());
    let store = tempfile::tempdir().unwrap();
    let steps = vec![
        Step::call("save_artifact", json!({"name": "chapter", "content": long})),
        Step::template("{{last_tool_result}}"),
    ];
    let (outcome, sink, _model) = run(steps.clone(), store.path(), false).await;
    assert_eq!(outcome.result, id);

    let reference = json!({"name": "chapter", "content_artifact": id, "content_bytes": long.len()});
    let answered = sink.of_kind("model.answered");
    assert_eq!(
        answered[0]["message"]["tool_calls"][0]["arguments"],
        reference
    );
    let assistant = outcome
        .messages
        .iter()
        .map(|m| m.to_json())
        .find(|m| m["role"] == "assistant")
        .unwrap();
    assert_eq!(assistant["tool_calls"][0]["arguments"], reference);
    assert_eq!(sink.of_kind("tool.completed")[0]["result"], json!(id));

    // Resume as if the instance died right after the model answered (nothing after it is in
    // the log): the call is answered from the store, not saved from a lost content.
    let replay: Vec<RunEventBody> = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .take_while(|(k, _)| k != "tool.started")
        .map(|(kind, json)| RunEventBody::from_parts(kind, json.clone()).unwrap())
        .collect();
    assert_eq!(replay.last().unwrap().kind(), "model.answered");
    let model = FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bundle = bundle(dir.path(), &model.openai_base_url());
    let host = ToolHost::start(&bundle, LaunchContext::new("/nonexistent/agen")).await;
    let harness = Harness::new(
        bundle,
        Arc::new(host),
        &BTreeMap::new(),
        reqwest::Client::new(),
    )
    .unwrap()
    .with_artifacts(Arc::new(LocalArtifacts::new(store.path())));
    let mut req = request();
    req.attempt = 2;
    req.replay = replay.clone();
    let resumed = harness
        .run(
            req.clone(),
            Arc::new(MemorySink::default()),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(resumed.result, id);

    // Against an empty store the content is gone, and the model is told to save again.
    let empty = tempfile::tempdir().unwrap();
    let model = FakeModel::start(
        Script::steps(vec![Step::template("{{last_tool_result}}")]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let bundle = self::bundle(dir.path(), &model.openai_base_url());
    let host = ToolHost::start(&bundle, LaunchContext::new("/nonexistent/agen")).await;
    let harness = Harness::new(
        bundle,
        Arc::new(host),
        &BTreeMap::new(),
        reqwest::Client::new(),
    )
    .unwrap()
    .with_artifacts(Arc::new(LocalArtifacts::new(empty.path())));
    let lost = harness
        .run(
            req,
            Arc::new(MemorySink::default()),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(
        lost.result,
        "save_artifact was interrupted before its content was stored, and the run log keeps only its digest; call save_artifact again with the content"
    );
}
