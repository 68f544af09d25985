//! Hub snapshots: one file holding every record of every table of the store plus the data
//! dir's key files (CA, admin and join tokens, the secret key), written by a running Hub
//! (`SnapshotStore`, `agen hub snapshot FILE`, and every `--snapshot-every`) and brought back
//! into a stopped Hub's data dir (`agen hub --data-dir D restore FILE`). On disk a snapshot is
//! sealed with the operator's snapshot key (`sealed`: the format below, encrypted and
//! authenticated); a plain one (written before snapshots were sealed) is read only when the
//! caller allows it. A restored store starts a new store epoch (`Db::store_epoch`) and is
//! marked restored, so that the Hub that opens it issues every attempt above any the old
//! one could have issued and re-queues every run in flight at the snapshot.
//!
//! Format: the line `agen-hub-snapshot 1\n`, then entries `kind(u8) section(u32 len + bytes)
//! key(u32 len + bytes) value(u64 len + bytes)` (kind 1 a data-dir file, section its relative
//! path; kind 2 a store record, section its table), then kind 0 and the sha256 of every byte
//! before it. A restore checks the digest before the restored store replaces anything.
//!
//! Invariants: the file holds the secret key and the admin token, so it is written 0600 and is
//! as secret as the data dir; a restore never writes into a store a Hub has open (sled's lock
//! refuses it) and keeps the store it replaces beside it (`db.replaced-<unix time>`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::sealed::{self, OpenReader, SealWriter, SnapshotKey};
use super::{Result, SledStore, Store, StoreError, Table};

const MAGIC: &[u8] = b"agen-hub-snapshot 1\n";
const KIND_END: u8 = 0;
const KIND_FILE: u8 = 1;
const KIND_RECORD: u8 = 2;

/// The data-dir files a snapshot carries (relative paths); those missing are skipped.
pub const FILES: &[&str] = &[
    "admin-token",
    "join-token",
    "secret.key",
    "tls/ca.pem",
    "tls/ca.key",
];

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub files: usize,
    pub records: usize,
}

fn bad(reason: impl Into<String>) -> StoreError {
    StoreError::Snapshot(reason.into())
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.hash.update(bytes);
        self.inner
            .write_all(bytes)
            .map_err(|e| bad(format!("cannot write the snapshot: {e}")))
    }

    fn entry(&mut self, kind: u8, section: &[u8], key: &[u8], value: &[u8]) -> Result<()> {
        self.put(&[kind])?;
        self.put(&(section.len() as u32).to_be_bytes())?;
        self.put(section)?;
        self.put(&(key.len() as u32).to_be_bytes())?;
        self.put(key)?;
        self.put(&(value.len() as u64).to_be_bytes())?;
        self.put(value)
    }
}

/// Writes a snapshot of `store` and of `data_dir`'s key files to `out`. The caller holds
/// whatever lock keeps the records still (the Hub: its state lock).
pub fn write(store: &dyn Store, data_dir: &Path, out: impl Write) -> Result<Counts> {
    let mut w = Hashing {
        inner: out,
        hash: Sha256::new(),
    };
    let mut counts = Counts::default();
    w.put(MAGIC)?;
    for name in FILES {
        let path = data_dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => {
                w.entry(KIND_FILE, name.as_bytes(), b"", &bytes)?;
                counts.files += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(format!("cannot read {}: {e}", path.display()))),
        }
    }
    for table in Table::ALL {
        for (k, v) in store.scan(table, b"")? {
            w.entry(KIND_RECORD, table.name().as_bytes(), &k, &v)?;
            counts.records += 1;
        }
    }
    w.put(&[KIND_END])?;
    let digest = w.hash.clone().finalize();
    w.inner
        .write_all(&digest)
        .and_then(|_| w.inner.flush())
        .map_err(|e| bad(format!("cannot write the snapshot: {e}")))?;
    Ok(counts)
}

