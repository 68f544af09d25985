//! Schedules and webhooks (issue 46) through the real Hub and CLI: a 6-field schedule fires
//! exactly once per slot across a Hub kill -9 right after a firing (tasks counted per slot),
//! and across kills 150 ms before, at and 150 ms after a fire time (no slot while a Hub ran
//! lost, none twice, an outage's slots fire at most one task);
//! pause, resume and run-now; a bad expression or time zone is INVALID_ARGUMENT naming its
//! field; a webhook delivery verified by a receiver this test runs (HMAC-SHA256 over
//! timestamp and body), retried until the receiver came up, and a private address refused; a
//! submit's webhook with `--webhook-on-waiting` told of the approval wait, then of the end; a
//! delivery that failed before a Hub kill -9 retried by the restarted Hub, received once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use agen_tests::{mcp_json, wait_for, write_bundle, HubProcess};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use tonic::Code;

use crate::limits::{api, runtime, Api};

/// A deployment `runner` with no replica: its tasks stay queued (nothing runs them).
pub(crate) fn deploy_idle(hub: &HubProcess, dir: &Path) {
    deploy_idle_with(hub, dir, &[]);
}

fn deploy_idle_with(hub: &HubProcess, dir: &Path, more: &[&str]) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                "---\nname: runner\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9/v1\n---\nYou answer.\n".into(),
            ),
        ],
    )
    .unwrap();
    let mut args = vec![
        "deploy",
        dir.to_str().unwrap(),
        "--name",
        "runner",
        "--replicas",
        "0",
    ];
    args.extend_from_slice(more);
    let out = hub.cli(&args).unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The tasks of schedule `id`, by slot label.
async fn fired(api: &mut Api, id: &str) -> BTreeMap<String, Vec<String>> {
    let tasks = api
        .list_tasks(pb::ListTasksRequest {
            deployment: "runner".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    let mut by_slot: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in tasks {
        if t.labels.get("agen.schedule").map(String::as_str) == Some(id) {
            let slot = t
                .labels
                .get("agen.schedule.slot")
                .cloned()
                .unwrap_or_default();
            by_slot.entry(slot).or_default().push(t.task_id);
        }
    }
    by_slot
}

pub(crate) fn create(hub: &HubProcess, cron: &str, tz: &str) -> Value {
    hub.cli_json(&[
        "schedules",
        "create",
        "runner",
        "--cron",
        cron,
        "--timezone",
        tz,
        "--input",
        "tick",
        "--overlap",
        "allow",
        "-o",
        "json",
    ])
    .unwrap()
}

#[test]
fn a_six_field_schedule_fires_once_per_slot_across_a_hub_kill_9_right_after_a_firing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    deploy_idle(&hub, &tmp.path().join("bundle"));
    let rt = runtime();
    let s = create(&hub, "*/2 * * * * *", "Europe/Oslo");
    let id = s["schedule_id"].as_str().unwrap().to_string();
    let mut a = rt.block_on(api(&hub));
    // Two slots fire, then the Hub is killed within moments of the third.
    wait_for("two slots to fire", Duration::from_secs(20), || {
        (rt.block_on(fired(&mut a, &id)).len() >= 2).then_some(())
    })
    .unwrap();
    let before = rt.block_on(fired(&mut a, &id)).len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(fired(&mut a, &id)).len() == before {
        assert!(Instant::now() < deadline, "no third slot fired");
        std::thread::sleep(Duration::from_millis(20));
    }
    let at_kill = rt.block_on(fired(&mut a, &id));
    hub.restart().unwrap();
    let ready = chrono::Utc::now();
    let mut a = rt.block_on(api(&hub));
    let mut after = BTreeMap::new();
    wait_for(
        "two more slots after the restart",
        Duration::from_secs(30),
        || {
            after = rt.block_on(fired(&mut a, &id));
            (after.len() >= at_kill.len() + 2).then_some(())
        },
    )
    .unwrap();
    let twice: Vec<_> = after.iter().filter(|(_, t)| t.len() > 1).collect();
    let empty = after.values().filter(|t| t.is_empty()).count();
    eprintln!("slots fired: {:?}", after.keys().collect::<Vec<_>>());
    assert_eq!((twice.len(), empty), (0, 0), "slots fired twice: {twice:?}");
    for (slot, tasks) in &at_kill {
        assert_eq!(
            after.get(slot),
            Some(tasks),
            "slot {slot} kept its one task"
        );
    }
    // Slots missed while no Hub ran (well before the new one was ready) fire one task
    // together (catch-up latest), not one each.
    let last_at_kill = at_kill.keys().max().cloned().unwrap();
    let missed = after
        .keys()
        .filter(|s| **s > last_at_kill)
        .filter(|s| {
            chrono::DateTime::parse_from_rfc3339(s).unwrap() < ready - chrono::Duration::seconds(3)
        })
        .count();
    assert!(missed <= 1, "{missed} missed slots fired");
    // Slots are 2 s apart: every label is an even second.
    for slot in after.keys() {
        let sec: u32 = slot[17..19].parse().unwrap();
        assert_eq!(sec % 2, 0, "{slot}");
    }
}

/// Sleeps until `offset_ms` (may be negative) from the next even second of the clock that is
/// at least 1.2 s away: a slot of a `*/2 * * * * *` schedule.
pub(crate) fn sleep_to_slot(offset_ms: i64) -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now().timestamp_millis();
    let mut slot = (now / 2000 + 1) * 2000;
    while slot + offset_ms - now < 1200 {
        slot += 2000;
    }
    std::thread::sleep(Duration::from_millis((slot + offset_ms - now) as u64));
    chrono::DateTime::from_timestamp_millis(slot).unwrap()
}

