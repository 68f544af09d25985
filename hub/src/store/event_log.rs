//! The event log: the tables written on every step of every run (run events and task events)
//! kept in an append-only file of their own, `events.log` beside sled's files, instead of in
//! sled's trees. Appending a batch of them is one `pwrite` of records to the file's end, and
//! making them durable is one `fdatasync` of that file; sled's tree inserts, node splits and
//! page rewrites (most of the Hub's CPU per run event) are off the hot path.
//!
//! Format: the line [`MAGIC`], the header (`synced(u64 le) sled_flushes(u64 le) crc32(u32 le)
//! 0(u32)`, see [`Header`]), then records `len(u32 le) crc32(u32 le) payload`, the payload
//! being `op(u8: 1 put, 2 remove) table(u8) key_len(u32 le) key value`. A put of a key present
//! replaces its value; a remove drops it. In memory the log keeps, per table, an ordered index
//! of key → where its value is in the file; values are read back with `pread`.
//!
//! Invariants:
//! - Records are written in the order of the calls that write them, each call's records with
//!   one write at the file's end, and the index changes only after the write succeeded. A
//!   write that fails is cut off the file again (`set_len`), so the file never holds a record
//!   the index does not know.
//! - A process killed at any point leaves a prefix of the records in the page cache (a write
//!   is in it when the call returns); a machine that loses power keeps every record written
//!   before the last [`EventLog::sync`] returned, and maybe more.
//! - The header says how long the file was at the last sync that returned (`synced`: nothing
//!   the Hub acknowledged lies past it) and how many flushes sled had made durable by then
//!   (`sled_flushes`, which sled keeps too: a sled that knows fewer lost writes). After each
//!   sync returns, the new values go into a small file beside the log, [`MARK_FILE_NAME`]
//!   (a `pwrite`, never synced on the hot path: a killed process leaves it in the page cache,
//!   and the log's own sync writes no page but its tail); the log's header gets them when it
//!   is closed or rewritten (synced then). Opening takes the greater of the two; after a power
//!   cut the mark may say less than was synced, never more.
//! - Opening checks every record (`log_scan`): only a torn tail past `synced` with no whole
//!   record after it (what a crash leaves) is cut. A bad record before it, or followed by
//!   whole ones, a file shorter than `synced` or a damaged header is damage: the log is left
//!   as it is and [`OpenError::Damaged`] says where (the store refuses to serve it).
//! - Records a put replaced or a remove dropped are dead; [`EventLog::compact`] rewrites the
//!   file without them (a new file, synced, renamed over the old one) once they outweigh the
//!   live ones: at open, and after the retention sweep removed tasks. Writes and reads go on
//!   while the live records are copied; only the records written meanwhile are copied under
//!   the lock, then the new file takes the old one's place. A crash at any point leaves either
//!   the old file whole or the new one whole (the rename is the switch).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::ops::Bound;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::Table;

/// The file's name in the store's folder.
pub const FILE_NAME: &str = "events.log";
/// Beside it, the header's values as of the last sync (see the module doc).
pub const MARK_FILE_NAME: &str = "events.log.synced";
/// Dead bytes below which opening never rewrites the file.
const COMPACT_FLOOR: u64 = 8 << 20;
/// The bytes a rewrite gathers before it writes them out.
const COMPACT_CHUNK: usize = 1 << 20;

#[cfg(test)]
pub use super::log_scan::MAGIC_V1;
pub(super) use super::log_scan::{table_of, HEADER, MAX_RECORD, OP_PUT, OP_REMOVE};
pub use super::log_scan::{Findings, Header, MAGIC};
use super::log_scan::{FIRST_RECORD, HEAD_LEN};

/// Why [`EventLog::open`] did not open the log.
#[cfg(test)]
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The log lost records that were acknowledged (see [`Findings`]); it was left untouched.
    #[error("{}: {}", .0.path.display(), .0.summary())]
    Damaged(Box<Findings>),
}

/// Where a value is in the file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    offset: u64,
    len: u32,
    /// The whole record's size (what it leaves dead when replaced or removed).
    record: u32,
}

pub(super) type Index = BTreeMap<Vec<u8>, Loc>;

/// One write of a batch: a put, or a remove.
pub enum Op<'a> {
    Put(Table, &'a [u8], &'a [u8]),
    Remove(Table, &'a [u8]),
}

