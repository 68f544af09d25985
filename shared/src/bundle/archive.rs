//! The archive form of a bundle: deterministic bytes (same folder, same bytes, same digest),
//! content-addressed by sha256, and a safe unpack.
//!
//! Format (all integers big-endian): the magic `AGENBNDL\x01`, a u32 entry count, then per
//! entry a u8 kind (0 file, 1 executable file, 2 symlink), a u32 path length, the path (UTF-8,
//! relative, `/`-separated), a u64 data length and the data (file bytes or link target).
//! Entries are sorted by path; no timestamps, owners or other modes are recorded.
//!
//! Invariants: `pack` skips `.git`, `target`, `node_modules`, `.venv`, `__pycache__` at any
//! depth and refuses symlinks that leave the bundle; `unpack` refuses absolute paths, `..`,
//! duplicate paths, symlinks that do not resolve (through every other link of the archive) to a
//! file or folder inside it (see `links`), and archives over [`MAX_BUNDLE_BYTES`], and
//! writes into a temporary sibling folder that is renamed into place only when complete.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::{BundleError, Result};

/// The largest bundle archive accepted (64 MiB).
pub const MAX_BUNDLE_BYTES: usize = 64 * 1024 * 1024;
/// Folders never packed, at any depth.
pub const SKIPPED_DIRS: [&str; 5] = [".git", "target", "node_modules", ".venv", "__pycache__"];

const MAGIC: &[u8] = b"AGENBNDL\x01";
const KIND_FILE: u8 = 0;
const KIND_EXEC: u8 = 1;
const KIND_SYMLINK: u8 = 2;
const MAX_ENTRIES: u32 = 100_000;
const MAX_PATH: u32 = 4096;

pub use super::entry::{ArchiveEntry, EntryKind};

fn too_large(what: &str) -> BundleError {
    BundleError::Archive(format!(
        "{what} is larger than {} MiB; remove large files (data, build output) from the bundle folder",
        MAX_BUNDLE_BYTES / (1024 * 1024)
    ))
}

/// Packs every file under `dir` (sorted relative paths, exec bit kept, skipped folders left out).
pub fn pack(dir: &Path) -> Result<Vec<u8>> {
    if !dir.is_dir() {
        return Err(BundleError::NotABundle {
            dir: dir.to_path_buf(),
            reason: "not a folder".into(),
        });
    }
    let mut entries = Vec::new();
    let mut total = 0usize;
    collect(dir, "", &mut entries, &mut total)?;
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    super::links::check_links(&entries).map_err(|m| {
        BundleError::Archive(format!(
            "{m}; a link must lead to a file or folder inside the bundle: copy the file into the bundle instead"
        ))
    })?;
    encode(&entries)
}

/// Encodes entries (which must already be sorted and unique for the output to be canonical).
pub fn encode(entries: &[ArchiveEntry]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    let count =
        u32::try_from(entries.len()).map_err(|_| BundleError::Archive("too many files".into()))?;
    out.extend_from_slice(&count.to_be_bytes());
    for e in entries {
        out.push(match e.kind {
            EntryKind::File => KIND_FILE,
            EntryKind::Executable => KIND_EXEC,
            EntryKind::Symlink => KIND_SYMLINK,
        });
        let path_len = u32::try_from(e.path.len())
            .map_err(|_| BundleError::Archive("path too long".into()))?;
        out.extend_from_slice(&path_len.to_be_bytes());
        out.extend_from_slice(e.path.as_bytes());
        out.extend_from_slice(&(e.data.len() as u64).to_be_bytes());
        out.extend_from_slice(&e.data);
        if out.len() > MAX_BUNDLE_BYTES {
            return Err(too_large("the bundle"));
        }
    }
    Ok(out)
}

