//! Several Hubs on one PostgreSQL database (issue 38): a follower serves the whole client API
//! by forwarding it to the leader (submit, query, the `WatchTask` stream of `agen wait`), its
//! gRPC health says it follows (with the leader's epoch and URL) while the leader's says it
//! leads, `agen_hub_is_leader` is 0 and 1, and a Nest that knows only the follower is sent to
//! the leader by the leader hint and registers there. Ends in counts (lost, twice, stuck).

use std::io::{Read, Write};
use std::time::Duration;

use agen_tests::{cli, wait_for, HubProcess};

use crate::chaos::{assert_safe, wait_charges};
use crate::several_hubs::{epoch, group, outcomes};

/// The metrics port the Hub logged (`--metrics-listen 127.0.0.1:0`).
fn metrics_port(hub: &HubProcess) -> u16 {
    wait_for("the hub's metrics port", Duration::from_secs(30), || {
        let log = hub.proc.log_text();
        let line = log
            .lines()
            .find(|l| l.contains("serving metrics at /metrics"))?;
        let at = line.split("addr=").nth(1)?;
        let port: String = at
            .split(':')
            .nth(1)?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        port.parse().ok()
    })
    .unwrap()
}

/// `agen_hub_is_leader` as `GET /metrics` shows it.
fn is_leader(port: u16) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: x\r\naccept: text/plain\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find(|l| l.starts_with("agen_hub_is_leader "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// gRPC health of `service` at `url` (trusting `hub`'s CA): (serving, role, epoch, leader).
fn health(hub: &HubProcess, url: &str, service: &str) -> (bool, String, String, String) {
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let answer = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        let md = |k: &str| {
            answer
                .metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let serving = answer.get_ref().status
            == tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
        (
            serving,
            md("agen-hub-role"),
            md("agen-hub-epoch"),
            md("agen-leader"),
        )
    })
}

/// Hub A leads, B follows. Through B alone a client submits side-effecting tasks, queries
/// them and waits on one (`WatchTask` forwarded); B's health says follower with A's epoch and
/// URL, A's says leader; `agen_hub_is_leader` is 1 on A, 0 on B; a third Nest given only B's
/// URL registers with A. Every task succeeds on attempt 1, charged once.
#[test]
fn a_follower_serves_the_client_api_and_sends_nests_to_the_leader() {
    let n = 6;
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_follower");
    let url = cluster.url(&db);
    let tmp = tempfile::tempdir().unwrap();
    let (mut f, b) = group(tmp.path(), &url, 4, 1.0);
    let e = epoch(cluster, &db).to_string();

    // Health and metrics on both.
    let (serving, role, ep, leader) = health(&f.hub, &f.hub.url(), "");
    assert!(serving, "the leader is SERVING");
    assert_eq!((role.as_str(), ep.as_str()), ("leader", e.as_str()));
    assert_eq!(leader, f.hub.url());
    let (serving, role, ep, leader) = health(&f.hub, &b.url(), "");
    assert!(serving, "the follower serves the client API");
    assert_eq!((role.as_str(), ep.as_str()), ("follower", e.as_str()));
    assert_eq!(leader, f.hub.url(), "the follower names the leader");
    assert!(
        !health(&f.hub, &b.url(), "agen.v1.NestService").0,
        "the follower does not serve Nests"
    );
    assert!(health(&f.hub, &f.hub.url(), "agen.v1.NestService").0);
    assert_eq!(is_leader(metrics_port(&f.hub)), Some(1.0));
    assert_eq!(is_leader(metrics_port(&b)), Some(0.0));

    // A client that knows only the follower.
    let token = std::fs::read_to_string(f.hub.dir.join("hub/admin-token")).unwrap();
    let cfg = tmp.path().join("follower.toml");
    std::fs::write(
        &cfg,
        format!(
            "hub = \"{}\"\nca_file = \"{}\"\ntoken = \"{}\"\n",
            b.url(),
            b.dir.join("hub/tls/ca.pem").display(),
            token.trim()
        ),
    )
    .unwrap();
    let tasks: Vec<String> = (0..n)
        .map(|i| {
            let out = cli(&cfg, &["submit", "charge", &format!("charge customer {i}")]).unwrap();
            assert!(
                out.status.success(),
                "submit through the follower: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .collect();
    wait_charges(&f, n);
    let out = cli(&cfg, &["wait", &tasks[0], "--timeout", "60s"]).unwrap();
    assert!(
        out.status.success(),
        "agen wait (WatchTask) through the follower: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let q = cli(&cfg, &["query", &tasks[0], "-o", "json"]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    assert_eq!(v["state"], "succeeded", "query through the follower");

    // A Nest that knows only the follower is told where the leader is.
    f.hub.nest_hub = Some(b.url());
    let c = f
        .hub
        .nest_with("nest-c", &[], &[], &["--run-as-self"])
        .unwrap();
    wait_for("nest-c to register", Duration::from_secs(60), || {
        let nests = f.hub.cli_json(&["nests", "-o", "json"]).ok()?;
        nests
            .as_array()?
            .iter()
            .any(|n| n["name"] == "nest-c" && n["state"] == "ready")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\nnest-c log:\n{}", c.proc.log_text()));
    assert!(
        c.proc
            .log_text()
            .contains("a follower hub named the leader"),
        "nest-c followed the hint"
    );
    f.nests.push(c);

    let counts = f.settle(&tasks, Duration::from_secs(120));
    let (first, cancelled, unknown) = outcomes(&f, &tasks);
    assert_safe(&f, &counts);
    assert_eq!(counts.succeeded, n, "every task succeeded: {counts:?}");
    assert_eq!(counts.charged_1, n, "every charge ran once: {counts:?}");
    assert_eq!((counts.lost, counts.stuck), (0, 0), "{counts:?}");
    assert_eq!((first, cancelled, unknown), (n, 0, 0));
}

/// A Hub refuses (exit 64) a `--nest-lease` that does not exceed the leader lease plus the
/// Nests' reconnect time, naming both values and the fix; the same lease one second longer
/// gets past the check (to the database, absent here).
#[test]
fn a_nest_lease_not_above_the_leader_lease_and_reconnect_time_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |nest_lease: &str| {
        std::process::Command::new(agen_tests::agen_bin())
            .args(["hub", "--data-dir"])
            .arg(tmp.path().join("hub"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--store",
                "postgres://agen@127.0.0.1:1/none?connect_timeout=1",
                "--identity-key-file",
            ])
            .arg(tmp.path().join("identity.key"))
            .args(["--leader-lease", "5s", "--nest-lease", nest_lease])
            .output()
            .unwrap()
    };
    let out = run("10s");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    for part in [
        "--nest-lease 10s does not exceed",
        "--leader-lease 5s",
        "reconnect time (5s)",
        "give --nest-lease more than 10s",
    ] {
        assert!(err.contains(part), "{part:?} in: {err}");
    }
    let out = run("11s");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("--nest-lease"), "11s passes the check: {err}");
}