pub(super) struct Inner {
    /// `None` once closed.
    pub(super) file: Option<Arc<File>>,
    /// The end of the last record written.
    pub(super) end: u64,
    pub(super) run_events: Index,
    pub(super) task_events: Index,
    /// Bytes of records replaced or removed since the file was written last.
    pub(super) dead: u64,
    /// Write calls done (a sync that finds none newer than its last has nothing to do).
    pub(super) writes: u64,
    /// What the log knows of its progress ([`Header`]): in the mark file after each sync,
    /// in the log's own header when it is rewritten or closed.
    pub(super) header: Header,
    /// `events.log.synced` ([`MARK_FILE_NAME`]); `None` when the log is only read.
    pub(super) mark: Option<Arc<File>>,
}

impl Inner {
    pub(super) fn empty() -> Inner {
        Inner {
            file: None,
            end: 0,
            run_events: Index::new(),
            task_events: Index::new(),
            dead: 0,
            writes: 0,
            header: Header::default(),
            mark: None,
        }
    }

    /// Writes the header's values into the mark file (not synced).
    fn write_mark(&self) -> std::io::Result<()> {
        match &self.mark {
            Some(mark) => mark.write_all_at(&self.header.encode(), 0),
            None => Ok(()),
        }
    }

    fn index(&self, table: Table) -> &Index {
        match table {
            Table::RunEvents => &self.run_events,
            _ => &self.task_events,
        }
    }

    fn index_mut(&mut self, table: Table) -> &mut Index {
        match table {
            Table::RunEvents => &mut self.run_events,
            _ => &mut self.task_events,
        }
    }

    fn file(&self) -> std::io::Result<Arc<File>> {
        self.file
            .clone()
            .ok_or_else(|| std::io::Error::other("the event log is closed: the hub stopped"))
    }

    fn read(&self, loc: Loc) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; loc.len as usize];
        self.file()?.read_exact_at(&mut buf, loc.offset)?;
        Ok(buf)
    }

    /// Applies one record already in the file (its value at `value_at`) to the index.
    pub(super) fn apply(
        &mut self,
        op: u8,
        table: Table,
        key: &[u8],
        value_at: u64,
        len: u32,
        record: u32,
    ) {
        let old = match op {
            OP_PUT => self.index_mut(table).insert(
                key.to_vec(),
                Loc {
                    offset: value_at,
                    len,
                    record,
                },
            ),
            _ => {
                self.dead += u64::from(record);
                self.index_mut(table).remove(key)
            }
        };
        if let Some(old) = old {
            self.dead += u64::from(old.record);
        }
    }
}

/// How [`EventLog::open_unchecked`] opens the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Read and write; made when absent.
    Create,
    /// Read and write; it must be there.
    Write,
    /// Read only (a check that changes nothing).
    Read,
}

/// The append-only file of run and task events (see the module doc).
pub struct EventLog {
    path: PathBuf,
    inner: Mutex<Inner>,
    /// One rewrite at a time ([`EventLog::compact`]).
    compacting: Mutex<()>,
}

fn table_id(table: Table) -> u8 {
    match table {
        Table::RunEvents => 1,
        _ => 2,
    }
}

/// Appends one record to `buf`; returns where its value starts within it, its length and the
/// record's size.
fn encode(buf: &mut Vec<u8>, op: u8, table: Table, key: &[u8], value: &[u8]) -> (usize, u32, u32) {
    let payload_len = 1 + 1 + 4 + key.len() + value.len();
    let start = buf.len();
    buf.extend_from_slice(&(payload_len as u32).to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.push(op);
    buf.push(table_id(table));
    buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
    buf.extend_from_slice(key);
    let value_at = buf.len();
    buf.extend_from_slice(value);
    let crc = crc32fast::hash(&buf[start + HEADER..]);
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    (value_at, value.len() as u32, (HEADER + payload_len) as u32)
}

/// Whether the event log keeps `table` (the rest live in sled).
pub fn holds(table: Table) -> bool {
    matches!(table, Table::RunEvents | Table::TaskEvents)
}

fn too_large(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{what} is larger than the event log's {MAX_RECORD}-byte record limit"),
    )
}

