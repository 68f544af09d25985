//! The Postgres side of `agen mcp sql`: one connection, and every tool call in its own
//! `READ ONLY` transaction with a `SET LOCAL statement_timeout`, always rolled back.
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
//!   large cells are cut in the database (see `pg_bounds`);
//! - the DSN is never logged or returned: errors name the variable, not its value;
//! - TLS follows libpq's `sslmode` (default `prefer`), through rustls (see `tls`).

use std::error::Error as StdError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, Kind, Type};
use tokio_postgres::{CancelToken, Client, Config, NoTls, Transaction};

use super::error::{Result, SqlError};
use super::guard::{self, Dialect};
use super::pg_bounds;
use super::render::{ColumnInfo, QueryRows, TableInfo};
use super::tls::{self, Roots, RustlsConnect, Verify};

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
        match pg_bounds::role_powers(client).await {
            Ok(powers) => {
                if let Some(warning) = pg_bounds::role_warning(&powers) {
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
                    tokio::time::timeout(self.timeout + CLIENT_GRACE, pg_bounds::reset_session(c))
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

/// The text of a Postgres error for the model: message, detail, hint and SQLSTATE.
fn describe_error(e: &tokio_postgres::Error) -> String {
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

/// Cancels the query running on a connection's backend.
async fn cancel_query(token: CancelToken, tls: Option<RustlsConnect>) {
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
struct CancelOnDrop {
    token: Option<CancelToken>,
    tls: Option<RustlsConnect>,
    discard: Arc<AtomicBool>,
}

impl CancelOnDrop {
    fn defuse(&mut self) -> Option<CancelToken> {
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
async fn watch_connection<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = connection.await {
        tracing::warn!(error = %describe_error(&e), "postgres connection closed");
    }
}

/// The TLS the DSN asks for, libpq style.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ssl {
    Disable,
    Tls(Verify, Roots),
}

/// Takes the libpq TLS parameters out of the URL (tokio-postgres knows only `sslmode=disable|
/// prefer|require`): `sslmode` (default `prefer`) and `sslrootcert` decide the [`Ssl`]; the URL
/// keeps an `sslmode` tokio-postgres understands. Client certificates and CRLs are refused.
fn split_ssl_params(dsn: &str, dsn_env: &str) -> Result<(String, Ssl)> {
    let (base, query) = dsn.split_once('?').unwrap_or((dsn, ""));
    let mut params = Vec::new();
    let mut mode = "prefer".to_owned();
    let mut root: Option<String> = None;
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "sslmode" => mode = percent_decode(value),
            "sslrootcert" => root = Some(percent_decode(value)),
            "sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir" => {
                return Err(SqlError::Config(format!(
                    "${dsn_env} uses {key}, which agen mcp sql does not support (no client certificates \
                     or CRLs); connect with a password or trust instead"
                )))
            }
            "sslcompression" | "sslsni" | "ssl_min_protocol_version" | "ssl_max_protocol_version" => {}
            _ => params.push(param.to_owned()),
        }
    }
    let roots = match root.as_deref() {
        None | Some("system") => Roots::System,
        Some(path) => Roots::File(path.into()),
    };
    let (wire, ssl) = match mode.as_str() {
        "disable" => ("disable", Ssl::Disable),
        "allow" | "prefer" => ("prefer", Ssl::Tls(Verify::None, roots)),
        // libpq: `require` with a root certificate verifies the chain, as `verify-ca` does.
        "require" if root.is_some() => ("require", Ssl::Tls(Verify::Chain, roots)),
        "require" => ("require", Ssl::Tls(Verify::None, roots)),
        "verify-ca" => ("require", Ssl::Tls(Verify::Chain, roots)),
        "verify-full" => ("require", Ssl::Tls(Verify::Full, roots)),
        other => {
            return Err(SqlError::Config(format!(
                "${dsn_env} has sslmode={other}; use disable, allow, prefer, require, verify-ca or verify-full"
            )))
        }
    };
    params.push(format!("sslmode={wire}"));
    Ok((format!("{base}?{}", params.join("&")), ssl))
}

/// Decodes `%XX` escapes in a URL query value (`+` is left as it is, as libpq does).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
        Op::Tables => Output::Tables(tables(&tx).await?),
        Op::Describe(table) => {
            let (name, columns) = describe(&tx, table).await?;
            Output::Columns(name, columns)
        }
        Op::Query(sql, limit) => Output::Rows(query(&tx, sql, limit).await?),
    };
    tx.rollback().await?;
    Ok(output)
}

/// A failure inside the transaction: a database error, or a reason of our own.
#[derive(Debug)]
enum PgFailure {
    Db(tokio_postgres::Error),
    Own(SqlError),
}

impl From<tokio_postgres::Error> for PgFailure {
    fn from(e: tokio_postgres::Error) -> Self {
        PgFailure::Db(e)
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

async fn tables(tx: &Transaction<'_>) -> std::result::Result<Vec<TableInfo>, PgFailure> {
    let rows = tx
        .query(
            "SELECT table_schema::text, table_name::text, table_type::text \
               FROM information_schema.tables \
              WHERE table_schema NOT IN ('pg_catalog', 'information_schema') \
             UNION ALL \
             SELECT schemaname::text, matviewname::text, 'MATERIALIZED VIEW' FROM pg_matviews \
             ORDER BY 1, 2",
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let schema: String = row.try_get(0)?;
        let name: String = row.try_get(1)?;
        let kind: String = row.try_get(2)?;
        let kind = match kind.as_str() {
            "BASE TABLE" => "table".to_owned(),
            "VIEW" => "view".to_owned(),
            "FOREIGN" => "foreign table".to_owned(),
            "LOCAL TEMPORARY" => "temporary table".to_owned(),
            other => other.to_lowercase(),
        };
        out.push(TableInfo {
            schema: Some(schema),
            name,
            kind,
        });
    }
    Ok(out)
}

async fn describe(
    tx: &Transaction<'_>,
    table: &str,
) -> std::result::Result<(String, Vec<ColumnInfo>), PgFailure> {
    let table = table.trim();
    if table.is_empty() {
        return Err(PgFailure::Own(SqlError::BadArgument(
            "`table` is empty; pass a table name such as `items` or `public.items`".into(),
        )));
    }
    let Some(row) = resolve_table(tx, table).await? else {
        return Err(PgFailure::Own(SqlError::NoSuchTable(table.to_owned())));
    };
    let oid: u32 = row.try_get(0)?;
    let name: String = row.try_get(1)?;
    let rows = tx
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull \
               FROM pg_attribute a \
              WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
              ORDER BY a.attnum",
            &[&oid],
        )
        .await?;
    let mut columns = Vec::with_capacity(rows.len());
    for row in rows {
        columns.push(ColumnInfo {
            name: row.try_get(0)?,
            data_type: row.try_get(1)?,
            nullable: row.try_get(2)?,
        });
    }
    Ok((name, columns))
}

/// Finds a table, view or foreign table by name: as written on the search path (`items`,
/// `Mixed Case`), then as `schema.table` (either part may be double-quoted), then lowercased.
async fn resolve_table(
    tx: &Transaction<'_>,
    table: &str,
) -> std::result::Result<Option<tokio_postgres::Row>, PgFailure> {
    const KINDS: &str = "c.relkind IN ('r', 'v', 'm', 'f', 'p')";
    let on_path = format!(
        "SELECT c.oid, c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE c.relname = $1 AND n.nspname = ANY(current_schemas(true)) AND {KINDS} \
          ORDER BY array_position(current_schemas(true), n.nspname) LIMIT 1"
    );
    if let Some(row) = tx.query_opt(&on_path, &[&table]).await? {
        return Ok(Some(row));
    }
    if let Some((schema, name)) = table.split_once('.') {
        let unquote = |s: &str| {
            let s = s.trim();
            match s.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
                Some(inner) => inner.replace("\"\"", "\""),
                None => s.to_lowercase(),
            }
        };
        let qualified = format!(
            "SELECT c.oid, c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = $1 AND c.relname = $2 AND {KINDS}"
        );
        let (schema, name) = (unquote(schema), unquote(name));
        if let Some(row) = tx.query_opt(&qualified, &[&schema, &name]).await? {
            return Ok(Some(row));
        }
    }
    let lower = table.to_lowercase();
    if lower != table {
        return Ok(tx.query_opt(&on_path, &[&lower]).await?);
    }
    Ok(None)
}

async fn query(
    tx: &Transaction<'_>,
    sql: &str,
    limit: usize,
) -> std::result::Result<QueryRows, PgFailure> {
    // Parse: the server refuses more than one command in a prepared statement.
    let statement = tx.prepare(sql).await?;
    if !statement.params().is_empty() {
        return Err(PgFailure::Own(SqlError::BadArgument(format!(
            "the query has {} parameter placeholder(s) ($1, …) but `query` takes no parameters; write the \
             values into the SQL text",
            statement.params().len()
        ))));
    }
    let columns: Vec<String> = statement
        .columns()
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    // Large cells are cut in the database: run the query wrapped (see `pg_bounds`).
    let wrappable =
        guard::first_keyword(sql, Dialect::Postgres).is_some_and(|k| pg_bounds::wrappable(&k));
    let (statement, slots) = if wrappable && !columns.is_empty() {
        let types: Vec<Type> = statement
            .columns()
            .iter()
            .map(|c| c.type_().clone())
            .collect();
        let text =
            guard::statement_text(sql, Dialect::Postgres).map_err(|e| PgFailure::Own(e.into()))?;
        let (wrapped, slots) = pg_bounds::wrap(text, &types);
        let statement = tx.prepare(&wrapped).await.map_err(|e| {
            PgFailure::Own(SqlError::BadArgument(format!(
                "the query cannot be run as a subquery, which this server does to cut large values in the \
                 database ({}); write it as one plain SELECT",
                describe_error(&e)
            )))
        })?;
        (statement, slots)
    } else {
        let slots = vec![pg_bounds::Slot::Plain; columns.len()];
        (statement, slots)
    };
    let portal = tx.bind(&statement, &[]).await?;
    let mut rows = Vec::new();
    let mut held = 0usize;
    let mut more = false;
    'fetch: loop {
        let batch = tx.query_portal(&portal, pg_bounds::FETCH_BATCH).await?;
        let last = batch.len() < pg_bounds::FETCH_BATCH as usize;
        for row in batch {
            if rows.len() == limit || held > pg_bounds::MAX_FETCH_BYTES {
                more = true;
                break 'fetch;
            }
            let cells = read_row(&row, &slots)?;
            held += cells.iter().map(approx_bytes).sum::<usize>();
            rows.push(cells);
        }
        if last {
            break;
        }
    }
    Ok(QueryRows {
        columns,
        rows,
        more,
    })
}

