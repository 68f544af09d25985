//! The PostgreSQL implementation of [`Store`] (`agen hub --store postgres://…`): every table of
//! the Hub as rows `(tbl, key, value)` of one table, `agen_records`, with the same keys and
//! values as the local store; the schema is versioned ([`migrate`]).
//!
//! Durability: each write is its own committed statement (visible at once, in the order the
//! Hub made them) on a connection with `synchronous_commit = off`, so a write costs one round
//! trip and no WAL flush; [`Store::flush`] commits one small update with `synchronous_commit =
//! on`, whose wait for the WAL covers every earlier commit of every connection (the WAL is one
//! sequence). So one flush makes all writes made before it durable (group commit, as the local
//! store's fsync): what the Hub acknowledges after a flush survives a crash of the Hub and of
//! PostgreSQL. After a crash the database holds a prefix of the writes.
//!
//! The [`Store`] calls are synchronous: they run on a small runtime of the store's own (its
//! connections live there) and the caller's thread waits, as it waits for the disk with sled.
//! A failure to reach the database marks the store broken ([`Store::broken`]), as a failed
//! write does the local store: writes are refused (reads go on) until [`Store::heal`] reaches
//! the database again, after which the Hub reloads its state from what is durable.

mod conn;
pub mod lease;
pub mod migrate;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio_postgres::Config;

use super::{PairRow, Result, Store, StoreError, Table};
use conn::{Op, Out, Pool};

/// Connections of one store (each caller thread blocks one while its operation runs).
const POOL_SIZE: usize = 8;

