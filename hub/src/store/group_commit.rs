//! Group commit for [`super::Db::flush`]: every caller that arrives while a flush is in flight
//! is served by the next single flush, so one fsync makes the writes of many runs durable.
//!
//! Invariant: `flush` returns `Ok` only after a store flush that *started after the call began*
//! has finished. A caller takes a ticket after its writes; a flush covers every ticket taken
//! before it started (read as `upto` before the store flush begins); a caller whose ticket is
//! covered by a finished flush returns without one of its own. A failed flush covers nothing.
//! A store flush that finds nothing new to sync is not counted as one (the fsync metric counts
//! syncs that wrote).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Result, Store};

#[derive(Default)]
pub struct GroupCommit {
    /// The last ticket handed out.
    tickets: AtomicU64,
    /// Every ticket up to this one is durable.
    durable: AtomicU64,
    /// Store flushes done.
    flushes: AtomicU64,
    /// One store flush at a time; waiters queue here in order (tokio's mutex is fair).
    lock: tokio::sync::Mutex<()>,
}

impl GroupCommit {
    pub async fn flush(&self, store: &dyn Store) -> Result<()> {
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        let _turn = self.lock.lock().await;
        if self.durable.load(Ordering::SeqCst) >= ticket {
            return Ok(());
        }
        let upto = self.tickets.load(Ordering::SeqCst);
        let started = std::time::Instant::now();
        if store.flush().await? {
            crate::store_metrics::store_flushed(started.elapsed());
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
        self.durable.fetch_max(upto, Ordering::SeqCst);
        Ok(())
    }

    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use crate::store::{Db, SledStore};

    #[tokio::test]
    async fn concurrent_flushes_share_store_flushes_and_each_waits_for_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::new(Arc::new(SledStore::open(&dir.path().join("db")).unwrap()));
        let callers = 64;
        let mut joins = Vec::new();
        for i in 0..callers {
            let db = db.clone();
            joins.push(tokio::spawn(async move {
                db.raw()
                    .put(crate::store::Table::Tasks, format!("k{i}").as_bytes(), b"v")
                    .unwrap();
                db.flush().await.unwrap();
            }));
        }
        for j in joins {
            j.await.unwrap();
        }
        let flushes = db.flushes();
        assert!(
            (1..callers as u64).contains(&flushes),
            "{callers} concurrent callers took {flushes} store flushes"
        );
        // A caller alone after a write always gets a flush of its own; with no write since
        // the last flush there is nothing to sync.
        db.raw()
            .put(crate::store::Table::Tasks, b"alone", b"v")
            .unwrap();
        db.flush().await.unwrap();
        assert_eq!(db.flushes(), flushes + 1);
        db.flush().await.unwrap();
        assert_eq!(db.flushes(), flushes + 1, "nothing new was written");
    }
}
