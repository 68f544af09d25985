//! OpenTelemetry export (issue 22): a Hub started with `--otlp-endpoint` sends each finished
//! task's trace to a real OTLP receiver (PyPI `grpcio` + `opentelemetry-proto`), over gRPC,
//! over HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`) and over TLS verified with a test CA
//! (`OTEL_EXPORTER_OTLP_CERTIFICATE`), with the ids `agen trace` shows,
//! the GenAI attributes, the tool span the MCP server's `_meta` `traceparent` named, a caller's
//! `traceparent` (the field and the gRPC metadata header) adopted, and `traceToolArguments`
//! arguments of a built-in call (each cut at 4 KiB by itself, secrets redacted). Spans leave as
//! they end (issue 42): a task waiting for an approval already shows its model turns and tool
//! calls at the receiver, named and attributed per the GenAI semantic conventions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agen_proto::v1 as pb;
use agen_tests::{
    free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers, Proc,
};
use serde_json::{json, Value};

/// The receiver process (`otlp_receiver.py` with `args`: `--http`, `--tls CERT KEY`), the
/// file it writes spans to and its port.
fn receiver(dir: &Path, args: &[String]) -> (Proc, PathBuf, u16) {
    let out = dir.join("spans.jsonl");
    let port_file = dir.join("otlp.port");
    let mut cmd = Command::new(Peers::python());
    cmd.arg(Peers::script("servers/otlp_receiver.py"))
        .arg(&out)
        .arg(&port_file)
        .args(args);
    let proc = Proc::spawn("otlp", cmd, &dir.join("otlp.log")).unwrap();
    let port = wait_for("the OTLP receiver's port", Duration::from_secs(30), || {
        std::fs::read_to_string(&port_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .unwrap();
    (proc, out, port)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

struct Fleet {
    _tmp: tempfile::TempDir,
    receiver: Proc,
    spans: PathBuf,
    hub: HubProcess,
    _nest: NestProcess,
    model: FakeModel,
    meta_log: PathBuf,
}

/// How a test's fleet differs from the plain one (gRPC export, no secrets).
#[derive(Default)]
struct Setup {
    /// `otlp_receiver.py` flags.
    receiver: Vec<String>,
    /// `https` instead of `http` in `--otlp-endpoint`.
    tls: bool,
    /// More environment variables of the Hub (`OTEL_EXPORTER_OTLP_*`).
    hub_env: Vec<(String, String)>,
    /// More environment variables of the Nest.
    nest_env: Vec<(String, String)>,
    /// More environment variables of the meta tool server (`${SECRET}` references).
    server_env: Vec<(String, String)>,
    /// `x-agen/secrets.json`, when the bundle declares secrets.
    secrets: Option<Value>,
    /// `x-agen/config.json`, when the bundle has one.
    config: Option<Value>,
}

fn fleet(script: Value, harness: Value) -> Fleet {
    fleet_with(script, harness, |_| Setup::default())
}

/// A Hub exporting to a receiver, one Nest, the fake model running `script` and a `meta`
/// deployment of the meta tool server with `harness`; `setup` (given the test's dir) says
/// what differs.
fn fleet_with(script: Value, harness: Value, setup: impl FnOnce(&Path) -> Setup) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let s = setup(tmp.path());
    let (receiver, spans, port) = receiver(tmp.path(), &s.receiver);
    let scheme = if s.tls { "https" } else { "http" };
    let endpoint = format!("{scheme}://127.0.0.1:{port}");

    let hub_env: Vec<(&str, &str)> = s
        .hub_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let hub = HubProcess::start_with_env(
        tmp.path(),
        free_port(),
        "3s",
        &["--otlp-endpoint", &endpoint],
        &hub_env,
    )
    .unwrap();
    let nest_env: Vec<(&str, &str)> = s
        .nest_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let nest = hub.nest("solo", &[], &nest_env).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let meta_log = tmp.path().join("meta.jsonl");
    let mut env = json!({"META_LOG": meta_log});
    for (k, v) in &s.server_env {
        env[k] = json!(v);
    }
    let dir = tmp.path().join("bundle");
    let mut files = vec![
        (
            "mcp.json",
            mcp_json(&[(
                "meta",
                json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": env}),
            )]),
        ),
        (
            "x-agen/agent.md",
            format!(
                "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nMeta.\n",
                model.base_url()
            ),
        ),
        ("x-agen/harness.json", harness.to_string()),
    ];
    if let Some(secrets) = &s.secrets {
        files.push(("x-agen/secrets.json", secrets.to_string()));
    }
    if let Some(config) = &s.config {
        files.push(("x-agen/config.json", config.to_string()));
    }
    write_bundle(&dir, &files).unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "meta", "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fleet {
        _tmp: tmp,
        receiver,
        spans,
        hub,
        _nest: nest,
        model,
        meta_log,
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// Submits `meta go` with the CLI and waits for it to succeed; its id.
fn submit(f: &Fleet, extra: &[&str]) -> String {
    let mut args = vec!["submit", "meta", "go"];
    args.extend_from_slice(extra);
    let out = f.hub.cli(&args).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = f.hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    task
}

/// `agen trace TASK -o json`, and the spans the receiver got for `task` once all of them
/// arrived (export runs in the background).
fn exported(f: &Fleet, task: &str) -> (Value, Vec<Value>) {
    let trace = f.hub.cli_json(&["trace", task, "-o", "json"]).unwrap();
    let want = trace["spans"].as_array().unwrap().len();
    let spans = wait_for("the exported trace", Duration::from_secs(30), || {
        let got: Vec<Value> = lines(&f.spans)
            .into_iter()
            .filter(|s| attr(s, "agen.task_id") == task)
            .collect();
        (got.len() >= want).then_some(got)
    })
    .unwrap_or_else(|e| panic!("{e}; receiver log:\n{}", f.receiver.log_text()));
    assert_eq!(spans.len(), want, "one export per finished task: {spans:?}");
    (trace, spans)
}

/// The `_meta` of each `echo` call the meta server recorded whose traceparent is in `trace_id`.
fn echo_metas(f: &Fleet, trace_id: &str) -> Vec<Value> {
    lines(&f.meta_log)
        .into_iter()
        .filter(|e| {
            e["tool"] == "echo"
                && e["meta"]["traceparent"]
                    .as_str()
                    .is_some_and(|t| t.contains(trace_id))
        })
        .map(|e| e["meta"].clone())
        .collect()
}

/// The whole structure of an exported `meta_echo` run: GetTrace's ids, one root
/// (`invoke_agent`), two `chat` turns and one `execute_tool` under it with the GenAI
/// attributes, and the tool server told the tool span. Returns the exported spans.
fn assert_exported_echo_run(f: &Fleet, task: &str) -> Vec<Value> {
    let (trace, spans) = exported(f, task);
    let trace_id = trace["trace_id"].as_str().unwrap();
    for s in &spans {
        assert_eq!(s["trace_id"], trace_id, "{s}");
        assert_eq!(s["resource"]["service.name"], "agen-hub", "{s}");
        assert_eq!(attr(s, "agen.namespace"), "default", "{s}");
        assert_eq!(attr(s, "agen.deployment"), "meta", "{s}");
        assert_eq!(attr(s, "agen.attempt"), 1, "{s}");
        assert!(s["end"].as_u64() >= s["start"].as_u64(), "{s}");
    }
    // The ids are GetTrace's.
    let mut ours: Vec<String> = trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["span_id"].as_str().unwrap().to_string())
        .collect();
    let mut theirs: Vec<String> = spans
        .iter()
        .map(|s| s["span_id"].as_str().unwrap().to_string())
        .collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    let roots: Vec<&Value> = spans.iter().filter(|s| s["parent_span_id"] == "").collect();
    assert_eq!(roots.len(), 1, "{spans:?}");
    let root = roots[0];
    assert_eq!(attr(root, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(root["status"]["code"], 1, "a succeeded run is ok: {root}");
    let chats: Vec<&Value> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name") == "chat")
        .collect();
    assert_eq!(chats.len(), 2, "two model turns: {spans:?}");
    for c in &chats {
        assert_eq!(c["parent_span_id"], root["span_id"], "{c}");
        assert_eq!(attr(c, "gen_ai.provider.name"), "openai", "{c}");
        assert_eq!(attr(c, "gen_ai.request.model"), "fake-model", "{c}");
        assert_eq!(attr(c, "gen_ai.usage.input_tokens"), 0, "{c}");
        assert_eq!(attr(c, "gen_ai.usage.output_tokens"), 0, "{c}");
        assert_eq!(c["name"], "chat fake-model");
    }
    let tools: Vec<&Value> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name") == "execute_tool")
        .collect();
    assert_eq!(tools.len(), 1, "{spans:?}");
    let tool = tools[0];
    assert_eq!(tool["parent_span_id"], root["span_id"], "{tool}");
    assert_eq!(attr(tool, "gen_ai.tool.name"), "meta.echo", "{tool}");
    assert!(
        attr(tool, "gen_ai.tool.call.id")
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{tool}"
    );
    assert_eq!(tool["status"]["code"], 1, "{tool}");
    // The tool server was told this span.
    let metas = echo_metas(f, trace_id);
    assert_eq!(metas.len(), 1, "{metas:?}");
    assert_eq!(
        metas[0]["traceparent"],
        format!(
            "00-{}-{}-01",
            tool["trace_id"].as_str().unwrap(),
            tool["span_id"].as_str().unwrap()
        )
    );
    spans
}

fn echo_script() -> Value {
    json!({"steps": [
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "hi"}}]},
        {"reply": "done"}
    ]})
}

#[test]
fn a_finished_task_is_exported_over_otlp_with_its_trace_ids_and_genai_attributes() {
    let f = fleet(echo_script(), json!({"traceToolArguments": true}));
    let task = submit(&f, &[]);
    let spans = assert_exported_echo_run(&f, &task);
    assert!(spans.iter().all(|s| s["transport"] == "grpc"), "{spans:?}");
    // traceToolArguments: the span carries them.
    let tool = spans
        .iter()
        .find(|s| attr(s, "gen_ai.operation.name") == "execute_tool")
        .unwrap();
    let args: Value =
        serde_json::from_str(attr(tool, "gen_ai.tool.call.arguments").as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"text": "hi"}), "{tool}");
}

