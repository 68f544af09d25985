//! The sled implementation of [`Store`]: one sled tree per table, in `<data-dir>/db`, except
//! for run and task events, which live in the append-only [`EventLog`] file beside sled's
//! (`<data-dir>/db/events.log`). A store opened on a folder whose sled trees still hold events
//! (written before the event log existed) moves them into the log first.
//!
//! Invariant: at most one flush runs at a time, on a blocking thread. sled 0.34's
//! `flush_async` deadlocks when called from several tasks at once (spacejam/sled#1308), so
//! flushes go through one gate; a caller whose writes a flush already covered returns without
//! flushing again (group commit), and a flush with no write since the last one (counted after
//! each write operation) syncs nothing. sled keeps its first IO error for ever (a full disk), so the
//! first failed operation marks the store broken ([`Store::broken`]) and [`Store::heal`]
//! reopens the database in place, but only once a probe file of its own could be written and
//! synced (`space`): no file of the store is reopened, rewritten or compacted while writes
//! fail, and the old handle keeps serving reads until then. A flush is
//! sled's flush and then a sync of its files to the disk (`disk_sync`), each only when it was
//! written since the last flush, and an `fdatasync` of the event log when it was: what the Hub
//! acknowledges as durable survives a power cut, not only a crash of the process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use futures::future::BoxFuture;

use super::disk_sync::{sync_folder, sync_to_disk, BlobsSeen};
use super::event_log::{self, EventLog, Op};
use super::space;
use super::{PairRow, Result, Store, StoreError, Table};

pub struct SledStore {
    path: PathBuf,
    /// `None` only while it is being reopened.
    db: RwLock<Option<sled::Db>>,
    /// Why the store cannot write (the first error since it last worked).
    broken: Mutex<Option<String>>,
    /// One flush at a time.
    flush_gate: tokio::sync::Mutex<()>,
    /// Flush requests issued so far (a ticket per request).
    flush_requests: AtomicU64,
    /// Every request with a ticket up to this one is durable.
    flushed_upto: AtomicU64,
    /// Write operations done so far (counted after each one, whether it worked or not).
    writes: AtomicU64,
    /// The write count the last flush read before it started: every write counted by then is
    /// durable, so a flush that finds no newer one has nothing to do.
    flushed_writes: AtomicU64,
    /// Closed for good ([`Store::close`]): never reopened.
    closed: std::sync::atomic::AtomicBool,
    /// What flushes know of sled's blob files ([`sync_to_disk`]).
    blobs: std::sync::Arc<Mutex<BlobsSeen>>,
    /// Run and task events.
    log: std::sync::Arc<EventLog>,
    /// The event log's write count the last flush read before it started.
    flushed_log_writes: AtomicU64,
}

impl SledStore {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<SledStore> {
        // Created 0700 before sled writes into it: the store holds task inputs and results.
        agen_shared::private::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.display().to_string(),
            reason: format!("cannot create the folder: {e}"),
        })?;
        let db = open_db(dir)?;
        let log = EventLog::open(dir).map_err(|e| StoreError::Open {
            path: dir.join(event_log::FILE_NAME).display().to_string(),
            reason: e.to_string(),
        })?;
        move_events_into_log(&db, &log).map_err(|reason| StoreError::Open {
            path: dir.display().to_string(),
            reason: format!("cannot move the events sled holds into the event log: {reason}"),
        })?;
        Ok(SledStore {
            path: dir.to_path_buf(),
            db: RwLock::new(Some(db)),
            broken: Mutex::new(None),
            flush_gate: tokio::sync::Mutex::new(()),
            flush_requests: AtomicU64::new(0),
            flushed_upto: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushed_writes: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            blobs: Default::default(),
            log: std::sync::Arc::new(log),
            flushed_log_writes: AtomicU64::new(0),
        })
    }

    fn db(&self) -> Result<sled::Db> {
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Op {
                table: "all",
                reason: "the store is being reopened after an IO error; retry in a moment".into(),
            })
    }

    fn tree(&self, table: Table) -> Result<sled::Tree> {
        let db = self.db()?;
        db.open_tree(table.name()).map_err(|e| self.err(table, e))
    }

    /// An operation failed: the store is broken until [`Store::heal`] succeeds.
    fn err(&self, table: Table, e: impl std::fmt::Display) -> StoreError {
        let e = StoreError::Op {
            table: table.name(),
            reason: e.to_string(),
        };
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if broken.is_none() {
            tracing::error!(error = %e, "the hub store cannot write; serving NOT_SERVING until it can");
            *broken = Some(e.to_string());
        }
        e
    }
}

