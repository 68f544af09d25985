//! The Hub's one port (gRPC and A2A) as the attacker (issues 40 and 41): a local process of an
//! instance or tool-server uid (a Nest's `--run-uids`, the Hub's `--refuse-uids`) is closed
//! before its TLS handshake, admin token and all, and counted, while a process of any other
//! uid is served; the plaintext listener (`--insecure-plaintext`) caps unauthenticated
//! connections per address and cuts silent ones like the TLS one, and a plaintext Nest (which
//! authenticates with its join token) is never cut. Every refusal ends in
//! `agen_hub_connections_refused_total{reason}`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use agen_tests::HubProcess;

/// The text of a daemon's `/metrics` (plain HTTP).
fn metrics_text(addr: &str) -> String {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nhost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn refused(text: &str, reason: &str) -> u64 {
    let series = format!("agen_hub_connections_refused_total{{reason=\"{reason}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse::<f64>().ok())
        .unwrap_or(-1.0) as u64
}

/// curl as `uid` (and gid): the HTTP status it got, `000` when the connection was closed.
fn curl_as(uid: u32, args: &[&str]) -> String {
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(args)
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_local_process_of_an_instance_uid_is_refused_the_hubs_grpc_and_a2a_port_and_counted() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a process under another uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", agen_tests::free_port());
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--metrics-listen", &metrics, "--refuse-uids", "62200-62209"],
    )
    .unwrap();
    let admin = std::fs::read_to_string(tmp.path().join("hub/admin-token")).unwrap();
    let auth = format!("authorization: Bearer {}", admin.trim());
    let url = hub.url();
    let a2a = format!("{url}/a2a/default/nobody");
    let card = format!("{a2a}/.well-known/agent-card.json");
    let grpc = format!("{url}/agen.v1.AgenService/ListDeployments");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}"#;
    let calls: Vec<Vec<&str>> = vec![
        vec![card.as_str()],
        vec![
            "-H",
            &auth,
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &a2a,
        ],
        vec![
            "--http2",
            "-X",
            "POST",
            "-H",
            &auth,
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
            "",
            &grpc,
        ],
    ];
    // The attacker: two uids of the range, each call with the admin token where it takes one.
    let mut codes = Vec::new();
    for uid in [62200, 62209] {
        for call in &calls {
            codes.push(curl_as(uid, call));
        }
    }
    let closed = codes.iter().filter(|c| *c == "000").count();
    assert_eq!((closed, codes.len()), (6, 6), "{codes:?}");
    // Anyone else (a uid outside the range, root) is served the same calls.
    for uid in [62199, 0] {
        for call in &calls {
            let code = curl_as(uid, call);
            assert_ne!(code, "000", "uid {uid}: {call:?}");
        }
    }
    let out = hub.cli(&["nests", "-o", "json"]).unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = metrics_text(&metrics);
    assert_eq!(refused(&text, "instance_uid"), 6, "{text}");
    assert!(
        hub.proc
            .log_text()
            .contains("an instance or tool-server uid"),
        "{}",
        hub.proc.log_text()
    );
}

#[test]
fn the_plaintext_listener_caps_unauthenticated_connections_per_address_and_cuts_silent_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", agen_tests::free_port());
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &[
            "--insecure-plaintext",
            "--metrics-listen",
            &metrics,
            "--max-unauthenticated-per-address",
            "4",
            "--unauthenticated-timeout",
            "2s",
        ],
    )
    .unwrap();
    // A plaintext Nest authenticates with its join token on every call: never cut.
    let dir = tmp.path().join("nest");
    let mut cmd = std::process::Command::new(agen_tests::agen_bin());
    cmd.args(["nest", "--hub", &format!("http://127.0.0.1:{}", hub.port)])
        .args(["--join-file"])
        .arg(tmp.path().join("hub/join-token"))
        .args(["--name", "plain", "--run-as-self", "--data-dir"])
        .arg(&dir)
        .env("RUST_LOG", "info");
    let nest = agen_tests::Proc::spawn("plain", cmd, &tmp.path().join("nest.log")).unwrap();
    agen_tests::wait_for("the nest to be ready", Duration::from_secs(30), || {
        let v = hub.cli_json(&["nests", "-o", "json"]).ok()?;
        (v.to_string().contains("\"ready\"")).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", nest.log_text()));
    let before = metrics_text(&metrics);
    let timed_out_before = refused(&before, "unauthenticated_timeout");

    // Four silent connections are held, the fifth from the same address is closed at once.
    let at = ("127.0.0.1", hub.port);
    let silent: Vec<std::net::TcpStream> = (0..4)
        .map(|_| std::net::TcpStream::connect(at).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut fifth = std::net::TcpStream::connect(at).unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let n = fifth.read(&mut [0u8; 16]).unwrap_or(0);
    assert_eq!(n, 0, "the fifth connection got bytes");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not closed at once"
    );
    // The silent ones are cut at their deadline (2 s), not held.
    for mut s in silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let n = s.read(&mut [0u8; 16]).unwrap_or(0);
        assert_eq!(n, 0);
    }
    // A legitimate call answers; the Nest was not cut (only the four silent connections were).
    let out = hub.cli(&["nests", "-o", "json"]).unwrap();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_secs(3));
    let text = metrics_text(&metrics);
    assert_eq!(
        refused(&text, "max_unauthenticated_per_address"),
        1,
        "{text}"
    );
    assert_eq!(
        refused(&text, "unauthenticated_timeout") - timed_out_before,
        4,
        "{text}"
    );
    let v = hub.cli_json(&["nests", "-o", "json"]).unwrap();
    assert!(v.to_string().contains("\"ready\""), "{v}");
}