/// A reader that hashes what it reads.
struct Reading<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Reading<R> {
    fn exact(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        (&mut self.inner)
            .take(n as u64)
            .read_to_end(&mut buf)
            .map_err(|e| bad(format!("cannot read the snapshot: {e}")))?;
        if buf.len() != n {
            return Err(bad("the snapshot is cut short (an incomplete copy?)"));
        }
        self.hash.update(&buf);
        Ok(buf)
    }

    fn len32(&mut self) -> Result<usize> {
        let b = self.exact(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn len64(&mut self) -> Result<usize> {
        let b = self.exact(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        usize::try_from(u64::from_be_bytes(a)).map_err(|_| bad("an entry is too large"))
    }
}

/// How the snapshot being read is protected: sealed with `key` (`None`: no key was given),
/// and whether a plain one (written before snapshots were sealed) may be read.
#[derive(Clone, Copy, Default)]
pub struct Opening<'k> {
    pub key: Option<&'k SnapshotKey>,
    pub allow_unencrypted: bool,
}

/// Writes a sealed snapshot of `store` and `data_dir`'s key files to `out` (see [`write`]).
pub fn write_sealed(
    store: &dyn Store,
    data_dir: &Path,
    out: impl Write,
    key: &SnapshotKey,
) -> Result<Counts> {
    let mut w = SealWriter::new(out, key).map_err(|e| bad(e.to_string()))?;
    let counts = write(store, data_dir, &mut w)?;
    w.finish()
        .map_err(|e| bad(format!("cannot write the snapshot: {e}")))?;
    Ok(counts)
}

/// The plain snapshot stream of `input`: opened with the key when sealed; a plain file only
/// when allowed (with a warning).
fn open_input<'a>(mut input: impl Read + 'a, how: Opening<'a>) -> Result<Box<dyn Read + 'a>> {
    let mut magic = vec![0u8; MAGIC.len()];
    input
        .read_exact(&mut magic)
        .map_err(|_| bad("the snapshot is cut short (not even its first line is there)"))?;
    if magic == sealed::MAGIC {
        let key = how.key.ok_or_else(|| {
            bad("the snapshot is sealed: give its snapshot key with --snapshot-key-file PATH or AGEN_SNAPSHOT_KEY_FILE")
        })?;
        let reader = OpenReader::new(input, key).map_err(|e| bad(e.to_string()))?;
        return Ok(Box::new(reader));
    }
    if magic != MAGIC {
        return Err(bad(
            "not an agen hub snapshot (write one with agen hub snapshot FILE)",
        ));
    }
    if !how.allow_unencrypted {
        return Err(bad(
            "the snapshot is not encrypted (written by an older agen): nobody can tell whether it was changed; restore it only if you trust the file, with --allow-unencrypted",
        ));
    }
    tracing::warn!("reading an unencrypted snapshot: it is not authenticated, so a change to it cannot be detected beyond its digest");
    Ok(Box::new(std::io::Cursor::new(magic).chain(input)))
}

/// Reads the plain snapshot stream `input` to its end, handing each data-dir file and each
/// record on; fails unless the whole file is there and its digest matches.
fn parse(
    input: impl Read,
    mut on_file: impl FnMut(&str, Vec<u8>) -> Result<()>,
    mut on_record: impl FnMut(Table, &[u8], &[u8]) -> Result<()>,
) -> Result<Counts> {
    let mut r = Reading {
        inner: input,
        hash: Sha256::new(),
    };
    if r.exact(MAGIC.len())? != MAGIC {
        return Err(bad(
            "not an agen hub snapshot (write one with agen hub snapshot FILE)",
        ));
    }
    let mut counts = Counts::default();
    loop {
        let kind = r.exact(1)?[0];
        if kind == KIND_END {
            break;
        }
        let section = r.len32().and_then(|n| r.exact(n))?;
        let key = r.len32().and_then(|n| r.exact(n))?;
        let value = r.len64().and_then(|n| r.exact(n))?;
        let section = String::from_utf8(section).map_err(|_| bad("a section is not UTF-8"))?;
        match kind {
            KIND_FILE => {
                if !FILES.contains(&section.as_str()) {
                    return Err(bad(format!("unexpected file {section:?} in the snapshot")));
                }
                on_file(&section, value)?;
                counts.files += 1;
            }
            KIND_RECORD => {
                let table = Table::ALL
                    .into_iter()
                    .find(|t| t.name() == section)
                    .ok_or_else(|| bad(format!("unknown table {section:?} in the snapshot")))?;
                on_record(table, &key, &value)?;
                counts.records += 1;
            }
            other => return Err(bad(format!("unknown entry kind {other} in the snapshot"))),
        }
    }
    let digest = r.hash.clone().finalize();
    let mut stored = [0u8; 32];
    r.inner
        .read_exact(&mut stored)
        .map_err(|_| bad("the snapshot is cut short (no digest at its end)"))?;
    if stored[..] != digest[..] {
        return Err(bad(
            "the snapshot's digest does not match: the file is damaged",
        ));
    }
    let mut rest = [0u8; 1];
    if r.inner.read(&mut rest).map_err(|e| bad(e.to_string()))? != 0 {
        return Err(bad(
            "the snapshot has bytes after its digest: the file is damaged",
        ));
    }
    Ok(counts)
}

/// Checks a snapshot file whole (authenticated, complete, digest) without writing anything.
pub fn verify(input: impl Read, how: Opening<'_>) -> Result<Counts> {
    parse(open_input(input, how)?, |_, _| Ok(()), |_, _, _| Ok(()))
}

/// Restores the snapshot read from `input` into `data_dir` (the Hub must be stopped): the
/// records go into a new store, which replaces `data_dir/db` (kept as `db.replaced-<time>`)
/// only once the whole file has been read and authenticated and its digest matches; then the
/// key files are written (0600). The restored store starts a new store epoch and is marked
/// restored (see the module doc).
pub fn restore(input: impl Read, data_dir: &Path, how: Opening<'_>) -> Result<Counts> {
    let db_dir = data_dir.join("db");
    if db_dir.exists() {
        // Refused while a Hub runs on it (sled's lock).
        let probe = SledStore::open(&db_dir)?;
        probe.close();
    }
    let staging = data_dir.join("db.restoring");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .map_err(|e| bad(format!("cannot remove {}: {e}", staging.display())))?;
    }
    let input = open_input(input, how)?;
    let store = SledStore::open(&staging)?;
    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let counts = parse(
        input,
        |name, bytes| {
            files.push((data_dir.join(name), bytes));
            Ok(())
        },
        |table, key, value| store.put(table, key, value),
    )?;
    let epoch = store.increment(super::EPOCH_COUNTER)?;
    store.put(
        Table::Counters,
        super::RESTORED_COUNTER.as_bytes(),
        &epoch.to_be_bytes(),
    )?;
    futures::executor::block_on(store.flush())?;
    store.close();
    drop(store);
    if db_dir.exists() {
        let aside = data_dir.join(format!("db.replaced-{}", chrono::Utc::now().timestamp()));
        std::fs::rename(&db_dir, &aside)
            .map_err(|e| bad(format!("cannot move {} aside: {e}", db_dir.display())))?;
    }
    std::fs::rename(&staging, &db_dir)
        .map_err(|e| bad(format!("cannot move the restored store into place: {e}")))?;
    for (path, bytes) in files {
        agen_shared::tls::write_private(&path, &bytes)
            .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))?;
    }
    // The renames are durable before the restore says it is done.
    super::disk_sync::sync_folder(data_dir)
        .map_err(|e| bad(format!("cannot sync {}: {e}", data_dir.display())))?;
    Ok(counts)
}
