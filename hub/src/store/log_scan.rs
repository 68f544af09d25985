//! Reading `events.log` back at open, record by record, and telling what a crash leaves from
//! damage. A crash leaves a prefix of what was written: whole records, then at most a record
//! cut short, past the header's `synced` length (nothing acknowledged lies there). Anything
//! else is damage: a record that fails its checksum (or its length, or says nothing we know)
//! before `synced`, or one followed by whole records; a file shorter than `synced`; a header
//! that fails its checksum. After a bad record the reader looks for the next whole record
//! (a length, op, table and key length that make sense, and a matching checksum), so every
//! whole record after the damage is still read, and the damaged stretch is reported with the
//! task and run ids found in its bytes (what it touched).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::Table;

/// Bytes of the header after the magic line.
pub(super) const HEAD_LEN: usize = 24;
/// Where the first record of a log with a header starts.
pub(super) const FIRST_RECORD: u64 = (MAGIC.len() + HEAD_LEN) as u64;
/// The bytes of a damaged stretch searched for ids (a bigger one is searched at its start).
const ID_SEARCH_LIMIT: u64 = 16 << 20;
/// The bytes read at a time while looking for the next whole record.
const RESYNC_WINDOW: usize = 4 << 20;

// The record format, which the writer (`event_log.rs`) and this reader share.

/// The file's first bytes.
pub const MAGIC: &[u8] = b"agen-hub-events 2\n";
/// The first bytes of a log written before it had a header (read, then rewritten with one).
pub const MAGIC_V1: &[u8] = b"agen-hub-events 1\n";
/// The largest record the log writes or reads back (a run event is limited far below).
pub(super) const MAX_RECORD: usize = 256 << 20;
/// Bytes of a record besides its payload (length and checksum).
pub(super) const HEADER: usize = 8;
pub(super) const OP_PUT: u8 = 1;
pub(super) const OP_REMOVE: u8 = 2;

/// What [`scan`] hands each record to: op, table, key, where its value is, its length, the
/// record's size.
pub(super) type Apply<'a> = dyn FnMut(u8, Table, &[u8], u64, u32, u32) + 'a;

pub(super) fn table_of(id: u8) -> Option<Table> {
    match id {
        1 => Some(Table::RunEvents),
        2 => Some(Table::TaskEvents),
        _ => None,
    }
}

/// What the header says: how long the file was at the last sync that returned, and how many
/// flushes sled had made durable by then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    pub synced: u64,
    pub sled_flushes: u64,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEAD_LEN] {
        let mut b = [0u8; HEAD_LEN];
        b[..8].copy_from_slice(&self.synced.to_le_bytes());
        b[8..16].copy_from_slice(&self.sled_flushes.to_le_bytes());
        let crc = crc32fast::hash(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; HEAD_LEN]) -> Option<Header> {
        let crc = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        (crc32fast::hash(&b[..16]) == crc && b[20..] == [0; 4]).then(|| Header {
            synced: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            sled_flushes: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        })
    }
}

/// A stretch of the file that holds no whole record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub offset: u64,
    pub len: u64,
    /// The task and run ids found in its bytes (`task-…`, `run-…`).
    pub ids: BTreeSet<String>,
}

/// What reading the log back found.
#[derive(Debug, Clone)]
pub struct Findings {
    pub path: PathBuf,
    /// The file's length.
    pub len: u64,
    /// 2, or 1 for a log written before it had a header.
    pub version: u8,
    /// `None` for a version 1 log, or when the header is damaged.
    pub header: Option<Header>,
    /// The magic line or the header fails its checksum.
    pub header_damaged: bool,
    /// Stretches with no whole record that a crash cannot explain.
    pub damaged: Vec<Region>,
    /// The file is shorter than the header's `synced` length (that length).
    pub short_of: Option<u64>,
    /// What a crash left past `synced`: cut off at open.
    pub torn_tail: Option<Region>,
    /// Whole records read.
    pub records: u64,
    /// The end of the last whole record.
    pub end: u64,
}

impl Findings {
    /// No damage (a torn tail is not damage).
    #[cfg(test)]
    pub fn intact(&self) -> bool {
        !self.header_damaged && self.damaged.is_empty() && self.short_of.is_none()
    }

