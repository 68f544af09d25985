//! Sealed snapshots: a snapshot file encrypted and authenticated with the operator's snapshot
//! key (32 random bytes in a file of its own, `agen hub snapshot-key new`), never with a key
//! the snapshot or the data dir holds.
//!
//! Format: [`MAGIC`] and a 7-byte random file id, then frames `len(u32 be) ciphertext` of at
//! most [`CHUNK`] plaintext bytes each, sealed with ChaCha20-Poly1305 (`ring`): the nonce is
//! the file id, the frame's number (u32 be) and 1 on the last frame (0 before it); the
//! associated data is the header. So a changed byte, a frame dropped, repeated or moved, a
//! file cut short (no last frame) and bytes after the last frame are each refused with an
//! error that says which, and so is another key.
//!
//! Invariant: nothing read from a sealed file is handed on before its frame was
//! authenticated; the key file is written 0600 and never overwritten.

use std::io::{Read, Write};
use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use ring::rand::{SecureRandom, SystemRandom};

/// The first bytes of a sealed snapshot (as long as the plain format's magic).
pub const MAGIC: &[u8] = b"agen-hub-snapshot 2\n";
/// Plaintext bytes per frame at most.
pub const CHUNK: usize = 64 * 1024;
const ID_LEN: usize = 7;
const TAG_LEN: usize = 16;

/// A sealed snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("snapshot key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The operator's snapshot key.
pub struct SnapshotKey(LessSafeKey);

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotKey(..)")
    }
}

impl SnapshotKey {
    fn from_bytes(bytes: &[u8]) -> Option<SnapshotKey> {
        UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .ok()
            .map(|k| SnapshotKey(LessSafeKey::new(k)))
    }

    /// Reads the key file at `path`: exactly 32 bytes.
    pub fn load(path: &Path) -> Result<SnapshotKey, SealError> {
        let key_err = |reason: String| SealError::Key {
            path: path.display().to_string(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| key_err(format!("cannot read it: {e}")))?;
        if bytes.len() != 32 {
            return Err(key_err(format!(
                "holds {} bytes, a snapshot key is exactly 32 random bytes; make one with `agen hub snapshot-key new FILE`",
                bytes.len()
            )));
        }
        SnapshotKey::from_bytes(&bytes).ok_or_else(|| key_err("not a usable key".into()))
    }

    /// Makes a new random key and writes it to `path` (0600; an existing file is never
    /// replaced).
    pub fn create(path: &Path) -> Result<(), SealError> {
        use std::os::unix::fs::OpenOptionsExt;
        let key_err = |reason: String| SealError::Key {
            path: path.display().to_string(),
            reason,
        };
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| key_err("the system has no randomness to give".into()))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => key_err(
                    "exists already; a key is never replaced (the snapshots made with it need it): pick another FILE".into(),
                ),
                _ => key_err(format!("cannot create it: {e}")),
            })?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| key_err(format!("cannot write it: {e}")))
    }
}

fn nonce(id: &[u8; ID_LEN], frame: u32, last: bool) -> Nonce {
    let mut n = [0u8; 12];
    n[..ID_LEN].copy_from_slice(id);
    n[ID_LEN..ID_LEN + 4].copy_from_slice(&frame.to_be_bytes());
    n[11] = u8::from(last);
    Nonce::assume_unique_for_key(n)
}

fn header(id: &[u8; ID_LEN]) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(id);
    h
}

/// Seals what is written to it into `inner`; [`SealWriter::finish`] writes the last frame.
pub struct SealWriter<'k, W: Write> {
    inner: W,
    key: &'k SnapshotKey,
    id: [u8; ID_LEN],
    frame: u32,
    buf: Vec<u8>,
}

impl<'k, W: Write> SealWriter<'k, W> {
    pub fn new(mut inner: W, key: &'k SnapshotKey) -> Result<SealWriter<'k, W>, SealError> {
        let mut id = [0u8; ID_LEN];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| SealError::Refused("the system has no randomness to give".into()))?;
        inner.write_all(&header(&id))?;
        Ok(SealWriter {
            inner,
            key,
            id,
            frame: 0,
            buf: Vec::with_capacity(CHUNK),
        })
    }

