//! The instance sandbox (issue 40), as the attacker: a command the model runs through the
//! workspace `run` tool tries ptrace, `pidfd_getfd` and `/proc/<pid>/mem` on its own instance,
//! on another tool server of that instance and on another namespace's instance and server, and
//! forges a hello and a `run.finished` through every socket it can open; every try is counted
//! and none succeeds. An instance whose bundle needs more uids than the range has left waits
//! (pending on its Nest, its message naming the range).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess, NestProcess};
use serde_json::{json, Value};

const RANGE: &str = "62160-62169";

/// The attacker, a Python script run by the workspace `run` tool: `attack.py REPORT SOCKET
/// NAME=PID...`. One line per try: `SUCCEEDED`/`REFUSED <how> <target>`, and for the sockets
/// `ACCEPTED`/`REFUSED`.
const ATTACK: &str = r#"
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
report = open(sys.argv[1], "a")
def out(line):
    report.write(line + "\n"); report.flush()
def err():
    return errno.errorcode.get(ctypes.get_errno(), "?")
for spec in sys.argv[3:]:
    name, pid = spec.split("="); pid = int(pid)
    if libc.ptrace(16, pid, None, None) == 0:
        out("SUCCEEDED ptrace " + name); libc.ptrace(17, pid, None, None)
    else:
        out("REFUSED ptrace %s %s" % (name, err()))
    got, why = None, "?"
    pfd = libc.syscall(434, pid, 0)
    if pfd < 0:
        why = "pidfd_open " + err()
    else:
        for fd in range(0, 64):
            g = libc.syscall(438, pfd, fd, 0)
            if g >= 0:
                got = fd; os.close(g); break
            if ctypes.get_errno() != errno.EBADF:
                why = err()
        os.close(pfd)
    out(("SUCCEEDED pidfd_getfd %s fd %s" % (name, got)) if got is not None else ("REFUSED pidfd_getfd %s %s" % (name, why)))
    try:
        with open("/proc/%d/mem" % pid, "rb") as f:
            out("SUCCEEDED mem " + name)
    except OSError as e:
        out("REFUSED mem %s %s" % (name, errno.errorcode.get(e.errno, "?")))
iid = os.path.basename(os.path.dirname(os.getcwd()))
hello = json.dumps({"type": "hello", "instance_id": iid, "pid": os.getpid(), "secret": "forged"}) + "\n"
forged = json.dumps({"type": "event", "run_id": "r", "attempt": 1, "seq": 1, "kind": "run.finished",
                     "json": json.dumps({"state": "succeeded", "result": "FORGED-BY-TOOL-SERVER"})}) + "\n"
for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        continue
    if target.startswith("socket:"):
        try:
            os.write(fd, (hello + forged).encode()); out("ACCEPTED inherited socket fd %d" % fd)
        except OSError as e:
            out("REFUSED inherited socket fd %d %s" % (fd, e))
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[2])
    s.sendall((hello + forged).encode())
    s.settimeout(10)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    out(("ACCEPTED nest socket %r" % data[:200]) if b'"placement"' in data else ("REFUSED nest socket %r" % data[:200]))
except OSError as e:
    out("REFUSED nest socket %s" % e)
"#;

fn uid_of(pid: u32) -> Option<u32> {
    proc_status(pid, "Uid:")
}

