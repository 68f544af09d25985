//! cgroup v1: a group `agen-nest-<pid>/<instance>` under the Nest's own group in each mounted
//! hierarchy of `memory`, `cpu`, `cpuacct` and `pids` (found in `/proc/self/mountinfo` and
//! `/proc/self/cgroup`); limits in `memory.limit_in_bytes`, `cpu.cfs_quota_us`, `pids.max`.

use std::path::{Path, PathBuf};

use agen_shared::bundle::ResourceSpec;

use super::{read_u64, Reading};

const CONTROLLERS: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];
const PERIOD_US: u64 = 100_000;

/// The Nest's group in each hierarchy it could write.
#[derive(Debug)]
pub struct Roots {
    /// (controller, the Nest's `agen-nest-<pid>` dir in its hierarchy)
    roots: Vec<(&'static str, PathBuf)>,
}

/// Where each v1 controller is mounted (`/sys/fs/cgroup/memory`), from mountinfo.
fn mounts() -> Vec<(String, PathBuf)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        // `… mount_point … - cgroup cgroup rw,memory`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut r = right.split(' ');
        if r.next() != Some("cgroup") {
            continue;
        }
        let opts = r.nth(1).unwrap_or("");
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        for o in opts.split(',') {
            if CONTROLLERS.contains(&o) {
                out.push((o.to_string(), PathBuf::from(point)));
            }
        }
    }
    out
}

/// The Nest's own path in the hierarchy of `controller`, from `/proc/self/cgroup`.
fn own_path(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _id = parts.next()?;
        let list = parts.next()?;
        let path = parts.next()?;
        list.split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })
}

impl Roots {
    pub fn setup(pid: u32) -> Result<Roots, String> {
        let mounts = mounts();
        let mut roots = Vec::new();
        let mut errors = Vec::new();
        for c in CONTROLLERS {
            let Some((_, mount)) = mounts.iter().find(|(m, _)| m == c) else {
                errors.push(format!("{c} not mounted"));
                continue;
            };
            let own = own_path(c).unwrap_or_else(|| "/".into());
            let parent = mount.join(own.trim_start_matches('/'));
            super::remove_stale(&parent, "agen-nest-");
            let dir = parent.join(format!("agen-nest-{pid}"));
            match std::fs::create_dir_all(&dir) {
                Ok(()) => roots.push((c, dir)),
                Err(e) => errors.push(format!("{c}: cannot create {}: {e}", dir.display())),
            }
        }
        if !roots.iter().any(|(c, _)| *c == "memory") || !roots.iter().any(|(c, _)| *c == "pids") {
            for (_, d) in &roots {
                let _ = std::fs::remove_dir(d);
            }
            return Err(if errors.is_empty() {
                "no memory or pids hierarchy".into()
            } else {
                errors.join("; ")
            });
        }
        Ok(Roots { roots })
    }

    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.roots.iter().map(|(c, _)| *c).collect();
        names.join(", ")
    }

    pub fn create(&self, id: &str, limits: &ResourceSpec) -> Result<Vec<PathBuf>, String> {
        let mut dirs = Vec::new();
        for (c, root) in &self.roots {
            let dir = root.join(id);
            if let Err(e) = std::fs::create_dir(&dir) {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(format!("cannot create cgroup {}: {e}", dir.display()));
                }
            }
            let set = |file: &str, value: String| {
                std::fs::write(dir.join(file), &value)
                    .map_err(|e| format!("cannot set {} to {value}: {e}", dir.join(file).display()))
            };
            match *c {
                "memory" => {
                    if let Some(m) = limits.memory_bytes {
                        set("memory.limit_in_bytes", m.to_string())?;
                    }
                }
                "cpu" => {
                    if let Some(c) = limits.cpu_millis {
                        set("cpu.cfs_period_us", PERIOD_US.to_string())?;
                        set(
                            "cpu.cfs_quota_us",
                            (u64::from(c) * PERIOD_US / 1000).to_string(),
                        )?;
                    }
                }
                "pids" => set("pids.max", limits.pids_limit().to_string())?,
                _ => {}
            }
            dirs.push(dir);
        }
        // The memory group first: `oom_kills` and `pids` read it.
        dirs.sort_by_key(|d| !d.starts_with(self.dir_of("memory").unwrap_or(Path::new("/-"))));
        Ok(dirs)
    }

    fn dir_of(&self, controller: &str) -> Option<&Path> {
        self.roots
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, d)| d.as_path())
    }

    pub fn cleanup(&self) {
        for (_, d) in &self.roots {
            super::remove_tree(d);
        }
    }
}

/// Usage from the group's dirs (one per hierarchy).
pub fn read(dirs: &[PathBuf]) -> Reading {
    let mut r = Reading::default();
    for d in dirs {
        if let Some(ns) = read_u64(&d.join("cpuacct.usage")) {
            r.cpu_seconds = ns as f64 / 1e9;
        }
        if let Some(usage) = read_u64(&d.join("memory.usage_in_bytes")) {
            let inactive = std::fs::read_to_string(d.join("memory.stat"))
                .ok()
                .and_then(|t| super::counter(&t, "total_inactive_file"))
                .unwrap_or(0);
            r.memory_bytes = usage.saturating_sub(inactive);
        }
        if let Some(p) = read_u64(&d.join("pids.current")) {
            r.pids = u32::try_from(p).unwrap_or(u32::MAX);
        }
    }
    r
}
