//! How a Postgres failure reads: the text of a server or connection error for the model, and the
//! failure type of work done inside a call's transaction.
//!
//! Invariant: the text names the server's message, detail, hint and SQLSTATE (or the chain of
//! causes for a connection error) and never the DSN.

use std::error::Error as StdError;

use tokio_postgres::error::SqlState;

use crate::sql::error::SqlError;

/// The text of a Postgres error for the model: message, detail, hint and SQLSTATE.
pub(super) fn describe_error(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        return text;
    };
    let mut text = format!(
        "{}: {} (SQLSTATE {})",
        db.severity().to_lowercase(),
        db.message(),
        db.code().code()
    );
    if let Some(detail) = db.detail() {
        text.push_str(&format!("; detail: {detail}"));
    }
    if let Some(hint) = db.hint() {
        text.push_str(&format!("; hint: {hint}"));
    }
    if db.code() == &SqlState::READ_ONLY_SQL_TRANSACTION {
        text.push_str("; this server is read-only: only queries that read are allowed");
    }
    text
}

/// A failure inside the transaction: a database error, or a reason of our own.
#[derive(Debug)]
pub(super) enum PgFailure {
    Db(tokio_postgres::Error),
    Own(SqlError),
}

impl From<tokio_postgres::Error> for PgFailure {
    fn from(e: tokio_postgres::Error) -> Self {
        PgFailure::Db(e)
    }
}