/// The tasks of schedule `id`: (slot, when the task was created), by slot.
pub(crate) async fn fired_at(
    api: &mut Api,
    id: &str,
) -> BTreeMap<chrono::DateTime<chrono::Utc>, Vec<i64>> {
    let tasks = api
        .list_tasks(pb::ListTasksRequest {
            deployment: "runner".into(),
            page_size: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    let mut by_slot: BTreeMap<_, Vec<i64>> = BTreeMap::new();
    for t in tasks {
        if t.labels.get("agen.schedule").map(String::as_str) != Some(id) {
            continue;
        }
        let slot = chrono::DateTime::parse_from_rfc3339(&t.labels["agen.schedule.slot"])
            .unwrap()
            .with_timezone(&chrono::Utc);
        by_slot.entry(slot).or_default().push(t.created_at_ms);
    }
    by_slot
}

#[test]
fn a_hub_killed_just_before_at_and_just_after_a_fire_time_fires_each_slot_once_not_zero_not_twice()
{
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    deploy_idle(&hub, &tmp.path().join("bundle"));
    let rt = runtime();
    let id = create(&hub, "*/2 * * * * *", "UTC")["schedule_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut a = rt.block_on(api(&hub));
    wait_for("a first slot to fire", Duration::from_secs(20), || {
        (!rt.block_on(fired_at(&mut a, &id)).is_empty()).then_some(())
    })
    .unwrap();
    // Each outage: (the kill, the first moment the restarted Hub answered).
    let mut down = Vec::new();
    for offset_ms in [-150, 0, 150] {
        sleep_to_slot(offset_ms);
        let killed = chrono::Utc::now();
        hub.restart().unwrap();
        down.push((killed, chrono::Utc::now()));
    }
    let mut a = rt.block_on(api(&hub));
    let last_up = down.last().unwrap().1;
    let mut after = BTreeMap::new();
    wait_for(
        "two slots after the last restart",
        Duration::from_secs(30),
        || {
            after = rt.block_on(fired_at(&mut a, &id));
            (after.keys().filter(|s| **s > last_up).count() >= 2).then_some(())
        },
    )
    .unwrap();
    eprintln!("outages: {down:?}\nslots fired: {after:?}");
    // Not twice: one task per slot, whichever Hub fired it.
    let twice: Vec<_> = after.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(twice.is_empty(), "slots fired twice: {twice:?}");
    let ms = chrono::Duration::milliseconds;
    // Not zero: a slot with no task fell in an outage (from a pass before the kill, 200 ms
    // apart, to the restarted Hub's first pass).
    let first = *after.keys().next().unwrap();
    let last = *after.keys().last().unwrap();
    let mut t = first;
    while t <= last {
        if !after.contains_key(&t) {
            assert!(
                down.iter()
                    .any(|(k, u)| t > *k - ms(500) && t <= *u + ms(500)),
                "slot {t}, not in an outage, did not fire; outages: {down:?}"
            );
        }
        t += ms(2000);
    }
    for (i, (k, u)) in down.iter().enumerate() {
        // Slots missed while no Hub ran fire one task together (catch-up latest), not one
        // each: of the slots up to the restart, at most one was fired late (after the kill,
        // and not by the pass right after its time).
        let caught_up = after
            .iter()
            .filter(|(slot, created)| {
                **slot <= *u
                    && created[0] > k.timestamp_millis()
                    && created[0] - slot.timestamp_millis() > 700
            })
            .count();
        assert!(
            caught_up <= 1,
            "outage {i} ({k}..{u}) fired {caught_up} missed slots"
        );
        // And the outage is not lost: the restarted Hub fired a slot of it or the next one.
        let resumed = after.iter().any(|(slot, created)| {
            *slot > *k - ms(500) && *slot <= *u + ms(2100) && created[0] > k.timestamp_millis()
        });
        assert!(resumed, "outage {i} ({k}..{u}): nothing fired after it");
    }
}

#[test]
fn pause_resume_and_run_now_and_bad_expressions_name_their_field() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    deploy_idle(&hub, &tmp.path().join("bundle"));
    let rt = runtime();
    let mut a = rt.block_on(api(&hub));
    // A bad expression or zone: INVALID_ARGUMENT naming the field, over the API and the CLI.
    for (cron, tz, field) in [
        ("* * *", "UTC", "cron:"),
        ("*/2 * * * 13 *", "UTC", "cron:"),
        ("0 7 * * *", "Europe/Atlantis", "timezone:"),
    ] {
        let e = rt
            .block_on(a.create_schedule(pb::CreateScheduleRequest {
                deployment: "runner".into(),
                cron: cron.into(),
                timezone: tz.into(),
                input: "tick".into(),
                ..Default::default()
            }))
            .expect_err(cron);
        assert_eq!(e.code(), Code::InvalidArgument, "{cron} {tz}: {e:?}");
        assert!(
            e.message().starts_with(field),
            "{cron} {tz}: {}",
            e.message()
        );
    }
    let out = hub
        .cli(&[
            "schedules",
            "create",
            "runner",
            "--cron",
            "0 7 * * *",
            "--timezone",
            "Mars/Olympus",
            "--input",
            "x",
        ])
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("timezone: unknown time zone"));

    let s = create(&hub, "* * * * * *", "UTC");
    let id = s["schedule_id"].as_str().unwrap().to_string();
    wait_for("a firing", Duration::from_secs(10), || {
        (!rt.block_on(fired(&mut a, &id)).is_empty()).then_some(())
    })
    .unwrap();
    let paused = hub
        .cli_json(&["schedules", "pause", &id, "-o", "json"])
        .unwrap();
    assert_eq!(paused["paused"], true);
    // Whatever was in flight lands; then 3 s of slots pass with nothing fired.
    std::thread::sleep(Duration::from_millis(500));
    let at_pause = rt.block_on(fired(&mut a, &id));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        rt.block_on(fired(&mut a, &id)),
        at_pause,
        "a paused schedule fired"
    );
    // Run-now fires while paused, labelled `manual`.
    let task = String::from_utf8(hub.cli(&["schedules", "run-now", &id]).unwrap().stdout).unwrap();
    let now = rt.block_on(fired(&mut a, &id));
    assert_eq!(now.get("manual").map(|t| t[0].as_str()), Some(task.trim()));
    // Resumed: slots fire again, none of those skipped while paused.
    hub.cli_json(&["schedules", "resume", &id, "-o", "json"])
        .unwrap();
    let resumed_at = chrono::Utc::now();
    wait_for("a firing after resume", Duration::from_secs(10), || {
        (rt.block_on(fired(&mut a, &id)).len() > now.len()).then_some(())
    })
    .unwrap();
    for slot in rt.block_on(fired(&mut a, &id)).keys() {
        if slot == "manual" || at_pause.contains_key(slot) {
            continue;
        }
        let t = chrono::DateTime::parse_from_rfc3339(slot)
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert!(
            t >= resumed_at - chrono::Duration::seconds(1),
            "slot {slot} fired from the pause"
        );
    }
    let ls = hub.cli_json(&["schedules", "ls", "-o", "json"]).unwrap();
    assert_eq!(ls[0]["schedule_id"], id.as_str());
    hub.cli_json(&["schedules", "rm", &id, "-o", "json"])
        .unwrap();
    let ls = hub.cli_json(&["schedules", "ls", "-o", "json"]).unwrap();
    assert_eq!(ls.as_array().map(Vec::len), Some(0));
}

