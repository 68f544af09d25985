//! The exit codes of `agen` (a contract: `docs/exit-codes.md`) and how an error
//! becomes one: a gRPC status anywhere in an error's chain decides, else it is a failure (1).

use std::fmt;

/// Every exit code scripts may rely on.
pub mod code {
    pub const OK: i32 = 0;
    /// The task failed (or the command did).
    pub const FAILED: i32 = 1;
    /// Bad arguments or input (clap uses it for usage errors too).
    pub const USAGE: i32 = 2;
    pub const CANCELLED: i32 = 3;
    pub const NOT_FOUND: i32 = 4;
    /// Unauthenticated or permission denied.
    pub const DENIED: i32 = 5;
    pub const UNAVAILABLE: i32 = 6;
    pub const WAIT_TIMEOUT: i32 = 7;
    /// `agen hub` refused to start: its store lost data it had acknowledged (see `agen hub
    /// verify`); systemd must not restart it in a loop (`RestartPreventExitStatus=65`).
    pub const STORE_DAMAGED: i32 = agen_hub::store::integrity::EXIT_STORE_DAMAGED;
    /// `agen hub` stopped because another Hub took its leader lease over (several Hubs on
    /// PostgreSQL); restarted, it waits as a follower.
    pub const DEPOSED: i32 = agen_hub::ha::EXIT_DEPOSED;
}

/// The exit code table shown at the end of `agen --help`.
pub const HELP: &str = "\
Exit codes:
  0  ok
  1  task failed (or the command failed)
  2  usage: bad arguments or input (a missing client config, CA file or Hub URL too)
  3  task cancelled
  4  not found
  5  unauthenticated or permission denied (an untrusted Hub certificate too)
  6  Hub unavailable (retry later)
  7  wait timeout
 64  the daemons (agen hub, agen nest): bad configuration (sysexits)
 65  agen hub: its store lost acknowledged data, it does not start (agen hub verify, repair)
 75  agen hub: another Hub took its leader lease over; restart it (it follows)";

/// An error that carries the exit code it ends the process with.
#[derive(Debug)]
pub struct CodedError {
    pub code: i32,
    pub message: String,
}

impl fmt::Display for CodedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CodedError {}

/// An error that ends the process with `code`.
pub fn coded(code: i32, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(CodedError {
        code,
        message: message.into(),
    })
}

/// The exit code of a gRPC status.
pub fn of_status(c: tonic::Code) -> i32 {
    use tonic::Code;
    match c {
        Code::Ok => code::OK,
        Code::NotFound => code::NOT_FOUND,
        Code::Unauthenticated | Code::PermissionDenied => code::DENIED,
        Code::Unavailable => code::UNAVAILABLE,
        Code::InvalidArgument | Code::OutOfRange => code::USAGE,
        Code::Cancelled => code::CANCELLED,
        Code::DeadlineExceeded => code::WAIT_TIMEOUT,
        _ => code::FAILED,
    }
}

/// The exit code an error ends the process with: the first coded error or gRPC status in its
/// chain, else 1. A transport error (no Hub listening) is "Hub unavailable".
pub fn of_error(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CodedError>() {
            return c.code;
        }
        if let Some(s) = cause.downcast_ref::<tonic::Status>() {
            return of_status(s.code());
        }
        if cause.downcast_ref::<tonic::transport::Error>().is_some() {
            return code::UNAVAILABLE;
        }
    }
    code::FAILED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_deep_in_the_chain_decides_the_code() {
        let e = anyhow::Error::new(tonic::Status::not_found("task t-1 not found"))
            .context("while waiting");
        assert_eq!(of_error(&e), code::NOT_FOUND);
        let e = coded(code::DENIED, "refused").context("while listing");
        assert_eq!(of_error(&e), code::DENIED);
        assert_eq!(of_error(&anyhow::anyhow!("plain")), code::FAILED);
        assert_eq!(of_status(tonic::Code::Unavailable), code::UNAVAILABLE);
        assert_eq!(of_status(tonic::Code::PermissionDenied), code::DENIED);
    }
}
