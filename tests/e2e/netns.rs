//! A private network per instance (issue 40, item 2), as the attacker: a command the model runs
//! through the workspace `run` tool binds 127.0.0.1:P while an instance of another namespace
//! binds the same port (both succeed, each sees only its own), then connects to an allowed test
//! server, to a second one by raw address and by HTTP, to a link-local address and to the Hub's
//! port on the host's own address. The test makes its own network namespace with two addresses
//! behind a veth pair, so no traffic leaves the machine. Every refusal is counted by the Nest's
//! `agen_egress_refused_total`, and the runs' models (fake models on the host's 127.0.0.1) still
//! answer through the Nest's relay. DNS: a client that reads no hosts file asks the resolver of
//! its resolv.conf (on the loopback) and gets the Nest's answer, from a hosts file the Nest sees
//! in a mount namespace of its own; a name the rule refuses is NXDOMAIN and counted; `agen mcp
//! sql` reaches a PostgreSQL the rule names.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use agen_tests::{free_port, mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

/// The test's servers: one per address, each answering a connection with `SRV <its address>`
/// (an HTTP request gets that as a 200 body).
const SERVER: &str = r#"
import socket, sys, threading
def listen(addr):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 8080)); s.listen(16)
    return s
def serve(s):
    addr = s.getsockname()[0]
    while True:
        c, _ = s.accept()
        c.settimeout(2)
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        body = ("SRV %s\n" % addr).encode()
        if data.startswith(b"GET "):
            c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
        else:
            c.sendall(body)
        c.close()
# Every address listens before "ready" is said.
for s in [listen(a) for a in sys.argv[1:]]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
sys.stdout.write("ready\n"); sys.stdout.flush()
threading.Event().wait()
"#;

/// The attacker: `attack.py REPORT TAG PORT MINE PEER TARGET...`; TARGET is `name=host:port`
/// (raw TCP) or `name=http://...` (HTTP GET). One line per try: `OK`/`REFUSED`.
const ATTACK: &str = r#"
import os, socket, sys, threading, time, urllib.request, urllib.error
report = open(sys.argv[1], "a")
tag, port, mine, peer = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
def out(line):
    report.write(line + "\n"); report.flush()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port)); srv.listen(4)
out("BOUND %s 127.0.0.1:%d" % (tag, port))
def answer():
    while True:
        c, _ = srv.accept(); c.sendall(tag.encode()); c.close()
threading.Thread(target=answer, daemon=True).start()
open(mine, "w").close()
deadline = time.time() + 60
while not os.path.exists(peer) and time.time() < deadline:
    time.sleep(0.05)
c = socket.create_connection(("127.0.0.1", port), timeout=5)
out("LOOPBACK %s sees %s" % (tag, c.recv(100).decode()))
for spec in sys.argv[6:]:
    name, target = spec.split("=", 1)
    if target.startswith("http://"):
        try:
            body = urllib.request.urlopen(target, timeout=10).read().decode().strip()
            out("OK %s %s" % (name, body))
        except urllib.error.HTTPError as e:
            out("REFUSED %s %d %s" % (name, e.code, e.read().decode().strip()))
        except OSError as e:
            out("REFUSED %s %s" % (name, e))
        continue
    host, p = target.rsplit(":", 1)
    try:
        s = socket.create_connection((host, int(p)), timeout=10)
        s.sendall(b"ping\n")
        data = s.recv(100).decode().strip()
        out(("OK %s %s" % (name, data)) if data else ("REFUSED %s closed" % name))
    except OSError as e:
        out("REFUSED %s %s" % (name, e))
"#;

/// A DNS client that reads no hosts file (like Go's or c-ares' resolvers): `dns.py REPORT
/// NAME:PORT... URL...` asks the nameserver of /etc/resolv.conf for each NAME's A records, then
/// connects to each address it got (raw TCP); each URL is fetched over HTTP. One line per step.
const DNS_CLIENT: &str = r#"
import socket, struct, sys, urllib.error, urllib.request
report = open(sys.argv[1], "a")
def out(line):
    report.write(line + "\n"); report.flush()
