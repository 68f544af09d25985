//! Rolling the Hub's CA (issue 42 item 7): `agen hub rotate-ca` with runs in flight on a real
//! fleet ends with every task succeeded (0 lost, 0 cancelled or failed); the Nest renews its
//! certificate from the new CA and takes the new CAs as its trust by itself; a client that
//! trusts only the previous CA still works during the overlap, the local client config works
//! throughout; after `--finish` and a Hub restart the Nest keeps working, and a certificate
//! signed only by the previous CA is refused.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agen_proto::v1 as pb;
use agen_tests::wait_for;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::chaos::{assert_safe, fleet, Fleet};

fn rotate(f: &Fleet, finish: bool) -> String {
    let mut cmd = Command::new(agen_tests::agen_bin());
    cmd.args(["hub", "rotate-ca", "--data-dir"])
        .arg(f.root.join("hub"))
        .env("AGEN_CONFIG", f.root.join("client.toml"));
    if finish {
        cmd.arg("--finish");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "rotate-ca: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Whether `Join` (a renewal with the Nest's own certificate) succeeds over a connection that
/// presents `cert_pem`/`key_pem` and trusts `ca_pem`.
fn renews_with(f: &Fleet, ca_pem: &str, cert_pem: &str, key_pem: &str, nest_id: &str) -> bool {
    agen_shared::tls::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca_pem))
            .identity(Identity::from_pem(cert_pem, key_pem))
            .domain_name("localhost");
        let Ok(endpoint) = Endpoint::from_shared(f.hub.url()).unwrap().tls_config(tls) else {
            return false;
        };
        let Ok(channel) = endpoint.connect().await else {
            return false;
        };
        let mut nest = pb::nest_service_client::NestServiceClient::new(channel);
        let csr_pem = agen_shared::tls::nest_csr_for_key(key_pem, nest_id).unwrap();
        nest.join(pb::JoinRequest {
            nest_id: nest_id.into(),
            name: "n1".into(),
            csr_pem,
        })
        .await
        .is_ok()
    })
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `agen tasks` with a client config of the Hub's URL and token whose CA file is `ca`.
fn tasks_trusting(f: &Fleet, ca: &Path) -> bool {
    let config = f.root.join(format!(
        "client-{}.toml",
        ca.file_name().unwrap().to_string_lossy()
    ));
    let mut text = read(&f.root.join("client.toml"));
    text = text
        .lines()
        .filter(|l| !l.starts_with("ca_file"))
        .collect::<Vec<_>>()
        .join("\n");
    text.push_str(&format!("\nca_file = {:?}\n", ca.to_string_lossy()));
    std::fs::write(&config, text).unwrap();
    agen_tests::cli(&config, &["tasks"])
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn rotate_ca_with_runs_in_flight_loses_nothing_and_finish_refuses_the_old_ca() {
    let mut f = fleet(&["n1"], 1, 4, 1.5, 0);
    let tls_dir = f.root.join("hub/tls");
    let nest_dir = f.nests[0].dir.clone();
    let nest_id = read(&nest_dir.join("node-id")).trim().to_owned();
    let old_ca = read(&tls_dir.join("ca.pem"));
    let old_ca_copy = f.root.join("old-ca.pem");
    std::fs::write(&old_ca_copy, &old_ca).unwrap();
    let (old_cert, key) = (
        read(&nest_dir.join("nest.crt")),
        read(&nest_dir.join("nest.key")),
    );

    // Runs in flight while the CA rolls.
    let mut tasks: Vec<String> = (0..4).map(|i| f.submit(&format!("before-{i}"))).collect();
    wait_for("a run in flight", Duration::from_secs(30), || {
        (!f.charges().is_empty()).then_some(())
    })
    .unwrap();
    let token = rotate(&f, false);
    let new_ca = read(&tls_dir.join("ca.pem"));
    let new_sha = agen_shared::tls::ca_pem_sha256(&new_ca).unwrap();
    assert_ne!(new_ca, old_ca);
    assert!(token.starts_with(&format!("agen1.{new_sha}.")), "{token}");
    assert_eq!(read(&f.root.join("hub/join-token")).trim(), token);

    // The Nest renews from the new CA and trusts the new CAs, by itself.
    wait_for("the nest's renewal", Duration::from_secs(30), || {
        let trust = std::fs::read_to_string(nest_dir.join("hub-ca.pem")).ok()?;
        let cert = std::fs::read_to_string(nest_dir.join("nest.crt")).ok()?;
        (agen_shared::tls::ca_pem_sha256(&trust).ok()? == new_sha
            && agen_shared::tls::nest_cert_is_current(&cert, &new_ca, &nest_id))
        .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; nest log:\n{}", f.nests[0].proc.log_text()));
    // During the overlap: the old certificate still renews, a client trusting only the old CA
    // works, and so does the local client config.
    assert!(renews_with(&f, &old_ca, &old_cert, &key, &nest_id));
    assert!(tasks_trusting(&f, &old_ca_copy), "a client of the old CA");
    tasks.extend((0..2).map(|i| f.submit(&format!("overlap-{i}"))));
    let c = f.settle(&tasks, Duration::from_secs(120));
    assert_safe(&f, &c);
    assert_eq!(
        (c.terminal, c.succeeded),
        (6, 6),
        "0 cancelled or failed: {c:?}"
    );

    // Finished: only the new CA. A Hub restart makes the Nest connect afresh with it.
    rotate(&f, true);
    wait_for("the old CA refused", Duration::from_secs(10), || {
        (!renews_with(&f, &new_ca, &old_cert, &key, &nest_id)).then_some(())
    })
    .unwrap();
    let new_cert = read(&nest_dir.join("nest.crt"));
    assert!(
        renews_with(&f, &new_ca, &new_cert, &key, &nest_id),
        "the new certificate"
    );
    assert!(
        !tasks_trusting(&f, &old_ca_copy),
        "a client of the old CA alone"
    );
    f.restart_hub();
    wait_for("the nest back", Duration::from_secs(30), || {
        f.hub
            .nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == "n1" && n["state"] == "ready")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; nest log:\n{}", f.nests[0].proc.log_text()));
    let after: Vec<String> = (0..2).map(|i| f.submit(&format!("after-{i}"))).collect();
    let c = f.settle(&after, Duration::from_secs(60));
    assert_safe(&f, &c);
    assert_eq!((c.terminal, c.succeeded), (2, 2), "{c:?}");
    let all = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    let bad = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] != "succeeded")
        .count();
    assert_eq!(bad, 0, "every task succeeded: {all}");
}