/// The smallest key above every key that starts with `prefix` (`None`: no such key).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn range<'a>(
    index: &'a Index,
    prefix: &[u8],
) -> impl DoubleEndedIterator<Item = (&'a Vec<u8>, &'a Loc)> {
    let upper = match prefix_end(prefix) {
        Some(end) => Bound::Excluded(end),
        None => Bound::Unbounded,
    };
    index.range::<Vec<u8>, _>((Bound::Included(prefix.to_vec()), upper))
}

fn open_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

impl EventLog {
    /// Opens (or creates) `events.log` in `dir`: checks every record, cuts a torn tail off
    /// (see the module doc), brings a log without a header to this format, and rewrites it
    /// without its dead records when they outweigh the live ones. Damage is refused
    /// ([`OpenError::Damaged`]) and the file left as it is. (The store opens it in two steps,
    /// [`EventLog::open_unchecked`] then [`EventLog::finish_open`], judging in between.)
    #[cfg(test)]
    pub fn open(dir: &Path) -> Result<EventLog, OpenError> {
        let (log, findings) = Self::open_unchecked(dir, Access::Create)?;
        if !findings.intact() {
            return Err(OpenError::Damaged(Box::new(findings)));
        }
        Ok(log.finish_open(&findings)?)
    }

    /// What [`EventLog::open`] does once `findings` (of this log, intact) are judged: the
    /// torn tail cut, an old format or dead weight rewritten.
    pub(super) fn finish_open(self, findings: &Findings) -> std::io::Result<EventLog> {
        let log = self;
        if let Some(tail) = &findings.torn_tail {
            tracing::warn!(
                file = %log.path.display(),
                kept = tail.offset,
                dropped = tail.len,
                "the event log ends in a record cut short past its last sync (a crash while it was written): the torn tail is dropped"
            );
            let file = log.lock().file()?;
            file.set_len(tail.offset)?;
            file.sync_all()?;
        }
        // A rewrite a crash interrupted left its unfinished copy behind; the log is whole.
        let _ = std::fs::remove_file(log.fresh_path());
        if findings.version == 1 {
            log.rewrite_now()?;
        } else if let Err(e) = log.compact() {
            // A rewrite that fails (a full disk) leaves the old file in use, untouched.
            tracing::warn!(file = %log.path.display(), error = %e, "the event log was not rewritten without its dead records; it stays as it is");
        }
        Ok(log)
    }