/// One row of a (possibly wrapped) query back into the user's columns.
fn read_row(
    row: &tokio_postgres::Row,
    slots: &[pg_bounds::Slot],
) -> std::result::Result<Vec<Value>, PgFailure> {
    let mut cells = Vec::with_capacity(slots.len());
    let mut at = 0;
    for slot in slots {
        match slot {
            pg_bounds::Slot::Plain => {
                let cell: Option<PgCell> = row.try_get(at)?;
                cells.push(cell.map_or(Value::Null, |c| c.0));
                at += 1;
            }
            pg_bounds::Slot::Cut => {
                let cut: Option<String> = row.try_get(at + 1)?;
                let stored: Option<i64> = row.try_get(at + 2)?;
                match cut {
                    Some(head) => cells.push(Value::String(pg_bounds::cut_marker(
                        &head,
                        stored.unwrap_or_default(),
                    ))),
                    None => {
                        let cell: Option<PgCell> = row.try_get(at)?;
                        cells.push(cell.map_or(Value::Null, |c| c.0));
                    }
                }
                at += 3;
            }
        }
    }
    Ok(cells)
}

/// About how many bytes a decoded cell holds.
fn approx_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(_) | Value::Object(_) => v.to_string().len(),
        _ => 8,
    }
}

/// Any Postgres value, decoded from the binary wire format into JSON.
struct PgCell(Value);

