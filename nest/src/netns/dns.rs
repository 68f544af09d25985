//! The DNS answers an instance gets: every UDP DNS question leaving its namespace is redirected
//! to this responder (on 127.0.0.1:53 inside the namespace), which the Nest answers with its
//! own resolver, only for names the instance's rule could allow (anything else is NXDOMAIN,
//! logged for `agen logs` and counted in `agen_egress_refused_total` like a refused
//! connection, so a closed rule leaves no DNS channel out). A questions get the Nest's IPv4 addresses (the
//! namespace has no IPv6 route out: AAAA is answered with no address); the names given out are
//! remembered per address, so a later connection to that address is known by its name.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::context::Context;

/// TTL of every answer: short, the Nest resolves again.
const TTL_SECS: u32 = 30;

/// A parsed question: id, flags, the name, its type, and where the question section ends.
struct Question {
    id: [u8; 2],
    rd: bool,
    name: String,
    qtype: u16,
    end: usize,
}

fn parse(q: &[u8]) -> Option<Question> {
    if q.len() < 12 || q[2] & 0x80 != 0 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let n = usize::from(*q.get(at)?);
        at += 1;
        if n == 0 {
            break;
        }
        if n > 63 {
            return None;
        }
        labels.push(
            std::str::from_utf8(q.get(at..at + n)?)
                .ok()?
                .to_ascii_lowercase(),
        );
        at += n;
    }
    let t = q.get(at..at + 4)?;
    Some(Question {
        id: [q[0], q[1]],
        rd: q[2] & 1 != 0,
        name: labels.join("."),
        qtype: u16::from_be_bytes([t[0], t[1]]),
        end: at + 4,
    })
}

/// The answer to `q` with `rcode` and these IPv4 addresses (for an A question).
fn answer(query: &[u8], q: &Question, rcode: u8, ips: &[Ipv4Addr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q.end + ips.len() * 16);
    out.extend(q.id);
    out.push(0x80 | u8::from(q.rd)); // QR, opcode 0, RD copied
    out.push(0x80 | rcode); // RA
    out.extend(1u16.to_be_bytes());
    out.extend(u16::try_from(ips.len()).unwrap_or(0).to_be_bytes());
    out.extend([0, 0, 0, 0]);
    out.extend(&query[12..q.end]);
    for ip in ips {
        out.extend([0xc0, 0x0c, 0, 1, 0, 1]); // the question's name, A, IN
        out.extend(TTL_SECS.to_be_bytes());
        out.extend(4u16.to_be_bytes());
        out.extend(ip.octets());
    }
    out
}

/// Answers questions on `sock` until `stop`.
pub async fn serve(sock: UdpSocket, cx: Arc<Context>, stop: CancellationToken) {
    let sock = Arc::new(sock);
    let mut buf = vec![0u8; 1500];
    loop {
        let (n, from) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r { Ok(x) => x, Err(_) => continue },
            _ = stop.cancelled() => return,
        };
        let query = buf[..n].to_vec();
        let Some(q) = parse(&query) else { continue };
        let (sock, cx) = (sock.clone(), cx.clone());
        tokio::spawn(async move {
            let reply = if q.qtype != 1 {
                // AAAA and the rest: the name exists, no address of that kind.
                answer(&query, &q, 0, &[])
            } else if q.name.is_empty() {
                answer(&query, &q, 3, &[])
            } else if let Err(rule) = cx.policy.may_resolve(&q.name) {
                cx.refused(&q.name, &rule, Some("its DNS question answered NXDOMAIN"));
                answer(&query, &q, 3, &[])
            } else {
                match tokio::net::lookup_host((q.name.as_str(), 0)).await {
                    Ok(addrs) => {
                        let mut ips: Vec<Ipv4Addr> = addrs
                            .filter_map(|a| match a.ip() {
                                IpAddr::V4(v4) => Some(v4),
                                IpAddr::V6(_) => None,
                            })
                            .collect();
                        ips.dedup();
                        ips.truncate(16);
                        cx.names.remember(&q.name, &ips);
                        answer(&query, &q, if ips.is_empty() { 3 } else { 0 }, &ips)
                    }
                    Err(_) => answer(&query, &q, 3, &[]),
                }
            };
            let _ = sock.send_to(&reply, from).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::Names;
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            q.push(l.len() as u8);
            q.extend(l.as_bytes());
        }
        q.push(0);
        q.extend(qtype.to_be_bytes());
        q.extend(1u16.to_be_bytes());
        q
    }

    #[test]
    fn a_question_is_parsed_and_answered_with_its_addresses() {
        let raw = query("Db.Test", 1);
        let q = parse(&raw).expect("parse");
        assert_eq!((q.name.as_str(), q.qtype, q.end), ("db.test", 1, raw.len()));
        let a = answer(&raw, &q, 0, &[Ipv4Addr::new(10, 0, 0, 7)]);
        assert_eq!(&a[..4], &[0x12, 0x34, 0x81, 0x80]);
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1);
        assert_eq!(&a[a.len() - 4..], &[10, 0, 0, 7]);
        let nx = answer(&raw, &q, 3, &[]);
        assert_eq!(nx[3] & 0x0f, 3);
        assert!(parse(&raw[..raw.len() - 1]).is_none());
        assert!(parse(&[0; 5]).is_none());
    }

    #[test]
    fn names_given_out_are_remembered_by_address() {
        let n = Names::default();
        n.remember("a.test", &[Ipv4Addr::new(10, 0, 0, 1)]);
        n.remember("b.test", &[Ipv4Addr::new(10, 0, 0, 1)]);
        n.remember("a.test", &[Ipv4Addr::new(10, 0, 0, 1)]);
        assert_eq!(
            n.of("10.0.0.1".parse().expect("ip")),
            vec!["a.test", "b.test"]
        );
    }
}