/// A new API token: (id, secret).
fn token(hub: &HubProcess, ns: &str, role: &str, name: &str) -> (String, String) {
    let t = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            ns,
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

/// One curl process sending `n` A2A requests on one connection: the status codes it got.
fn a2a_burst(url: &str, n: usize, secret: Option<&str>) -> Vec<String> {
    let mut cmd = std::process::Command::new("curl");
    // No body: the Hub answers before reading one, and a peer still sending it would see
    // the connection reset before the answer.
    cmd.args([
        "-sk",
        "-X",
        "POST",
        "-w",
        "%{http_code}\n",
        "--max-time",
        "60",
    ]);
    if let Some(s) = secret {
        cmd.args(["-H", &format!("authorization: Bearer {s}")]);
    }
    for _ in 0..n {
        cmd.args(["-o", "/dev/null", url]);
    }
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_burst_of_refused_calls_makes_a_bounded_number_of_audit_records_naming_the_peer_and_the_count()
{
    use agen_proto::v1 as pb;
    const N: usize = 150;
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let (revoked_id, revoked) = token(&hub, "default", "submitter", "gone");
    let out = hub.cli(&["tokens", "revoke", &revoked_id]).unwrap();
    assert!(out.status.success(), "{out:?}");
    let (_, viewer) = token(&hub, "default", "viewer", "looker");
    let started = Instant::now();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc_refused = rt.block_on(async {
        let mut client =
            pb::agen_service_client::AgenServiceClient::new(hub.channel().await.unwrap());
        let mut refused = 0;
        for (i, secret) in ["agen_nosuch_0123456789", revoked.as_str(), ""]
            .iter()
            .cycle()
            .take(N)
            .enumerate()
        {
            let mut req = tonic::Request::new(pb::ListTasksRequest::default());
            if !secret.is_empty() {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {secret}").parse().unwrap());
            }
            let status = client
                .list_tasks(req)
                .await
                .err()
                .unwrap_or_else(|| panic!("call {i} served"));
            refused += usize::from(status.code() == tonic::Code::Unauthenticated);
        }
        refused
    });
    assert_eq!(grpc_refused, N);
    let url = format!("{}/a2a/default/nobody", hub.url());
    let unauthorized = a2a_burst(&url, N, None);
    let forbidden = a2a_burst(&url, N, Some(&viewer));
    assert_eq!(
        (
            unauthorized.iter().filter(|c| *c == "401").count(),
            forbidden.iter().filter(|c| *c == "403").count()
        ),
        (N, N),
        "{unauthorized:?} {forbidden:?}"
    );
    let seconds = started.elapsed().as_secs() + 1;

    // Every refusal is in the log, one by one or counted; per kind at most two records a second.
    let read = || -> Vec<serde_json::Value> {
        match hub.cli_json(&["audit", "-o", "json"]).unwrap() {
            serde_json::Value::Array(a) => a,
            other => panic!("audit printed {other}"),
        }
    };
    let tally = |entries: &[serde_json::Value], pred: &dyn Fn(&serde_json::Value) -> bool| {
        let mine: Vec<&serde_json::Value> = entries.iter().filter(|e| pred(e)).collect();
        let total: u64 = mine
            .iter()
            // A summary record stands for the refusals it counted; any other for itself.
            .map(|e| e["suppressed"].as_u64().unwrap_or(0).max(1))
            .sum();
        (mine.len(), total)
    };
    let grpc =
        |e: &serde_json::Value| e["outcome"] == "unauthenticated" && e["call"] == "ListTasks";
    let a2a_401 =
        |e: &serde_json::Value| e["outcome"] == "unauthenticated" && e["call"] == "A2A JSON-RPC";
    let a2a_403 =
        |e: &serde_json::Value| e["outcome"] == "permission_denied" && e["call"] == "A2A JSON-RPC";
    let mut entries = Vec::new();
    agen_tests::wait_for("every refusal counted", Duration::from_secs(10), || {
        entries = read();
        [
            &grpc as &dyn Fn(&serde_json::Value) -> bool,
            &a2a_401,
            &a2a_403,
        ]
        .iter()
        .all(|p| tally(&entries, *p).1 == N as u64)
        .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {entries:#?}"));
    for (kind, pred) in [
        ("grpc", &grpc as &dyn Fn(&serde_json::Value) -> bool),
        ("a2a 401", &a2a_401),
        ("a2a 403", &a2a_403),
    ] {
        let (records, total) = tally(&entries, pred);
        eprintln!("{kind}: {total} refusals in {records} records over {seconds} s");
        assert!(
            records as u64 <= 2 * (seconds + 1),
            "{kind}: {records} records"
        );
        assert!(records < N / 4, "{kind}: {records} records");
        for e in entries.iter().filter(|e| pred(e)) {
            assert!(
                e["peer"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("127.0.0.1:")),
                "{e}"
            );
        }
    }
    // The 403s name the token that was not enough.
    assert!(entries
        .iter()
        .filter(|e| a2a_403(e))
        .all(|e| e["token_name"] == "looker" && e["namespace"] == "default"));
    // Once the second is over, a refusal is written at once again, saying why (revoked).
    let revoked_call = || {
        rt.block_on(async {
            let mut client =
                pb::agen_service_client::AgenServiceClient::new(hub.channel().await.unwrap());
            let mut req = tonic::Request::new(pb::ListTasksRequest::default());
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {revoked}").parse().unwrap(),
            );
            client.list_tasks(req).await.err().unwrap().code()
        })
    };
    agen_tests::wait_for(
        "the revoked token's refusal",
        Duration::from_secs(10),
        || {
            assert_eq!(revoked_call(), tonic::Code::Unauthenticated);
            read()
                .iter()
                .any(|e| grpc(e) && e["message"].as_str().is_some_and(|m| m.contains("revoked")))
                .then_some(())
        },
    )
    .unwrap();
}
