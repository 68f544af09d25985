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
            let verb = if n % 2 == 0 { "approve" } else { "deny" };
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
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &[
            "--max-unauthenticated-per-address",
            "150",
            "--unauthenticated-timeout",
            "3s",
        ],
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connector = tls_connector(&hub);
    let pid = hub.proc.pid();
    let before = rss(pid);
    const CONNECTIONS: usize = 200;
    let trickle = Duration::from_secs(3);
    let (flood, peak, legit) = rt.block_on(async {
        let attackers: Vec<_> = (0..CONNECTIONS)
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
        "{CONNECTIONS} tokenless slow 2 MB bodies: {} answered 401 before the body, {} refused (per-address cap), {} unanswered; hub RSS +{grown_mb} MB; a legitimate call answered in {} ms",
        flood.unauthorized,
        flood.refused,
        flood.unanswered,
        legit.as_millis()
    );
    assert_eq!(flood.unanswered, 0, "{flood:?}");
    assert!(flood.refused >= CONNECTIONS - 150, "{flood:?}");
    assert!(flood.unauthorized > 0, "{flood:?}");
    assert!(grown_mb < 50, "hub RSS grew {grown_mb} MB");
    assert!(
        legit < Duration::from_secs(1),
        "legitimate call took {legit:?}"
    );

    // A silent connection (handshake, then nothing) is closed at --unauthenticated-timeout.
    let closed_after = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tls_connector(&hub).connect(name, tcp).await.unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 16];
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await;
        started.elapsed()
    });
    assert!(
        closed_after < Duration::from_secs(6),
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