    /// One line per finding.
    #[cfg(test)]
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.header_damaged {
            out.push(format!(
                "{} at byte 0: the header (bytes 0..{FIRST_RECORD}) is damaged: the synced length it records is unknown",
                self.path.display()
            ));
        }
        for r in &self.damaged {
            out.push(format!(
                "{} at byte {}: {} bytes hold no whole record (a record fails its checksum or length) and whole records follow or it lies before the synced length",
                self.path.display(),
                r.offset,
                r.len
            ));
        }
        if let Some(synced) = self.short_of {
            out.push(format!(
                "{} at byte {}: the file ends {} bytes before the {synced} bytes it had when last synced (its tail was cut off)",
                self.path.display(),
                self.len,
                synced - self.len
            ));
        }
        out
    }

    #[cfg(test)]
    pub fn summary(&self) -> String {
        self.lines().join("; ")
    }
}

/// One record read from the stream.
enum Next {
    Whole {
        op: u8,
        table: u8,
        key: Vec<u8>,
        /// Where the value starts, and its length.
        value_at: u64,
        value_len: u32,
        record: u32,
    },
    /// The file ends here, between records.
    End,
    /// No whole record here.
    Bad,
}

/// Whether `payload` (a record's, its checksum sound) says something we know.
fn sensible(payload: &[u8]) -> Option<(u8, u8, usize)> {
    if payload.len() < 6 {
        return None;
    }
    let (op, table) = (payload[0], payload[1]);
    let key_len = u32::from_le_bytes([payload[2], payload[3], payload[4], payload[5]]) as usize;
    (matches!(op, OP_PUT | OP_REMOVE) && table_of(table).is_some() && 6 + key_len <= payload.len())
        .then_some((op, table, key_len))
}

fn read_one(r: &mut impl Read, at: u64, file_len: u64, payload: &mut Vec<u8>) -> Next {
    if at == file_len {
        return Next::End;
    }
    let mut header = [0u8; HEADER];
    if r.read_exact(&mut header).is_err() {
        return Next::Bad;
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if !(6..=MAX_RECORD).contains(&len) || at + (HEADER + len) as u64 > file_len {
        return Next::Bad;
    }
    payload.resize(len, 0);
    if r.read_exact(payload).is_err() || crc32fast::hash(payload) != crc {
        return Next::Bad;
    }
    let Some((op, table, key_len)) = sensible(payload) else {
        return Next::Bad;
    };
    Next::Whole {
        op,
        table,
        key: payload[6..6 + key_len].to_vec(),
        value_at: at + (HEADER + 6 + key_len) as u64,
        value_len: (len - 6 - key_len) as u32,
        record: (HEADER + len) as u32,
    }
}

/// The offset of the first whole record at or after `from` (`None`: there is none).
fn resync(file: &File, from: u64, file_len: u64) -> std::io::Result<Option<u64>> {
    let mut pos = from;
    let mut buf = Vec::new();
    let mut spill = Vec::new();
    while pos + (HEADER + 6) as u64 <= file_len {
        let take = (RESYNC_WINDOW + HEADER + 6).min((file_len - pos) as usize);
        buf.resize(take, 0);
        file.read_exact_at(&mut buf, pos)?;
        let last = pos + take as u64 == file_len;
        let tries = if last { take } else { RESYNC_WINDOW };
        for i in 0..tries {
            if i + HEADER + 6 > take {
                break;
            }
            let p = pos + i as u64;
            let b = &buf[i..];
            let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
            if !(6..=MAX_RECORD).contains(&len) || p + (HEADER + len) as u64 > file_len {
                continue;
            }
            let key_len = u32::from_le_bytes([b[10], b[11], b[12], b[13]]) as usize;
            if !(matches!(b[8], OP_PUT | OP_REMOVE) && table_of(b[9]).is_some())
                || 6 + key_len > len
            {
                continue;
            }
            let crc = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let payload = if i + HEADER + len <= take {
                &b[HEADER..HEADER + len]
            } else {
                spill.resize(len, 0);
                file.read_exact_at(&mut spill, p + HEADER as u64)?;
                &spill[..]
            };
            if crc32fast::hash(payload) == crc {
                return Ok(Some(p));
            }
        }
        pos += tries as u64;
    }
    Ok(None)
}

/// The `task-…` and `run-…` ids (32 hex digits after the dash) in `bytes`.
pub(super) fn ids_in(bytes: &[u8]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for prefix in [&b"task-"[..], b"run-"] {
        let mut i = 0;
        while i + prefix.len() + 32 <= bytes.len() {
            let tail = &bytes[i + prefix.len()..i + prefix.len() + 32];
            if bytes[i..].starts_with(prefix)
                && tail
                    .iter()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
            {
                ids.insert(String::from_utf8_lossy(&bytes[i..i + prefix.len() + 32]).into());
                i += prefix.len() + 32;
            } else {
                i += 1;
            }
        }
    }
    ids
}

fn region(file: &File, offset: u64, len: u64) -> std::io::Result<Region> {
    let mut bytes = vec![0u8; len.min(ID_SEARCH_LIMIT) as usize];
    file.read_exact_at(&mut bytes, offset)?;
    Ok(Region {
        offset,
        len,
        ids: ids_in(&bytes),
    })
}

fn not_a_log(path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} is not an agen event log (it must start with {:?})",
            path.display(),
            String::from_utf8_lossy(MAGIC).trim_end()
        ),
    )
}

