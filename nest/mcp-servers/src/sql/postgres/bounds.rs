//! What a Postgres call may pull into this server's memory and what it may leave behind: large
//! cells are cut in the database, rows are fetched in batches under a byte budget, the session
//! is reset after every call, and the DSN's role is checked once at start.
//!
//! Invariants:
//! - a `SELECT`/`WITH`/`VALUES`/`TABLE` query is run wrapped, `SELECT … FROM (SELECT * FROM
//!   (<query>) OFFSET 0) AS agen_q(…)` (`OFFSET 0` keeps the planner from copying the query's
//!   expressions into each of our references, so the query runs once), where every column whose type is not small by construction is fetched as the
//!   value when its stored size is at most [`DB_CUT_STORED_BYTES`], and otherwise as its first
//!   [`DB_CUT_CHARS`] characters of text (the cut happens in the database);
//! - rows are fetched [`FETCH_BATCH`] at a time and fetching stops once [`MAX_FETCH_BYTES`] of
//!   cells are held;
//! - `DISCARD ALL` runs after every call (advisory locks, prepared statements, temporary
//!   tables and settings never outlive it); if it fails the connection is dropped.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Stored size above which a cell is cut in the database.
pub(crate) const DB_CUT_STORED_BYTES: i32 = 8 * 1024;
/// Characters of text kept from a cell cut in the database (the marker fits in the 1000
/// characters a cell may show).
pub(crate) const DB_CUT_CHARS: i32 = 950;
/// Rows asked for per fetch.
pub(crate) const FETCH_BATCH: i32 = 50;
/// Bytes of cells held before fetching stops.
pub(crate) const MAX_FETCH_BYTES: usize = 4 * 1024 * 1024;

/// How each column of the user's query is fetched from the wrapped one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// One column, as it is (small by construction).
    Plain,
    /// Three columns: the value when small, its cut text when large, its stored size.
    Cut,
}

/// Whether values of `ty` are small by construction (no need to cut them in the database).
fn small_by_construction(ty: &Type) -> bool {
    matches!(
        *ty,
        Type::BOOL
            | Type::INT2
            | Type::INT4
            | Type::INT8
            | Type::OID
            | Type::XID
            | Type::CID
            | Type::REGCLASS
            | Type::REGPROC
            | Type::REGTYPE
            | Type::FLOAT4
            | Type::FLOAT8
            | Type::CHAR
            | Type::UUID
            | Type::DATE
            | Type::TIME
            | Type::TIMETZ
            | Type::TIMESTAMP
            | Type::TIMESTAMPTZ
            | Type::INTERVAL
            | Type::MONEY
            | Type::INET
            | Type::CIDR
            | Type::NAME
    )
}

/// Whether a statement starting with `first` (lowercase) can be wrapped in a subquery.
pub(crate) fn wrappable(first: &str) -> bool {
    matches!(first, "select" | "with" | "values" | "table")
}

/// The wrapped query for `statement` (already stripped of trailing `;` and comments) whose
/// columns have `types`, and how to read each column back.
pub(crate) fn wrap(statement: &str, types: &[Type]) -> (String, Vec<Slot>) {
    let names: Vec<String> = (1..=types.len()).map(|i| format!("\"c{i}\"")).collect();
    let mut items = Vec::new();
    let mut slots = Vec::new();
    for (ty, name) in types.iter().zip(&names) {
        let col = format!("agen_q.{name}");
        if small_by_construction(ty) {
            items.push(col);
            slots.push(Slot::Plain);
        } else {
            let size = format!("pg_column_size({col})");
            items.push(format!(
                "CASE WHEN {size} <= {DB_CUT_STORED_BYTES} THEN {col} END"
            ));
            items.push(format!(
                "CASE WHEN {size} > {DB_CUT_STORED_BYTES} THEN left({col}::text, {DB_CUT_CHARS}) END"
            ));
            items.push(format!("{size}::int8"));
            slots.push(Slot::Cut);
        }
    }
    let sql = format!(
        "SELECT {} FROM (SELECT * FROM (\n{statement}\n) AS agen_i OFFSET 0) AS agen_q({})",
        items.join(", "),
        names.join(", ")
    );
    (sql, slots)
}

/// The text shown for a cell cut in the database.
pub(crate) fn cut_marker(head: &str, stored: i64) -> String {
    format!("{head}… [cut in the database: {stored} bytes stored; select a part of it with left() or substr()]")
}

/// Resets the session after a call: `DISCARD ALL` releases advisory locks and drops
/// prepared statements, temporary tables and settings.
pub(crate) async fn reset_session(client: &Client) -> Result<(), tokio_postgres::Error> {
    client.batch_execute("DISCARD ALL").await
}

/// What the DSN's role may do beyond reading, or `None` when it only reads.
pub(crate) async fn role_powers(client: &Client) -> Result<Vec<String>, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls, r.rolreplication, \
                    pg_has_role(current_user, 'pg_signal_backend', 'MEMBER'), \
                    pg_has_role(current_user, 'pg_write_server_files', 'MEMBER') \
                      OR pg_has_role(current_user, 'pg_execute_server_program', 'MEMBER'), \
                    EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                             WHERE c.relkind IN ('r', 'p', 'v', 'f') \
                               AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
                               AND n.nspname NOT LIKE 'pg_toast%' \
                               AND has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')), \
                    EXISTS (SELECT 1 FROM pg_namespace n \
                             WHERE n.nspname NOT LIKE 'pg_%' AND n.nspname <> 'information_schema' \
                               AND has_schema_privilege(n.oid, 'CREATE')), \
                    current_user::text \
               FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await?;
    let flags = [
        (0, "is a superuser"),
        (1, "can create roles"),
        (2, "can create databases"),
        (3, "bypasses row-level security"),
        (4, "can replicate"),
        (5, "can signal other backends (pg_signal_backend)"),
        (6, "can write server files or run programs"),
        (7, "can insert, update, delete or truncate tables"),
        (8, "can create objects in a schema"),
    ];
    let mut powers = Vec::new();
    for (i, what) in flags {
        if row.try_get::<_, bool>(i)? {
            powers.push(what.to_owned());
        }
    }
    Ok(powers)
}

/// The start-up warning for a role with `powers` (see [`role_powers`]).
pub(crate) fn role_warning(powers: &[String]) -> Option<String> {
    if powers.is_empty() {
        return None;
    }
    Some(format!(
        "the DSN's role {}; every query runs read-only and is screened, but the guide recommends \
         connecting as a role that may only read what the agent should see (e.g. a role granted \
         only pg_read_all_data or SELECT on the tables it needs, not a superuser or owner)",
        powers.join(", ")
    ))
}