impl<'a> FromSql<'a> for PgCell {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(PgCell(
            decode(ty, raw).unwrap_or_else(|| undecodable(ty, raw)),
        ))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn undecodable(ty: &Type, raw: &[u8]) -> Value {
    Value::String(format!(
        "<{} value, {} bytes: cast it to text (::text) to see it>",
        ty.name(),
        raw.len()
    ))
}

/// Reads big-endian numbers off a byte slice, failing softly on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        self.take(2).map(|b| i16::from_be_bytes([b[0], b[1]]))
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8)
            .map(|b| i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
}

fn utf8(raw: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(raw).into_owned())
}

fn float(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or_else(|| Value::String(f.to_string()), Value::Number)
}

fn decode(ty: &Type, raw: &[u8]) -> Option<Value> {
    match ty.kind() {
        Kind::Enum(_) => return Some(utf8(raw)),
        Kind::Domain(inner) => return decode(inner, raw),
        Kind::Array(member) => return decode_array(member, raw),
        _ => {}
    }
    let mut r = Reader(raw);
    let value = match *ty {
        Type::BOOL => Value::Bool(*raw.first()? != 0),
        Type::INT2 => json!(r.i16()?),
        Type::INT4 => json!(r.i32()?),
        Type::INT8 => json!(r.i64()?),
        Type::OID | Type::XID | Type::CID | Type::REGCLASS | Type::REGPROC | Type::REGTYPE => {
            json!(u32::try_from(r.i32()?).ok().unwrap_or_default())
        }
        Type::FLOAT4 => float(f64::from(f32::from_bits(u32::from_be_bytes(
            r.take(4)?.try_into().ok()?,
        )))),
        Type::FLOAT8 => float(f64::from_bits(u64::from_be_bytes(
            r.take(8)?.try_into().ok()?,
        ))),
        Type::NUMERIC => Value::String(decode_numeric(&mut r)?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::XML => {
            utf8(raw)
        }
        Type::CHAR => Value::String((*raw.first()? as char).to_string()),
        Type::JSON => serde_json::from_slice(raw).unwrap_or_else(|_| utf8(raw)),
        Type::JSONB => {
            let body = raw.get(1..)?;
            serde_json::from_slice(body).unwrap_or_else(|_| utf8(body))
        }
        Type::UUID => {
            let h = hex::encode(r.take(16)?);
            Value::String(format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            ))
        }
        Type::BYTEA => Value::String(format!("\\x{}", hex::encode(raw))),
        Type::DATE => Value::String(decode_date(r.i32()?)?),
        Type::TIMESTAMP => Value::String(decode_timestamp(r.i64()?)?),
        Type::TIMESTAMPTZ => Value::String(decode_timestamp(r.i64()?)? + "+00"),
        Type::TIME => Value::String(decode_time(r.i64()?)),
        Type::TIMETZ => {
            let time = decode_time(r.i64()?);
            let west = r.i32()?;
            let east = -west;
            let sign = if east < 0 { '-' } else { '+' };
            let (h, m) = (east.abs() / 3600, (east.abs() % 3600) / 60);
            Value::String(if m == 0 {
                format!("{time}{sign}{h:02}")
            } else {
                format!("{time}{sign}{h:02}:{m:02}")
            })
        }
        Type::INTERVAL => {
            let micros = r.i64()?;
            let days = r.i32()?;
            let months = r.i32()?;
            Value::String(decode_interval(micros, days, months))
        }
        Type::MONEY => {
            let cents = r.i64()?;
            let sign = if cents < 0 { "-" } else { "" };
            Value::String(format!(
                "{sign}{}.{:02}",
                (cents / 100).abs(),
                (cents % 100).abs()
            ))
        }
        Type::INET | Type::CIDR => Value::String(decode_inet(&mut r)?),
        _ if ty.name() == "citext" || ty.name() == "ltree" => utf8(raw),
        _ => return None,
    };
    Some(value)
}

