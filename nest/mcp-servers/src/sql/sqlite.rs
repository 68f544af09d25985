//! The SQLite side of `agen mcp sql`: one connection to a file opened read-only, fenced four ways.
//!
//! Invariants:
//! - the file is opened with `SQLITE_OPEN_READ_ONLY` (a `file:` URI cannot widen that: SQLite
//!   refuses a `mode=` less strict than the flags), then `PRAGMA query_only = ON`;
//! - an authorizer, installed after that pragma, allows only reads: no writes, no schema changes,
//!   no `ATTACH`/`DETACH`, no transactions or savepoints, no pragma outside the read-only
//!   introspection list, no `load_extension` (extension loading is also off at the C level);
//! - exactly one statement runs: the tail after the first statement must be empty, and the
//!   statement must be one SQLite itself calls read-only (`sqlite3_stmt_readonly`);
//! - one value is at most 16 MiB and SQLite's heap at most 256 MiB (see `sqlite_bounds`), so
//!   a single huge `randomblob()` fails at once rather than outrunning the deadline;
//! - every statement runs under a deadline enforced by a progress handler, so a runaway query is
//!   interrupted at the timeout, or as soon as its MCP request is cancelled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::types::ValueRef;
use rusqlite::{Batch, Connection, OpenFlags};
use serde_json::Value;

use super::error::{Result, SqlError};
use super::guard::{self, Dialect};
use super::render::{ColumnInfo, QueryRows, TableInfo};
use super::sqlite_bounds;

/// Progress-handler granularity: SQLite VM instructions between deadline checks. Small, since
/// one instruction can be expensive (a 10 MB `randomblob()`), and a check is only a clock read.
const PROGRESS_STEPS: i32 = 32;

/// A SQLite database file, opened read-only.
pub struct Sqlite {
    conn: Arc<Mutex<Connection>>,
    watch: Arc<Watch>,
    timeout: Duration,
}

/// What the progress handler checks between VM steps: the running call's deadline, and whether
/// that call was abandoned (its MCP request cancelled). Calls are numbered so that abandoning one
/// can never interrupt the next.
#[derive(Default)]
struct Watch {
    deadline: Mutex<Option<Instant>>,
    /// The call running on the connection, 0 when idle.
    running: AtomicU64,
    /// The last call that was abandoned.
    abandoned: AtomicU64,
    next_id: AtomicU64,
}

impl Watch {
    fn start(&self, id: u64, timeout: Duration) {
        if let Ok(mut d) = self.deadline.lock() {
            *d = Some(Instant::now() + timeout);
        }
        self.running.store(id, Ordering::SeqCst);
    }

    fn finish(&self) {
        self.running.store(0, Ordering::SeqCst);
        if let Ok(mut d) = self.deadline.lock() {
            *d = None;
        }
    }

    /// true interrupts the running statement.
    fn should_interrupt(&self) -> bool {
        let running = self.running.load(Ordering::SeqCst);
        if running != 0 && running == self.abandoned.load(Ordering::SeqCst) {
            return true;
        }
        self.deadline
            .lock()
            .map(|d| d.is_some_and(|at| Instant::now() >= at))
            .unwrap_or(true)
    }
}

/// Armed while a call waits for its blocking task; dropped armed, it marks the call abandoned.
struct AbandonOnDrop {
    watch: Arc<Watch>,
    id: u64,
    armed: bool,
}

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!("sql call abandoned; interrupting its sqlite statement");
            self.watch.abandoned.store(self.id, Ordering::SeqCst);
        }
    }
}

/// Where the DSN points: a plain path, or a `file:` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqliteTarget {
    Path(PathBuf),
    Uri(String),
}

/// Reads a SQLite DSN: `sqlite:///abs.db`, `sqlite://rel.db`, `sqlite:x.db`, `file:x.db?…`, or a
/// plain path. A query string after a `sqlite:` path turns it into a `file:` URI.
pub fn parse_target(dsn: &str) -> SqliteTarget {
    let dsn = dsn.trim();
    if dsn.starts_with("file:") {
        return SqliteTarget::Uri(dsn.to_owned());
    }
    let path = if let Some(rest) = dsn
        .strip_prefix("sqlite://")
        .or_else(|| dsn.strip_prefix("sqlite3://"))
    {
        rest
    } else if let Some(rest) = dsn
        .strip_prefix("sqlite:")
        .or_else(|| dsn.strip_prefix("sqlite3:"))
    {
        rest
    } else {
        dsn
    };
    match path.split_once('?') {
        Some((file, query)) => SqliteTarget::Uri(format!("file:{file}?{query}")),
        None => SqliteTarget::Path(PathBuf::from(path)),
    }
}

