//! The connections of the PostgreSQL store: a fixed set of (re)connecting clients, each with its
//! prepared statements, and the operations of [`super::PgStore`] as SQL.
//!
//! Invariants: a connection that failed (closed, timed out) is dropped and made anew on its next
//! use; writing connections run with `synchronous_commit = off` (a write is committed and visible
//! at once, made durable by the next flush), the flush connection with `on` (its commit waits
//! for the WAL up to it, and so for every earlier commit of every connection).
//!
//! Fencing (several Hubs, [`super::lease`]): once the pool has a fence epoch, every write runs
//! in a transaction that first takes the lease row `FOR SHARE` and checks that its epoch is
//! still the fence; a Hub that took the lease since (its `UPDATE` waits for those share locks)
//! makes every later write of the old epoch find no row and write nothing ([`Out::Fenced`]).
//! Each record keeps the epoch it was written under (`agen_records.epoch`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls, Statement};

/// How long one operation may take before its connection is dropped and it fails.
pub const OP_TIMEOUT: Duration = Duration::from_secs(10);

/// One client and the statements prepared on it.
pub struct Conn {
    client: Client,
    stmts: HashMap<&'static str, Statement>,
}

impl Conn {
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    async fn stmt(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).await?;
        self.stmts.insert(sql, s.clone());
        Ok(s)
    }
}

/// Opens one connection; its driver runs on the current runtime.
pub async fn connect(config: &Config, synchronous: bool) -> Result<Conn, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("hub store: a database connection ended: {e}");
        }
    });
    let mode = if synchronous { "on" } else { "off" };
    client
        .batch_execute(&format!("SET synchronous_commit = {mode}"))
        .await?;
    Ok(Conn {
        client,
        stmts: HashMap::new(),
    })
}

/// A slot holds a connection once one was made.
type Slot = Arc<tokio::sync::Mutex<Option<Conn>>>;

/// A fixed number of writing/reading connections, and one for flushes.
pub struct Pool {
    config: Config,
    slots: Vec<Slot>,
    next: AtomicUsize,
    flush: Slot,
    /// The leader epoch every write is conditional on (0: none, a Hub that takes no lease).
    pub fence: AtomicU64,
}

impl Pool {
    pub fn new(config: Config, size: usize) -> Pool {
        Pool {
            config,
            slots: (0..size.max(1)).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
            flush: Slot::default(),
            fence: AtomicU64::new(0),
        }
    }

    /// Runs `op` on a free connection (or the next one), connecting first when needed; drops
    /// the connection when the operation failed for anything but a refusal by the database.
    pub async fn run(&self, op: Op) -> Result<Out, tokio_postgres::Error> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = (0..n)
            .map(|i| &self.slots[(start + i) % n])
            .find_map(|s| s.clone().try_lock_owned().ok());
        let guard = match slot {
            Some(g) => g,
            None => self.slots[start % n].clone().lock_owned().await,
        };
        self.on(guard, false, op).await
    }

    /// Runs `op` on the flush connection.
    pub async fn run_flush(&self, op: Op) -> Result<Out, tokio_postgres::Error> {
        let guard = self.flush.clone().lock_owned().await;
        self.on(guard, true, op).await
    }

    async fn on(
        &self,
        mut guard: tokio::sync::OwnedMutexGuard<Option<Conn>>,
        synchronous: bool,
        op: Op,
    ) -> Result<Out, tokio_postgres::Error> {
        if guard.as_ref().is_some_and(|c| c.client.is_closed()) {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(connect(&self.config, synchronous).await?);
        }
        let conn = guard.as_mut().expect("connected just above");
        let fence = self.fence.load(Ordering::SeqCst);
        let out = if fence > 0 && op.writes() {
            fenced(conn, op, fence).await
        } else {
            exec(conn, op, fence, false).await
        };
        if let Err(e) = &out {
            if e.code().is_none() {
                *guard = None;
            }
        }
        out
    }
}

