//! Hostile clients (issue 41) on a real fleet: a model that repeats one tool-call id with other
//! arguments gets each call asked again (an approval decides one call).

use std::time::{Duration, Instant};

use agen_tests::{FakeModel, HubProcess};
use serde_json::{json, Value};

use crate::approvals::{deploy_asker, submit};

#[test]
fn a_model_repeating_one_call_id_with_other_arguments_is_asked_every_time() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("ran.txt");
    // Ten turns, each a `ws.run` with the same model id `dup` and its own command.
    let mut steps: Vec<Value> = (0..10)
        .map(|i| {
            json!({"tool_calls": [{"name": "ws_run", "id": "dup",
                "arguments": {"command": format!("echo ran-{i} >> {}", marker.display())}}]})
        })
        .collect();
    steps.push(json!({"reply": "done"}));
    let model = FakeModel::start(&tmp.path().join("model"), &json!({ "steps": steps })).unwrap();
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let task = submit(&hub, "asker");

    // Approve the even calls, deny the odd ones, as each is asked.
    let mut asked: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        assert!(
            Instant::now() < deadline,
            "task did not end; asked so far {asked:?}"
        );
        let pending = hub.cli_json(&["approvals", "-o", "json"]).unwrap();
        if let Some(p) = pending
            .as_array()
            .and_then(|a| a.iter().find(|a| a["task"] == task))
        {
            let call_id = p["call_id"].as_str().unwrap().to_string();
            let command = p["arguments"]["command"].as_str().unwrap().to_string();
            let n = asked.len();
            let verb = if n.is_multiple_of(2) {
                "approve"
            } else {
                "deny"
            };
            let out = hub.cli(&[verb, &task, &call_id]).unwrap();
            assert!(
                out.status.success(),
                "{verb}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            asked.push((call_id, command));
            continue;
        }
        let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
        if matches!(
            q["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ) {
            assert_eq!(q["state"], "succeeded", "{q}");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ran: Vec<String> = std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let approved: Vec<String> = (0..10).step_by(2).map(|i| format!("ran-{i}")).collect();
    let unasked = ran.iter().filter(|r| !approved.contains(r)).count();
    println!(
        "repeated call id x10: asked {}, ran {}, ran unasked {unasked}",
        asked.len(),
        ran.len()
    );
    assert_eq!(
        (asked.len(), ran.len(), unasked),
        (10, 5, 0),
        "ran: {ran:?}"
    );
    assert_eq!(ran, approved, "exactly the approved calls ran, in order");
    // Each call was asked with its own arguments, under an id of the run's own (never `dup`).
    for (i, (call_id, command)) in asked.iter().enumerate() {
        assert!(command.starts_with(&format!("echo ran-{i} ")), "{command}");
        assert_ne!(call_id, "dup");
    }
    let mut ids: Vec<&String> = asked.iter().map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10, "ten different call ids: {asked:?}");
}

/// A count of the attack: `default` in CI, more from `tests/soak/hostile.sh` (read, never set).
fn soak(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// A TLS client of the Hub's port (its CA trusted), as an attacker without a token uses it.
fn tls_connector(hub: &HubProcess) -> tokio_rustls::TlsConnector {
    agen_shared::tls::install_crypto_provider();
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for der in agen_shared::tls::pem_certs(&ca) {
        roots
            .add(rustls::pki_types::CertificateDer::from(der))
            .unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Flood {
    unauthorized: usize,
    refused: usize,
    unanswered: usize,
}

/// One tokenless A2A POST announcing a 2 MB body and sending it slowly for `trickle`.
async fn slow_tokenless_post(
    connector: tokio_rustls::TlsConnector,
    port: u16,
    trickle: Duration,
) -> &'static str {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return "refused";
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let Ok(Ok(tls)) =
        tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await
    else {
        return "refused";
    };
    let (mut rd, mut wr) = tokio::io::split(tls);
    let head = "POST /a2a/default/anyone HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 2097152\r\n\r\n";
    if wr.write_all(head.as_bytes()).await.is_err() {
        return "refused";
    }
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 1024];
        let end = Instant::now() + trickle;
        while Instant::now() < end {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = vec![0u8; 64];
    let read = tokio::time::timeout(trickle + Duration::from_secs(2), rd.read(&mut buf)).await;
    writer.abort();
    match read {
        Ok(Ok(n)) if n > 0 && buf[..n].starts_with(b"HTTP/1.1 401") => "unauthorized",
        Ok(_) => "refused",
        Err(_) => "unanswered",
    }
}

#[test]
fn tokenless_slow_bodies_cost_the_hub_no_memory_and_a_legitimate_call_still_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let port = agen_tests::free_port();
    // 200 in CI; tests/soak/hostile.sh runs 1,000. Three quarters fit under the address cap.
    let connections = soak("AGEN_SOAK_CONNECTIONS", 200);
    let cap_flag = (connections * 3 / 4).to_string();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &[
            "--max-unauthenticated-per-address",
            &cap_flag,
            "--max-unauthenticated",
            &cap_flag,
            "--unauthenticated-timeout",
            "5s",
        ],
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connector = tls_connector(&hub);
    let pid = hub.proc.pid();
    let before = rss(pid);
    let (cap, connections_total) = (connections * 3 / 4, connections);
    let trickle = Duration::from_secs(3);
    let (flood, peak, legit) = rt.block_on(async {
        let attackers: Vec<_> = (0..connections_total)
            .map(|_| tokio::spawn(slow_tokenless_post(connector.clone(), port, trickle)))
            .collect();
        // Meanwhile, a legitimate call on a fresh connection.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let started = Instant::now();
        let channel = hub.channel().await.unwrap();
        let mut client = agen_proto::v1::agen_service_client::AgenServiceClient::new(channel);
        client
            .list_deployments(
                hub.bearer(agen_proto::v1::ListDeploymentsRequest::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        let legit = started.elapsed();
        let mut peak = rss(pid);
        let mut flood = Flood::default();
        for a in attackers {
            match a.await.unwrap() {
                "unauthorized" => flood.unauthorized += 1,
                "refused" => flood.refused += 1,
                _ => flood.unanswered += 1,
            }
            peak = peak.max(rss(pid));
        }
        (flood, peak, legit)
    });
    let grown_mb = peak.saturating_sub(before) / (1024 * 1024);
    println!(
        "{connections_total} tokenless slow 2 MB bodies: {} answered 401 before the body, {} refused (per-address cap), {} unanswered; hub RSS +{grown_mb} MB; a legitimate call answered in {} ms",
        flood.unauthorized,
        flood.refused,
        flood.unanswered,
        legit.as_millis()
    );
    assert_eq!(flood.unanswered, 0, "{flood:?}");
    // Each was answered 401 before its body or refused at the caps (a slot freed by an early
    // 401 admits a later one, so the split depends on timing).
    assert_eq!(
        flood.refused + flood.unauthorized,
        connections_total,
        "{flood:?}"
    );

    // Silent connections hold their slots until the deadline: past the cap they are refused.
    let (held, refused) = rt.block_on(async {
        let tries: Vec<_> = (0..cap + 20)
            .map(|_| {
                let connector = connector.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .ok()?;
                    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                    let mut tls = connector.connect(name, tcp).await.ok()?;
                    // Admitted: the server keeps it open (nothing to read) for now.
                    let mut b = [0u8; 1];
                    match tokio::time::timeout(Duration::from_millis(300), tls.read(&mut b)).await {
                        Err(_) => Some(tls),
                        Ok(_) => None,
                    }
                })
            })
            .collect();
        let (mut held, mut refused) = (Vec::new(), 0);
        for t in tries {
            match t.await.unwrap() {
                Some(tls) => held.push(tls),
                None => refused += 1,
            }
        }
        (held, refused)
    });
    println!(
        "{} silent connections from one address: {} held, {refused} refused (cap {cap})",
        cap + 20,
        held.len()
    );
    assert!(
        held.len() <= cap && refused >= 20,
        "held {} refused {refused}",
        held.len()
    );
    drop(held);
    assert!(grown_mb < 50, "hub RSS grew {grown_mb} MB");
    assert!(
        legit < Duration::from_secs(1),
        "legitimate call took {legit:?}"
    );

    // A silent connection (handshake, then nothing) is closed at --unauthenticated-timeout.
    let closed_after = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        // The held connections were just dropped: their slots come back once the Hub sees
        // them close, so a refusal meanwhile is retried (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tls = loop {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            match tls_connector(&hub).connect(name, tcp).await {
                Ok(tls) => break tls,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no slot came back within 10 s: {e}"),
            }
        };
        let started = Instant::now();
        let mut buf = [0u8; 16];
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await;
        started.elapsed()
    });
    assert!(
        closed_after < Duration::from_secs(8),
        "a silent connection stayed {closed_after:?}"
    );

    // A 60 MB `Join` (before any authentication) is refused by its declared size.
    let before = rss(pid);
    let status = rt.block_on(async {
        let channel = hub.channel().await.unwrap();
        let mut nest = agen_proto::v1::nest_service_client::NestServiceClient::new(channel)
            .max_encoding_message_size(usize::MAX);
        nest.join(agen_proto::v1::JoinRequest {
            nest_id: "intruder".into(),
            name: "intruder".into(),
            csr_pem: "x".repeat(60 * 1024 * 1024),
        })
        .await
        .expect_err("a 60 MB Join is refused")
    });
    let grown_mb = rss(pid).saturating_sub(before) / (1024 * 1024);
    println!(
        "60 MB Join: {:?} {}; hub RSS +{grown_mb} MB",
        status.code(),
        status.message()
    );
    assert!(status.message().contains("65536"), "{status:?}");
    assert!(grown_mb < 50, "hub RSS grew {grown_mb} MB on a 60 MB Join");
}

