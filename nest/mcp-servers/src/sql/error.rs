//! Errors of the sql server. Every variant's text is written for the model that made the call:
//! what went wrong and what to do instead. None of them ever carries the DSN.

use std::time::Duration;

use super::guard::Refusal;

#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// The server cannot start: the DSN variable is missing or unusable.
    #[error("{0}")]
    Config(String),
    /// The database could not be reached (the call may work later).
    #[error("cannot connect to the database: {0}; the server retries on the next call")]
    Connect(String),
    /// The statement was refused before it reached the database.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// The statement ran past the timeout and was stopped.
    #[error(
        "the query was stopped after {} (the server's --timeout); make it cheaper: add a WHERE \
         clause or a LIMIT, or aggregate",
        humantime::format_duration(*.0)
    )]
    Timeout(Duration),
    /// The database reported an error for the statement.
    #[error("{0}")]
    Database(String),
    /// The table given to `describe` does not exist.
    #[error("table `{0}` not found; `tables` lists the tables and views that exist")]
    NoSuchTable(String),
    /// The MCP client cancelled the call.
    #[error("the call was cancelled")]
    Cancelled,
    /// The call's arguments are unusable.
    #[error("{0}")]
    BadArgument(String),
}

pub type Result<T> = std::result::Result<T, SqlError>;
