//! `agen hub migrate --from … --to …`: every table of one stopped store copied into another (the
//! local store into PostgreSQL, or back), then counted on both sides.
//!
//! Invariants: a copy writes each record as it is (same key, same value), so running it again
//! changes nothing (idempotent); it ends with a flush, and it succeeds only when the destination
//! holds exactly as many records of every table as the source. The local store's own bookkeeping
//! (its count of flushes, which its integrity check compares with its event log) is not copied.

use super::{integrity, Result, Store, StoreError, Table};

/// One table's count on both sides after a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub table: &'static str,
    pub source: usize,
    pub destination: usize,
}

/// Whether a record is a store's own bookkeeping rather than the Hub's.
fn own_bookkeeping(table: Table, key: &[u8]) -> bool {
    table == Table::Counters && key == integrity::SLED_FLUSHES.as_bytes()
}

/// Copies every table of `from` into `to`, flushes `to`, and counts both: an error names the
/// first table whose counts differ.
pub async fn copy_all(from: &dyn Store, to: &dyn Store) -> Result<Vec<Copied>> {
    let mut counts = Vec::new();
    for table in Table::ALL {
        let rows = from.scan(table, b"")?;
        let mut source = 0;
        for (k, v) in &rows {
            if own_bookkeeping(table, k) {
                continue;
            }
            to.put(table, k, v)?;
            source += 1;
        }
        counts.push((table, source));
    }
    to.flush().await?;
    let mut out = Vec::new();
    for (table, source) in counts {
        let destination = to
            .scan(table, b"")?
            .iter()
            .filter(|(k, _)| !own_bookkeeping(table, k))
            .count();
        if destination != source {
            return Err(StoreError::Op {
                table: table.name(),
                reason: format!(
                    "the destination holds {destination} records after the copy, the source {source}: the destination was not empty (copy into an empty database or data dir)"
                ),
            });
        }
        out.push(Copied {
            table: table.name(),
            source,
            destination,
        });
    }
    Ok(out)
}
