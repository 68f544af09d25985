//! The `tables` and `describe` tools on Postgres: catalog queries run inside the call's
//! read-only transaction.
//!
//! Invariant: a table name is only ever a bound parameter of a catalog query, never SQL text.

use tokio_postgres::Transaction;

use crate::sql::error::SqlError;
use crate::sql::render::{ColumnInfo, TableInfo};

use super::failure::PgFailure;

pub(super) async fn tables(tx: &Transaction<'_>) -> std::result::Result<Vec<TableInfo>, PgFailure> {
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

pub(super) async fn describe(
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
