//! The Postgres side of `agen mcp sql`: one connection, and every tool call in its own
//! `READ ONLY` transaction with a `SET LOCAL statement_timeout`, always rolled back.
//!
//! Reading order: `dsn` (libpq's TLS parameters) and `tls` (the rustls glue), this file (the
//! connection and the life of one call), `cancel` (client-side cancels), `schema` (`tables`,
//! `describe`), `query` and `decode` (rows into JSON), `bounds` (what a call may hold or leave
//! behind), `failure` (how errors read).
//!
//! Invariants:
//! - the user's SQL is sent as exactly one statement through the extended protocol (Parse/Bind/
//!   Execute), which the server refuses for more than one command;
//! - the transaction is read-only from its first statement and is never committed, so neither
//!   data nor session settings (`set_config(…, false)` is rolled back too) survive a call;
//! - the timeout is a `SET LOCAL` inside that transaction (as is `standard_conforming_strings
//!   = on`, so the server reads string literals exactly as the screen in `guard` did), and a client-side deadline (the
//!   timeout plus a grace) cancels the query and drops the connection if the server does not;
//! - after every call the session is reset with `DISCARD ALL` (or the connection dropped), and
//!   large cells are cut in the database (see `bounds`);
//! - the DSN is never logged or returned: errors name the variable, not its value;
//! - TLS follows libpq's `sslmode` (default `prefer`), through rustls (see `tls`).

mod bounds;
mod cancel;
mod decode;
mod dsn;
mod failure;
mod query;
mod schema;
mod tls;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use super::error::{Result, SqlError};
use super::guard::{self, Dialect};
use super::render::{ColumnInfo, QueryRows, TableInfo};
use cancel::{cancel_query, watch_connection, CancelOnDrop};
use dsn::{split_ssl_params, Ssl};
use failure::{describe_error, PgFailure};
use tls::RustlsConnect;

/// How long past the statement timeout the client waits before it cancels on its own.
const CLIENT_GRACE: Duration = Duration::from_secs(2);

/// A Postgres database reached through one (re)connecting client.
pub struct Postgres {
    config: Config,
    /// `None` for `sslmode=disable`.
    tls: Option<RustlsConnect>,
    timeout: Duration,
    client: tokio::sync::Mutex<Option<Client>>,
    /// Set when a call was abandoned mid-query: the next call reconnects.
    discard: Arc<AtomicBool>,
}