fn proc_status(pid: u32, key: &str) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn groups_of(pid: u32) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("Groups:"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

fn ppid_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn instance_pid(nest: &NestProcess, id: &str) -> Option<u32> {
    let bundle = agen_nest::separation::runtime_root(&nest.dir)
        .join(id)
        .join("bundle");
    nest.descendants().into_iter().find(|p| {
        cmdline(*p).contains("instance")
            && std::fs::read_link(format!("/proc/{p}/cwd")).ok().as_deref() == Some(&bundle)
    })
}

/// The child of `instance` whose command line holds `needle`.
fn server_of(nest: &NestProcess, instance: u32, needle: &str) -> Option<u32> {
    nest.descendants()
        .into_iter()
        .find(|p| ppid_of(*p) == Some(instance) && cmdline(*p).contains(needle))
}

fn agent_md(name: &str, model: &FakeModel) -> String {
    format!(
        "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run things.\n",
        model.base_url()
    )
}

fn deploy(hub: &HubProcess, bundle: &Path, namespace: &str, name: &str, wait: bool) {
    let mut args = vec![
        "deploy",
        bundle.to_str().unwrap(),
        "--namespace",
        namespace,
        "--name",
        name,
    ];
    if wait {
        args.push("--wait");
    }
    let out = hub.cli(&args).unwrap();
    assert!(
        out.status.success() || !wait,
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn running_instance(hub: &HubProcess, deployment: &str) -> String {
    let list = hub
        .wait_instances(
            &format!("{deployment} running"),
            Duration::from_secs(60),
            |l| {
                l.iter().any(|i| {
                    i["deployment"] == deployment && i["state"] == "running" && i["healthy"] == true
                })
            },
        )
        .unwrap();
    list.iter()
        .find(|i| i["deployment"] == deployment && i["state"] == "running")
        .and_then(|i| i["instance"].as_str())
        .unwrap()
        .to_string()
}

fn ws(root: &str, run: bool) -> Value {
    let mut args = vec!["mcp", "workspace", "--root", root];
    if !run {
        args.push("--no-run");
    }
    json!({"command": "agen", "args": args})
}

#[test]
fn a_tool_server_cannot_ptrace_read_or_steal_from_its_instance_its_neighbour_or_another_instance_nor_forge_a_finish(
) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let attack = out.join("attack.py");
    std::fs::write(&attack, ATTACK).unwrap();
    std::fs::set_permissions(&attack, std::fs::Permissions::from_mode(0o644)).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest_with("sandboxed", &[], &[], &["--run-uids", RANGE])
        .unwrap();

    // Namespace b: a victim instance with one tool server.
    let victim_model = FakeModel::start(
        &tmp.path().join("model-b"),
        &json!({"steps": [{"reply": "victim done"}]}),
    )
    .unwrap();
    let victim = tmp.path().join("victim");
    write_bundle(
        &victim,
        &[
            ("mcp.json", mcp_json(&[("ws", ws(".", true))])),
            ("x-agen/agent.md", agent_md("victim", &victim_model)),
        ],
    )
    .unwrap();
    deploy(&hub, &victim, "b", "victim", true);
    let victim_id = running_instance(&hub, "victim");
    let victim_pid = instance_pid(&nest, &victim_id).unwrap();
    let victim_server = server_of(&nest, victim_pid, "mcp workspace").unwrap();

    // Namespace a: the attacker's instance has two tool servers; `run` is on the first.
    let report = out.join("report.txt");
    let socket = agen_nest::separation::runtime_root(&nest.dir).join("nest.sock");
    let attacker = tmp.path().join("attacker");
    let model_dir = tmp.path().join("model-a");
    // The targets are known only once the instance runs: the script reads them from a file.
    let targets_file = out.join("targets");
    let model = FakeModel::start(
        &model_dir,
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!(
                "python3 {} {} {} $(cat {})",
                attack.display(), report.display(), socket.display(), targets_file.display())}}]},
            {"reply": "attacker done"}
        ]}),
    )
    .unwrap();
    write_bundle(
        &attacker,
        &[
            (
                "mcp.json",
                mcp_json(&[("ws", ws(".", true)), ("notes", ws("./notes", false))]),
            ),
            ("notes/readme.md", "notes\n".to_string()),
            ("x-agen/agent.md", agent_md("attacker", &model)),
        ],
    )
    .unwrap();
    deploy(&hub, &attacker, "a", "attacker", true);
    let attacker_id = running_instance(&hub, "attacker");
    let attacker_pid = instance_pid(&nest, &attacker_id).unwrap();
    let attacker_ws = server_of(&nest, attacker_pid, "--root . ").unwrap();
    let neighbour = server_of(&nest, attacker_pid, "--root ./notes").unwrap();

    // Five uids of the range, one each; every server has its instance's gid as a group.
    let uids: Vec<u32> = [
        victim_pid,
        victim_server,
        attacker_pid,
        attacker_ws,
        neighbour,
    ]
    .iter()
    .map(|p| uid_of(*p).unwrap())
    .collect();
    let mut distinct = uids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "{uids:?}");
    assert!(uids.iter().all(|u| (62160..=62169).contains(u)), "{uids:?}");
    for (server, instance) in [
        (victim_server, victim_pid),
        (attacker_ws, attacker_pid),
        (neighbour, attacker_pid),
    ] {
        assert_eq!(
            groups_of(server),
            vec![proc_status(instance, "Gid:").unwrap()],
            "server {server}"
        );
    }
    // The instance holds no capability on its main thread and is not dumpable.
    let status = std::fs::read_to_string(format!("/proc/{attacker_pid}/status")).unwrap();
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");

    std::fs::write(
        &targets_file,
        format!(
            "own-instance={attacker_pid} neighbour-server={neighbour} other-instance={victim_pid} other-server={victim_server}"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&targets_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out_json = hub
        .cli(&[
            "submit",
            "attacker",
            "go",
            "--namespace",
            "a",
            "--wait",
            "-o",
            "json",
        ])
        .unwrap();
    let t: Value = serde_json::from_slice(&out_json.stdout).unwrap_or_else(|_| {
        panic!(
            "submit printed no JSON: {}",
            String::from_utf8_lossy(&out_json.stderr)
        )
    });
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let count = |tag: &str| text.lines().filter(|l| l.starts_with(tag)).count();
    eprintln!("the attacker's report:\n{text}");
    // 4 targets × (ptrace, pidfd_getfd, mem) and the Nest's socket.
    assert_eq!(
        (count("SUCCEEDED"), count("ACCEPTED"), count("REFUSED ")),
        (0, 0, 4 * 3 + 1),
        "{text}"
    );
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["outcome"]["result"], "attacker done", "{t}");
    let forged = hub
        .cli_json(&["tasks", "--namespace", "a", "-o", "json"])
        .map(|v| v.to_string().matches("FORGED-BY-TOOL-SERVER").count())
        .unwrap_or(0);
    assert_eq!(forged, 0);
    // The victim still works.
    let out_json = hub
        .cli(&[
            "submit",
            "victim",
            "go",
            "--namespace",
            "b",
            "--wait",
            "-o",
            "json",
        ])
        .unwrap();
    let t: Value = serde_json::from_slice(&out_json.stdout).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
}

