//! Versioned, forward-only schema migrations of the PostgreSQL store: SQL files embedded in the
//! binary (`migrations/NNNN_name.sql`), applied in order, each in the transaction that records
//! it in `schema_migrations`. A database whose schema is newer than this binary knows is refused,
//! naming both versions.
//!
//! Invariant: migrations run under a transaction-scoped advisory lock, so Hubs starting together
//! on one database apply each migration once.

use tokio_postgres::Client;

/// Every migration this binary knows, oldest first: (version, name, SQL).
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (1, "records", include_str!("migrations/0001_records.sql")),
    (2, "leader", include_str!("migrations/0002_leader.sql")),
];

/// The advisory lock the migrations hold (`"agen"` in ASCII).
const LOCK: i64 = 0x6167_656e;

/// The schema version this binary writes.
pub fn latest() -> u32 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

/// What [`migrate`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The schema version the database had (0: an empty database).
    pub from: u32,
    /// The version it has now.
    pub to: u32,
}

/// Why the schema cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("the database {shown} has schema version {found}, newer than this agen build knows ({latest}): run an agen build that knows version {found} (a newer release), or point --store at another database")]
    Newer {
        shown: String,
        found: u32,
        latest: u32,
    },
    #[error("the database {shown}: {reason}")]
    Db { shown: String, reason: String },
}

/// Brings the schema to [`latest`] (`apply`), or only reads its version (`!apply`: an older
/// schema is reported, not changed). `shown` names the database in errors (no password).
pub async fn migrate(
    client: &mut Client,
    shown: &str,
    apply: bool,
) -> Result<Migrated, MigrateError> {
    let db = |e: tokio_postgres::Error| MigrateError::Db {
        shown: shown.to_owned(),
        reason: super::describe(&e),
    };
    let tx = client.transaction().await.map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await
        .map_err(db)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version integer PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(db)?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM schema_migrations",
            &[],
        )
        .await
        .map_err(db)?
        .get(0);
    let found = u32::try_from(found).unwrap_or(0);
    if found > latest() {
        return Err(MigrateError::Newer {
            shown: shown.to_owned(),
            found,
            latest: latest(),
        });
    }
    if !apply {
        return Ok(Migrated {
            from: found,
            to: found,
        });
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|m| m.0 > found) {
        tx.batch_execute(sql).await.map_err(db)?;
        let v = i32::try_from(*version).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&v, name],
        )
        .await
        .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(Migrated {
        from: found,
        to: latest(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_numbered_one_by_one_and_name_their_files() {
        for (i, (version, name, sql)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version as usize, i + 1, "migration {name}");
            assert!(!sql.trim().is_empty(), "migration {name} is empty");
        }
        assert_eq!(latest() as usize, MIGRATIONS.len());
    }
}
