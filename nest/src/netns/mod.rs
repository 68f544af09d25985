//! A private network per separated instance (root Nest, Linux): the instance and its tool
//! servers run in a network namespace of their own (`ip netns add agen-<nest>-<instance>`)
//! whose loopback is theirs alone; every address outside 127.0.0.0/8 is routed to that
//! loopback (`local 0.0.0.0/0 dev lo`), and nftables redirects every TCP connection to the
//! Nest's egress proxy ([`proxy`]) and every UDP DNS question (to any address, the loopback's
//! too) to the Nest's responder ([`dns`]), both listening inside the namespace, so nothing leaves it except through the
//! Nest, proxy-aware client or not. The bundle's own endpoints on the Nest host's loopback are
//! relayed into the namespace's loopback on the same port. The rule is the bundle's
//! `x-agen/config.json` `network` with the Nest's `--egress-default` ([`decide`]).
//!
//! Isolation needs root, `ip` (iproute2) and `nft` (nftables); [`Network::resolve`] tries it
//! once at start and otherwise says why it is off (logged, and in `agen nests`).
//!
//! Invariants: a namespace is made before its instance's first spawn; its name (`ip netns
//! add`) lives only while the Nest sets it up, then the Nest holds it by a handle, so it ends
//! with the instance's last process and that handle, even when the Nest is killed (names a
//! setup cut short left are deleted at the next start); only
//! a thread that spawns an instance enters a namespace, and it returns to the Nest's before
//! doing anything else (the process aborts if it cannot); the rules are set by the Nest, and
//! the instance never holds CAP_NET_ADMIN, so it cannot change them.

pub mod context;
pub mod decide;
pub mod dns;
pub mod proxy;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use agen_shared::bundle::{Bundle, HostPattern, Provider, ServerSpec};
use tokio_util::sync::CancellationToken;

use decide::Policy;

/// Where `ip netns add` puts its namespaces.
const NETNS_DIR: &str = "/run/netns";

/// A flag of the Nest's options (`config.rs`).
pub use crate::config::EgressDefault;

/// The Nest's network isolation: on (and its rules), or off and why.
pub struct Network {
    off: Option<String>,
    egress_default: EgressDefault,
    prefix: String,
    /// The Hub's addresses and port, the Nest's metrics port: never reachable unless allowed.
    hub: (Vec<IpAddr>, u16),
    metrics_port: Option<u16>,
    refused: Mutex<BTreeMap<(String, String), u64>>,
}

fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run(cmd: &mut Command, input: Option<&str>) -> Result<(), String> {
    use std::io::Write;
    let shown = format!("{cmd:?}").replace('"', "");
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{shown}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip() -> Command {
    Command::new(tool("ip").unwrap_or_else(|| PathBuf::from("ip")))
}

/// `ip netns exec NAME nft -f -`.
fn nft_in(name: &str) -> Command {
    let mut c = ip();
    c.args(["netns", "exec", name])
        .arg(tool("nft").unwrap_or_else(|| PathBuf::from("nft")))
        .args(["-f", "-"]);
    c
}

impl Network {
    /// Isolation for a Nest whose instances are `separated` (a shared-uid instance could
    /// change its own namespace's rules), tried once now. `shared` (`--shared-network`) turns
    /// it off on purpose.
    pub fn resolve(opts: &crate::config::NestOptions, separated: bool) -> Network {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(opts.data_dir.as_os_str().as_encoded_bytes());
        let prefix = format!("agen-{}-", &hex::encode(digest)[..6]);
        let hub = hub_addr(opts.hub_urls().first().map_or("", String::as_str));
        let mut net = Network {
            off: None,
            egress_default: opts.egress_default,
            prefix,
            hub,
            metrics_port: opts.metrics_listen.map(|a| a.port()),
            refused: Mutex::new(BTreeMap::new()),
        };
        net.off = if opts.shared_network {
            Some("--shared-network".into())
        } else if !separated {
            Some("instances are not separated by uid".into())
        } else if !nix::unistd::geteuid().is_root() && !has_net_caps() {
            Some("the Nest is neither root nor holds CAP_SYS_ADMIN and CAP_NET_ADMIN".into())
        } else if tool("ip").is_none() {
            Some("no `ip` command (install Debian iproute2)".into())
        } else if tool("nft").is_none() {
            Some("no `nft` command (install Debian nftables)".into())
        } else {
            net.clear_leftovers();
            net.probe().err()
        };
        net
    }

    /// Isolation off for `reason` (tests, `agen up` on a host that cannot).
    pub fn off(reason: &str) -> Network {
        Network {
            off: Some(reason.into()),
            egress_default: EgressDefault::Allow,
            prefix: "agen-off-".into(),
            hub: (Vec::new(), 0),
            metrics_port: None,
            refused: Mutex::new(BTreeMap::new()),
        }
    }

    fn probe(&self) -> Result<(), String> {
        let name = format!("{}probe", self.prefix);
        let _ = run(ip().args(["netns", "del", &name]), None);
        let r = run(ip().args(["netns", "add", &name]), None)
            .and_then(|()| run(ip().args(["-n", &name, "link", "set", "lo", "up"]), None))
            .and_then(|()| run(&mut nft_in(&name), Some(&rules(1))));
        let _ = run(ip().args(["netns", "del", &name]), None);
        r.map_err(|e| format!("network namespaces do not work here: {e}"))
    }

    /// Deletes the namespaces a previous run of this Nest left.
    fn clear_leftovers(&self) {
        let Ok(rd) = std::fs::read_dir(NETNS_DIR) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&self.prefix) {
                match run(ip().args(["netns", "del", &name]), None) {
                    Ok(()) => {
                        tracing::info!(netns = %name, "deleted a network namespace a previous run of this nest left")
                    }
                    Err(e) => tracing::warn!("{e}"),
                }
            }
        }
    }

    pub fn is_on(&self) -> bool {
        self.off.is_none()
    }

    /// For `agen nests` and the start line.
    pub fn describe(&self) -> String {
        match &self.off {
            None => format!(
                "network namespace per instance, egress default {}",
                self.egress_default.as_str()
            ),
            Some(why) => format!("network shared with the host ({why})"),
        }
    }

    /// Whether `a` is closed unless a rule names it: the Nest host's own addresses (loopback
    /// included), link-local and unspecified addresses, the Hub's port and the Nest's.
    pub fn is_protected(&self, a: SocketAddr) -> bool {
        let ip = a.ip();
        let special = match ip {
            IpAddr::V4(v4) => {
                v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_unspecified()
                    || v4.is_broadcast()
                    || v4.is_multicast()
            }
            IpAddr::V6(v6) => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || (v6.segments()[0] & 0xffc0) == 0xfe80
                    || v6.is_multicast()
            }
        };
        // An address this host can bind is one of its own.
        let local = std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok();
        let hub = a.port() == self.hub.1 && (local || self.hub.0.contains(&ip));
        let metrics = local && Some(a.port()) == self.metrics_port;
        special || local || hub || metrics
    }

    pub fn count_refused(&self, namespace: &str, deployment: &str) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((namespace.to_string(), deployment.to_string()))
            .or_default() += 1;
    }

    /// `agen_egress_refused_total` by (namespace, deployment).
    pub fn refused(&self) -> Vec<((String, String), u64)> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Makes the namespace of `instance` for `bundle` and starts its proxy, DNS responder and
    /// relays (blocking: call from `spawn_blocking`, inside a runtime).
    pub fn create(
        self: &Arc<Self>,
        instance: &str,
        owner: (String, String),
        bundle: &Bundle,
        logs: crate::logs::LogStore,
        rt: tokio::runtime::Handle,
    ) -> Result<InstanceNet, String> {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(instance.as_bytes());
        let name = format!("{}{}", self.prefix, &hex::encode(digest)[..8]);
        let policy = Arc::new(self.policy_of(bundle)?);
        let _ = run(ip().args(["netns", "del", &name]), None);
        run(ip().args(["netns", "add", &name]), None)?;
        // The name is only for setting it up: once the Nest holds it open it is deleted, so the
        // namespace ends with its last process and the Nest's handle, even after a kill -9.
        let named = Named(name.clone());
        let fd = std::fs::File::open(Path::new(NETNS_DIR).join(&name))
            .map_err(|e| format!("cannot open network namespace {name}: {e}"))?;
        let net = InstanceNet {
            fd,
            stop: CancellationToken::new(),
        };
        run(ip().args(["-n", &name, "link", "set", "lo", "up"]), None)?;
        run(
            ip().args([
                "-n",
                &name,
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
            ]),
            None,
        )?;
        let relays = loopback_ports(bundle);
        let fd = net.fd.try_clone().map_err(|e| e.to_string())?;
        let (proxy, dns, relayed) = in_netns(fd, move || -> std::io::Result<_> {
            let proxy = std::net::TcpListener::bind("127.0.0.1:0")?;
            let dns = std::net::UdpSocket::bind("127.0.0.1:53")?;
            let mut relayed = Vec::new();
            for port in relays {
                for host in [
                    IpAddr::from([127, 0, 0, 1]),
                    IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                ] {
                    if let Ok(l) = std::net::TcpListener::bind(SocketAddr::new(host, port)) {
                        relayed.push((l, SocketAddr::new(host, port)));
                    }
                }
            }
            Ok((proxy, dns, relayed))
        })
        .map_err(|e| format!("cannot listen in network namespace {name}: {e}"))?;
        let own = proxy.local_addr().map_err(|e| e.to_string())?;
        run(&mut nft_in(&name), Some(&rules(own.port())))?;
        drop(named);
        let _guard = rt.enter();
        let tokio_listener = |l: std::net::TcpListener| {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        };
        let names = Arc::new(context::Names::default());
        let cx = Arc::new(context::Context {
            instance: instance.to_string(),
            policy,
            names,
            network: self.clone(),
            logs,
            owner,
            own,
        });
        let proxy = tokio_listener(proxy).map_err(|e| e.to_string())?;
        rt.spawn(proxy::serve(proxy, cx.clone(), net.stop.clone()));
        dns.set_nonblocking(true).map_err(|e| e.to_string())?;
        let dns = tokio::net::UdpSocket::from_std(dns).map_err(|e| e.to_string())?;
        rt.spawn(dns::serve(dns, cx, net.stop.clone()));
        for (l, to) in relayed {
            let l = tokio_listener(l).map_err(|e| e.to_string())?;
            rt.spawn(proxy::relay(l, to, net.stop.clone()));
        }
        Ok(net)
    }

    fn policy_of(&self, bundle: &Bundle) -> Result<Policy, String> {
        let (allow, deny) = match &bundle.config.network {
            Some(r) => r.patterns()?,
            None => (Vec::new(), Vec::new()),
        };
        let implicit = model_endpoint(bundle)
            .and_then(|e| HostPattern::parse(&e).ok())
            .into_iter()
            .collect();
        Ok(Policy {
            allow,
            deny,
            implicit,
            default_allow: self.egress_default == EgressDefault::Allow,
        })
    }
}