#[test]
fn otlp_http_protobuf_exports_the_same_trace_to_post_v1_traces() {
    let f = fleet_with(echo_script(), json!({}), |_| Setup {
        receiver: vec!["--http".into()],
        hub_env: vec![
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into()),
            ("OTEL_EXPORTER_OTLP_HEADERS".into(), "x-tenant=blue".into()),
        ],
        ..Setup::default()
    });
    let task = submit(&f, &[]);
    let spans = assert_exported_echo_run(&f, &task);
    for s in &spans {
        assert_eq!(s["transport"], "http", "{s}");
        assert_eq!(s["path"], "/v1/traces", "{s}");
        assert_eq!(
            s["metadata"]["content-type"], "application/x-protobuf",
            "{s}"
        );
        assert_eq!(s["metadata"]["x-tenant"], "blue", "{s}");
    }
    // No arguments unless the bundle asks for them.
    assert!(
        spans
            .iter()
            .all(|s| attr(s, "gen_ai.tool.call.arguments").is_null()),
        "{spans:?}"
    );
}

/// Submits `meta go` straight over gRPC (no CLI in between), with `traceparent` only as the
/// W3C gRPC metadata header; the task's id.
fn submit_with_header(hub: &HubProcess, traceparent: &str) -> String {
    agen_shared::tls::install_crypto_provider();
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(hub.url())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut api = pb::agen_service_client::AgenServiceClient::new(channel);
        let mut req = tonic::Request::new(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "meta".into(),
            input: "go".into(),
            ..Default::default()
        });
        let md = req.metadata_mut();
        md.insert(
            "authorization",
            format!("Bearer {}", token.trim()).parse().unwrap(),
        );
        md.insert("traceparent", traceparent.parse().unwrap());
        api.submit_task(req).await.unwrap().into_inner().task_id
    })
}

