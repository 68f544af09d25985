//! The sled implementation of [`Store`]: one sled tree per table, in `<data-dir>/db`.
//!
//! Invariant: at most one flush runs at a time, on a blocking thread. sled 0.34's
//! `flush_async` deadlocks when called from several tasks at once (spacejam/sled#1308), so
//! flushes go through one gate; a caller whose writes a flush already covered returns without
//! flushing again (group commit).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use super::{Result, Store, StoreError, Table};

pub struct SledStore {
    db: sled::Db,
    /// One flush at a time.
    flush_gate: tokio::sync::Mutex<()>,
    /// Flush requests issued so far (a ticket per request).
    flush_requests: AtomicU64,
    /// Every request with a ticket up to this one is durable.
    flushed_upto: AtomicU64,
}

impl SledStore {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore> {
        // Created 0700 before sled writes into it: the store holds task inputs and results.
        agen_shared::private::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.display().to_string(),
            reason: format!("cannot create the folder: {e}"),
        })?;
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(|e| StoreError::Open {
                path: dir.display().to_string(),
                reason: format!("{e}; is another hub running with this --data-dir?"),
            })?;
        Ok(SledStore {
            db,
            flush_gate: tokio::sync::Mutex::new(()),
            flush_requests: AtomicU64::new(0),
            flushed_upto: AtomicU64::new(0),
        })
    }

    fn tree(&self, table: Table) -> Result<sled::Tree> {
        self.db.open_tree(table.name()).map_err(|e| err(table, e))
    }
}

fn err(table: Table, e: impl std::fmt::Display) -> StoreError {
    StoreError::Op {
        table: table.name(),
        reason: e.to_string(),
    }
}

impl Store for SledStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .tree(table)?
            .get(key)
            .map_err(|e| err(table, e))?
            .map(|v| v.to_vec()))
    }

    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.tree(table)?
            .insert(key, value)
            .map_err(|e| err(table, e))?;
        Ok(())
    }

    fn remove(&self, table: Table, key: &[u8]) -> Result<()> {
        self.tree(table)?.remove(key).map_err(|e| err(table, e))?;
        Ok(())
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.tree(table)?
            .scan_prefix(prefix)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| err(table, e))
            })
            .collect()
    }

    fn insert_if_absent(&self, table: Table, key: &[u8], value: &[u8]) -> Result<bool> {
        let res = self
            .tree(table)?
            .compare_and_swap(key, None as Option<&[u8]>, Some(value))
            .map_err(|e| err(table, e))?;
        Ok(res.is_ok())
    }

    fn increment(&self, counter: &str) -> Result<u64> {
        let tree = self.tree(Table::Counters)?;
        let new = tree
            .update_and_fetch(counter.as_bytes(), |old| {
                let n = old
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .unwrap_or(0);
                Some((n + 1).to_be_bytes().to_vec())
            })
            .map_err(|e| err(Table::Counters, e))?;
        Ok(new
            .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(1))
    }

    fn flush(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // Our writes happened before we took a ticket.
            let ticket = self.flush_requests.fetch_add(1, Ordering::SeqCst) + 1;
            let _gate = self.flush_gate.lock().await;
            if self.flushed_upto.load(Ordering::SeqCst) >= ticket {
                return Ok(());
            }
            // Every request issued before this flush starts is covered by it.
            let covers = self.flush_requests.load(Ordering::SeqCst);
            let db = self.db.clone();
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::task::spawn_blocking(move || db.flush())
                    .await
                    .map_err(|e| err(Table::RunEvents, e))?
                    .map_err(|e| err(Table::RunEvents, e))?;
            } else {
                // Outside a tokio runtime (tools, some tests) there is nobody to block.
                db.flush().map_err(|e| err(Table::RunEvents, e))?;
            }
            self.flushed_upto.fetch_max(covers, Ordering::SeqCst);
            Ok(())
        })
    }
}
