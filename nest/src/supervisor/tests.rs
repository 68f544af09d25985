//! Supervisor behaviour with real child processes: restarts with back-off, capacity, runs for
//! missing instances, secrets, and a second hello for a live instance.

use super::*;
use std::time::Instant;

use crate::model::{AssignedRun, InstanceState};
use tokio::net::UnixStream;

use crate::socket::{self, ToNest};
use pretty_assertions::assert_eq;

/// A supervisor on a fresh data dir whose "agen" is `bin`, with one bundle already cached.
fn supervisor(
    dir: &std::path::Path,
    bin: &str,
    capacity: u32,
) -> (Arc<Supervisor>, String, Reports) {
    let mut opts = NestOptions::new("http://127.0.0.1:9", "t");
    opts.capacity = capacity;
    opts.data_dir = dir.to_path_buf();
    opts.agen_bin = PathBuf::from(bin);
    opts.name = "n1".into();
    let opts = Arc::new(opts);
    let digest = format!("sha256:{}", "a".repeat(64));
    std::fs::create_dir_all(opts.bundles_dir().join("a".repeat(64))).expect("cached bundle");
    let client = Arc::new(crate::hub_client::ClientSlot::default());
    let bundles = Arc::new(BundleCache::new(opts.clone(), client));
    let children = Arc::new(Children::open(&opts.children_file()));
    let (sup, reports) = Supervisor::new(
        opts,
        children,
        bundles,
        Arc::new(Outbox::default()),
        Arc::new(crate::separation::Separation::off()),
        Arc::new(crate::netns::Network::off("unit test")),
        CancellationToken::new(),
    );
    (sup, digest, reports)
}

async fn wait_for(
    sup: &Supervisor,
    what: &str,
    f: impl Fn(&[InstanceReport]) -> bool,
) -> Vec<InstanceReport> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let snap = sup.snapshot();
        if f(&snap) {
            return snap;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {snap:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_instance_is_restarted_with_back_off_then_reported_unhealthy_and_stops_cleanly()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let (sup, digest, mut reports) = supervisor(dir.path(), "/bin/false", 4);
    let place = PlaceOrder {
        instance_id: "i1".into(),
        namespace: "ns".into(),
        deployment: "d".into(),
        bundle_digest: digest,
        ..Default::default()
    };
    sup.place(place.clone());
    sup.place(place); // a repeated placement is a no-op
    let snap = wait_for(&sup, "three restarts", |s| {
        s.len() == 1 && s[0].restarts >= UNHEALTHY_AFTER_CRASHES
    })
    .await;
    let r = &snap[0];
    assert_eq!(r.state, InstanceState::Unhealthy, "{r:?}");
    assert!(
        r.message
            .starts_with("instance process exited with status 1; restarting in"),
        "{}",
        r.message
    );

    // Stopping it (even mid back-off) forgets it and reports it one last time.
    sup.stop("i1", "replaced by the hub");
    wait_for(&sup, "the instance to be forgotten", |s| s.is_empty()).await;
    // Every change went through the channel; what queued up is one report per instance, the
    // newest: here the final one.
    let first = reports.recv().await.expect("the supervisor reports");
    let queued = reports.coalesce(first);
    assert_eq!(queued.len(), 1, "one instance, one report: {queued:?}");
    let last = &queued[0];
    assert_eq!(last.instance_id, "i1");
    assert_eq!((last.state, last.healthy), (InstanceState::Stopping, false));
    assert!(
        sup.children.list().is_empty(),
        "nothing left in children.json"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placement_beyond_capacity_is_reported_unhealthy_until_the_hub_stops_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sup, digest, _reports) = supervisor(dir.path(), "/bin/false", 1);
    for id in ["i1", "i2"] {
        sup.place(PlaceOrder {
            instance_id: id.into(),
            bundle_digest: digest.clone(),
            ..Default::default()
        });
    }
    let snap = sup.snapshot();
    let i2 = snap
        .iter()
        .find(|r| r.instance_id == "i2")
        .expect("i2 is reported");
    assert_eq!(i2.state, InstanceState::Unhealthy);
    assert_eq!(i2.message, "nest n1 is at capacity (1 instances)");
    sup.stop("i2", "replaced");
    wait_for(&sup, "i2 to be forgotten", |s| {
        s.iter().all(|r| r.instance_id != "i2")
    })
    .await;
    sup.stop("i1", "done");
    wait_for(&sup, "i1 to be forgotten", |s| s.is_empty()).await;
}

#[tokio::test]
async fn a_run_for_an_instance_that_is_not_here_is_reported_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sup, _, _reports) = supervisor(dir.path(), "/bin/false", 4);
    sup.assign(AssignedRun {
        run_id: "r1".into(),
        attempt: 2.into(),
        task_id: "t1".into(),
        instance_id: "nope".into(),
        ..Default::default()
    });
    let batch = sup.outbox.take_batch(10);
    assert_eq!(batch.len(), 1);
    let ev = &batch[0].events[0];
    assert_eq!(
        (
            ev.run_id.as_str(),
            ev.attempt,
            ev.seq,
            ev.body.kind(),
            ev.sync
        ),
        ("r1", 2, 1, "run.interrupted", true)
    );
    match &ev.body {
        agen_contract::run::RunEventBody::RunInterrupted(i) => {
            assert_eq!(i.reason, "instance nope is not running on nest n1")
        }
        other => panic!("not a run.interrupted: {other:?}"),
    }
}