/// Moves every run and task event sled's trees hold (a store written before the event log
/// existed) into the event log: copied, synced, and only then cleared from sled. A crash
/// midway leaves them in sled, and the next open copies them again (a put replaces).
fn move_events_into_log(db: &sled::Db, log: &EventLog) -> Result<(), String> {
    let mut moved = Vec::new();
    for table in [Table::RunEvents, Table::TaskEvents] {
        let tree = db.open_tree(table.name()).map_err(|e| e.to_string())?;
        if tree.is_empty() {
            continue;
        }
        let write = |chunk: &[(sled::IVec, sled::IVec)]| {
            let ops: Vec<Op<'_>> = chunk
                .iter()
                .map(|(k, v)| Op::Put(table, k.as_ref(), v.as_ref()))
                .collect();
            log.write(&ops).map_err(|e| e.to_string())
        };
        let mut chunk = Vec::new();
        for entry in tree.iter() {
            chunk.push(entry.map_err(|e| e.to_string())?);
            if chunk.len() == 1024 {
                write(&chunk)?;
                chunk.clear();
            }
        }
        write(&chunk)?;
        moved.push(tree);
    }
    if moved.is_empty() {
        return Ok(());
    }
    log.sync().map_err(|e| e.to_string())?;
    for tree in &moved {
        tree.clear().map_err(|e| e.to_string())?;
    }
    db.flush().map_err(|e| e.to_string())?;
    tracing::info!("moved the run and task events sled held into the event log");
    Ok(())
}

fn open_db(dir: &Path) -> Result<sled::Db> {
    // A snapshot sled began and never finished (a full disk) would be read as its newest one.
    let cleared = space::clear_unfinished_snapshots(dir).map_err(|e| StoreError::Open {
        path: dir.display().to_string(),
        reason: format!("cannot remove an unfinished sled snapshot: {e}"),
    })?;
    for path in cleared {
        tracing::warn!(file = %path.display(), "removed a snapshot sled began and never finished (a write failed, e.g. a full disk); its finished snapshot and log are whole");
    }
    let db = sled::Config::new()
        .path(dir)
        .open()
        .map_err(|e| StoreError::Open {
            path: dir.display().to_string(),
            reason: format!("{e}; is another hub running with this --data-dir?"),
        })?;
    // The log file's name in its folder is durable too (sled does not sync the folder).
    sync_folder(dir).map_err(|e| StoreError::Open {
        path: dir.display().to_string(),
        reason: format!("cannot sync the folder: {e}"),
    })?;
    Ok(db)
}

impl SledStore {
    /// Counts one write operation (after it, so that a flush that reads the count covers it).
    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    /// [`Store::insert_pairs_in_order`] in the event log: one write of every row in order,
    /// refused whole when a row's key is stored already.
    fn log_pairs_in_order(&self, table: Table, also: Table, rows: &[PairRow]) -> Result<()> {
        let mut ops = Vec::with_capacity(rows.len() * 2);
        for row in rows {
            if let Some((key, value)) = &row.before {
                ops.push(Op::Put(also, key, value));
            }
            ops.push(Op::Put(table, &row.key, &row.value));
        }
        let written = self
            .log
            .write_if(&ops, |stored| {
                rows.iter().all(|row| !stored(table, &row.key))
            })
            .map_err(|e| self.err(table, e))?;
        if written {
            Ok(())
        } else {
            Err(StoreError::Op {
                table: table.name(),
                reason: "a row to append was stored meanwhile; nothing was written".into(),
            })
        }
    }
}