impl Sqlite {
    /// Opens the database named by the DSN held in `dsn_env`, read-only.
    pub fn open(dsn: &str, dsn_env: &str, timeout: Duration) -> Result<Self> {
        let target = parse_target(dsn);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match &target {
            SqliteTarget::Path(path) => {
                if path.as_os_str().is_empty() {
                    return Err(SqlError::Config(format!(
                        "${dsn_env} names no SQLite file; set it to a path or a postgres:// URL"
                    )));
                }
                if !path.is_file() {
                    return Err(SqlError::Config(format!(
                        "${dsn_env} names the SQLite file {}, which does not exist; point {dsn_env} at an \
                         existing database file (or a postgres:// URL)",
                        path.display()
                    )));
                }
                Connection::open_with_flags(path, flags)
            }
            SqliteTarget::Uri(uri) => Connection::open_with_flags(Path::new(uri), flags),
        }
        .map_err(|e| SqlError::Config(format!("cannot open the SQLite database named by ${dsn_env}: {e}")))?;
        sqlite_bounds::bound(&conn);
        let watch = Arc::new(Watch::default());
        fence(&conn, timeout, Arc::clone(&watch)).map_err(|e| {
            SqlError::Config(format!("cannot make the SQLite database read-only: {e}"))
        })?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            watch,
            timeout,
        })
    }

    pub async fn tables(&self) -> Result<Vec<TableInfo>> {
        self.with_conn(|conn| {
            let mut stmt = conn.prepare(
                "SELECT name, type FROM sqlite_schema \
                  WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
                  ORDER BY name",
            )?;
            let rows = stmt.query_map([], |row| {
                Ok(TableInfo {
                    schema: None,
                    name: row.get(0)?,
                    kind: row.get(1)?,
                })
            })?;
            rows.collect()
        })
        .await
    }

    pub async fn describe(&self, table: &str) -> Result<(String, Vec<ColumnInfo>)> {
        let table = table.trim().to_owned();
        if table.is_empty() {
            return Err(SqlError::BadArgument(
                "`table` is empty; pass a table name such as `items`".into(),
            ));
        }
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) if !self.has_table("main", &table).await? => {
                (unquote(schema), unquote(name))
            }
            _ => ("main".to_owned(), unquote(&table)),
        };
        let columns = {
            let (schema, name) = (schema.clone(), name.clone());
            self.with_conn(move |conn| {
                let mut stmt = conn.prepare(
                    "SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1, ?2) ORDER BY cid",
                )?;
                let rows = stmt.query_map([&name, &schema], |row| {
                    let not_null: bool = row.get(2)?;
                    let data_type: String = row.get(1)?;
                    Ok(ColumnInfo {
                        name: row.get(0)?,
                        data_type: if data_type.is_empty() { "(any)".to_owned() } else { data_type },
                        nullable: !not_null,
                    })
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await
            .map_err(|e| match e {
                SqlError::Database(m) if m.contains("unknown database") => {
                    SqlError::NoSuchTable(table.clone())
                }
                other => other,
            })?
        };
        if columns.is_empty() {
            return Err(SqlError::NoSuchTable(table));
        }
        let shown = if schema == "main" {
            name
        } else {
            format!("{schema}.{name}")
        };
        Ok((shown, columns))
    }

    async fn has_table(&self, schema: &str, name: &str) -> Result<bool> {
        let (schema, name) = (schema.to_owned(), name.to_owned());
        self.with_conn(move |conn| {
            conn.query_row(
                "SELECT count(*) FROM pragma_table_info(?1, ?2)",
                [&name, &schema],
                |row| row.get::<_, i64>(0),
            )
        })
        .await
        .map(|n| n > 0)
    }

    pub async fn query(&self, sql: &str, limit: usize) -> Result<QueryRows> {
        guard::screen(sql, Dialect::Sqlite)?;
        let sql = sql.to_owned();
        self.run_blocking(move |conn| run_query(conn, &sql, limit))
            .await
    }

    /// Runs `work` on the connection in a blocking task, under the deadline.
    async fn with_conn<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.run_blocking(move |conn| work(conn).map_err(QueryFailure::Sqlite))
            .await
    }

    /// Runs `work` in a blocking task holding the connection, watched by the progress handler:
    /// interrupted at the timeout, or as soon as this call is abandoned.
    async fn run_blocking<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> std::result::Result<T, QueryFailure> + Send + 'static,
    {
        let id = self.watch.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let mut abandon = AbandonOnDrop {
            watch: Arc::clone(&self.watch),
            id,
            armed: true,
        };
        let conn = Arc::clone(&self.conn);
        let watch = Arc::clone(&self.watch);
        let timeout = self.timeout;
        let outcome = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().map_err(|_| QueryFailure::Poisoned)?;
            watch.start(id, timeout);
            let result = work(&conn);
            watch.finish();
            result
        })
        .await;
        abandon.armed = false;
        let outcome = outcome.map_err(|e| {
            SqlError::Database(format!("internal error: the database task failed: {e}"))
        })?;
        outcome.map_err(|f| self.map_failure(f))
    }

    fn map_failure(&self, failure: QueryFailure) -> SqlError {
        match failure {
            QueryFailure::Sqlite(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::OperationInterrupted =>
            {
                SqlError::Timeout(self.timeout)
            }
            QueryFailure::Sqlite(rusqlite::Error::SqliteFailure(e, msg))
                if e.code == rusqlite::ErrorCode::AuthorizationForStatementDenied =>
            {
                SqlError::Database(format!(
                    "{}: this server is read-only and allows only reads and introspection pragmas",
                    msg.unwrap_or_else(|| "not authorized".into())
                ))
            }
            QueryFailure::Sqlite(rusqlite::Error::SqliteFailure(e, msg))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::TooBig | rusqlite::ErrorCode::OutOfMemory
                ) =>
            {
                SqlError::Database(format!(
                    "{}: {}",
                    msg.unwrap_or_else(|| e.to_string()),
                    sqlite_bounds::too_big()
                ))
            }
            QueryFailure::Sqlite(e) => SqlError::Database(e.to_string()),
            QueryFailure::Own(e) => e,
            QueryFailure::Poisoned => SqlError::Database(
                "internal error: the connection lock is poisoned; restart the server".into(),
            ),
        }
    }
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    for (open, close) in [('"', '"'), ('`', '`'), ('[', ']')] {
        if let Some(inner) = s.strip_prefix(open).and_then(|s| s.strip_suffix(close)) {
            return inner.to_owned();
        }
    }
    s.to_owned()
}