fn collect(root: &Path, rel: &str, out: &mut Vec<ArchiveEntry>, total: &mut usize) -> Result<()> {
    let here = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let shown = |r: &str| {
        if r.is_empty() {
            ".".to_string()
        } else {
            r.to_string()
        }
    };
    let listing =
        std::fs::read_dir(&here).map_err(|e| BundleError::io(shown(rel), "cannot list", e))?;
    for item in listing {
        let item = item.map_err(|e| BundleError::io(shown(rel), "cannot list", e))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else {
            return Err(BundleError::Archive(format!(
                "{}/{}: file name is not UTF-8; rename it",
                shown(rel),
                name.to_string_lossy()
            )));
        };
        let path = if rel.is_empty() {
            name.to_string()
        } else {
            format!("{rel}/{name}")
        };
        let meta = std::fs::symlink_metadata(item.path())
            .map_err(|e| BundleError::io(path.clone(), "cannot stat", e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            if SKIPPED_DIRS.contains(&name) {
                continue;
            }
            collect(root, &path, out, total)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(item.path())
                .map_err(|e| BundleError::io(path.clone(), "cannot read link", e))?;
            let Some(target_s) = target.to_str() else {
                return Err(BundleError::Archive(format!(
                    "{path}: symlink target is not UTF-8"
                )));
            };
            check_link(&path, target_s).map_err(|m| {
                BundleError::Archive(format!("{m}; copy the file into the bundle instead"))
            })?;
            out.push(ArchiveEntry {
                path,
                kind: EntryKind::Symlink,
                data: target_s.as_bytes().to_vec(),
            });
        } else if ft.is_file() {
            *total += meta.len() as usize;
            if *total > MAX_BUNDLE_BYTES {
                return Err(too_large(&format!("the bundle (at {path})")));
            }
            let data = std::fs::read(item.path())
                .map_err(|e| BundleError::io(path.clone(), "cannot read", e))?;
            let kind = if is_executable(&meta) {
                EntryKind::Executable
            } else {
                EntryKind::File
            };
            out.push(ArchiveEntry { path, kind, data });
        }
        // sockets, fifos, devices: not part of a bundle.
    }
    Ok(())
}

#[cfg(unix)]
fn is_executable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &std::fs::Metadata) -> bool {
    false
}

/// `sha256:<hex>` of the bytes.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks a relative archive path: non-empty, `/`-separated normal components only.
fn check_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty() || path.contains('\0') || path.contains('\\') {
        return Err(format!(
            "bad path `{path}`; expected a relative `/`-separated path"
        ));
    }
    if path.starts_with('/') {
        return Err(format!("absolute path `{path}` refused"));
    }
    for part in path.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!(
                "path `{path}` refused; expected no empty, `.` or `..` segments"
            ));
        }
    }
    Ok(())
}

/// A symlink at `path` with `target` must be relative and stay inside the bundle.
fn check_link(path: &str, target: &str) -> std::result::Result<(), String> {
    if target.is_empty() || Path::new(target).is_absolute() || target.starts_with('/') {
        return Err(format!(
            "symlink {path} -> {target} points outside the bundle"
        ));
    }
    // Resolve lexically from the link's folder; depth must never go below the root.
    let mut depth: i64 = path.split('/').count() as i64 - 1;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return Err(format!(
                "symlink {path} -> {target} points outside the bundle"
            ));
        }
    }
    Ok(())
}

/// Reads an archive into entries, checking the format, sizes and every path.
pub fn decode(bytes: &[u8]) -> Result<Vec<ArchiveEntry>> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(too_large("the archive"));
    }
    let corrupt = |what: &str| BundleError::Archive(format!("corrupt archive: {what}"));
    let mut r = Reader { bytes, at: 0 };
    if r.take(MAGIC.len()).ok_or_else(|| corrupt("too short"))? != MAGIC {
        return Err(BundleError::Archive(
            "not an agen bundle archive (bad magic)".into(),
        ));
    }
    let count = r.u32().ok_or_else(|| corrupt("no entry count"))?;
    if count > MAX_ENTRIES {
        return Err(BundleError::Archive(format!(
            "{count} files; at most {MAX_ENTRIES} are allowed"
        )));
    }
    let mut seen = BTreeSet::new();
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let kind = match r.u8().ok_or_else(|| corrupt("truncated entry"))? {
            KIND_FILE => EntryKind::File,
            KIND_EXEC => EntryKind::Executable,
            KIND_SYMLINK => EntryKind::Symlink,
            k => return Err(corrupt(&format!("unknown entry kind {k}"))),
        };
        let path_len = r.u32().ok_or_else(|| corrupt("truncated entry"))?;
        if path_len > MAX_PATH {
            return Err(corrupt("path too long"));
        }
        let path = r
            .take(path_len as usize)
            .ok_or_else(|| corrupt("truncated path"))?;
        let path = std::str::from_utf8(path)
            .map_err(|_| corrupt("path is not UTF-8"))?
            .to_string();
        check_path(&path).map_err(BundleError::Archive)?;
        if !seen.insert(path.clone()) {
            return Err(BundleError::Archive(format!("path `{path}` appears twice")));
        }
        let len = r.u64().ok_or_else(|| corrupt("truncated entry"))?;
        let len = usize::try_from(len).map_err(|_| corrupt("entry too large"))?;
        let data = r
            .take(len)
            .ok_or_else(|| corrupt(&format!("truncated data of `{path}`")))?
            .to_vec();
        if kind == EntryKind::Symlink {
            let target =
                std::str::from_utf8(&data).map_err(|_| corrupt("symlink target is not UTF-8"))?;
            check_link(&path, target).map_err(BundleError::Archive)?;
        }
        entries.push(ArchiveEntry { path, kind, data });
    }
    if r.at != bytes.len() {
        return Err(corrupt("trailing bytes"));
    }
    // A path below another entry (e.g. a symlink `a` and a file `a/x`) would write through it.
    for e in &entries {
        let mut prefix = e.path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if seen.contains(parent) {
                return Err(BundleError::Archive(format!(
                    "path `{}` is beneath the file or symlink `{parent}`",
                    e.path
                )));
            }
            prefix = parent;
        }
    }
    super::links::check_links(&entries).map_err(|m| {
        BundleError::Archive(format!(
            "{m}; a link must lead to a file or folder inside the bundle"
        ))
    })?;
    Ok(entries)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
    }
}

