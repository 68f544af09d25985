//! Backups that run themselves, and what a Hub opened on a restored store does first.
//!
//! - [`Core::run_snapshots`]: every `--snapshot-every`, a sealed snapshot (the operator's
//!   snapshot key, `store::sealed`) written under the state lock (consistent) into
//!   `--snapshot-dir` as `hub-<UTC time>.snapshot` (0600, synced, renamed into place), and only
//!   the newest `--snapshot-keep` of them kept.
//! - [`Core::resume_after_restore`]: a store restored from a snapshot starts a new store epoch
//!   (`store::snapshot`): every attempt this Hub issues is above any the Hub before the
//!   restore could have issued ([`attempt_floor`]), and every run in flight at the snapshot is
//!   re-queued before anything is served: its next attempt replays what the snapshot holds,
//!   so an interrupted side-effecting call is `effect_unknown`, and the old attempt's events
//!   are fenced, as are events of runs this store never heard of.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::SnapshotSchedule;
use crate::core::leases::Requeue;
use crate::core::Core;
use crate::error::{HubError, Result};
use crate::model::TaskState;
use crate::store::sealed::SnapshotKey;

/// The lowest attempt a Hub on a store of `epoch` issues is above this: attempts of earlier
/// epochs stay below (2^16 attempts of one run per epoch).
pub fn attempt_floor(epoch: u64) -> u32 {
    u32::try_from(epoch.min(0xFFFF)).unwrap_or(0xFFFF) << 16
}

/// The name of a snapshot written at `at` (sorts by time).
fn snapshot_name(at: chrono::DateTime<chrono::Utc>) -> String {
    format!("hub-{}.snapshot", at.format("%Y%m%dT%H%M%S%.3fZ"))
}

/// The snapshots in `dir` this schedule wrote, oldest first.
fn scheduled_snapshots(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("hub-") && n.ends_with(".snapshot"))
        })
        .collect();
    found.sort();
    Ok(found)
}

impl Core {
    /// Writes a sealed snapshot to `out` (the state lock is held while the records are read).
    pub fn write_sealed_snapshot(
        &self,
        out: impl std::io::Write,
        key: &SnapshotKey,
    ) -> Result<crate::store::snapshot::Counts> {
        let _still = self.lock();
        Ok(crate::store::snapshot::write_sealed(
            self.db.raw(),
            &self.opts.data_dir,
            out,
            key,
        )?)
    }

    /// One scheduled snapshot into `dir`, then the oldest beyond `keep` removed. Returns the
    /// file written.
    pub fn snapshot_into(&self, dir: &Path, keep: usize, key: &SnapshotKey) -> Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let io = |what: &'static str| HubError::io(dir, what);
        agen_shared::private::create_dir_all(dir).map_err(io("cannot create the snapshot dir"))?;
        let path = dir.join(snapshot_name(chrono::Utc::now()));
        let partial = path.with_extension("partial");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)
            .map_err(io("cannot create a snapshot file"))?;
        let written = self
            .write_sealed_snapshot(std::io::BufWriter::new(&file), key)
            .and_then(|_| file.sync_all().map_err(io("cannot sync the snapshot")))
            .and_then(|_| {
                std::fs::rename(&partial, &path).map_err(io("cannot rename the snapshot"))
            })
            .and_then(|_| crate::store::sync_dir(dir).map_err(io("cannot sync the snapshot dir")));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        let all = scheduled_snapshots(dir).map_err(io("cannot list the snapshot dir"))?;
        for old in all.iter().take(all.len().saturating_sub(keep)) {
            if let Err(e) = std::fs::remove_file(old) {
                tracing::warn!(file = %old.display(), error = %e, "cannot remove an old snapshot");
            }
        }
        Ok(path)
    }

    /// Runs until `shutdown`: a sealed snapshot every `schedule.every` (see the module doc).
    pub async fn run_snapshots(
        self: Arc<Self>,
        schedule: SnapshotSchedule,
        shutdown: CancellationToken,
    ) {
        let key = match SnapshotKey::load(&schedule.key_file) {
            Ok(k) => Arc::new(k),
            Err(e) => {
                tracing::error!(error = %e, "scheduled snapshots are off");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(schedule.every) => {}
            }
            let (core, dir, keep, key) = (
                self.clone(),
                schedule.dir.clone(),
                schedule.keep,
                key.clone(),
            );
            match tokio::task::spawn_blocking(move || core.snapshot_into(&dir, keep, &key)).await {
                Ok(Ok(path)) => {
                    tracing::info!(file = %path.display(), "scheduled snapshot written")
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "scheduled snapshot failed; next try in --snapshot-every")
                }
                Err(e) => tracing::error!(error = %e, "the snapshot task failed"),
            }
        }
    }

    /// On a store a restore just wrote: re-queues every run that was in flight at the
    /// snapshot (see the module doc), then marks the restore complete. Nothing to do
    /// otherwise.
    pub async fn resume_after_restore(&self) -> Result<()> {
        let epoch = self.db.restore_pending()?;
        if epoch == 0 {
            return Ok(());
        }
        let requeued = {
            let mut st = self.lock();
            let in_flight: Vec<crate::model::TaskRec> = st
                .tasks
                .values()
                .filter(|t| {
                    !t.state.is_terminal()
                        && t.state != TaskState::Queued
                        && !t.instance_id.is_empty()
                })
                .cloned()
                .collect();
            for task in &in_flight {
                self.requeue_task(
                    &mut st,
                    task.clone(),
                    &format!("the hub was restored from a snapshot (store epoch {epoch}): its run resumes from what the snapshot holds"),
                    Requeue::NotCounted,
                )?;
            }
            self.db.clear_restore_pending()?;
            in_flight.len()
        };
        self.commit().await?;
        tracing::warn!(
            epoch,
            requeued,
            "restored from a snapshot: a new store epoch; the runs in flight at the snapshot were re-queued"
        );
        Ok(())
    }

    /// The lowest attempt this Hub may issue minus one (see [`attempt_floor`]).
    pub(crate) fn attempt_floor(&self) -> u32 {
        self.attempt_floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_issues_above_the_last() {
        assert_eq!(attempt_floor(0), 0);
        assert_eq!(attempt_floor(1), 65_536);
        assert!(attempt_floor(2) > attempt_floor(1) + 60_000);
        assert_eq!(attempt_floor(u64::MAX), 0xFFFF << 16);
    }

    #[test]
    fn snapshot_names_sort_by_time() {
        let a = snapshot_name(chrono::DateTime::from_timestamp(1_700_000_000, 0).expect("t"));
        let b =
            snapshot_name(chrono::DateTime::from_timestamp(1_700_000_001, 5_000_000).expect("t"));
        assert_eq!(a, "hub-20231114T221320.000Z.snapshot");
        assert!(a < b);
    }
}