#[test]
fn an_instance_that_needs_more_uids_than_are_free_is_pending_naming_the_range() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub
        .nest_with("small", &[], &[], &["--run-uids", "62170-62171"])
        .unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!({"steps": []})).unwrap();
    let bundle: PathBuf = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[("ws", ws(".", true)), ("notes", ws("./notes", false))]),
            ),
            ("x-agen/agent.md", agent_md("big", &model)),
        ],
    )
    .unwrap();
    deploy(&hub, &bundle, "default", "big", false);
    let list = hub
        .wait_instances("the instance pending", Duration::from_secs(60), |l| {
            l.iter().any(|i| {
                i["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("pending: no free uid in 62170-62171"))
            })
        })
        .unwrap_or_else(|e| panic!("{e}: {:?}", hub.instances()));
    // The Hub keeps a placed instance `starting` (its own `pending` means "not placed"), with
    // the Nest's reason; it is neither replaced nor placed twice.
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["state"], "starting", "{list:?}");
}

/// The status code of `GET path` at `addr` (with a bearer token when given).
fn get(addr: &str, path: &str, token: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_tool_server_is_refused_by_the_hubs_and_the_nests_endpoints_and_metrics_need_the_token() {
    const TOKEN: &str = "metrics-token-4c1e";
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let token_file = tmp.path().join("metrics-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let hub_metrics = format!("127.0.0.1:{}", agen_tests::free_port());
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &[
            "--metrics-listen",
            &hub_metrics,
            "--metrics-token-file",
            token_file.to_str().unwrap(),
        ],
    )
    .unwrap();
    let nest_metrics = format!("127.0.0.1:{}", agen_tests::free_port());
    // The Nests' default range, the one the Hub refuses too; the host's network shared (with
    // a namespace of its own the tool server would not even reach the host's loopback: see
    // `netns`), so what refuses it here is its uid.
    let _nest = hub
        .nest_with(
            "watched",
            &[],
            &[],
            &[
                "--metrics-listen",
                &nest_metrics,
                "--metrics-token-file",
                token_file.to_str().unwrap(),
                "--shared-network",
            ],
        )
        .unwrap();
    wait_ok(&nest_metrics);

    // Anyone else: /metrics needs the token, /healthz and /readyz never do.
    for addr in [&hub_metrics, &nest_metrics] {
        assert_eq!(get(addr, "/metrics", None), 401, "{addr}");
        assert_eq!(get(addr, "/metrics", Some("wrong")), 401, "{addr}");
        assert_eq!(get(addr, "/metrics", Some(TOKEN)), 200, "{addr}");
        assert_eq!(get(addr, "/healthz", None), 200, "{addr}");
        assert_eq!(get(addr, "/readyz", None), 200, "{addr}");
    }

    // A tool server, token and all, is refused every path of both.
    let report = out.join("codes.txt");
    let mut command = String::new();
    for addr in [&hub_metrics, &nest_metrics] {
        for path in ["/metrics", "/healthz", "/readyz"] {
            command.push_str(&format!(
                "echo \"{addr}{path} $(curl -s -o /dev/null -w '%{{http_code}}' -H 'authorization: Bearer {TOKEN}' http://{addr}{path})\" >> {}; ",
                report.display()
            ));
        }
    }
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": command}}]},
            {"reply": "probed"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            ("mcp.json", mcp_json(&[("ws", ws(".", true))])),
            ("x-agen/agent.md", agent_md("prober", &model)),
        ],
    )
    .unwrap();
    deploy(&hub, &bundle, "default", "prober", true);
    let out_json = hub
        .cli(&["submit", "prober", "go", "--wait", "-o", "json"])
        .unwrap();
    let t: Value = serde_json::from_slice(&out_json.stdout).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let text = std::fs::read_to_string(&report).unwrap();
    let codes: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let refused = codes.iter().filter(|c| **c == "403").count();
    assert_eq!((refused, codes.len()), (6, 6), "{text}");
}