fn decode_array(member: &Type, raw: &[u8]) -> Option<Value> {
    let mut r = Reader(raw);
    let ndim = usize::try_from(r.i32()?).ok()?;
    let _flags = r.i32()?;
    let _oid = r.i32()?;
    let mut dims = Vec::with_capacity(ndim);
    for _ in 0..ndim {
        dims.push(usize::try_from(r.i32()?).ok()?);
        let _lower_bound = r.i32()?;
    }
    let count: usize = if ndim == 0 { 0 } else { dims.iter().product() };
    let mut values = Vec::with_capacity(count.min(10_000));
    for _ in 0..count {
        let len = r.i32()?;
        if len < 0 {
            values.push(Value::Null);
        } else {
            let bytes = r.take(usize::try_from(len).ok()?)?;
            values.push(decode(member, bytes).unwrap_or_else(|| undecodable(member, bytes)));
        }
    }
    // Nest from the innermost dimension outwards.
    for &dim in dims.iter().skip(1).rev() {
        if dim == 0 {
            break;
        }
        values = values
            .chunks(dim)
            .map(|c| Value::Array(c.to_vec()))
            .collect();
    }
    Some(Value::Array(values))
}

fn decode_numeric(r: &mut Reader<'_>) -> Option<String> {
    let ndigits = usize::try_from(r.i16()?).ok()?;
    let weight = r.i16()?;
    let sign = r.u16()?;
    let dscale = usize::from(r.u16()?);
    match sign {
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        _ => {}
    }
    let mut digits = Vec::with_capacity(ndigits);
    for _ in 0..ndigits {
        digits.push(r.i16()?);
    }
    let digit = |i: i32| -> i16 {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for d in 0..=i32::from(weight) {
            if d == 0 {
                out.push_str(&digit(d).to_string());
            } else {
                out.push_str(&format!("{:04}", digit(d)));
            }
        }
    }
    if dscale > 0 {
        let mut frac = String::new();
        let mut d = i32::from(weight) + 1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(d)));
            d += 1;
        }
        frac.truncate(dscale);
        out.push('.');
        out.push_str(&frac);
    }
    Some(out)
}

