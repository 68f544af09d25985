//! cgroup v2: the unified hierarchy at `/sys/fs/cgroup` (its `cgroup.controllers` present),
//! delegated to the Nest (systemd `Delegate=yes`). No process may sit in a group that has
//! children with controllers, so the Nest moves itself into a leaf `nest-<pid>` of its own
//! group, enables `cpu memory pids` below it and makes `instances-<pid>/<instance>`; limits in
//! `memory.max` (and `memory.swap.max` 0), `cpu.max`, `pids.max`.

use std::path::{Path, PathBuf};

use agen_shared::bundle::ResourceSpec;

use super::{read_u64, Reading};

const MOUNT: &str = "/sys/fs/cgroup";
const PERIOD_US: u64 = 100_000;

#[derive(Debug)]
pub struct Root {
    /// The Nest's own group (delegated).
    own: PathBuf,
    /// `instances-<pid>` under it.
    instances: PathBuf,
}

impl Root {
    pub fn setup(pid: u32) -> Result<Root, String> {
        let mount = Path::new(MOUNT);
        let controllers = std::fs::read_to_string(mount.join("cgroup.controllers"))
            .map_err(|_| format!("{MOUNT} is not a cgroup2 mount"))?;
        for c in ["memory", "pids"] {
            if !controllers.split_whitespace().any(|x| x == c) {
                return Err(format!("{MOUNT} offers no {c} controller"));
            }
        }
        let cg = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let own_rel = cg
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or("no cgroup v2 entry in /proc/self/cgroup")?;
        let own = mount.join(own_rel.trim().trim_start_matches('/'));
        let available = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
        for c in ["memory", "pids"] {
            if !available.split_whitespace().any(|x| x == c) {
                return Err(format!(
                    "{} has no {c} controller (run the Nest with systemd's Delegate=yes, as the unit does)",
                    own.display()
                ));
            }
        }
        super::remove_stale(&own, "instances-");
        super::remove_stale(&own, "nest-");
        let leaf = own.join(format!("nest-{pid}"));
        std::fs::create_dir_all(&leaf)
            .map_err(|e| format!("cannot create {}: {e}", leaf.display()))?;
        std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).map_err(|e| {
            format!(
                "cannot move the nest into {} (is the group delegated?): {e}",
                leaf.display()
            )
        })?;
        let enable: Vec<String> = ["cpu", "memory", "pids"]
            .iter()
            .filter(|c| available.split_whitespace().any(|x| x == **c))
            .map(|c| format!("+{c}"))
            .collect();
        let enable = enable.join(" ");
        std::fs::write(own.join("cgroup.subtree_control"), &enable).map_err(|e| {
            format!(
                "cannot enable {enable} in {} (other processes in the group?): {e}",
                own.display()
            )
        })?;
        let instances = own.join(format!("instances-{pid}"));
        std::fs::create_dir_all(&instances)
            .and_then(|()| std::fs::write(instances.join("cgroup.subtree_control"), &enable))
            .map_err(|e| format!("cannot set up {}: {e}", instances.display()))?;
        Ok(Root { own, instances })
    }

    pub fn describe(&self) -> String {
        format!("delegated {}", self.own.display())
    }

    pub fn create(&self, id: &str, limits: &ResourceSpec) -> Result<Vec<PathBuf>, String> {
        let dir = self.instances.join(id);
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(format!("cannot create cgroup {}: {e}", dir.display()));
            }
        }
        let set = |file: &str, value: String| {
            std::fs::write(dir.join(file), &value)
                .map_err(|e| format!("cannot set {} to {value}: {e}", dir.join(file).display()))
        };
        if let Some(m) = limits.memory_bytes {
            set("memory.max", m.to_string())?;
            if dir.join("memory.swap.max").exists() {
                set("memory.swap.max", "0".into())?;
            }
        }
        if let Some(c) = limits.cpu_millis {
            set(
                "cpu.max",
                format!("{} {PERIOD_US}", u64::from(c) * PERIOD_US / 1000),
            )?;
        }
        set("pids.max", limits.pids_limit().to_string())?;
        Ok(vec![dir])
    }

    pub fn cleanup(&self) {
        super::remove_tree(&self.instances);
    }
}

/// Usage from the group's dir.
pub fn read(dir: &Path) -> Reading {
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).unwrap_or_default();
    let mem = read_u64(&dir.join("memory.current")).unwrap_or(0);
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .ok()
        .and_then(|t| super::counter(&t, "inactive_file"))
        .unwrap_or(0);
    Reading {
        cpu_seconds: super::counter(&stat, "usage_usec").unwrap_or(0) as f64 / 1e6,
        memory_bytes: mem.saturating_sub(inactive),
        pids: read_u64(&dir.join("pids.current"))
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
    }
}