    /// Reads `events.log` in `dir` back without judging or changing it; returns the log of
    /// its whole records and what the reading found. `Access::Create` makes an absent one
    /// (empty), `Access::Read` opens it for reading only.
    pub(super) fn open_unchecked(
        dir: &Path,
        access: Access,
    ) -> std::io::Result<(EventLog, Findings)> {
        let path = dir.join(FILE_NAME);
        let create = access == Access::Create;
        let file = match access {
            Access::Create => open_file(&path)?,
            Access::Write => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)?,
            Access::Read => File::open(&path)?,
        };
        let mut inner = Inner::empty();
        let mark_path = dir.join(MARK_FILE_NAME);
        let (mark, marked) = match access {
            Access::Read => (None, read_mark(&mark_path)),
            Access::Create | Access::Write => {
                let f = open_file(&mark_path)?;
                let marked = read_mark(&mark_path);
                (Some(Arc::new(f)), marked)
            }
        };
        inner.mark = mark;
        let len = file.metadata()?.len();
        let findings = if len == 0 && create {
            inner.header = Header {
                synced: FIRST_RECORD,
                sled_flushes: 0,
            };
            let mut head = MAGIC.to_vec();
            head.extend_from_slice(&inner.header.encode());
            file.write_all_at(&head, 0)?;
            file.sync_all()?;
            super::disk_sync::sync_folder(dir)?;
            inner.write_mark()?;
            inner.end = FIRST_RECORD;
            Findings {
                path: path.clone(),
                len: FIRST_RECORD,
                version: 2,
                header: Some(inner.header),
                header_damaged: false,
                damaged: Vec::new(),
                short_of: None,
                torn_tail: None,
                records: 0,
                end: FIRST_RECORD,
            }
        } else {
            let found = super::log_scan::scan(
                &file,
                &path,
                &mut |op, table, key, at, len, record| inner.apply(op, table, key, at, len, record),
                marked,
            )?;
            inner.end = found.end;
            inner.header = found.header.unwrap_or_default();
            found
        };
        inner.file = Some(Arc::new(file));
        let log = EventLog {
            path,
            inner: Mutex::new(inner),
            compacting: Mutex::new(()),
        };
        Ok((log, findings))
    }

    /// Every task id with task events, and how many it has, with their greatest seq (keys
    /// `task \0 seq(be)`; other keys are skipped).
    pub fn task_event_counts(&self) -> BTreeMap<String, (u64, u64)> {
        let inner = self.lock();
        let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for key in inner.task_events.keys() {
            let Some(split) = key.len().checked_sub(9) else {
                continue;
            };
            if key[split] != 0 || split == 0 {
                continue;
            }
            let seq = u64::from_be_bytes(key[split + 1..].try_into().expect("8 bytes"));
            let id = String::from_utf8_lossy(&key[..split]).into_owned();
            let e = out.entry(id).or_default();
            e.0 += 1;
            e.1 = e.1.max(seq);
        }
        out
    }

    /// Records `header` in the mark file (the page cache; see the module doc).
    fn note(inner: &mut Inner, header: Header) -> std::io::Result<()> {
        if header != inner.header {
            inner.header = header;
            inner.write_mark()?;
        }
        Ok(())
    }

    /// Sets what the header will say of sled's flushes at the next rewrite, even fewer than
    /// it says now (a repair makes the log agree with sled).
    pub(super) fn set_sled_flushes(&self, flushes: u64) {
        self.lock().header.sled_flushes = flushes;
    }

    /// Records in the header that sled has made `flushes` flushes durable.
    pub fn note_sled_flushes(&self, flushes: u64) -> std::io::Result<()> {
        let mut inner = self.lock();
        inner.file()?;
        let header = Header {
            sled_flushes: inner.header.sled_flushes.max(flushes),
            ..inner.header
        };
        Self::note(&mut inner, header)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, table: Table, key: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        let inner = self.lock();
        match inner.index(table).get(key) {
            Some(loc) => inner.read(*loc).map(Some),
            None => Ok(None),
        }
    }

    /// Every entry whose key starts with `prefix`, in key order.
    pub fn scan(&self, table: Table, prefix: &[u8]) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let inner = self.lock();
        range(inner.index(table), prefix)
            .map(|(k, loc)| Ok((k.clone(), inner.read(*loc)?)))
            .collect()
    }

    /// The entry with the greatest key that starts with `prefix`.
    pub fn last(&self, table: Table, prefix: &[u8]) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let inner = self.lock();
        let found = range(inner.index(table), prefix)
            .next_back()
            .map(|(k, loc)| (k.clone(), *loc));
        match found {
            Some((k, loc)) => Ok(Some((k, inner.read(loc)?))),
            None => Ok(None),
        }
    }

    /// Writes `ops` in order with one write at the file's end, if `check` (called under the
    /// log's lock with a view of what is stored) allows it; returns what `check` said.
    pub fn write_if(
        &self,
        ops: &[Op<'_>],
        check: impl FnOnce(&dyn Fn(Table, &[u8]) -> bool) -> bool,
    ) -> std::io::Result<bool> {
        let mut inner = self.lock();
        let file = inner.file()?;
        let allowed = {
            let view = |table: Table, key: &[u8]| inner.index(table).contains_key(key);
            check(&view)
        };
        if !allowed {
            return Ok(false);
        }
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(ops.len());
        for op in ops {
            let (code, table, key, value) = match *op {
                Op::Put(table, key, value) => (OP_PUT, table, key, value),
                Op::Remove(table, key) => (OP_REMOVE, table, key, &[][..]),
            };
            if HEADER + 6 + key.len() + value.len() > MAX_RECORD {
                return Err(too_large(&format!("a record of {}", table.name())));
            }
            let (value_at, len, record) = encode(&mut buf, code, table, key, value);
            placed.push((code, table, key, value_at, len, record));
        }
        let at = inner.end;
        inner.writes += 1;
        if let Err(e) = file.write_all_at(&buf, at) {
            // Nothing of a failed write may stay in the file: the index never knew it.
            let _ = file.set_len(at);
            return Err(e);
        }
        inner.end = at + buf.len() as u64;
        for (code, table, key, value_at, len, record) in placed {
            inner.apply(code, table, key, at + value_at as u64, len, record);
        }
        Ok(true)
    }

    /// Writes every op in order (see [`EventLog::write_if`]).
    pub fn write(&self, ops: &[Op<'_>]) -> std::io::Result<()> {
        self.write_if(ops, |_| true).map(drop)
    }

    /// Write calls done so far.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// Makes every record written before the call durable on the disk (`fdatasync`; the log's
    /// lock is not held meanwhile, so writes go on), then records in the header that the file
    /// is durable that far.
    pub fn sync(&self) -> std::io::Result<()> {
        let (file, end) = {
            let inner = self.lock();
            (inner.file()?, inner.end)
        };
        file.sync_data().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("fdatasync of {}: {e}", self.path.display()),
            )
        })?;
        let mut inner = self.lock();
        // A rewrite swapped the file meanwhile: the new one's header says it all already.
        if !inner.file.as_ref().is_some_and(|f| Arc::ptr_eq(f, &file)) {
            return Ok(());
        }
        let header = Header {
            synced: inner.header.synced.max(end),
            ..inner.header
        };
        Self::note(&mut inner, header)
    }

    /// Closes the file for good (later calls fail), after a last sync, so that its header says
    /// it is whole.
    pub fn close(&self) {
        if self.lock().file.is_some() {
            if let Err(e) = self.sync().and_then(|()| {
                let inner = self.lock();
                let file = inner.file()?;
                file.write_all_at(&inner.header.encode(), MAGIC.len() as u64)?;
                file.sync_data()
            }) {
                tracing::warn!(file = %self.path.display(), error = %e, "cannot sync the event log as the hub stops");
            }
        }
        self.lock().file = None;
    }

    fn fresh_path(&self) -> PathBuf {
        self.path.with_file_name(format!("{FILE_NAME}.compacting"))
    }

    /// Rewrites the file with its live records only, when the dead ones weigh more (and at
    /// least [`COMPACT_FLOOR`]); returns whether it did. The live records as they are now are
    /// copied without the log's lock (writes and reads go on); then, under the lock, the
    /// records written meanwhile are copied as they are and read into the new index, and the
    /// new file is renamed over the old one. A failure leaves the old file in use, untouched.
    pub fn compact(&self) -> std::io::Result<bool> {
        self.compact_if(false)
    }

    /// Rewrites the file now, whatever its dead weight (see [`EventLog::compact`]): a log of
    /// an older format, or one repaired (only its whole records are copied).
    pub(super) fn rewrite_now(&self) -> std::io::Result<bool> {
        self.compact_if(true)
    }

    fn compact_if(&self, force: bool) -> std::io::Result<bool> {
        let _one = self.compacting.lock().unwrap_or_else(|p| p.into_inner());
        let (old, tables, copied_upto) = {
            let inner = self.lock();
            let live = inner.end.saturating_sub(inner.dead);
            if !force && (inner.dead < COMPACT_FLOOR || inner.dead < live) {
                return Ok(false);
            }
            (
                inner.file()?,
                [
                    (Table::RunEvents, inner.run_events.clone()),
                    (Table::TaskEvents, inner.task_events.clone()),
                ],
                inner.end,
            )
        };
        let fresh_path = self.fresh_path();
        let swapped = self.rewrite(&old, tables, copied_upto, &fresh_path);
        match swapped {
            Ok(after) => {
                tracing::info!(
                    file = %self.path.display(),
                    before = copied_upto,
                    after,
                    "the event log was rewritten without its dead records"
                );
                Ok(true)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&fresh_path);
                Err(e)
            }
        }
    }

    /// [`EventLog::compact`]'s work: `tables` (the index when the file ended at
    /// `copied_upto`) copied from `old` into a new file, the rest under the lock; returns the
    /// new file's size.
    fn rewrite(
        &self,
        old: &File,
        tables: [(Table, Index); 2],
        copied_upto: u64,
        fresh_path: &Path,
    ) -> std::io::Result<u64> {
        let fresh = open_file(fresh_path)?;
        fresh.set_len(0)?;
        let mut next = Inner::empty();
        // Written in chunks, so that the live records never need to fit in memory at once.
        // The header is written last, once the file's length is known.
        let mut buf = MAGIC.to_vec();
        buf.extend_from_slice(&[0u8; HEAD_LEN]);
        let mut written = 0u64;
        for (table, index) in tables {
            for (key, loc) in index {
                let mut value = vec![0u8; loc.len as usize];
                old.read_exact_at(&mut value, loc.offset)?;
                let (value_at, len, record) = encode(&mut buf, OP_PUT, table, &key, &value);
                next.index_mut(table).insert(
                    key,
                    Loc {
                        offset: written + value_at as u64,
                        len,
                        record,
                    },
                );
                if buf.len() >= COMPACT_CHUNK {
                    fresh.write_all_at(&buf, written)?;
                    written += buf.len() as u64;
                    buf.clear();
                }
            }
        }
        fresh.write_all_at(&buf, written)?;
        written += buf.len() as u64;
        // The bulk reaches the disk before the lock is taken.
        fresh.sync_data()?;

        let mut inner = self.lock();
        let current = inner.file()?;
        // Whatever was written since the copy began, as it is, read into the new index.
        let mut tail = vec![0u8; (inner.end - copied_upto) as usize];
        current.read_exact_at(&mut tail, copied_upto)?;
        fresh.write_all_at(&tail, written)?;
        let end = read_records(&mut &tail[..], written, &mut next, &self.path)?;
        if end != written + tail.len() as u64 {
            return Err(std::io::Error::other(format!(
                "{}: the records written during the rewrite did not read back whole",
                self.path.display()
            )));
        }
        let header = Header {
            synced: end,
            sled_flushes: inner.header.sled_flushes,
        };
        fresh.write_all_at(&header.encode(), MAGIC.len() as u64)?;
        fresh.sync_data()?;
        // The mark says the new file's length before that file takes the old one's place: a
        // kill -9 between the two leaves a mark that claims no more than either file holds (the
        // copy is never longer than the file it was copied from), never the old file's length
        // over the shorter new one.
        if let Some(mark) = &inner.mark {
            mark.write_all_at(&header.encode(), 0)?;
        }
        std::fs::rename(fresh_path, &self.path)?;
        if let Some(dir) = self.path.parent() {
            super::disk_sync::sync_folder(dir)?;
        }
        inner.file = Some(Arc::new(fresh));
        inner.end = end;
        inner.run_events = next.run_events;
        inner.task_events = next.task_events;
        inner.dead = next.dead;
        inner.header = header;
        // The mark may say more of the old file (a repair lowers sled's count): it follows.
        inner.write_mark()?;
        Ok(end)
    }
}