/// `task` ran as a child of the caller's span: every exported span is in the caller's trace,
/// the run span's parent is the caller's span, and the tool server's `_meta` traceparent is
/// the tool span in that trace.
fn assert_child_of(f: &Fleet, task: &str, caller_trace: &str, caller_span: &str) {
    let t = f.hub.cli_json(&["wait", task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let (trace, spans) = exported(f, task);
    assert_eq!(trace["trace_id"], caller_trace, "{trace}");
    assert!(
        spans.iter().all(|s| s["trace_id"] == caller_trace),
        "{spans:?}"
    );
    let root = spans
        .iter()
        .find(|s| attr(s, "gen_ai.operation.name") == "invoke_agent")
        .unwrap();
    assert_eq!(root["parent_span_id"], caller_span, "{root}");
    let tool = spans
        .iter()
        .find(|s| attr(s, "gen_ai.operation.name") == "execute_tool")
        .unwrap();
    assert_eq!(tool["parent_span_id"], root["span_id"], "{tool}");
    let metas = echo_metas(f, caller_trace);
    assert_eq!(metas.len(), 1, "{metas:?}");
    assert_eq!(
        metas[0]["traceparent"],
        format!("00-{caller_trace}-{}-01", tool["span_id"].as_str().unwrap())
    );
}

#[test]
fn a_callers_traceparent_field_or_header_makes_the_run_a_child_of_its_trace() {
    let f = fleet(echo_script(), json!({}));
    // The field (agen submit --traceparent).
    let (caller_trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let task = submit(
        &f,
        &[
            "--traceparent",
            &format!("00-{caller_trace}-{caller_span}-01"),
        ],
    );
    assert_child_of(&f, &task, caller_trace, caller_span);
    // The gRPC metadata header, from a plain gRPC client that does not set the field.
    let (header_trace, header_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let task = submit_with_header(&f.hub, &format!("00-{header_trace}-{header_span}-01"));
    assert_child_of(&f, &task, header_trace, header_span);
    // A malformed header is ignored (W3C): the task runs in a trace of its own.
    let task = submit_with_header(&f.hub, "00-nothex-01");
    let t = f.hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let (trace, spans) = exported(&f, &task);
    let own = trace["trace_id"].as_str().unwrap();
    assert!(
        own.len() == 32 && own != caller_trace && own != header_trace,
        "{trace}"
    );
    assert!(spans.iter().all(|s| s["trace_id"] == own), "{spans:?}");
    // A malformed field is refused with the field named, and creates no task.
    let bad = f
        .hub
        .cli(&["submit", "meta", "go", "--traceparent", "00-nothex-01"])
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("traceparent"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let tasks = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(tasks.as_array().map(Vec::len), Some(3), "{tasks}");
}

/// A secret the Nest holds, that the model repeats in a built-in call's argument.
const SECRET: &str = "tok-9c1f4e7a2b";

#[test]
fn a_builtin_calls_arguments_are_recorded_each_cut_at_4_kib_and_redacted() {
    let long = format!("token {SECRET}; {}", "x".repeat(6000));
    let script = json!({"steps": [
        {"tool_calls": [{"name": "save_artifact", "arguments": {
            "name": "notes.txt", "media_type": "text/plain", "content": long
        }}]},
        {"reply": "saved"}
    ]});
    let f = fleet_with(script, json!({"traceToolArguments": true}), |_| Setup {
        nest_env: vec![("OTLP_TEST_TOKEN".into(), SECRET.into())],
        server_env: vec![("TOKEN".into(), "${API_TOKEN}".into())],
        secrets: Some(json!({"API_TOKEN": {"source": "env", "var": "OTLP_TEST_TOKEN"}})),
        ..Setup::default()
    });
    let task = submit(&f, &[]);
    let (trace, spans) = exported(&f, &task);
    // GetTrace / agen trace -o json: the built-in's span carries its arguments.
    let ours = trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["attributes"]["tool"] == "save_artifact")
        .unwrap_or_else(|| panic!("no save_artifact span: {trace}"));
    let recorded = ours["attributes"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(recorded).unwrap();
    // Each argument is cut by itself: the short ones are whole after the long one.
    assert_eq!(args["name"], "notes.txt", "{args}");
    assert_eq!(args["media_type"], "text/plain", "{args}");
    let content = args["content"].as_str().unwrap();
    assert!(
        content.starts_with("token [redacted]; xxx") && content.ends_with("… (cut at 4 KiB)"),
        "{content}"
    );
    assert!(content.len() < 4200, "{}", content.len());
    // The exported span carries the same text.
    let tool = spans
        .iter()
        .find(|s| attr(s, "gen_ai.tool.name") == "save_artifact")
        .unwrap_or_else(|| panic!("no save_artifact span exported: {spans:?}"));
    assert_eq!(attr(tool, "gen_ai.operation.name"), "execute_tool");
    assert_eq!(attr(tool, "gen_ai.tool.call.arguments"), recorded, "{tool}");
    assert_eq!(tool["status"]["code"], 1, "{tool}");
    // agen trace --events prints them too.
    let out = f.hub.cli(&["trace", &task, "--events"]).unwrap();
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{events}");
    assert!(
        events.contains("save_artifact") && events.contains("[redacted]"),
        "{events}"
    );
    // The secret is nowhere the trace went.
    let mut leaks = 0;
    for text in [
        trace.to_string(),
        std::fs::read_to_string(&f.spans).unwrap(),
        events.to_string(),
    ] {
        leaks += text.matches(SECRET).count();
    }
    assert_eq!(leaks, 0, "the secret leaked into a trace");
}

/// A test CA in `dir` and a server certificate it signed for `127.0.0.1` / `localhost`:
/// (the CA's PEM file, the server chain's, the server key's).
fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let tls = agen_shared::tls::load_or_create_hub_tls(dir, &[]).unwrap();
    let chain = dir.join("server-chain.pem");
    let key = dir.join("server.key");
    std::fs::write(&chain, &tls.server_chain_pem).unwrap();
    std::fs::write(&key, &tls.server_key_pem).unwrap();
    (tls.ca_file, chain, key)
}

#[test]
fn otlp_over_tls_grpc_and_http_trust_the_configured_ca_and_only_it() {
    let mut certs = None;
    let f = fleet_with(echo_script(), json!({}), |dir| {
        let (ca, chain, key) = test_ca(&dir.join("otlp-ca"));
        certs = Some((dir.to_owned(), ca.clone(), chain.clone(), key.clone()));
        Setup {
            receiver: vec![
                "--tls".into(),
                chain.to_string_lossy().into_owned(),
                key.to_string_lossy().into_owned(),
            ],
            tls: true,
            hub_env: vec![(
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE".into(),
                ca.to_string_lossy().into_owned(),
            )],
            ..Setup::default()
        }
    });
    let task = submit(&f, &[]);
    let spans = assert_exported_echo_run(&f, &task);
    assert!(spans.iter().all(|s| s["transport"] == "grpc"), "{spans:?}");

    // Without the CA file the system roots are used, and they do not trust the test CA: the
    // export is refused (a warning naming the task), nothing arrives, the task is unharmed.
    let mut f = f;
    f.hub.extra_env.clear();
    f.hub.restart().unwrap();
    wait_for("the nest back", Duration::from_secs(30), || {
        f.hub
            .nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == "solo" && n["state"] == "ready")
            .then_some(())
    })
    .unwrap();
    let untrusted = submit(&f, &[]);
    let warning = wait_for(
        "the refused export's warning",
        Duration::from_secs(30),
        || {
            f.hub
                .proc
                .log_text()
                .lines()
                .find(|l| l.contains(&format!("OTLP export of task {untrusted}")))
                .map(str::to_owned)
        },
    )
    .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", f.hub.proc.log_text()));
    assert!(
        warning.contains("certificate") && warning.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "the warning says why and what to set: {warning}"
    );
    let arrived = lines(&f.spans)
        .iter()
        .filter(|s| attr(s, "agen.task_id") == untrusted.as_str())
        .count();
    assert_eq!(
        arrived, 0,
        "spans exported to a collector the Hub must not trust"
    );

    // OTLP/HTTP to an https:// receiver: the same CA file is what reqwest trusts.
    let (dir, ca, chain, key) = certs.unwrap();
    let http_dir = dir.join("otlp-https");
    std::fs::create_dir_all(&http_dir).unwrap();
    let tls_args = [
        "--http".to_string(),
        "--tls".into(),
        chain.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    ];
    let (_https_receiver, https_spans, port) = receiver(&http_dir, &tls_args);
    f.hub.extra_args = vec![
        "--otlp-endpoint".into(),
        format!("https://127.0.0.1:{port}"),
    ];
    f.hub.extra_env = vec![
        ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into()),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE".into(),
            ca.to_string_lossy().into_owned(),
        ),
    ];
    f.hub.restart().unwrap();
    wait_for("the nest back", Duration::from_secs(30), || {
        f.hub
            .nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == "solo" && n["state"] == "ready")
            .then_some(())
    })
    .unwrap();
    let over_https = submit(&f, &[]);
    let want = f
        .hub
        .cli_json(&["trace", &over_https, "-o", "json"])
        .unwrap()["spans"]
        .as_array()
        .unwrap()
        .len();
    let got = wait_for("the trace over https", Duration::from_secs(30), || {
        let got: Vec<Value> = lines(&https_spans)
            .into_iter()
            .filter(|s| attr(s, "agen.task_id") == over_https.as_str())
            .collect();
        (got.len() >= want).then_some(got)
    })
    .unwrap_or_else(|e| panic!("{e}; hub log:\n{}", f.hub.proc.log_text()));
    assert!(
        got.iter()
            .all(|s| s["transport"] == "http" && s["path"] == "/v1/traces"),
        "{got:?}"
    );

    // A CA file that cannot be read stops the Hub at start, naming the file.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ca.pem");
    let mut cmd = Command::new(agen_tests::agen_bin());
    cmd.args(["hub", "--data-dir"])
        .arg(dir.path().join("hub"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--otlp-endpoint", "https://127.0.0.1:4317"])
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", &missing)
        .env("AGEN_CONFIG", dir.path().join("client.toml"));
    let mut hub = Proc::spawn("bad-hub", cmd, &dir.path().join("hub.log")).unwrap();
    let status = wait_for(
        "the hub to refuse to start",
        Duration::from_secs(30),
        || hub.child.try_wait().ok().flatten(),
    )
    .unwrap();
    assert!(!status.success());
    let log = hub.log_text();
    assert!(
        log.contains("no-such-ca.pem") && log.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        "{log}"
    );
}

/// The spans the receiver has for `task` so far.
fn spans_of(f: &Fleet, task: &str) -> Vec<Value> {
    lines(&f.spans)
        .into_iter()
        .filter(|s| attr(s, "agen.task_id") == task)
        .collect()
}

#[test]
fn a_waiting_tasks_spans_reach_the_receiver_before_it_ends_named_per_genai() {
    // Turn 1: an echo and a call of a tool that does not exist; turn 2: a call that needs an
    // approval; then the answer.
    let script = json!({"steps": [
        {"tool_calls": [
            {"name": "meta_echo", "arguments": {"text": "hi"}},
            {"name": "nosuch_tool", "arguments": {}}
        ]},
        {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 0}}]},
        {"reply": "done"}
    ]});
    let f = fleet_with(script, json!({}), |_| Setup {
        config: Some(json!({"permissions": {"ask": ["meta.slow"]}})),
        ..Setup::default()
    });
    let out = f
        .hub
        .cli(&["submit", "meta", "go", "--conversation", "otlp-talk"])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    wait_for("the pending approval", Duration::from_secs(60), || {
        let list = f.hub.cli_json(&["approvals", "-o", "json"]).ok()?;
        list.as_array()?
            .iter()
            .any(|a| a["task"] == task.as_str())
            .then_some(())
    })
    .unwrap();

    // While it waits: both model turns and both finished calls are at the receiver.
    let early = wait_for("the spans so far", Duration::from_secs(30), || {
        let got = spans_of(&f, &task);
        let ops = |op: &str| {
            got.iter()
                .filter(|s| attr(s, "gen_ai.operation.name") == op)
                .count()
        };
        (ops("chat") == 2 && ops("execute_tool") == 2).then_some(got)
    })
    .unwrap_or_else(|e| panic!("{e}; got {:?}", spans_of(&f, &task)));
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "waiting", "the task has not ended: {q}");
    assert_eq!(early.len(), 4, "nothing still open is exported: {early:?}");
    let port = f
        .model
        .base_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse::<i64>().ok())
        .unwrap();
    for s in &early {
        assert_eq!(s["resource"]["service.name"], "agen-hub", "{s}");
        assert_eq!(s["resource"]["service.namespace"], "default", "{s}");
        assert!(
            s["resource"]["service.instance.id"]
                .as_str()
                .is_some_and(|i| i.len() == 36),
            "{s}"
        );
        assert!(
            s["resource"]["host.name"]
                .as_str()
                .is_some_and(|h| !h.is_empty()),
            "{s}"
        );
        if attr(s, "gen_ai.operation.name") == "chat" {
            assert_eq!(s["name"], "chat fake-model", "{s}");
            assert_eq!(s["kind"], 3, "a model call is a client span: {s}");
            assert_eq!(attr(s, "gen_ai.request.model"), "fake-model", "{s}");
            assert_eq!(attr(s, "gen_ai.response.model"), "fake-model", "{s}");
            assert!(
                attr(s, "gen_ai.response.id")
                    .as_str()
                    .is_some_and(|i| i.starts_with("chatcmpl-fake-")),
                "{s}"
            );
            assert!(
                attr(s, "gen_ai.response.finish_reasons")
                    .as_str()
                    .is_some_and(|r| r.contains("\"tool_calls\"")),
                "{s}"
            );
            assert_eq!(attr(s, "server.address"), "127.0.0.1", "{s}");
            assert_eq!(attr(s, "server.port"), port, "{s}");
            assert_eq!(s["status"]["code"], 1, "{s}");
        }
    }
    let echo = early
        .iter()
        .find(|s| s["name"] == "execute_tool meta.echo")
        .unwrap_or_else(|| panic!("no execute_tool meta.echo: {early:?}"));
    assert_eq!(echo["status"]["code"], 1, "{echo}");
    assert!(attr(echo, "error.type").is_null(), "{echo}");
    let unknown = early
        .iter()
        .find(|s| {
            attr(s, "gen_ai.operation.name") == "execute_tool"
                && s["name"] != "execute_tool meta.echo"
        })
        .unwrap();
    assert_eq!(
        unknown["status"]["code"], 2,
        "a failed call is an error: {unknown}"
    );
    assert_eq!(attr(unknown, "error.type"), "unknown_tool", "{unknown}");

    // Approved: the rest follows, each span exactly once, the run's own span last.
    let out = f.hub.cli(&["approve", &task]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = f.hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let (trace, spans) = exported(&f, &task);
    assert_eq!(spans.len(), trace["spans"].as_array().unwrap().len());
    let root = spans
        .iter()
        .find(|s| s["parent_span_id"] == "")
        .unwrap_or_else(|| panic!("no root: {spans:?}"));
    assert_eq!(root["name"], "invoke_agent meta", "{root}");
    assert_eq!(attr(root, "gen_ai.agent.name"), "meta", "{root}");
    let conversation = attr(root, "gen_ai.conversation.id");
    assert!(
        conversation.as_str().is_some_and(|c| !c.is_empty()),
        "{root}"
    );
    if let Some(c) = t.get("conversation_id").filter(|c| c.is_string()) {
        assert_eq!(conversation, c, "{root}");
    }
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    for want in [
        "chat fake-model",
        "execute_tool meta.slow",
        "approval meta.slow",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    assert_eq!(
        names.iter().filter(|n| n.starts_with("chat ")).count(),
        3,
        "{names:?}"
    );
    // The trace views still name the spans as before.
    let ours: Vec<&str> = trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        ours.contains(&"task meta") && ours.contains(&"tool meta.slow"),
        "{ours:?}"
    );
}