/// One store operation.
pub enum Op {
    Get(&'static str, Vec<u8>),
    Put(&'static str, Vec<u8>, Vec<u8>),
    Remove(&'static str, Vec<u8>),
    Scan(&'static str, Vec<u8>),
    Last(&'static str, Vec<u8>),
    InsertIfAbsent(&'static str, Vec<u8>, Vec<u8>),
    /// (table, also, rows as (key, value, before)).
    InsertPairs(&'static str, &'static str, Vec<super::super::PairRow>),
    Increment(Vec<u8>),
    Flush,
    Ping,
    /// A lease operation ([`super::lease`]): never fenced.
    Lease(super::lease::LeaseOp),
}

impl Op {
    /// Whether the operation changes records (and so is fenced).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Op::Put(..)
                | Op::Remove(..)
                | Op::InsertIfAbsent(..)
                | Op::InsertPairs(..)
                | Op::Increment(..)
        )
    }
}

/// What an operation returns.
pub enum Out {
    Done,
    Value(Option<Vec<u8>>),
    Rows(Vec<(Vec<u8>, Vec<u8>)>),
    Wrote(bool),
    Count(u64),
    /// [`Op::InsertPairs`] found a row's key stored already: nothing was written.
    Present,
    /// The lease row's epoch is no longer the fence: nothing was written (the epoch it has).
    Fenced(i64),
    /// What a lease operation answered.
    Lease(super::lease::LeaseOut),
}

const GET: &str = "SELECT value FROM agen_records WHERE tbl = $1 AND key = $2";
const PUT: &str = "INSERT INTO agen_records (tbl, key, value, epoch) VALUES ($1, $2, $3, $4) \
                   ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value, epoch = EXCLUDED.epoch";
const REMOVE: &str = "DELETE FROM agen_records WHERE tbl = $1 AND key = $2";
const SCAN_ALL: &str =
    "SELECT key, value FROM agen_records WHERE tbl = $1 AND key >= $2 ORDER BY key";
const SCAN: &str = "SELECT key, value FROM agen_records WHERE tbl = $1 AND key >= $2 AND key < $3 \
                    ORDER BY key";
const LAST_ALL: &str = "SELECT key, value FROM agen_records WHERE tbl = $1 AND key >= $2 \
                        ORDER BY key DESC LIMIT 1";
const LAST: &str = "SELECT key, value FROM agen_records WHERE tbl = $1 AND key >= $2 AND key < $3 \
                    ORDER BY key DESC LIMIT 1";
const INSERT: &str = "INSERT INTO agen_records (tbl, key, value, epoch) VALUES ($1, $2, $3, $4) \
                      ON CONFLICT (tbl, key) DO NOTHING";
const ANY_PRESENT: &str =
    "SELECT count(*) FROM agen_records WHERE tbl = $1 AND key = ANY($2::bytea[])";
/// A counter is 8 bytes, big-endian (as in the local store); anything else counts as 0.
const INCREMENT: &str = "INSERT INTO agen_records (tbl, key, value, epoch) VALUES ('counters', $1, int8send(1), $2) \
    ON CONFLICT (tbl, key) DO UPDATE SET value = int8send(CASE WHEN length(agen_records.value) = 8 \
    THEN ('x' || encode(agen_records.value, 'hex'))::bit(64)::bigint ELSE 0 END + 1), epoch = EXCLUDED.epoch \
    RETURNING value";
const FLUSH: &str = "UPDATE agen_flush SET flushes = flushes + 1 WHERE id = 1";
/// The lease row's epoch, held against a takeover until the transaction ends.
const FENCE: &str = "SELECT epoch FROM agen_leader WHERE id = 1 FOR SHARE";

/// The smallest key above every key that starts with `prefix` (`None`: no such bound).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Runs the write `op` in a transaction that holds the lease row at epoch `fence`, or writes
/// nothing ([`Out::Fenced`]) when the row has another epoch.
async fn fenced(conn: &mut Conn, op: Op, fence: u64) -> Result<Out, tokio_postgres::Error> {
    let check = conn.stmt(FENCE).await?;
    conn.client.batch_execute("BEGIN").await?;
    let out = async {
        let epoch: i64 = conn.client.query_one(&check, &[]).await?.get(0);
        if epoch != fence as i64 {
            return Ok(Out::Fenced(epoch));
        }
        exec(conn, op, fence, true).await
    }
    .await;
    match out {
        Ok(Out::Fenced(e)) => {
            conn.client.batch_execute("ROLLBACK").await?;
            Ok(Out::Fenced(e))
        }
        Ok(out) => {
            conn.client.batch_execute("COMMIT").await?;
            Ok(out)
        }
        Err(e) => {
            if !conn.client.is_closed() {
                let _ = conn.client.batch_execute("ROLLBACK").await;
            }
            Err(e)
        }
    }
}

/// Runs `op`; its writes carry `epoch`. `in_tx`: a transaction is open already (a fenced
/// write), so [`Op::InsertPairs`] opens none of its own.
async fn exec(
    conn: &mut Conn,
    op: Op,
    epoch: u64,
    in_tx: bool,
) -> Result<Out, tokio_postgres::Error> {
    let epoch = epoch as i64;
    match op {
        Op::Get(t, k) => {
            let s = conn.stmt(GET).await?;
            let row = conn.client.query_opt(&s, &[&t, &k]).await?;
            Ok(Out::Value(row.map(|r| r.get(0))))
        }
        Op::Put(t, k, v) => {
            let s = conn.stmt(PUT).await?;
            conn.client.execute(&s, &[&t, &k, &v, &epoch]).await?;
            Ok(Out::Done)
        }
        Op::Remove(t, k) => {
            let s = conn.stmt(REMOVE).await?;
            conn.client.execute(&s, &[&t, &k]).await?;
            Ok(Out::Done)
        }
        Op::Scan(t, prefix) => {
            let rows = match prefix_end(&prefix) {
                Some(end) => {
                    let s = conn.stmt(SCAN).await?;
                    conn.client.query(&s, &[&t, &prefix, &end]).await?
                }
                None => {
                    let s = conn.stmt(SCAN_ALL).await?;
                    conn.client.query(&s, &[&t, &prefix]).await?
                }
            };
            Ok(Out::Rows(
                rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
            ))
        }
        Op::Last(t, prefix) => {
            let row = match prefix_end(&prefix) {
                Some(end) => {
                    let s = conn.stmt(LAST).await?;
                    conn.client.query_opt(&s, &[&t, &prefix, &end]).await?
                }
                None => {
                    let s = conn.stmt(LAST_ALL).await?;
                    conn.client.query_opt(&s, &[&t, &prefix]).await?
                }
            };
            Ok(Out::Rows(
                row.iter().map(|r| (r.get(0), r.get(1))).collect(),
            ))
        }
        Op::InsertIfAbsent(t, k, v) => {
            let s = conn.stmt(INSERT).await?;
            Ok(Out::Wrote(
                conn.client.execute(&s, &[&t, &k, &v, &epoch]).await? == 1,
            ))
        }
        Op::InsertPairs(table, also, rows) => {
            let (any, insert, put) = (
                conn.stmt(ANY_PRESENT).await?,
                conn.stmt(INSERT).await?,
                conn.stmt(PUT).await?,
            );
            let keys: Vec<&[u8]> = rows.iter().map(|r| r.key.as_slice()).collect();
            if in_tx {
                return insert_pairs(
                    &conn.client,
                    (&any, &insert, &put),
                    (table, also),
                    &keys,
                    &rows,
                    epoch,
                )
                .await;
            }
            let tx = conn.client.transaction().await?;
            let out = insert_pairs(
                &tx,
                (&any, &insert, &put),
                (table, also),
                &keys,
                &rows,
                epoch,
            )
            .await?;
            if matches!(out, Out::Done) {
                tx.commit().await?;
            }
            Ok(out)
        }
        Op::Increment(k) => {
            let s = conn.stmt(INCREMENT).await?;
            let v: Vec<u8> = conn.client.query_one(&s, &[&k, &epoch]).await?.get(0);
            Ok(Out::Count(
                <[u8; 8]>::try_from(v.as_slice())
                    .map(u64::from_be_bytes)
                    .unwrap_or(1),
            ))
        }
        Op::Flush => {
            let s = conn.stmt(FLUSH).await?;
            conn.client.execute(&s, &[]).await?;
            Ok(Out::Done)
        }
        Op::Ping => {
            conn.client.simple_query("SELECT 1").await?;
            Ok(Out::Done)
        }
        Op::Lease(op) => super::lease::exec(conn.client(), op).await.map(Out::Lease),
    }
}

/// The statements of an ordered insert: (any present, insert, put).
type PairStmts<'a> = (&'a Statement, &'a Statement, &'a Statement);

/// [`Op::InsertPairs`] inside an open transaction of `c`.
async fn insert_pairs(
    c: &impl tokio_postgres::GenericClient,
    (any, insert, put): PairStmts<'_>,
    (table, also): (&'static str, &'static str),
    keys: &[&[u8]],
    rows: &[super::super::PairRow],
    epoch: i64,
) -> Result<Out, tokio_postgres::Error> {
    let present: i64 = c.query_one(any, &[&table, &keys]).await?.get(0);
    if present > 0 {
        return Ok(Out::Present);
    }
    for row in rows {
        if let Some((k, v)) = &row.before {
            c.execute(put, &[&also, k, v, &epoch]).await?;
        }
        c.execute(insert, &[&table, &row.key, &row.value, &epoch])
            .await?;
    }
    Ok(Out::Done)
}
