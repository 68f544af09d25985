//! gRPC server metrics (issue 42, item 2): every call the Hub serves is counted per service,
//! method and status code, with its duration, and the scrape passes `promtool check metrics`.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::{free_port, wait_for, HubProcess};

/// `GET /metrics` as Prometheus's classic text format.
fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: x\r\naccept: text/plain\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// The value of the sample line `series` (name and labels as printed).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn every_grpc_call_is_counted_by_method_and_code_and_the_scrape_passes_promtool() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--metrics-listen", &format!("127.0.0.1:{port}")],
    )
    .unwrap();
    let ok = r#"grpc_server_handled_total{grpc_service="agen.v1.AgenService",grpc_method="ListNests",grpc_code="OK"}"#;
    let not_found = r#"grpc_server_handled_total{grpc_service="agen.v1.AgenService",grpc_method="QueryTask",grpc_code="NotFound"}"#;
    let before = scrape(port);
    let (ok0, nf0) = (sample(&before, ok), sample(&before, not_found));
    for _ in 0..3 {
        assert!(hub.cli(&["nests"]).unwrap().status.success());
    }
    let out = hub.cli(&["query", "task-does-not-exist"]).unwrap();
    assert!(!out.status.success());

    let after = wait_for("the calls to be counted", Duration::from_secs(10), || {
        let text = scrape(port);
        (sample(&text, ok) >= ok0 + 3.0).then_some(text)
    })
    .unwrap();
    assert_eq!(
        (sample(&after, ok) - ok0, sample(&after, not_found) - nf0),
        (3.0, 1.0),
        "{after}"
    );
    let count = r#"grpc_server_handling_seconds_count{grpc_service="agen.v1.AgenService",grpc_method="ListNests"}"#;
    assert!(sample(&after, count) >= 3.0, "{after}");

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus; tests/run.sh installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(after.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}