/// Puts the fences up on a freshly opened connection.
fn fence(conn: &Connection, timeout: Duration, watch: Arc<Watch>) -> rusqlite::Result<()> {
    conn.execute_batch("PRAGMA query_only = ON")?;
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER,
        false,
    )?;
    // Views and triggers in the file may not call functions with side effects.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA,
        false,
    )?;
    // Extension loading stays off (rusqlite is built without `load_extension`, so nothing
    // enables it), and the authorizer refuses the SQL function as well.
    conn.busy_timeout(timeout)?;
    conn.progress_handler(PROGRESS_STEPS, Some(move || watch.should_interrupt()));
    conn.authorizer(Some(authorize));
    Ok(())
}

/// The authorizer: reads and introspection only.
fn authorize(ctx: AuthContext<'_>) -> Authorization {
    match ctx.action {
        AuthAction::Select | AuthAction::Read { .. } | AuthAction::Recursive => {
            Authorization::Allow
        }
        AuthAction::Function { function_name } if guard::sqlite_function_allowed(function_name) => {
            Authorization::Allow
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } if guard::sqlite_pragma_allowed(pragma_name, pragma_value) => Authorization::Allow,
        _ => Authorization::Deny,
    }
}

#[derive(Debug)]
enum QueryFailure {
    Sqlite(rusqlite::Error),
    Own(SqlError),
    Poisoned,
}

impl From<rusqlite::Error> for QueryFailure {
    fn from(e: rusqlite::Error) -> Self {
        QueryFailure::Sqlite(e)
    }
}

fn run_query(
    conn: &Connection,
    sql: &str,
    limit: usize,
) -> std::result::Result<QueryRows, QueryFailure> {
    let mut batch = Batch::new(conn, sql);
    let Some(mut stmt) = batch.next()? else {
        return Err(QueryFailure::Own(SqlError::Refused(guard::Refusal::Empty)));
    };
    // Anything after the first statement, even a statement SQLite cannot prepare, is refused.
    if !matches!(batch.next(), Ok(None)) {
        return Err(QueryFailure::Own(SqlError::Refused(
            guard::Refusal::MultipleStatements,
        )));
    }
    if !stmt.readonly() {
        return Err(QueryFailure::Own(SqlError::Database(
            "the statement would change the database; this server is read-only".into(),
        )));
    }
    if stmt.parameter_count() > 0 {
        return Err(QueryFailure::Own(SqlError::BadArgument(format!(
            "the query has {} parameter placeholder(s) (?, :name) but `query` takes no parameters; write the \
             values into the SQL text",
            stmt.parameter_count()
        ))));
    }
    let columns: Vec<String> = stmt.column_names().into_iter().map(str::to_owned).collect();
    let width = columns.len();
    let mut rows_out = Vec::new();
    let mut more = false;
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        if rows_out.len() == limit {
            more = true;
            break;
        }
        let mut cells = Vec::with_capacity(width);
        for i in 0..width {
            cells.push(cell(row.get_ref(i)?));
        }
        rows_out.push(cells);
    }
    Ok(QueryRows {
        columns,
        rows: rows_out,
        more,
    })
}

