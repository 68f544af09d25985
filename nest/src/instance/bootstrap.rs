//! Reading the instance's [`Bootstrap`] from the pipe its Nest left on an inherited fd.
//!
//! Invariants: the fd is taken only when it is a pipe (never some other inherited file), read
//! to EOF (bounded by [`MAX_BOOTSTRAP`]) and closed before anything else starts, so no tool
//! server inherits it; the fd variable itself holds only a number.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::socket::{Bootstrap, BOOTSTRAP_FD_ENV, MAX_BOOTSTRAP};

/// Why the bootstrap could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("{BOOTSTRAP_FD_ENV} is not set: `agen instance` is started by a nest, not by hand")]
    NotSet,
    #[error("{BOOTSTRAP_FD_ENV}={0:?} is not an fd number")]
    BadNumber(String),
    #[error("{BOOTSTRAP_FD_ENV}={fd}: fd {fd} is not the nest's bootstrap pipe ({why})")]
    NotAPipe { fd: i32, why: String },
    #[error("reading the bootstrap from fd {fd}: {source}")]
    Read {
        fd: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("the bootstrap from fd {fd} is not valid: {source}")]
    Decode {
        fd: i32,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads and closes the bootstrap fd named by [`BOOTSTRAP_FD_ENV`].
pub fn read_inherited() -> Result<Bootstrap, BootstrapError> {
    let raw = std::env::var(BOOTSTRAP_FD_ENV).map_err(|_| BootstrapError::NotSet)?;
    let fd: i32 = raw
        .trim()
        .parse()
        .ok()
        .filter(|fd| *fd > 2)
        .ok_or(BootstrapError::BadNumber(raw.clone()))?;
    let st = nix::sys::stat::fstat(fd).map_err(|e| BootstrapError::NotAPipe {
        fd,
        why: e.to_string(),
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(BootstrapError::NotAPipe {
            fd,
            why: "not a pipe".into(),
        });
    }
    #[allow(unsafe_code)]
    // SAFETY: the fd is open (fstat succeeded), is a pipe, and nothing else in this process
    // owns it: the nest put it there for us alone, and this is its only reader.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut text = Vec::new();
    std::fs::File::from(owned)
        .take(MAX_BOOTSTRAP)
        .read_to_end(&mut text)
        .map_err(|source| BootstrapError::Read { fd, source })?;
    serde_json::from_slice(&text).map_err(|source| BootstrapError::Decode { fd, source })
}
