//! Who owns the other end of a TCP connection from this host: the uid of the client socket, asked
//! of the kernel by address (`sock_diag`), else read from `/proc/net/tcp{,6}` (the client's own socket is the line whose local address is the
//! peer's and whose remote address is ours). Both daemons use it to refuse local processes of an
//! instance or tool-server uid (a Nest's `--run-uids`): the Nest's and the Hub's `/metrics`
//! listeners and the Hub's gRPC/A2A port.
//!
//! Invariant: fail closed for loopback. A loopback peer whose socket cannot be found is refused
//! too; a peer of another host (no line here) is not this module's to judge. The kernel sets a
//! socket's uid when it is made, so a process cannot borrow another uid's without that process
//! handing it over.

use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;

/// What [`check`] found about a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// Not from a refused uid (or not from this host).
    Allowed,
    /// From a local process of a refused uid (`None`: a loopback peer whose socket was not found).
    Refused(Option<u32>),
}

/// Whether the connection from `peer` to `local` comes from a local process of one of the
/// `refused` uids. Reads `/proc` (off the async threads: [`check_async`]).
pub fn check(peer: SocketAddr, local: SocketAddr, refused: &[RangeInclusive<u32>]) -> Peer {
    if refused.is_empty() {
        return Peer::Allowed;
    }
    match socket_owner(peer, local) {
        Some(uid) if refused.iter().any(|r| r.contains(&uid)) => Peer::Refused(Some(uid)),
        Some(_) => Peer::Allowed,
        None if unmapped(peer.ip()).is_loopback() => Peer::Refused(None),
        None => Peer::Allowed,
    }
}

/// Lookups running at once. Each reads the whole socket table, so a flood of connections must
/// not become a flood of blocking threads (each with its own allocator arena: hundreds of MB).
const LOOKUPS_AT_ONCE: usize = 2;

/// [`check`] on a blocking thread, at most [`LOOKUPS_AT_ONCE`] at a time in this process.
pub async fn check_async(
    peer: SocketAddr,
    local: SocketAddr,
    refused: std::sync::Arc<Vec<RangeInclusive<u32>>>,
) -> Peer {
    static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(LOOKUPS_AT_ONCE);
    if refused.is_empty() {
        return Peer::Allowed;
    }
    let fail_closed = if unmapped(peer.ip()).is_loopback() {
        Peer::Refused(None)
    } else {
        Peer::Allowed
    };
    let Ok(_turn) = LOOKUPS.acquire().await else {
        return fail_closed;
    };
    tokio::task::spawn_blocking(move || check(peer, local, &refused))
        .await
        .unwrap_or(fail_closed)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The uid owning the client socket of a connection from `peer` to `local` on this host (its
/// line in `/proc/net/tcp` or `tcp6` has local = `peer`, remote = `local`); `None` when no
/// process of this network namespace holds it.
pub fn socket_owner(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (src, dst) = (
        (unmapped(peer.ip()), peer.port()),
        (unmapped(local.ip()), local.port()),
    );
    // The kernel's lookup by address first; `/proc` only when netlink cannot answer.
    match crate::sock_diag::owner(src, dst) {
        Ok(found) => return found,
        Err(e) => tracing::debug!("{}; reading /proc/net/tcp instead", e.0),
    }
    let want = (
        unmapped(peer.ip()),
        peer.port(),
        unmapped(local.ip()),
        local.port(),
    );
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(l), Some(r), Some(uid)) = (f.get(1), f.get(2), f.get(7)) else {
                continue;
            };
            let (Some(l), Some(r)) = (proc_addr(l), proc_addr(r)) else {
                continue;
            };
            if (l.0, l.1, r.0, r.1) == want {
                return uid.parse().ok();
            }
        }
    }
    None
}

/// `0100007F:1F90` (IPv4) or 32 hex digits `:PORT` (IPv6), words in the kernel's byte order.
fn proc_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip = match addr.len() {
        8 => IpAddr::from(word(addr)?),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(addr.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some((unmapped(ip), port))
}

/// `FIRST-LAST` (or one uid) as a range, for flags like the Hub's `--refuse-uids`.
pub fn parse_range(s: &str) -> Result<RangeInclusive<u32>, String> {
    let bad = || format!("{s:?} is not a uid range; write FIRST-LAST, e.g. 61000-61999");
    let (first, last) = s.split_once('-').unwrap_or((s, s));
    let first: u32 = first.trim().parse().map_err(|_| bad())?;
    let last: u32 = last.trim().parse().map_err(|_| bad())?;
    if first > last {
        return Err(bad());
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    #[test]
    fn proc_net_addresses_are_read_in_the_kernels_byte_order() {
        let v4 = proc_addr("0100007F:1F90").expect("v4");
        assert_eq!(v4, ("127.0.0.1".parse().expect("ip"), 8080));
        let v6 = proc_addr("00000000000000000000000001000000:0050").expect("v6");
        assert_eq!(v6, ("::1".parse().expect("ip"), 80));
        let mapped = proc_addr("0000000000000000FFFF00000100007F:0050").expect("mapped");
        assert_eq!(mapped, ("127.0.0.1".parse().expect("ip"), 80));
        assert_eq!(proc_addr("zz:1"), None);
    }

    #[tokio::test]
    async fn the_owner_of_a_local_client_socket_is_found_and_judged() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = listener.local_addr().expect("addr");
        let client = TcpStream::connect(at).await.expect("connect");
        let (_server, peer) = listener.accept().await.expect("accept");
        assert_eq!(peer, client.local_addr().expect("addr"));
        let me = nix::unistd::getuid().as_raw();
        assert_eq!(socket_owner(peer, at), Some(me));
        assert_eq!(check(peer, at, &[me..=me]), Peer::Refused(Some(me)));
        assert_eq!(check(peer, at, &[]), Peer::Allowed);
        let other = me.wrapping_add(1)..=me.wrapping_add(1);
        assert_eq!(check(peer, at, &[other]), Peer::Allowed);
        // A loopback peer with no socket here: refused (fail closed).
        let gone: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert_eq!(check(gone, at, &[me..=me]), Peer::Refused(None));
    }

    #[test]
    fn uid_ranges_parse() {
        assert_eq!(parse_range("61000-61999"), Ok(61000..=61999));
        assert_eq!(parse_range("7"), Ok(7..=7));
        assert!(parse_range("9-1").is_err());
        assert!(parse_range("a-b").is_err());
    }
}