/// Unpacks an archive into `into`, which must not exist yet. Everything is written to a
/// temporary sibling folder first and renamed into place, so `into` is either absent or
/// complete. If another unpack creates `into` meanwhile (two unpacks of the same digest into a
/// digest-named cache folder), this one yields to it and returns `Ok`.
pub fn unpack(bytes: &[u8], into: &Path) -> Result<()> {
    let entries = decode(bytes)?;
    let shown = into.display().to_string();
    if into.exists() {
        return Err(BundleError::Archive(format!(
            "cannot unpack into {shown}: it already exists"
        )));
    }
    let parent = match into.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| BundleError::io(parent.display().to_string(), "cannot create folder", e))?;
    let base = into
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bundle".into());
    let tmp = parent.join(format!(
        ".{base}.tmp-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = write_all(&entries, &tmp).and_then(|()| match std::fs::rename(&tmp, into) {
        Ok(()) => Ok(()),
        Err(_) if into.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(BundleError::io(
            shown.clone(),
            "cannot move the unpacked bundle into place",
            e,
        )),
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Unpacks only if `bytes` has digest `expected` (`sha256:<hex>`).
pub fn unpack_verified(bytes: &[u8], expected: &str, into: &Path) -> Result<()> {
    let actual = digest(bytes);
    if actual != expected {
        return Err(BundleError::Archive(format!(
            "digest mismatch: expected {expected}, got {actual}"
        )));
    }
    unpack(bytes, into)
}

fn write_all(entries: &[ArchiveEntry], root: &Path) -> Result<()> {
    let io = |p: &str, action: &'static str| {
        let p = p.to_string();
        move |e| BundleError::io(p, action, e)
    };
    std::fs::create_dir(root).map_err(io(&root.display().to_string(), "cannot create folder"))?;
    // Files first, symlinks last, so nothing is ever written through a link.
    for e in entries.iter().filter(|e| e.kind != EntryKind::Symlink) {
        let dest = join_checked(root, &e.path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(io(&e.path, "cannot create folder"))?;
        }
        write_new(&dest, &e.data, e.kind == EntryKind::Executable)
            .map_err(io(&e.path, "cannot write"))?;
    }
    for e in entries.iter().filter(|e| e.kind == EntryKind::Symlink) {
        let dest = join_checked(root, &e.path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(io(&e.path, "cannot create folder"))?;
        }
        let target = String::from_utf8_lossy(&e.data).into_owned();
        make_symlink(&target, &dest).map_err(io(&e.path, "cannot create symlink"))?;
    }
    Ok(())
}

/// `root` + a path already checked by [`check_path`].
fn join_checked(root: &Path, rel: &str) -> PathBuf {
    let mut p = root.to_path_buf();
    for c in Path::new(rel).components() {
        if let Component::Normal(c) = c {
            p.push(c);
        }
    }
    p
}

/// Creates `path` (it must not exist) with mode 0755 or 0644 *under the process umask*, so a
/// daemon's umask 077 makes its bundle cache private (0700/0600) by construction.
#[cfg(unix)]
fn write_new(path: &Path, data: &[u8], exec: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if exec { 0o755 } else { 0o644 })
        .open(path)?;
    f.write_all(data)
}

#[cfg(not(unix))]
fn write_new(path: &Path, data: &[u8], _exec: bool) -> std::io::Result<()> {
    std::fs::write(path, data)
}

#[cfg(unix)]
fn make_symlink(target: &str, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, at)
}

#[cfg(not(unix))]
fn make_symlink(_target: &str, _at: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "symlinks in bundles need a unix host",
    ))
}