fn epoch() -> Option<chrono::NaiveDateTime> {
    chrono::NaiveDate::from_ymd_opt(2000, 1, 1)?.and_hms_opt(0, 0, 0)
}

fn decode_date(days: i32) -> Option<String> {
    match days {
        i32::MAX => Some("infinity".into()),
        i32::MIN => Some("-infinity".into()),
        _ => Some((epoch()?.date() + chrono::Duration::days(i64::from(days))).to_string()),
    }
}

fn decode_timestamp(micros: i64) -> Option<String> {
    match micros {
        i64::MAX => Some("infinity".into()),
        i64::MIN => Some("-infinity".into()),
        _ => {
            let at = epoch()?.checked_add_signed(chrono::Duration::microseconds(micros))?;
            Some(at.format("%Y-%m-%d %H:%M:%S%.f").to_string())
        }
    }
}

fn decode_time(micros: i64) -> String {
    let secs = micros / 1_000_000;
    let frac = micros % 1_000_000;
    let base = format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    );
    if frac == 0 {
        base
    } else {
        format!("{base}.{}", format!("{frac:06}").trim_end_matches('0'))
    }
}

fn decode_interval(micros: i64, days: i32, months: i32) -> String {
    let mut parts = Vec::new();
    let (years, months) = (months / 12, months % 12);
    if years != 0 {
        parts.push(format!(
            "{years} year{}",
            if years.abs() == 1 { "" } else { "s" }
        ));
    }
    if months != 0 {
        parts.push(format!(
            "{months} mon{}",
            if months.abs() == 1 { "" } else { "s" }
        ));
    }
    if days != 0 {
        parts.push(format!(
            "{days} day{}",
            if days.abs() == 1 { "" } else { "s" }
        ));
    }
    if micros != 0 || parts.is_empty() {
        let sign = if micros < 0 { "-" } else { "" };
        parts.push(format!("{sign}{}", decode_time(micros.abs())));
    }
    parts.join(" ")
}

