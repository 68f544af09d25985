//! One TCP socket's owner by its addresses, asked of the kernel over netlink (`sock_diag`,
//! `inet_diag` exact lookup): a hash lookup in the kernel, where reading `/proc/net/tcp` walks
//! every socket of the host. A Hub with 10,000 Nests on loopback made each new connection's
//! `/proc` scan cost milliseconds, one at a time, until joins waited past their timeouts and
//! were refused as "socket owner cannot be read" (`agen bench fleet`, BENCHMARKS.md).
//!
//! Invariant: `Err` only when netlink itself cannot answer (no such socket family in this
//! kernel, a refused socket, a malformed answer): the caller may fall back to `/proc`; a
//! socket the kernel does not have is `Ok(None)`.

use std::net::IpAddr;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
/// `struct nlmsghdr` then `struct inet_diag_req_v2`.
const REQUEST_LEN: usize = 16 + 56;
/// Where `idiag_uid` is in an answer: after the header (16), family/state/timer/retrans (4),
/// the socket id (48), expires, rqueue and wqueue (12).
const UID_AT: usize = 16 + 4 + 48 + 12;

/// The kernel's answer could not be had.
#[derive(Debug)]
pub struct Unavailable(pub String);

/// The uid of the TCP socket whose local address is `src` and remote address `dst` (both
/// already unmapped from IPv4-mapped IPv6), or `None` when the kernel has no such socket.
pub fn owner(src: (IpAddr, u16), dst: (IpAddr, u16)) -> Result<Option<u32>, Unavailable> {
    let family = match (src.0, dst.0) {
        (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
        _ => return Ok(None),
    };
    let request = request(family as u8, src, dst);
    let mut answer = [0u8; 512];
    let n = exchange(&request, &mut answer)?;
    parse(&answer[..n])
}

fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    let mut b = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => b[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => b.copy_from_slice(&v6.octets()),
    }
    b
}

fn request(family: u8, src: (IpAddr, u16), dst: (IpAddr, u16)) -> Vec<u8> {
    let mut r = Vec::with_capacity(REQUEST_LEN);
    // struct nlmsghdr (host byte order)
    r.extend_from_slice(&(REQUEST_LEN as u32).to_ne_bytes());
    r.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    r.extend_from_slice(&1u32.to_ne_bytes()); // seq
    r.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
                                              // struct inet_diag_req_v2
    r.push(family);
    r.push(libc::IPPROTO_TCP as u8);
    r.push(0); // no extensions
    r.push(0);
    r.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
                                                  // struct inet_diag_sockid: ports and addresses in network byte order
    r.extend_from_slice(&src.1.to_be_bytes());
    r.extend_from_slice(&dst.1.to_be_bytes());
    r.extend_from_slice(&addr_bytes(src.0));
    r.extend_from_slice(&addr_bytes(dst.0));
    r.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    r.extend_from_slice(&u32::MAX.to_ne_bytes()); // INET_DIAG_NOCOOKIE
    r.extend_from_slice(&u32::MAX.to_ne_bytes());
    r
}

fn parse(a: &[u8]) -> Result<Option<u32>, Unavailable> {
    let bad = || Unavailable(format!("a sock_diag answer of {} bytes", a.len()));
    let u16_at = |i: usize| a.get(i..i + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let u32_at = |i: usize| {
        a.get(i..i + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    match u16_at(4).ok_or_else(bad)? {
        SOCK_DIAG_BY_FAMILY => Ok(Some(u32_at(UID_AT).ok_or_else(bad)?)),
        NLMSG_ERROR => {
            let errno = -(u32_at(16).ok_or_else(bad)? as i32);
            if errno == libc::ENOENT {
                Ok(None)
            } else {
                Err(Unavailable(format!(
                    "sock_diag: {}",
                    std::io::Error::from_raw_os_error(errno)
                )))
            }
        }
        other => Err(Unavailable(format!("sock_diag: message type {other}"))),
    }
}

/// Sends `request` to the kernel's sock_diag and reads one answer into `answer`.
#[allow(unsafe_code)]
fn exchange(request: &[u8], answer: &mut [u8]) -> Result<usize, Unavailable> {
    let os = |what: &str| {
        Unavailable(format!(
            "sock_diag {what}: {}",
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: plain syscalls on a descriptor this function owns (closed through `OwnedFd`);
    // every pointer passed is to a live buffer of the length given with it.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        );
        if fd < 0 {
            return Err(os("socket"));
        }
        let fd = <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // An answer comes at once; never wait long for one that does not.
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        let mut kernel: libc::sockaddr_nl = std::mem::zeroed();
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let sent = libc::sendto(
            raw,
            request.as_ptr().cast(),
            request.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        );
        if sent < 0 {
            return Err(os("send"));
        }
        let got = libc::recv(raw, answer.as_mut_ptr().cast(), answer.len(), 0);
        if got < 0 {
            return Err(os("receive"));
        }
        Ok(got as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_has_the_kernels_layout() {
        let r = request(
            libc::AF_INET as u8,
            ("127.0.0.1".parse().unwrap(), 0x1234),
            ("127.0.0.2".parse().unwrap(), 80),
        );
        assert_eq!(r.len(), REQUEST_LEN);
        assert_eq!(&r[24..26], &[0x12, 0x34]);
        assert_eq!(&r[26..28], &[0, 80]);
        assert_eq!(&r[28..32], &[127, 0, 0, 1]);
        assert_eq!(&r[44..48], &[127, 0, 0, 2]);
    }

    /// The kernel answers for a live client socket with this process's uid, and `None` for
    /// an address pair no socket has: the lookup itself, not the `/proc` fallback.
    #[test]
    fn the_kernel_names_the_owner_of_a_live_client_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let found = owner((peer.ip(), peer.port()), (server.ip(), server.port()));
        assert_eq!(found.map_err(|e| e.0).unwrap(), Some(me));
        drop(client);
        let nobody = owner(
            ("127.0.0.1".parse().unwrap(), 1),
            (server.ip(), server.port()),
        );
        assert_eq!(nobody.map_err(|e| e.0).unwrap(), None);
    }

    #[test]
    fn an_unknown_socket_is_none_and_a_short_answer_an_error() {
        let mut err = vec![0u8; 36];
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert!(matches!(parse(&err), Ok(None)));
        assert!(parse(&[0u8; 3]).is_err());
    }
}