    fn seal_frame(&mut self, last: bool) -> std::io::Result<()> {
        let mut data = std::mem::take(&mut self.buf);
        self.key
            .0
            .seal_in_place_append_tag(
                nonce(&self.id, self.frame, last),
                Aad::from(header(&self.id)),
                &mut data,
            )
            .map_err(|_| std::io::Error::other("sealing a snapshot frame failed"))?;
        self.frame = self
            .frame
            .checked_add(1)
            .ok_or_else(|| std::io::Error::other("a snapshot of more than 2^32 frames"))?;
        self.inner.write_all(&(data.len() as u32).to_be_bytes())?;
        self.inner.write_all(&data)?;
        data.clear();
        self.buf = data;
        Ok(())
    }

    /// Seals the rest as the last frame and returns the inner writer (flushed).
    pub fn finish(mut self) -> std::io::Result<W> {
        self.seal_frame(true)?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for SealWriter<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = room.min(bytes.len());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.buf.len() == CHUNK {
            self.seal_frame(false)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Reads a sealed snapshot back: each frame is authenticated before its bytes are handed on.
pub struct OpenReader<'k, R: Read> {
    inner: R,
    key: &'k SnapshotKey,
    id: [u8; ID_LEN],
    frame: u32,
    plain: Vec<u8>,
    at: usize,
    ended: bool,
}

fn refused(reason: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, reason.to_string())
}

impl<'k, R: Read> OpenReader<'k, R> {
    /// `inner` positioned just after [`MAGIC`] (the caller read it to tell the formats apart).
    pub fn new(mut inner: R, key: &'k SnapshotKey) -> std::io::Result<OpenReader<'k, R>> {
        let mut id = [0u8; ID_LEN];
        inner
            .read_exact(&mut id)
            .map_err(|_| refused("the snapshot is cut short (its header is incomplete)"))?;
        Ok(OpenReader {
            inner,
            key,
            id,
            frame: 0,
            plain: Vec::new(),
            at: 0,
            ended: false,
        })
    }

    fn next_frame(&mut self) -> std::io::Result<()> {
        let mut len = [0u8; 4];
        if let Err(e) = self.inner.read_exact(&mut len) {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => refused(
                    "the snapshot is cut short (its last frame is missing): an incomplete copy",
                ),
                _ => e,
            });
        }
        let len = u32::from_be_bytes(len) as usize;
        if !(TAG_LEN..=CHUNK + TAG_LEN).contains(&len) {
            return Err(refused(
                "the snapshot is damaged or was tampered with (a frame length is impossible)",
            ));
        }
        let mut data = vec![0u8; len];
        self.inner.read_exact(&mut data).map_err(|_| {
            refused("the snapshot is cut short (its last frame is missing): an incomplete copy")
        })?;
        // The last frame is marked in its nonce: try it as a middle frame, then as the last.
        let aad = header(&self.id);
        let mut last = false;
        let mut copy = data.clone();
        let opened = match self.key.0.open_in_place(
            nonce(&self.id, self.frame, false),
            Aad::from(aad.clone()),
            &mut copy,
        ) {
            Ok(p) => p.len(),
            Err(_) => {
                last = true;
                self.key
                    .0
                    .open_in_place(nonce(&self.id, self.frame, true), Aad::from(aad), &mut data)
                    .map_err(|_| {
                        refused("the snapshot was tampered with, is damaged, or was sealed with another snapshot key: a frame fails its authentication")
                    })?
                    .len()
            }
        };
        if last {
            data.truncate(opened);
            self.plain = data;
            self.ended = true;
            let mut rest = [0u8; 1];
            if self.inner.read(&mut rest)? != 0 {
                return Err(refused(
                    "the snapshot was tampered with: there are bytes after its last frame",
                ));
            }
        } else {
            copy.truncate(opened);
            self.plain = copy;
        }
        self.at = 0;
        self.frame = self
            .frame
            .checked_add(1)
            .ok_or_else(|| refused("a snapshot of more than 2^32 frames"))?;
        Ok(())
    }
}