fn wait_ok(addr: &str) {
    agen_tests::wait_for("the endpoint", Duration::from_secs(30), || {
        std::net::TcpStream::connect(addr).ok().map(|_| ())
    })
    .unwrap();
}

/// What the sandbox costs (BENCHMARKS.md; not part of the suite: `cargo test -p agen-tests
/// --test e2e -- --ignored sandbox::what_the_sandbox_costs --nocapture`): an instance's start
/// (deploy --wait of a bundle with two workspace servers) and a tool call (`ws_read`, 20 in one
/// run, less a run without one) on a Nest that runs everything as itself, one that pins every
/// instance and its servers to one user (servers share their instance's uid, as before issue
/// 40), and one that gives each server a uid of its own, with the host's network and with a
/// network namespace per instance (its model reached through the Nest's relay).
#[test]
#[ignore]
fn what_the_sandbox_costs() {
    const CALLS: usize = 20;
    const STARTS: usize = 3;
    let modes: [(&str, &[&str]); 4] = [
        ("run-as-self", &["--run-as-self"]),
        (
            "run-as nobody (servers share the instance's uid)",
            &["--run-as", "nobody", "--shared-network"],
        ),
        (
            "uid per instance and per server, host network",
            &["--run-uids", "62180-62199", "--shared-network"],
        ),
        (
            "uid per instance and per server, network namespace",
            &["--run-uids", "62180-62199"],
        ),
    ];
    for (mode, args) in modes {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let hub = HubProcess::start(tmp.path()).unwrap();
        let _nest = hub.nest_with("bench", &[], &[], args).unwrap();
        let mut steps = Vec::new();
        for _ in 0..CALLS {
            steps.push(json!({"tool_calls": [{"name": "ws_read", "arguments": {"path": "notes/readme.md"}}]}));
        }
        steps.push(json!({"reply": "read"}));
        let model =
            FakeModel::start(&tmp.path().join("model"), &json!({ "steps": steps })).unwrap();
        let mut starts = Vec::new();
        for i in 0..STARTS {
            let bundle = tmp.path().join(format!("b{i}"));
            write_bundle(
                &bundle,
                &[
                    (
                        "mcp.json",
                        mcp_json(&[("ws", ws(".", true)), ("notes", ws("./notes", false))]),
                    ),
                    ("notes/readme.md", "notes\n".to_string()),
                    ("x-agen/agent.md", agent_md(&format!("b{i}"), &model)),
                ],
            )
            .unwrap();
            let t = std::time::Instant::now();
            deploy(&hub, &bundle, "default", &format!("b{i}"), true);
            starts.push(t.elapsed().as_secs_f64() * 1000.0);
            if i + 1 < STARTS {
                let _ = hub.cli(&["rm", &format!("b{i}")]);
            }
        }
        let last = format!("b{}", STARTS - 1);
        let run = |what: &str| {
            let out = hub
                .cli(&["submit", &last, what, "--wait", "-o", "json"])
                .unwrap();
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["state"], "succeeded", "{v}");
            v["task_id"].as_str().unwrap().to_string()
        };
        let task = run("read");
        // Each call's span (tool.started to its result), as `agen trace` shows it.
        let trace = hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
        let mut calls: Vec<f64> = trace["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.contains("ws")))
            .filter_map(|s| s["duration_ms"].as_f64())
            .collect();
        calls.sort_by(f64::total_cmp);
        eprintln!(
            "{mode}: instance start (deploy --wait) ms {starts:.0?}; tool call ms: {} calls, median {:.1}, mean {:.1}",
            calls.len(),
            calls.get(calls.len() / 2).copied().unwrap_or(0.0),
            calls.iter().sum::<f64>() / calls.len().max(1) as f64
        );
    }
}
