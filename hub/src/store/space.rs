//! A full disk, survived any number of times: whether the store's folder has room again is
//! asked of a probe file of our own, never of the store's files, and what sled 0.34 leaves
//! behind when a write of its own fails for lack of space is cleared before sled opens.
//!
//! Why: sled writes a new snapshot file (`snap.<lsn>.generating`, renamed to `snap.<lsn>` once
//! synced) every time it opens, and its lookup of snapshots takes the `.generating` ones too
//! (their names sort after the finished ones). Opening sled on a full disk leaves such a file
//! cut short, and every later open reads it and fails with `Read corrupted data`. So the store
//! is reopened only once [`probe`] wrote and synced room for it, and [`clear_unfinished_snapshots`]
//! removes what an interrupted snapshot left before every open (the finished snapshot and the
//! log it was made from are whole and untouched).
//!
//! Invariant: neither function writes to, truncates or renames a file sled or the event log
//! reads; the probe file is the only file written, and it is removed again.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The probe file's name in the store's folder (no store file starts with a dot).
pub const PROBE_FILE: &str = ".space-probe";

/// Room the probe asks for: sled's segment (512 KiB) and its snapshot, with room to spare.
pub const PROBE_BYTES: usize = 2 << 20;

/// Writes and syncs [`PROBE_BYTES`] into a probe file in `dir`, then removes it: `Ok` when the
/// disk has room for the store to open and write again.
pub fn probe(dir: &Path) -> Result<(), String> {
    let path = dir.join(PROBE_FILE);
    let written = write_probe(&path);
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| {
        format!(
            "no room yet: writing {} KiB to {} failed: {e}",
            PROBE_BYTES / 1024,
            path.display()
        )
    })?;
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

fn write_probe(path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; 64 * 1024];
    for _ in 0..PROBE_BYTES / chunk.len() {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// Removes the `snap.*.generating` files in `dir`: snapshots sled began and never finished
/// (see the module doc). Returns the ones removed.
pub fn clear_unfinished_snapshots(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(removed),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            std::fs::remove_file(entry.path())?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unfinished_snapshots_are_cleared() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in [
            "snap.0000000000001000",
            "snap.0000000000002000.generating",
            "db",
            "conf",
            "events.log",
        ] {
            std::fs::write(dir.path().join(name), b"x").expect("write");
        }
        let removed = clear_unfinished_snapshots(dir.path()).expect("clear");
        assert_eq!(
            removed,
            vec![dir.path().join("snap.0000000000002000.generating")]
        );
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["conf", "db", "events.log", "snap.0000000000001000"]);
    }

    #[test]
    fn the_probe_leaves_no_file_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        probe(dir.path()).expect("room");
        assert!(!dir.path().join(PROBE_FILE).exists());
        let missing = dir.path().join("missing");
        let err = probe(&missing).expect_err("no folder");
        assert!(err.contains("no room yet"), "{err}");
    }
}
