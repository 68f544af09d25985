//! Reading a bundle's own files during validation: opened beneath the bundle root, regular
//! files only, and bounded in size.
//!
//! Invariants: on Linux every file is opened with `openat2(root, rel, RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`, so no symlink (or chain of them) can make validation read outside
//! the bundle; the open never blocks (`O_NONBLOCK`, so a FIFO cannot hang the Hub); anything but
//! a regular file (a device such as `/dev/zero`, a FIFO, a socket) is refused; at most
//! [`MAX_FILE_BYTES`] are read from one file.

use std::io::Read;
use std::path::Path;

use super::error::{BundleError, Result};

/// The largest bundle file read during validation (`mcp.json`, `x-agen/agent.md`, a skill, a
/// flow): 4 MiB.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The bytes of `dir/rel`, or `None` when it does not exist. `rel` is shown in errors.
pub(crate) fn read_bounded(dir: &Path, rel: &str) -> Result<Option<Vec<u8>>> {
    let file = match open_beneath(dir, rel)? {
        Some(f) => f,
        None => return Ok(None),
    };
    let meta = file
        .metadata()
        .map_err(|e| BundleError::io(rel, "cannot stat", e))?;
    if !meta.is_file() {
        return Err(BundleError::file(
            rel,
            "is not a regular file (a device, FIFO or socket); expected a file inside the bundle",
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| BundleError::io(rel, "cannot read", e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(BundleError::file(rel, format!(
                "is larger than {} MiB; expected a small text file (keep data out of the bundle's definition files)",
                MAX_FILE_BYTES / (1024 * 1024)
            ),
        ));
    }
    Ok(Some(bytes))
}

#[cfg(target_os = "linux")]
fn open_beneath(dir: &Path, rel: &str) -> Result<Option<std::fs::File>> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use nix::errno::Errno;
    use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
    use nix::sys::stat::Mode;

    let root = open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| BundleError::io(".", "cannot open the bundle folder", e.into()))?;
    // SAFETY: `open` just returned this descriptor and nothing else owns it.
    #[allow(unsafe_code)]
    let root = unsafe { OwnedFd::from_raw_fd(root) };
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let mut attempts = 0;
    loop {
        match openat2(root.as_raw_fd(), Path::new(rel), how) {
            Ok(fd) => {
                // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
                #[allow(unsafe_code)]
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                return Ok(Some(std::fs::File::from(fd)));
            }
            Err(Errno::EAGAIN | Errno::EINTR) if attempts < 64 => attempts += 1,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::EXDEV) => return Err(BundleError::file(
                rel,
                "leads outside the bundle (through a symlink); expected a file inside the bundle",
            )),
            Err(Errno::ELOOP) => {
                return Err(BundleError::file(
                    rel,
                    "goes through too many symlinks; expected a file inside the bundle",
                ))
            }
            Err(Errno::ENOSYS) => return open_checked(dir, rel),
            Err(e) => return Err(BundleError::io(rel, "cannot open", e.into())),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn open_beneath(dir: &Path, rel: &str) -> Result<Option<std::fs::File>> {
    open_checked(dir, rel)
}

/// Without `openat2`: canonicalise and check the prefix (weaker: check then open).
fn open_checked(dir: &Path, rel: &str) -> Result<Option<std::fs::File>> {
    let path = dir.join(rel);
    let real = match std::fs::canonicalize(&path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BundleError::io(rel, "cannot resolve", e)),
    };
    let root = std::fs::canonicalize(dir).map_err(|e| BundleError::io(".", "cannot resolve", e))?;
    if !real.starts_with(&root) {
        return Err(BundleError::file(
            rel,
            "leads outside the bundle (through a symlink); expected a file inside the bundle",
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| BundleError::io(rel, "cannot stat", e))?;
    if !meta.is_file() {
        return Err(BundleError::file(
            rel,
            "is not a regular file (a device, FIFO or socket); expected a file inside the bundle",
        ));
    }
    std::fs::File::open(&real)
        .map(Some)
        .map_err(|e| BundleError::io(rel, "cannot open", e))
}
