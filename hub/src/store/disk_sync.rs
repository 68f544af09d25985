//! What makes a flush of the sled store durable on the disk, not only in the page cache.
//!
//! sled 0.34 writes a log buffer with `pwrite` and waits for it with `sync_file_range`, which
//! neither commits the file's metadata (its length, as the log grows) nor flushes the disk's
//! write cache; and it never syncs the blob files it keeps values over ~128 KiB in. A Hub
//! killed with `kill -9` loses nothing of that (the page cache outlives it), the machine's
//! power does. So a flush is sled's flush, then an `fsync` of every blob file written since the
//! last flush (and of their folder), then an `fdatasync` of sled's log file.
//!
//! Invariant: the blob folder is listed again whenever its mtime changed since a listing, or
//! is less than [`SETTLED`] old (a file system's clock for mtimes is coarse: an entry made in
//! the same tick as a listing leaves the mtime as the listing saw it, but never an old one), so
//! a flush never skips a blob written before it, and a store with thousands of blobs does not
//! list them on every flush.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// The age past which a folder's mtime can no longer be shared by a new entry.
const SETTLED: Duration = Duration::from_secs(2);

/// What flushes so far know of sled's blob folder.
#[derive(Debug, Default)]
pub(super) struct BlobsSeen {
    /// The greatest blob id synced (sled names blob files by log sequence number).
    newest: u64,
    /// The folder's mtime at the last listing, once it was older than [`SETTLED`].
    settled: Option<SystemTime>,
}

/// Makes every write to `db` so far durable on the disk (see the module doc).
pub(super) fn sync_to_disk(
    db: &sled::Db,
    dir: &Path,
    blobs: &std::sync::Mutex<BlobsSeen>,
) -> Result<(), String> {
    db.flush().map_err(|e| e.to_string())?;
    let folder = dir.join("blobs");
    let mut seen = blobs.lock().unwrap_or_else(|p| p.into_inner());
    sync_new_blobs(&folder, &mut seen)
        .map_err(|e| format!("fsync of the blobs in {}: {e}", folder.display()))?;
    drop(seen);
    let log = dir.join("db");
    std::fs::File::open(&log)
        .and_then(|f| f.sync_data())
        .map_err(|e| format!("fdatasync of {}: {e}", log.display()))
}

/// Syncs the blob files `seen` has not synced yet, listing the folder only when it may hold
/// one.
fn sync_new_blobs(folder: &Path, seen: &mut BlobsSeen) -> std::io::Result<()> {
    let mtime = match std::fs::metadata(folder) {
        Ok(meta) => meta.modified()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if seen.settled == Some(mtime) {
        return Ok(());
    }
    seen.newest = sync_blobs_after(folder, seen.newest)?;
    let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
    seen.settled = (age > SETTLED).then_some(mtime);
    Ok(())
}

/// Syncs every blob file named by an id above `after`, then the folder when there was one;
/// returns the greatest id seen.
fn sync_blobs_after(folder: &Path, after: u64) -> std::io::Result<u64> {
    let mut newest = after;
    for entry in std::fs::read_dir(folder)? {
        let entry = entry?;
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if id > after {
            std::fs::File::open(entry.path())?.sync_all()?;
            newest = newest.max(id);
        }
    }
    if newest > after {
        sync_folder(folder)?;
    }
    Ok(newest)
}

/// Syncs a folder's entries. A file system that cannot sync a folder (`EINVAL`: some network
/// and FUSE ones) is taken at its word, as databases do: there is nothing more to ask of it.
pub(super) fn sync_folder(folder: &Path) -> std::io::Result<()> {
    match std::fs::File::open(folder)?.sync_all() {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        done => done,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set_mtime(folder: &Path, when: SystemTime) {
        std::fs::File::open(folder)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_modified(when))
            .unwrap();
    }

    fn mtime(folder: &Path) -> SystemTime {
        std::fs::metadata(folder).unwrap().modified().unwrap()
    }

    #[test]
    fn a_flush_syncs_the_blobs_named_above_the_last_one_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("blobs");
        let mut seen = BlobsSeen::default();
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 0, "no folder: nothing to sync");

        std::fs::create_dir(&folder).unwrap();
        for name in ["5", "12", "not-a-blob"] {
            std::fs::write(folder.join(name), b"x").unwrap();
        }
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 12);
        std::fs::write(folder.join("13"), b"x").unwrap();
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 13, "a new blob is seen by the next flush");
    }

    #[test]
    fn a_folder_is_listed_again_while_its_mtime_is_recent_and_not_once_it_settled() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("blobs");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("5"), b"x").unwrap();
        let mut seen = BlobsSeen::default();
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(
            (seen.newest, seen.settled),
            (5, None),
            "a fresh mtime is not settled"
        );

        // An entry made within the same clock tick leaves the mtime as it was: a recent mtime
        // is listed again all the same.
        let listed = mtime(&folder);
        std::fs::write(folder.join("8"), b"x").unwrap();
        set_mtime(&folder, listed);
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 8);

        // Old and unchanged: listed once more, then settled and not listed again.
        set_mtime(&folder, SystemTime::now() - Duration::from_secs(60));
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert!(seen.settled.is_some());
        let settled = mtime(&folder);
        std::fs::write(folder.join("9"), b"x").unwrap();
        set_mtime(&folder, settled);
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 8, "a settled, unchanged folder is not listed");

        // Any new entry moves the mtime off the settled one.
        set_mtime(&folder, SystemTime::now());
        sync_new_blobs(&folder, &mut seen).unwrap();
        assert_eq!(seen.newest, 9);
    }
}