#[test]
fn secrets_are_resolved_from_the_nest_env_and_the_hub_and_missing_ones_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = dir.path();
    std::fs::create_dir_all(b.join("x-agen")).expect("mkdir");
    std::fs::write(b.join("x-agen/agent.md"), "---\nname: t\n---\nhi\n").expect("write");
    std::fs::write(
        b.join("x-agen/secrets.json"),
        r#"{"FROM_ENV": {"source": "env", "var": "NEST_VAR"}, "FROM_HUB": {"source": "platform"}, "UNSET": {"source": "env", "var": "NOPE"}, "UNUSED": {"source": "platform"}}"#,
    )
    .expect("write");
    std::fs::write(
        b.join("mcp.json"),
        r#"{"mcpServers": {"s": {"command": "x", "env": {"A": "${FROM_ENV}", "B": "${FROM_HUB}", "C": "${UNSET}"}}}}"#,
    )
    .expect("write");
    let mut opts = NestOptions::new("http://127.0.0.1:1", "t");
    opts.name = "n1".into();
    opts.env = vec![("NEST_VAR".into(), "from-env".into())];
    let p = PlaceOrder {
        instance_id: "i".into(),
        namespace: "default".into(),
        deployment: "d".into(),
        platform_secrets: [("FROM_HUB".to_string(), "from-hub".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let got = build_placement(&p, b, &opts);
    assert_eq!(
        got.secrets,
        BTreeMap::from([
            ("FROM_ENV".to_string(), "from-env".to_string()),
            ("FROM_HUB".to_string(), "from-hub".to_string())
        ])
    );
    assert_eq!(
        got.missing_secrets,
        vec!["secret UNSET used in mcp.json mcpServers.s.env.C has no value: environment variable NOPE is not set on nest n1; set it in the nest's environment".to_string()]
    );
    assert_eq!(got.concurrency, 1);
}

/// Says hello as `id` with `secret` on a fresh connection to the Nest socket.
async fn hello(
    path: &std::path::Path,
    id: &str,
    secret: socket::SpawnSecret,
) -> (
    socket::Reader<ToInstance>,
    socket::Writer<ToNest>,
    Option<ToInstance>,
) {
    let stream = UnixStream::connect(path).await.expect("connect");
    let (mut r, mut w) = socket::split::<ToInstance, ToNest>(stream);
    w.send(&ToNest::Hello {
        instance_id: id.into(),
        pid: 1,
        secret,
    })
    .await
    .expect("send hello");
    let first = tokio::time::timeout(Duration::from_secs(10), r.next())
        .await
        .expect("an answer in time")
        .expect("a readable answer");
    (r, w, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_hello_for_a_live_instance_is_refused_and_the_first_connection_keeps_working() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    // An "agen" that starts and never connects: the test plays the instance.
    let bin = dir.path().join("fake-agen");
    std::fs::write(&bin, "#!/bin/sh\nexec sleep 300\n").expect("write script");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (sup, digest, _reports) = supervisor(dir.path(), bin.to_str().expect("utf-8"), 4);
    let path = sup.opts.socket_path();
    let listener = socket::listen(&path, 0o600).expect("listen");
    tokio::spawn(sup.clone().serve(listener));
    sup.place(PlaceOrder {
        instance_id: "i1".into(),
        namespace: "ns".into(),
        deployment: "d".into(),
        bundle_digest: digest,
        ..Default::default()
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let secret = loop {
        let cred = sup
            .lock()
            .instances
            .get_mut("i1")
            .and_then(|e| e.cred.as_mut())
            .map(|c| {
                // The spawned pid stands for this test process, which plays the instance.
                c.pid = i32::try_from(std::process::id()).expect("pid fits");
                c.secret.clone()
            });
        if let Some(s) = cred {
            break s;
        }
        assert!(Instant::now() < deadline, "the instance was never spawned");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let (mut real, _real_w, first) = hello(&path, "i1", secret.clone()).await;
    assert!(
        matches!(first, Some(ToInstance::Placement(ref p)) if p.instance_id == "i1"),
        "{first:?}"
    );
    // A replay of the very same hello (right secret, right pid), a guessed secret, and ids
    // that were never placed here: one answer for all, naming no instance (an attacker on the
    // socket learns nothing of which ids exist or are connected).
    let mut answers = Vec::new();
    for (id, secret) in [
        ("i1", secret.clone()),
        ("i1", socket::SpawnSecret::generate()),
        ("i2", socket::SpawnSecret::generate()),
        ("other-namespace-instance", secret.clone()),
    ] {
        let (_, _, answer) = hello(&path, id, secret).await;
        match answer {
            Some(ToInstance::Refused { reason }) => {
                assert!(!reason.contains(id), "{reason}");
                answers.push(reason);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    answers.dedup();
    assert_eq!(answers, vec![super::identity::PEER_REFUSAL.to_string()]);
    // The real connection is still the instance's: a run reaches it.
    sup.assign(AssignedRun {
        run_id: "r1".into(),
        attempt: 1.into(),
        task_id: "t1".into(),
        instance_id: "i1".into(),
        ..Default::default()
    });
    let got = tokio::time::timeout(Duration::from_secs(10), real.next())
        .await
        .expect("the run in time")
        .expect("readable");
    assert!(
        matches!(got, Some(ToInstance::Run(ref o)) if o.run.run_id.as_str() == "r1"),
        "{got:?}"
    );
    sup.stop("i1", "done");
    wait_for(&sup, "i1 to be forgotten", |s| s.is_empty()).await;
}

#[test]
fn queued_reports_go_as_the_newest_of_each_instance_in_the_order_they_changed_last() {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut reports = Reports(rx);
    let report = |id: &str, message: &str| {
        let place = PlaceOrder {
            instance_id: id.into(),
            ..Default::default()
        };
        InstanceReport::new(&place, InstanceState::Starting, message.into())
    };
    for r in [
        report("a", "1"),
        report("b", "1"),
        report("a", "2"),
        report("c", "1"),
    ] {
        tx.send(r).expect("send");
    }
    let sent: Vec<(String, String)> = reports
        .coalesce(report("b", "0"))
        .into_iter()
        .map(|r| (r.instance_id, r.message))
        .collect();
    assert_eq!(
        sent,
        vec![
            ("b".to_string(), "1".to_string()),
            ("a".to_string(), "2".to_string()),
            ("c".to_string(), "1".to_string()),
        ]
    );
    reports.clear();
    tx.send(report("a", "3")).expect("send");
    reports.clear();
    assert!(reports.0.try_recv().is_err(), "cleared");
}
