//! Private by construction: the owner-only umask the daemons start with, folders created 0700
//! and files created 0600 (the mode is given to the create call, never chmod-ed afterwards),
//! and the repair of a data dir that an older version or a hand left readable by others.
//!
//! Invariant: nothing under a data dir of the Hub, a Nest or `agen up` grants group or other
//! users any access.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of every folder of a data dir.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every key, token, database and log file of a data dir.
pub const FILE_MODE: u32 = 0o600;

/// Sets this process's umask to 077, so that whatever it and its children create (sled's
/// files, logs, temp files) is readable by its own user only. Daemons call it first thing.
pub fn restrict_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Creates `path` and its missing parents with mode 0700.
pub fn create_dir_all(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Creates (or truncates) `path` with mode 0600 and writes `data`, not atomically; see
/// [`crate::tls::write_private`] for the atomic form.
pub fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// One entry [`repair`] tightened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tightened {
    pub path: PathBuf,
    /// The permission bits before (`0o7777` part of the mode).
    pub from: u32,
    /// The permission bits after.
    pub to: u32,
}

/// Walks `root` (symlinks are not followed) and removes every group and other permission bit
/// from it and from everything under it; folders keep 0700 at least. Logs each entry it
/// changed and returns them. A missing `root` is nothing to repair.
pub fn repair(root: &Path) -> std::io::Result<Vec<Tightened>> {
    let mut fixed = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            continue;
        }
        let from = meta.permissions().mode() & 0o7777;
        let to = if ft.is_dir() {
            (from & 0o700) | DIR_MODE
        } else {
            from & 0o700
        };
        if to != from {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(to))?;
            tracing::warn!(
                path = %path.display(),
                from = format!("{from:o}"),
                to = format!("{to:o}"),
                "data dir entry was readable by other users; tightened its mode"
            );
            fixed.push(Tightened {
                path: path.clone(),
                from,
                to,
            });
        }
        if ft.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    if !fixed.is_empty() {
        tracing::warn!(
            data_dir = %root.display(),
            entries = fixed.len(),
            "made the data dir private again (folders 0700, files without group/other access)"
        );
    }
    Ok(fixed)
}

/// Creates `root` (0700) if needed and [`repair`]s it: the start of every data dir.
pub fn prepare_data_dir(root: &Path) -> std::io::Result<Vec<Tightened>> {
    create_dir_all(root)?;
    repair(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn folders_and_files_are_created_owner_only_whatever_the_umask() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        create_dir_all(&dir).expect("mkdir");
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        write_file(&dir.join("key"), b"k").expect("write");
        assert_eq!(mode(&dir.join("key")), 0o600);
    }

    #[test]
    fn repair_tightens_loose_entries_and_says_which() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("data");
        std::fs::create_dir_all(root.join("db")).expect("mkdir");
        std::fs::write(root.join("db/conf"), "x").expect("write");
        std::fs::write(root.join("run.sh"), "x").expect("write");
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        set(&root, 0o755);
        set(&root.join("db"), 0o750);
        set(&root.join("db/conf"), 0o644);
        set(&root.join("run.sh"), 0o755);
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).expect("symlink");

        let mut fixed = prepare_data_dir(&root).expect("repair");
        fixed.sort_by(|a, b| a.path.cmp(&b.path));
        let got: Vec<(String, u32, u32)> = fixed
            .iter()
            .map(|t| {
                let rel = t.path.strip_prefix(&root).expect("under root");
                (rel.display().to_string(), t.from, t.to)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (String::new(), 0o755, 0o700),
                ("db".into(), 0o750, 0o700),
                ("db/conf".into(), 0o644, 0o600),
                ("run.sh".into(), 0o755, 0o700),
            ]
        );
        // The link's target is left alone, and a second start has nothing to fix.
        assert_ne!(mode(Path::new("/etc/passwd")) & 0o044, 0);
        assert!(repair(&root).expect("repair").is_empty());
    }
}