ns = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
out("NAMESERVER %s" % ns)
def ask(name):
    q = struct.pack(">HHHHHH", 0x4147, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, (ns, 53))
    r = s.recv(1500)
    rcode, count = r[3] & 15, struct.unpack(">H", r[6:8])[0]
    at, ips = len(q), []
    for _ in range(count):
        typ, _, _, n = struct.unpack(">HHIH", r[at + 2:at + 12])
        at += 12
        if typ == 1 and n == 4:
            ips.append(socket.inet_ntoa(r[at:at + 4]))
        at += n
    return rcode, ips
for spec in sys.argv[2:]:
    if spec.startswith("http://"):
        try:
            out("HTTP %s %s" % (spec, urllib.request.urlopen(spec, timeout=10).read().decode().strip()))
        except urllib.error.HTTPError as e:
            out("HTTP %s %d %s" % (spec, e.code, e.read().decode().strip()))
        except OSError as e:
            out("HTTP %s failed %s" % (spec, e))
        continue
    name, port = spec.rsplit(":", 1)
    try:
        rcode, ips = ask(name)
    except OSError as e:
        out("DNS %s failed %s" % (name, e))
        continue
    out("DNS %s rcode %d %s" % (name, rcode, ",".join(ips)))
    for ip in ips:
        try:
            c = socket.create_connection((ip, int(port)), timeout=10)
            c.sendall(b"ping\n")
            out("TCP %s %s" % (name, c.recv(100).decode().strip() or "closed"))
        except OSError as e:
            out("TCP %s refused %s" % (name, e))
"#;

/// A TCP forwarder: `forward.py LISTEN_HOST:PORT TO_HOST:PORT`, says "ready" once listening.
const FORWARDER: &str = r#"
import socket, sys, threading
lh, lp = sys.argv[1].rsplit(":", 1)
th, tp = sys.argv[2].rsplit(":", 1)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((lh, int(lp))); srv.listen(16)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:
    c, _ = srv.accept()
    u = socket.create_connection((th, int(tp)))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"#;

/// A child killed when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test's own network namespace: `addrs` on a veth pair whose host side is `host`.
struct TestNet {
    name: String,
    host: String,
    addrs: Vec<String>,
    server: Option<Child>,
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestNet {
    fn start(tag: &str, subnet: u8, dir: &Path) -> TestNet {
        let name = format!("agt-{}-{tag}", std::process::id());
        let (h, n) = (
            format!("agh{}{tag}", std::process::id() % 100_000),
            format!("agn{}{tag}", std::process::id() % 100_000),
        );
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let mut net = TestNet {
            name: name.clone(),
            host: format!("10.231.{subnet}.1"),
            addrs: vec![format!("10.231.{subnet}.2"), format!("10.231.{subnet}.3")],
            server: None,
        };
        sh(&["ip", "netns", "add", &name]);
        sh(&[
            "ip", "link", "add", &h, "type", "veth", "peer", "name", &n, "netns", &name,
        ]);
        sh(&["ip", "addr", "add", &format!("{}/24", net.host), "dev", &h]);
        sh(&["ip", "link", "set", &h, "up"]);
        for a in &net.addrs {
            sh(&[
                "ip",
                "-n",
                &name,
                "addr",
                "add",
                &format!("{a}/24"),
                "dev",
                &n,
            ]);
        }
        sh(&["ip", "-n", &name, "link", "set", &n, "up"]);
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        let script = dir.join(format!("server-{tag}.py"));
        std::fs::write(&script, SERVER).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &name, "python3"])
            .arg(&script)
            .args(&net.addrs)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // "ready\n", read whole; the pipe stays open as long as the server runs.
        let mut ready = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut ready)
            .unwrap();
        net.server = Some(child);
        net
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace deletes the veth pair with it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A `10.231.N.0/24` no route of the host uses (`which` apart for the two tests).
fn free_subnet(which: u32) -> u8 {
    let routes = Command::new("ip").args(["-4", "route"]).output().unwrap();
    let routes = String::from_utf8_lossy(&routes.stdout).into_owned();
    (0..100)
        .map(|i| ((std::process::id() + i) % 100 * 2 + which) as u8)
        .find(|n| !routes.contains(&format!("10.231.{n}.")))
        .expect("a free 10.231.N.0/24")
}