/// What the test's receiver got: (headers it needs, body).
type Received = Arc<Mutex<Vec<(String, String, String)>>>;

/// A receiver on `listener` that records each POST (signature, delivery id, body) and answers
/// 200. It runs on `rt`, a current-thread runtime: it serves only while the test drives `rt`.
fn receiver(rt: &tokio::runtime::Runtime, listener: std::net::TcpListener) -> Received {
    let got: Received = Arc::default();
    let store = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let store = store.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                store
                    .lock()
                    .unwrap()
                    .push((h("agen-signature"), h("agen-delivery"), body));
                "ok"
            }
        }),
    );
    listener.set_nonblocking(true).unwrap();
    rt.spawn(async move {
        let l = tokio::net::TcpListener::from_std(listener).unwrap();
        let _ = axum::serve(l, app).await;
    });
    got
}

fn verify(secret: &str, signature: &str, body: &str) -> bool {
    let mut t = "";
    let mut v1 = "";
    for part in signature.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = x,
            Some(("v1", x)) => v1 = x,
            _ => {}
        }
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    let age = chrono::Utc::now().timestamp() - t.parse::<i64>().unwrap_or(0);
    hex::decode(v1).is_ok_and(|sig| mac.verify_slice(&sig).is_ok()) && age.abs() < 300
}

