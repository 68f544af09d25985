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