/// Whether this host can run the sandbox; the reason when not (printed, the test skipped).
fn cannot_isolate() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    for tool in ["ip", "nft"] {
        let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).is_file());
        if !found {
            return Some(format!("no `{tool}` (Debian iproute2 / nftables)"));
        }
    }
    None
}

fn ws() -> Value {
    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]})
}

fn metric(addr: &str, namespace: &str, deployment: &str) -> u64 {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let key = format!(
        "agen_egress_refused_total{{namespace=\"{namespace}\",deployment=\"{deployment}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

struct Agent {
    namespace: &'static str,
    name: &'static str,
    report: PathBuf,
    _model: FakeModel,
}

/// Deploys an agent whose one tool call runs the attack with `targets`.
#[allow(clippy::too_many_arguments)]
fn agent(
    hub: &HubProcess,
    tmp: &Path,
    out: &Path,
    (namespace, name): (&'static str, &'static str),
    port: u16,
    (mine, peer): (&str, &str),
    network: Option<Value>,
    targets: &[String],
) -> Agent {
    let report = out.join(format!("{name}.txt"));
    let mut command = format!(
        "python3 {} {} {name} {port} {} {} {}",
        out.join("attack.py").display(),
        report.display(),
        out.join(mine).display(),
        out.join(peer).display(),
        targets.join(" ")
    );
    // Node's fetch (not proxy-aware) to each HTTP target, when node is installed.
    for t in targets.iter().filter_map(|t| t.split_once("=http://")) {
        command.push_str(&format!(
            "; command -v node >/dev/null && node -e \"fetch('http://{}').then(async r => console.log('FETCH {} ' + r.status + ' ' + (await r.text()).trim())).catch(e => console.log('FETCH {} failed ' + e))\" >> {}",
            t.1, t.0, t.0, report.display()
        ));
    }
    runner(hub, tmp, (namespace, name), &command, network, report, None)
}

/// A second tool server and the call the model makes to it after `ws_run`: (name, spec, call).
type Extra<'a> = Option<(&'a str, Value, Value)>;

/// Deploys an agent whose one tool call runs `command` through the workspace `run` tool.
fn runner(
    hub: &HubProcess,
    tmp: &Path,
    (namespace, name): (&'static str, &'static str),
    command: &str,
    network: Option<Value>,
    report: PathBuf,
    extra: Extra<'_>,
) -> Agent {
    let mut steps =
        vec![json!({"tool_calls": [{"name": "ws_run", "arguments": {"command": command}}]})];
    let mut servers = vec![("ws", ws())];
    match extra {
        Some((server, spec, call)) => {
            servers.push((server, spec));
            steps.push(json!({ "tool_calls": [call] }));
            steps.push(
                json!({ "reply_template": format!("{name} done: {{{{last_tool_result}}}}") }),
            );
        }
        None => steps.push(json!({ "reply": format!("{name} done") })),
    }
    let model = FakeModel::start(
        &tmp.join(format!("model-{name}")),
        &json!({ "steps": steps }),
    )
    .unwrap();
    let bundle = tmp.join(name);
    let mut files = vec![
        ("mcp.json", mcp_json(&servers)),
        (
            "x-agen/agent.md",
            format!(
                "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run things.\n",
                model.base_url()
            ),
        ),
    ];
    if let Some(n) = network {
        files.push(("x-agen/config.json", json!({"network": n}).to_string()));
    }
    write_bundle(&bundle, &files).unwrap();
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--namespace",
            namespace,
            "--name",
            name,
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Agent {
        namespace,
        name,
        report,
        _model: model,
    }
}

fn submit(hub: &HubProcess, a: &Agent) -> Value {
    let out = hub
        .cli(&[
            "submit",
            a.name,
            "go",
            "--namespace",
            a.namespace,
            "--wait",
            "-o",
            "json",
        ])
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn report(a: &Agent) -> String {
    std::fs::read_to_string(&a.report).unwrap_or_default()
}

fn setup(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    let attack = out.join("attack.py");
    std::fs::write(&attack, ATTACK).unwrap();
    std::fs::set_permissions(&attack, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _ = tag;
    (tmp, out)
}

#[test]
fn instances_have_their_own_loopback_and_reach_only_what_their_rule_allows_each_refusal_counted() {
    if let Some(why) = cannot_isolate() {
        eprintln!("skipped: network isolation cannot run here: {why}");
        return;
    }
    let (tmp, out) = setup("rules");
    let subnet = free_subnet(0);
    let net = TestNet::start("r", subnet, tmp.path());
    let (a, b) = (&net.addrs[0], &net.addrs[1]);
    let hub = HubProcess::start(tmp.path()).unwrap();
    let hub_port = hub.url().rsplit(':').next().unwrap().to_string();
    let metrics = format!("127.0.0.1:{}", free_port());
    let nest = hub
        .nest_with(
            "isolated",
            &[],
            &[],
            &["--run-uids", "62200-62209", "--metrics-listen", &metrics],
        )
        .unwrap();
    let nests = hub.nests().unwrap();
    assert_eq!(
        nests[0]["network"], "network namespace per instance, egress default allow",
        "{nests:?}"
    );
    let port = free_port();
    let targets = |extra: &[String]| {
        let mut t = vec![
            format!("allowed={a}:8080"),
            format!("http-allowed=http://{a}:8080/"),
            format!("raw-second={b}:8080"),
            format!("http-second=http://{b}:8080/"),
            "link-local=169.254.169.254:80".to_string(),
            format!("hub-on-host-address={}:{hub_port}", net.host),
            format!("hub-on-loopback=127.0.0.1:{hub_port}"),
        ];
        t.extend_from_slice(extra);
        t
    };
    let ruled = agent(
        &hub,
        tmp.path(),
        &out,
        ("a", "ruled"),
        port,
        ("ruled.bound", "open.bound"),
        Some(json!({"allow": [format!("{a}:8080")]})),
        &targets(&[]),
    );
    let open = agent(
        &hub,
        tmp.path(),
        &out,
        ("b", "open"),
        port,
        ("open.bound", "ruled.bound"),
        None,
        &targets(&[]),
    );
    // At once: each waits until the other has bound the same loopback port.
    let (t1, t2) = std::thread::scope(|s| {
        let t1 = s.spawn(|| submit(&hub, &ruled));
        let t2 = s.spawn(|| submit(&hub, &open));
        (t1.join().unwrap(), t2.join().unwrap())
    });
    let (r1, r2) = (report(&ruled), report(&open));
    eprintln!("ruled:\n{r1}\nopen:\n{r2}");
    assert_eq!(t1["outcome"]["result"], "ruled done", "{t1}");
    assert_eq!(t2["outcome"]["result"], "open done", "{t2}");
    let line = |r: &str, name: &str| {
        r.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or("")
            .to_string()
    };
    // Both bound the same loopback port and each saw its own server.
    for (r, tag) in [(&r1, "ruled"), (&r2, "open")] {
        assert!(r.contains(&format!("BOUND {tag} 127.0.0.1:{port}")), "{r}");
        assert!(r.contains(&format!("LOOPBACK {tag} sees {tag}")), "{r}");
    }
    // The rule: the allowed server answers, the second address is refused raw and by HTTP
    // (a 403 naming host and rule).
    assert_eq!(line(&r1, "allowed"), format!("OK allowed SRV {a}"));
    assert_eq!(
        line(&r1, "http-allowed"),
        format!("OK http-allowed SRV {a}")
    );
    assert!(line(&r1, "raw-second").starts_with("REFUSED"), "{r1}");
    let http = line(&r1, "http-second");
    assert!(
        http.starts_with("REFUSED http-second 403")
            && http.contains(&format!("{b}:8080"))
            && http.contains("not in network.allow"),
        "{http}"
    );
    // No rule, egress default allow: both servers answer.
    assert_eq!(line(&r2, "allowed"), format!("OK allowed SRV {a}"));
    assert_eq!(line(&r2, "raw-second"), format!("OK raw-second SRV {b}"));
    assert_eq!(line(&r2, "http-second"), format!("OK http-second SRV {b}"));
    // Never, for either: link-local, the Hub's port on the host's address or its loopback.
    for r in [&r1, &r2] {
        for name in ["link-local", "hub-on-host-address", "hub-on-loopback"] {
            assert!(line(r, name).starts_with("REFUSED"), "{name}: {r}");
        }
    }
    // Node's fetch goes the same way: refused with the 403 under the rule, answered without.
    let fetched = r1.contains("FETCH ");
    if fetched {
        assert!(
            r1.contains(&format!("FETCH http-allowed 200 SRV {a}")),
            "{r1}"
        );
        assert!(
            r1.contains(&format!(
                "FETCH http-second 403 agen: egress refused: {b}:8080"
            )),
            "{r1}"
        );
        assert!(
            r2.contains(&format!("FETCH http-second 200 SRV {b}")),
            "{r2}"
        );
    } else {
        eprintln!("node is not installed: the fetch case was not run");
    }
    let count = |r: &str| r.lines().filter(|l| l.starts_with("REFUSED")).count();
    assert_eq!(
        (count(&r1), count(&r2)),
        (5, 3),
        "ruled:\n{r1}\nopen:\n{r2}"
    );
    // Counted by the proxy: every refusal but the loopback one (the instance's own loopback
    // has nothing on the Hub's port, nothing reached the Nest).
    assert_eq!(metric(&metrics, "a", "ruled"), 4 + u64::from(fetched));
    assert_eq!(metric(&metrics, "b", "open"), 2);
    // And named in the instance's logs.
    let logs = hub.cli(&["logs", "ruled", "--namespace", "a"]).unwrap();
    let text = String::from_utf8_lossy(&logs.stdout);
    assert!(
        text.contains(&format!("egress refused: {b}:8080 (not in network.allow)")),
        "{text}"
    );
    drop(nest);
}

#[test]
fn with_egress_default_deny_and_no_rule_nothing_leaves_but_the_models_answers() {
    if let Some(why) = cannot_isolate() {
        eprintln!("skipped: network isolation cannot run here: {why}");
        return;
    }
    let (tmp, out) = setup("deny");
    let subnet = free_subnet(1);
    let net = TestNet::start("d", subnet, tmp.path());
    let hub = HubProcess::start(tmp.path()).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let _nest = hub
        .nest_with(
            "closed",
            &[],
            &[],
            &[
                "--run-uids",
                "62210-62219",
                "--egress-default",
                "deny",
                "--metrics-listen",
                &metrics,
            ],
        )
        .unwrap();
    std::fs::write(out.join("peer.bound"), "").unwrap();
    let closed = agent(
        &hub,
        tmp.path(),
        &out,
        ("c", "closed"),
        free_port(),
        ("closed.bound", "peer.bound"),
        None,
        &[
            format!("first={}:8080", net.addrs[0]),
            format!("second={}:8080", net.addrs[1]),
        ],
    );
    let t = submit(&hub, &closed);
    let r = report(&closed);
    assert_eq!(t["outcome"]["result"], "closed done", "{t}\n{r}");
    assert_eq!(
        r.lines().filter(|l| l.starts_with("REFUSED")).count(),
        2,
        "{r}"
    );
    assert_eq!(r.lines().filter(|l| l.starts_with("OK")).count(), 0, "{r}");
    assert_eq!(metric(&metrics, "c", "closed"), 2);
    let nests = hub.nests().unwrap();
    assert_eq!(
        nests[0]["network"], "network namespace per instance, egress default deny",
        "{nests:?}"
    );
}

#[test]
fn dns_in_the_sandbox_answers_allowed_names_through_the_nest_and_refuses_the_rest_counted() {
    if let Some(why) = cannot_isolate() {
        eprintln!("skipped: network isolation cannot run here: {why}");
        return;
    }
    let (tmp, out) = setup("dns");
    let subnet = free_subnet(1);
    let net = TestNet::start("n", subnet, tmp.path());
    let (a, b) = (&net.addrs[0], &net.addrs[1]);
    // The Nest runs in a mount namespace of its own whose hosts file maps the test's names to
    // the test's addresses, and whose resolv.conf names a resolver on the host's loopback (as
    // systemd-resolved's 127.0.0.53 does; nothing answers there): the machine's files are
    // untouched, and no question leaves the machine.
    let hosts = tmp.path().join("hosts");
    let original = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    std::fs::write(
        &hosts,
        format!(
            "{original}\n{a} api.ok.agen-test\n{b} other.agen-test\n{} db.agen-test\n",
            net.host
        ),
    )
    .unwrap();
    let resolv = tmp.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 127.0.0.153\n").unwrap();
    for f in [&hosts, &resolv] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    // PostgreSQL (the tests' shared cluster, on the host's 127.0.0.1) behind a forwarder on
    // the host's side of the test's veth pair, named db.agen-test: the Nest host's own
    // address, reachable only because the rule names it.
    let cluster = agen_tests::postgres::shared();
    let database = cluster.database("sandbox_sql");
    cluster.psql(
        &database,
        "CREATE TABLE t (x int); INSERT INTO t VALUES (42)",
    );
    let db_port = free_port();
    let forwarder = tmp.path().join("forward.py");
    std::fs::write(&forwarder, FORWARDER).unwrap();
    let mut forward = Command::new("python3")
        .arg(&forwarder)
        .arg(format!("{}:{db_port}", net.host))
        .arg(format!("127.0.0.1:{}", cluster.port))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    forward
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut ready)
        .unwrap();
    let _forward = KillOnDrop(forward);
    let client = out.join("dns.py");
    std::fs::write(&client, DNS_CLIENT).unwrap();
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o644)).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let (hosts_s, resolv_s) = (hosts.to_str().unwrap(), resolv.to_str().unwrap());
    let _nest = hub
        .nest_wrapped(
            "resolver",
            &[],
            &[],
            &["--run-uids", "62220-62229", "--metrics-listen", &metrics],
            &[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind \"$0\" /etc/hosts && mount --bind \"$1\" /etc/resolv.conf && shift && exec \"$@\"",
                hosts_s,
                resolv_s,
            ],
        )
        .unwrap();
    let report_path = out.join("dns.txt");
    let command = format!(
        "python3 {} {} api.ok.agen-test:8080 other.agen-test:8080 missing.ok.agen-test:8080 http://api.ok.agen-test:8080/",
        client.display(),
        report_path.display()
    );
    // A wildcard rule: the Nest cannot know the allowed address from the rule itself, only
    // from the name its DNS answer gave out for it.
    let agent = runner(
        &hub,
        tmp.path(),
        ("d", "resolver"),
        &command,
        Some(json!({"allow": ["*.ok.agen-test:8080", format!("db.agen-test:{db_port}")]})),
        report_path,
        Some((
            "db",
            json!({"command": "agen", "args": ["mcp", "sql", "--dsn-env", "DSN"], "env": {
                "DSN": format!("postgres://postgres@db.agen-test:{db_port}/{database}?sslmode=disable")
            }}),
            json!({"name": "db_query", "arguments": {"sql": "SELECT x * 10 AS answer FROM t"}}),
        )),
    );
    let t = submit(&hub, &agent);
    let r = report(&agent);
    eprintln!("{r}");
    // `agen mcp sql` reached the allowed PostgreSQL by its name through the proxy.
    let result = t["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("resolver done: ") && result.contains("420"),
        "{t}\n{r}"
    );
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(
        lines,
        [
            "NAMESERVER 127.0.0.153".to_string(),
            format!("DNS api.ok.agen-test rcode 0 {a}"),
            format!("TCP api.ok.agen-test SRV {a}"),
            "DNS other.agen-test rcode 3 ".to_string(),
            "DNS missing.ok.agen-test rcode 3 ".to_string(),
            format!("HTTP http://api.ok.agen-test:8080/ SRV {a}"),
        ],
        "{r}"
    );
    // One refusal: the denied name (a name the rule allows but the Nest cannot resolve is
    // NXDOMAIN too, not a refusal).
    assert_eq!(metric(&metrics, "d", "resolver"), 1);
    let logs = hub.cli(&["logs", "resolver", "--namespace", "d"]).unwrap();
    let text = String::from_utf8_lossy(&logs.stdout);
    assert_eq!(text.matches("egress refused").count(), 1, "{text}");
    assert!(
        text.contains(
            "egress refused: other.agen-test (not in network.allow): its DNS question answered NXDOMAIN"
        ),
        "{text}"
    );
}
