//! The Hub's listener: one port for gRPC (HTTP/2) and the A2A HTTP API (HTTP/2 or HTTP/1.1),
//! over TLS ([`tls_incoming`]) or, on loopback only, plaintext ([`plain_incoming`]). ALPN offers
//! `h2` then `http/1.1`; client certificates are optional at the TLS level (Nests present the
//! one `Join` issued, API clients have none); every handshake runs off the accept loop under a
//! deadline, so a slow or silent client holds up no one else. On both, every connection first
//! takes a slot of the [`ConnGate`] and passes its owner check (refused: closed before the
//! handshake or any byte is read); one that has not authenticated within its deadline is cut.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::conn_gate::{ConnGate, Reason, Slot};

/// Handshakes in flight at once; further connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// The uids a Nest on this host hands its instances and tool servers by default
/// (`--run-uids`): the default of `--refuse-uids` (a local process of one of them is refused
/// the Hub's port and its metrics listener).
pub const REFUSED_UIDS: std::ops::RangeInclusive<u32> = 61000..=61999;

/// The TLS connections of `listener`, handshaken, as a stream for tonic's
/// `serve_with_incoming_shutdown`. It ends when `shutdown` is cancelled; every connection it
/// gave is cut when `cut` is (so no connection outlives a stopped Hub: a stream that does not
/// end in the shutdown grace would otherwise keep a Nest talking to it instead of reconnecting).
pub fn tls_incoming(
    listener: TcpListener,
    tls: Arc<crate::tls_live::LiveTls>,
    shutdown: CancellationToken,
    cut: CancellationToken,
    gate: Arc<ConnGate>,
) -> ReceiverStream<std::io::Result<Cut<TlsStream<TcpStream>>>> {
    gated_incoming(listener, shutdown, cut, gate, move |tcp| {
        // The settings now: a rotated CA applies from the next connection on.
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
        async move {
            let tls = acceptor.accept(tcp).await?;
            // A certificate of the Hub's CA (rustls verified it): a Nest.
            let nest = tls.get_ref().1.peer_certificates().is_some();
            Ok((tls, nest))
        }
    })
}

/// The plaintext connections of `listener` (`--insecure-plaintext`, loopback only), under the
/// same gate, owner check and deadlines as [`tls_incoming`].
pub fn plain_incoming(
    listener: TcpListener,
    shutdown: CancellationToken,
    cut: CancellationToken,
    gate: Arc<ConnGate>,
) -> ReceiverStream<std::io::Result<Cut<TcpStream>>> {
    gated_incoming(listener, shutdown, cut, gate, |tcp| async move {
        Ok((tcp, false))
    })
}

/// The accept loop both listeners share: a gate slot, the owner check and `upgrade` (the TLS
/// handshake; `true`: the connection proved itself a Nest) under the handshake deadline, off
/// the loop.
fn gated_incoming<C, F, Fut>(
    listener: TcpListener,
    shutdown: CancellationToken,
    cut: CancellationToken,
    gate: Arc<ConnGate>,
    upgrade: F,
) -> ReceiverStream<std::io::Result<Cut<C>>>
where
    C: Send + 'static,
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = std::io::Result<(C, bool)>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    let upgrade = Arc::new(upgrade);
    tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly, keep serving.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let slot = match gate.admit(peer) {
                Ok(slot) => slot,
                // Closed at once: no handshake, nothing buffered (the gate logs and counts it).
                Err(_) => continue,
            };
            // Small replies (acks, task states) must not wait on the peer's delayed ACK.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, %peer, "cannot set TCP_NODELAY");
            }
            let (tx, cut, gate, upgrade) = (tx.clone(), cut.clone(), gate.clone(), upgrade.clone());
            let limits = *gate.limits();
            tokio::spawn(async move {
                let _permit = permit;
                let Ok(local) = tcp.local_addr() else { return };
                // An instance or tool server of a Nest on this host: closed before any byte is
                // read (the gate logs and counts it).
                if gate.check_owner(peer, local).await.is_err() {
                    return;
                }
                match tokio::time::timeout(limits.handshake_timeout, upgrade(tcp)).await {
                    Ok(Ok((conn, nest))) => {
                        if nest {
                            slot.mark_authenticated();
                        }
                        let conn = Cut::new(conn, cut).gated(slot, limits.unauthenticated_timeout);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, %peer, "tls handshake failed"),
                    Err(_) => {
                        gate.count(Reason::HandshakeTimeout);
                        tracing::debug!(%peer, "tls handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// A connection that fails (reads and writes end with `ConnectionAborted`) once its token is
/// cancelled, so the server's connection task ends and the peer sees the connection close; and,
/// when gated, once it has stayed unauthenticated past its deadline. It holds its gate slot.
pub struct Cut<T> {
    inner: T,
    cut: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    slot: Option<Slot>,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// The deadline passed (counted once).
    expired: bool,
}

impl<T> Cut<T> {
    pub fn new(inner: T, cut: CancellationToken) -> Cut<T> {
        Cut {
            inner,
            cut: Box::pin(cut.cancelled_owned()),
            slot: None,
            deadline: None,
            expired: false,
        }
    }

    /// Holds `slot` and fails once `timeout` passed without the connection authenticating.
    pub fn gated(mut self, slot: Slot, timeout: Duration) -> Cut<T> {
        if !slot.is_authenticated() {
            self.deadline = Some(Box::pin(tokio::time::sleep(timeout)));
        }
        self.slot = Some(slot);
        self
    }

    /// `Err` once the token is cancelled or the authentication deadline passed (registering
    /// the wakers otherwise).
    fn check(&mut self, cx: &mut std::task::Context<'_>) -> std::io::Result<()> {
        use std::future::Future;
        if let std::task::Poll::Ready(()) = self.cut.as_mut().poll(cx) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the hub stopped",
            ));
        }
        if self.slot.as_ref().is_some_and(Slot::is_authenticated) {
            self.deadline = None;
        }
        if let Some(deadline) = self.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                if !std::mem::replace(&mut self.expired, true) {
                    if let Some(slot) = &self.slot {
                        slot.count(Reason::UnauthenticatedTimeout);
                    }
                }
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "not authenticated in time (--unauthenticated-timeout)",
                ));
            }
        }
        Ok(())
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Cut<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Cut<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = this.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check(cx) {
            return std::task::Poll::Ready(Err(e));
        }
        std::pin::Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Cut<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
