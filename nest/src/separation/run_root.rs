//! Where a Nest keeps its run dirs and socket while it separates instances: `/run/agen` (the
//! unit's RuntimeDirectory), or `--run-root`; never a shared temp folder, where another local
//! user could plant the paths first.

use std::path::{Path, PathBuf};

use super::{Result, SeparationError};

/// The run root of the Nest whose data dir is `data_dir`: `/run/agen/nest-<12 hex>` when
/// `/run/agen` (or `/run`, to make it) is there to write, else `<temp dir>/agen-run/nest-<12 hex>`; the hash is of the data
/// dir's absolute path, so two Nests of one host never share one.
pub fn runtime_root(data_dir: &Path) -> PathBuf {
    let base = private_runtime_base().unwrap_or_else(|| std::env::temp_dir().join("agen-run"));
    root_in(&base, data_dir)
}

/// `/run/agen` when it (or `/run`, to make it) is there to write: the unit's RuntimeDirectory,
/// which root may make.
fn private_runtime_base() -> Option<PathBuf> {
    let writable = |p: &str| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
    (writable("/run/agen") || writable("/run")).then(|| PathBuf::from("/run/agen"))
}

/// `<base>/nest-<12 hex of the data dir's absolute path>`.
fn root_in(base: &Path, data_dir: &Path) -> PathBuf {
    use sha2::Digest;
    let abs = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = hex::encode(sha2::Sha256::digest(abs.as_os_str().as_encoded_bytes()));
    base.join(format!("nest-{}", &hash[..12]))
}

/// The run root of a separating Nest: in `--run-root` when given (a folder no other user may
/// write), else in `/run/agen`; never in a shared temp folder, where another local user could
/// plant the paths first. The error names `--run-root`.
pub(super) fn separated_run_root(given: Option<&Path>, data_dir: &Path) -> Result<PathBuf> {
    if let Some(base) = given {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(base) {
            if meta.permissions().mode() & 0o022 != 0 {
                return Err(SeparationError::RunRoot(format!(
                    "--run-root {}: other users may write to it (mode {:o}); give a folder only this nest's user can write (chmod 755 or 700)",
                    base.display(),
                    meta.permissions().mode() & 0o7777
                )));
            }
        }
        return Ok(root_in(base, data_dir));
    }
    match private_runtime_base() {
        Some(base) => Ok(root_in(&base, data_dir)),
        None => Err(SeparationError::RunRoot(
            "instance separation needs a private folder for run dirs and the socket, and /run is not writable here; \
             give one with --run-root DIR (a folder only this nest's user can write), or run without separation (--run-as-self)"
                .into(),
        )),
    }
}