/// `request` with `secret` as its bearer.
fn with_token<T>(request: T, secret: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(request);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    req
}

/// A new API token of `role` in `default`: (id, secret).
fn token(hub: &HubProcess, role: &str, name: &str) -> (String, String) {
    let t = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            role,
            "--name",
            name,
            "-o",
            "json",
        ])
        .unwrap();
    (
        t["id"].as_str().unwrap().to_string(),
        t["secret"].as_str().unwrap().to_string(),
    )
}

/// The text of the Hub's `/metrics` (plain HTTP on the metrics port).
fn metrics_text(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nhost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// An A2A `SubscribeToTask` SSE stream with `secret`: the status line of the answer, and the
/// stream (for reading on).
async fn a2a_subscribe(
    connector: &tokio_rustls::TlsConnector,
    port: u16,
    secret: &str,
    task: &str,
) -> (
    String,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task}})
            .to_string();
    let head = format!(
        "POST /a2a/default/streamer HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {secret}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    (text.lines().next().unwrap_or_default().to_string(), tls)
}

/// A deployment `streamer` with no Nest to run it and a task that stays queued.
fn queued_task(hub: &HubProcess, dir: &std::path::Path) -> String {
    agen_tests::write_bundle(
        dir,
        &[(
            "x-agen/agent.md",
            "---\nname: streamer\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9\n---\nYou stream.\n"
                .to_string(),
        )],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "streamer"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    submit(hub, "streamer")
}

#[test]
fn every_stream_kind_is_capped_per_token_and_in_total_and_refusals_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let (port, metrics_port) = (agen_tests::free_port(), agen_tests::free_port());
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &[
            "--max-streams-per-token",
            "10",
            "--max-streams",
            "15",
            "--metrics-listen",
            &format!("127.0.0.1:{metrics_port}"),
        ],
    )
    .unwrap();
    let task = queued_task(&hub, &tmp.path().join("streamer"));
    let (_, viewer_a) = token(&hub, "viewer", "dash-a");
    let (_, viewer_b) = token(&hub, "viewer", "dash-b");
    let (_, submitter) = token(&hub, "submitter", "a2a-client");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pid = hub.proc.pid();
    let rss_before = rss(pid);
    // 2,000 in CI; tests/soak/hostile.sh runs 20,000.
    let opens = soak("AGEN_SOAK_WATCH_OPENS", 2000);
    let (a_open, a_refused, b_open, b_refused, kept) = rt.block_on(async {
        use agen_proto::v1::agen_service_client::AgenServiceClient;
        let channel = hub.channel().await.unwrap();
        let watch = |secret: String| {
            let mut client = AgenServiceClient::new(channel.clone());
            let task = task.clone();
            async move {
                client
                    .watch_task(with_token(
                        agen_proto::v1::WatchTaskRequest {
                            task_id: task,
                            ..Default::default()
                        },
                        &secret,
                    ))
                    .await
            }
        };
        // One viewer token opens WatchTask 2,000 times (100 at once): 10 stay open.
        let mut kept = Vec::new();
        let (mut a_open, mut a_refused) = (0, 0);
        for _ in 0..opens / 100 {
            let batch: Vec<_> = (0..100)
                .map(|_| tokio::spawn(watch(viewer_a.clone())))
                .collect();
            for b in batch {
                match b.await.unwrap() {
                    Ok(s) => {
                        a_open += 1;
                        kept.push(s.into_inner());
                    }
                    Err(s) if s.code() == tonic::Code::ResourceExhausted => a_refused += 1,
                    Err(s) => panic!("unexpected refusal: {s:?}"),
                }
            }
        }
        // Another token: the total (15) leaves it 5.
        let (mut b_open, mut b_refused) = (0, 0);
        for _ in 0..10 {
            match watch(viewer_b.clone()).await {
                Ok(s) => {
                    b_open += 1;
                    kept.push(s.into_inner());
                }
                Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                    assert!(s.message().contains("--max-streams"), "{s:?}");
                    b_refused += 1
                }
                Err(s) => panic!("unexpected refusal: {s:?}"),
            }
        }
        (a_open, a_refused, b_open, b_refused, kept)
    });
    let rss_grown = rss(pid).saturating_sub(rss_before) / (1024 * 1024);
    // A2A SSE: 10 per token, the 11th and 12th get 429.
    let connector = tls_connector(&hub);
    let sse: Vec<String> = rt.block_on(async {
        let mut out = Vec::new();
        let mut held = Vec::new();
        for _ in 0..12 {
            let (status, s) = a2a_subscribe(&connector, port, &submitter, &task).await;
            out.push(status);
            held.push(s);
        }
        out
    });
    let sse_ok = sse.iter().filter(|s| s.starts_with("HTTP/1.1 200")).count();
    let sse_429 = sse.iter().filter(|s| s.starts_with("HTTP/1.1 429")).count();
    let m = metrics_text(metrics_port);
    let refused_watch = metric(&m, "agen_hub_streams_refused_total{kind=\"watch_task\"}");
    let refused_sse = metric(&m, "agen_hub_streams_refused_total{kind=\"a2a_sse\"}");
    println!(
        "WatchTask x{opens} from one token: {a_open} open, {a_refused} refused; a second token: {b_open} open, {b_refused} refused (total); A2A SSE x12: {sse_ok} open, {sse_429} x 429; metric refused watch_task {refused_watch}, a2a_sse {refused_sse}; hub RSS +{rss_grown} MB"
    );
    assert_eq!((a_open, a_refused), (10, opens - 10));
    assert_eq!((b_open, b_refused), (5, 5));
    assert_eq!((sse_ok, sse_429), (10, 2), "{sse:?}");
    assert_eq!((refused_watch, refused_sse), ((opens - 10 + 5) as u64, 2));
    assert!(rss_grown < 50, "hub RSS grew {rss_grown} MB");
    // Closed streams give their places back.
    drop(kept);
    let reopened = rt.block_on(async {
        use agen_proto::v1::agen_service_client::AgenServiceClient;
        let mut client = AgenServiceClient::new(hub.channel().await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = client
                .watch_task(with_token(
                    agen_proto::v1::WatchTaskRequest {
                        task_id: task.clone(),
                        ..Default::default()
                    },
                    &viewer_b,
                ))
                .await;
            if r.is_ok() || Instant::now() > deadline {
                return r.is_ok();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(reopened, "a closed stream's place was not given back");
}

#[test]
fn rotating_a_token_ends_its_open_streams_of_every_kind_within_a_second() {
    let tmp = tempfile::tempdir().unwrap();
    let port = agen_tests::free_port();
    let hub = HubProcess::start_with_args(tmp.path(), port, "3s", &[]).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("ran.txt");
    let model = crate::approvals::model(tmp.path(), &marker);
    crate::approvals::deploy_asker(&hub, &tmp.path().join("asker"), "streamer", &model);
    let task = submit(&hub, "streamer");
    crate::approvals::pending_of(&hub, &task);
    let (id, secret) = token(&hub, "submitter", "rotated");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connector = tls_connector(&hub);
    let ended = rt.block_on(async {
        use agen_proto::v1::agen_service_client::AgenServiceClient;
        use tokio::io::AsyncReadExt;
        let mut client = AgenServiceClient::new(hub.channel().await.unwrap());
        let mut watch = client
            .watch_task(with_token(
                agen_proto::v1::WatchTaskRequest {
                    task_id: task.clone(),
                    ..Default::default()
                },
                &secret,
            ))
            .await
            .unwrap()
            .into_inner();
        let mut logs = client
            .read_logs(with_token(
                agen_proto::v1::ReadLogsRequest {
                    target: "streamer".into(),
                    follow: true,
                    ..Default::default()
                },
                &secret,
            ))
            .await
            .unwrap()
            .into_inner();
        let (status, mut sse) = a2a_subscribe(&connector, port, &secret, &task).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        // Each stream's end, timed from its own task.
        let watch_end = tokio::spawn(async move {
            while let Ok(Some(_)) = watch.message().await {}
            Instant::now()
        });
        let logs_end = tokio::spawn(async move {
            while let Ok(Some(_)) = logs.message().await {}
            Instant::now()
        });
        let sse_end = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                match sse.read(&mut buf).await {
                    Ok(0) | Err(_) => return Instant::now(),
                    Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("rotated") => {
                        return Instant::now()
                    }
                    Ok(_) => {}
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!watch_end.is_finished() && !logs_end.is_finished() && !sse_end.is_finished());
        let out = hub.cli(&["tokens", "rotate", &id]).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rotated = Instant::now();
        let mut ended = Vec::new();
        for (kind, h) in [
            ("WatchTask", watch_end),
            ("logs -f", logs_end),
            ("A2A SSE", sse_end),
        ] {
            let at = tokio::time::timeout(Duration::from_secs(5), h)
                .await
                .unwrap_or_else(|_| panic!("{kind} still open 5 s after the rotation"))
                .unwrap();
            ended.push((kind, at.saturating_duration_since(rotated)));
        }
        ended
    });
    println!("rotation: {ended:?}");
    for (kind, after) in &ended {
        assert!(
            *after < Duration::from_secs(1),
            "{kind} ended {after:?} after the rotation"
        );
    }
    let out = hub.cli(&["tasks", "--token", &secret]).unwrap();
    assert!(!out.status.success(), "the old secret still works");
}

/// `agen ARGS` run under a pseudo-terminal (`script`): every byte the terminal got.
fn cli_on_a_terminal(hub: &HubProcess, args: &[&str]) -> Vec<u8> {
    let command = std::iter::once(agen_tests::agen_bin().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = std::process::Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    out.stdout
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

#[test]
fn hostile_names_and_model_output_reach_the_terminal_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();

    // Names that lie are refused: reserved words, line breaks, escapes, bidi overrides.
    for name in [
        "admin",
        "System",
        "agen",
        "ci\nbot",
        "x\u{1b}[2Jy",
        "evil\u{202e}",
        "a\u{200b}b",
    ] {
        let out = hub
            .cli(&[
                "tokens",
                "create",
                "--namespace",
                "default",
                "--role",
                "viewer",
                "--name",
                name,
            ])
            .unwrap();
        assert!(!out.status.success(), "token name {name:?} was accepted");
    }
    let out = hub
        .cli(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "viewer",
            "--name",
            "Équipe 日本 (CI)",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A model whose answer carries terminal escapes, on a real fleet.
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let hostile = "\u{1b}[31mRED\u{1b}]0;pwned\u{7}\r\nforged\u{202e}txt";
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": hostile}, {"reply": hostile}]}),
    )
    .unwrap();
    agen_tests::write_bundle(
        &tmp.path().join("b"),
        &[(
            "x-agen/agent.md",
            format!(
                "---\nname: hostile\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                model.base_url()
            ),
        )],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            tmp.path().join("b").to_str().unwrap(),
            "--name",
            "hostile",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let waited = cli_on_a_terminal(&hub, &["submit", "hostile", "go", "--wait"]);
    let listed = cli_on_a_terminal(&hub, &["tasks"]);
    let mut raw = 0;
    for bytes in [&waited, &listed] {
        for seq in [
            &b"\x1b[31m"[..],
            b"\x1b]0;pwned",
            b"\x07",
            "\u{202e}".as_bytes(),
        ] {
            raw += count(bytes, seq);
        }
    }
    let escaped = count(&waited, b"\\e[31mRED") + count(&listed, b"\\e[31mRED");
    println!(
        "hostile model output under a terminal: {raw} raw control sequences from data, {escaped} shown escaped"
    );
    assert_eq!(
        raw,
        0,
        "submit --wait: {:?}\ntasks: {:?}",
        String::from_utf8_lossy(&waited),
        String::from_utf8_lossy(&listed)
    );
    assert!(
        count(&waited, b"\\e[31mRED") >= 1,
        "{:?}",
        String::from_utf8_lossy(&waited)
    );
}

#[test]
fn a_model_inventing_thousands_of_tool_names_makes_a_bounded_number_of_series() {
    let tmp = tempfile::tempdir().unwrap();
    let (port, metrics_port) = (agen_tests::free_port(), agen_tests::free_port());
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &["--metrics-listen", &format!("127.0.0.1:{metrics_port}")],
    )
    .unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    // 2,000 in CI (30 times the cap); tests/soak/hostile.sh runs 10,000.
    let names = soak("AGEN_SOAK_TOOL_NAMES", 2_000);
    let calls: Vec<Value> = (0..names)
        .map(|i| json!({"name": format!("invented_{i}"), "arguments": {}}))
        .collect();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"tool_calls": calls}, {"reply": "done"}]}),
    )
    .unwrap();
    agen_tests::write_bundle(
        &tmp.path().join("b"),
        &[(
            "x-agen/agent.md",
            format!(
                "---\nname: inventor\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou invent.\n",
                model.base_url()
            ),
        )],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            tmp.path().join("b").to_str().unwrap(),
            "--name",
            "inventor",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = submit(&hub, "inventor");
    let done = crate::approvals::wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    // The counts settle (the counter of `other` holds every name past the first 64).
    let total = |m: &str| -> u64 {
        m.lines()
            .filter(|l| {
                l.starts_with("agen_tool_calls_total{") && l.contains("deployment=\"inventor\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let mut last = 0;
    let m = agen_tests::wait_for(
        "the tool call counts to settle",
        Duration::from_secs(30),
        || {
            std::thread::sleep(Duration::from_millis(500));
            let m = metrics_text(metrics_port);
            let now = total(&m);
            let settled = now == last && now > 64;
            last = now;
            settled.then_some(m)
        },
    )
    .unwrap();
    let series = m
        .lines()
        .filter(|l| {
            !l.starts_with('#') && l.contains("deployment=\"inventor\"") && l.contains("tool=\"")
        })
        .count();
    let tools: std::collections::HashSet<&str> = m
        .lines()
        .filter(|l| {
            l.starts_with("agen_tool_calls_total{") && l.contains("deployment=\"inventor\"")
        })
        .filter_map(|l| l.split("tool=\"").nth(1)?.split('"').next())
        .collect();
    println!(
        "{names} invented tool names: {} calls counted, {} distinct tool label values, {series} tool series, /metrics {} bytes",
        total(&m),
        tools.len(),
        m.len()
    );
    assert_eq!(tools.len(), 65, "64 names and `other`: {tools:?}");
    assert!(tools.contains("other"));
    assert!(m.len() < 200_000, "/metrics is {} bytes", m.len());
}
