//! Confinement of every path to the workspace root.
//!
//! Invariants (the security boundary of the workspace server):
//! - Every file or folder is opened with `openat2(root_fd, rel, RESOLVE_BENEATH |
//!   RESOLVE_NO_MAGICLINKS)`: the kernel resolves the whole path, symlinks included, and refuses
//!   anything that would leave the root. There is no check-then-open anywhere, so a folder
//!   swapped for a symlink between two calls (or in the middle of one) cannot lead outside.
//! - User paths are first cleaned lexically ([`Root::resolve`]): relative paths stay relative,
//!   absolute paths are accepted only under the root (component-wise, so `/srv/root_evil` is not
//!   under `/srv/root`), and `..` may not climb above the root.
//! - `RESOLVE_BENEATH` also refuses absolute symlinks that point back inside the root. Only for
//!   those, the path is canonicalised in user space and opened again, still with
//!   `RESOLVE_BENEATH`: the user-space step only improves the answer, the kernel stays the judge.
//! - Parents of new files are created one component at a time with `mkdirat` on a directory
//!   handle that was itself opened beneath the root.
//! - Nothing here follows a symlink that leads outside: such paths fail with
//!   [`WorkspaceError::SymlinkEscape`] and the link itself is never modified.

use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{mkdirat, Mode};

use super::error::{Result, WorkspaceError};

/// A cleaned path relative to the workspace root: no `.`, no `..`, never absolute. Empty means
/// the root itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RelPath(PathBuf);

impl RelPath {
    /// The root itself.
    pub(crate) fn root() -> Self {
        RelPath(PathBuf::new())
    }

    pub(crate) fn as_path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.as_os_str().is_empty()
    }

    pub(crate) fn join(&self, name: &OsStr) -> RelPath {
        RelPath(self.0.join(name))
    }

    pub(crate) fn parent(&self) -> Option<RelPath> {
        if self.is_root() {
            return None;
        }
        Some(RelPath(
            self.0.parent().map(Path::to_path_buf).unwrap_or_default(),
        ))
    }

    pub(crate) fn file_name(&self) -> Option<&OsStr> {
        self.0.file_name()
    }

    /// How the path is shown to the model: `/`-separated, `.` for the root.
    pub(crate) fn shown(&self) -> String {
        if self.is_root() {
            return ".".to_string();
        }
        let parts: Vec<String> = self
            .0
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        parts.join("/")
    }
}

/// The workspace root: a directory handle every path is resolved beneath.
#[derive(Debug)]
pub(crate) struct Root {
    dir: OwnedFd,
    /// The canonical root (no symlinks).
    path: PathBuf,
    /// The root as given on the command line, made absolute (may differ from `path`).
    given: PathBuf,
}

/// The error for a root this process's uid cannot read or enter: names the path and the uid.
fn unusable(shown: &str, e: impl std::fmt::Display) -> WorkspaceError {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    WorkspaceError::Invalid(format!(
        "workspace root `{shown}` is not usable by uid {uid} (gid {gid}): {e}; give that uid access to the folder (e.g. chown it) or run the nest with --run-as-self"
    ))
}

