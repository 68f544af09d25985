//! The `query` tool on Postgres: the user's one statement, prepared, wrapped so that large cells
//! are cut in the database (see `bounds`), and fetched in batches into JSON rows.
//!
//! Invariants: the statement goes through the extended protocol (Parse/Bind/Execute), so the
//! server refuses more than one command; it takes no parameters; fetching stops at the row limit
//! or once [`bounds::MAX_FETCH_BYTES`] of cells are held, and `more` says so.

use serde_json::Value;
use tokio_postgres::types::Type;
use tokio_postgres::Transaction;

use crate::sql::error::SqlError;
use crate::sql::guard::{self, Dialect};
use crate::sql::render::QueryRows;

use super::bounds;
use super::decode::PgCell;
use super::failure::{describe_error, PgFailure};

pub(super) async fn query(
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
        guard::first_keyword(sql, Dialect::Postgres).is_some_and(|k| bounds::wrappable(&k));
    let (statement, slots) = if wrappable && !columns.is_empty() {
        let types: Vec<Type> = statement
            .columns()
            .iter()
            .map(|c| c.type_().clone())
            .collect();
        let text =
            guard::statement_text(sql, Dialect::Postgres).map_err(|e| PgFailure::Own(e.into()))?;
        let (wrapped, slots) = bounds::wrap(text, &types);
        let statement = tx.prepare(&wrapped).await.map_err(|e| {
            PgFailure::Own(SqlError::BadArgument(format!(
                "the query cannot be run as a subquery, which this server does to cut large values in the \
                 database ({}); write it as one plain SELECT",
                describe_error(&e)
            )))
        })?;
        (statement, slots)
    } else {
        let slots = vec![bounds::Slot::Plain; columns.len()];
        (statement, slots)
    };
    let portal = tx.bind(&statement, &[]).await?;
    let mut rows = Vec::new();
    let mut held = 0usize;
    let mut more = false;
    'fetch: loop {
        let batch = tx.query_portal(&portal, bounds::FETCH_BATCH).await?;
        let last = batch.len() < bounds::FETCH_BATCH as usize;
        for row in batch {
            if rows.len() == limit || held > bounds::MAX_FETCH_BYTES {
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
    slots: &[bounds::Slot],
) -> std::result::Result<Vec<Value>, PgFailure> {
    let mut cells = Vec::with_capacity(slots.len());
    let mut at = 0;
    for slot in slots {
        match slot {
            bounds::Slot::Plain => {
                let cell: Option<PgCell> = row.try_get(at)?;
                cells.push(cell.map_or(Value::Null, |c| c.0));
                at += 1;
            }
            bounds::Slot::Cut => {
                let cut: Option<String> = row.try_get(at + 1)?;
                let stored: Option<i64> = row.try_get(at + 2)?;
                match cut {
                    Some(head) => cells.push(Value::String(bounds::cut_marker(
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
