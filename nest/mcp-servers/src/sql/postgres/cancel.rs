//! Stopping a Postgres query from the client side: the cancel request, the guard that sends it
//! when a call's future is abandoned, and the task that watches a connection end.
//!
//! Invariant: a guard dropped armed marks the connection to be replaced before it cancels, so a
//! late cancel can never hit the next call's query.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_postgres::{CancelToken, NoTls};

use super::failure::describe_error;
use super::tls::RustlsConnect;

/// Cancels the query running on a connection's backend.
pub(super) async fn cancel_query(token: CancelToken, tls: Option<RustlsConnect>) {
    let cancelled = match tls {
        None => token.cancel_query(NoTls).await,
        Some(tls) => token.cancel_query(tls).await,
    };
    if let Err(e) = cancelled {
        tracing::warn!(error = %describe_error(&e), "postgres cancel request failed");
    }
}

/// Armed while a call runs; dropped armed (the call's future was abandoned), it cancels the
/// backend's query and marks the connection to be replaced, so a late cancel can never hit the
/// next call's query.
pub(super) struct CancelOnDrop {
    pub(super) token: Option<CancelToken>,
    pub(super) tls: Option<RustlsConnect>,
    pub(super) discard: Arc<AtomicBool>,
}

impl CancelOnDrop {
    pub(super) fn defuse(&mut self) -> Option<CancelToken> {
        self.token.take()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        self.discard.store(true, Ordering::SeqCst);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tracing::info!("sql call abandoned; cancelling its postgres query");
            handle.spawn(cancel_query(token, self.tls.take()));
        }
    }
}

/// Logs how a connection ended; the client notices on its next call and reconnects.
pub(super) async fn watch_connection<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = connection.await {
        tracing::warn!(error = %describe_error(&e), "postgres connection closed");
    }
}
