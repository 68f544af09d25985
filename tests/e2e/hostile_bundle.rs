//! Hostile bundle archives against a real Hub: link chains that resolve outside once unpacked,
//! links to `/dev/zero`, oversized files — each uploaded over real gRPC as an attacker would
//! (the CLI refuses to pack them), refused with the file named, while the Hub's memory stays
//! bounded and it keeps serving. And the CLI's own `agen deploy` refusing a local link chain.

use std::path::Path;

use agen_proto::v1 as pb;
use agen_shared::bundle::{digest, encode, ArchiveEntry, EntryKind};
use agen_shared::client_config::ClientConfig;
use agen_tests::HubProcess;
use pb::agen_service_client::AgenServiceClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const AGENT_MD: &str = "---\nmodel: openai/gpt-4.1-mini\n---\nYou are helpful.\n";

fn entry(path: &str, kind: EntryKind, data: &[u8]) -> ArchiveEntry {
    ArchiveEntry {
        path: path.into(),
        kind,
        data: data.to_vec(),
    }
}

/// Uploads `entries` as an archive straight over gRPC; the Hub's error message, or `None`.
async fn upload(hub_dir: &Path, mut entries: Vec<ArchiveEntry>) -> Option<String> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let bytes = encode(&entries).expect("encode");
    let cfg = ClientConfig::load(&hub_dir.join("client.toml")).expect("client config");
    let pem = std::fs::read(cfg.ca_file.expect("ca file")).expect("ca pem");
    let channel = Endpoint::from_shared(cfg.hub.expect("hub url"))
        .expect("url")
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    let token: tonic::metadata::MetadataValue<_> = format!("Bearer {}", cfg.token.expect("token"))
        .parse()
        .expect("header");
    let mut client =
        AgenServiceClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", token.clone());
            Ok(r)
        });
    let mut chunks: Vec<pb::BundleChunk> = bytes
        .chunks(1 << 20)
        .map(|c| pb::BundleChunk {
            data: c.to_vec(),
            ..Default::default()
        })
        .collect();
    chunks[0].digest = digest(&bytes);
    chunks[0].total_size = bytes.len() as u64;
    match client
        .upload_bundle(tonic::codegen::tokio_stream::iter(chunks))
        .await
    {
        Ok(_) => None,
        Err(s) => Some(s.message().to_string()),
    }
}

/// The Hub's peak resident memory (VmHWM) in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bundle_archives_are_refused_at_deploy_naming_the_file_and_the_hub_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    // Something outside the bundle a chain could reach: the Hub's own data dir has files.
    let agent = || entry("x-agen/agent.md", EntryKind::File, AGENT_MD.as_bytes());
    let link = |p: &str, t: &str| entry(p, EntryKind::Symlink, t.as_bytes());
    let file = |p: &str, d: &[u8]| entry(p, EntryKind::File, d);
    let big = vec![b'a'; 5 * 1024 * 1024];
    #[rustfmt::skip]
    let attacks: Vec<(&str, Vec<ArchiveEntry>, &str)> = vec![
        ("chain to /", vec![file("d/f", b""), link("d/l0", ".."), link("u1", "d/l0/.."), link("x-agen", "u1/etc")],
            "symlink u1 -> d/l0/.. points outside the bundle (through d/l0 -> ..)"),
        ("chain to /dev/zero", vec![file("a/b/c", b""), link("a/b/up", "../.."), link("a/b/up2", "up/.."), link("x-agen/agent.md", "../a/b/up2/dev/zero")],
            "points outside the bundle"),
        ("link to a missing device", vec![agent(), link("zero", "dev/zero")],
            "symlink zero -> dev/zero points to dev, which is not a file or folder in the bundle"),
        ("oversized agent.md", vec![file("x-agen/agent.md", &big)],
            "x-agen/agent.md: is larger than 4 MiB"),
        ("oversized mcp.json", vec![agent(), file("mcp.json", &big)],
            "mcp.json: is larger than 4 MiB"),
    ];
    let mut unrefused = Vec::new();
    for (name, entries, expected) in attacks {
        match upload(&hub.dir, entries).await {
            Some(msg) if msg.contains(expected) => {}
            other => unrefused.push(format!("{name}: expected {expected:?}, got {other:?}")),
        }
    }
    // A good archive still goes through, so the refusals are not a broken upload path.
    let accepted = upload(
        &hub.dir,
        vec![agent(), file("lib/a.py", b"a"), link("b.py", "lib/a.py")],
    )
    .await;
    let peak = peak_rss_mib(hub.proc.pid());
    assert_eq!(unrefused, Vec::<String>::new());
    assert_eq!(accepted, None);
    assert!(peak < 400, "the Hub peaked at {peak} MiB");
    hub.cli_json(&["nests", "-o", "json"]).unwrap();
}

#[test]
fn agen_deploy_refuses_a_local_link_chain_naming_the_link() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let dir = tmp.path().join("bundle");
    std::fs::create_dir_all(dir.join("x-agen")).unwrap();
    std::fs::create_dir_all(dir.join("d")).unwrap();
    std::fs::write(dir.join("x-agen/agent.md"), AGENT_MD).unwrap();
    std::os::unix::fs::symlink("..", dir.join("d/l0")).unwrap();
    std::os::unix::fs::symlink("d/l0/..", dir.join("u1")).unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "chain"])
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("symlink u1 -> d/l0/.. points outside the bundle"),
        "{err}"
    );
}