/// Whether `url` names a PostgreSQL store (`postgres://` or `postgresql://`).
pub fn is_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` without its password and parameters, for messages and logs.
pub fn shown(url: &str) -> String {
    match url.parse::<Config>() {
        Ok(c) => {
            let host = c
                .get_hosts()
                .iter()
                .map(|h| match h {
                    tokio_postgres::config::Host::Tcp(h) => h.clone(),
                    tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
                })
                .collect::<Vec<_>>()
                .join(",");
            let port = c
                .get_ports()
                .first()
                .map(|p| format!(":{p}"))
                .unwrap_or_default();
            format!(
                "postgres://{}{host}{port}/{}",
                c.get_user().map(|u| format!("{u}@")).unwrap_or_default(),
                c.get_dbname().unwrap_or("")
            )
        }
        Err(_) => "postgres://(an unreadable URL)".into(),
    }
}

/// A database error as a sentence (the server's message and detail when it sent one).
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(&format!(": {inner}"));
                src = inner.source();
            }
            s
        }
    }
}

/// `agen hub migrate`: connects to `url` and brings its schema to [`migrate::latest`]
/// (`apply`), or only reads its version. Blocks; call it off the async threads.
pub fn migrate_url(
    url: &str,
    apply: bool,
) -> std::result::Result<migrate::Migrated, migrate::MigrateError> {
    let shown = shown(url);
    let fail = |reason: String| migrate::MigrateError::Db {
        shown: shown.clone(),
        reason,
    };
    let config: Config = url
        .parse()
        .map_err(|e| fail(format!("not a valid postgres:// URL: {e}")))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(format!("cannot start a runtime: {e}")))?;
    rt.block_on(async {
        let mut c = conn::connect(&config, true)
            .await
            .map_err(|e| fail(format!("cannot connect: {}", describe(&e))))?;
        migrate::migrate(c.client(), &shown, apply).await
    })
}

pub struct PgStore {
    /// `None` only while dropped.
    rt: Option<tokio::runtime::Runtime>,
    pool: Arc<Pool>,
    shown: String,
    broken: Mutex<Option<String>>,
    closed: AtomicBool,
    /// Write operations so far, and the count the last flush covered.
    writes: AtomicU64,
    flushed_writes: AtomicU64,
    /// A write found another Hub's epoch on the lease row: this Hub is deposed for good.
    deposed: AtomicBool,
}

impl PgStore {
    /// Connects to `url`, applies the pending migrations ([`migrate::migrate`]) and refuses a
    /// schema newer than this binary's.
    pub fn open(url: &str) -> Result<PgStore> {
        Self::open_with(url, true).map(|(store, _)| store)
    }

    /// Opens the store and brings its schema up to date (`apply`) or only reads its version.
    pub fn open_with(url: &str, apply: bool) -> Result<(PgStore, migrate::Migrated)> {
        let shown = shown(url);
        let open_err = |reason: String| StoreError::Open {
            path: shown.clone(),
            reason,
        };
        let mut config: Config = url
            .parse()
            .map_err(|e| open_err(format!("not a valid postgres:// URL: {e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(conn::OP_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("agen-hub");
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("agen-hub-pg")
            .enable_all()
            .build()
            .map_err(|e| open_err(format!("cannot start the store's runtime: {e}")))?;
        let store = PgStore {
            rt: Some(rt),
            pool: Arc::new(Pool::new(config.clone(), POOL_SIZE)),
            shown: shown.clone(),
            broken: Mutex::new(None),
            closed: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            flushed_writes: AtomicU64::new(0),
            deposed: AtomicBool::new(false),
        };
        let named = shown.clone();
        let migrated = store
            .block(async move {
                let mut c = conn::connect(&config, true).await.map_err(|e| {
                    format!(
                        "cannot connect: {}; check that PostgreSQL runs there and the URL's user, password and database",
                        describe(&e)
                    )
                })?;
                migrate::migrate(c.client(), &named, apply)
                    .await
                    .map_err(|e| e.to_string())
            })
            .map_err(open_err)?;
        Ok((store, migrated))
    }

    /// Runs `fut` on the store's runtime and waits for it (from any thread, in a runtime or not).
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, String>> + Send + 'static,
    ) -> Result<T, String> {
        let rt = self.rt.as_ref().ok_or("the store is closed")?;
        // A plain channel, not the task's JoinHandle: polled from a thread of the caller's
        // runtime, a JoinHandle obeys that runtime's cooperative budget, and once it is spent
        // its wake-up is deferred to a scheduler this thread, blocked here, never returns to.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| "a store task ended without an answer".to_owned())?
    }

    fn op(&self, table: Table, op: Op) -> Result<Out> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Op {
                table: table.name(),
                reason: "the store is closed: the hub stopped".into(),
            });
        }
        let writes = !matches!(op, Op::Get(..) | Op::Scan(..) | Op::Last(..) | Op::Ping);
        // As the local store: once broken, no write goes in until the Hub healed the store and
        // reloaded its state from what is durable; reads go on.
        if writes {
            if let Some(reason) = self.broken() {
                return Err(StoreError::Op {
                    table: table.name(),
                    reason,
                });
            }
        }
        let pool = self.pool.clone();
        let out = self.block(async move {
            match tokio::time::timeout(conn::OP_TIMEOUT, pool.run(op)).await {
                Ok(Ok(out)) => Ok(Ok(out)),
                Ok(Err(e)) => Ok(Err(e)),
                Err(_) => Err(format!(
                    "the database did not answer within {} s",
                    conn::OP_TIMEOUT.as_secs()
                )),
            }
        });
        if writes {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        self.settle(table, out)
    }

    /// Runs a lease operation (never fenced, never refused as broken).
    fn lease_op(&self, op: lease::LeaseOp) -> Result<lease::LeaseOut, String> {
        let pool = self.pool.clone();
        let out = self.block(async move {
            match tokio::time::timeout(conn::OP_TIMEOUT, pool.run(Op::Lease(op))).await {
                Ok(Ok(out)) => Ok(out),
                Ok(Err(e)) => Err(describe(&e)),
                Err(_) => Err(format!(
                    "the database did not answer within {} s",
                    conn::OP_TIMEOUT.as_secs()
                )),
            }
        })?;
        match out {
            Out::Lease(out) => Ok(out),
            _ => Err("unexpected answer to a lease operation".into()),
        }
    }

    /// Takes the leader lease for `holder` (advertising `url`) when it expired or `holder`
    /// holds it; from then on every write is fenced by the new epoch. `None`: another Hub
    /// leads.
    pub fn take_lease(
        &self,
        holder: &str,
        url: &str,
        lease: std::time::Duration,
    ) -> Result<Option<u64>, String> {
        match self.lease_op(lease::LeaseOp::Take {
            holder: holder.into(),
            url: url.into(),
            ms: lease::ms(lease),
        })? {
            lease::LeaseOut::Epoch(Some(e)) => {
                let e = u64::try_from(e).unwrap_or(0);
                self.pool.fence.store(e, Ordering::SeqCst);
                Ok(Some(e))
            }
            _ => Ok(None),
        }
    }

    /// Extends the lease held at `epoch`; `false`: another Hub took it (this one is deposed,
    /// and its writes are refused from now on).
    pub fn renew_lease(
        &self,
        holder: &str,
        epoch: u64,
        lease: std::time::Duration,
    ) -> Result<bool, String> {
        match self.lease_op(lease::LeaseOp::Renew {
            holder: holder.into(),
            epoch: epoch as i64,
            ms: lease::ms(lease),
        })? {
            lease::LeaseOut::Epoch(Some(_)) => Ok(true),
            _ => {
                self.depose(None);
                Ok(false)
            }
        }
    }

    /// Gives the lease held at `epoch` up (this Hub stops): a follower takes it at once.
    pub fn release_lease(&self, holder: &str, epoch: u64) -> Result<bool, String> {
        match self.lease_op(lease::LeaseOp::Release {
            holder: holder.into(),
            epoch: epoch as i64,
        })? {
            lease::LeaseOut::Epoch(e) => Ok(e.is_some()),
            _ => Err("unexpected answer to releasing the lease".into()),
        }
    }

    /// The lease row.
    pub fn leader(&self) -> Result<lease::Leader, String> {
        match self.lease_op(lease::LeaseOp::Read)? {
            lease::LeaseOut::Row(r) => Ok(r),
            _ => Err("unexpected answer to reading the lease".into()),
        }
    }

    /// The epoch this Hub's writes are fenced by (0: none).
    pub fn fence(&self) -> u64 {
        self.pool.fence.load(Ordering::SeqCst)
    }

    /// Whether this Hub lost its lease to another (its writes are refused).
    pub fn deposed(&self) -> bool {
        self.deposed.load(Ordering::SeqCst)
    }

    /// The sealed identity the Hubs share, if one was stored.
    pub fn identity(&self) -> Result<Option<Vec<u8>>, String> {
        match self.lease_op(lease::LeaseOp::IdentityGet)? {
            lease::LeaseOut::Identity(v) => Ok(v),
            _ => Err("unexpected answer to reading the identity".into()),
        }
    }

    /// Stores `sealed` as the identity unless one is stored already.
    pub fn insert_identity(&self, sealed: Vec<u8>) -> Result<(), String> {
        self.lease_op(lease::LeaseOp::IdentityInsert(sealed))
            .map(drop)
    }

    /// Marks this Hub deposed: no write goes in any more, and healing does not undo it.
    fn depose(&self, epoch: Option<i64>) {
        if !self.deposed.swap(true, Ordering::SeqCst) {
            let mine = self.fence();
            let now = epoch
                .map(|e| format!(" (the lease is at epoch {e})"))
                .unwrap_or_default();
            tracing::error!("hub store: this Hub lost the leader lease of epoch {mine} to another Hub{now}; it writes nothing more");
        }
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
            "this Hub is no longer the leader (its epoch {} was taken over): it writes nothing more",
            self.fence()
        ));
    }

    /// Turns an outcome into the store's result, marking the store broken when the database
    /// could not be reached (and whole again when it could).
    fn settle(
        &self,
        table: Table,
        out: Result<Result<Out, tokio_postgres::Error>, String>,
    ) -> Result<Out> {
        let reason = match out {
            Ok(Ok(Out::Fenced(epoch))) => {
                self.depose(Some(epoch));
                return Err(StoreError::Op {
                    table: table.name(),
                    reason: self.broken().unwrap_or_default(),
                });
            }
            Ok(Ok(out)) => return Ok(out),
            // Refused by the database (a constraint, a permission): the database works.
            Ok(Err(e)) if e.code().is_some() => {
                return Err(StoreError::Op {
                    table: table.name(),
                    reason: describe(&e),
                })
            }
            Ok(Err(e)) => describe(&e),
            Err(reason) => reason,
        };
        let reason = format!("database {} unreachable: {reason}", self.shown);
        self.set_broken(Some(reason.clone()));
        Err(StoreError::Op {
            table: table.name(),
            reason,
        })
    }

    fn set_broken(&self, reason: Option<String>) {
        let mut b = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        if reason.is_some() && b.is_none() {
            tracing::warn!("hub store: {}", reason.as_deref().unwrap_or(""));
        }
        *b = reason;
    }

    fn unexpected(table: Table, what: &str) -> StoreError {
        StoreError::Op {
            table: table.name(),
            reason: format!("unexpected answer to {what}"),
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Never blocks: the store may be dropped inside another runtime.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Store for PgStore {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.op(table, Op::Get(table.name(), key.to_vec()))? {
            Out::Value(v) => Ok(v),
            _ => Err(Self::unexpected(table, "get")),
        }
    }

    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<()> {
        self.op(table, Op::Put(table.name(), key.to_vec(), value.to_vec()))
            .map(drop)
    }

    fn remove(&self, table: Table, key: &[u8]) -> Result<()> {
        self.op(table, Op::Remove(table.name(), key.to_vec()))
            .map(drop)
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match self.op(table, Op::Scan(table.name(), prefix.to_vec()))? {
            Out::Rows(rows) => Ok(rows),
            _ => Err(Self::unexpected(table, "scan")),
        }
    }

    fn insert_if_absent(&self, table: Table, key: &[u8], value: &[u8]) -> Result<bool> {
        match self.op(
            table,
            Op::InsertIfAbsent(table.name(), key.to_vec(), value.to_vec()),
        )? {
            Out::Wrote(w) => Ok(w),
            _ => Err(Self::unexpected(table, "insert")),
        }
    }

    fn insert_pairs_in_order(&self, table: Table, also: Table, rows: &[PairRow]) -> Result<()> {
        let rows = rows
            .iter()
            .map(|r| PairRow {
                key: r.key.clone(),
                value: r.value.clone(),
                before: r.before.clone(),
            })
            .collect();
        match self.op(table, Op::InsertPairs(table.name(), also.name(), rows))? {
            Out::Done => Ok(()),
            Out::Present => Err(StoreError::Op {
                table: table.name(),
                reason: "a row to append was stored meanwhile; nothing was written".into(),
            }),
            _ => Err(Self::unexpected(table, "an ordered insert")),
        }
    }

    fn last(&self, table: Table, prefix: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        match self.op(table, Op::Last(table.name(), prefix.to_vec()))? {
            Out::Rows(mut rows) => Ok(rows.pop()),
            _ => Err(Self::unexpected(table, "last")),
        }
    }

    fn increment(&self, counter: &str) -> Result<u64> {
        match self.op(Table::Counters, Op::Increment(counter.as_bytes().to_vec()))? {
            Out::Count(n) => Ok(n),
            _ => Err(Self::unexpected(Table::Counters, "increment")),
        }
    }

    fn flush(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            // Every write counted by now returned before this flush: its commit is in the WAL.
            let writes = self.writes.load(Ordering::SeqCst);
            if let Some(reason) = self.broken() {
                return Err(StoreError::Op {
                    table: "all",
                    reason,
                });
            }
            if writes == self.flushed_writes.load(Ordering::SeqCst) {
                return Ok(false);
            }
            let Some(rt) = self.rt.as_ref() else {
                return Err(StoreError::Op {
                    table: "all",
                    reason: "the store is closed".into(),
                });
            };
            let pool = self.pool.clone();
            let out = rt
                .spawn(async move {
                    tokio::time::timeout(conn::OP_TIMEOUT, pool.run_flush(Op::Flush))
                        .await
                        .map_err(|_| {
                            format!(
                                "the database did not confirm a commit within {} s",
                                conn::OP_TIMEOUT.as_secs()
                            )
                        })
                })
                .await
                .map_err(|e| format!("a store task failed: {e}"))
                .and_then(|r| r);
            self.settle(Table::Counters, out)?;
            self.flushed_writes.fetch_max(writes, Ordering::SeqCst);
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
        *self.broken.lock().unwrap_or_else(|p| p.into_inner()) =
            Some("the store is closed: the hub stopped".into());
        self.closed.store(true, Ordering::SeqCst);
    }

    fn compact(&self) -> Result<bool> {
        // PostgreSQL reclaims dead rows itself (autovacuum).
        Ok(false)
    }

    fn heal(&self) -> Result<bool> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Op {
                table: "all",
                reason: "the store is closed: the hub stopped".into(),
            });
        }
        if self.deposed() {
            return Err(StoreError::Op {
                table: "all",
                reason: self.broken().unwrap_or_default(),
            });
        }
        if self.broken().is_none() {
            return Ok(false);
        }
        let pool = self.pool.clone();
        let out = self.block(async move {
            match tokio::time::timeout(conn::OP_TIMEOUT, pool.run(Op::Ping)).await {
                Ok(r) => Ok(r),
                Err(_) => Err("the database did not answer".to_owned()),
            }
        });
        match out {
            Ok(Ok(_)) => {
                *self.broken.lock().unwrap_or_else(|p| p.into_inner()) = None;
                tracing::info!("hub store: database {} reachable again", self.shown);
                Ok(true)
            }
            Ok(Err(e)) => Err(StoreError::Op {
                table: "all",
                reason: format!(
                    "database {} still unreachable: {}",
                    self.shown,
                    describe(&e)
                ),
            }),
            Err(reason) => Err(StoreError::Op {
                table: "all",
                reason: format!("database {} still unreachable: {reason}", self.shown),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_bound_every_key_with_the_prefix() {
        assert_eq!(conn::prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(conn::prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(conn::prefix_end(b"\xff\xff"), None);
        assert_eq!(conn::prefix_end(b""), None);
    }

    #[test]
    fn shown_urls_keep_no_password() {
        let s = shown("postgres://agen:s3cret@db.example:5433/hub?sslmode=disable");
        assert_eq!(s, "postgres://agen@db.example:5433/hub");
        assert!(!s.contains("s3cret"));
    }
}