impl Store for SledStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        if event_log::holds(table) {
            return self.log.get(table, key).map_err(|e| self.err(table, e));
        }
        Ok(self
            .tree(table)?
            .get(key)
            .map_err(|e| self.err(table, e))?
            .map(|v| v.to_vec()))
    }

    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        if event_log::holds(table) {
            return self
                .log
                .write(&[Op::Put(table, key, value)])
                .map_err(|e| self.err(table, e));
        }
        let done = self
            .tree(table)
            .and_then(|t| t.insert(key, value).map_err(|e| self.err(table, e)));
        self.wrote();
        done.map(drop)
    }

    fn remove(&self, table: Table, key: &[u8]) -> Result<()> {
        if event_log::holds(table) {
            return self
                .log
                .write(&[Op::Remove(table, key)])
                .map_err(|e| self.err(table, e));
        }
        let done = self
            .tree(table)
            .and_then(|t| t.remove(key).map_err(|e| self.err(table, e)));
        self.wrote();
        done.map(drop)
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        if event_log::holds(table) {
            return self.log.scan(table, prefix).map_err(|e| self.err(table, e));
        }
        self.tree(table)?
            .scan_prefix(prefix)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(|e| self.err(table, e))
            })
            .collect()
    }

    fn insert_if_absent(&self, table: Table, key: &[u8], value: &[u8]) -> Result<bool> {
        if event_log::holds(table) {
            return self
                .log
                .write_if(&[Op::Put(table, key, value)], |stored| !stored(table, key))
                .map_err(|e| self.err(table, e));
        }
        let res = self.tree(table).and_then(|t| {
            t.compare_and_swap(key, None as Option<&[u8]>, Some(value))
                .map_err(|e| self.err(table, e))
        });
        self.wrote();
        Ok(res?.is_ok())
    }

    fn insert_pairs_in_order(&self, table: Table, also: Table, rows: &[PairRow]) -> Result<()> {
        match (event_log::holds(table), event_log::holds(also)) {
            (true, true) => return self.log_pairs_in_order(table, also, rows),
            (false, false) => {}
            _ => {
                return Err(StoreError::Op {
                    table: table.name(),
                    reason: format!(
                    "rows of {} and {} cannot be written in order: they live in different files",
                    table.name(),
                    also.name()
                ),
                })
            }
        }
        // sled orders every write of one thread in its one log (both trees share it), and
        // recovery replays a prefix of the log: the order below is what a crash keeps.
        let (first, second) = (self.tree(table)?, self.tree(also)?);
        for row in rows {
            if first
                .contains_key(&row.key)
                .map_err(|e| self.err(table, e))?
            {
                return Err(StoreError::Op {
                    table: table.name(),
                    reason: "a row to append was stored meanwhile; nothing was written".into(),
                });
            }
        }
        let written = rows.iter().try_for_each(|row| {
            if let Some((key, value)) = &row.before {
                second
                    .insert(key.as_slice(), value.as_slice())
                    .map_err(|e| self.err(also, e))?;
            }
            first
                .insert(row.key.as_slice(), row.value.as_slice())
                .map_err(|e| self.err(table, e))
                .map(drop)
        });
        self.wrote();
        written
    }

    fn last(&self, table: Table, prefix: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        if event_log::holds(table) {
            return self.log.last(table, prefix).map_err(|e| self.err(table, e));
        }
        match self.tree(table)?.scan_prefix(prefix).next_back() {
            Some(Ok((k, v))) => Ok(Some((k.to_vec(), v.to_vec()))),
            Some(Err(e)) => Err(self.err(table, e)),
            None => Ok(None),
        }
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
            .map_err(|e| self.err(Table::Counters, e));
        self.wrote();
        Ok(new?
            .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(1))
    }

    fn flush(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            // Our writes happened before we took a ticket.
            let ticket = self.flush_requests.fetch_add(1, Ordering::SeqCst) + 1;
            let _gate = self.flush_gate.lock().await;
            if self.flushed_upto.load(Ordering::SeqCst) >= ticket {
                return Ok(false);
            }
            // Every request issued before this flush starts is covered by it.
            let covers = self.flush_requests.load(Ordering::SeqCst);
            // Every write counted by now is covered too; with none since the last flush (and
            // a store that works) there is nothing to sync.
            let writes = self.writes.load(Ordering::SeqCst);
            let log_writes = self.log.writes();
            let sled_dirty =
                writes != self.flushed_writes.load(Ordering::SeqCst) || self.broken().is_some();
            let log_dirty = log_writes != self.flushed_log_writes.load(Ordering::SeqCst);
            if !sled_dirty && !log_dirty {
                self.flushed_upto.fetch_max(covers, Ordering::SeqCst);
                return Ok(false);
            }
            let (db, dir, blobs) = (self.db()?, self.path.clone(), self.blobs.clone());
            let log = self.log.clone();
            let sync = move || {
                if sled_dirty {
                    sync_to_disk(&db, &dir, &blobs)?;
                }
                if log_dirty {
                    log.sync().map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            };
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::task::spawn_blocking(sync)
                    .await
                    .map_err(|e| self.err(Table::RunEvents, e))?
                    .map_err(|e| self.err(Table::RunEvents, e))?;
            } else {
                // Outside a tokio runtime (tools, some tests) there is nobody to block.
                sync().map_err(|e| self.err(Table::RunEvents, e))?;
            }
            self.flushed_writes.store(writes, Ordering::SeqCst);
            self.flushed_log_writes.store(log_writes, Ordering::SeqCst);
            self.flushed_upto.fetch_max(covers, Ordering::SeqCst);
            Ok(true)
        })
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) =
            Some("the store is closed: the hub stopped".into());
        self.log.close();
        // The handle goes, and with it the database's file lock (a restarted Hub in the same
        // process opens it again at once).
        drop(self.db.write().unwrap_or_else(|p| p.into_inner()).take());
    }

    fn compact(&self) -> Result<bool> {
        // Nothing is rewritten while writes fail (a full disk): the old file stays as it is.
        if self.broken().is_some() {
            return Ok(false);
        }
        // Sled compacts its own files; the event log is rewritten here.
        self.log.compact().map_err(|e| StoreError::Op {
            table: Table::RunEvents.name(),
            reason: format!(
                "rewriting {} without its dead records: {e}",
                event_log::FILE_NAME
            ),
        })
    }

    fn heal(&self) -> Result<bool> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Op {
                table: "all",
                reason: "the store is closed: the hub stopped".into(),
            });
        }
        if self.broken().is_none() {
            return Ok(false);
        }
        // Not one file of the store is touched until the disk has room again: reopening sled
        // on a full disk is what destroyed it. Reads go on through the old handle meanwhile.
        space::probe(&self.path).map_err(|reason| StoreError::Op {
            table: "all",
            reason,
        })?;
        // Only the flush gate's holder flushes; reopening waits for no one else.
        let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
        // The old handle goes first: it holds the database's file lock.
        drop(slot.take());
        let reopened = open_db(&self.path).and_then(|db| {
            let probe = db
                .insert("store_probe", &crate::model::now_ms().to_be_bytes())
                .map_err(|e| e.to_string())
                .and_then(|_| sync_to_disk(&db, &self.path, &self.blobs))
                .and_then(|_| self.log.sync().map_err(|e| e.to_string()));
            match probe {
                Ok(()) => Ok(db),
                Err(reason) => Err(StoreError::Op {
                    table: "all",
                    reason,
                }),
            }
        });
        match reopened {
            Ok(db) => {
                *slot = Some(db);
                drop(slot);
                *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(true)
            }
            Err(e) => {
                // The disk filled again meanwhile. A handle for reads, but only while there is
                // room to open one: otherwise reads wait for the next heal.
                if space::probe(&self.path).is_ok() {
                    if let Ok(db) = open_db(&self.path) {
                        *slot = Some(db);
                    }
                }
                Err(e)
            }
        }
    }
}