impl Root {
    /// Opens the root folder; fails when it does not exist or is not a folder.
    pub(crate) fn open(root: &Path) -> Result<Root> {
        let shown = root.display().to_string();
        let given = if root.is_absolute() {
            root.to_path_buf()
        } else {
            std::env::current_dir()
                .map_err(|e| WorkspaceError::io("reading the current folder for", &shown, e))?
                .join(root)
        };
        let path = fs::canonicalize(root).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return unusable(&shown, e);
            }
            WorkspaceError::Invalid(format!(
                "workspace root `{shown}` cannot be opened: {e}; pass an existing folder to --root"
            ))
        })?;
        // Under the instance's own uid (a separated Nest) the folder may be someone else's.
        nix::unistd::access(
            &path,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::X_OK,
        )
        .map_err(|e| unusable(&shown, e))?;
        let dir = nix::fcntl::open(&path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| {
                WorkspaceError::Invalid(format!("workspace root `{shown}` is not a folder that can be opened: {e}; pass an existing folder to --root"))
            })?;
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        #[allow(unsafe_code)]
        let dir = unsafe { OwnedFd::from_raw_fd(dir) };
        // Everything is opened with openat2 (Linux 5.6+); say so now rather than on every call.
        let beneath = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        if let Err(errno) = openat2_retrying(
            dir.as_fd(),
            Path::new("."),
            OFlag::O_PATH,
            Mode::empty(),
            beneath,
        ) {
            return Err(WorkspaceError::Invalid(format!(
                "cannot open files beneath the workspace root `{shown}` with openat2 ({errno}); the workspace server needs Linux 5.6 or newer without a seccomp filter blocking openat2"
            )));
        }
        Ok(Root {
            dir,
            path,
            given: clean_absolute(&given),
        })
    }

    /// The canonical root folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Turns a path from a tool call into a cleaned path relative to the root, refusing anything
    /// that is lexically outside (`..` above the root, absolute paths elsewhere).
    pub(crate) fn resolve(&self, user: &str) -> Result<RelPath> {
        let trimmed = user.trim();
        if trimmed.is_empty() {
            return Err(WorkspaceError::Invalid(
                "the path is empty; give a path relative to the workspace root, such as `src/main.rs`".into(),
            ));
        }
        if trimmed.contains('\0') {
            return Err(WorkspaceError::Invalid(format!(
                "`{}` contains a NUL byte; paths cannot",
                trimmed.escape_debug()
            )));
        }
        let outside = || WorkspaceError::OutsideRoot {
            path: trimmed.to_string(),
            root: self.path.display().to_string(),
        };
        let raw = Path::new(trimmed);
        let relative: &Path = if raw.is_absolute() {
            raw.strip_prefix(&self.path)
                .or_else(|_| raw.strip_prefix(&self.given))
                .map_err(|_| outside())?
        } else {
            raw
        };
        let mut cleaned = PathBuf::new();
        for component in relative.components() {
            match component {
                Component::Normal(part) => cleaned.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !cleaned.pop() {
                        return Err(outside());
                    }
                }
                Component::RootDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        Ok(RelPath(cleaned))
    }

    /// Opens `rel` beneath the root with `flags` (`O_CLOEXEC` is always added; `mode` is used
    /// only with `O_CREAT`). Symlinks are followed only while they stay inside the root.
    pub(crate) fn open_beneath(&self, rel: &RelPath, flags: OFlag, mode: Mode) -> Result<OwnedFd> {
        let beneath = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        match openat2_retrying(self.dir.as_fd(), rel.as_path(), flags, mode, beneath) {
            Ok(fd) => Ok(fd),
            Err(Errno::EXDEV) => {
                // An absolute symlink that points back inside the root is refused by
                // RESOLVE_BENEATH; open its canonical form, still beneath the root.
                if let Some(inner) = self.canonical_inside(rel) {
                    if inner != *rel {
                        return openat2_retrying(
                            self.dir.as_fd(),
                            inner.as_path(),
                            flags,
                            mode,
                            beneath,
                        )
                        .map_err(|errno| self.error_for(errno, rel));
                    }
                }
                Err(self.explain_escape(rel))
            }
            Err(errno) => Err(self.error_for(errno, rel)),
        }
    }

    /// Creates the missing parent folders of `rel`, each beneath the root.
    pub(crate) fn create_parents(&self, rel: &RelPath) -> Result<()> {
        self.create_parents_inner(rel)
            .map_err(|e| e.for_path(rel.shown()))
    }

    fn create_parents_inner(&self, rel: &RelPath) -> Result<()> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        let mut current = RelPath::root();
        let mut current_fd = self.open_beneath(&current, dir_flags, Mode::empty())?;
        for component in parent.as_path().components() {
            let name = component.as_os_str();
            let next = current.join(name);
            current_fd = match self.open_beneath(&next, dir_flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(WorkspaceError::NotFound { .. }) => {
                    match mkdirat(
                        Some(current_fd.as_raw_fd()),
                        name,
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(errno) => {
                            return Err(WorkspaceError::io(
                                "creating the folder",
                                next.shown(),
                                errno,
                            ))
                        }
                    }
                    self.open_beneath(&next, dir_flags, Mode::empty())?
                }
                Err(e) => return Err(e),
            };
            current = next;
        }
        Ok(())
    }

    /// The canonical form of `rel` when it exists (or its parent does) and lies inside the root.
    pub(crate) fn canonical_inside(&self, rel: &RelPath) -> Option<RelPath> {
        let full = self.path.join(rel.as_path());
        let canonical = match fs::canonicalize(&full) {
            Ok(c) => c,
            Err(_) => {
                let parent = fs::canonicalize(full.parent()?).ok()?;
                parent.join(rel.file_name()?)
            }
        };
        canonical
            .strip_prefix(&self.path)
            .ok()
            .map(|p| RelPath(p.to_path_buf()))
    }

    /// Maps an `openat2` failure on `rel` to an error the model can act on.
    fn error_for(&self, errno: Errno, rel: &RelPath) -> WorkspaceError {
        let path = rel.shown();
        match errno {
            Errno::ENOENT => WorkspaceError::NotFound { path },
            Errno::ELOOP => WorkspaceError::Loop { path },
            Errno::ENOTDIR => WorkspaceError::NotADirectory { path },
            Errno::EISDIR => WorkspaceError::IsAFolder { path },
            Errno::ENXIO | Errno::ENODEV => WorkspaceError::NotAFile { path },
            Errno::EXDEV => self.explain_escape(rel),
            Errno::EEXIST => WorkspaceError::io("creating", path, errno),
            other => WorkspaceError::io("opening", path, other),
        }
    }

    /// Finds the symlink on the way to `rel` that leads outside, to name it in the error. This
    /// only shapes the message; the refusal itself already happened in the kernel.
    fn explain_escape(&self, rel: &RelPath) -> WorkspaceError {
        let mut prefix = RelPath::root();
        for component in rel.as_path().components() {
            prefix = prefix.join(component.as_os_str());
            let full = self.path.join(prefix.as_path());
            let Ok(meta) = fs::symlink_metadata(&full) else {
                break;
            };
            if !meta.file_type().is_symlink() {
                continue;
            }
            let target = fs::read_link(&full).unwrap_or_default();
            let leaves = match fs::canonicalize(&full) {
                Ok(canonical) => !canonical.starts_with(&self.path),
                Err(_) => self.target_leaves(&prefix, &target),
            };
            if leaves {
                return WorkspaceError::SymlinkEscape {
                    path: rel.shown(),
                    link: prefix.shown(),
                    target: target.display().to_string(),
                };
            }
        }
        WorkspaceError::Escape { path: rel.shown() }
    }

    /// Whether a (dangling) symlink at `link` with `target` points outside, judged lexically.
    fn target_leaves(&self, link: &RelPath, target: &Path) -> bool {
        if target.is_absolute() {
            return !(target.starts_with(&self.path) || target.starts_with(&self.given));
        }
        let parent = link.parent().unwrap_or_default();
        let mut depth: Vec<&OsStr> = parent.0.components().map(|c| c.as_os_str()).collect();
        for component in target.components() {
            match component {
                Component::Normal(part) => depth.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    if depth.pop().is_none() {
                        return true;
                    }
                }
                Component::RootDir | Component::Prefix(_) => return true,
            }
        }
        false
    }
}

/// `openat2` with `O_CLOEXEC`, retried on the transient `EAGAIN`/`EINTR` the kernel may return
/// while a rename races with a `RESOLVE_BENEATH` lookup.
pub(crate) fn openat2_retrying(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: OFlag,
    mode: Mode,
    resolve: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let mode = if flags.contains(OFlag::O_CREAT) {
        mode
    } else {
        Mode::empty()
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .mode(mode)
        .resolve(resolve);
    let mut attempts = 0;
    loop {
        match openat2(dir.as_raw_fd(), path, how) {
            Ok(fd) => {
                // SAFETY: `openat2` just returned this descriptor and nothing else owns it.
                #[allow(unsafe_code)]
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            Err(Errno::EAGAIN | Errno::EINTR) if attempts < 64 => attempts += 1,
            Err(errno) => return Err(errno),
        }
    }
}

/// Removes `.` and resolves `..` lexically in an absolute path.
fn clean_absolute(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}