/// What the mark file says (`None`: absent, short or failing its checksum: no claim).
fn read_mark(path: &Path) -> Option<Header> {
    let bytes = std::fs::read(path).ok()?;
    let head: [u8; HEAD_LEN] = bytes.get(..HEAD_LEN)?.try_into().ok()?;
    Header::decode(&head)
}

/// Reads whole records from `r` (the first at file offset `at`) into `inner`'s index; returns
/// the end of the last whole one.
fn read_records(
    r: &mut impl Read,
    mut at: u64,
    inner: &mut Inner,
    path: &Path,
) -> std::io::Result<u64> {
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; HEADER];
        if r.read_exact(&mut header).is_err() {
            return Ok(at);
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if !(6..=MAX_RECORD).contains(&len) {
            return Ok(at);
        }
        payload.resize(len, 0);
        if r.read_exact(&mut payload).is_err() || crc32fast::hash(&payload) != crc {
            return Ok(at);
        }
        let (op, table) = (payload[0], table_of(payload[1]));
        let key_len = u32::from_le_bytes([payload[2], payload[3], payload[4], payload[5]]) as usize;
        let (Some(table), true, true) =
            (table, matches!(op, OP_PUT | OP_REMOVE), 6 + key_len <= len)
        else {
            // A whole record with a sound checksum that says nothing we know: written by
            // something else, never by a crash. Stop rather than guess.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: the record at byte {at} has op {op} and table {} (expected op 1 or 2, table 1 or 2)",
                    path.display(),
                    payload[1]
                ),
            ));
        };
        let key = &payload[6..6 + key_len];
        let record = (HEADER + len) as u32;
        let value_at = at + (HEADER + 6 + key_len) as u64;
        inner.apply(op, table, key, value_at, (len - 6 - key_len) as u32, record);
        at += u64::from(record);
    }
}

#[cfg(test)]
#[path = "event_log_tests.rs"]
mod tests;
