//! Writes and edits under a `.git` folder are refused unless the server runs with
//! `--allow-git-writes`: git runs what `.git/config` (`core.fsmonitor`, `core.pager`, aliases)
//! and `.git/hooks/*` say, so a write there is a command the next person to type `git status`
//! in the folder runs, even on a `--no-run` server. So is a write that would make, at any depth
//! (the root included), a folder git takes for a repository by itself: `HEAD` + `objects/` +
//! `refs/` (`vendor/lib/{HEAD,objects,refs,config}`), whichever of the three comes last.
//!
//! Invariant: the path is judged both as written (cleaned) and as it resolves on disk (its
//! longest existing prefix canonicalised), so a symlink `docs -> .git` does not get through.
//! The workspace tools cannot create symlinks, so what is judged is what will be written.

use std::path::{Component, Path};

use super::confine::{RelPath, Root};
use super::error::{Result, WorkspaceError};

/// Fails when `user_path` (as given to `write` or `edit`) is inside a `.git` folder.
pub(crate) fn check(root: &Root, user_path: &str, allow: bool) -> Result<()> {
    if allow {
        return Ok(());
    }
    let rel = root.resolve(user_path)?;
    let resolved = resolved_on_disk(root.path(), &rel);
    let inside = in_git_dir(rel.as_path()) || resolved.as_deref().is_some_and(in_git_dir);
    if inside {
        return Err(WorkspaceError::Invalid(format!(
            "`{}` is inside a `.git` folder; writes and edits there are refused because git runs \
             commands from its config and hooks. Change the files of the project instead (the \
             server's operator can start it with --allow-git-writes)",
            rel.shown()
        )));
    }
    for path in std::iter::once(rel.as_path()).chain(resolved.as_deref()) {
        if let Some(dir) = completes_repository(root.path(), path) {
            let shown = if dir.as_os_str().is_empty() {
                ".".to_string()
            } else {
                dir.display().to_string()
            };
            return Err(WorkspaceError::Invalid(format!(
                "`{}` would make `{shown}` a git repository (HEAD, objects/ and refs/); writes and \
                 edits that create or complete one are refused because git runs commands from \
                 its config and hooks. Change the files of the project instead (the server's \
                 operator can start it with --allow-git-writes)",
                rel.shown()
            )));
        }
    }
    Ok(())
}

/// The folder (relative to the root; empty: the root) that a write of `rel` would leave with
/// `HEAD`, `objects/` and `refs/` together, if any: what git discovers as a repository.
fn completes_repository(root: &Path, rel: &Path) -> Option<std::path::PathBuf> {
    let mut dir = rel.parent();
    while let Some(d) = dir {
        let on_disk = root.join(d);
        let written = rel.strip_prefix(d).ok()?;
        let first = written.components().next().and_then(|c| match c {
            Component::Normal(n) => n.to_str(),
            _ => None,
        });
        let is_file = written.components().count() == 1;
        let head = (first == Some("HEAD") && is_file) || on_disk.join("HEAD").is_file();
        let objects = (first == Some("objects") && !is_file) || on_disk.join("objects").is_dir();
        let refs = (first == Some("refs") && !is_file) || on_disk.join("refs").is_dir();
        if head && objects && refs {
            return Some(d.to_path_buf());
        }
        dir = d.parent();
    }
    None
}

/// Whether a path relative to the root has a `.git` component.
fn in_git_dir(rel: &Path) -> bool {
    rel.components().any(|c| match c {
        Component::Normal(name) => name
            .to_str()
            .is_some_and(|n| n.eq_ignore_ascii_case(".git")),
        _ => false,
    })
}

/// `rel` as it resolves on disk, relative to the root: the longest existing prefix
/// canonicalised, the rest appended. `None` when it resolves outside the root (the open will
/// refuse it anyway).
fn resolved_on_disk(root: &Path, rel: &RelPath) -> Option<std::path::PathBuf> {
    let full = root.join(rel.as_path());
    let mut existing = full.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = std::fs::canonicalize(existing) {
            let mut out = canonical.strip_prefix(root).ok()?.to_path_buf();
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Some(out);
        }
        rest.push(existing.file_name()?.to_owned());
        existing = existing.parent()?;
    }
}