/// One unit of work done inside a read-only transaction.
enum Op<'a> {
    Tables,
    Describe(&'a str),
    Query(&'a str, usize),
}

enum Output {
    Tables(Vec<TableInfo>),
    Columns(String, Vec<ColumnInfo>),
    Rows(QueryRows),
}

impl Postgres {
    /// Parses the DSN held in `dsn_env`; does not connect yet.
    pub fn new(dsn: &str, dsn_env: &str, timeout: Duration) -> Result<Self> {
        let (dsn, ssl) = split_ssl_params(dsn, dsn_env)?;
        let mut config: Config = dsn.parse().map_err(|e| {
            SqlError::Config(format!(
                "${dsn_env} is not a valid postgres:// URL ({e}); fix the value of {dsn_env}"
            ))
        })?;
        let tls = match ssl {
            Ssl::Disable => None,
            Ssl::Tls(verify, roots) => Some(RustlsConnect::new(
                tls::client_config(verify, &roots)
                    .map_err(|e| SqlError::Config(format!("${dsn_env}: {e}")))?,
            )),
        };
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeout);
        }
        if config.get_application_name().is_none() {
            config.application_name("agen-mcp-sql");
        }
        Ok(Self {
            config,
            tls,
            timeout,
            client: tokio::sync::Mutex::new(None),
            discard: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Connects now, so that a bad DSN shows at start (the server still starts if it fails).
    /// Also warns on stderr when the DSN's role can do more than read.
    pub async fn warm_up(&self) -> Result<()> {
        let mut slot = self.client.lock().await;
        let client = self.connected(&mut slot).await?;
        match bounds::role_powers(client).await {
            Ok(powers) => {
                if let Some(warning) = bounds::role_warning(&powers) {
                    eprintln!("agen mcp sql: warning: {warning}");
                }
            }
            Err(e) => {
                tracing::warn!(error = %describe_error(&e), "cannot check what the DSN's role may do")
            }
        }
        Ok(())
    }

    pub async fn tables(&self) -> Result<Vec<TableInfo>> {
        match self.run(Op::Tables).await? {
            Output::Tables(tables) => Ok(tables),
            _ => Err(SqlError::Database(
                "internal error: unexpected output for tables".into(),
            )),
        }
    }

    pub async fn describe(&self, table: &str) -> Result<(String, Vec<ColumnInfo>)> {
        match self.run(Op::Describe(table)).await? {
            Output::Columns(name, columns) => Ok((name, columns)),
            _ => Err(SqlError::Database(
                "internal error: unexpected output for describe".into(),
            )),
        }
    }

    pub async fn query(&self, sql: &str, limit: usize) -> Result<QueryRows> {
        guard::screen(sql, Dialect::Postgres)?;
        match self.run(Op::Query(sql, limit)).await? {
            Output::Rows(rows) => Ok(rows),
            _ => Err(SqlError::Database(
                "internal error: unexpected output for query".into(),
            )),
        }
    }

    async fn connected<'s>(&self, slot: &'s mut Option<Client>) -> Result<&'s mut Client> {
        let abandoned = self.discard.swap(false, Ordering::SeqCst);
        if abandoned || slot.as_ref().is_some_and(|c| c.is_closed()) {
            *slot = None;
        }
        if slot.is_none() {
            let connect_error = |e: tokio_postgres::Error| SqlError::Connect(describe_error(&e));
            let client = match &self.tls {
                None => {
                    let (client, connection) =
                        self.config.connect(NoTls).await.map_err(connect_error)?;
                    tokio::spawn(watch_connection(connection));
                    client
                }
                Some(tls) => {
                    let (client, connection) = self
                        .config
                        .connect(tls.clone())
                        .await
                        .map_err(connect_error)?;
                    tokio::spawn(watch_connection(connection));
                    client
                }
            };
            tracing::info!("connected to postgres");
            *slot = Some(client);
        }
        slot.as_mut()
            .ok_or_else(|| SqlError::Connect("no connection".into()))
    }

    /// Runs `op` in a fresh read-only transaction under the timeout, then rolls back.
    async fn run(&self, op: Op<'_>) -> Result<Output> {
        let mut slot = self.client.lock().await;
        let client = self.connected(&mut slot).await?;
        // If this call is abandoned (the MCP client cancels it), the guard cancels the query
        // on the server and has the next call start on a fresh connection.
        let mut guard = CancelOnDrop {
            token: Some(client.cancel_token()),
            tls: self.tls.clone(),
            discard: Arc::clone(&self.discard),
        };
        let outcome = tokio::time::timeout(
            self.timeout + CLIENT_GRACE,
            run_in_transaction(client, op, self.timeout),
        )
        .await;
        let cancel = guard.defuse();
        if outcome.is_ok() {
            // Nothing a call did may outlive it (a session advisory lock survives even a failed
            // statement): reset the session, or drop the connection if that fails.
            let reset = match slot.as_ref() {
                Some(c) if !c.is_closed() => {
                    tokio::time::timeout(self.timeout + CLIENT_GRACE, bounds::reset_session(c))
                        .await
                        .is_ok_and(|r| r.is_ok())
                }
                _ => false,
            };
            if !reset {
                tracing::info!(
                    "postgres session could not be reset after a call; reconnecting next time"
                );
                *slot = None;
            }
        }
        match outcome {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(e)) => Err(self.map_failure(e)),
            Err(_) => {
                tracing::warn!(timeout = ?self.timeout, "postgres did not stop the query at its statement timeout; cancelling");
                if let Some(token) = cancel {
                    cancel_query(token, self.tls.clone()).await;
                }
                // The connection may still be busy with the cancelled query: start afresh.
                *slot = None;
                Err(SqlError::Timeout(self.timeout))
            }
        }
    }

    fn map_error(&self, e: &tokio_postgres::Error) -> SqlError {
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            return SqlError::Timeout(self.timeout);
        }
        if e.is_closed() {
            return SqlError::Connect(describe_error(e));
        }
        SqlError::Database(describe_error(e))
    }
}

impl Postgres {
    fn map_failure(&self, f: PgFailure) -> SqlError {
        match f {
            PgFailure::Db(e) => self.map_error(&e),
            PgFailure::Own(e) => e,
        }
    }
}

async fn run_in_transaction(
    client: &mut Client,
    op: Op<'_>,
    timeout: Duration,
) -> std::result::Result<Output, PgFailure> {
    let tx = client.build_transaction().read_only(true).start().await?;
    let millis = timeout.as_millis().max(1);
    // standard_conforming_strings makes the server read string literals the way the screen did.
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {millis}; SET LOCAL standard_conforming_strings = on"
    ))
    .await?;
    let output = match op {
        Op::Tables => Output::Tables(schema::tables(&tx).await?),
        Op::Describe(table) => {
            let (name, columns) = schema::describe(&tx, table).await?;
            Output::Columns(name, columns)
        }
        Op::Query(sql, limit) => Output::Rows(query::query(&tx, sql, limit).await?),
    };
    tx.rollback().await?;
    Ok(output)
}