/// Whether this process holds CAP_SYS_ADMIN and CAP_NET_ADMIN (the systemd unit's Nest).
fn has_net_caps() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|eff| eff & (1 << CAP_NET_ADMIN) != 0 && eff & (1 << CAP_SYS_ADMIN) != 0)
}

/// The nftables rules of a namespace whose proxy listens on `port`. DNS comes first: a host
/// whose resolv.conf names a resolver on its loopback (systemd-resolved's 127.0.0.53) sends its
/// questions there, which the namespace's loopback would otherwise keep.
fn rules(port: u16) -> String {
    format!(
        "table ip agen {{\n  chain out {{\n    type nat hook output priority -100; policy accept;\n    udp dport 53 redirect to :53\n    ip daddr 127.0.0.0/8 return\n    meta l4proto tcp redirect to :{port}\n  }}\n}}\n"
    )
}

/// `--hub https://host:port` → the host's addresses and the port.
fn hub_addr(url: &str) -> (Vec<IpAddr>, u16) {
    let Some((host, port)) = host_port(url) else {
        return (Vec::new(), 0);
    };
    use std::net::ToSocketAddrs;
    let ips = (host.as_str(), port)
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default();
    (ips, port)
}

/// `scheme://host:port/...` → (host, port), the port defaulting by scheme.
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let default = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .map_or(Some(default), |p| p.parse().ok())?;
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
    .filter(|(h, _)| !h.is_empty())
}