/// Reads every whole record of `file` (not empty), handing each to `apply` (op, table, key,
/// where its value is, its length, the record's size), and says what else it found; `marked`: what the mark file beside it says (the greater values count). Reads only.
pub(super) fn scan(
    file: &File,
    path: &Path,
    apply: &mut Apply<'_>,
    marked: Option<Header>,
) -> std::io::Result<Findings> {
    let file_len = file.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut magic = vec![0u8; MAGIC.len()];
    let got_magic = r.read_exact(&mut magic).is_ok();
    let mut head = [0u8; HEAD_LEN];
    let mut f = Findings {
        path: path.to_path_buf(),
        len: file_len,
        version: 2,
        header: None,
        header_damaged: false,
        damaged: Vec::new(),
        short_of: None,
        torn_tail: None,
        records: 0,
        end: 0,
    };
    let mut at = if got_magic && magic == MAGIC_V1 {
        f.version = 1;
        MAGIC.len() as u64
    } else {
        let whole_head = r.read_exact(&mut head).is_ok();
        f.header = whole_head.then(|| Header::decode(&head)).flatten();
        match (got_magic && magic == MAGIC, f.header) {
            (true, Some(_)) => {}
            // A damaged magic line beside a sound header, or the reverse: damage, not another file.
            (false, Some(_)) | (true, None) => f.header_damaged = true,
            (false, None) => return Err(not_a_log(path)),
        }
        if f.header_damaged {
            f.header = None;
        }
        if let (Some(h), Some(m)) = (f.header.as_mut(), marked) {
            h.synced = h.synced.max(m.synced);
            h.sled_flushes = h.sled_flushes.max(m.sled_flushes);
        }
        FIRST_RECORD
    };
    // Nothing acknowledged lies past `synced`; unknown (a damaged header) counts as the whole
    // file, and a version 1 log (no header) relies on whole records following.
    let synced = match (f.version, f.header) {
        (_, Some(h)) => h.synced,
        (1, None) => 0,
        _ => file_len,
    };
    let mut payload = Vec::new();
    f.end = at;
    loop {
        match read_one(&mut r, at, file_len, &mut payload) {
            Next::End => break,
            Next::Whole {
                op,
                table,
                key,
                value_at,
                value_len,
                record,
            } => {
                let table = table_of(table).expect("checked by sensible()");
                apply(op, table, &key, value_at, value_len, record);
                f.records += 1;
                at += u64::from(record);
                f.end = at;
            }
            Next::Bad => {
                let next = resync(file, at + 1, file_len)?;
                let stretch = region(file, at, next.unwrap_or(file_len) - at)?;
                match next {
                    None if at >= synced => {
                        f.torn_tail = Some(stretch);
                        break;
                    }
                    None => {
                        f.damaged.push(stretch);
                        break;
                    }
                    Some(q) => {
                        f.damaged.push(stretch);
                        r.seek(SeekFrom::Start(q))?;
                        at = q;
                    }
                }
            }
        }
    }
    if let Some(h) = f.header {
        if file_len < h.synced {
            f.short_of = Some(h.synced);
        }
    }
    Ok(f)
}