#[test]
fn a_webhook_is_signed_retried_until_its_receiver_is_up_and_refused_for_a_private_address() {
    let tmp = tempfile::tempdir().unwrap();
    // The receiver's port is reserved now and served only later: the first attempts fail.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--webhook-allow", "127.0.0.1"],
    )
    .unwrap();
    deploy_idle(&hub, &tmp.path().join("bundle"));
    let rt = runtime();
    let mut a = rt.block_on(api(&hub));
    let url = format!("http://127.0.0.1:{port}/hook");
    // No webhook secret in the namespace yet: the submit says how to set one.
    let out = hub
        .cli(&["submit", "runner", "hello", "--webhook", &url])
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agen secrets set AGEN_WEBHOOK_SECRET"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let secret = "whsec-test-1234";
    let set = hub
        .cli(&["secrets", "set", "AGEN_WEBHOOK_SECRET", "--from-file", &{
            let f = tmp.path().join("secret");
            std::fs::write(&f, secret).unwrap();
            f.to_string_lossy().into_owned()
        }])
        .unwrap();
    assert!(set.status.success());
    let private = "https://10.255.255.1:8443/hook";
    let submit = |urls: &[&str]| {
        let mut args = vec!["submit", "runner", "hello"];
        for u in urls {
            args.push("--webhook");
            args.push(u);
        }
        let out = hub.cli(&args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let task = submit(&[&url, private]);
    rt.block_on(a.cancel_task(pb::CancelTaskRequest {
        task_id: task.clone(),
        reason: "done".into(),
        ..Default::default()
    }))
    .unwrap();
    // The receiver is down: attempts fail and are recorded.
    let webhooks = |a: &mut Api| {
        rt.block_on(a.list_task_webhooks(pb::ListTaskWebhooksRequest {
            task_id: task.clone(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .deliveries
    };
    wait_for("two failed attempts", Duration::from_secs(15), || {
        let d = webhooks(&mut a);
        d.iter()
            .any(|d| d.url == url && d.attempts >= 2 && d.state == "pending")
            .then_some(())
    })
    .unwrap();
    // Up now: the next retry is delivered, signed.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let got = receiver(&rt, listener);
    let delivered = wait_for("the retry to be delivered", Duration::from_secs(30), || {
        webhooks(&mut a)
            .into_iter()
            .find(|d| d.url == url && d.state == "delivered")
    })
    .unwrap();
    assert!(delivered.attempts >= 3, "{delivered:?}");
    let received = got.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "one delivery, received once");
    let (sig, delivery, body) = &received[0];
    assert!(verify(secret, sig, body), "signature {sig} over {body}");
    assert!(!verify("another secret", sig, body));
    assert_eq!(delivery, &delivered.delivery_id);
    let payload: Value = serde_json::from_str(body).unwrap();
    assert_eq!(payload["type"], "task.ended");
    assert_eq!(payload["task"]["task_id"], task.as_str());
    assert_eq!(payload["task"]["state"], "cancelled");
    // The private address is refused at every attempt, never connected to.
    let refused = webhooks(&mut a)
        .into_iter()
        .find(|d| d.url == private)
        .unwrap();
    assert_eq!(refused.state, "pending");
    assert!(
        refused.last_error.contains("refused") && refused.last_error.contains("--webhook-allow"),
        "{refused:?}"
    );
    // The CLI lists both.
    let listed = hub
        .cli_json(&["tasks", "webhooks", &task, "-o", "json"])
        .unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    // A deployment's webhook: every task of it is told, signed with the secret it names.
    let hook_secret = "deployment-hook-secret";
    let f = tmp.path().join("hook-secret");
    std::fs::write(&f, hook_secret).unwrap();
    let set = hub
        .cli(&[
            "secrets",
            "set",
            "HOOK_SECRET",
            "--from-file",
            f.to_str().unwrap(),
        ])
        .unwrap();
    assert!(set.status.success());
    let url2 = format!("http://127.0.0.1:{port}/hook?from=deployment");
    deploy_idle_with(
        &hub,
        &tmp.path().join("bundle"),
        &["--webhook", &url2, "--webhook-secret", "HOOK_SECRET"],
    );
    let task2 = submit(&[]);
    rt.block_on(a.cancel_task(pb::CancelTaskRequest {
        task_id: task2.clone(),
        reason: "done".into(),
        ..Default::default()
    }))
    .unwrap();
    // (Each call drives this test's runtime, where the receiver runs.)
    wait_for("the deployment's delivery", Duration::from_secs(20), || {
        let d = rt
            .block_on(a.list_task_webhooks(pb::ListTaskWebhooksRequest {
                task_id: task2.clone(),
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .deliveries;
        (d.len() == 1 && d[0].state == "delivered" && d[0].url == url2).then_some(())
    })
    .unwrap();
    assert_eq!(
        got.lock().unwrap().len(),
        2,
        "one more delivery, received once"
    );
    let (sig, _, body) = got.lock().unwrap()[1].clone();
    assert!(
        verify(hook_secret, &sig, &body),
        "signature {sig} over {body}"
    );
    let payload: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(payload["task"]["task_id"], task2.as_str());
}

#[test]
fn a_webhook_on_waiting_is_told_of_the_approval_wait_and_then_of_the_end_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--webhook-allow", "127.0.0.1"],
    )
    .unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = crate::approvals::model(tmp.path(), &marker);
    crate::approvals::deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let secret = "whsec-waiting-5678";
    let f = tmp.path().join("secret");
    std::fs::write(&f, secret).unwrap();
    let set = hub
        .cli(&[
            "secrets",
            "set",
            "AGEN_WEBHOOK_SECRET",
            "--from-file",
            f.to_str().unwrap(),
        ])
        .unwrap();
    assert!(set.status.success());
    // A receiver that serves on its own thread while the test waits on the CLI.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/hook",
        listener.local_addr().unwrap().port()
    );
    let got = receiver(&rt, listener);
    let out = hub
        .cli(&[
            "submit",
            "asker",
            "go",
            "--webhook",
            &url,
            "--webhook-on-waiting",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let pending = crate::approvals::pending_of(&hub, &task);
    // The wait is told while the task still waits: nothing ran, nothing was decided.
    let (sig, delivery, body) = wait_for("the waiting delivery", Duration::from_secs(30), || {
        got.lock().unwrap().first().cloned()
    })
    .unwrap();
    assert!(verify(secret, &sig, &body), "signature {sig} over {body}");
    assert!(!verify("another secret", &sig, &body));
    let payload: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(payload["type"], "task.waiting", "{payload}");
    assert_eq!(payload["delivery_id"], delivery.as_str(), "{payload}");
    assert_eq!(payload["task"]["task_id"], task.as_str(), "{payload}");
    assert_eq!(payload["task"]["state"], "waiting", "{payload}");
    assert_eq!(crate::approvals::executions(&marker), 0);
    let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "waiting", "still waiting when told: {q}");

    let out = hub
        .cli(&["approve", &task, pending["call_id"].as_str().unwrap()])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ended = crate::approvals::wait_task(&hub, &task);
    assert_eq!(ended["state"], "succeeded", "{ended}");
    assert_eq!(crate::approvals::executions(&marker), 1);
    wait_for("the end's delivery", Duration::from_secs(30), || {
        (got.lock().unwrap().len() >= 2).then_some(())
    })
    .unwrap();
    // Both recorded as delivered, one each: the wait, then the end.
    let listed = wait_for("both deliveries recorded", Duration::from_secs(10), || {
        let l = hub
            .cli_json(&["tasks", "webhooks", &task, "-o", "json"])
            .ok()?;
        let all = l.as_array()?.clone();
        all.iter().all(|d| d["state"] == "delivered").then_some(all)
    })
    .unwrap();
    let events: Vec<&str> = listed.iter().filter_map(|d| d["event"].as_str()).collect();
    assert_eq!(events, ["task.waiting", "task.ended"], "{listed:?}");
    let received = got.lock().unwrap().clone();
    assert_eq!(received.len(), 2, "each delivered once: {received:?}");
    let (sig, _, body) = &received[1];
    assert!(verify(secret, sig, body), "signature {sig} over {body}");
    let payload: Value = serde_json::from_str(body).unwrap();
    assert_eq!(payload["type"], "task.ended", "{payload}");
    assert_eq!(payload["task"]["state"], "succeeded", "{payload}");
    assert!(
        payload["task"]["result"]
            .as_str()
            .is_some_and(|r| r.starts_with("saw: ")),
        "{payload}"
    );
}

#[test]
fn a_webhook_delivery_is_retried_across_a_hub_kill_9_and_received_once_with_its_delivery_id() {
    let tmp = tempfile::tempdir().unwrap();
    // The receiver's port is reserved now and served only after the restart.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let mut hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--webhook-allow", "127.0.0.1"],
    )
    .unwrap();
    deploy_idle(&hub, &tmp.path().join("bundle"));
    let secret = "whsec-restart-9";
    let f = tmp.path().join("secret");
    std::fs::write(&f, secret).unwrap();
    let set = hub
        .cli(&[
            "secrets",
            "set",
            "AGEN_WEBHOOK_SECRET",
            "--from-file",
            f.to_str().unwrap(),
        ])
        .unwrap();
    assert!(set.status.success());
    let url = format!("http://127.0.0.1:{port}/hook");
    let out = hub
        .cli(&["submit", "runner", "hello", "--webhook", &url])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = hub.cli(&["cancel", &task]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = |hub: &HubProcess| -> Option<Value> {
        let l = hub
            .cli_json(&["tasks", "webhooks", &task, "-o", "json"])
            .ok()?;
        l.as_array()?.first().cloned()
    };
    let before = wait_for("a failed attempt", Duration::from_secs(15), || {
        listed(&hub).filter(|d| d["attempts"].as_u64() >= Some(1))
    })
    .unwrap();
    assert_eq!(before["state"], "pending", "{before}");
    hub.restart().unwrap();
    // Up now: the restarted Hub retries the recorded delivery, under the same id.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let got = receiver(
        &rt,
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap(),
    );
    let after = wait_for(
        "the delivery after the restart",
        Duration::from_secs(30),
        || listed(&hub).filter(|d| d["state"] == "delivered"),
    )
    .unwrap();
    assert_eq!(after["delivery_id"], before["delivery_id"], "{after}");
    assert!(
        after["attempts"].as_u64() > before["attempts"].as_u64(),
        "{before} then {after}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let received = got.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "received once: {received:?}");
    let (sig, delivery, body) = &received[0];
    assert_eq!(delivery, after["delivery_id"].as_str().unwrap());
    assert!(verify(secret, sig, body), "signature {sig} over {body}");
    let payload: Value = serde_json::from_str(body).unwrap();
    assert_eq!(payload["task"]["state"], "cancelled", "{payload}");
}
