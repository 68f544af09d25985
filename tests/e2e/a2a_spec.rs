//! A2A by the book (issue 48), on a real fleet, with the REAL PyPI `a2a-sdk` client and with raw
//! HTTP requests (`tests/peers/a2a_client.py` op `raw`, like curl) for the exact shapes:
//! `ListTasks` (namespace scope, filters, pages, `historyLength`, `includeArtifacts`, the
//! errors), the public card without a token and the extended card with one, an origin per
//! deployment (`--a2a-domain` host routing and `agen a2a serve`), JSON-RPC 2.0 error codes and
//! ids, and the task lifecycle the A2A TCK checks (a message continuing a task in progress,
//! `CancelTask` of a working task, `historyLength` on `GetTask`). The Hub answers a blocking
//! `SendMessage` after 500 ms (`--a2a-send-wait`) and the agent works 6 s on a new context, so
//! its tasks are still working when the test talks to them.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::process::Command;
use std::time::Duration;

use agen_tests::{agen_bin, free_port, wait_for, write_bundle, FakeModel, HubProcess, Proc};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

use crate::a2a::{sent_task, status_text, Fleet};

const DOMAIN: &str = "agents.test";

/// A raw HTTP request through `a2a_client.py` (`auth`: with the token).
fn raw(f: &Fleet, token: &str, method: &str, url: &str, body: &str, headers: Value) -> Value {
    f.a2a_to(
        url,
        token,
        json!({"op": "raw", "method": method, "url": url, "body": body, "headers": headers, "auth": !token.is_empty()}),
    )
}

/// A JSON-RPC call posted by hand to `url`; the parsed answer (status checked to be 200).
fn rpc(f: &Fleet, token: &str, url: &str, body: Value) -> Value {
    let r = raw(
        f,
        token,
        "POST",
        url,
        &body.to_string(),
        json!({"Content-Type": "application/json"}),
    );
    assert_eq!(r["status"], 200, "{body} -> {r}");
    r["body"].clone()
}

fn code(answer: &Value) -> i64 {
    answer["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error code: {answer}"))
}

