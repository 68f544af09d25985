//! Network code the Hub and Nest daemons share, kept out of `agen-shared` (which has no
//! network code and no async runtime): the `/metrics` HTTP listener and who owns a local
//! connection's other end.

pub mod metrics_http;
pub mod peer_uid;
mod sock_diag;