impl<R: Read> Read for OpenReader<'_, R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.plain.len() {
            if self.ended {
                return Ok(0);
            }
            self.next_frame()?;
        }
        let n = out.len().min(self.plain.len() - self.at);
        out[..n].copy_from_slice(&self.plain[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: &Path, name: &str) -> SnapshotKey {
        let path = dir.join(name);
        SnapshotKey::create(&path).expect("create");
        SnapshotKey::load(&path).expect("load")
    }

    fn seal(key: &SnapshotKey, plain: &[u8]) -> Vec<u8> {
        let mut w = SealWriter::new(Vec::new(), key).expect("writer");
        w.write_all(plain).expect("write");
        w.finish().expect("finish")
    }

    fn open(key: &SnapshotKey, sealed: &[u8]) -> Result<Vec<u8>, String> {
        assert_eq!(&sealed[..MAGIC.len()], MAGIC);
        let mut r = OpenReader::new(&sealed[MAGIC.len()..], key).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        r.read_to_end(&mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    #[test]
    fn what_is_sealed_opens_whole_and_nothing_else_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let k = key(dir.path(), "k");
        let other = key(dir.path(), "other");
        let plain: Vec<u8> = (0..(CHUNK * 2 + 123)).map(|i| (i % 251) as u8).collect();
        let sealed = seal(&k, &plain);
        assert_eq!(open(&k, &sealed).expect("opens"), plain);
        assert_eq!(open(&k, &seal(&k, b"")).expect("empty"), b"");

        let check = |bytes: &[u8], expected: &str| {
            let err = open(&k, bytes).expect_err("refused");
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        };
        // A flipped byte anywhere after the magic: in the id, a length, a ciphertext, a tag.
        for at in [
            MAGIC.len() + 2,
            MAGIC.len() + 8,
            MAGIC.len() + 500,
            sealed.len() - 3,
        ] {
            let mut bad = sealed.clone();
            bad[at] ^= 0x40;
            let err = open(&k, &bad).expect_err("a flipped byte is refused");
            assert!(
                err.contains("tampered") || err.contains("cut short"),
                "{at}: {err}"
            );
        }
        // Cut short: at a frame boundary (no last frame) and inside a frame.
        let first_frame_end = MAGIC.len() + ID_LEN + 4 + CHUNK + TAG_LEN;
        check(&sealed[..first_frame_end], "cut short");
        check(&sealed[..sealed.len() - 10], "cut short");
        // Bytes appended after the last frame.
        let mut longer = sealed.clone();
        longer.push(0);
        check(&longer, "after its last frame");
        // Frames swapped.
        let f = 4 + CHUNK + TAG_LEN;
        let start = MAGIC.len() + ID_LEN;
        let mut swapped = sealed[..start].to_vec();
        swapped.extend_from_slice(&sealed[start + f..start + 2 * f]);
        swapped.extend_from_slice(&sealed[start..start + f]);
        swapped.extend_from_slice(&sealed[start + 2 * f..]);
        check(&swapped, "tampered");
        // Another key.
        let err = open(&other, &sealed).expect_err("another key");
        assert!(err.contains("another snapshot key"), "{err}");
    }

    #[test]
    fn a_key_file_is_32_bytes_0600_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("snapshot.key");
        SnapshotKey::create(&path).expect("create");
        let meta = std::fs::metadata(&path).expect("meta");
        assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (32, 0o600));
        let err = SnapshotKey::create(&path).expect_err("exists").to_string();
        assert!(err.contains("never replaced"), "{err}");
        std::fs::write(dir.path().join("short"), b"abc").expect("write");
        let err = SnapshotKey::load(&dir.path().join("short"))
            .expect_err("short")
            .to_string();
        assert!(err.contains("exactly 32 random bytes"), "{err}");
    }
}
