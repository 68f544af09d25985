//! The children registry: `<data-dir>/children.json` lists the process groups this Nest
//! started, so that a Nest that died without cleaning up (kill -9, OOM, power loss of the
//! daemon alone) kills any leftover at its next start.
//!
//! Invariants: a group is recorded before its child is allowed to run long (right after spawn)
//! and removed only after the group was killed; the file is rewritten atomically (temp file +
//! rename); reaping kills a recorded group only if it still exists, with SIGKILL.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One recorded process group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRecord {
    /// What it is: `instance <id>` or `tool server <name> of <id>`.
    pub what: String,
    pub pgid: i32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    /// By key (the instance id, or `<instance id>/<server>`).
    children: BTreeMap<String, ChildRecord>,
}

/// The registry; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Children {
    path: PathBuf,
    state: Mutex<File>,
}

impl Children {
    /// Opens the registry at `path` without touching what it lists (see [`Children::reap_leftovers`]).
    pub fn open(path: &Path) -> Children {
        let state = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<File>(&b).ok())
            .unwrap_or_default();
        Children {
            path: path.to_path_buf(),
            state: Mutex::new(state),
        }
    }

    /// Kills (SIGKILL) every group a previous run of this Nest recorded, then empties the
    /// registry. Returns what was found still alive.
    pub fn reap_leftovers(&self) -> Vec<ChildRecord> {
        let mut reaped = Vec::new();
        {
            let mut st = self.lock();
            for rec in st.children.values() {
                if rec.pgid > 1 && killpg(Pid::from_raw(rec.pgid), Signal::SIGKILL).is_ok() {
                    reaped.push(rec.clone());
                }
            }
            st.children.clear();
        }
        self.save();
        reaped
    }

    /// Records a process group; the registry is written only when that changes it (an
    /// instance repeats its tool servers in every status report). Returns whether it wrote.
    pub fn record(&self, key: &str, rec: ChildRecord) -> bool {
        {
            let mut st = self.lock();
            if st.children.get(key) == Some(&rec) {
                return false;
            }
            st.children.insert(key.to_string(), rec);
        }
        self.save();
        true
    }

    pub fn remove(&self, key: &str) {
        let removed = self.lock().children.remove(key).is_some();
        if removed {
            self.save();
        }
    }

    /// Removes every record whose key starts with `prefix` (an instance and its tool servers).
    pub fn remove_prefix(&self, prefix: &str) {
        let before;
        {
            let mut st = self.lock();
            before = st.children.len();
            st.children.retain(|k, _| !k.starts_with(prefix));
            if st.children.len() == before {
                return;
            }
        }
        self.save();
    }

    pub fn list(&self) -> Vec<(String, ChildRecord)> {
        self.lock()
            .children
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, File> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn save(&self) {
        let bytes = {
            let st = self.lock();
            serde_json::to_vec_pretty(&*st).unwrap_or_default()
        };
        let tmp = self.path.with_extension("json.tmp");
        let res = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = res {
            tracing::warn!(path = %self.path.display(), "cannot write the children registry: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_record_repeated_unchanged_does_not_rewrite_the_registry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = Children::open(&dir.path().join("children.json"));
        let rec = |pgid| ChildRecord {
            what: "tool server ws of i1".into(),
            pgid,
        };
        assert!(c.record("i1/ws", rec(4242)), "a new record is written");
        assert!(
            !c.record("i1/ws", rec(4242)),
            "the same record again is not"
        );
        assert!(
            c.record("i1/ws", rec(4343)),
            "a restarted server's new group is"
        );
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("children.json");
        let c = Children::open(&path);
        c.record(
            "i1",
            ChildRecord {
                what: "instance i1".into(),
                pgid: 999_999,
            },
        );
        c.record(
            "i1/time",
            ChildRecord {
                what: "tool server time of i1".into(),
                pgid: 999_998,
            },
        );
        c.record(
            "i2",
            ChildRecord {
                what: "instance i2".into(),
                pgid: 999_997,
            },
        );
        c.remove_prefix("i1");
        let again = Children::open(&path);
        assert_eq!(
            again.list(),
            vec![(
                "i2".to_string(),
                ChildRecord {
                    what: "instance i2".into(),
                    pgid: 999_997
                }
            )]
        );
    }

    #[test]
    fn leftover_groups_from_a_previous_run_are_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("children.json");
        let mut child = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pgid = i32::try_from(child.id()).expect("pid fits");
        Children::open(&path).record(
            "i1",
            ChildRecord {
                what: "instance i1".into(),
                pgid,
            },
        );

        // A new Nest starts on the same data dir.
        let reaped = Children::open(&path).reap_leftovers();
        assert_eq!(
            reaped,
            vec![ChildRecord {
                what: "instance i1".into(),
                pgid
            }]
        );
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        assert!(Children::open(&path).list().is_empty());
    }
}
