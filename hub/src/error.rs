//! The Hub's error type and the ONE place it becomes a `tonic::Status`.

use crate::store::StoreError;

/// Everything that can go wrong in the Hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    Config(String),
    #[error("{path}: {action}: {source}")]
    Io {
        path: std::path::PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] agen_shared::tls::TlsError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot serve gRPC: {0}")]
    Serve(String),
    /// A request field is wrong: names the field and what was expected.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    /// The thing exists already with other contents (a reused client request id).
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit was reached (artifact size, namespace quota): says which and what to do.
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's token may not do this: names the role and namespace it would need.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = HubError> = std::result::Result<T, E>;

impl HubError {
    /// The store refused to open because it lost data it had acknowledged (see
    /// `store::integrity`): what it found.
    pub fn store_damaged(&self) -> Option<&crate::store::integrity::Report> {
        match self {
            HubError::Store(StoreError::Damaged(report)) => Some(report),
            _ => None,
        }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        HubError::InvalidArgument(msg.into())
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        HubError::NotFound(msg.into())
    }
    pub fn io(
        path: impl Into<std::path::PathBuf>,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> HubError {
        let path = path.into();
        move |source| HubError::Io {
            path,
            action,
            source,
        }
    }
}

/// The longest status message the Hub sends (a row of the limits table, `limits.rs`).
pub const MAX_STATUS_MESSAGE_BYTES: usize = 4096;

/// At most `max` bytes of `s`, cut at a character boundary, with `…` appended when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl From<HubError> for tonic::Status {
    fn from(e: HubError) -> Self {
        // No status ever carries more than a bounded message (a client rejects huge ones).
        let msg = cut(&e.to_string(), MAX_STATUS_MESSAGE_BYTES);
        match e {
            HubError::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            HubError::NotFound(_) => tonic::Status::not_found(msg),
            HubError::AlreadyExists(_) => tonic::Status::already_exists(msg),
            HubError::FailedPrecondition(_) => tonic::Status::failed_precondition(msg),
            HubError::ResourceExhausted(_) => tonic::Status::resource_exhausted(msg),
            HubError::Unauthenticated(_) => tonic::Status::unauthenticated(msg),
            HubError::PermissionDenied(_) => tonic::Status::permission_denied(msg),
            HubError::Config(_) => tonic::Status::invalid_argument(msg),
            // The store cannot write (a full disk): the Hub heals by itself; retry later.
            HubError::Store(StoreError::Op { .. } | StoreError::Open { .. }) => {
                tracing::warn!(error = %msg, "request refused: the store cannot write");
                tonic::Status::unavailable(format!(
                    "{msg}; the hub serves again by itself once its store can write (free space in its --data-dir)"
                ))
            }
            HubError::Io { .. }
            | HubError::Tls(_)
            | HubError::Store(_)
            | HubError::Serve(_)
            | HubError::Internal(_) => {
                tracing::error!(error = %msg, "internal error");
                tonic::Status::internal(msg)
            }
        }
    }
}