fn cell(value: ValueRef<'_>) -> Value {
    sqlite_bounds::cell(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn dsns_name_a_file_or_a_uri() {
        let check =
            |dsn: &str, expected: SqliteTarget| assert_eq!(parse_target(dsn), expected, "{dsn}");
        let path = |p: &str| SqliteTarget::Path(PathBuf::from(p));
        check("/srv/shop.db", path("/srv/shop.db"));
        check("shop.db", path("shop.db"));
        check("sqlite:///srv/shop.db", path("/srv/shop.db"));
        check("sqlite://shop.db", path("shop.db"));
        check("sqlite:shop.db", path("shop.db"));
        check(
            "file:/srv/shop.db?immutable=1",
            SqliteTarget::Uri("file:/srv/shop.db?immutable=1".into()),
        );
        check(
            "sqlite:///srv/shop.db?cache=shared",
            SqliteTarget::Uri("file:/srv/shop.db?cache=shared".into()),
        );
    }

    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("shop.db");
        let conn = Connection::open(&path).expect("create db");
        conn.execute_batch(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, note TEXT);
             INSERT INTO items (name, note) VALUES ('apple', NULL), ('pear', 'ripe');
             CREATE VIEW names AS SELECT name FROM items;",
        )
        .expect("seed db");
        (dir, path)
    }

    #[tokio::test]
    async fn reads_work_and_writes_are_refused_by_the_database_itself() {
        let (_dir, path) = fixture();
        let db = Sqlite::open(
            path.to_str().expect("utf-8 path"),
            "DSN",
            Duration::from_secs(5),
        )
        .expect("open");
        let tables = db.tables().await.expect("tables");
        assert_eq!(
            tables
                .iter()
                .map(|t| (t.name.as_str(), t.kind.as_str()))
                .collect::<Vec<_>>(),
            vec![("items", "table"), ("names", "view")]
        );
        let (name, columns) = db.describe("items").await.expect("describe");
        assert_eq!(name, "items");
        assert_eq!(columns.len(), 3);
        assert!(!columns[1].nullable);
        let (name, _) = db
            .describe("main.items")
            .await
            .expect("describe main.items");
        assert_eq!(name, "items");
        for missing in ["nope", "nope.items", "main.nope"] {
            let err = db.describe(missing).await.expect_err(missing);
            assert!(matches!(err, SqlError::NoSuchTable(_)), "{missing}: {err}");
        }
        let rows = db
            .query("SELECT id, name FROM items ORDER BY id", 1)
            .await
            .expect("query");
        assert_eq!(rows.rows, vec![vec![json!(1), json!("apple")]]);
        assert!(rows.more);

        // Run straight at the connection, past the lexical screen: the fences below it hold.
        let conn = db.conn.lock().expect("lock");
        for sql in [
            "DELETE FROM items",
            "INSERT INTO items (name) VALUES ('x')",
            "ATTACH DATABASE ':memory:' AS other",
            "VACUUM INTO '/tmp/agen-sql-vacuum-copy.db'",
            "PRAGMA query_only = 0",
            "SELECT load_extension('nothing')",
            "CREATE TEMP TABLE t (x)",
            "BEGIN IMMEDIATE",
            "SELECT 1; DELETE FROM items",
        ] {
            assert!(run_query(&conn, sql, 10).is_err(), "{sql} must fail");
        }
        assert!(!Path::new("/tmp/agen-sql-vacuum-copy.db").exists());
        let count: i64 = conn
            .query_row("SELECT count(*) FROM items", [], |r| r.get(0))
            .expect("count");
        assert_eq!(count, 2);
    }

    #[tokio::test]
    async fn a_runaway_query_is_interrupted_at_the_timeout() {
        let (_dir, path) = fixture();
        let db = Sqlite::open(
            path.to_str().expect("utf-8 path"),
            "DSN",
            Duration::from_millis(300),
        )
        .expect("open");
        let started = Instant::now();
        let err = db
            .query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c", 10)
            .await
            .expect_err("must time out");
        assert!(matches!(err, SqlError::Timeout(_)), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // The connection still works afterwards.
        assert!(db.query("SELECT 1", 10).await.is_ok());
    }
}