fn is_loopback_host(h: &str) -> bool {
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The bundle's model endpoint as a pattern (`host:port`), unless it is on the loopback
/// (relayed instead).
fn model_endpoint(bundle: &Bundle) -> Option<String> {
    let url = match (&bundle.agent.base_url, &bundle.agent.model) {
        (Some(u), _) => u.clone(),
        (None, Some(m)) if m.provider == Provider::Anthropic => "https://api.anthropic.com".into(),
        (None, _) => "https://api.openai.com/v1".into(),
    };
    let (h, p) = host_port(&url)?;
    if is_loopback_host(&h) {
        return None;
    }
    Some(if h.contains(':') {
        format!("[{h}]:{p}")
    } else {
        format!("{h}:{p}")
    })
}

/// The ports on the Nest host's loopback that the bundle names: its model `baseUrl`, its `url`
/// servers, its remote A2A delegates' cards.
pub fn loopback_ports(bundle: &Bundle) -> Vec<u16> {
    let mut urls: Vec<&str> = bundle.agent.base_url.iter().map(String::as_str).collect();
    for spec in bundle.mcp.servers.values() {
        if let ServerSpec::Url { url, .. } = spec {
            urls.push(url);
        }
    }
    for d in &bundle.config.delegates {
        if let Some(a) = &d.a2a {
            urls.push(&a.card_url);
        }
    }
    let mut ports: Vec<u16> = urls
        .into_iter()
        .filter_map(host_port)
        .filter(|(h, _)| is_loopback_host(h))
        .map(|(_, p)| p)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// One instance's namespace (a handle to it, no name left); its proxy, responder and relays
/// stop when it is dropped, and the namespace goes with its last process.
pub struct InstanceNet {
    fd: std::fs::File,
    stop: CancellationToken,
}

impl InstanceNet {
    /// What a spawn enters ([`spawn_in`]).
    pub fn handle(&self) -> &std::fs::File {
        &self.fd
    }
}

impl Drop for InstanceNet {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The setup name of a namespace, deleted when dropped (the namespace lives on while held).
struct Named(String);

impl Drop for Named {
    fn drop(&mut self) {
        if let Err(e) = run(ip().args(["netns", "del", &self.0]), None) {
            tracing::warn!(
                "cannot delete the name of network namespace {}: {e}",
                self.0
            );
        }
    }
}

#[allow(unsafe_code)]
fn setns(fd: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns with a file descriptor we own and a namespace type; affects this thread.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a thread of its own inside the namespace `file` (sockets made there stay in
/// it).
fn in_netns<R: Send + 'static>(
    file: std::fs::File,
    f: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> std::io::Result<R> {
    std::thread::spawn(move || {
        setns(&file)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// Runs `spawn` on this thread inside the namespace `target`, then returns the thread to the
/// namespace it was in (aborting the process if it cannot: no Nest thread may stay in an
/// instance's namespace).
pub fn spawn_in<R>(
    target: &std::fs::File,
    spawn: impl FnOnce() -> std::io::Result<R>,
) -> std::io::Result<R> {
    let back = std::fs::File::open("/proc/thread-self/ns/net")?;
    setns(target)?;
    let r = spawn();
    if let Err(e) = setns(&back) {
        tracing::error!("cannot return a nest thread to its network namespace: {e}; aborting");
        std::process::abort();
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_their_host_and_port() {
        assert_eq!(
            host_port("https://api.openai.com/v1"),
            Some(("api.openai.com".into(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:8080/v1"),
            Some(("127.0.0.1".into(), 8080))
        );
        assert_eq!(host_port("http://[::1]:9/x"), Some(("::1".into(), 9)));
        assert_eq!(host_port("http://u:p@h.test"), Some(("h.test".into(), 80)));
        assert_eq!(host_port("nope"), None);
        assert!(
            is_loopback_host("LOCALHOST")
                && is_loopback_host("127.0.0.9")
                && !is_loopback_host("10.0.0.1")
        );
    }

    #[test]
    fn the_hosts_own_and_link_local_addresses_are_protected() {
        let n = Network::off("test");
        for (a, protected) in [
            ("127.0.0.1:80", true),
            ("169.254.169.254:80", true),
            ("0.0.0.0:80", true),
            ("192.0.2.1:443", false),
        ] {
            assert_eq!(n.is_protected(a.parse().expect("addr")), protected, "{a}");
        }
    }
}