fn decode_inet(r: &mut Reader<'_>) -> Option<String> {
    let family = r.take(1)?[0];
    let bits = r.take(1)?[0];
    let _is_cidr = r.take(1)?[0];
    let len = usize::from(r.take(1)?[0]);
    let addr = r.take(len)?;
    let (text, full) = match family {
        2 if len == 4 => (
            std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]).to_string(),
            32,
        ),
        3 if len == 16 => {
            let octets: [u8; 16] = addr.try_into().ok()?;
            (std::net::Ipv6Addr::from(octets).to_string(), 128)
        }
        _ => return None,
    };
    Some(if bits == full {
        text
    } else {
        format!("{text}/{bits}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn numeric(ndigits: i16, weight: i16, sign: u16, dscale: u16, digits: &[i16]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&ndigits.to_be_bytes());
        raw.extend_from_slice(&weight.to_be_bytes());
        raw.extend_from_slice(&sign.to_be_bytes());
        raw.extend_from_slice(&dscale.to_be_bytes());
        for d in digits {
            raw.extend_from_slice(&d.to_be_bytes());
        }
        raw
    }

    #[test]
    fn numerics_decode_to_their_text() {
        let check = |raw: Vec<u8>, expected: &str| {
            assert_eq!(decode_numeric(&mut Reader(&raw)).as_deref(), Some(expected));
        };
        check(numeric(1, 0, 0, 0, &[42]), "42");
        check(numeric(2, 0, 0, 2, &[12, 5000]), "12.50");
        check(numeric(2, 1, 0x4000, 0, &[1, 2345]), "-12345");
        check(numeric(1, -1, 0, 4, &[5]), "0.0005");
        check(numeric(1, -2, 0, 8, &[7]), "0.00000007");
        check(numeric(0, 0, 0, 2, &[]), "0.00");
        check(numeric(0, 0, 0xC000, 0, &[]), "NaN");
    }

    #[test]
    fn times_decode_to_their_text() {
        assert_eq!(decode_date(0).as_deref(), Some("2000-01-01"));
        assert_eq!(decode_date(-1).as_deref(), Some("1999-12-31"));
        assert_eq!(
            decode_timestamp(1_500_000).as_deref(),
            Some("2000-01-01 00:00:01.500")
        );
        assert_eq!(decode_time(3_723_000_001), "01:02:03.000001");
        assert_eq!(
            decode_interval(3_600_000_000, 3, 14),
            "1 year 2 mons 3 days 01:00:00"
        );
        assert_eq!(decode_interval(0, 0, 0), "00:00:00");
    }

    #[test]
    fn sslmode_values_libpq_knows_are_accepted_or_explained() {
        let check = |dsn: &str, expected: std::result::Result<(&str, Ssl), ()>| {
            let got = split_ssl_params(dsn, "DSN").map_err(|_| ());
            let expected = expected.map(|(url, ssl)| (url.to_owned(), ssl));
            assert_eq!(got, expected, "{dsn}");
        };
        let tls = |verify| Ssl::Tls(verify, Roots::System);
        let root = |verify, path: &str| Ssl::Tls(verify, Roots::File(path.into()));
        check(
            "postgres://u@h/db",
            Ok(("postgres://u@h/db?sslmode=prefer", tls(Verify::None))),
        );
        check(
            "postgres://u@h/db?sslmode=disable",
            Ok(("postgres://u@h/db?sslmode=disable", Ssl::Disable)),
        );
        check(
            "postgres://u@h/db?sslmode=allow&connect_timeout=3",
            Ok((
                "postgres://u@h/db?connect_timeout=3&sslmode=prefer",
                tls(Verify::None),
            )),
        );
        check(
            "postgres://u@h/db?sslmode=require",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::None))),
        );
        check(
            "postgres://u@h/db?sslmode=require&sslrootcert=%2Fetc%2Fca.pem",
            Ok((
                "postgres://u@h/db?sslmode=require",
                root(Verify::Chain, "/etc/ca.pem"),
            )),
        );
        check(
            "postgres://u@h/db?sslmode=verify-ca",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::Chain))),
        );
        check(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=system",
            Ok(("postgres://u@h/db?sslmode=require", tls(Verify::Full))),
        );
        check("postgres://u@h/db?sslmode=bogus", Err(()));
        check("postgres://u@h/db?sslcert=/c.pem&sslkey=/k.pem", Err(()));
        assert!(Postgres::new(
            "postgres://u@h/db?sslmode=verify-full",
            "DSN",
            Duration::from_secs(1)
        )
        .is_ok());
        assert!(Postgres::new(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem",
            "DSN",
            Duration::from_secs(1)
        )
        .is_err());
    }
}
