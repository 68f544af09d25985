//! The sled implementation of [`Store`]: one sled tree per table, in `<data-dir>/db`.

use std::path::Path;

use futures::future::BoxFuture;

use super::{Result, Store, StoreError, Table};

pub struct SledStore {
    db: sled::Db,
}

impl SledStore {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore> {
        let db = sled::Config::new()
            .path(dir)
            .open()
            .map_err(|e| StoreError::Open {
                path: dir.display().to_string(),
                reason: format!("{e}; is another hub running with this --data-dir?"),
            })?;
        Ok(SledStore { db })
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
            self.db
                .flush_async()
                .await
                .map_err(|e| err(Table::RunEvents, e))?;
            Ok(())
        })
    }
}