fn ids(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("no tasks: {list}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn list_tasks_cards_origins_json_rpc_and_lifecycle_are_by_the_a2a_book() {
    let port = free_port();
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &["--a2a-domain", DOMAIN, "--a2a-send-wait", "500ms"],
    )
    .unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let mut f = Fleet {
        tmp,
        hub,
        _nest: Some(nest),
        models: Vec::new(),
    };
    // A new context: 6 s of work, then an artifact and the reply; a continued one answers at once.
    let script = json!({"steps": [
        {"delay_ms": 6000, "tool_calls": [{"name": "save_artifact", "arguments": {"name": "greeting", "content": "hello", "mediaType": "text/plain"}}]},
        {"reply": "greeted"}
    ]});
    let model = FakeModel::start(&f.tmp.path().join("model"), &script).unwrap();
    let bundle = f.tmp.path().join("greeter");
    write_bundle(&bundle, &[(
        "x-agen/agent.md",
        format!(
            "---\nname: greeter\nmodel: openai/fake-model\nbaseUrl: {}\ndescription: Greets whoever writes.\n---\n# greeter\n\nYou greet.\n",
            model.base_url()
        ),
    )])
    .unwrap();
    f.models.push(model);
    for ns in ["default", "other"] {
        let out = f
            .hub
            .cli(&[
                "deploy",
                bundle.to_str().unwrap(),
                "--name",
                "greeter",
                "--namespace",
                ns,
                "--concurrency",
                "4",
                "--wait",
            ])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let token = f.token("default", "submitter", "a2a-spec");
    let other = f.token("other", "submitter", "a2a-spec-other");
    let agent = format!("{}/a2a/default/greeter", f.hub.url());
    let card_url = format!("{agent}/.well-known/agent-card.json");

    // 1. The public card: no token needed, only what a stranger may know.
    let c = raw(&f, "", "GET", &card_url, "", json!({}));
    assert_eq!(c["status"], 200, "{c}");
    let card = &c["body"];
    assert_eq!(
        (
            card["name"].clone(),
            card["description"].clone(),
            card["version"].clone()
        ),
        (
            json!("greeter"),
            json!("Greets whoever writes."),
            json!("generation 1")
        ),
        "{card}"
    );
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        agent.as_str(),
        "{card}"
    );
    assert_eq!(card["capabilities"]["extendedAgentCard"], true, "{card}");
    assert_eq!(card["skills"][0]["id"], "greeter", "{card}");
    assert!(card.get("provider").is_none(), "{card}");
    let text = c["text"].as_str().unwrap();
    assert!(
        !text.contains("sha256") && !text.to_lowercase().contains("token"),
        "{text}"
    );
    // The extended card, through the a2a-sdk client with a token: the bundle digest, the provider.
    let ext = f.a2a_to(&agent, &token, json!({"op": "extended_card"}));
    let version = ext["card"]["version"]
        .as_str()
        .unwrap_or_else(|| panic!("{ext}"));
    assert!(version.len() >= 32 && version != "generation 1", "{ext}");
    assert!(
        !text.contains(version),
        "the public card hides the digest: {text}"
    );
    assert_eq!(
        ext["card"]["provider"]["organization"], "Agen deployment default/greeter",
        "{ext}"
    );
    // ... and without a token: 401 with the scheme.
    let r = raw(
        &f,
        "",
        "POST",
        &agent,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard"}).to_string(),
        json!({"Content-Type": "application/json"}),
    );
    assert_eq!(
        (
            r["status"].clone(),
            r["headers"]["www-authenticate"].clone()
        ),
        (json!(401), json!("Bearer")),
        "{r}"
    );

    // 2. JSON-RPC 2.0: parse error, invalid requests (id echoed when valid, null when not),
    // unknown method, invalid params, A2A's own codes, notifications unanswered.
    let post = |body: &str, headers: Value| raw(&f, &token, "POST", &agent, body, headers);
    let ct = json!({"Content-Type": "application/json"});
    let cases: Vec<(&str, Value, i64, Value)> = vec![
        (
            r#"{"jsonrpc": "2.0", "method": "SendMessage", "params": {"#,
            ct.clone(),
            -32700,
            Value::Null,
        ),
        (
            r#"{"jsonrpc": "2.0", "params": {}, "id": "7"}"#,
            ct.clone(),
            -32600,
            json!("7"),
        ),
        (
            r#"{"jsonrpc": "2.0", "params": {}}"#,
            ct.clone(),
            -32600,
            Value::Null,
        ),
        (
            r#"{"jsonrpc": "1.0", "method": "GetTask", "params": {"id": "x"}, "id": 8}"#,
            ct.clone(),
            -32600,
            json!(8),
        ),
        (
            r#"{"method": "GetTask", "params": {"id": "x"}, "id": 8}"#,
            ct.clone(),
            -32600,
            json!(8),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "GetTask", "id": {"bad": "type"}}"#,
            ct.clone(),
            -32600,
            Value::Null,
        ),
        (
            r#"{"jsonrpc": "2.0", "method": 5, "id": 3}"#,
            ct.clone(),
            -32600,
            json!(3),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "GetTask", "params": "x", "id": 3}"#,
            ct.clone(),
            -32600,
            json!(3),
        ),
        (
            r#"[{"jsonrpc": "2.0", "method": "GetTask", "id": 1}]"#,
            ct.clone(),
            -32600,
            Value::Null,
        ),
        (r#""just a string""#, ct.clone(), -32600, Value::Null),
        (
            r#"{"jsonrpc": "2.0", "method": "SendMessageXXX", "params": {}, "id": "3"}"#,
            ct.clone(),
            -32601,
            json!("3"),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "SendMessage", "params": {"message": {"parts": "invalid"}}, "id": 10}"#,
            ct.clone(),
            -32602,
            json!(10),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "SendMessage", "params": {"": "not_a_dict"}, "id": "4"}"#,
            ct.clone(),
            -32602,
            json!("4"),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "nonexistent-task-id"}, "id": 11}"#,
            ct.clone(),
            -32001,
            json!(11),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "CancelTask", "params": {"id": "nonexistent-task-id"}, "id": 11}"#,
            ct.clone(),
            -32001,
            json!(11),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "CreateTaskPushNotificationConfig", "params": {}, "id": 12}"#,
            ct.clone(),
            -32003,
            json!(12),
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "ListTasks", "params": {}, "id": 13}"#,
            json!({"Content-Type": "application/json", "A2A-Version": "0.3"}),
            -32009,
            json!(13),
        ),
    ];
    for (body, headers, want, id) in cases {
        let r = post(body, headers);
        assert_eq!(r["status"], 200, "{body} -> {r}");
        let a = &r["body"];
        assert_eq!(
            (a["jsonrpc"].clone(), code(a), a["id"].clone()),
            (json!("2.0"), want, id),
            "{body} -> {a}"
        );
        assert!(
            a.get("result").is_none() && a["error"]["message"].is_string(),
            "{body} -> {a}"
        );
    }
    // A notification (no id) is performed and never answered.
    let n = post(
        r#"{"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "nonexistent-task-id"}}"#,
        ct.clone(),
    );
    assert_eq!(
        (n["status"].clone(), n["text"].clone()),
        (json!(204), json!("")),
        "{n}"
    );

    // 3. The lifecycle: a blocking send answers with the working task; a message naming it
    // continues it (it runs as the next task of the context; the answer is the named task,
    // whose history shows the message and then its answer); historyLength on GetTask.
    let first = sent_task(&f.a2a_to(&agent, &token, json!({"op": "send", "text": "hello"})));
    let t1 = first["id"].as_str().unwrap().to_owned();
    let ctx = first["contextId"].as_str().unwrap().to_owned();
    assert!(
        ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"]
            .contains(&first["status"]["state"].as_str().unwrap()),
        "{first}"
    );
    let next = f.a2a_to(
        &agent,
        &token,
        json!({"op": "send", "text": "and again", "task_id": t1}),
    );
    assert_eq!(sent_task(&next)["id"], t1.as_str(), "{next}");
    let wrong = rpc(
        &f,
        &token,
        &agent,
        json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m-wrong", "role": "ROLE_USER", "taskId": t1, "contextId": "another", "parts": [{"text": "x"}]}}}),
    );
    assert_eq!(code(&wrong), -32602, "{wrong}");
    // CancelTask of a working task.
    let doomed = sent_task(&f.a2a_to(&agent, &token, json!({"op": "send", "text": "cancel me"})));
    let t3 = doomed["id"].as_str().unwrap().to_owned();
    let c = f.a2a_to(&agent, &token, json!({"op": "cancel", "id": t3}));
    assert_eq!(c["task"]["status"]["state"], "TASK_STATE_CANCELED", "{c}");
    // SubscribeToTask of an ended task is an unsupported operation, of an unknown one not
    // found: each an SSE stream of one JSON-RPC error event, where a stream reader reads.
    for (id, want) in [(t3.as_str(), -32004), ("nonexistent-task-id", -32001)] {
        let body =
            json!({"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": id}});
        let r = raw(&f, &token, "POST", &agent, &body.to_string(), ct.clone());
        assert!(
            r["headers"]["content-type"]
                .as_str()
                .is_some_and(|c| c.starts_with("text/event-stream")),
            "{r}"
        );
        let data = r["text"]
            .as_str()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("{r}"));
        let event: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            (code(&event), event["id"].clone()),
            (want, json!(2)),
            "{event}"
        );
    }
    // The continuation is a task of the context, run after the first.
    let in_ctx = f.a2a_to(&agent, &token, json!({"op": "list", "context_id": ctx}));
    let t2 = ids(&in_ctx["list"])
        .into_iter()
        .find(|id| *id != t1)
        .unwrap_or_else(|| panic!("{in_ctx}"));
    wait_for("the continuation to end", Duration::from_secs(60), || {
        (f.state_of(&t2) == "succeeded").then_some(())
    })
    .unwrap();
    assert_eq!(f.state_of(&t1), "succeeded");
    let get = |h: Option<i64>| {
        let mut op = json!({"op": "get", "id": t1});
        if let Some(h) = h {
            op["history_length"] = json!(h);
        }
        f.a2a_to(&agent, &token, op)
    };
    let said = |t: &Value| -> Vec<(String, String)> {
        t["task"]["history"].as_array().map_or(Vec::new(), |h| {
            h.iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap().to_owned(),
                        m["parts"][0]["text"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
    };
    let (user, agent_role) = ("ROLE_USER".to_owned(), "ROLE_AGENT".to_owned());
    assert_eq!(
        said(&get(None)),
        vec![
            (user.clone(), "hello".to_owned()),
            (agent_role.clone(), "greeted".to_owned()),
            (user.clone(), "and again".to_owned()),
            (agent_role.clone(), "greeted".to_owned()),
        ]
    );
    assert_eq!(
        said(&get(Some(2))),
        vec![
            (user, "and again".to_owned()),
            (agent_role, "greeted".to_owned())
        ]
    );
    assert_eq!(said(&get(Some(0))), Vec::new());
    let neg = rpc(
        &f,
        &token,
        &agent,
        json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": t1, "historyLength": -1}}),
    );
    assert_eq!(code(&neg), -32602, "{neg}");

    // 4. ListTasks, through the a2a-sdk client and by hand.
    let list = |op: Value| {
        let mut op = op;
        op["op"] = json!("list");
        let r = f.a2a_to(&agent, &token, op);
        r.get("list").cloned().unwrap_or_else(|| panic!("{r}"))
    };
    let all = list(json!({}));
    assert_eq!(
        (
            all["totalSize"].clone(),
            all["pageSize"].clone(),
            all["nextPageToken"].clone()
        ),
        (json!(3), json!(3), json!("")),
        "{all}"
    );
    let mut want = vec![t1.clone(), t2.clone(), t3.clone()];
    want.sort();
    let mut got = ids(&all);
    got.sort();
    assert_eq!(got, want);
    let stamps: Vec<&str> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"]["timestamp"].as_str().unwrap())
        .collect();
    let mut sorted = stamps.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(stamps, sorted, "most recently updated first");
    assert!(
        all["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.get("artifacts").is_none()),
        "no artifacts unless asked: {all}"
    );
    // Pages of one: every task once, then an empty token.
    let mut seen = Vec::new();
    let mut page_token = String::new();
    for _ in 0..5 {
        let p = list(json!({"page_size": 1, "page_token": page_token}));
        assert_eq!(
            (p["totalSize"].clone(), p["pageSize"].clone()),
            (json!(3), json!(1)),
            "{p}"
        );
        seen.extend(ids(&p));
        page_token = p["nextPageToken"].as_str().unwrap().to_owned();
        if page_token.is_empty() {
            break;
        }
    }
    seen.sort();
    assert_eq!(seen, want);
    // Filters: the context, the state, the update time; historyLength; artifacts on request.
    let by_ctx = list(json!({"context_id": ctx, "history_length": 1}));
    assert_eq!(by_ctx["totalSize"], 2, "{by_ctx}");
    assert_eq!(
        ids(&by_ctx),
        vec![t2.clone(), t1.clone()],
        "the continuation ended last"
    );
    for t in by_ctx["tasks"].as_array().unwrap() {
        assert_eq!(t["contextId"], ctx.as_str());
        assert_eq!(t["history"].as_array().map(Vec::len), Some(1), "{t}");
    }
    assert_eq!(
        ids(&list(json!({"status": "TASK_STATE_CANCELED"}))),
        vec![t3.clone()]
    );
    assert_eq!(
        list(json!({"status": "TASK_STATE_WORKING"}))["totalSize"],
        0
    );
    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    assert_eq!(
        list(json!({"status_timestamp_after": future}))["totalSize"],
        0
    );
    assert_eq!(
        list(json!({"status_timestamp_after": "2020-01-01T00:00:00Z"}))["totalSize"],
        3
    );
    let with = list(json!({"include_artifacts": true, "context_id": ctx}));
    let first_listed = with["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == t1.as_str())
        .unwrap();
    assert_eq!(first_listed["artifacts"][0]["name"], "greeting", "{with}");
    // The documented errors, by hand.
    for params in [
        json!({"pageSize": 0}),
        json!({"pageSize": -1}),
        json!({"pageSize": 101}),
        json!({"pageToken": "invalid-token-xyz"}),
        json!({"status": "INVALID_STATUS"}),
        json!({"historyLength": -1}),
        json!({"statusTimestampAfter": "-1"}),
    ] {
        let a = rpc(
            &f,
            &token,
            &agent,
            json!({"jsonrpc": "2.0", "id": "l", "method": "ListTasks", "params": params}),
        );
        assert_eq!(code(&a), -32602, "{params} -> {a}");
    }
    // A token sees its namespace only: another namespace's token is refused here, and there
    // it lists that namespace's task alone.
    let r = raw(
        &f,
        &other,
        "POST",
        &agent,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}).to_string(),
        ct.clone(),
    );
    assert_eq!(r["status"], 403, "{r}");
    let there = format!("{}/a2a/other/greeter", f.hub.url());
    let mine = sent_task(&f.a2a_to(
        &there,
        &other,
        json!({"op": "send", "text": "hi there", "return_immediately": true}),
    ));
    let l = f.a2a_to(&there, &other, json!({"op": "list"}));
    assert_eq!(
        ids(&l["list"]),
        vec![mine["id"].as_str().unwrap().to_owned()],
        "{l}"
    );
    assert_eq!(list(json!({}))["totalSize"], 3);

    // 5. An origin per deployment: host routing under --a2a-domain ...
    let host = format!("greeter.default.{DOMAIN}:{port}");
    let root = format!("{}/", f.hub.url());
    let c = raw(
        &f,
        "",
        "GET",
        &format!("{root}.well-known/agent-card.json"),
        "",
        json!({"Host": host}),
    );
    assert_eq!(c["status"], 200, "{c}");
    assert_eq!(
        c["body"]["supportedInterfaces"][0]["url"],
        format!("https://{host}/"),
        "{c}"
    );
    let l = raw(
        &f,
        &token,
        "POST",
        &root,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 1}})
            .to_string(),
        json!({"Host": host, "Content-Type": "application/json"}),
    );
    assert_eq!(l["body"]["result"]["totalSize"], 3, "{l}");
    for stranger in [
        format!("nobody.default.{DOMAIN}"),
        "greeter.default.example.com".to_owned(),
    ] {
        let c = raw(
            &f,
            "",
            "GET",
            &format!("{root}.well-known/agent-card.json"),
            "",
            json!({"Host": stranger}),
        );
        assert_eq!(c["status"], 404, "{stranger}: {c}");
    }
    // ... and `agen a2a serve`, a local origin whose root is the deployment.
    let mut cmd = Command::new(agen_bin());
    cmd.args(["a2a", "serve", "greeter", "--listen", "127.0.0.1:0"])
        .env("AGEN_CONFIG", f.hub.dir.join("client.toml"));
    let serve = Proc::spawn("a2a-serve", cmd, &f.tmp.path().join("serve.log")).unwrap();
    let origin = wait_for("agen a2a serve to listen", Duration::from_secs(30), || {
        let log = serve.log_text();
        let at = log.find("as an A2A agent at ")? + "as an A2A agent at ".len();
        let url = log[at..].split_whitespace().next()?;
        Some(url.trim_end_matches('/').to_owned())
    })
    .unwrap();
    let card = f.a2a_to(&origin, &token, json!({"op": "card"}));
    assert_eq!(
        card["card"]["supportedInterfaces"][0]["url"],
        format!("{origin}/"),
        "{card}"
    );
    let streamed = f.a2a_to(
        &origin,
        &token,
        json!({"op": "send", "text": "through the local origin", "stream": true}),
    );
    let events = streamed["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{streamed}"));
    assert!(events[0].get("task").is_some(), "{streamed}");
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(
        (last["state"].clone(), status_text(last)),
        (json!("TASK_STATE_COMPLETED"), "greeted".to_owned()),
        "{streamed}"
    );
    assert_eq!(
        f.a2a_to(&origin, &token, json!({"op": "list"}))["list"]["totalSize"],
        4
    );
    let refused = raw(
        &f,
        "agen-not-a-token",
        "POST",
        &format!("{origin}/"),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}).to_string(),
        ct.clone(),
    );
    assert_eq!(
        (
            refused["status"].clone(),
            refused["headers"]["www-authenticate"].clone()
        ),
        (json!(401), json!("Bearer")),
        "{refused}"
    );
    drop(serve);
    let out = f
        .hub
        .cli(&["a2a", "serve", "greeter", "--listen", "0.0.0.0:0"])
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
    // File content: UTF-8 bytes are taken as text, binary bytes refused (-32005).
    let part = |raw: &str| json!({"jsonrpc": "2.0", "id": 3, "method": "SendMessage", "params": {"configuration": {"returnImmediately": true}, "message": {"messageId": format!("m-raw-{raw}"), "role": "ROLE_USER", "parts": [{"text": "read this"}, {"raw": raw, "mediaType": "application/octet-stream"}]}}});
    let text = rpc(&f, &token, &agent, part("VGhpcyBpcyB0ZXN0IGJpbmFyeSBkYXRh"));
    assert_eq!(
        text["result"]["task"]["history"][0]["parts"][0]["text"],
        "read this\nThis is test binary data",
        "{text}"
    );
    assert_eq!(code(&rpc(&f, &token, &agent, part("/wA="))), -32005);
}
